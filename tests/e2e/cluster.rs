//! Cluster mode: several `host serve --store postgres://…` nodes on one
//! real PostgreSQL (started by the test, `common/postgres.rs`), as real
//! processes. The controller's rules across nodes, a node killed (its work
//! goes on elsewhere after its lease), a node paused past its lease (its
//! late writes are refused), notifications off (polling still delivers a
//! cancel), the HTTP API of one node answering for the whole cluster, and
//! a soak checked against the recorded attempt intervals.

use crate::{common, daemon, http, partition, postgres};

use common::run_host;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use daemon::{Daemon, LIMIT, p};
use partition::Partition;
use postgres::Postgres;

/// A node of the cluster on `pg`, named `name`, with a short lease so that
/// takeovers happen within the test's patience.
pub(crate) fn node(pg: &Postgres, name: &str, extra: &[&str]) -> Daemon {
    node_with_lease(pg, name, "2s", extra)
}

/// A node whose lease outlasts a loaded machine's pauses: the tests that do
/// not kill or pause nodes must see no takeover.
pub(crate) fn steady_node(pg: &Postgres, name: &str, extra: &[&str]) -> Daemon {
    node_with_lease(pg, name, "10s", extra)
}

pub(crate) fn node_with_lease(pg: &Postgres, name: &str, lease: &str, extra: &[&str]) -> Daemon {
    node_at(&pg.url(), name, lease, extra)
}

/// A node that reaches the database at `url`.
pub(crate) fn node_at(url: &str, name: &str, lease: &str, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--store",
        url,
        "--node-name",
        name,
        "--lease",
        lease,
        "--lease-renew",
        "200ms",
        "--cluster-poll",
        "200ms",
        "--grace",
        "5s",
    ];
    args.extend_from_slice(extra);
    Daemon::start(&args)
}

/// Polls `host ps` on `via` until the task named `name` is in `state` on
/// node `on` (any node if None); returns its row.
pub(crate) fn wait_until(
    via: &Daemon,
    name: &str,
    state: &str,
    on: Option<&str>,
) -> serde_json::Value {
    let deadline = Instant::now() + LIMIT;
    loop {
        let rows = via.ps();
        if let Some(row) = rows
            .iter()
            .find(|t| t["name"] == name && t["state"] == state && on.is_none_or(|n| t["node"] == n))
        {
            return row.clone();
        }
        assert!(
            Instant::now() < deadline,
            "`{name}` never became {state} on {on:?}: ps shows {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `host wait NAME --json` on `via`: (exit code, the result object).
pub(crate) fn wait_json(via: &Daemon, target: &str) -> (Option<i32>, serde_json::Value) {
    let out = via.run(&["wait", target, "--json"]);
    let json = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "wait {target}: not JSON ({e}): {:?} / {}",
            out.stdout, out.stderr
        )
    });
    (out.code, json)
}

/// The outcomes the cluster's events tell of for the task `name`, as `via`
/// shows them (`host events --json --task NAME`).
fn finished_events(via: &Daemon, name: &str) -> Vec<String> {
    let out = via.run(&["events", "--json", "--task", name]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "TaskFinished")
        .map(|e| e["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// One recorded attempt.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub task: u64,
    pub node: u64,
    pub started: u64,
    pub ended: Option<u64>,
    pub result: String,
}

/// The recorded attempts of a slot, by start.
pub(crate) fn attempts(pg: &Postgres, slot: &str) -> Vec<Attempt> {
    pg.psql(&format!(
        "SELECT task_id, node, started_ms, ended_ms, coalesce(result, '') \
         FROM taskhost_attempts WHERE slot = '{slot}' ORDER BY started_ms, task_id"
    ))
    .lines()
    .map(|l| {
        let f: Vec<&str> = l.split('|').collect();
        Attempt {
            task: f[0].parse().unwrap(),
            node: f[1].parse().unwrap(),
            started: f[2].parse().unwrap(),
            ended: f[3].parse().ok(),
            result: f[4].to_owned(),
        }
    })
    .collect()
}

/// No two recorded attempts of one slot overlap in time, and every one ended.
fn assert_no_overlap(slot: &str, rows: &[Attempt]) {
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let ended = a
            .ended
            .unwrap_or_else(|| panic!("slot {slot}: attempt {a:?} never ended"));
        assert!(
            ended <= b.started,
            "slot {slot}: attempt {a:?} overlaps attempt {b:?} (two owners at once)"
        );
    }
}

#[test]
fn the_controller_rules_hold_across_nodes() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &["--max-slot-queue", "2"]);
    let n2 = steady_node(&pg, "n2", &["--max-slot-queue", "2"]);
    let n3 = steady_node(&pg, "n3", &["--max-slot-queue", "2"]);

    // Order: three submissions of one slot from three nodes run one after
    // the other, in the order they were accepted.
    let sleeper = p("sleeper");
    // Each submission returns once committed, so this is their order.
    let ids: Vec<String> = [(&n1, "o1"), (&n2, "o2"), (&n3, "o3")]
        .iter()
        .map(|(via, name)| {
            via.submit(&[
                &sleeper, "--slot", "order", "--name", name, "--param", "ms=200",
            ])
        })
        .collect();
    for name in ["o1", "o2", "o3"] {
        let (code, json) = wait_json(&n2, name);
        assert_eq!(code, Some(0), "{name}: {json}");
    }
    let rows = attempts(&pg, "order");
    let order: Vec<String> = rows.iter().map(|r| r.task.to_string()).collect();
    assert_eq!(
        order, ids,
        "the slot ran its work in the order it was accepted"
    );
    assert_no_overlap("order", &rows);

    // Busy: drop-if-running is refused while the slot's owner runs on
    // another node.
    let owner = n1.submit(&[
        &sleeper, "--slot", "b", "--name", "owner", "--param", "ms=60000",
    ]);
    let running = wait_until(&n3, "owner", "running", None);
    assert!(
        running["node"].is_string(),
        "ps names the owner's node: {running}"
    );
    let busy = n2.run(&[
        "submit",
        &p("hello"),
        "--slot",
        "b",
        "--policy",
        "drop-if-running",
        "--wait",
    ]);
    assert_eq!(busy.code, Some(3), "{}", busy.stderr);
    assert!(busy.stderr.contains("SlotBusy"), "{}", busy.stderr);

    // Supersede, then replace: a queued submission is displaced by a
    // Replace, which stops the owner (on whichever node) and runs next.
    let queued = n2.submit(&[&p("hello"), "--slot", "b", "--name", "queued"]);
    let behind = n1.submit(&[
        &p("hello"),
        "--slot",
        "b",
        "--name",
        "behind",
        "--input",
        "later",
    ]);
    // Bounds: the slot's queue (max 2) is full.
    let full = n3.run(&["submit", &p("hello"), "--slot", "b", "--wait"]);
    assert_eq!(full.code, Some(3), "{}", full.stderr);
    assert!(full.stderr.contains("QueueFull"), "{}", full.stderr);
    let replace = n3.run(&[
        "submit",
        &p("hello"),
        "--slot",
        "b",
        "--name",
        "replacement",
        "--policy",
        "replace",
        "--input",
        "new",
        "--wait",
    ]);
    assert_eq!(replace.code, Some(0), "{}", replace.stderr);
    assert_eq!(replace.stdout, "new");
    let (code, json) = wait_json(&n2, &queued);
    assert_eq!(code, Some(3), "{json}");
    assert_eq!(json["rejection"], "SupersededByReplace", "{json}");
    let (code, json) = wait_json(&n3, &owner);
    assert_eq!(code, Some(4), "the replaced owner was stopped: {json}");
    assert_eq!(json["outcome"], "canceled", "{json}");
    // The rest of the queue runs after the replacement.
    let (code, json) = wait_json(&n2, &behind);
    assert_eq!(code, Some(0), "{json}");
    let rows = attempts(&pg, "b");
    assert_no_overlap("b", &rows);
    let order: Vec<String> = rows.iter().map(|r| r.task.to_string()).collect();
    let replacement = n1.run(&["wait", "replacement", "--json"]);
    let replacement: serde_json::Value = serde_json::from_str(replacement.stdout.trim()).unwrap();
    assert_eq!(
        order,
        [owner.clone(), replacement["id"].to_string(), behind.clone()],
        "owner, replacement, then the rest of the queue"
    );

    // Removal: queued work canceled from another node never runs.
    n1.submit(&[
        &sleeper, "--slot", "r", "--name", "r-owner", "--param", "ms=60000",
    ]);
    wait_until(&n1, "r-owner", "running", None);
    let waiting = n2.submit(&[&p("hello"), "--slot", "r", "--name", "r-queued"]);
    let cancel = n3.run(&["cancel", "r-queued"]);
    assert_eq!(
        cancel.code,
        Some(0),
        "this call made the claim: {}",
        cancel.stderr
    );
    assert!(
        cancel.stderr.contains("RemovedFromQueue"),
        "{}",
        cancel.stderr
    );
    let (code, json) = wait_json(&n1, &waiting);
    assert_eq!(code, Some(3), "{json}");
    assert_eq!(json["rejection"], "RemovedFromQueue", "{json}");
    let stop = n2.run(&["cancel", "r-owner"]);
    assert_eq!(stop.code, Some(0), "{}", stop.stderr);
    assert!(stop.stderr.contains("canceled"), "{}", stop.stderr);
    let slots = n3.run(&["slots", "--json"]);
    assert_eq!(
        slots.stdout.trim(),
        "[]",
        "every slot is free: {}",
        slots.stdout
    );
}

/// The policies a submission of the admission programs may carry.
const POLICIES: [&str; 3] = ["queue", "replace", "drop-if-running"];

/// Runs one admission program on `via`: each step submits a parked sleeper
/// to one of the slots of case `case` under a policy, then waits until
/// the daemon is settled (every task of the case runs its guest or waits in
/// a queue; stops and promotions done). Returns, per step, what became of
/// the submission and the case's slots afterwards (owners and queues by
/// name, so that the two backends' ids do not matter). Cancels the case's
/// work at the end.
fn play(via: &Daemon, case: usize, steps: &[(usize, usize)]) -> Vec<String> {
    let sleeper = p("sleeper");
    let prefix = format!("c{case}-");
    let mut seen = Vec::new();
    for (i, &(slot, policy)) in steps.iter().enumerate() {
        let (name, slot) = (format!("{prefix}{i}"), format!("{prefix}s{slot}"));
        let out = via.run(&[
            "submit",
            &sleeper,
            "--slot",
            &slot,
            "--name",
            &name,
            "--policy",
            POLICIES[policy],
            "--param",
            "ms=600000",
            "--param",
            "step_ms=600000",
            "--json",
        ]);
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("submit {name}: {e}: {:?} / {}", out.stdout, out.stderr));
        let placed = match out.code {
            Some(0) => json["state"].as_str().unwrap_or_default().to_owned(),
            Some(3) => format!("rejected {}", json["rejection"]),
            other => panic!("submit {name}: exit {other:?}: {}", out.stderr),
        };
        seen.push(format!(
            "{name} ({} {}): {placed}; {}",
            POLICIES[policy],
            slot,
            settled(via, &prefix)
        ));
    }
    for row in via.ps() {
        if row["name"].as_str().is_some_and(|n| n.starts_with(&prefix)) {
            via.run(&["cancel", &row["id"].to_string()]);
        }
    }
    let deadline = Instant::now() + LIMIT;
    while via
        .ps()
        .iter()
        .any(|r| r["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
    {
        assert!(Instant::now() < deadline, "case {case}'s work never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    seen
}

/// Waits until every live task named with `prefix` runs its guest (it has
/// reported its first progress) or is queued, and the slots say the same
/// twice in a row; returns the slots, owners and queues by name.
fn settled(via: &Daemon, prefix: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    let mut last = String::new();
    loop {
        let rows: Vec<serde_json::Value> = via
            .ps()
            .into_iter()
            .filter(|r| r["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .collect();
        let still = rows.iter().all(|r| {
            r["state"] == "queued"
                || r["state"] == "waiting"
                || (r["state"] == "running" && r["progress"].is_object())
        });
        let mut held: Vec<&str> = rows
            .iter()
            .filter(|r| r["state"] == "waiting")
            .filter_map(|r| r["name"].as_str())
            .collect();
        held.sort_unstable();
        let names: HashMap<u64, String> = rows
            .iter()
            .map(|r| {
                (
                    r["id"].as_u64().unwrap(),
                    r["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let named = |id: &serde_json::Value| {
            id.as_u64()
                .and_then(|id| names.get(&id).cloned())
                .unwrap_or_else(|| format!("?{id}"))
        };
        let out = via.run(&["slots", "--json"]);
        let slots: Vec<serde_json::Value> = serde_json::from_str(out.stdout.trim()).unwrap();
        let mut shown: Vec<String> = slots
            .iter()
            .filter(|s| s["key"].as_str().is_some_and(|k| k.starts_with(prefix)))
            .map(|s| {
                let queued: Vec<String> =
                    s["queued"].as_array().unwrap().iter().map(named).collect();
                let owners: Vec<String> =
                    s["owners"].as_array().unwrap().iter().map(named).collect();
                format!(
                    "{} owners [{}] of {} queue [{}]",
                    s["key"],
                    owners.join(" "),
                    s["capacity"],
                    queued.join(" ")
                )
            })
            .collect();
        shown.sort();
        let now = format!("{}; held [{}]", shown.join(", "), held.join(" "));
        if still && now == last && !now.contains('?') {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "never settled: ps {rows:?}, slots {now}"
        );
        last = now;
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The admission rules are written once (`admission::decide`) and applied
/// twice: by the in-process controller to memory and by the cluster's
/// store in its PostgreSQL transaction. Random programs of Queue, Replace
/// and DropIfRunning submissions over four slots (capacity 1, 2, and 3
/// with a queue bound of its own, and a debounced one), under small
/// bounds, give the same placements and leave the same owners (oldest
/// first), queues and held submissions on a single daemon and on a
/// cluster node.
#[test]
fn the_admission_rules_decide_alike_in_memory_and_in_postgres() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let pg = Postgres::start();
    let bounds = ["--max-slot-queue", "2", "--max-total-pending", "3"];
    let single = Daemon::start(&[&["--store", "memory"][..], &bounds[..]].concat());
    let node = steady_node(&pg, "n1", &bounds);
    for via in [&single, &node] {
        for rule in [
            &["slot", "set", "*-s1", "--capacity", "2"][..],
            &["slot", "set", "*-s2", "--capacity", "3", "--max-queue", "1"],
            &["slot", "set", "*-s3", "--debounce", "10m"],
        ] {
            let out = via.run(rule);
            assert_eq!(out.code, Some(0), "{rule:?}: {}", out.stderr);
        }
    }
    let case = std::cell::Cell::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 8,
        max_shrink_iters: 24,
        failure_persistence: None,
        ..Config::default()
    });
    // Mostly Queue, over two slots, so that the bounds are reached.
    let policy = prop_oneof![5 => Just(0usize), 3 => Just(1usize), 2 => Just(2usize)];
    let programs = proptest::collection::vec((0..4usize, policy), 4..20);
    runner
        .run(&programs, |steps| {
            let n = case.get();
            case.set(n + 1);
            let here = play(&single, n, &steps);
            let there = play(&node, n, &steps);
            prop_assert!(
                here == there,
                "a single daemon:\n{}\na cluster node:\n{}",
                here.join("\n"),
                there.join("\n")
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_killed_node_s_work_is_taken_over_after_its_lease() {
    let pg = Postgres::start();
    let mut a = node(&pg, "a", &[]);
    let sleeper = p("sleeper");
    a.submit(&[&sleeper, "--name", "once", "--param", "ms=60000"]);
    a.submit(&[
        &sleeper,
        "--name",
        "again",
        "--param",
        "ms=1500",
        "--restart",
        "on-failure",
        "--backoff",
        "100ms",
    ]);
    wait_until(&a, "once", "running", Some("a"));
    wait_until(&a, "again", "running", Some("a"));
    let b = node(&pg, "b", &[]);

    let killed = Instant::now();
    a.process
        .as_mut()
        .expect("running")
        .child
        .kill()
        .expect("SIGKILL a");
    let _ = a.process.take().expect("running").child.wait();

    // The run-once task must not run twice: it ends Failed, interrupted.
    let (code, json) = wait_json(&b, "once");
    let took = killed.elapsed();
    assert_eq!(code, Some(1), "{json}");
    assert!(
        json["reason"]
            .as_str()
            .is_some_and(|r| r.contains("interrupted")),
        "{json}"
    );
    assert!(
        took < Duration::from_secs(2 + 10),
        "taken over {took:?} after the kill (lease 2s)"
    );
    // The restartable one runs again, on b, and completes.
    let (code, json) = wait_json(&b, "again");
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["attempts"], 2, "{json}");
    let rows = attempts(&pg, "again");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].result, "interrupted", "{rows:?}");
    assert_ne!(
        rows[0].node, rows[1].node,
        "the second attempt ran on another node: {rows:?}"
    );
    assert_no_overlap("again", &rows);
    let events = b.run(&["events", "--json"]);
    assert!(
        events.stdout.contains("taken over from a stopped node"),
        "b tells of the takeover: {}",
        events.stdout
    );
}

#[test]
fn a_claim_whose_attempt_never_started_is_admitted_again_not_failed() {
    let pg = Postgres::start();
    let a = node(&pg, "a", &["--max-concurrent", "1"]);
    // a runs one task at a time: `later` waits, admitted but unclaimed.
    a.submit(&[&p("sleeper"), "--name", "busy", "--param", "ms=60000"]);
    wait_until(&a, "busy", "running", Some("a"));
    let later = a.submit(&[&p("hello"), "--name", "later", "--input", "ran once"]);
    wait_until(&a, "later", "waiting", None);
    // A node that died right after claiming it, before its attempt began.
    pg.psql(&format!(
        "WITH ghost AS (INSERT INTO taskhost_nodes (name, started_ms, lease_until, capacity) \
         VALUES ('ghost', 0, now() - interval '1 hour', 1) RETURNING id) \
         UPDATE taskhost_tasks SET state = 'running', node = (SELECT id FROM ghost), \
         token = nextval('taskhost_fence') WHERE id = {later}"
    ));
    let out = a.run(&["cancel", "busy"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Taken over from the ghost: nothing had run, so it runs now.
    let (code, json) = wait_json(&a, &later);
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["attempts"], 1, "{json}");
    assert_eq!(json["output"], "ran once", "{json}");
}

#[test]
fn a_node_refuses_a_claimed_task_whose_grants_exceed_its_own_ceiling() {
    let pg = Postgres::start();
    let data = tempfile::tempdir().unwrap();
    let wide = data.path().to_str().unwrap();
    // a allows the directory and runs one task at a time; b allows none
    // (a cluster node's default).
    let a = steady_node(&pg, "a", &["--max-concurrent", "1", "--allow-dir", wide]);
    a.submit(&[&p("sleeper"), "--name", "busy", "--param", "ms=60000"]);
    wait_until(&a, "busy", "running", Some("a"));
    let b = steady_node(&pg, "b", &[]);
    let grant = format!("{wide}::/data");
    // Submitted through b, it is refused at once.
    let out = b.run(&["submit", &p("hello"), "--dir", &grant, "--input", "x"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("this daemon allows no directory grants"),
        "{}",
        out.stderr
    );
    // Recorded through a, whose ceiling admits it, and claimed by b (a is
    // full): b does not run it.
    a.submit(&[
        &p("hello"),
        "--name",
        "wide",
        "--dir",
        &grant,
        "--input",
        "x",
    ]);
    let (code, json) = wait_json(&a, "wide");
    assert_eq!(code, Some(1), "{json}");
    assert_eq!(json["outcome"], "failed", "{json}");
    let reason = json["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("cannot run on node b: --dir ")
            && reason.contains("this daemon allows no directory grants"),
        "{json}"
    );
    assert_eq!(json["attempts"], 0, "{json}");
}

#[test]
fn nodes_speak_tls_to_the_database_and_verify_its_certificate() {
    let pg = Postgres::start_with_tls();
    let ca = pg.ca_file();
    let full = pg.tcp_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    let a = node_at(&full, "a", "10s", &[]);
    // Encrypted only, as libpq's `require`; and plain text still works.
    let b = node_at(&pg.tcp_url("127.0.0.1", "sslmode=require"), "b", "10s", &[]);
    let c = node_at(&pg.url(), "c", "10s", &[]);
    for (via, input) in [(&a, "verified"), (&b, "encrypted"), (&c, "plain")] {
        let out = via.run(&["submit", &p("hello"), "--input", input, "--wait"]);
        assert_eq!(out.code, Some(0), "{input}: {}", out.stderr);
        assert_eq!(out.stdout, input);
    }
    // The server saw TLS on every TCP session of the nodes, none without.
    let seen = pg.psql(
        "SELECT s.ssl, count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'taskhost' AND a.client_addr IS NOT NULL GROUP BY s.ssl",
    );
    assert!(
        seen.trim().starts_with("t|") && !seen.contains("f|"),
        "sessions by TLS: {seen:?}"
    );

    // A certificate the node cannot verify: it does not start, and says why.
    let dir = tempfile::tempdir().unwrap();
    let serve = |url: &str| {
        run_host(&[
            "serve",
            "--store",
            url,
            "--socket",
            dir.path().join("h.sock").to_str().unwrap(),
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
        ])
    };
    let out = serve(&pg.tcp_url("localhost", "sslmode=verify-full&sslrootcert=system"));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("invalid peer certificate") && out.stderr.contains("UnknownIssuer"),
        "{}",
        out.stderr
    );
    let out = serve(&pg.tcp_url("localhost", "sslmode=verify-full"));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("add sslrootcert=/path/to/ca.pem"),
        "{}",
        out.stderr
    );
}

/// Runs the restartable sleeper `long` (4 s) on node `a`.
fn run_long(a: &Daemon) {
    a.submit(&[
        &p("sleeper"),
        "--name",
        "long",
        "--param",
        "ms=4000",
        "--restart",
        "on-failure",
        "--backoff",
        "100ms",
    ]);
    wait_until(a, "long", "running", Some("a"));
}

/// After `a` lost `long` to `b`: b completed it in a second attempt, a's
/// attempt was closed by the takeover (a's late end refused), the two never
/// overlapped, a serves again as a new node, and the cluster's events tell
/// of one end, b's (a's abort is not the task's end). Returns the attempts.
fn taken_over_once(pg: &Postgres, a: &Daemon, b: &Daemon) -> Vec<Attempt> {
    let (code, json) = wait_json(b, "long");
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["attempts"], 2, "{json}");
    let rows = attempts(pg, "long");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].result, "interrupted", "{rows:?}");
    assert_eq!(rows[1].result, "completed", "{rows:?}");
    assert_no_overlap("long", &rows);
    let out = a.run(&["submit", &p("hello"), "--input", "back", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "back");
    assert_eq!(finished_events(a, "long"), ["completed"]);
    rows
}

#[test]
fn a_node_paused_past_its_lease_is_fenced_off() {
    let pg = Postgres::start();
    let mut a = node(&pg, "a", &[]);
    run_long(&a);
    let b = node(&pg, "b", &[]);
    let pid = a.pid().to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    signal("-STOP");
    // Past a's lease, b takes the task over and runs it.
    wait_until(&b, "long", "running", Some("b"));
    signal("-CONT");
    a.process
        .as_mut()
        .expect("running")
        .wait_for_line("lost its lease", LIMIT);

    taken_over_once(&pg, &a, &b);
}

#[test]
fn a_node_cut_off_from_the_database_fences_itself_before_the_takeover() {
    let pg = Postgres::start();
    let partition = Partition::start(&pg);
    let mut a = node_at(&partition.url(), "a", "2s", &[]);
    run_long(&a);
    let b = node(&pg, "b", &[]);

    // No answer from the database, no error either: before the fix, a's
    // renewal waited for ever and its attempt ran on beside b's.
    partition.cut(true);
    let cut = Instant::now();
    let line = a
        .process
        .as_mut()
        .expect("running")
        .wait_for_line("lost its lease", LIMIT);
    let fenced = Instant::now();
    assert!(line.contains("fenced itself"), "{line}");
    let fenced_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        fenced - cut < Duration::from_secs(2),
        "a fenced itself {:?} after the cut, past its 2 s lease",
        fenced - cut
    );
    // Past a's lease, b takes the task over and runs it.
    wait_until(&b, "long", "running", Some("b"));
    partition.cut(false);

    let rows = taken_over_once(&pg, &a, &b);
    assert!(
        rows[1].started >= fenced_ms,
        "b's attempt started at {} ms, before a had fenced itself (by {fenced_ms} ms): {rows:?}",
        rows[1].started
    );
}

#[test]
fn a_frozen_peer_holding_a_slot_lock_does_not_cost_the_others_their_lease() {
    let pg = Postgres::start();
    let x = node(&pg, "x", &[]);
    x.submit(&[
        &p("sleeper"),
        "--name",
        "frozen",
        "--slot",
        "held",
        "--param",
        "ms=60000",
        "--restart",
        "on-failure",
    ]);
    wait_until(&x, "frozen", "running", Some("x"));
    // The node that takes `frozen` over (kept alive to the end).
    let _a = node(&pg, "a", &[]);
    std::thread::scope(|scope| {
        // A session that holds the slot's row lock, as a peer frozen in
        // the middle of a transaction would.
        let holder = scope.spawn(|| {
            pg.psql(
                "BEGIN; SELECT slot FROM taskhost_slots WHERE slot = 'held' FOR UPDATE; \
                 SELECT pg_sleep(6); COMMIT;",
            )
        });
        let pid = x.pid().to_string();
        let kill = |sig: &str| {
            assert!(
                std::process::Command::new("kill")
                    .args([sig, &pid])
                    .status()
                    .unwrap()
                    .success()
            )
        };
        kill("-STOP");
        // x's lease runs out; a's takeover of `frozen` waits on the lock.
        let deadline = Instant::now() + LIMIT;
        while pg
            .psql(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%taskhost_slots%'",
            )
            .trim()
            != "1"
        {
            assert!(
                Instant::now() < deadline,
                "no takeover ever waited on the lock"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // While it waits, for longer than a lease, a's lease stays renewed.
        let waited = Instant::now();
        while waited.elapsed() < Duration::from_millis(2500) {
            let ahead = pg.psql(
                "SELECT count(*) FROM taskhost_nodes WHERE name = 'a' AND alive \
                 AND lease_until > now() + interval '1 second'",
            );
            assert_eq!(
                ahead.trim(),
                "1",
                "a's lease was not renewed while its takeover waited on a lock"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        holder.join().unwrap();
        kill("-CONT");
    });
    // The takeover went through once the lock was free: `frozen` runs its
    // second attempt on a live node: a, or x joined again as a new node
    // after it found its lease gone (both may claim it), never the x that
    // was frozen. a never lost its lease (it never joined again).
    let deadline = Instant::now() + LIMIT;
    let rows = loop {
        let rows = attempts(&pg, "held");
        if rows.len() == 2 {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "the takeover never started attempt 2: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(rows[0].result, "interrupted", "{rows:?}");
    assert_ne!(
        rows[1].node, rows[0].node,
        "attempt 2 ran on a live node, not on the frozen one: {rows:?}"
    );
    assert!(
        rows[0].ended.is_some_and(|ended| ended <= rows[1].started),
        "the attempts do not overlap: {rows:?}"
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM taskhost_nodes WHERE name = 'a'")
            .trim(),
        "1"
    );
}

#[test]
fn a_slot_held_by_a_frozen_session_holds_up_only_its_own_submissions() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &[]);
    let out = a.run(&[
        "submit",
        &p("hello"),
        "--slot",
        "held",
        "--input",
        "x",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    std::thread::scope(|scope| {
        // A session holding the slot's row lock, as a peer frozen in the
        // middle of a transaction would, for less than a's lock timeout.
        let holder = scope.spawn(|| {
            pg.psql(
                "BEGIN; SELECT slot FROM taskhost_slots WHERE slot = 'held' FOR UPDATE; \
                 SELECT pg_sleep(4); COMMIT;",
            )
        });
        let deadline = Instant::now() + LIMIT;
        // The holder is in place once its sleep runs.
        while pg
            .psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(4)%' AND state = 'active' AND pid <> pg_backend_pid()")
            .trim()
            != "1"
        {
            assert!(Instant::now() < deadline, "the holder never took the lock");
            std::thread::sleep(Duration::from_millis(10));
        }
        let late = a.spawn(&[
            "submit",
            &p("hello"),
            "--slot",
            "held",
            "--input",
            "late",
            "--wait",
        ]);
        // Its admission waits on the lock, on a connection of its own.
        while pg
            .psql(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND application_name = 'taskhost'",
            )
            .trim()
            == "0"
        {
            assert!(
                Instant::now() < deadline,
                "the admission never waited on the lock: {}",
                pg.psql("SELECT application_name, state, wait_event_type, left(query, 80) FROM pg_stat_activity")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Meanwhile other slots are admitted, run and end at once.
        let started = Instant::now();
        for i in 0..3 {
            let input = format!("now {i}");
            let slot = format!("free-{i}");
            let out = a.run(&[
                "submit",
                &p("hello"),
                "--slot",
                &slot,
                "--input",
                &input,
                "--wait",
            ]);
            assert_eq!(out.code, Some(0), "{}", out.stderr);
            assert_eq!(out.stdout, input);
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "other slots waited for the held one: {:?}",
            started.elapsed()
        );
        holder.join().unwrap();
        // Once the lock is free, the held slot's submission goes through.
        let (_, out) = late.finish(LIMIT);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        assert_eq!(out.stdout, "late");
    });
}

#[test]
fn a_node_that_shuts_down_hands_its_work_over_at_once() {
    let pg = Postgres::start();
    // A lease far longer than a handover takes on a loaded machine: a
    // takeover before it runs out can only be the handover.
    let mut a = node_with_lease(&pg, "a", "60s", &[]);
    a.submit(&[
        &p("sleeper"),
        "--name",
        "handed",
        "--slot",
        "h",
        "--param",
        "ms=2000",
        "--restart",
        "on-failure",
        "--backoff",
        "50ms",
    ]);
    a.submit(&[
        &p("hello"),
        "--slot",
        "h",
        "--name",
        "next",
        "--input",
        "after",
    ]);
    wait_until(&a, "handed", "running", Some("a"));
    let b = steady_node(&pg, "b", &[]);
    let stopped = Instant::now();
    let out = a.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let _ = a.finish(LIMIT);
    // Taken over by b well before a's 60 s lease would have run out.
    wait_until(&b, "handed", "running", Some("b"));
    assert!(
        stopped.elapsed() < Duration::from_secs(45),
        "handed over after {:?}",
        stopped.elapsed()
    );
    let (code, json) = wait_json(&b, "handed");
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["attempts"], 2, "{json}");
    let out = b.run(&["wait", "next"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout, "after",
        "queued work stayed for the other nodes"
    );
    assert_no_overlap("h", &attempts(&pg, "h"));
}

#[test]
fn without_notifications_polling_still_delivers_work_and_cancels() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &["--no-notify"]);
    let b = steady_node(&pg, "b", &["--no-notify"]);
    a.submit(&[&p("sleeper"), "--name", "parked", "--param", "ms=60000"]);
    wait_until(&b, "parked", "running", None);
    let started = Instant::now();
    let out = b.run(&["cancel", "parked"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("parked canceled"), "{}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the cancel took {:?}",
        started.elapsed()
    );
    // Work submitted on one node is found by polling and waited for on
    // another.
    let id = b.submit(&[&p("hello"), "--input", "polled"]);
    let out = a.run(&["wait", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "polled");
}

#[test]
fn a_cancel_while_a_node_still_loads_the_plugin_is_not_lost() {
    // A claimed task shows running from its claim on, while the claiming
    // node still fetches and compiles the plugin before the task's body is
    // registered there. A cancel in that window must still stop it (it was
    // lost: the stop was tried once, before there was anything to stop).
    // Fresh copies of the plugin make every claim compile.
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &[]);
    let b = steady_node(&pg, "b", &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let sleeper = std::fs::read(common::plugin("sleeper")).expect("the sleeper plugin");
    for i in 0..4 {
        let path = dir.path().join(format!("sleeper{i}.wasm"));
        let copy = common::renamed(&sleeper, b"sleeper", format!("sleepe{i}").as_bytes());
        std::fs::write(&path, copy).unwrap();
        let name = format!("nap{i}");
        let via = if i % 2 == 0 { &a } else { &b };
        via.submit(&[
            path.to_str().unwrap(),
            "--name",
            &name,
            "--param",
            "ms=30000",
        ]);
        wait_until(via, &name, "running", None);
        let started = Instant::now();
        let out = via.run(&["cancel", &name]);
        assert_eq!(out.code, Some(0), "{name}: {}", out.stderr);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{name}: the cancel took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_plugin_uploaded_through_one_node_is_fetched_by_the_others_ahead_of_its_tasks() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &[]);
    let b = steady_node(&pg, "b", &[]);
    // Held for an hour: no node claims it, yet b brings its plugin.
    a.submit(&[&p("hello"), "--name", "later", "--delay", "1h"]);
    let bytes = std::fs::read(common::plugin("hello")).expect("the hello plugin");
    let hex: String = <sha2::Sha256 as sha2::Digest>::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let fetched = b
        .dir
        .path()
        .join("state/plugins")
        .join(format!("{hex}.wasm"));
    let deadline = Instant::now() + LIMIT;
    while !fetched.exists() {
        assert!(Instant::now() < deadline, "b never fetched the plugin");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read(&fetched).unwrap(), bytes);
}

#[test]
fn one_node_s_http_api_answers_for_the_cluster() {
    let pg = Postgres::start();
    // b runs the task (the only node when it is claimed); a, started
    // afterwards with --http, must show it, its slot and its log, and stop it.
    let b = steady_node(&pg, "b", &[]);
    b.submit(&[
        &p("sleeper"),
        "--name",
        "far",
        "--slot",
        "deploy/prod",
        "--param",
        "ms=600000",
    ]);
    wait_until(&b, "far", "running", Some("b"));
    let a = steady_node(&pg, "a", &["--http", "127.0.0.1:0"]);
    // Loopback, no token file: a's own token, from its state directory.
    let api = http::Api::of(&a);
    let port = api.port;
    assert_eq!(http::get(port, "/api/tasks").status, 401);

    let tasks = api.get("/api/tasks");
    assert_eq!(tasks.status, 200, "{}", tasks.body);
    let rows = tasks.json();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "far")
        .unwrap_or_else(|| panic!("a's API lists b's task: {rows}"));
    assert_eq!(row["node"], "b", "{row}");
    assert_eq!(row["state"], "running", "{row}");
    // The same rows as `host ps --json` through a (ages and progress aside).
    let ps = a.ps();
    let strip = |v: &serde_json::Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("age_ms");
        v.as_object_mut().unwrap().remove("progress");
        v
    };
    assert_eq!(
        rows.as_array()
            .unwrap()
            .iter()
            .map(strip)
            .collect::<Vec<_>>(),
        ps.iter().map(strip).collect::<Vec<_>>()
    );
    let slots = api.get("/api/slots").json();
    let slot = slots
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "deploy/prod")
        .unwrap_or_else(|| panic!("the slot is listed: {slots}"));
    assert_eq!(slot["owner"], row["id"], "{slot}");

    // The task page while b runs it.
    let page = api.get("/api/tasks/far");
    assert_eq!(page.status, 200, "{}", page.body);
    let page = page.json();
    assert_eq!(page["row"]["node"], "b", "{page}");
    assert_eq!(page["slot"], "deploy/prod", "{page}");
    assert!(page["outcome"].is_null(), "{page}");
    assert!(page["log"].is_array(), "{page}");

    // Cancel through a's API: b stops it.
    let canceled = api.post("/api/tasks/far/cancel");
    assert_eq!(canceled.status, 200, "{}", canceled.body);
    let canceled = canceled.json();
    assert_eq!(canceled["claimed"], true, "{canceled}");
    assert_eq!(canceled["report"]["outcome"], "canceled", "{canceled}");
    let page = api.get("/api/tasks/far").json();
    assert_eq!(page["outcome"]["outcome"], "canceled", "{page}");
    assert_eq!(page["attempts"].as_array().map(Vec::len), Some(1), "{page}");
    let all = api.get("/api/tasks?all=true").json();
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "far" && r["outcome"] == "canceled"),
        "{all}"
    );
    assert_eq!(api.get("/api/tasks/nothing-here").status, 404);

    // The cluster's events over SSE, the cancel of b's task among them.
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    use std::io::{BufRead, Write};
    write!(
        stream,
        "GET /api/events?task=far HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {}\r\n\r\n",
        api.bearer()
    )
    .unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let deadline = Instant::now() + LIMIT;
    let mut seen = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended: {seen:?}"
        );
        if line.contains("\"task_removed\"") || line.contains("TaskRemoved") {
            break;
        }
        seen.push(line);
        assert!(Instant::now() < deadline, "no removal event: {seen:?}");
    }
}

/// A running task's lines shipped to the database are trimmed to its
/// newest 2,000 while it runs (they were kept whole until its end).
#[test]
fn a_running_tasks_shipped_lines_are_trimmed_to_its_newest() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &[]);
    a.submit(&[
        &p("chatty"),
        "--name",
        "loud",
        "--param",
        "lines=2500",
        "--param",
        "hold_ms=60000",
    ]);
    wait_until(&a, "loud", "running", None);
    // Every line shipped: the last one is in the database (each shipment
    // and its trim commit together).
    let deadline = Instant::now() + LIMIT;
    loop {
        let shipped = pg.psql(
            "SELECT count(*) FROM taskhost_logs \
             WHERE position(convert_to('stderr line 2500', 'UTF8') in line) > 0",
        );
        if shipped.trim() == "1" {
            break;
        }
        assert!(Instant::now() < deadline, "the last line was not shipped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rows: usize = pg
        .psql("SELECT count(*) FROM taskhost_logs")
        .trim()
        .parse()
        .unwrap();
    assert!(
        (1..=2_000).contains(&rows),
        "{rows} lines kept for a running task that wrote 5,000"
    );
    let out = a.run(&["cancel", "loud"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn many_followers_and_waiters_on_one_node_share_its_polls() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &["--no-notify"]);
    let b = steady_node(&pg, "b", &["--no-notify"]);
    // Without notifications every follower and waiter of b depends on b's
    // polls: one read of the events and one look-up of the waited tasks
    // per poll, for all of them.
    const N: usize = 24;
    let followers: Vec<_> = (0..N)
        .map(|_| b.spawn_stdout_lines(&["events", "--follow", "--json", "--task", "nap"]))
        .collect();
    a.submit(&[&p("sleeper"), "--name", "nap", "--param", "ms=300"]);
    let waiters: Vec<_> = (0..N).map(|_| b.spawn(&["wait", "nap"])).collect();
    for waiter in waiters {
        let (_, out) = waiter.finish(LIMIT);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    for (mut child, lines) in followers {
        let deadline = Instant::now() + LIMIT;
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains("TaskFinished") => break,
                Ok(line) => seen.push(line),
                Err(_) => panic!("a follower never saw nap finish; it saw {seen:?}"),
            }
        }
        assert!(
            seen.iter().any(|l| l.contains("AttemptStarting")),
            "the follower saw the start first: {seen:?}"
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn logs_are_shown_by_every_node() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &[]);
    let b = steady_node(&pg, "b", &[]);
    let nodes = [("a", &a), ("b", &b)];
    // Finished: any node shows the lines.
    let id = a.submit(&[&p("chatty"), "--param", "lines=3"]);
    assert_eq!(a.run(&["wait", &id]).code, Some(0));
    for (_, via) in nodes {
        let out = via.run(&["logs", &id]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        assert!(out.stdout.contains("stdout line 3"), "{}", out.stdout);
    }
    // Running on one node: following it through the other ends when it
    // ends, with its lines.
    b.submit(&[&p("sleeper"), "--name", "nap", "--param", "ms=1500"]);
    let row = wait_until(&a, "nap", "running", None);
    // Its first attempt is counted once its start is recorded (in the
    // attempt's row alone, not the task's).
    let deadline = Instant::now() + LIMIT;
    while wait_until(&a, "nap", "running", None)["attempts"] != 1 {
        assert!(Instant::now() < deadline, "nap never showed its attempt");
        std::thread::sleep(Duration::from_millis(20));
    }
    let other = nodes
        .iter()
        .find(|(name, _)| row["node"] != *name)
        .map(|(_, d)| *d)
        .expect("the other node");
    let out = other.run(&["logs", "nap", "--follow"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (code, json) = wait_json(&a, "nap");
    assert_eq!(code, Some(0), "the follow ended with the task: {json}");
    // Events: the node that did not run it tells of its end too.
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = other.run(&["events", "--json", "--task", "nap"]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        if out.stdout.contains("TaskFinished") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no TaskFinished of nap: {}",
            out.stdout
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Events shipped in many batches read back through the other node in
    // order, each task's end among them.
    let ids: Vec<String> = (0..24)
        .map(|_| {
            let id = b.submit(&[&p("hello")]);
            assert_eq!(b.run(&["wait", &id]).code, Some(0));
            id
        })
        .collect();
    let out = a.run(&["events", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let events: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event"))
        .collect();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for id in &ids {
        assert!(
            events
                .iter()
                .any(|e| e["kind"] == "TaskFinished" && e["task_id"].as_u64() == id.parse().ok()),
            "no end of {id} in {}",
            out.stdout
        );
    }
}

#[test]
fn unused_plugins_are_collected_from_the_database() {
    let pg = Postgres::start();
    let a = steady_node(&pg, "a", &[]);
    let b = steady_node(&pg, "b", &[]);
    let stored = || {
        pg.psql("SELECT count(*) FROM taskhost_plugins")
            .trim()
            .to_owned()
    };
    let out = a.run(&["submit", &p("hello"), "--input", "one", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(stored(), "1", "stored once for the cluster");
    // A retained task refers to it: kept.
    let prune = b.run(&["plugins", "prune"]);
    assert_eq!(prune.code, Some(0), "{}", prune.stderr);
    assert_eq!(stored(), "1", "kept while a retained task uses it");
    // Once retention has let its tasks go, it goes.
    pg.psql("DELETE FROM taskhost_tasks");
    let prune = b.run(&["plugins", "prune"]);
    assert_eq!(prune.code, Some(0), "{}", prune.stderr);
    assert_eq!(stored(), "0", "collected");
    // A node that still has its own copy stores it again when it is used.
    let out = a.run(&["submit", &p("hello"), "--input", "two", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "two");
    assert_eq!(stored(), "1");
}

/// `TASKHOST_CLUSTER_SOAK=N` submissions (default 10,000) over N/100 slots
/// (at least 6) from 8 clients spread over three nodes; one node is killed
/// and started again during the run, then one slot's row is held by another
/// session for 3 s while another node is cut off from the database for
/// 1.8 s.
#[test]
fn cluster_soak_keeps_one_owner_per_slot_and_one_outcome_per_task() {
    let total: usize = std::env::var("TASKHOST_CLUSTER_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let slots = (total / 100).max(6);
    let pg = Postgres::start();
    let extra = [
        "--max-slot-queue",
        "100000",
        "--max-total-pending",
        "1000000",
    ];
    // s3 reaches the database through a proxy that is paused for a while.
    let partition = Partition::start(&pg);
    let mut nodes = [
        node(&pg, "s1", &extra),
        node(&pg, "s2", &extra),
        node_at(&partition.url(), "s3", "2s", &extra),
    ];
    let sockets: Vec<std::path::PathBuf> = nodes.iter().map(|n| n.socket.clone()).collect();
    let hello = std::fs::read(plugin_artifacts::path("hello")).expect("hello");
    let sleeper = std::fs::read(plugin_artifacts::path("sleeper")).expect("sleeper");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let per_client = total / 8;
    let kill_at = total / 3;
    let submitted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let sockets = sockets.clone();
            let (hello, sleeper) = (hello.clone(), sleeper.clone());
            let submitted = std::sync::Arc::clone(&submitted);
            runtime.spawn(async move {
                let mut acked: Vec<u64> = Vec::new();
                let mut i = 0;
                while i < per_client {
                    let socket = &sockets[(c + i) % sockets.len()];
                    let Ok(client) = taskhost::daemon::Client::connect(socket).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        i += 1;
                        continue;
                    };
                    let (Ok(h), Ok(s)) = (
                        client.ensure_plugin(&hello).await,
                        client.ensure_plugin(&sleeper).await,
                    ) else {
                        i += 1;
                        continue;
                    };
                    // A few submissions per connection, then the next node.
                    for _ in 0..5 {
                        if i >= per_client {
                            break;
                        }
                        let slot = format!("slot-{}", (c * 7 + i) % slots);
                        let mut request =
                            taskhost::daemon::protocol::SubmitRequest::new(if i % 3 == 0 {
                                s
                            } else {
                                h
                            });
                        request.slot = Some(slot);
                        request.params = vec![("ms".into(), "20".into())];
                        i += 1;
                        submitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        match client.submit(request).await {
                            Ok(done) => acked.push(done.id.get()),
                            Err(_) => break,
                        }
                    }
                }
                acked
            })
        })
        .collect();
    // Kill a node a third of the way in, and start it again.
    let deadline = Instant::now() + LIMIT;
    while submitted.load(std::sync::atomic::Ordering::SeqCst) < kill_at {
        assert!(Instant::now() < deadline, "the clients stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
    let victim = &mut nodes[1];
    let mut process = victim.process.take().expect("running");
    process.child.kill().expect("SIGKILL");
    let _ = process.child.wait();
    let url = pg.url();
    victim.restart(&[
        "--store",
        &url,
        "--node-name",
        "s2-again",
        "--lease",
        "2s",
        "--lease-renew",
        "200ms",
        "--cluster-poll",
        "200ms",
        "--max-slot-queue",
        "100000",
        "--max-total-pending",
        "1000000",
    ]);

    // Half way: a session holds one slot's row lock for 3 s (a peer frozen
    // in a transaction), while s3 is cut off from the database for 1.8 s
    // (past the point where it fences itself, short of its lease).
    let deadline = Instant::now() + LIMIT;
    while submitted.load(std::sync::atomic::Ordering::SeqCst) < total / 2 {
        assert!(Instant::now() < deadline, "the clients stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::scope(|scope| {
        scope.spawn(|| {
            pg.psql(
                "BEGIN; SELECT slot FROM taskhost_slots WHERE slot = 'slot-0' FOR UPDATE; \
                 SELECT pg_sleep(3); COMMIT;",
            )
        });
        partition.cut(true);
        std::thread::sleep(Duration::from_millis(1800));
        partition.cut(false);
    });
    let line = nodes[2]
        .process
        .as_mut()
        .expect("running")
        .wait_for_line("lost its lease", LIMIT);
    assert!(line.contains("fenced itself"), "{line}");

    let mut acked: Vec<u64> = Vec::new();
    for client in clients {
        let ids = runtime.block_on(client).expect("client task");
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "one client's acknowledged ids only grow: {ids:?}"
        );
        acked.extend(ids);
    }
    assert!(
        acked.len() > total / 2,
        "only {} of {total} acknowledged",
        acked.len()
    );

    // Everything acknowledged ends.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = pg.psql("SELECT count(*) FROM taskhost_tasks WHERE state <> 'finished'");
        if left.trim() == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} tasks never finished",
            left.trim()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let outcomes: HashMap<u64, String> = pg
        .psql("SELECT id, outcome FROM taskhost_tasks")
        .lines()
        .map(|l| {
            let (id, outcome) = l.split_once('|').expect("id|outcome");
            (id.parse().unwrap(), outcome.to_owned())
        })
        .collect();
    for id in &acked {
        let outcome = outcomes
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged task {id} vanished"));
        assert!(
            ["completed", "failed"].contains(&outcome.as_str()),
            "task {id} ended {outcome}"
        );
    }
    let mut checked = 0;
    for s in 0..slots {
        let slot = format!("slot-{s}");
        let rows = attempts(&pg, &slot);
        checked += rows.len();
        assert_no_overlap(&slot, &rows);
    }
    let failed = acked.iter().filter(|id| outcomes[*id] == "failed").count();
    println!(
        "cluster soak: {} of {total} acknowledged over {slots} slots, {failed} failed \
         (interrupted by the kill or the partition), {checked} attempt intervals checked",
        acked.len()
    );
    // Each acknowledged id was answered by `host wait` on any node.
    let id = acked[acked.len() / 2].to_string();
    let out = nodes[2].run(&["wait", &id]);
    assert!(matches!(out.code, Some(0) | Some(1)), "{}", out.stderr);
}

#[test]
fn an_idempotency_key_sent_through_two_nodes_makes_one_task() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    let hello = p("hello");
    let args = |key: &str| {
        vec![
            "submit".to_owned(),
            hello.clone(),
            "--input".to_owned(),
            "x".to_owned(),
            "--idempotency-key".to_owned(),
            key.to_owned(),
        ]
    };
    // One after the other, and both at once.
    let first = n1.run(&args("k1").iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(first.code, Some(0), "{first:?}");
    let second = n2.run(&args("k1").iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(second.code, Some(0), "{second:?}");
    assert_eq!(first.stdout, second.stdout, "the same task");
    let together: Vec<_> = [&n1, &n2, &n1, &n2]
        .iter()
        .map(|via| via.spawn(&args("k2").iter().map(String::as_str).collect::<Vec<_>>()))
        .collect();
    let ids: std::collections::BTreeSet<String> = together
        .into_iter()
        .map(|running| {
            let (status, out) = running.finish(LIMIT);
            assert!(status.success(), "{out:?}");
            out.stdout.trim().to_owned()
        })
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "one task for four submissions of one key: {ids:?}"
    );
    // Another request with the key is refused through either node.
    let mut other = args("k1");
    other[3] = "y".to_owned();
    let refused = n2.run(&other.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(refused.code, Some(3), "{refused:?}");
    assert!(refused.stderr.contains("k1"), "{}", refused.stderr);
    let rows = n1.run(&["ps", "--all", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&rows.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
}

/// The due times of the tasks a schedule fired, from the database, in
/// order.
fn fired_dues(pg: &Postgres, schedule: &str) -> Vec<u64> {
    pg.psql(&format!(
        "SELECT due_ms FROM taskhost_tasks WHERE schedule = '{schedule}' ORDER BY due_ms"
    ))
    .lines()
    .map(|l| l.trim().parse().expect("a due time"))
    .collect()
}

#[test]
fn a_per_second_schedule_fires_once_a_second_across_nodes_and_a_sigkill() {
    let pg = Postgres::start();
    let mut nodes: Vec<(&str, Daemon)> = ["a", "b", "c"]
        .into_iter()
        .map(|name| (name, node(&pg, name, &[])))
        .collect();
    let out = nodes[0].1.run(&[
        "schedule",
        "add",
        "tick",
        "--cron",
        "* * * * * *",
        &p("hello"),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Every node answers for the cluster's schedules.
    let out = nodes[1].1.run(&["schedule", "ls", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("\"tick\""), "{}", out.stdout);
    let until = |n: usize| {
        let deadline = Instant::now() + LIMIT;
        while fired_dues(&pg, "tick").len() < n {
            assert!(Instant::now() < deadline, "fewer than {n} firings");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    until(4);
    // The node that ran the latest firing dies, whatever it was doing
    // (perhaps firing again): the others take the schedule on.
    let latest = pg.psql(
        "SELECT n.name FROM taskhost_attempts a JOIN taskhost_tasks t ON t.id = a.task_id \
         JOIN taskhost_nodes n ON n.id = a.node WHERE t.schedule = 'tick' \
         ORDER BY a.started_ms DESC LIMIT 1",
    );
    let killed = nodes
        .iter()
        .position(|(name, _)| *name == latest.trim())
        .unwrap_or_else(|| panic!("no node named {latest:?} ran a firing"));
    let (killed_name, mut killed_node) = nodes.remove(killed);
    killed_node.kill_9();
    let after_kill = fired_dues(&pg, "tick").len();
    until(after_kill + 4);
    let out = nodes[0].1.run(&["schedule", "rm", "tick"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let dues = fired_dues(&pg, "tick");
    for pair in dues.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1_000,
            "one firing per second, none twice, none left out: {dues:?}"
        );
    }
    // Every firing ran (on some node) and completed.
    let outcomes = pg.psql(
        "SELECT count(*) FROM taskhost_tasks WHERE schedule = 'tick' AND outcome = 'completed'",
    );
    let settled = pg
        .psql("SELECT count(*) FROM taskhost_tasks WHERE schedule = 'tick' AND state = 'finished'");
    assert_eq!(outcomes.trim(), settled.trim(), "{dues:?}");
    // Firings ran on the killed node before its death and on another after.
    let survivors = pg.psql(&format!(
        "SELECT count(*) FROM taskhost_attempts a JOIN taskhost_tasks t ON t.id = a.task_id \
         JOIN taskhost_nodes n ON n.id = a.node \
         WHERE t.schedule = 'tick' AND n.name <> '{killed_name}'"
    ));
    assert!(
        survivors.trim().parse::<u64>().unwrap() >= 1,
        "no firing ran after node {killed_name} was killed: {dues:?}"
    );
}

#[test]
fn a_delayed_task_outlives_its_node_and_runs_once_after_its_time() {
    let pg = Postgres::start();
    let mut a = node(&pg, "a", &[]);
    let b = node(&pg, "b", &[]);
    let out = a.run(&[
        "submit",
        &p("hello"),
        "--name",
        "later",
        "--input",
        "late",
        "--delay",
        "3s",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let submitted: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(submitted["state"], "waiting", "{submitted}");
    let due = submitted["due_ms"].as_u64().expect("due_ms");
    let row = wait_until(&b, "later", "waiting", None);
    assert_eq!(row["due_ms"].as_u64(), Some(due), "{row}");
    // The node that took it dies; another places it at its time.
    a.kill_9();
    let (code, json) = wait_json(&b, "later");
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["output"], "late");
    assert_eq!(json["attempts"], 1, "{json}");
    let rows = attempts(&pg, "later");
    assert_eq!(rows.len(), 1, "ran once: {rows:?}");
    assert!(
        rows[0].started >= due,
        "not before its time: {rows:?}, due {due}"
    );
    // Canceled while it waits, through any node: it never runs.
    b.submit(&[&p("hello"), "--name", "never", "--delay", "1h"]);
    let out = b.run(&["cancel", "never"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (code, json) = wait_json(&b, "never");
    assert_eq!(code, Some(3), "{json}");
    assert_eq!(json["rejection"], "RemovedFromQueue", "{json}");
}

/// Child tasks go through the database like any submission: a parent on
/// one node fans out to children that any node may run, and sums them.
/// A slot's key-value state is the cluster's: written through one node,
/// read by the slot's next task wherever it runs, and by `host kv` on any.
#[test]
fn children_and_slot_state_span_the_nodes() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    let out = n1.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "n=10",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let output: serde_json::Value =
        serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        (output["sum"].as_u64(), output["failed"].as_u64()),
        (Some(285), Some(0)),
        "{output}"
    );
    // Every node shows each child's parent (the link is the database's).
    let parent = report["id"].as_u64().unwrap();
    for via in [&n1, &n2] {
        let out = via.run(&["ps", "--all", "--json"]);
        let rows: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
        let linked = rows
            .iter()
            .filter(|r| r["parent"].as_u64() == Some(parent))
            .count();
        assert_eq!(linked, 10, "{rows:#?}");
    }

    for (via, n) in [(&n1, 1), (&n2, 2), (&n1, 3)] {
        let out = via.run(&[
            "submit",
            &p("counter"),
            "--slot",
            "s",
            "--input",
            "x",
            "--wait",
            "--json",
        ]);
        let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let output: serde_json::Value =
            serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
        assert_eq!(output["runs"], n, "{report}");
    }
    let got = n2.run(&["kv", "get", "s", "runs"]);
    assert_eq!((got.code, got.stdout.as_str()), (Some(0), "3"), "{got:?}");
    let ls = n1.run(&["kv", "ls", "--json"]);
    assert!(ls.stdout.contains("\"slot:s\""), "{ls:?}");
    let rm = n1.run(&["kv", "rm", "s", "runs"]);
    assert_eq!(rm.code, Some(0), "{rm:?}");
    assert_eq!(n2.run(&["kv", "get", "s", "runs"]).code, Some(2));
}

/// A tree's bounds hold across nodes: its unfinished descendants are
/// counted in the database's admission, its depth from the parent's row;
/// each refusal reaches the guest naming the setting.
#[test]
fn a_trees_bounds_hold_across_the_nodes() {
    let pg = Postgres::start();
    let bounds = ["--max-descendants", "3", "--max-depth", "1"];
    let n1 = steady_node(&pg, "n1", &bounds);
    let _n2 = steady_node(&pg, "n2", &bounds);
    // Five children, each sleeping a second: three are admitted, and
    // each of those may not spawn its own (depth 2).
    let out = n1.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "depth=2",
        "--param",
        "n=5",
        "--param",
        "ms=1000",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let output: serde_json::Value =
        serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["tasks"], 4, "{output}");
    assert_eq!(output["refused"], 2 + 3 * 5, "{output}");
    // The root's log and a child's (which may have run on either node).
    let root = report["id"].as_u64().unwrap();
    for (task, flag) in [(root, "--max-descendants"), (root + 1, "--max-depth 1")] {
        let logs = n1.run(&["logs", &task.to_string()]);
        assert!(
            logs.stdout
                .lines()
                .any(|l| l.contains("spawn refused") && l.contains(flag)),
            "{flag}: {logs:?}"
        );
    }
}

/// The CPU time a process has used so far (user and system).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line, in clock ticks (100 a second).
    let rest = &stat[stat.rfind(')').expect("a command") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// A database restart (stopped as by a crash, started again 5 s later)
/// under load costs no accepted task: the nodes hold their 10 s leases
/// through it, a running attempt's writes are tried again until the
/// database is back, and nothing runs twice.
#[test]
fn a_database_restart_under_load_fails_nothing_accepted() {
    // Commits on disk before they are answered, as a production server's:
    // the throwaway servers' default (`synchronous_commit=off`) loses the
    // last commits at an immediate stop.
    let pg = Postgres::start_with_settings("-c synchronous_commit=on");
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    // Sixteen run-once tasks through both nodes, running across the stop.
    for i in 0..16 {
        let via = if i % 2 == 0 { &n1 } else { &n2 };
        via.submit(&[
            &p("sleeper"),
            "--name",
            &format!("once-{i}"),
            "--param",
            "ms=3000",
        ]);
    }
    // A thousand hellos, half through each node, submitted across the
    // stop (a submission the nodes cannot store while the database is down
    // is refused, not acknowledged, and sent again).
    let hello = std::fs::read(plugin_artifacts::path("hello")).expect("hello");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acked_count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = [n1.socket.clone(), n2.socket.clone()]
        .into_iter()
        .map(|socket| {
            let hello = hello.clone();
            let acked_count = std::sync::Arc::clone(&acked_count);
            runtime.spawn(async move {
                let client =
                    std::sync::Arc::new(taskhost::daemon::Client::connect(&socket).await.unwrap());
                let digest = client.ensure_plugin(&hello).await.unwrap();
                // Eight in flight, so that work is being admitted, claimed
                // and started at every moment of the stop.
                let lanes: Vec<_> = (0..8)
                    .map(|_| {
                        let (client, acked_count) = (
                            std::sync::Arc::clone(&client),
                            std::sync::Arc::clone(&acked_count),
                        );
                        tokio::spawn(async move {
                            let mut acked = Vec::new();
                            while acked.len() < 500 / 8 + 1 {
                                let mut request =
                                    taskhost::daemon::protocol::SubmitRequest::new(digest);
                                request.input = b"hi".to_vec();
                                match client.submit(request).await {
                                    Ok(done) => {
                                        acked.push(done.id.get());
                                        acked_count
                                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    }
                                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                                }
                            }
                            acked
                        })
                    })
                    .collect();
                let mut acked = Vec::new();
                for lane in lanes {
                    acked.extend(lane.await.unwrap());
                }
                acked
            })
        })
        .collect();
    let deadline = Instant::now() + LIMIT;
    while acked_count.load(std::sync::atomic::Ordering::SeqCst) < 200 {
        assert!(Instant::now() < deadline, "the clients stalled");
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_until(&n1, "once-0", "running", None);
    pg.stop_immediately();
    std::thread::sleep(Duration::from_secs(5));
    pg.start_again();
    let mut acked: Vec<u64> = Vec::new();
    for client in clients {
        acked.extend(runtime.block_on(client).unwrap());
    }
    assert!(acked.len() >= 1000, "{}", acked.len());
    // Every task ends; every one of them completed.
    let deadline = Instant::now() + LIMIT;
    while pg.psql("SELECT count(*) FROM taskhost_tasks WHERE state <> 'finished'") != "0\n" {
        assert!(
            Instant::now() < deadline,
            "tasks left unfinished: {}\nnodes: {}",
            pg.psql(
                "SELECT id, name, state, node, token, attempts, resume_at_ms FROM taskhost_tasks \
                 WHERE state <> 'finished' ORDER BY id LIMIT 20"
            ),
            pg.psql("SELECT id, name, alive, lease_until FROM taskhost_nodes")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let outcomes = pg.psql(
        "SELECT id || ' ' || name || ' ' || coalesce(outcome, state) FROM taskhost_tasks \
         WHERE outcome IS DISTINCT FROM 'completed'",
    );
    assert_eq!(outcomes, "", "every accepted task completed");
    for id in &acked {
        assert_eq!(
            pg.psql(&format!(
                "SELECT outcome FROM taskhost_tasks WHERE id = {id}"
            )),
            "completed\n",
            "task {id}"
        );
    }
    let n = acked.len();
    acked.sort_unstable();
    acked.dedup();
    assert_eq!(acked.len(), n, "an id acknowledged twice");
    let finished = pg.psql("SELECT count(*) FROM taskhost_tasks");
    assert_eq!(
        finished.trim(),
        (n + 16).to_string(),
        "the tasks acknowledged, and no other"
    );
    // None ran twice: one attempt for each run-once task.
    let twice = pg.psql(
        "SELECT t.name, count(*) FROM taskhost_attempts a JOIN taskhost_tasks t \
         ON t.id = a.task_id WHERE t.name LIKE 'once-%' GROUP BY t.name HAVING count(*) <> 1",
    );
    assert_eq!(twice, "", "a run-once task started more than once");
}

/// While the database is down for 30 s, each node says so in a few lines
/// (one when it is lost, one every 10 s, one when it is back), sleeps
/// between its tries, and serves again within 2 s of the database's return.
#[test]
fn a_node_waits_quietly_for_its_database_and_serves_again_at_once() {
    let pg = Postgres::start();
    let mut nodes = [node(&pg, "a", &[]), node(&pg, "b", &[])];
    for n in &nodes {
        n.run(&["submit", &p("hello"), "--input", "before", "--wait"]);
    }
    let pids: Vec<u32> = nodes.iter().map(Daemon::pid).collect();
    for n in &mut nodes {
        n.process.as_mut().unwrap().lines_so_far();
    }
    let cpu_before: Vec<Duration> = pids.iter().map(|p| cpu_time(*p)).collect();
    let down = Instant::now();
    pg.stop_immediately();
    std::thread::sleep(Duration::from_secs(30).saturating_sub(down.elapsed()));
    let cpu_down: Vec<Duration> = pids
        .iter()
        .zip(&cpu_before)
        .map(|(p, before)| cpu_time(*p) - *before)
        .collect();
    let outage = down.elapsed();
    pg.start_again();
    let back = Instant::now();
    // Served again: a submission through each node completes.
    for n in &nodes {
        loop {
            let out = n.run(&["submit", &p("hello"), "--input", "after", "--wait"]);
            if out.code == Some(0) {
                break;
            }
            assert!(
                back.elapsed() < Duration::from_secs(2),
                "not served 2 s after the database came back: {out:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let served = back.elapsed();
    assert!(served < Duration::from_secs(2), "served {served:?} after");
    for (n, cpu) in nodes.iter_mut().zip(cpu_down) {
        let process = n.process.as_mut().unwrap();
        process.wait_for_line("PostgreSQL is reachable again", LIMIT);
        let lines = process.stderr_seen.clone();
        let during: Vec<&String> = lines
            .iter()
            .skip_while(|l| !l.contains("cannot be reached"))
            .collect();
        assert!(!during.is_empty(), "{lines:#?}");
        eprintln!(
            "{} lines and {cpu:?} of CPU in a {outage:?} outage, served {served:?} after: {during:#?}",
            during.len()
        );
        assert!(
            during.len() <= 10,
            "{} lines for a {outage:?} outage: {during:#?}",
            during.len()
        );
        assert!(
            cpu < outage / 20,
            "{cpu:?} of CPU in a {outage:?} outage (5% is {:?})",
            outage / 20
        );
    }
}

/// A node paused past its lease loses its claim; when it wakes, its
/// attempt's writes to the slot's state are refused by the database (the
/// fencing token moved on), while the node that took the task over writes.
#[test]
fn a_stale_owners_state_write_after_its_lease_is_refused() {
    let pg = Postgres::start();
    let mut a = node(&pg, "a", &[]);
    a.submit(&[
        &p("counter"),
        "--name",
        "ticker",
        "--slot",
        "t",
        "--param",
        "ticks=60",
        "--param",
        "tick_ms=50",
        "--restart",
        "on-failure",
        "--backoff",
        "100ms",
    ]);
    wait_until(&a, "ticker", "running", Some("a"));
    let b = node(&pg, "b", &[]);
    let _c = node(&pg, "c", &[]);
    // Some ticks of a's attempt first.
    let deadline = Instant::now() + LIMIT;
    while b.run(&["kv", "get", "t", "attempt-1"]).code != Some(0) {
        assert!(Instant::now() < deadline, "attempt 1 never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = a.pid().to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    signal("-STOP");
    // Past a's lease, another node takes the task over and runs it.
    let deadline = Instant::now() + LIMIT;
    while b.run(&["kv", "get", "t", "attempt-2"]).code != Some(0) {
        assert!(Instant::now() < deadline, "attempt 2 never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = b.run(&["kv", "get", "t", "attempt-1"]).stdout;
    signal("-CONT");
    a.process
        .as_mut()
        .expect("running")
        .wait_for_line("lost its lease", LIMIT);
    let (code, json) = wait_json(&b, "ticker");
    assert_eq!(code, Some(0), "{json}");
    let after = b.run(&["kv", "get", "t", "attempt-1"]).stdout;
    assert_eq!(
        after, before,
        "a's attempt wrote nothing after it lost its claim"
    );
    let ticks = b.run(&["kv", "get", "t", "attempt-2"]).stdout;
    assert_eq!(ticks, "60", "the new owner wrote every tick");
}

/// The database's own check, whatever the node believes: once the task's
/// fencing token moves on (as a takeover moves it), the next write of the
/// attempt that still runs under the old one is refused, which the node
/// logs, and the guest's loop ends there.
#[test]
fn a_write_under_an_old_fencing_token_is_refused_by_the_database() {
    let pg = Postgres::start();
    let mut a = steady_node(&pg, "a", &[]);
    a.submit(&[
        &p("counter"),
        "--name",
        "old",
        "--slot",
        "o",
        "--param",
        "ticks=400",
        "--param",
        "tick_ms=20",
    ]);
    let deadline = Instant::now() + LIMIT;
    while a.run(&["kv", "get", "o", "attempt-1"]).code != Some(0) {
        assert!(Instant::now() < deadline, "attempt 1 never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    pg.psql("UPDATE taskhost_tasks SET token = nextval('taskhost_fence') WHERE name = 'old'");
    a.process
        .as_mut()
        .expect("running")
        .wait_for_line("a key-value write of task", LIMIT);
    // The refused increment ended the attempt's loop: it wrote no more.
    let ticks = a.run(&["kv", "get", "o", "attempt-1"]).stdout;
    assert!(ticks.parse::<u32>().unwrap() < 400, "{ticks}");
}
