//! Time through the real binary on one host: cron schedules (firing on
//! time, pause, resume, rm, overlaps decided by each slot policy, missed
//! firings across a SIGKILL and restart), delayed submissions (waiting in
//! `ps`, cancel while waiting, across a restart, `--at`), priorities among
//! attempts waiting for `--max-concurrent 1`, and the refusals of a bad
//! expression or zone. The cron rules themselves, daylight-saving
//! transitions included, are unit tests of `taskhost_daemon::schedule`.
//! Real time where a schedule must pass seconds; everything else waits on
//! events and outcomes.

use crate::{common, daemon};

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::Finished;
use daemon::{Daemon, LIMIT, p};
use serde_json::Value;

fn json(out: &Finished) -> Value {
    out.json()
}

/// Follows the daemon's events of these kinds (JSON lines).
struct Events {
    child: std::process::Child,
    lines: Receiver<String>,
}

impl Events {
    fn follow(d: &Daemon, kinds: &str) -> Self {
        let (child, lines) =
            d.spawn_stdout_lines(&["events", "--follow", "--json", "--kind", kinds]);
        Self { child, lines }
    }

    /// The next event for which `pred` holds (others are dropped).
    fn next_where(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {what} within {LIMIT:?}"));
            let event: Value = serde_json::from_str(&line).expect("an event as JSON");
            if pred(&event) {
                return event;
            }
        }
    }

    fn fired(&self, schedule: &str) -> Value {
        self.next_where(&format!("firing of {schedule}"), |e| {
            e["kind"] == "ScheduleFired" && e["schedule"] == schedule
        })
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn schedules(d: &Daemon) -> Vec<Value> {
    let out = d.run(&["schedule", "ls", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    json(&out).as_array().expect("an array").clone()
}

fn schedule(d: &Daemon, name: &str) -> Value {
    schedules(d)
        .into_iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no schedule {name}"))
}

fn add(d: &Daemon, args: &[&str]) {
    let mut all = vec!["schedule", "add"];
    all.extend_from_slice(args);
    let out = d.run(&all);
    assert_eq!(out.code, Some(0), "schedule add {args:?}: {}", out.stderr);
}

fn ok(out: Finished) -> Finished {
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out
}

#[test]
fn a_per_second_schedule_fires_each_second_and_pauses_resumes_and_goes() {
    let d = Daemon::start(&[]);
    let events = Events::follow(&d, "ScheduleFired");
    add(
        &d,
        &[
            "tick",
            "--cron",
            "* * * * * *",
            &p("hello"),
            "--input",
            "hi",
        ],
    );
    let row = schedule(&d, "tick");
    assert_eq!(row["cron"], "* * * * * *");
    assert_eq!(row["tz"], "UTC");
    assert_eq!(row["missed"], "once");
    assert_eq!(row["paused"], false);
    // Three firings, a second apart, each served on time (the wall-clock
    // bound is generous; the lateness target is the benchmark's).
    let mut dues = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let e = events.fired("tick");
        assert_eq!(e["detail"], "on-time", "{e}");
        let late = e["delay_ms"].as_u64().expect("delay_ms");
        assert!(late < 1_000, "fired {late} ms late: {e}");
        dues.push(e["at_ms"].as_u64().unwrap() - late);
        ids.push(e["task_id"].as_u64().unwrap());
    }
    for pair in dues.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            (900..=1_100).contains(&gap),
            "firings {gap} ms apart: {dues:?}"
        );
    }
    // Each firing is an ordinary task named for its schedule, in its slot.
    for id in &ids {
        let out = ok(d.run(&["wait", &id.to_string(), "--json"]));
        let report = json(&out);
        assert_eq!(report["name"], format!("tick-{id}"));
        assert_eq!(report["slot"], "tick");
        assert_eq!(report["outcome"], "completed");
    }
    let out = ok(d.run(&["ps", "--all", "--json"]));
    let rows = json(&out);
    let fired: Vec<&Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["schedule"] == "tick")
        .collect();
    assert!(fired.len() >= 3, "ps --all shows the firings: {rows}");

    // Paused: no firing while it is; its row says so.
    let out = ok(d.run(&["schedule", "pause", "tick", "--json"]));
    assert_eq!(json(&out)["paused"], true);
    let last = schedule(&d, "tick")["last_task"].clone();
    std::thread::sleep(Duration::from_millis(2_500));
    let row = schedule(&d, "tick");
    assert_eq!(row["last_task"], last, "no firing while paused: {row}");
    assert_eq!(row["next_ms"], Value::Null);
    // Resumed: the firings it missed while paused are one catch-up
    // (--missed once), then it fires on time again.
    ok(d.run(&["schedule", "resume", "tick"]));
    let catch_up = events.next_where("the catch-up", |e| e["schedule"] == "tick");
    assert_eq!(catch_up["detail"], "catch-up", "{catch_up}");
    let next = events.fired("tick");
    assert_eq!(
        next["detail"], "on-time",
        "one catch-up, never a burst: {next}"
    );

    // `run` fires once now; `rm` stops it for good.
    let out = ok(d.run(&["schedule", "run", "tick", "--wait", "--json"]));
    assert_eq!(json(&out)["outcome"], "completed");
    ok(d.run(&["schedule", "rm", "tick"]));
    assert!(schedules(&d).is_empty());
    let out = d.run(&["schedule", "pause", "tick"]);
    assert_eq!(out.code, Some(2), "an unknown schedule: {out:?}");
    assert!(
        out.stderr.contains("no schedule named `tick`"),
        "{}",
        out.stderr
    );
}

#[test]
fn overlapping_firings_are_decided_by_the_slot_policy() {
    let d = Daemon::start(&[]);
    let events = Events::follow(&d, "ScheduleFired");
    // Each firing sleeps 2.5 s; the schedules fire every second.
    for (name, policy) in [("q", "queue"), ("r", "replace"), ("dr", "drop-if-running")] {
        add(
            &d,
            &[
                name,
                "--cron",
                "* * * * * *",
                &p("sleeper"),
                "--param",
                "ms=2500",
                "--policy",
                policy,
            ],
        );
    }
    let mut fired: std::collections::HashMap<String, Vec<String>> = Default::default();
    while ["q", "r", "dr"]
        .iter()
        .any(|n| fired.get(*n).is_none_or(|v| v.len() < 2))
    {
        let e = events.next_where("a firing", |e| e["kind"] == "ScheduleFired");
        let name = e["schedule"].as_str().unwrap().to_owned();
        fired
            .entry(name)
            .or_default()
            .push(e["task_id"].as_u64().unwrap().to_string());
    }
    // Queue: the second firing waits behind the first in the slot.
    let slots = json(&ok(d.run(&["slots", "--json"])));
    let q = slots
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "q")
        .unwrap_or_else(|| panic!("slot q: {slots}"));
    assert!(q["queue_depth"].as_u64().unwrap() >= 1, "{q}");
    // Drop-if-running: the second firing is rejected SlotBusy.
    let out = d.run(&["wait", &fired["dr"][1], "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(json(&out)["rejection"], "SlotBusy");
    // Replace: the second firing stops the first, which ends canceled.
    let out = d.run(&["wait", &fired["r"][0], "--json"]);
    assert_eq!(out.code, Some(4), "{out:?}");
    assert_eq!(json(&out)["outcome"], "canceled");
    for name in ["q", "r", "dr"] {
        ok(d.run(&["schedule", "rm", name]));
    }
}

#[test]
fn missed_firings_after_a_sigkill_are_one_catch_up_or_none() {
    let mut d = Daemon::start(&[]);
    {
        let events = Events::follow(&d, "ScheduleFired");
        add(&d, &["once", "--cron", "* * * * * *", &p("hello")]);
        add(
            &d,
            &[
                "skip",
                "--cron",
                "* * * * * *",
                "--missed",
                "skip",
                &p("hello"),
            ],
        );
        events.fired("once");
        events.fired("skip");
    }
    d.kill_9();
    // Down for a few firings.
    std::thread::sleep(Duration::from_millis(3_500));
    d.restart(&[]);
    let events = Events::follow(&d, "ScheduleFired,ScheduleMissed");
    let names: Vec<String> = schedules(&d)
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["once", "skip"], "the schedules survived the kill");
    // Every schedule fires on time again after what the start decided.
    events.next_where("once on time", |e| {
        e["schedule"] == "once" && e["detail"] == "on-time"
    });
    events.next_where("skip on time", |e| {
        e["schedule"] == "skip" && e["detail"] == "on-time"
    });
    // The start's decisions are in the history, before those.
    let out = ok(d.run(&["events", "--json", "--kind", "ScheduleFired,ScheduleMissed"]));
    let history: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let count = |schedule: &str, kind: &str, detail: Option<&str>| {
        history
            .iter()
            .filter(|e| e["schedule"] == schedule && e["kind"] == kind)
            .filter(|e| detail.is_none_or(|d| e["detail"] == d))
            .count()
    };
    assert_eq!(
        count("once", "ScheduleFired", Some("catch-up")),
        1,
        "{history:?}"
    );
    assert_eq!(
        count("skip", "ScheduleFired", Some("catch-up")),
        0,
        "{history:?}"
    );
    assert_eq!(count("skip", "ScheduleMissed", None), 1, "{history:?}");
    let missed = history
        .iter()
        .find(|e| e["kind"] == "ScheduleMissed")
        .unwrap();
    assert!(
        missed["reason"].as_str().unwrap().contains("--missed skip"),
        "{missed}"
    );
}

#[test]
fn a_delayed_task_waits_in_ps_survives_a_restart_and_runs_once_after_its_time() {
    let mut d = Daemon::start(&[]);
    let before = common_now_ms();
    let out = ok(d.run(&[
        "submit",
        &p("hello"),
        "--name",
        "later",
        "--input",
        "late",
        "--delay",
        "3s",
        "--json",
    ]));
    let submitted = json(&out);
    assert_eq!(submitted["state"], "waiting", "{submitted}");
    let due = submitted["due_ms"].as_u64().expect("due_ms");
    assert!(due >= before + 3_000, "due {due}, submitted after {before}");
    let id = submitted["id"].as_u64().unwrap().to_string();
    let row = d.wait_until_state("later", "waiting");
    assert_eq!(row["due_ms"].as_u64(), Some(due), "{row}");
    assert!(row["due"].as_str().unwrap().ends_with('Z'), "{row}");
    // Not even queued in its slot yet.
    let slots = json(&ok(d.run(&["slots", "--json"])));
    assert_eq!(slots, Value::Array(Vec::new()));

    d.kill_9();
    d.restart(&[]);
    let row = d.wait_until_state("later", "waiting");
    assert_eq!(
        row["due_ms"].as_u64(),
        Some(due),
        "the same due time: {row}"
    );
    let out = ok(d.run(&["wait", &id, "--json"]));
    let report = json(&out);
    assert_eq!(report["outcome"], "completed");
    assert_eq!(report["output"], "late");
    assert_eq!(report["attempts"], 1, "ran once: {report}");
    let out = ok(d.run(&[
        "events",
        "--json",
        "--task",
        &id,
        "--kind",
        "AttemptStarting",
    ]));
    let starts: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert!(
        starts[0]["at_ms"].as_u64().unwrap() >= due,
        "started no earlier than its time: {starts:?}, due {due}"
    );
}

#[test]
fn a_delayed_task_is_canceled_while_it_waits_and_a_past_time_runs_at_once() {
    let d = Daemon::start(&[]);
    ok(d.run(&["submit", &p("hello"), "--name", "never", "--delay", "1h"]));
    let out = ok(d.run(&["cancel", "never"]));
    assert!(out.stderr.contains("never"), "{}", out.stderr);
    let out = d.run(&["wait", "never", "--json"]);
    assert_eq!(out.code, Some(3), "{out:?}");
    let report = json(&out);
    assert_eq!(report["rejection"], "RemovedFromQueue", "{report}");
    let out = ok(d.run(&[
        "submit",
        &p("hello"),
        "--input",
        "now",
        "--at",
        "2020-01-01T00:00:00Z",
        "--wait",
    ]));
    assert_eq!(out.stdout, "now");
    let out = d.run(&["submit", &p("hello"), "--at", "tomorrow"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("RFC 3339"), "{}", out.stderr);
    let out = d.run(&[
        "submit",
        &p("hello"),
        "--at",
        "2030-01-01T00:00:00Z",
        "--delay",
        "1s",
    ]);
    assert_eq!(out.code, Some(2), "--at and --delay together: {out:?}");
}

#[test]
fn with_one_permit_waiting_attempts_start_by_priority_then_in_order() {
    let d = Daemon::start(&["--max-concurrent", "1"]);
    let started = d.spawn(&[
        "submit",
        &p("sleeper"),
        "--name",
        "blocker",
        "--param",
        "ms=1500",
    ]);
    drop(started);
    d.wait_until_state("blocker", "running");
    let mut ids = Vec::new();
    for (name, priority) in [
        ("low", "-1"),
        ("first", "0"),
        ("urgent", "9"),
        ("second", "0"),
        ("high", "5"),
    ] {
        ids.push(d.submit(&[&p("hello"), "--name", name, "--priority", priority]));
        d.wait_until_state(name, "waiting");
    }
    for id in &ids {
        ok(d.run(&["wait", id]));
    }
    let out = ok(d.run(&["events", "--json", "--kind", "AttemptStarting"]));
    let order: Vec<String> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON"))
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        order,
        ["blocker", "urgent", "high", "first", "second", "low"]
    );
}

#[test]
fn a_bad_expression_or_zone_is_refused_naming_it() {
    let d = Daemon::start(&[]);
    for (cron, tz, says) in [
        ("61 * * * *", None, "the minute field `61`"),
        ("0 0 * * * * *", None, "has 7 fields"),
        ("0 0 * JUNE *", None, "the month field `JUNE`"),
        ("@fortnightly", None, "unknown cron name `@fortnightly`"),
        (
            "0 3 * * *",
            Some("Europe/Atlantis"),
            "unknown time zone `Europe/Atlantis`",
        ),
    ] {
        let hello = p("hello");
        let mut args = vec!["schedule", "add", "bad", "--cron", cron, &hello];
        if let Some(tz) = tz {
            args.extend(["--tz", tz]);
        }
        let out = d.run(&args);
        assert_eq!(out.code, Some(2), "{cron} {tz:?}: {out:?}");
        assert!(out.stderr.contains(says), "{cron}: {}", out.stderr);
    }
    let out = d.run(&[
        "schedule",
        "add",
        "bad",
        "--cron",
        "* * * * *",
        "--name",
        "x",
        &p("hello"),
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    let out = d.run(&["schedule", "add", "42", "--cron", "* * * * *", &p("hello")]);
    assert_eq!(out.code, Some(2), "{out:?}");
    // A resource template's parameter missing is refused at add, not at
    // the first firing.
    let out = d.run(&[
        "schedule",
        "add",
        "deploys",
        "--cron",
        "@daily",
        &p("deploy"),
    ]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("env"), "{}", out.stderr);
    add(&d, &["dup", "--cron", "@daily", &p("hello")]);
    let out = d.run(&["schedule", "add", "dup", "--cron", "@daily", &p("hello")]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stderr.contains("exists"), "{}", out.stderr);
    assert!(schedules(&d).iter().all(|s| s["name"] == "dup"));
}

fn common_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn a_schedule_keeps_its_plugin_from_removal_and_collection() {
    let d = Daemon::start(&[]);
    add(
        &d,
        &[
            "nightly",
            "--cron",
            "0 3 * * *",
            &p("sleeper"),
            "--param",
            "ms=1",
        ],
    );
    let plugins = d.plugins();
    let sleeper = plugins
        .iter()
        .find(|r| r["name"] == "sleeper")
        .unwrap_or_else(|| panic!("the schedule's plugin is stored: {plugins:?}"));
    assert_eq!(sleeper["unfinished"], 1, "{sleeper}");
    let digest = sleeper["digest"].as_str().unwrap().to_owned();
    let out = d.run(&["plugins", "rm", &digest[..12]]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("schedule"), "{}", out.stderr);
    ok(d.run(&["plugins", "prune"]));
    assert!(d.plugins().iter().any(|r| r["digest"] == digest.as_str()));
    ok(d.run(&["schedule", "rm", "nightly"]));
    ok(d.run(&["plugins", "prune"]));
    assert!(!d.plugins().iter().any(|r| r["digest"] == digest.as_str()));
}
