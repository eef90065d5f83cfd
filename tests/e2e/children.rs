//! Child tasks through the real binary and the `fanout` plugin
//! (`taskhost:plugin/children`): a fan-out of 100 children and the fan-in
//! of their outputs, the link in `ps`; a parent's cancel cascading to its
//! children; a parent retried after SIGKILL finding the children it
//! started instead of starting them again; a plugin of the older WIT 0.1.0
//! still served; `host run`, which has no controller, refusing a spawn.

use crate::common::{self, run_host};
use crate::daemon::{Daemon, LIMIT, p};

use std::time::{Duration, Instant};

use serde_json::Value;

/// The rows of `ps --all --json` whose parent is `parent`.
fn children_of(daemon: &Daemon, parent: u64) -> Vec<Value> {
    let out = daemon.run(&["ps", "--all", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    out.json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["parent"].as_u64() == Some(parent))
        .cloned()
        .collect()
}

/// Polls `ps` until `parent` has `n` children in `state`.
fn until_children(daemon: &Daemon, parent: u64, n: usize, state: &str) -> Vec<Value> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let rows = children_of(daemon, parent);
        if rows.iter().filter(|r| r["state"] == state).count() >= n {
            return rows;
        }
        assert!(Instant::now() < deadline, "children of {parent}: {rows:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hundred_children_fan_out_and_their_outputs_fan_in() {
    let daemon = Daemon::start(&[]);
    let out = daemon.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "n=100",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let report = out.json();
    let output: Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    // Σ i² for i in 0..100.
    assert_eq!(output["sum"], 328_350, "{output}");
    assert_eq!(output["failed"], 0, "{output}");
    let parent = report["id"].as_u64().unwrap();
    let rows = children_of(&daemon, parent);
    assert_eq!(rows.len(), 100, "{rows:?}");
    assert!(rows.iter().all(|r| r["outcome"] == "completed"), "{rows:?}");
    assert_eq!(
        rows[0]["name"],
        format!("{}.child-0", report["name"].as_str().unwrap())
    );
    // The parent's log says which it started.
    let logs = daemon.run(&["logs", &parent.to_string()]);
    assert!(logs.stdout.contains("(key `child-99`) of task"), "{logs:?}");
}

#[test]
fn a_parents_cancel_cascades_to_its_children() {
    let daemon = Daemon::start(&[]);
    let parent = daemon.submit(&[&p("fanout"), "--param", "n=3", "--param", "ms=60000"]);
    let id: u64 = parent.parse().unwrap();
    let rows = until_children(&daemon, id, 3, "running");
    let out = daemon.run(&["cancel", &parent]);
    assert!(
        out.stderr.contains("canceled"),
        "the parent ends canceled: {out:?}"
    );
    for row in rows {
        let child = row["id"].to_string();
        let out = daemon.run(&["wait", &child, "--json"]);
        assert_eq!(out.json()["outcome"], "canceled", "child {child}: {out:?}");
    }
}

#[test]
fn a_parent_retried_after_a_crash_finds_its_children() {
    // Two at once: the parent and one child run, the other children wait.
    let mut daemon = Daemon::start(&["--max-concurrent", "2"]);
    let parent = daemon.submit(&[
        &p("fanout"),
        "--param",
        "n=4",
        "--param",
        "ms=300",
        "--restart",
        "on-failure",
        "--backoff",
        "1ms",
    ]);
    let id: u64 = parent.parse().unwrap();
    let before: Vec<u64> = {
        let deadline = Instant::now() + LIMIT;
        loop {
            let rows = children_of(&daemon, id);
            if rows.len() == 4 {
                break rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
            }
            assert!(Instant::now() < deadline, "{rows:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    daemon.kill_9();
    daemon.restart(&["--max-concurrent", "2"]);
    let out = daemon.run(&["wait", &parent, "--json"]);
    let report = out.json();
    assert_eq!(report["outcome"], "completed", "{report}");
    assert!(
        report["attempts"].as_u64().unwrap() >= 2,
        "it was retried: {report}"
    );
    let output: Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    let after: Vec<u64> = output["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(after, before, "the same children, not new ones: {output}");
    // No other task was made: four children by name, each still linked to
    // its parent after the SIGKILL and restart.
    let out = daemon.run(&["ps", "--all", "--json"]);
    let rows = out.json().as_array().unwrap().clone();
    let named: Vec<u64> = rows
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("fanout-1.child-"))
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(named, before, "{out:?}");
    let linked: Vec<u64> = children_of(&daemon, id)
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(linked, before, "every child shows its parent: {rows:#?}");
    let table = daemon.run(&["ps", "--all"]);
    assert!(table.stdout.contains("PARENT"), "{table:?}");
    // The recovered children's events name their parent too.
    let events = daemon.run(&["events", "--json"]);
    let of_children: Vec<Value> = events
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        // The task's own events (a slot's transitions are the slot's).
        .filter(|e| e["task_id"].as_u64().is_some_and(|t| before.contains(&t)))
        .filter(|e| e["kind"] != "ControllerSlotTransition")
        .collect();
    assert!(!of_children.is_empty(), "{events:?}");
    assert!(
        of_children.iter().all(|e| e["parent"].as_u64() == Some(id)),
        "{of_children:#?}"
    );
}

#[test]
fn links_survive_a_graceful_restart() {
    let mut daemon = Daemon::start(&[]);
    let out = daemon.run(&["submit", &p("fanout"), "--param", "n=3", "--wait", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let parent = out.json()["id"].as_u64().unwrap();
    assert_eq!(children_of(&daemon, parent).len(), 3);
    let out = daemon.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let (status, _) = daemon.finish(LIMIT);
    assert!(status.success());
    daemon.restart(&[]);
    let rows = children_of(&daemon, parent);
    assert_eq!(
        rows.len(),
        3,
        "the links are read back from the store: {rows:?}"
    );
    let table = daemon.run(&["ps", "--all"]);
    assert!(table.stdout.contains("PARENT"), "{table:?}");
}

/// A parent's output in tree mode: `(tasks, refused, failed)`.
fn tree_counts(out: &common::Finished) -> (u64, u64, u64) {
    let report = out.json();
    let output: Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    let n = |k: &str| output[k].as_u64().unwrap();
    (n("tasks"), n("refused"), n("failed"))
}

/// Whether some guest line of the daemon's tasks says a spawn was refused
/// naming `flag`.
fn refused_naming(daemon: &Daemon, flag: &str) -> bool {
    let events = daemon.run(&["events", "--json", "--kind", "GuestLog"]);
    events
        .stdout
        .lines()
        .any(|l| l.contains("spawn refused") && l.contains(flag))
}

#[test]
fn a_tree_past_each_bound_is_refused_naming_it() {
    // Too deep: the root's children may not spawn.
    let daemon = Daemon::start(&["--max-depth", "1"]);
    let out = daemon.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "depth=2",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(tree_counts(&out), (3, 4, 0), "{out:?}");
    assert!(refused_naming(&daemon, "--max-depth 1"));

    // Too many descendants: three of five (each sleeps a second, so the
    // first three are unfinished when the others are spawned).
    let daemon = Daemon::start(&["--max-descendants", "3"]);
    let out = daemon.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "depth=1",
        "--param",
        "n=5",
        "--param",
        "ms=1000",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(tree_counts(&out), (4, 2, 0), "{out:?}");
    assert!(refused_naming(&daemon, "--max-descendants"));

    // Too many parents: the root is one, so its child may not be another.
    let daemon = Daemon::start(&["--max-parked", "1"]);
    let out = daemon.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "depth=2",
        "--param",
        "n=1",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(tree_counts(&out), (2, 1, 0), "{out:?}");
    assert!(refused_naming(&daemon, "--max-parked 1"));
}

#[test]
fn a_thousand_children_run_under_two_permits() {
    // The parent gives its permit back while it waits: without that, it
    // and one child would hold both, and the 999 others would never run.
    let daemon = Daemon::start(&["--max-concurrent", "2"]);
    let out = daemon.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "n=1000",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let report = out.json();
    let output: Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    // Σ i² for i in 0..1000.
    assert_eq!(output["sum"], 332_833_500_u64, "{output}");
    assert_eq!(output["failed"], 0, "{output}");
}

#[test]
fn a_spawn_bomb_leaves_the_daemon_serving() {
    // Every task spawns two more, 20 deep, each sleeping first: with the
    // defaults the tree is bounded, the daemon serves others meanwhile,
    // and a cancel of the root drains it.
    let daemon = Daemon::start(&[]);
    let (mut follower, lines) =
        daemon.spawn_stdout_lines(&["events", "--follow", "--json", "--kind", "GuestLog"]);
    let root = daemon.submit(&[
        &p("fanout"),
        "--name",
        "bomb",
        "--param",
        "depth=20",
        "--param",
        "n=2",
        "--param",
        "ms=300",
    ]);
    // Until the bounds bite: the first refused spawn names its flag.
    let deadline = Instant::now() + LIMIT;
    let refusal = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).expect("a refused spawn");
        if line.contains("spawn refused") {
            break line;
        }
    };
    assert!(refusal.contains("(--max-"), "{refusal}");
    let live = daemon.ps().len();
    assert!(live > 256, "the tree is large when the bounds bite: {live}");
    let started = Instant::now();
    let out = daemon.run(&["submit", &p("hello"), "--input", "hi", "--wait"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "hi");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "another task ran within 2 s of its submission: {:?}",
        started.elapsed()
    );
    let peak = crate::daemon::proc_kib(daemon.pid(), "VmHWM");
    assert!(peak < 200 * 1024, "peak RSS {peak} KiB");
    let started = Instant::now();
    let out = daemon.run(&["cancel", &root]);
    assert_eq!(out.code, Some(0), "{out:?}");
    loop {
        let left = daemon.ps();
        if left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} tasks left 5 s after the root's cancel",
            left.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = follower.kill();
    let _ = follower.wait();
}

#[test]
fn a_plugin_of_the_older_wit_is_still_served() {
    let hello = std::fs::read(common::plugin("hello")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for old_version in ["0.1.0", "0.1.1"] {
        let old = common::renamed(
            &common::renamed(
                &hello,
                b"plugin/host@0.1.2",
                format!("plugin/host@{old_version}").as_bytes(),
            ),
            b"plugin/types@0.1.2",
            format!("plugin/types@{old_version}").as_bytes(),
        );
        let path = dir.path().join(format!("hello-{old_version}.wasm"));
        std::fs::write(&path, old).unwrap();
        let out = run_host(&["run", path.to_str().unwrap(), "--input", "still here"]);
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (Some(0), "still here"),
            "{old_version}: {out:?}"
        );
    }

    // `host run` has no controller: a spawn fails, saying so.
    let out = run_host(&["run", &p("fanout"), "--json"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stdout.contains("starts no child tasks"), "{out:?}");
}
