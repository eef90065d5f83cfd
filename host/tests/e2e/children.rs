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
    // No other task was made: four children by name. (A child that a
    // restart ended shows in `ps` without its parent: the store keeps the
    // link in the request, which `ps` does not read for finished tasks.)
    let out = daemon.run(&["ps", "--all", "--json"]);
    let named: Vec<u64> = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("fanout-1.child-"))
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert_eq!(named, before, "{out:?}");
}

#[test]
fn a_plugin_of_the_older_wit_is_still_served() {
    let hello = std::fs::read(common::plugin("hello")).unwrap();
    let old = common::renamed(
        &common::renamed(&hello, b"plugin/host@0.1.1", b"plugin/host@0.1.0"),
        b"plugin/types@0.1.1",
        b"plugin/types@0.1.0",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hello-0.1.0.wasm");
    std::fs::write(&path, old).unwrap();
    let out = run_host(&["run", path.to_str().unwrap(), "--input", "still here"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "still here"),
        "{out:?}"
    );

    // `host run` has no controller: a spawn fails, saying so.
    let out = run_host(&["run", &p("fanout"), "--json"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stdout.contains("starts no child tasks"), "{out:?}");
}
