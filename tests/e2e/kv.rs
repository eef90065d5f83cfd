//! Per-slot key-value state through the real binary and the `counter`
//! plugin (`wasi:keyvalue`): a slot's bucket is its own, survives SIGKILL
//! and a restart, and `host kv` shows and removes it; shared buckets only
//! within the daemon's `allow_kv`; a failed attempt's writes stay for its
//! retry; the size limits fail the write that passes them, naming the flag.

use crate::daemon::{Daemon, p};

use serde_json::Value;

/// Runs `counter` in `slot` with `extra` flags, waits, and gives its report
/// and its output as JSON (`Null` when it has none).
fn count(daemon: &Daemon, slot: &str, extra: &[&str]) -> (Value, Value) {
    let path = p("counter");
    let mut args = vec!["submit", &path, "--slot", slot, "--wait", "--json"];
    args.extend_from_slice(extra);
    let out = daemon.run(&args);
    let report = out.json();
    let output = report["output"]
        .as_str()
        .map_or(Value::Null, |o| serde_json::from_str(o).unwrap());
    (report, output)
}

#[test]
fn a_slots_state_is_its_own_and_survives_sigkill_and_restart() {
    let mut daemon = Daemon::start(&[]);
    for (n, input) in [(1, "one"), (2, "two"), (3, "three")] {
        let (report, out) = count(&daemon, "a", &["--input", input]);
        assert_eq!(out["runs"], n, "{report}");
    }
    let (_, out) = count(&daemon, "a", &["--input", "four"]);
    assert_eq!(out["previous"], "three");
    // Another slot has a bucket of its own.
    let (_, out) = count(&daemon, "b", &["--input", "x"]);
    assert_eq!(
        (out["runs"].as_u64(), out["previous"].as_str()),
        (Some(1), Some(""))
    );

    let ls = daemon.run(&["kv", "ls", "--json"]);
    assert_eq!(ls.code, Some(0), "{ls:?}");
    let names: Vec<String> = ls
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{}={}", r["name"].as_str().unwrap(), r["keys"]))
        .collect();
    assert_eq!(names, ["slot:a=2", "slot:b=2"]);
    let get = daemon.run(&["kv", "get", "a", "runs"]);
    assert_eq!((get.code, get.stdout.as_str()), (Some(0), "4"), "{get:?}");

    // Acknowledged means kept: a SIGKILL loses none of it.
    daemon.kill_9();
    daemon.restart(&[]);
    let (_, out) = count(&daemon, "a", &["--input", "five"]);
    assert_eq!(
        (out["runs"].as_u64(), out["previous"].as_str()),
        (Some(5), Some("four"))
    );

    let rm = daemon.run(&["kv", "rm", "a", "runs"]);
    assert_eq!(rm.code, Some(0), "{rm:?}");
    assert!(rm.stderr.contains("removed `runs` from slot `a`"), "{rm:?}");
    let get = daemon.run(&["kv", "get", "a", "runs"]);
    assert_eq!(get.code, Some(2), "{get:?}");
    assert!(get.stderr.contains("no key `runs` in slot `a`"), "{get:?}");
    let (_, out) = count(&daemon, "a", &[]);
    assert_eq!(out["runs"], 1);
}

#[test]
fn shared_buckets_need_the_operators_allow_kv() {
    let daemon = Daemon::start(&["--allow-kv", "hits"]);
    let out = daemon.run(&["submit", &p("counter"), "--kv", "other"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr
            .contains("this daemon does not share bucket `other`")
            && out.stderr.contains("host serve --allow-kv other"),
        "{out:?}"
    );
    // Two slots write one shared bucket; each increment is one step.
    let (_, first) = count(&daemon, "x", &["--kv", "hits", "--param", "shared=hits"]);
    let (_, second) = count(&daemon, "y", &["--kv", "hits", "--param", "shared=hits"]);
    assert_eq!(
        (first["hits"].as_u64(), second["hits"].as_u64()),
        (Some(1), Some(2))
    );
    let got = daemon.run(&["kv", "get", "--shared", "hits", "hits"]);
    assert_eq!(got.stdout, "2", "{got:?}");
    // A bucket the submission was not granted is refused to the guest.
    let (report, _) = count(&daemon, "z", &["--param", "shared=hits"]);
    assert_eq!(report["outcome"], "fatal", "{report}");
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("submit it with --kv hits"),
        "{report}"
    );
}

#[test]
fn a_failed_attempts_writes_stay_for_its_retry() {
    let daemon = Daemon::start(&[]);
    let (report, _) = count(
        &daemon,
        "r",
        &[
            "--param",
            "fail=once more",
            "--restart",
            "on-failure",
            "--max-retries",
            "2",
            "--backoff",
            "1ms",
        ],
    );
    assert_eq!(report["outcome"], "failed", "{report}");
    assert_eq!(report["attempts"], 3, "{report}");
    let get = daemon.run(&["kv", "get", "r", "runs"]);
    assert_eq!(
        get.stdout, "3",
        "every attempt's increment is kept: {get:?}"
    );
}

#[test]
fn a_write_past_a_limit_fails_naming_it() {
    let daemon = Daemon::start(&["--kv-max-bucket", "1KiB"]);
    let (report, _) = count(&daemon, "big", &["--param", "pad=2000"]);
    assert_eq!(report["outcome"], "failed", "{report}");
    let reason = report["reason"].as_str().unwrap();
    assert!(
        reason.contains("slot `big` would hold") && reason.contains("--kv-max-bucket"),
        "{report}"
    );
    // What was written before the refused write is kept.
    let get = daemon.run(&["kv", "get", "big", "runs"]);
    assert_eq!(get.stdout, "1", "{get:?}");
    let (_, out) = count(&daemon, "big", &["--param", "pad=100"]);
    assert_eq!(out["runs"], 2);
}
