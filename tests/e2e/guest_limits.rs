//! The per-attempt caps on what a guest holds in the host, end to end: the
//! real `host` binary, the real `hog` plugin and the hand-written
//! `two-memories` component (`tests/corpus/plugins/two-memories.wat`). A
//! guest that opens files or makes WASI handles past its caps gets an error,
//! its task fails with a reason naming the cap and the flag that raises it,
//! and the daemon, under a descriptor limit the guest could otherwise use
//! up, keeps answering other clients meanwhile. The memory limit counts all
//! of a component's memories together, and a submission's `--max-memory`
//! above the daemon's `--memory-ceiling` is refused.

use crate::{common, daemon};

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use common::run_host;
use daemon::{Daemon, LIMIT, p};
use serde_json::Value;

/// How long `host ps` may take while a guest holds its files: a daemon out
/// of descriptors would not answer it at all.
const PROMPT: Duration = Duration::from_secs(10);

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is one JSON object ({e}): {stdout:?}"))
}

/// The hand-written `two-memories` component, assembled from its text.
fn two_memories(dir: &std::path::Path) -> String {
    let wat = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/corpus/plugins/two-memories.wat"
    );
    let bytes = wat::parse_file(wat).expect("two-memories.wat assembles");
    let path = dir.join("two-memories.wasm");
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

#[test]
fn a_guest_past_its_file_and_handle_caps_fails_while_the_daemon_serves_others() {
    // 1,024 descriptors for the whole daemon: without a cap of its own, a
    // guest opening files in a loop would take every one of them, and the
    // daemon could accept no client.
    let mut d =
        Daemon::start_with_fd_limit(1024, &["--max-open-files", "64", "--max-handles", "1000"]);
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("hog.txt"), "held").unwrap();
    let grant = format!("{}::/data", data.path().display());
    d.submit(&[
        &p("hog"),
        "--dir",
        &grant,
        "--param",
        "release=/data/release",
        "--name",
        "files",
    ]);
    let (mut follow, lines) = d.spawn_stdout_lines(&["logs", "files", "--follow"]);
    let deadline = Instant::now() + LIMIT;
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("holding") => break,
            Ok(line) => seen.push(line),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                panic!("the hog never held its files; its log: {seen:?}")
            }
        }
    }
    // While the guest holds all it could open, another client is served.
    let ps = d.spawn(&["ps", "--json"]);
    let (status, out) = ps.finish(PROMPT);
    assert!(status.success(), "ps: {}", out.stderr);
    let rows: Value = json(&out.stdout);
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .any(|row| row["name"] == "files" && row["state"] == "running"),
        "{rows}"
    );
    // Let it go: its open failed, and the reason names the cap and its flag.
    std::fs::write(data.path().join("release"), "").unwrap();
    let out = d.run(&["wait", "files", "--json"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "failed", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.starts_with("open #"), "{reason}");
    assert!(reason.contains(" of /data/hog.txt failed: "), "{reason}");
    assert!(
        reason.ends_with(
            "(the guest hit its limit of 64 open files per attempt (raise it with \
             --max-open-files))"
        ),
        "{reason}"
    );
    let _ = follow.kill();
    let _ = follow.wait();
    let logs = d.run(&["logs", "files"]);
    assert!(
        logs.stdout.contains(
            "opening `hog.txt` refused: the guest is at its limit of 64 open files per \
             attempt (raise it with --max-open-files)"
        ),
        "{}",
        logs.stdout
    );

    // Handles without descriptors (timers): past the cap the guest traps.
    let out = d.run(&[
        "submit",
        &p("hog"),
        "--param",
        "what=handles",
        "--name",
        "handles",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "failed", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "the guest hit its limit of 1000 WASI handles per attempt (open files, streams, \
             pollables, HTTP requests and header sets; raise it with --max-handles); "
        ),
        "{reason}"
    );
    assert!(
        reason.contains("resource table has no free keys"),
        "{reason}"
    );
    d.assert_served("after the hogs");
}

#[test]
fn the_memory_limit_counts_every_memory_of_a_component() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = two_memories(dir.path());
    // Each memory alone stays under 32 MiB; the two together do not.
    let out = run_host(&["run", &plugin, "--max-memory", "32MiB", "--json"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(
        v["reason"],
        "two-memories: the second memory could not grow to 20MiB (the guest hit its memory \
         limit of 32MiB (it asked for 40MiB across all its memories; raise it with \
         --max-memory))",
        "{v}"
    );
    let out = run_host(&["run", &plugin, "--max-memory", "40MiB"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "both memories grew to 20MiB");
}

#[test]
fn a_max_memory_above_the_daemon_ceiling_is_refused() {
    let d = Daemon::start(&["--memory-ceiling", "64MiB", "--max-memory", "32MiB"]);
    let out = d.run(&[
        "submit",
        &p("hello"),
        "--max-memory",
        "128MiB",
        "--input",
        "x",
        "--wait",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(
        out.stderr.trim_end(),
        "error: --max-memory 128MiB is above this daemon's memory ceiling of 64MiB; ask for \
         64MiB or less, or its operator can raise it with `host serve --memory-ceiling \
         128MiB` or `memory_ceiling = \"128MiB\"` in the config file"
    );
    let out = d.run(&[
        "submit",
        &p("hello"),
        "--max-memory",
        "64MiB",
        "--input",
        "at the ceiling",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "at the ceiling");
    assert!(d.ps().is_empty());

    // A daemon whose own default is above its ceiling does not start.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("h.sock");
    let out = run_host(&[
        "serve",
        "--socket",
        socket.to_str().unwrap(),
        "--state-dir",
        dir.path().join("state").to_str().unwrap(),
        "--max-memory",
        "128MiB",
        "--memory-ceiling",
        "64MiB",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "max_memory (128MiB) is above memory_ceiling (64MiB): lower --max-memory or raise \
             --memory-ceiling"
        ),
        "{}",
        out.stderr
    );
    assert!(!socket.exists());
}

#[test]
fn directory_and_env_grants_beyond_the_daemon_ceiling_are_refused() {
    let allowed = tempfile::tempdir().unwrap();
    let inner = allowed.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    let reading = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let ro = format!("{}:ro", reading.path().display());
    let d = Daemon::start(&[
        "--allow-dir",
        allowed.path().to_str().unwrap(),
        "--allow-dir",
        &ro,
        "--allow-env",
        "APP_*",
        "--allow-env",
        "LANG",
    ]);
    let hello = p("hello");
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", hello.as_str(), "--input", "ran", "--wait"];
        args.extend_from_slice(extra);
        d.run(&args)
    };
    // Within the ceiling: a directory under an allowed one, a read-only
    // grant under the read-only one, allowed names.
    let under = format!("{}::/data", inner.display());
    let read = format!("{}::/ref:ro", reading.path().display());
    let out = submit(&[
        "--dir",
        &under,
        "--dir",
        &read,
        "--env",
        "APP_MODE=x",
        "--env",
        "LANG=C",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "ran");

    // Outside it, by path or by `..`: refused, naming the fix.
    let escape = format!("{}/..::/data", allowed.path().display());
    for grant in [format!("{}::/data", outside.path().display()), escape] {
        let out = submit(&["--dir", &grant]);
        assert_eq!(out.code, Some(2), "{grant}: {}", out.stderr);
        assert!(
            out.stderr
                .contains("is outside the directories this daemon allows")
                && out.stderr.contains("host serve --allow-dir"),
            "{}",
            out.stderr
        );
    }
    // Writable under the read-only one.
    let write = format!("{}::/ref", reading.path().display());
    let out = submit(&["--dir", &write]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("allows only read-only grants there; add `:ro`"),
        "{}",
        out.stderr
    );
    let out = submit(&["--env", "SECRET=1"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(
        out.stderr.trim_end(),
        "error: --env SECRET: this daemon does not let submissions set `SECRET` (its \
         allow_env: APP_*, LANG); its operator can add it with `host serve --allow-env SECRET`"
    );
    assert!(
        d.ps().iter().all(|t| t["state"] == "completed"),
        "{:?}",
        d.ps()
    );
}
