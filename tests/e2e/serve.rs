//! `host serve` and the client verbs end to end: a real daemon on a socket in
//! a temporary directory, the real client binary, the real plugins. Tests
//! synchronise on the daemon's stderr, on client output and on bounded polls
//! of `host ps`, never on sleeps alone.

use crate::{common, daemon};

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Finished, Running, plugin};
use daemon::{Daemon, LIMIT, p};
use serde_json::Value;
use taskhost::daemon::protocol::{
    Envelope, Hello, MAGIC, PROTOCOL_VERSION, Reply, Request, Welcome, decode, encode,
};
use taskhost::runtime::Digest;
use taskhost::supervisor::{TaskId, TaskRef};

/// The one JSON object a `--json` verb prints.
fn json(out: &Finished) -> Value {
    let mut lines = out.stdout.lines();
    let first = lines.next().unwrap_or_else(|| {
        panic!(
            "one JSON line on stdout, got nothing; stderr {:?}",
            out.stderr
        )
    });
    assert_eq!(
        lines.next(),
        None,
        "stdout holds exactly one JSON object: {:?}",
        out.stdout
    );
    serde_json::from_str(first).expect("valid JSON")
}

#[test]
fn submit_wait_and_wait_by_id() {
    let d = Daemon::start(&[]);
    let out = d.run(&["submit", &p("deploy"), "--param", "env=prod", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "deployed to prod (dry run: no endpoint)");
    assert!(
        out.stderr.contains("completed in 1 attempt"),
        "{}",
        out.stderr
    );

    let id = d.submit(&[&p("hello"), "--slot", "x", "--input", "hi"]);
    let out = d.run(&["wait", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hi");

    let out = d.run(&["wait", &id, "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["output"], "hi");
    assert_eq!(v["slot"], "x");
    assert_eq!(v["id"].to_string(), id);
}

#[test]
fn submit_wait_on_a_terminal_puts_the_output_on_a_line_of_its_own() {
    let d = Daemon::start(&["--store", "memory"]);
    let out = common::run_host_on_terminal(
        &d.args(&["submit", &p("hello"), "--input", "hi", "--wait"]),
        LIMIT,
    );
    assert_eq!(out.code, Some(0), "{:?}", out.text());
    let screen = out.screen();
    let at = screen.iter().position(|l| l == "hi");
    assert!(
        at.is_some_and(|at| screen
            .get(at + 1)
            .is_some_and(|l| l.starts_with("hello-1 completed in 1 attempt"))),
        "the output is a line of its own, the summary the next: {screen:#?}"
    );
    // Into a pipe the bytes stay exact.
    let out = d.run(&["submit", &p("hello"), "--input", "hi", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hi");
}

#[test]
fn max_retries_implies_restart_on_failure_for_submit_and_schedules() {
    let d = Daemon::start(&["--store", "memory"]);
    let retried = [
        "--param",
        "fail_times=2",
        "--max-retries",
        "3",
        "--backoff",
        "1ms,2ms,2,none",
    ];
    let flaky = p("flaky");
    let out = d.run(&[&["submit", &flaky][..], &retried, &["--wait"]].concat());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "ok after 3 attempts");
    assert!(
        out.stderr.contains("completed in 3 attempts"),
        "{}",
        out.stderr
    );

    // A schedule's firings carry it too.
    let add = ["schedule", "add", "retried", "--cron", "0 0 1 1 *", &flaky];
    let out = d.run(&[&add[..], &retried].concat());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = d.run(&["schedule", "run", "retried", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("completed in 3 attempts"),
        "{}",
        out.stderr
    );
}

#[test]
fn drop_if_running_rejects_a_second_submission_with_slot_busy() {
    let d = Daemon::start(&[]);
    let sleeper = [
        "submit",
        &p("sleeper"),
        "--param",
        "ms=5000",
        "--slot",
        "s",
        "--policy",
        "drop-if-running",
    ];
    let first = d.run(&sleeper);
    assert_eq!(first.code, Some(0), "{}", first.stderr);

    let second = d.run(&sleeper);
    assert_eq!(second.code, Some(3), "{}", second.stderr);
    assert!(second.stderr.contains("SlotBusy"), "{}", second.stderr);
    assert_eq!(second.stdout, "", "a rejection has no output");

    let mut with_json = sleeper.to_vec();
    with_json.push("--json");
    let third = d.run(&with_json);
    assert_eq!(third.code, Some(3), "{}", third.stderr);
    let v = json(&third);
    assert_eq!(v["outcome"], "rejected");
    assert_eq!(v["rejection"], "SlotBusy");
    assert_eq!(v["slot"], "s");
}

#[test]
fn replace_cancels_the_running_owner() {
    let d = Daemon::start(&[]);
    let first = d.spawn(&[
        "submit",
        &p("sleeper"),
        "--param",
        "ms=60000",
        "--slot",
        "r",
        "--name",
        "first",
        "--policy",
        "replace",
        "--wait",
    ]);
    d.wait_until_state("first", "running");

    let second = d.run(&[
        "submit",
        &p("hello"),
        "--slot",
        "r",
        "--policy",
        "replace",
        "--input",
        "second",
        "--wait",
    ]);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    assert_eq!(second.stdout, "second");

    let (_, first) = first.finish(LIMIT);
    assert_eq!(first.code, Some(4), "{}", first.stderr);
    assert!(first.stderr.contains("first canceled"), "{}", first.stderr);
    assert_eq!(first.stdout, "");
}

#[test]
fn slots_and_ps_show_the_owner_and_its_queue_and_cancel_removes_queued_work() {
    let d = Daemon::start(&[]);
    let owner = d.submit(&[
        &p("sleeper"),
        "--param",
        "ms=60000",
        "--slot",
        "q",
        "--name",
        "owner",
    ]);
    d.wait_until_state("owner", "running");
    let queued = d.submit(&[&p("hello"), "--slot", "q", "--name", "waiting"]);

    let out = d.run(&["slots", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let slots: Vec<Value> = serde_json::from_str(&out.stdout).expect("slots --json");
    assert_eq!(slots.len(), 1, "{slots:?}");
    assert_eq!(slots[0]["key"], "q");
    assert_eq!(slots[0]["state"], "running");
    assert_eq!(slots[0]["owner"].to_string(), owner);
    assert_eq!(slots[0]["queue_depth"], 1);

    let tasks = d.ps();
    let state_of = |id: &str| {
        tasks
            .iter()
            .find(|t| t["id"] == id.parse::<u64>().unwrap())
            .map(|t| t["state"].clone())
    };
    assert_eq!(state_of(&owner), Some("running".into()), "{tasks:?}");
    assert_eq!(state_of(&queued), Some("queued".into()), "{tasks:?}");
    assert_eq!(tasks.len(), 2, "{tasks:?}");

    // Human output carries the same facts.
    let out = d.run(&["slots"]);
    assert!(out.stdout.starts_with("SLOT"), "{}", out.stdout);
    assert!(out.stdout.contains("running"), "{}", out.stdout);

    let out = d.run(&["cancel", "waiting"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("RemovedFromQueue"), "{}", out.stderr);

    let again = d.submit(&[&p("hello"), "--slot", "q", "--name", "waiting-too"]);
    let out = d.run(&["cancel", "waiting-too", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["claimed"], true);
    assert_eq!(v["report"]["rejection"], "RemovedFromQueue");
    assert_eq!(v["report"]["id"].to_string(), again);

    // The queue is empty again and the owner still runs.
    let slots: Vec<Value> = serde_json::from_str(&d.run(&["slots", "--json"]).stdout).unwrap();
    assert_eq!(slots[0]["queue_depth"], 0, "{slots:?}");
    assert_eq!(slots[0]["state"], "running", "{slots:?}");
}

#[test]
fn shutdown_force_aborts_a_spinner_and_removes_the_socket() {
    let mut d = Daemon::start(&[]);
    let waiter = d.spawn(&[
        "submit",
        &p("spin"),
        "--name",
        "spinner",
        "--wait",
        "--json",
    ]);
    d.wait_until_state("spinner", "running");

    // --cancel-all: every task gets its final outcome now (without it, a
    // durable store keeps the work for the next start).
    let out = d.run(&["shutdown", "--grace", "200ms", "--cancel-all"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("force-aborted"), "{}", out.stderr);
    assert!(out.stderr.contains("spinner"), "{}", out.stderr);

    let (status, daemon_out) = d.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", daemon_out.stderr);
    assert!(
        !d.socket.exists(),
        "the socket `{}` is removed",
        d.socket.display()
    );

    let (_, waited) = waiter.finish(LIMIT);
    assert_eq!(waited.code, Some(4), "{}", waited.stderr);
    assert_eq!(json(&waited)["outcome"], "force-aborted");
}

/// The memory store keeps nothing for a next start, so a graceful stop
/// gives every task its final outcome now (the durable store's graceful
/// stop is in tests/e2e/durability.rs).
#[test]
fn sigterm_with_the_memory_store_shuts_down_gracefully_and_waiters_get_their_reports() {
    let mut d = Daemon::start(&["--store", "memory"]);
    let waiters: Vec<Running> = ["nap-1", "nap-2"]
        .iter()
        .map(|name| {
            d.spawn(&[
                "submit",
                &p("sleeper"),
                "--param",
                "ms=60000",
                "--name",
                name,
                "--wait",
                "--json",
            ])
        })
        .collect();
    d.wait_until_state("nap-1", "running");
    d.wait_until_state("nap-2", "running");

    d.process.as_ref().unwrap().signal("TERM");
    let (status, daemon_out) = d.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{}", daemon_out.stderr);
    assert!(
        daemon_out
            .stderr
            .contains("all tasks stopped within the grace"),
        "{}",
        daemon_out.stderr
    );
    assert!(!d.socket.exists(), "the socket is removed");
    // The reports reach the waiters before the daemon exits.
    for waiter in waiters {
        let (_, waited) = waiter.finish(LIMIT);
        assert_eq!(waited.code, Some(4), "{}", waited.stderr);
        assert_eq!(json(&waited)["outcome"], "canceled");
    }
}

fn serve_args<'a>(socket: &'a Path, state: &'a Path) -> [&'a str; 5] {
    [
        "serve",
        "--socket",
        socket.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]
}

#[test]
fn a_live_socket_is_refused_a_stale_one_replaced_and_other_files_kept() {
    let mut d = Daemon::start(&[]);
    let state = d.dir.path().join("state2");

    // A second daemon on a live socket does not start; the first carries on.
    let mut second = Running::spawn(&serve_args(&d.socket, &state));
    second.wait_for_line("already listening", LIMIT);
    let (_, out) = second.finish(LIMIT);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert_served(&d, "still-served");

    // A crashed daemon leaves its socket behind; the next one replaces it.
    let mut crashed = d.process.take().unwrap();
    crashed.child.kill().unwrap();
    crashed.child.wait().unwrap();
    assert!(d.socket.exists(), "a stale socket is left behind");
    let mut next = Running::spawn(&serve_args(&d.socket, &state));
    next.wait_for_line("taskhost daemon listening on", LIMIT);
    d.process = Some(next);
    assert_served(&d, "served-again");

    // A file that is not a socket is never taken for a stale one.
    let file = d.dir.path().join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let mut refused = Running::spawn(&serve_args(&file, &state));
    refused.wait_for_line("not a socket", LIMIT);
    let (_, out) = refused.finish(LIMIT);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// Reads one frame (length prefix + postcard body) from a blocking stream.
fn read_frame_sync(stream: &mut UnixStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).expect("a frame's length");
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).expect("a frame's body");
    body
}

/// A raw connection that has shaken hands like a real client.
fn handshake(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let hello = encode(&Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
    })
    .unwrap();
    stream.write_all(&hello).unwrap();
    let welcome: Welcome = decode(&read_frame_sync(&mut stream)).expect("a welcome");
    assert_eq!(welcome.version, PROTOCOL_VERSION);
    stream
}

/// Asserts the daemon ends this connection (EOF or a reset, not a hang).
fn assert_closed_by_daemon(mut stream: UnixStream, what: &str) {
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert!(
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
            "{what}: the daemon kept the connection open"
        ),
    }
}

fn assert_served(d: &Daemon, input: &str) {
    let out = d.run(&["submit", &p("hello"), "--input", input, "--wait"]);
    assert_eq!(out.code, Some(0), "after {input}: {}", out.stderr);
    assert_eq!(out.stdout, input);
}

#[test]
fn hostile_clients_cost_only_their_own_connection() {
    let d = Daemon::start(&[]);
    let socket = d.socket.clone();
    // A well-behaved client stays connected throughout.
    let survivor = d.spawn(&[
        "submit",
        &p("sleeper"),
        "--param",
        "ms=60000",
        "--name",
        "survivor",
        "--wait",
    ]);
    d.wait_until_state("survivor", "running");

    // Garbage instead of a hello.
    let mut garbage = UnixStream::connect(&socket).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: taskhost\r\n\r\n")
        .unwrap();
    assert_closed_by_daemon(garbage, "garbage");
    assert_served(&d, "after-garbage");

    // A small frame that is not a hello.
    let mut not_hello = UnixStream::connect(&socket).unwrap();
    not_hello
        .write_all(&[0, 0, 0, 3, 0xff, 0xff, 0xff])
        .unwrap();
    assert_closed_by_daemon(not_hello, "malformed hello");

    // An oversized length prefix, before and after the handshake.
    let mut huge = UnixStream::connect(&socket).unwrap();
    huge.write_all(&[0xff; 4]).unwrap();
    assert_closed_by_daemon(huge, "oversized hello");
    let mut huge = handshake(&socket);
    huge.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    assert_closed_by_daemon(huge, "oversized request");
    assert_served(&d, "after-oversized");

    // A truncated frame: the daemon serves others while it hangs, then the
    // client gives up half-way.
    let mut truncated = handshake(&socket);
    truncated.write_all(&[0, 0, 0, 100, 1, 2, 3]).unwrap();
    assert_served(&d, "during-truncated");
    truncated.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed_by_daemon(truncated, "truncated");
    assert_served(&d, "after-truncated");

    // Vanishing mid-upload: half of an Upload frame, then gone.
    let upload = |data: Vec<u8>, last: bool| {
        encode(&Envelope {
            id: 1,
            body: Request::Upload {
                digest: Digest([7; 32]),
                offset: 0,
                data,
                last,
            },
        })
        .unwrap()
    };
    let mut partial_frame = handshake(&socket);
    let frame = upload(vec![0x61; 200_000], false);
    partial_frame.write_all(&frame[..frame.len() / 2]).unwrap();
    drop(partial_frame);
    assert_served(&d, "after-partial-frame");

    // Vanishing mid-upload: a whole first chunk, never the rest.
    let mut partial_chunk = handshake(&socket);
    partial_chunk
        .write_all(&upload(vec![0x61; 100_000], false))
        .unwrap();
    let reply = read_frame_sync(&mut partial_chunk);
    let reply: Envelope<Reply> = decode(&reply).unwrap();
    assert_eq!(
        reply.body,
        Reply::Uploaded { plugin: None },
        "the first chunk is taken"
    );
    drop(partial_chunk);
    assert_served(&d, "after-partial-chunk");

    // The long-lived client was never disturbed.
    assert!(d.ps().iter().any(|t| t["name"] == "survivor"));
    let out = d.run(&["remove", "survivor"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (_, survivor) = survivor.finish(LIMIT);
    assert_eq!(survivor.code, Some(4), "{}", survivor.stderr);
    assert!(
        survivor.stderr.contains("survivor canceled"),
        "{}",
        survivor.stderr
    );
}

/// Connects and shakes hands, retrying while the daemon turns the connection
/// away (its connection limit is reached by clients it has not yet seen
/// leave).
fn handshake_when_admitted(socket: &Path) -> UnixStream {
    for _ in 0..500 {
        let mut stream = UnixStream::connect(socket).expect("connect");
        stream.set_read_timeout(Some(LIMIT)).unwrap();
        let hello = encode(&Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
        })
        .unwrap();
        let mut len = [0u8; 4];
        if stream.write_all(&hello).is_ok() && stream.read_exact(&mut len).is_ok() {
            let mut body = vec![0; u32::from_be_bytes(len) as usize];
            stream.read_exact(&mut body).expect("a welcome");
            let _: Welcome = decode(&body).expect("a welcome");
            return stream;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the daemon never admitted a connection");
}

#[test]
fn a_waiter_that_vanishes_gives_its_connection_back() {
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("host.toml");
    std::fs::write(&config, "max_connections = 2\n").unwrap();
    let d = Daemon::start_at("h.sock", &["--config", config.to_str().unwrap()]);
    let id: u64 = d
        .submit(&[&p("sleeper"), "--param", "ms=60000"])
        .parse()
        .unwrap();

    // Two clients fill the connection limit, each waiting for the sleeper.
    let waiters: Vec<UnixStream> = (0..2)
        .map(|_| {
            let mut stream = handshake_when_admitted(&d.socket);
            let mut frames = encode(&Envelope {
                id: 1,
                body: Request::Wait(TaskRef::Id(TaskId::from_u64(id))),
            })
            .unwrap();
            frames.extend(
                encode(&Envelope {
                    id: 2,
                    body: Request::List { all: false },
                })
                .unwrap(),
            );
            stream.write_all(&frames).unwrap();
            // The list is answered, so the wait was read before it.
            let reply: Envelope<Reply> = decode(&read_frame_sync(&mut stream)).unwrap();
            assert_eq!(reply.id, 2, "{reply:?}");
            assert!(
                matches!(reply.body, Reply::Tasks(_) | Reply::End),
                "{reply:?}"
            );
            stream
        })
        .collect();
    let out = d.run(&["ps"]);
    assert_eq!(out.code, Some(5), "the limit is reached: {}", out.stderr);

    // They vanish while their task still runs: their connections are freed.
    drop(waiters);
    for _ in 0..500 {
        if d.run(&["ps"]).code == Some(0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("vanished waiters still hold the daemon's connections");
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn other_users_cannot_connect() {
    // The daemon creates its socket directory itself.
    let d = Daemon::start_at("run/h.sock", &[]);
    let run_dir = d.socket.parent().unwrap().to_path_buf();
    assert_eq!(mode(&d.socket), 0o600, "the socket is owner-only");
    assert_eq!(mode(&run_dir), 0o700, "its directory is owner-only");

    let uid = taskhost::daemon::socket::current_uid().expect("uid");
    if uid != 0 {
        // Not root: no other user to become; the modes above are what keep
        // others out, and the owner gets in.
        let out = d.run(&["ps"]);
        assert_eq!(out.code, Some(0), "the owner connects: {}", out.stderr);
        return;
    }

    // Root: become nobody.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (host, _copy) = common::host_for_nobody();
    let nobody_ps = || {
        let out = common::as_nobody(&host)
            .args(["ps", "--socket", d.socket()])
            .env_remove("TASKHOST_SOCKET")
            .stdin(Stdio::null())
            .output()
            .expect("run host as nobody");
        Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };

    // nobody's client refuses a socket in a directory that is not
    // nobody's before it connects (tests/e2e/trust.rs has the rest).
    let out = nobody_ps();
    assert_eq!(out.code, Some(5), "nobody is refused: {}", out.stderr);
    assert!(
        out.stderr.contains("belongs to another user"),
        "refused: {}",
        out.stderr
    );

    // Past the client's own checks (an open(2) as nobody): even with the
    // directory opened up, the socket's mode refuses nobody.
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let raw = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["bash", "-c", "exec 3<>\"$0\"", d.socket()])
        .stdin(Stdio::null())
        .output()
        .expect("run bash as nobody");
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let stderr = String::from_utf8_lossy(&raw.stderr);
    assert!(!raw.status.success(), "nobody opened the socket");
    // open(2) of a socket one may use fails with ENXIO; one whose mode
    // refuses the user fails with EACCES.
    assert!(
        stderr.contains("Permission denied"),
        "refused by the socket's mode: {stderr}"
    );

    // The owner (root) connects.
    let out = d.run(&["ps"]);
    assert_eq!(out.code, Some(0), "the owner connects: {}", out.stderr);
    assert!(out.stdout.starts_with("ID"), "{}", out.stdout);
}

#[test]
fn no_daemon_is_exit_5_with_a_hint() {
    let out = common::run_host(&["ps", "--socket", "/nonexistent/x.sock"]);
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    assert!(out.stderr.contains("/nonexistent/x.sock"), "{}", out.stderr);
    assert!(out.stderr.contains("host serve"), "{}", out.stderr);
    assert_eq!(out.stdout, "");
    assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
}

#[test]
fn logs_show_guest_output() {
    let d = Daemon::start(&[]);
    let id = d.submit(&[&p("chatty")]);
    let out = d.run(&["wait", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "chatty done");

    let out = d.run(&["logs", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines.contains(&"[stdout] stdout line 1"), "{lines:?}");
    assert!(lines.contains(&"[stderr] stderr line 3"), "{lines:?}");
    assert_eq!(lines.len(), 6, "{lines:?}");
}

#[test]
fn logs_follow_streams_until_the_task_ends() {
    let d = Daemon::start(&[]);
    // deploy logs a line, then sleeps (cancellably) and logs again when
    // cancelled: both halves of a follow are visible.
    let id = d.submit(&[&p("deploy"), "--param", "env=logs", "--param", "ms=60000"]);
    let (mut follow, lines) = d.spawn_stdout_lines(&["logs", &id, "--follow"]);
    let first = lines.recv_timeout(LIMIT).expect("the line logged so far");
    assert!(first.contains("deploying to logs"), "{first}");
    assert_eq!(
        follow.try_wait().unwrap(),
        None,
        "following while the task runs"
    );

    let out = d.run(&["remove", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let live = lines.recv_timeout(LIMIT).expect("a live line");
    assert!(live.contains("deploy to logs cancelled"), "{live}");
    // The stream ends with the task.
    assert!(
        lines.recv_timeout(LIMIT).is_err(),
        "no more lines after the end"
    );
    let status = follow.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let out = d.run(&["wait", &id, "--json"]);
    assert_eq!(json(&out)["outcome"], "canceled");
}

#[test]
fn events_json_includes_task_finished() {
    let d = Daemon::start(&[]);
    let out = d.run(&["submit", &p("hello"), "--input", "x", "--wait", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let id = json(&out)["id"].clone();

    let out = d.run(&["events", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let events: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "TaskFinished" && e["task_id"] == id),
        "{events:?}"
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");
}

#[test]
fn a_plugin_file_changed_after_submission_does_not_change_queued_work() {
    let d = Daemon::start(&[]);
    let owner = d.submit(&[&p("sleeper"), "--param", "ms=60000", "--slot", "q"]);
    let file = d.dir.path().join("mine.wasm");
    std::fs::copy(plugin("hello"), &file).unwrap();

    let out = d.run(&[
        "submit",
        file.to_str().unwrap(),
        "--slot",
        "q",
        "--input",
        "original",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["queued"], true, "queued behind the sleeper: {v}");
    let queued = v["id"].to_string();

    // Overwrite the file with another plugin, then let the queue move.
    std::fs::write(&file, std::fs::read(plugin("chatty")).unwrap()).unwrap();
    let out = d.run(&["remove", &owner]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    let out = d.run(&["wait", &queued, "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["output"], "original", "hello ran, not chatty");
    assert!(v["name"].as_str().unwrap().starts_with("hello-"), "{v}");
}

/// `serve --detach` returns once the daemon accepts, and keeps its log
/// bounded: a `daemon.log` over 16 MiB becomes `daemon.log.1` at the next
/// start.
#[test]
fn serve_detach_starts_a_new_log_past_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let socket = dir.path().join("h.sock");
    std::fs::create_dir_all(&state).unwrap();
    let big = vec![b'x'; (16 << 20) + 1];
    std::fs::write(state.join("daemon.log"), &big).unwrap();

    let out = common::run_host(&[
        "serve",
        "--detach",
        "--socket",
        socket.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let stop = common::run_host(&["shutdown", "--socket", socket.to_str().unwrap()]);
    assert_eq!(stop.code, Some(0), "{}", stop.stderr);

    let old = std::fs::metadata(state.join("daemon.log.1")).unwrap().len();
    assert_eq!(old, big.len() as u64, "the old log is kept whole, once");
    let new = std::fs::read_to_string(state.join("daemon.log")).unwrap();
    assert!(new.len() < 1 << 20, "a new log: {} bytes", new.len());
    assert!(new.contains("taskhost daemon listening"), "{new}");
}

/// `--plugin-cache` bounds the compiled plugins the daemon keeps in memory:
/// the least recently used go first, stay listed and stored, and a later
/// submission compiles them again.
#[test]
fn the_plugin_cache_keeps_its_bound_and_reloads_what_it_dropped() {
    let d = Daemon::start(&["--plugin-cache", "200KiB"]);
    let runs: [&[&str]; 4] = [
        &["submit", &p("hello"), "--input", "one", "--wait"],
        &["submit", &p("sleeper"), "--param", "ms=1", "--wait"],
        &["submit", &p("flaky"), "--param", "fail_times=0", "--wait"],
        &["submit", &p("trap"), "--wait"],
    ];
    for args in runs {
        let out = d.run(args);
        assert!(matches!(out.code, Some(0 | 1)), "{}", out.stderr);
    }
    let rows = d.plugins();
    assert_eq!(rows.len(), 4, "every plugin stays stored: {rows:?}");
    let loaded: Vec<&Value> = rows.iter().filter(|r| r["loaded"] == true).collect();
    let bytes: u64 = loaded.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    assert!(
        !loaded.is_empty() && bytes <= 200 << 10,
        "at most 200 KiB of plugins loaded: {rows:?}"
    );
    let hello = rows.iter().find(|r| r["name"] == "hello").unwrap();
    assert_eq!(hello["loaded"], false, "the least recently used went first");

    // Dropped from memory, not from the daemon: it runs again.
    let out = d.run(&["submit", &p("hello"), "--input", "again", "--wait"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), "again"),
        "{}",
        out.stderr
    );
    let rows = d.plugins();
    let hello = rows.iter().find(|r| r["name"] == "hello").unwrap();
    assert_eq!(hello["loaded"], true);
}

/// The scheduling policies (`/proc/PID/task/*/stat`, field 41) of a
/// process's threads named `name`.
fn thread_policies(pid: u32, name: &str) -> Vec<u32> {
    let mut policies = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads") {
        let task = task.expect("a thread").path();
        let Ok(comm) = std::fs::read_to_string(task.join("comm")) else {
            continue;
        };
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.join("stat")).expect("the thread's stat");
        // The fields after the name, which is in parentheses: policy is
        // the 41st field in all, the 39th after the name.
        let after_name = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let policy = after_name
            .split_whitespace()
            .nth(38)
            .expect("a policy field");
        policies.push(policy.parse().expect("a number"));
    }
    policies
}

/// What the daemon's start-up line says of its epoch ticker's priority.
fn says_realtime_ticker(daemon: &Daemon) -> bool {
    let seen = &daemon.process.as_ref().expect("running").stderr_seen;
    let line = seen
        .iter()
        .find(|l| l.contains("taskhost daemon listening") && l.contains("realtime_ticker="))
        .unwrap_or_else(|| panic!("a start-up line naming realtime_ticker; saw {seen:?}"));
    line.contains("realtime_ticker=true")
}

/// The daemon's epoch ticker asks for real-time priority, so that a woken
/// ticker does not wait for a core that spinning guests hold: it says at
/// start whether it got it, which is what its thread's policy shows, and
/// where the process may not (no CAP_SYS_NICE, RLIMIT_RTPRIO 0) it runs at
/// normal priority and says why.
#[test]
fn the_epoch_ticker_runs_at_realtime_priority_where_the_process_may() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_FIFO: u32 = 1;
    let daemon = Daemon::start(&[]);
    let pid = daemon.process.as_ref().expect("running").child.id();
    let policy = if says_realtime_ticker(&daemon) {
        SCHED_FIFO
    } else {
        SCHED_OTHER
    };
    assert_eq!(thread_policies(pid, "taskhost-epoch"), [policy]);
    assert_eq!(
        thread_policies(pid, "tokio-rt-worker")
            .into_iter()
            .filter(|p| *p != SCHED_OTHER)
            .count(),
        0,
        "only the ticker asks for another policy"
    );
    drop(daemon);

    // Without the privilege: root drops CAP_SYS_NICE from what the daemon
    // can have, everyone's RLIMIT_RTPRIO is 0.
    let daemon = Daemon::start_in_shell(
        "ulimit -r 0 || exit 1; \
         if [ \"$(id -u)\" = 0 ]; then exec setpriv --bounding-set -sys_nice -- \"$0\" \"$@\"; fi; \
         exec \"$0\" \"$@\"",
        &[],
    );
    let pid = daemon.process.as_ref().expect("running").child.id();
    assert!(!says_realtime_ticker(&daemon));
    assert_eq!(thread_policies(pid, "taskhost-epoch"), [SCHED_OTHER]);
    let seen = &daemon.process.as_ref().expect("running").stderr_seen;
    assert!(
        seen.iter()
            .any(|l| l.contains("the epoch ticker runs at normal priority")
                && l.contains("RLIMIT_RTPRIO")),
        "{seen:?}"
    );
}

/// Every task's life ends in `TaskRemoved`, at shutdown too: a follower of
/// the events sees the `TaskRemoved` of each running task before the
/// shutdown's final event, in every run (a stopped guest's instance is
/// dropped on a reaper thread, which once published `TaskRemoved` after
/// the shutdown had already closed the stream).
#[test]
fn a_follower_sees_every_task_removed_at_shutdown() {
    let runs: usize = std::env::var("TASKHOST_SHUTDOWN_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for run in 0..runs {
        let mut d = Daemon::start(&[]);
        let names = ["nap-a", "nap-b", "nap-c"];
        let ids: Vec<u64> = names
            .iter()
            .map(|name| {
                d.submit(&[&p("sleeper"), "--name", name, "--param", "ms=60000"])
                    .parse()
                    .expect("an id")
            })
            .collect();
        for name in names {
            d.wait_until_state(name, "running");
        }
        let (mut follower, lines) = d.spawn_stdout_lines(&["events", "--follow", "--json"]);
        // The follower is attached once it has replayed the history.
        let mut seen: Vec<Value> = Vec::new();
        let deadline = std::time::Instant::now() + LIMIT;
        while !seen
            .iter()
            .any(|e| e["kind"] == "AttemptStarting" && e["task_id"] == ids[2])
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = lines
                .recv_timeout(left)
                .expect("the follower replays history");
            seen.push(serde_json::from_str(&line).expect("one JSON object per line"));
        }
        let out = d.run(&["shutdown", "--grace", "3s"]);
        assert_eq!(out.code, Some(0), "run {run}: {}", out.stderr);
        let (status, daemon_out) = d.finish(LIMIT);
        assert_eq!(status.code(), Some(0), "run {run}: {}", daemon_out.stderr);
        // The stream ends when the daemon is gone.
        while let Ok(line) = lines.recv_timeout(LIMIT) {
            seen.push(serde_json::from_str(&line).expect("one JSON object per line"));
        }
        let _ = follower.wait();
        let position = |kind: &str, id: Option<u64>| {
            seen.iter()
                .position(|e| e["kind"] == kind && id.is_none_or(|id| e["task_id"] == id))
        };
        let last = seen
            .iter()
            .rposition(|e| {
                matches!(
                    e["kind"].as_str(),
                    Some("AllStoppedWithinGrace" | "GraceExceeded")
                )
            })
            .unwrap_or_else(|| panic!("run {run}: no final shutdown event in {seen:#?}"));
        for id in &ids {
            let removed = position("TaskRemoved", Some(*id))
                .unwrap_or_else(|| panic!("run {run}: no TaskRemoved of task {id} in {seen:#?}"));
            assert!(
                removed < last,
                "run {run}: task {id}'s TaskRemoved comes before the shutdown's end: {seen:#?}"
            );
        }
    }
}
