//! Flow control on slots across a cluster of three real nodes on one real
//! PostgreSQL: the rules set through one node and read by every node, a
//! slot of capacity 2 filled from two nodes, a Replace that meets it full,
//! a rule raised while work waits, a plugin's declared capacity, a bad
//! rule refused, a debounced slot's bursts, a rate shared by the nodes; and
//! the invariants of capacity, rate and debounce checked over the recorded
//! attempts of random submissions while one node is killed with SIGKILL and
//! one is frozen with SIGSTOP past its lease.

use crate::cluster::{Attempt, attempts, node, steady_node};
use crate::{daemon, postgres};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use daemon::{Daemon, LIMIT, p};
use postgres::Postgres;
use serde_json::Value;

fn ok(via: &Daemon, args: &[&str]) -> String {
    let out = via.run(args);
    assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
    out.stdout
}

/// The slot `key` as `host slots --json` on `via` shows it, its owners and
/// queue by name, once `ready` holds of it.
fn slot_when(via: &Daemon, key: &str, ready: impl Fn(&Value, &[String], &[String]) -> bool) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let names: HashMap<u64, String> = via
            .ps()
            .iter()
            .filter_map(|r| Some((r["id"].as_u64()?, r["name"].as_str()?.to_owned())))
            .collect();
        let named = |ids: &Value| -> Vec<String> {
            ids.as_array()
                .into_iter()
                .flatten()
                .map(|id| {
                    id.as_u64()
                        .and_then(|id| names.get(&id).cloned())
                        .unwrap_or_else(|| format!("?{id}"))
                })
                .collect()
        };
        let slots: Vec<Value> = serde_json::from_str(&ok(via, &["slots", "--json"])).unwrap();
        let slot = slots.into_iter().find(|s| s["key"] == key);
        if let Some(slot) = &slot
            && ready(slot, &named(&slot["owners"]), &named(&slot["queued"]))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "slot {key} never got there: {slot:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sleeper(via: &Daemon, slot: &str, name: &str, policy: &str) {
    ok(
        via,
        &[
            "submit",
            &p("sleeper"),
            "--slot",
            slot,
            "--name",
            name,
            "--policy",
            policy,
            "--param",
            "ms=600000",
        ],
    );
}

fn rules(via: &Daemon) -> Vec<Value> {
    serde_json::from_str(&ok(via, &["slot", "ls", "--json"])).unwrap()
}

#[test]
fn capacity_replace_and_a_raised_rule_hold_across_three_nodes() {
    let pg = Postgres::start();
    let [a, b, c] = ["a", "b", "c"].map(|n| steady_node(&pg, n, &[]));
    ok(&a, &["slot", "set", "db/*", "--capacity", "2"]);
    for via in [&a, &b, &c] {
        let rules = rules(via);
        assert_eq!(rules.len(), 1, "{rules:?}");
        assert_eq!(rules[0]["pattern"], "db/*");
        assert_eq!(rules[0]["capacity"], 2);
    }
    // A bad rule is refused through any node, naming the fix.
    let out = b.run(&["slot", "set", "api", "--capacity", "0"]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("--capacity"), "{}", out.stderr);

    // Two owners, admitted through two nodes; a third waits.
    sleeper(&a, "db/x", "one", "queue");
    sleeper(&b, "db/x", "two", "queue");
    slot_when(&c, "db/x", |s, owners, _| {
        s["capacity"] == 2 && owners == ["one", "two"]
    });
    sleeper(&c, "db/x", "three", "queue");
    sleeper(&a, "db/x", "tail", "queue");
    slot_when(&a, "db/x", |_, owners, queued| {
        owners == ["one", "two"] && queued == ["three", "tail"]
    });
    // A Replace meets the full slot: the oldest owner is stopped and the
    // queue's head displaced; the replacement takes its place, ahead of
    // the queue's tail, which stays.
    sleeper(&b, "db/x", "four", "replace");
    slot_when(&c, "db/x", |_, owners, queued| {
        owners == ["two", "four"] && queued == ["tail"]
    });
    for (name, outcome) in [("one", "canceled"), ("three", "rejected")] {
        let out = a.run(&["wait", name, "--json"]);
        let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(json["outcome"], outcome, "{name}: {json}");
    }

    // A rule raised while work waits admits it at once, on every node.
    ok(&b, &["slot", "set", "db/*", "--capacity", "3"]);
    slot_when(&a, "db/x", |s, owners, queued| {
        s["capacity"] == 3 && owners == ["two", "four", "tail"] && queued.is_empty()
    });
    // Unset through one node: every node's new slots take the default.
    ok(&c, &["slot", "unset", "db/*"]);
    assert!(rules(&a).is_empty());
    sleeper(&a, "db/y", "five", "queue");
    sleeper(&b, "db/y", "six", "queue");
    slot_when(&c, "db/y", |s, owners, queued| {
        s["capacity"] == 1 && owners == ["five"] && queued == ["six"]
    });
    // A plugin's declared capacity (`pool`: 2) counts without a rule, on
    // every node; a rule wins.
    for (via, name) in [(&a, "p1"), (&b, "p2"), (&c, "p3")] {
        let out = via.run(&[
            "submit",
            &p("pool"),
            "--param",
            "name=x",
            "--param",
            "ms=600000",
            "--name",
            name,
        ]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    slot_when(&b, "pool/x", |s, owners, queued| {
        s["capacity"] == 2 && owners == ["p1", "p2"] && queued == ["p3"]
    });
    ok(&c, &["slot", "set", "pool/*", "--capacity", "3"]);
    slot_when(&a, "pool/x", |s, owners, queued| {
        s["capacity"] == 3 && owners == ["p1", "p2", "p3"] && queued.is_empty()
    });
    for name in ["two", "four", "tail", "five", "six", "p1", "p2", "p3"] {
        ok(&a, &["cancel", name]);
    }
}

/// The `host wait --json` of task `id` through `via`.
fn waited(via: &Daemon, id: &str) -> (Option<i32>, Value) {
    let out = via.run(&["wait", id, "--json"]);
    let json = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("wait {id}: {e}: {:?} {}", out.stdout, out.stderr));
    (out.code, json)
}

/// A debounced slot across nodes: a burst through three nodes runs only
/// its newest (each older one rejected naming the next), checked in the
/// recorded attempts too; and `max-wait` places the newest of a run that
/// keeps coming before its own debounce would have.
#[test]
fn a_debounced_slot_runs_the_newest_of_each_burst_across_nodes() {
    let pg = Postgres::start();
    let [a, b, c] = ["a", "b", "c"].map(|n| steady_node(&pg, n, &[]));
    ok(&a, &["slot", "set", "deb", "--debounce", "2s"]);
    let nodes = [&a, &b, &c];
    let ids: Vec<String> = (0..5)
        .map(|i| {
            let input = format!("n{i}");
            nodes[i % 3].submit(&[&p("hello"), "--slot", "deb", "--input", &input])
        })
        .collect();
    for i in 0..4 {
        let (code, json) = waited(&c, &ids[i]);
        assert_eq!(code, Some(3), "{json}");
        assert_eq!(json["outcome"], "rejected", "{json}");
        let reason = json["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&format!("a newer submission ({})", ids[i + 1])),
            "{reason}"
        );
    }
    let (code, json) = waited(&b, &ids[4]);
    assert_eq!(
        (code, &json["output"]),
        (Some(0), &Value::from("n4")),
        "{json}"
    );
    let rows = attempts(&pg, "deb");
    assert_eq!(rows.len(), 1, "one run of the burst: {rows:?}");
    assert_eq!(rows[0].task.to_string(), ids[4]);

    // max-wait: submissions 1.5 s apart under a 3 s debounce keep
    // superseding; 4 s after the first, the newest is placed anyway.
    ok(
        &b,
        &["slot", "set", "mw", "--debounce", "3s", "--max-wait", "4s"],
    );
    let mut run = Vec::new();
    for (i, via) in nodes.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        run.push(via.submit(&[&p("hello"), "--slot", "mw", "--input", "x"]));
    }
    let (code, json) = waited(&a, &run[2]);
    assert_eq!(code, Some(0), "{json}");
    let submitted = |id: &str| -> u64 {
        pg.psql(&format!(
            "SELECT submitted_ms FROM taskhost_tasks WHERE id = {id}"
        ))
        .trim()
        .parse()
        .unwrap()
    };
    let started = attempts(&pg, "mw")[0].started;
    let (first, last) = (submitted(&run[0]), submitted(&run[2]));
    assert!(
        started >= first + 4000 - 50 && started < last + 3000,
        "placed at {} ms after the first and {} ms after its own submission",
        started - first,
        started.saturating_sub(last)
    );
}

/// The most recorded attempt starts in any window of `period` ms.
fn most_starts_in(rows: &[Attempt], period: u64) -> usize {
    let mut starts: Vec<u64> = rows.iter().map(|a| a.started).collect();
    starts.sort_unstable();
    let (mut lo, mut most) = (0, 0);
    for hi in 0..starts.len() {
        while starts[hi] - starts[lo] >= period {
            lo += 1;
        }
        most = most.max(hi + 1 - lo);
    }
    most
}

/// A rate across three nodes: each node starts its share (a third of the
/// rate and of the burst), so all of them together never start more than
/// the rate and burst in any period, checked over the recorded attempt
/// starts; and the rate binds (the starts take as long as it says).
#[test]
fn a_rate_holds_across_three_nodes() {
    let pg = Postgres::start();
    let [a, b, c] = ["a", "b", "c"].map(|n| steady_node(&pg, n, &[]));
    ok(
        &a,
        &[
            "slot",
            "set",
            "rated",
            "--capacity",
            "20",
            "--rate",
            "10/s",
            "--burst",
            "3",
        ],
    );
    let nodes = [&a, &b, &c];
    let total = 60;
    let ids: Vec<String> = (0..total)
        .map(|i| nodes[i % 3].submit(&[&p("hello"), "--slot", "rated", "--input", "x"]))
        .collect();
    for id in &ids {
        let (code, json) = waited(&a, id);
        assert_eq!(code, Some(0), "{json}");
    }
    let rows = attempts(&pg, "rated");
    assert_eq!(rows.len(), total, "{rows:?}");
    let most = most_starts_in(&rows, 1000);
    assert!(most <= 10 + 3, "{most} starts in one second: {rows:?}");
    let span = rows.last().unwrap().started - rows[0].started;
    assert!(
        span >= 4000,
        "{total} starts at 10/s with a burst of 3 took only {span} ms"
    );
    let on: std::collections::HashSet<u64> = rows.iter().map(|a| a.node).collect();
    println!(
        "{total} starts over {span} ms on {} nodes, at most {most} in a second",
        on.len()
    );
}

/// The most attempts of one slot running at once, over its recorded
/// intervals (an attempt that ends as another starts in the same
/// millisecond is over by then).
fn most_at_once(slot: &str, rows: &[Attempt]) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for a in rows {
        let ended = a
            .ended
            .unwrap_or_else(|| panic!("slot {slot}: attempt {a:?} never ended"));
        edges.push((a.started, 1));
        edges.push((ended, -1));
    }
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[test]
fn the_checker_of_attempt_intervals_catches_one_too_many() {
    let at = |started, ended| Attempt {
        task: 0,
        node: 0,
        started,
        ended: Some(ended),
        result: String::new(),
    };
    // Two at once, a third as one ends: two at most.
    assert_eq!(most_at_once("s", &[at(0, 10), at(5, 20), at(10, 30)]), 2);
    // A third inside both: three.
    assert_eq!(most_at_once("s", &[at(0, 10), at(5, 20), at(9, 30)]), 3);
}

/// Random submissions (mostly Queue, some Replace and DropIfRunning) of
/// short sleepers over slots of capacity 1, 2 and 3, a rated slot and a
/// debounced one, through one node of three; a second node is killed with
/// SIGKILL and started again, the third frozen with SIGSTOP past its lease
/// and woken. Every task ends, and over the recorded attempts: no slot's
/// attempts ever overlap more than its capacity (the slots of capacity 2
/// and 3 reach it, so a checker one short fails); the rated slot never
/// starts more in a second than its rate and burst (and reaches that);
/// each debounce window runs once, its newest submission.
#[test]
fn flow_rules_hold_across_three_nodes_with_one_killed_and_one_frozen() {
    let seed: u64 = std::env::var("TASKHOST_FLOW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("TASKHOST_FLOW_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let pg = Postgres::start();
    let bounds = ["--max-slot-queue", "10000", "--max-total-pending", "10000"];
    let a = node(&pg, "a", &bounds);
    let mut b = node(&pg, "b", &bounds);
    let c = node(&pg, "c", &bounds);
    ok(&a, &["slot", "set", "k2-*", "--capacity", "2"]);
    ok(&a, &["slot", "set", "k3-*", "--capacity", "3"]);
    // A third of the rate and burst on each of three nodes.
    let rated = ["--capacity", "6", "--rate", "3/s", "--burst", "3"];
    ok(&a, &[&["slot", "set", "rated"][..], &rated].concat());
    ok(&a, &["slot", "set", "deb", "--debounce", "150ms"]);
    let slots = [
        ("k1-0", 1),
        ("k2-0", 2),
        ("k2-1", 2),
        ("k3-0", 3),
        ("rated", 6),
        ("deb", 1),
    ];
    // Each shared slot filled at once, so that reaching its capacity does
    // not hang on how fast a loaded machine submits the random ones.
    let filling: Vec<_> = slots[1..4]
        .iter()
        .flat_map(|&(slot, capacity)| std::iter::repeat_n(slot, capacity))
        .map(|slot| {
            let args = [
                "submit",
                &p("sleeper"),
                "--slot",
                slot,
                "--param",
                "ms=1500",
            ];
            crate::common::host()
                .args(a.args(&args))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn host")
        })
        .collect();
    for child in filling {
        let out = child.wait_with_output().expect("host submit");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut debounced = Vec::new();
    let total = 240;
    for i in 0..total {
        // A quarter to the rated slot: more than its rate allows.
        let (slot, _) = match rng.u32(..4) {
            0 => slots[4],
            _ => slots[rng.usize(..slots.len())],
        };
        let policy = match rng.u32(..20) {
            0..14 => "queue",
            14..17 => "replace",
            _ => "drop-if-running",
        };
        let ms = (20 + rng.u32(..180)).to_string();
        let out = a.run(&[
            "submit",
            &p("sleeper"),
            "--slot",
            slot,
            "--policy",
            policy,
            "--param",
            &format!("ms={ms}"),
        ]);
        assert!(matches!(out.code, Some(0 | 3)), "{}", out.stderr);
        if slot == "deb" {
            debounced.push(out.stdout.trim().to_owned());
        }
        if i == total / 3 {
            let mut process = b.process.take().expect("running");
            process.child.kill().expect("SIGKILL");
            let _ = process.child.wait();
            let url = pg.url();
            let mut args = vec!["--store", &url, "--node-name", "b-again"];
            args.extend(["--lease", "2s", "--lease-renew", "200ms"]);
            args.extend(["--cluster-poll", "200ms"]);
            args.extend(bounds);
            b.restart(&args);
        }
        if i == total / 2 {
            let pid = c.pid().to_string();
            let signal = |name: &str| {
                let status = std::process::Command::new("kill")
                    .args([name, &pid])
                    .status()
                    .expect("kill");
                assert!(status.success());
            };
            signal("-STOP");
            std::thread::sleep(Duration::from_millis(3000));
            signal("-CONT");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let left = pg.psql("SELECT count(*) FROM taskhost_tasks WHERE state <> 'finished'");
        if left.trim() == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} tasks never ended",
            left.trim()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut checked = 0;
    for (slot, capacity) in slots {
        let rows = attempts(&pg, slot);
        checked += rows.len();
        let most = most_at_once(slot, &rows);
        assert!(
            most <= capacity,
            "slot {slot} (capacity {capacity}) ran {most} attempts at once: {rows:?}"
        );
        if capacity > 1 && slot.starts_with('k') {
            assert_eq!(
                most, capacity,
                "slot {slot} never reached its capacity: the run proves little"
            );
        }
    }
    let rows = attempts(&pg, "rated");
    let most = most_starts_in(&rows, 1000);
    let span = rows.last().map_or(0, |a| a.started) - rows.first().map_or(0, |a| a.started);
    println!(
        "rated: {} starts over {span} ms, at most {most} in a second",
        rows.len()
    );
    assert!(
        most <= 3 + 3,
        "the rated slot started {most} in one second: {rows:?}"
    );
    assert!(
        most > 3,
        "the rated slot never started more than its pace in a second: the run proves little"
    );
    debounce_held(&pg, &a, &debounced, 150);
    let nodes = pg.psql("SELECT count(DISTINCT node) FROM taskhost_attempts");
    println!(
        "{checked} attempt intervals over {} nodes checked",
        nodes.trim()
    );
}

/// Each debounce window of `ids` (submissions to one slot debounced by
/// `debounce_ms`, in the order submitted) ran once, its newest submission:
/// one followed by another inside its window was superseded, naming that
/// one, and never ran; one not followed inside its window was not. The
/// run has both, so a checker that allows either fails.
fn debounce_held(pg: &Postgres, via: &Daemon, ids: &[String], debounce_ms: u64) {
    // Clocks read a few milliseconds apart (the submitting node's and the
    // one that placed the held submission).
    const SLACK: u64 = 25;
    let submitted: Vec<u64> = ids
        .iter()
        .map(|id| {
            pg.psql(&format!(
                "SELECT submitted_ms FROM taskhost_tasks WHERE id = {id}"
            ))
            .trim()
            .parse()
            .expect("a submission time")
        })
        .collect();
    let ran: std::collections::HashSet<String> = attempts(pg, "deb")
        .iter()
        .map(|a| a.task.to_string())
        .collect();
    let (mut superseded, mut kept) = (0, 0);
    for (i, id) in ids.iter().enumerate() {
        let (_, json) = waited(via, id);
        let reason = json["reason"].as_str().unwrap_or_default().to_owned();
        let named = reason.contains("a newer submission");
        let Some(next) = ids.get(i + 1) else {
            assert!(!named, "the last submission {id} was superseded: {json}");
            continue;
        };
        let gap = submitted[i + 1].saturating_sub(submitted[i]);
        if gap + SLACK < debounce_ms {
            superseded += 1;
            assert!(
                reason.contains(&format!("a newer submission ({next})")) && !ran.contains(id),
                "{id} was followed by {next} {gap} ms later, inside its window: {json}"
            );
        } else if gap > debounce_ms + SLACK {
            kept += 1;
            assert!(
                !named,
                "{id} was superseded though {next} came {gap} ms later: {json}"
            );
        }
    }
    assert!(
        superseded > 0 && kept > 0,
        "{superseded} submissions superseded and {kept} not: the run proves little"
    );
}
