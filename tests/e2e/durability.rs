//! The durable store (SQLite, the default) with real processes: `kill -9`
//! of `host serve` with work in every state, a restart on the same state
//! directory, and the recovery contract checked case by case; the graceful
//! stop that keeps queued work; and a damaged, newer or read-only store
//! refused at start with one clear error.

use crate::{common, daemon};

use std::path::Path;

use common::{Finished, Running};
use daemon::{Daemon, LIMIT, p};
use serde_json::Value;

fn json(out: &Finished) -> Value {
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?} / {:?}", out.stdout, out.stderr))
}

#[test]
fn kill_9_then_restart_keeps_every_accepted_task_and_its_id() {
    // A long grace, so a spinner asked to stop is still stopping at the kill.
    let mut d = Daemon::start(&["--grace", "10m"]);

    // Finished before the crash.
    let out = d.run(&[
        "submit",
        &p("hello"),
        "--name",
        "done",
        "--input",
        "kept",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Running, run-once: must not run twice.
    let once = d.submit(&[
        &p("sleeper"),
        "--name",
        "once",
        "--slot",
        "a",
        "--param",
        "ms=600000",
    ]);
    d.wait_until_state("once", "running");
    // Queued behind it in the same slot.
    let queued = d.submit(&[
        &p("hello"),
        "--name",
        "q1",
        "--slot",
        "a",
        "--policy",
        "queue",
        "--input",
        "after",
    ]);
    // Backing off between failed attempts, with retries left: long enough
    // that it still backs off when the kill comes on a loaded machine (with
    // 2 s, attempt 2 had once run before the kill).
    d.submit(&[
        &p("flaky"),
        "--name",
        "retry",
        "--param",
        "fail_times=1",
        "--restart",
        "on-failure",
        "--backoff",
        "8s,8s,1,none",
    ]);
    d.wait_until_state("retry", "backing-off");
    // Periodic, waiting for its next run an hour after its first.
    d.submit(&[&p("hello"), "--name", "periodic", "--every", "1h"]);
    d.wait_until_state("periodic", "backing-off");
    // Being stopped: a spinner ignores the cancel until the (long) grace.
    d.submit(&[&p("spin"), "--name", "stopping"]);
    d.wait_until_state("stopping", "running");
    let out = d.run(&["remove", "stopping"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    d.wait_until_state("stopping", "stopping");
    // Pauses and stops are recorded without waiting; an acknowledged
    // submission is committed after every write before it.
    d.submit(&[&p("hello"), "--name", "fence"]);

    d.kill_9();
    d.restart(&[]);

    // Finished work is still there, by name and by id.
    let out = d.run(&["wait", "done"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "kept"),
        "{}",
        out.stderr
    );
    // The interrupted run-once task ended Failed, naming why.
    let out = d.run(&["wait", &once, "--json"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("interrupted: the host stopped"),
        "{v}"
    );
    // The queued one ran after the restart, under its old id.
    let out = d.run(&["wait", &queued]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "after"),
        "{}",
        out.stderr
    );
    // The restartable one was retried (its attempt 1 failed on purpose and
    // the retry after the restart succeeds).
    let out = d.run(&["wait", "retry", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // The one being stopped ended Canceled.
    let out = d.run(&["wait", "stopping", "--json"]);
    assert_eq!(json(&out)["outcome"], "canceled", "{}", out.stderr);

    // Each resumed task has a Recovered event saying what became of it.
    let out = d.run(&["events", "--kind", "recovered", "--json"]);
    let events: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let about = |name: &str| {
        events
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("a Recovered event for {name}: {events:?}"))["reason"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(about("once").starts_with("failed"), "{events:?}");
    assert!(about("q1").starts_with("queued again"), "{events:?}");
    // Both pauses resume at their recorded deadlines, not afresh.
    assert!(
        about("retry").starts_with("waiting: attempt 2 is due in"),
        "{events:?}"
    );
    let periodic = about("periodic");
    assert!(
        periodic.starts_with("waiting: attempt 2 is due in 59m")
            || periodic.starts_with("waiting: attempt 2 is due in 1h"),
        "{periodic}"
    );
    let out = d.run(&["ps", "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
    let row = rows
        .iter()
        .find(|r| r["name"] == "periodic")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(
        (&row["state"], &row["attempts"]),
        (&Value::from("backing-off"), &Value::from(1)),
        "{row}"
    );
    assert!(about("stopping").starts_with("canceled"), "{events:?}");

    // Ids only grow across the restart.
    let new = d.submit(&[&p("hello")]);
    assert!(new.parse::<u64>().unwrap() > 7, "new id {new}");
    // ps --all lists finished work from before the restart.
    let out = d.run(&["ps", "--all", "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
    assert!(
        rows.iter()
            .any(|r| r["name"] == "done" && r["state"] == "finished"),
        "{rows:?}"
    );
}

/// A sleeper named `owner` running in `slot`, and `hello` named `name`
/// queued behind it with this input; returns the queued one's id.
fn owner_with_one_queued(d: &Daemon, slot: &str, name: &str, input: &str) -> String {
    d.submit(&[
        &p("sleeper"),
        "--name",
        "owner",
        "--slot",
        slot,
        "--param",
        "ms=600000",
    ]);
    d.wait_until_state("owner", "running");
    d.submit(&[
        &p("hello"),
        "--name",
        name,
        "--slot",
        slot,
        "--policy",
        "queue",
        "--input",
        input,
    ])
}

#[test]
fn a_graceful_stop_keeps_queued_work_for_the_next_start() {
    let mut d = Daemon::start(&[]);
    let queued = owner_with_one_queued(&d, "s", "later", "still here");
    let waiter = d.spawn(&["wait", "later"]);

    let out = d.run(&["shutdown", "--grace", "5s"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let _ = d.finish(LIMIT);
    // The waiter lost its daemon (exit 5) and can wait again.
    let (_, waited) = waiter.finish(LIMIT);
    assert_eq!(waited.code, Some(5), "{}", waited.stderr);

    d.restart(&[]);
    let out = d.run(&["wait", &queued]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "still here"),
        "{}",
        out.stderr
    );
    // The owner's attempt was interrupted by the stop: run-once, so Failed.
    let out = d.run(&["wait", "owner", "--json"]);
    assert_eq!(json(&out)["outcome"], "failed", "{}", out.stderr);
}

/// A store written by the first schema (before pauses were recorded) is
/// migrated at start, and its work goes on.
#[test]
fn a_store_from_an_older_version_is_migrated_and_its_work_resumed() {
    let mut d = Daemon::start(&[]);
    // A parent and its two children, finished before the migration.
    let fanned = d.run(&["submit", &p("fanout"), "--param", "n=2", "--wait", "--json"]);
    assert_eq!(fanned.code, Some(0), "{fanned:?}");
    let parent = fanned.json()["id"].as_u64().unwrap();
    let queued = owner_with_one_queued(&d, "m", "queued", "migrated");
    d.kill_9();
    // Back to schema 1, as the first durable release wrote it.
    let db = d.dir.path().join("state/taskhost.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "DROP TABLE idempotency; \
         DROP TABLE schedules; \
         DROP TABLE kv; \
         DROP TABLE slot_rules; \
         DROP TABLE namespaces; \
         DROP TABLE deployments; \
         DROP TABLE plugin_uses; \
         DELETE FROM meta WHERE key <> 'next_id'; \
         ALTER TABLE tasks DROP COLUMN resume_at_ms; \
         ALTER TABLE tasks DROP COLUMN failures; \
         ALTER TABLE tasks DROP COLUMN parent; \
         ALTER TABLE tasks DROP COLUMN root; \
         ALTER TABLE tasks DROP COLUMN started_ms; \
         ALTER TABLE tasks DROP COLUMN records; \
         PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(conn);

    d.restart(&[]);
    let out = d.run(&["wait", &queued]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "migrated"),
        "{}",
        out.stderr
    );
    let version: u32 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 14, "every migration is applied");
    // The children's links, filled from their requests by the migration.
    let out = d.run(&["ps", "--all", "--json"]);
    let linked = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["parent"].as_u64() == Some(parent))
        .count();
    assert_eq!(linked, 2, "{out:?}");
    // Each plugin's finished users, counted by migration 13 and kept since,
    // are the finished tasks that ran it.
    let tasks = out.json();
    let plugins = d.plugins();
    assert!(plugins.len() >= 2, "{plugins:?}");
    for plugin in plugins {
        let finished = tasks
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["plugin"] == plugin["name"] && r["state"] == "finished")
            .count();
        assert_eq!(
            plugin["finished"].as_u64(),
            Some(finished as u64),
            "{plugin}"
        );
    }
}

#[test]
fn a_damaged_newer_or_unwritable_store_is_refused_at_start_with_one_clear_error() {
    let start = |dir: &Path| {
        let socket = dir.join("h.sock");
        let state = dir.join("state");
        common::run_host(&[
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ])
    };

    // Not a database at all.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(dir.path().join("state/taskhost.db"), vec![b'x'; 8192]).unwrap();
    let out = start(dir.path());
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("taskhost.db"), "{}", out.stderr);
    assert!(out.stderr.contains("Move it away"), "{}", out.stderr);

    // A database truncated mid-file.
    let mut d = Daemon::start(&[]);
    for i in 0..50 {
        d.submit(&[&p("hello"), "--input", &format!("{i:0200}")]);
    }
    let _ = d.run(&["shutdown"]);
    let _ = d.finish(LIMIT);
    let db = d.dir.path().join("state/taskhost.db");
    let len = std::fs::metadata(&db).unwrap().len();
    let bytes = std::fs::read(&db).unwrap();
    std::fs::write(&db, &bytes[..(len as usize / 2).max(100)]).unwrap();
    let _ = std::fs::remove_file(d.dir.path().join("state/taskhost.db-wal"));
    let out = start(d.dir.path());
    assert_eq!(
        out.code,
        Some(1),
        "a truncated store is refused: {}",
        out.stderr
    );
    assert!(out.stderr.contains("taskhost.db"), "{}", out.stderr);
    // Cut inside its first page: SQLite alone would take it for an empty
    // database and start afresh.
    std::fs::write(&db, &bytes[..2048]).unwrap();
    let out = start(d.dir.path());
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("is damaged"), "{}", out.stderr);

    // Written by a newer version.
    let mut d = Daemon::start(&[]);
    let _ = d.run(&["shutdown"]);
    let _ = d.finish(LIMIT);
    let db = d.dir.path().join("state/taskhost.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let out = start(d.dir.path());
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("newer taskhost"), "{}", out.stderr);

    // A state directory nobody may write (root may write anywhere, so the
    // database is made a directory instead, which nobody can open as one).
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state/taskhost.db")).unwrap();
    let out = start(dir.path());
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("taskhost.db"), "{}", out.stderr);
}

/// A full disk: the daemon runs with a file size limit (RLIMIT_FSIZE, with
/// SIGXFSZ ignored, so a write past it fails with EFBIG as on a full
/// filesystem; no root needed). Submissions are acknowledged until the store
/// cannot grow; then a submission is refused with an error naming the store,
/// the daemon keeps serving, and everything acknowledged before is there
/// after a restart without the limit.
#[test]
fn a_full_disk_refuses_submissions_clearly_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("h.sock");
    let state = dir.path().join("state");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -S -f 3072; exec "$0" "$@""#)
        .arg(common::host_bin())
        .args(["serve", "--socket", socket.to_str().unwrap()])
        .args(["--state-dir", state.to_str().unwrap()])
        .env("TASKHOST_CACHE_DIR", common::cache_dir())
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null());
    let mut process = Running::spawn_command(cmd);
    process.wait_for_line("taskhost daemon listening on", LIMIT);
    let mut d = Daemon {
        dir,
        socket,
        process: Some(process),
    };
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max file size") && l.contains("3145728")),
        "the daemon runs with the file size limit: {limits}"
    );

    // 256 KiB inputs against a 3 MiB file limit: the store fills up after
    // about a dozen (the sleeper's output is small, so outcomes fit).
    let input = d.dir.path().join("input");
    std::fs::write(&input, vec![b'x'; 256 << 10]).unwrap();
    let input = input.to_str().unwrap();
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..64 {
        let name = format!("t{i}");
        let out = d.run(&[
            "submit",
            &p("sleeper"),
            "--param",
            "ms=1",
            "--name",
            &name,
            "--input-file",
            input,
        ]);
        if out.code == Some(0) {
            acknowledged.push(out.stdout.trim().to_owned());
        } else {
            refused = Some(out);
            break;
        }
    }
    let refused = refused.expect("the store filled up");
    assert!(
        refused.stderr.contains("could not be stored") && refused.stderr.contains("taskhost.db"),
        "one clear error naming the problem and the store: {}",
        refused.stderr
    );
    assert!(!acknowledged.is_empty());
    // Still serving (a small task may or may not fit; the daemon answers).
    let out = d.run(&["ps"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    // Space again (the limit lifted on the running daemon): outcomes that
    // could not be recorded are retried until they land, and only then
    // shown; every acknowledged task gets one.
    let lifted = std::process::Command::new("prlimit")
        .args(["--pid", &d.pid().to_string(), "--fsize=unlimited:"])
        .status()
        .expect("run prlimit (Debian package util-linux)");
    assert!(lifted.success());
    let mut before = Vec::new();
    for id in &acknowledged {
        let out = d.run(&["wait", id, "--json"]);
        assert_eq!(out.code, Some(0), "task {id}: {}", out.stderr);
        before.push(json(&out)["outcome"].clone());
    }

    let _ = d.run(&["shutdown"]);
    let _ = d.finish(LIMIT);
    d.restart(&[]);
    // The same outcomes after the restart: none was shown before it was on
    // disk.
    for (id, before) in acknowledged.iter().zip(before) {
        let out = d.run(&["wait", id, "--json"]);
        assert_eq!(json(&out)["id"].to_string(), *id);
        assert_eq!(json(&out)["outcome"], before, "task {id}: {}", out.stderr);
    }
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        assert!(
            common::is_root(),
            "this test mounts a small tmpfs to fill: run it as root (CI does)"
        );
        std::fs::create_dir_all(at).unwrap();
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs at {}", at.display());
        Self(at.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("run mount");
        assert!(status.success(), "resize the tmpfs at {}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A full filesystem (ENOSPC, a small tmpfs under the state directory):
/// submissions are refused with an error naming the store and the problem,
/// the daemon keeps serving, nothing acknowledged is lost, and once there
/// is space again it takes submissions again by itself, no restart needed.
#[test]
fn a_full_filesystem_is_survived_and_left_behind_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let tmpfs = Tmpfs::mount(&state, "6m");
    let mut d = Daemon {
        socket: dir.path().join("h.sock"),
        process: None,
        dir,
    };
    d.restart(&[]);
    let input = d.dir.path().join("input");
    std::fs::write(&input, vec![b'x'; 256 << 10]).unwrap();
    let input = input.to_str().unwrap();
    let submit = |d: &Daemon, i: usize| {
        d.run(&[
            "submit",
            &p("sleeper"),
            "--param",
            "ms=1",
            "--name",
            &format!("t{i}"),
            "--input-file",
            input,
        ])
    };
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..64 {
        let out = submit(&d, i);
        if out.code == Some(0) {
            acknowledged.push(out.stdout.trim().to_owned());
        } else {
            refused = Some(out);
            break;
        }
    }
    let refused = refused.expect("the store filled the tmpfs");
    assert!(!acknowledged.is_empty());
    let store = state.join("taskhost.db");
    assert!(
        refused.stderr.contains(store.to_str().unwrap())
            && refused.stderr.contains("disk is full")
            && refused.stderr.contains("free space on the filesystem of"),
        "one clear error naming the store, the problem and the fix: {}",
        refused.stderr
    );
    let out = d.run(&["ps"]);
    assert_eq!(out.code, Some(0), "still serving: {}", out.stderr);

    // Space again: submissions are taken again, and every acknowledged
    // task gets its outcome.
    tmpfs.resize("64m");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let again = loop {
        let out = submit(&d, 100);
        if out.code == Some(0) {
            break out.stdout.trim().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no submission taken 10 s after space returned: {}",
            out.stderr
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    acknowledged.push(again);
    let mut before = Vec::new();
    for id in &acknowledged {
        let out = d.run(&["wait", id, "--json"]);
        assert_eq!(out.code, Some(0), "task {id}: {}", out.stderr);
        before.push(json(&out)["outcome"].clone());
    }
    let _ = d.run(&["shutdown"]);
    let _ = d.finish(LIMIT);
    d.restart(&[]);
    for (id, before) in acknowledged.iter().zip(before) {
        let out = d.run(&["wait", id, "--json"]);
        assert_eq!(json(&out)["outcome"], before, "task {id}: {}", out.stderr);
    }
    let _ = d.run(&["shutdown"]);
    let _ = d.finish(LIMIT);
}

/// `host plugins`: what is stored and who uses it; `rm` refuses a plugin an
/// unfinished task needs; unused plugins are collected (at start here, with
/// no grace) once retention has let go of the tasks that used them.
#[test]
fn plugins_are_listed_removed_and_collected_when_no_task_needs_them() {
    let mut d = Daemon::start(&[]);
    let out = d.run(&["submit", &p("hello"), "--input", "x", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    d.submit(&[&p("sleeper"), "--name", "nap", "--param", "ms=600000"]);
    d.wait_until_state("nap", "running");

    let rows = d.plugins();
    let row = |rows: &[Value], name: &str| rows.iter().find(|r| r["name"] == name).cloned();
    let sleeper = row(&rows, "sleeper").expect("sleeper listed");
    let hello = row(&rows, "hello").expect("hello listed");
    assert_eq!(
        (&sleeper["unfinished"], &sleeper["finished"]),
        (&Value::from(1), &Value::from(0))
    );
    assert_eq!(
        (&hello["unfinished"], &hello["finished"]),
        (&Value::from(0), &Value::from(1))
    );
    let hex = |row: &Value| row["digest"].as_str().unwrap()["sha256:".len()..].to_owned();

    // A plugin an unfinished task needs stays.
    let out = d.run(&["plugins", "rm", &hex(&sleeper)[..10]]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("used by 1 unfinished task"),
        "{}",
        out.stderr
    );
    // One only finished tasks used goes, by a prefix of its digest.
    let out = d.run(&["plugins", "rm", &hex(&hello)[..10]]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("1 plugin(s) removed"), "{}", out.stderr);
    assert!(row(&d.plugins(), "hello").is_none());
    assert!(
        !d.dir
            .path()
            .join(format!("state/plugins/{}.wasm", hex(&hello)))
            .exists()
    );
    // Submitting it again uploads it again.
    let out = d.run(&["submit", &p("hello"), "--input", "again", "--wait"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "again"),
        "{}",
        out.stderr
    );

    // Nothing is unused yet: prune removes nothing.
    let out = d.run(&["plugins", "prune", "--json"]);
    assert_eq!(out.stdout.trim(), "[]", "{}", out.stderr);

    // With retention keeping no finished task and no grace for unused
    // plugins, the next start collects every plugin no unfinished task needs.
    let out = d.run(&["cancel", "nap"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let _ = d.run(&["shutdown"]);
    let _ = d.finish(LIMIT);
    d.restart(&["--retain-finished", "0", "--keep-unused-plugins", "0s"]);
    assert_eq!(d.plugins(), Vec::<Value>::new());
    let stored = std::fs::read_dir(d.dir.path().join("state/plugins"))
        .unwrap()
        .count();
    assert_eq!(stored, 0, "no plugin file is left");
}
