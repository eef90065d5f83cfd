//! Flow control on slots through the real binary: `host slot set|unset|ls`
//! and the config file's `slots` table, a capacity of N against each
//! policy, a slot's own queue bound, a rule changed while work waits, rules
//! kept across a restart, a debounced slot, a rated slot across a restart;
//! and the invariants of capacity, rate and debounce checked over the
//! event history of random programs on a durable daemon killed with
//! SIGKILL at random moments.

use crate::invariants::{debounce_broken, most_owners, over_capacity, rate_broken};
use crate::{daemon, wire};

use std::time::{Duration, Instant};

use daemon::{Daemon, p};
use serde_json::{Value, json};
use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::protocol::{Reply, Request, SubmitRequest};
use taskhost::supervisor::EventKind;

/// The slot `key` as `host slots --json` shows it, once `ready` holds of
/// it (polled: the slot table moves on its own as owners end).
fn slot_when(d: &Daemon, key: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = d.run(&["slots", "--json"]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let slots: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
        if let Some(slot) = slots.into_iter().find(|s| s["key"] == key)
            && ready(&slot)
        {
            return slot;
        }
        assert!(
            Instant::now() < deadline,
            "slot {key} never got there: {}",
            out.stdout
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn owners(slot: &Value) -> usize {
    slot["owners"].as_array().map_or(0, Vec::len)
}

fn sleeper(d: &Daemon, slot: &str, name: &str, policy: &str) -> String {
    d.submit(&[
        &p("sleeper"),
        "--slot",
        slot,
        "--param",
        "ms=60000",
        "--name",
        name,
        "--policy",
        policy,
    ])
}

#[test]
fn a_slot_of_capacity_three_against_every_policy_and_a_rule_changed_while_work_waits() {
    let mut d = Daemon::start(&[]);
    let set = d.run(&["slot", "set", "db/*", "--capacity", "3", "--json"]);
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    assert_eq!(
        set.json(),
        json!({"pattern": "db/*", "capacity": 3, "max_queue": null, "debounce_ms": null, "max_wait_ms": null, "rate": null, "burst": null})
    );
    for i in 0..5 {
        sleeper(&d, "db/a", &format!("s{i}"), "queue");
    }
    let slot = slot_when(&d, "db/a", |s| owners(s) == 3);
    assert_eq!(
        (slot["capacity"].clone(), slot["queue_depth"].clone()),
        (json!(3), json!(2))
    );
    let table = d.run(&["slots"]);
    assert!(table.stdout.contains("3/3"), "{}", table.stdout);

    // Full: drop-if-running is rejected, Replace stops the oldest owner.
    let dropped = d.run(&[
        "submit",
        &p("hello"),
        "--slot",
        "db/a",
        "--policy",
        "drop-if-running",
        "--wait",
    ]);
    assert_eq!(dropped.code, Some(3), "{}", dropped.stderr);
    assert!(dropped.stderr.contains("SlotBusy"), "{}", dropped.stderr);
    let replaced = d.run(&[
        "submit",
        &p("hello"),
        "--slot",
        "db/a",
        "--policy",
        "replace",
        "--input",
        "r",
        "--wait",
    ]);
    assert_eq!(replaced.code, Some(0), "{}", replaced.stderr);
    let oldest = d.run(&["wait", "s0", "--json"]);
    assert_eq!(oldest.json()["outcome"], "canceled", "{}", oldest.stdout);
    // The replacement took the head's place (s3 ends superseded), ran,
    // and left its place to s4.
    let head = d.run(&["wait", "s3", "--json"]);
    assert_eq!(
        head.json()["rejection"],
        "SupersededByReplace",
        "{}",
        head.stdout
    );
    slot_when(&d, "db/a", |s| owners(s) == 3 && s["queue_depth"] == 0);
    sleeper(&d, "db/a", "s5", "queue");
    slot_when(&d, "db/a", |s| s["queue_depth"] == 1);

    // Raised while s5 waits: it starts at once.
    let raised = d.run(&["slot", "set", "db/*", "--capacity", "5"]);
    assert_eq!(raised.code, Some(0), "{}", raised.stderr);
    slot_when(&d, "db/a", |s| owners(s) == 4 && s["queue_depth"] == 0);
    // Lowered to one: nobody is stopped, a newcomer waits.
    let lowered = d.run(&["slot", "set", "db/*", "--capacity", "1"]);
    assert_eq!(lowered.code, Some(0), "{}", lowered.stderr);
    sleeper(&d, "db/a", "late", "queue");
    slot_when(&d, "db/a", |s| owners(s) == 4 && s["queue_depth"] == 1);

    // A slot's own queue bound.
    let narrow = d.run(&["slot", "set", "narrow", "--max-queue", "1"]);
    assert_eq!(narrow.code, Some(0), "{}", narrow.stderr);
    sleeper(&d, "narrow", "n0", "queue");
    sleeper(&d, "narrow", "n1", "queue");
    let full = d.run(&["submit", &p("hello"), "--slot", "narrow", "--wait"]);
    assert_eq!(full.code, Some(3), "{}", full.stderr);
    assert!(full.stderr.contains("QueueFull"), "{}", full.stderr);

    // Rules are kept across a restart, in order of their patterns.
    let out = d.run(&["shutdown", "--grace", "0s"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    d.finish(Duration::from_secs(30));
    d.restart(&[]);
    let ls = d.run(&["slot", "ls", "--json"]);
    assert_eq!(
        ls.json(),
        json!([
            {"pattern": "db/*", "capacity": 1, "max_queue": null, "debounce_ms": null, "max_wait_ms": null, "rate": null, "burst": null},
            {"pattern": "narrow", "capacity": null, "max_queue": 1, "debounce_ms": null, "max_wait_ms": null, "rate": null, "burst": null},
        ])
    );
    let unset = d.run(&["slot", "unset", "db/*"]);
    assert_eq!(unset.code, Some(0), "{}", unset.stderr);
    let again = d.run(&["slot", "unset", "db/*"]);
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(again.stderr.contains("host slot ls"), "{}", again.stderr);
    for (args, says) in [
        (&["slot", "set", "x", "--capacity", "0"][..], "at least 1"),
        (
            &["slot", "set", "", "--capacity", "2"][..],
            "must not be empty",
        ),
        (
            &["slot", "set", "x"][..],
            "give --capacity, --max-queue, --debounce or --rate",
        ),
        (&["slot", "set", "x", "--burst", "2"][..], "give --rate too"),
        (&["slot", "set", "x", "--rate", "5"][..], "STARTS/PERIOD"),
        (
            &["slot", "set", "x", "--max-wait", "1s"][..],
            "give --debounce too",
        ),
    ] {
        let out = d.run(args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
}

/// A plugin of WIT 0.1.2 declares a capacity (`pool`: 2): its slots hold
/// that many owners without a rule; an operator's rule wins either way;
/// an unset rule gives the plugin's back; a plugin of an older WIT and one
/// that declares nothing keep one owner per slot.
#[test]
fn a_plugin_declares_its_slots_capacity_and_a_rule_wins() {
    let d = Daemon::start(&[]);
    let pool = |name: &str| {
        d.submit(&[
            &p("pool"),
            "--param",
            "name=a",
            "--param",
            "ms=60000",
            "--name",
            name,
        ])
    };
    for name in ["w1", "w2", "w3"] {
        pool(name);
    }
    let slot = slot_when(&d, "pool/a", |s| owners(s) == 2 && s["queue_depth"] == 1);
    assert_eq!(slot["capacity"], 2, "{slot}");
    // The operator's rule wins: lowered, the owners run on and none starts.
    let out = d.run(&["slot", "set", "pool/*", "--capacity", "1"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    slot_when(&d, "pool/a", |s| s["capacity"] == 1 && owners(s) == 2);
    // Raised past the plugin's, the one waiting starts at once.
    let out = d.run(&["slot", "set", "pool/*", "--capacity", "3"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    slot_when(&d, "pool/a", |s| s["capacity"] == 3 && owners(s) == 3);
    // Unset: the plugin's own capacity again.
    let out = d.run(&["slot", "unset", "pool/*"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    pool("w4");
    slot_when(&d, "pool/a", |s| {
        s["capacity"] == 2 && owners(s) == 3 && s["queue_depth"] == 1
    });
    for name in ["w1", "w2", "w3", "w4"] {
        assert_eq!(d.run(&["cancel", name]).code, Some(0));
    }
    // A plugin that declares nothing: one owner per slot, as ever.
    sleeper(&d, "plain", "s1", "queue");
    sleeper(&d, "plain", "s2", "queue");
    let slot = slot_when(&d, "plain", |s| owners(s) == 1 && s["queue_depth"] == 1);
    assert_eq!(slot["capacity"], 1, "{slot}");
    for name in ["s1", "s2"] {
        assert_eq!(d.run(&["cancel", name]).code, Some(0));
    }
}

#[test]
fn the_config_files_slots_table_sets_rules_and_a_bad_one_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[slots.\"pool/*\"]\ncapacity = 2\nmax_queue = 7\nrate = \"100/s\"\nburst = 3\n\
         [slots.ci]\ndebounce = \"2s\"\n",
    )
    .unwrap();
    let d = Daemon::start(&["--config", good.to_str().unwrap()]);
    let ls = d.run(&["slot", "ls", "--json"]);
    assert_eq!(
        ls.json(),
        json!([
            {"pattern": "ci", "capacity": null, "max_queue": null, "debounce_ms": 2000, "max_wait_ms": null, "rate": null, "burst": null},
            {"pattern": "pool/*", "capacity": 2, "max_queue": 7, "debounce_ms": null, "max_wait_ms": null, "rate": "100/1.00s", "burst": 3},
        ])
    );
    sleeper(&d, "pool/a", "a", "queue");
    sleeper(&d, "pool/a", "b", "queue");
    slot_when(&d, "pool/a", |s| owners(s) == 2);

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[slots.\"x\"]\ncapacity = 0\n").unwrap();
    let out = crate::common::run_host(&[
        "serve",
        "--socket",
        dir.path().join("bad.sock").to_str().unwrap(),
        "--state-dir",
        dir.path().join("bad-state").to_str().unwrap(),
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("slots.\"x\"") && out.stderr.contains("at least 1"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounced_slot_runs_the_newest_of_each_burst() {
    let d = Daemon::start(&[]);
    let set = d.run(&[
        "slot",
        "set",
        "build",
        "--debounce",
        "300ms",
        "--max-wait",
        "5s",
        "--json",
    ]);
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    assert_eq!(set.json()["debounce_ms"], 300, "{}", set.stdout);
    assert_eq!(set.json()["max_wait_ms"], 5000, "{}", set.stdout);
    let events = wire::follow_events(&d.socket).await;
    // Two bursts of three; the newest of each runs.
    let mut ids = Vec::new();
    for burst in 0..2 {
        for i in 0..3 {
            let name = format!("b{burst}-{i}");
            let input = name.clone();
            ids.push(d.submit(&[
                &p("hello"),
                "--slot",
                "build",
                "--name",
                &name,
                "--input",
                &input,
            ]));
        }
        let waiting = d.ps();
        let held: Vec<&Value> = waiting.iter().filter(|t| t["state"] == "waiting").collect();
        assert_eq!(held.len(), 1, "one held at a time: {waiting:?}");
        let newest = d.run(&["wait", &format!("b{burst}-2"), "--json"]);
        assert_eq!(
            newest.json()["output"],
            format!("b{burst}-2"),
            "{}",
            newest.stdout
        );
        for i in 0..2 {
            let older = d.run(&["wait", &format!("b{burst}-{i}"), "--json"]);
            assert_eq!(older.code, Some(3), "{}", older.stderr);
            let reason = older.json()["reason"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let newer = &ids[burst * 3 + i + 1];
            assert!(reason.contains(&format!("({newer})")), "{reason}");
        }
    }
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let events = events.await.expect("the event follower");
    assert_eq!(debounce_broken(&events, |s| s == "build"), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_slot_starts_at_its_pace_and_shows_what_waits_as_throttled() {
    let d = Daemon::start(&[]);
    let set = d.run(&[
        "slot",
        "set",
        "api",
        "--rate",
        "10/s",
        "--burst",
        "2",
        "--capacity",
        "50",
        "--json",
    ]);
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    assert_eq!(set.json()["burst"], 2, "{}", set.stdout);
    let events = wire::follow_events(&d.socket).await;
    let client = wire::connect(&d.socket).await;
    let hello = wire::upload_plugin(&client, "hello").await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let mut r = SubmitRequest::new(hello);
        r.slot = Some("api".into());
        r.name = Some(format!("call-{i}"));
        if let Reply::Submitted(s) = wire::call(&client, Request::Submit(Box::new(r))).await {
            ids.push(s.id);
        }
    }
    assert_eq!(ids.len(), 20);
    // Beyond the burst, the rest wait for the rate, shown as throttled
    // with the time of their next possible start.
    let rows = d.ps();
    let throttled: Vec<&Value> = rows.iter().filter(|t| t["state"] == "throttled").collect();
    assert!(!throttled.is_empty(), "{rows:?}");
    assert!(
        throttled.iter().all(|t| t["due_ms"].is_u64()),
        "{throttled:?}"
    );
    for id in &ids {
        let report = client.wait((*id).into()).await.expect("a report");
        assert!(matches!(
            report.outcome,
            taskhost::outcome::TaskOutcome::Completed { .. }
        ));
    }
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let events = events.await.expect("the event follower");
    let starts: Vec<(String, Duration)> = events
        .iter()
        .filter(|e| e.kind == EventKind::AttemptStarting && e.slot.as_deref() == Some("api"))
        .map(|e| ("api".to_owned(), Duration::from_millis(e.at_ms)))
        .collect();
    assert_eq!(starts.len(), 20);
    let rate = |slot: &str| (slot == "api").then_some((10, Duration::from_secs(1), 2));
    // Event times are read a little after each start: windows 20 ms short.
    assert_eq!(
        rate_broken(&starts, rate, Duration::from_millis(20)),
        Ok(())
    );
    let first = starts.iter().map(|s| s.1).min().unwrap();
    let last = starts.iter().map(|s| s.1).max().unwrap();
    // 3 at once, then one every 100 ms.
    assert!(
        last - first >= Duration::from_millis(1_600),
        "{:?}",
        last - first
    );
}

/// A restart (here after SIGKILL) does not give a rate-limited slot a
/// fresh budget: its first start waits until a period after the latest
/// start the store recorded, so no window of the period holds more starts
/// across the restart than the rate and burst allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_holds_a_rated_slot_until_a_period_after_its_latest_start() {
    let mut d = Daemon::start(&[]);
    let set = d.run(&["slot", "set", "api", "--rate", "3/2s", "--burst", "1"]);
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    let mut starts: Vec<(String, Duration)> = Vec::new();
    for round in 0..2 {
        let events = wire::follow_events(&d.socket).await;
        let client = wire::connect(&d.socket).await;
        let hello = wire::upload_plugin(&client, "hello").await;
        let mut ids = Vec::new();
        for i in 0..4 {
            let mut r = SubmitRequest::new(hello);
            r.slot = Some("api".into());
            r.name = Some(format!("r{round}-{i}"));
            if let Reply::Submitted(s) = wire::call(&client, Request::Submit(Box::new(r))).await {
                ids.push(s.id);
            }
        }
        for id in &ids {
            client.wait((*id).into()).await.expect("a report");
        }
        d.kill_9();
        let events = events.await.expect("the event follower");
        starts.extend(
            events
                .iter()
                .filter(|e| e.kind == EventKind::AttemptStarting)
                .map(|e| ("api".to_owned(), Duration::from_millis(e.at_ms))),
        );
        d.restart(&[]);
    }
    assert_eq!(starts.len(), 8, "{starts:?}");
    starts.sort_by_key(|s| s.1);
    // Two at once (one of burst), then one every 667 ms; after the
    // restart, the first a period (2 s) after the last before it.
    let rate = |slot: &str| (slot == "api").then_some((3, Duration::from_secs(2), 1));
    assert_eq!(
        rate_broken(&starts, rate, Duration::from_millis(20)),
        Ok(()),
        "{starts:?}"
    );
    let gap = starts[4].1 - starts[3].1;
    assert!(gap >= Duration::from_millis(1980), "{gap:?}: {starts:?}");
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// Slots `c1`, `c2` and `c3` hold 1, 2 and 3 owners (`rt` 3 too).
fn capacity(slot: &str) -> usize {
    match slot {
        "c2" => 2,
        "c3" | "rt" => 3,
        _ => 1,
    }
}

/// Four rounds of 60 random submissions over `c1`–`c3` (and, beside
/// them, a slot rated 5/s with a burst of 2 and one debounced by 100 ms),
/// each round ended by SIGKILL at a random moment and the daemon started
/// again: no round holds more owners than a slot's capacity (and `c3`
/// reaches 3, so a checker one short fails), no round places a debounced
/// submission that a newer one superseded, and no window of a second
/// holds more of the rated slot's recorded starts than 7, across the
/// kills too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_programs_across_random_kills_keep_capacity_rate_and_debounce() {
    let seed = std::env::var("TASKHOST_FLOW_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("flow soak: seed {seed} (TASKHOST_FLOW_SEED replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut d = Daemon::start(&["--max-slot-queue", "1000"]);
    for (slot, n) in [("c2", "2"), ("c3", "3")] {
        let out = d.run(&["slot", "set", slot, "--capacity", n]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    // A rated slot and a debounced one beside them.
    let rated = ["rt", "--rate", "5/s", "--burst", "2", "--capacity", "3"];
    for rule in [&rated[..], &["db", "--debounce", "100ms"]] {
        let out = d.run(&[&["slot", "set"][..], rule].concat());
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    let mut rated_ids = Vec::new();
    let mut rounds = Vec::new();
    for round in 0..4 {
        let events = wire::follow_events(&d.socket).await;
        let client = wire::connect(&d.socket).await;
        let sleeper = wire::upload_plugin(&client, "sleeper").await;
        let mut ids = Vec::new();
        for i in 0..60u32 {
            let mut r = SubmitRequest::new(sleeper);
            r.slot = Some(format!("c{}", 1 + i % 3));
            r.policy = Some(match rng.u8(0..6) {
                0 => AdmissionPolicy::Replace,
                1 => AdmissionPolicy::DropIfRunning,
                _ => AdmissionPolicy::Queue,
            });
            r.params = wire::params(&[("ms", &rng.u32(0..120).to_string())]);
            r.name = Some(format!("r{round}-{i}"));
            if let Reply::Submitted(s) = wire::call(&client, Request::Submit(Box::new(r))).await {
                ids.push(s.id);
            }
            let side = match rng.u8(0..6) {
                0 => Some("rt"),
                1 => Some("db"),
                _ => None,
            };
            if let Some(slot) = side {
                let mut r = SubmitRequest::new(sleeper);
                r.slot = Some(slot.into());
                r.params = wire::params(&[("ms", &rng.u32(0..120).to_string())]);
                r.name = Some(format!("r{round}-{i}-{slot}"));
                if let Reply::Submitted(s) = wire::call(&client, Request::Submit(Box::new(r))).await
                    && slot == "rt"
                {
                    rated_ids.push(s.id);
                }
            }
            if rng.u8(0..8) == 0
                && let Some(id) = ids.get(rng.usize(0..ids.len()))
            {
                let _ = client
                    .request(Request::Cancel {
                        target: (*id).into(),
                        wait: false,
                    })
                    .await;
            }
        }
        // The kill comes at a random moment while the program runs.
        tokio::time::sleep(Duration::from_millis(rng.u64(50..600))).await;
        d.kill_9();
        let events = events.await.expect("the event follower");
        // Every owner of this run died with it: each run is checked alone.
        if let Err(broken) = over_capacity(&events, capacity) {
            panic!("round {round}: {broken}");
        }
        if let Err(broken) = debounce_broken(&events, |slot| slot == "db") {
            panic!("round {round}: {broken}");
        }
        rounds.push(events);
        d.restart(&["--max-slot-queue", "1000"]);
    }
    // The checks held, and the programs filled the slots to their
    // capacity: a checker expecting one owner fewer fails on them.
    let top = rounds
        .iter()
        .filter_map(|events| most_owners(events).get("c3").copied())
        .max();
    assert_eq!(top, Some(3));
    let planted = |slot: &str| if slot == "c3" { 2 } else { capacity(slot) };
    let off_by_one = rounds
        .iter()
        .any(|events| over_capacity(events, planted).is_err());
    assert!(off_by_one, "a capacity off by one went unnoticed");
    // The rated slot's starts across every kill and restart: an attempt
    // announced but not recorded before a kill never ran (its task, on
    // recovery, starts that attempt again, or ends with fewer), so only
    // each attempt's last announcement within what the store recorded
    // counts.
    let events = wire::follow_events(&d.socket).await;
    let client = wire::connect(&d.socket).await;
    let mut recorded = std::collections::HashMap::new();
    for id in &rated_ids {
        let report = client.wait((*id).into()).await.expect("a report");
        recorded.insert(*id, report.attempts);
    }
    let out = d.run(&["shutdown", "--grace", "0s"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    rounds.push(events.await.expect("the event follower"));
    let mut last = std::collections::HashMap::new();
    for e in rounds.iter().flatten() {
        if e.kind == EventKind::AttemptStarting
            && e.slot.as_deref() == Some("rt")
            && let (Some(id), Some(attempt)) = (e.task_id, e.attempt)
            && attempt <= recorded.get(&id).copied().unwrap_or(0)
        {
            last.insert((id, attempt), Duration::from_millis(e.at_ms));
        }
    }
    let starts: Vec<(String, Duration)> =
        last.into_values().map(|t| ("rt".to_owned(), t)).collect();
    let rate = |slot: &str| (slot == "rt").then_some((5, Duration::from_secs(1), 2));
    // Event times are read a little after each start: windows 20 ms short.
    assert_eq!(
        rate_broken(&starts, rate, Duration::from_millis(20)),
        Ok(()),
        "{} starts of the rated slot",
        starts.len()
    );
    let placed = rounds
        .iter()
        .flatten()
        .filter(|e| e.kind == EventKind::DelayDue && e.slot.as_deref() == Some("db"))
        .count();
    println!(
        "{} recorded starts of the rated slot, {placed} debounced submissions placed",
        starts.len()
    );
    assert!(
        placed > 0,
        "no debounced submission was placed: the run proves little"
    );
    assert!(
        most_starts_in_a_second(&starts) > 5,
        "the rated slot never ran ahead of its pace: the run proves little"
    );
}

/// The most starts in any window of a second.
fn most_starts_in_a_second(starts: &[(String, Duration)]) -> usize {
    let mut times: Vec<Duration> = starts.iter().map(|s| s.1).collect();
    times.sort();
    let (mut lo, mut most) = (0, 0);
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= Duration::from_secs(1) {
            lo += 1;
        }
        most = most.max(hi + 1 - lo);
    }
    most
}
