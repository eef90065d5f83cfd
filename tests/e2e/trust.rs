//! Trust boundaries through the real binary: what the daemon creates is its
//! user's alone; a state or socket directory of another user, or one others
//! may write to, is refused; without a home there is no shared fallback;
//! the client checks the socket's directory and the process answering
//! before it sends anything; one daemon per state directory; a SQLite file
//! that is not a taskhost store is left untouched; out-of-range durations
//! on the wire are refused; guest text reaches the terminal as text; the
//! pool's memory reset under swap; the open-file limit; retention by bytes;
//! plugin files flushed before the submission is acknowledged. Each test
//! failed on the code before the change it covers. The tests that need a
//! second user run as root (as CI does) and become `nobody` with setpriv.

use crate::common::{self, Finished, Running};
use crate::daemon::{Daemon, LIMIT, p};
use crate::wire;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use taskhost::daemon::protocol::{ErrorKind, Reply, Request, SubmitRequest};

const NOBODY: u32 = 65534;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o777
}

fn chown_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");
}

fn output(out: std::process::Output) -> Finished {
    Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn require_root(test: &str) {
    assert!(
        common::is_root(),
        "{test} acts as a second user (nobody): run the tests as root, as CI does"
    );
}

#[test]
fn everything_a_detached_daemon_creates_is_owner_only() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let socket = tmp.path().join("run/h.sock");
    let (s, d) = (socket.to_str().unwrap(), state.to_str().unwrap());
    let out = common::run_host(&["serve", "--detach", "--socket", s, "--state-dir", d]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = common::run_host(&[
        "submit",
        &p("hello"),
        "--input",
        "top-secret",
        "--wait",
        "--socket",
        s,
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "top-secret");

    // Looked at while the daemon runs: the WAL and its index exist now.
    let mut seen = Vec::new();
    let mut open = Vec::new();
    let mut stack = vec![state.clone(), socket.parent().unwrap().to_path_buf()];
    while let Some(dir) = stack.pop() {
        seen.push(dir.clone());
        if mode(&dir) & 0o077 != 0 {
            open.push(format!("{} {:o}", dir.display(), mode(&dir)));
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                if meta.mode() & 0o077 != 0 {
                    open.push(format!("{} {:o}", path.display(), meta.mode() & 0o777));
                }
                seen.push(path);
            }
        }
    }
    let down = common::run_host(&["shutdown", "--socket", s]);
    assert_eq!(down.code, Some(0), "{}", down.stderr);
    for name in [
        "taskhost.db",
        "taskhost.db-wal",
        "taskhost.db-shm",
        "daemon.log",
        "taskhost.lock",
        "plugins",
        "wasmtime-cache",
    ] {
        assert!(
            seen.contains(&state.join(name)),
            "{name} was not created: {seen:?}"
        );
    }
    assert_eq!(mode(&state), 0o700);
    assert!(open.is_empty(), "readable by others: {open:?}");
}

#[test]
fn a_state_directory_others_may_write_to_or_of_another_user_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("h.sock");
    let serve = |state: &Path| {
        common::run_host(&[
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--store",
            "memory",
        ])
    };

    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = serve(&shared);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("is writable by others (mode 777)")
            && out
                .stderr
                .contains(&format!("chmod 700 {}", shared.display())),
        "{}",
        out.stderr
    );
    assert!(!socket.exists(), "it stopped before listening");

    // Readable by others (as an older taskhost made it): made private.
    let old = tmp.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut running = Running::spawn(&[
        "serve",
        "--socket",
        socket.to_str().unwrap(),
        "--state-dir",
        old.to_str().unwrap(),
        "--store",
        "memory",
    ]);
    running.wait_for_line("it is now 0700", LIMIT);
    running.wait_for_line("taskhost daemon listening on", LIMIT);
    assert_eq!(mode(&old), 0o700);
    running.signal("TERM");
    let (status, _) = running.finish(LIMIT);
    assert!(status.success());

    require_root("a state directory of another user");
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown_nobody(&theirs);
    let out = serve(&theirs);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("belongs to another user (uid 65534)")
            && out
                .stderr
                .contains("give --state-dir a directory of your own"),
        "{}",
        out.stderr
    );
}

#[test]
fn without_a_home_the_daemon_refuses_instead_of_sharing_tmp() {
    require_root("a user without a home");
    let (host, _copy) = common::host_for_nobody();
    let run = tempfile::tempdir().unwrap();
    std::fs::set_permissions(run.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    chown_nobody(run.path());
    let shared = std::env::temp_dir().join("taskhost");
    let before = std::fs::metadata(&shared).ok().map(|m| m.mtime());
    // As a system unit without `User=` sees it: no HOME, no XDG_*; nobody's
    // home in /etc/passwd does not exist.
    let out = output(
        common::as_nobody(&host)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args([
                "serve",
                "--store",
                "memory",
                "--socket",
                run.path().join("h.sock").to_str().unwrap(),
            ])
            .output()
            .expect("run host as nobody"),
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("there is no state directory to use")
            && out.stderr.contains("give --state-dir DIR"),
        "{}",
        out.stderr
    );
    let after = std::fs::metadata(&shared).ok().map(|m| m.mtime());
    assert_eq!(before, after, "{} was touched", shared.display());
}

#[test]
fn the_client_sends_nothing_to_a_socket_in_another_users_directory() {
    require_root("a directory of another user");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("theirs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The socket another user put there, listening.
    let socket = dir.join("h.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    chown_nobody(&dir);

    for args in [
        vec!["ps"],
        vec!["submit", &p("hello"), "--input", "top-secret"],
    ] {
        let mut all = args.clone();
        all.extend(["--socket", socket.to_str().unwrap()]);
        let out = common::run_host(&all);
        assert_eq!(out.code, Some(5), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("refusing to talk to")
                && out.stderr.contains("belongs to another user (uid 65534)"),
            "{}",
            out.stderr
        );
    }
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the client connected: {other:?}"),
    }
}

#[test]
fn the_client_refuses_a_daemon_of_another_user_and_detach_does_not_claim_it() {
    require_root("a daemon of another user");
    let (host, _copy) = common::host_for_nobody();
    let theirs = tempfile::tempdir().unwrap();
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    chown_nobody(theirs.path());
    let their_socket = theirs.path().join("h.sock");
    let mut cmd = common::as_nobody(&host);
    cmd.env("HOME", theirs.path()).args([
        "serve",
        "--store",
        "memory",
        "--socket",
        their_socket.to_str().unwrap(),
        "--state-dir",
        theirs.path().join("state").to_str().unwrap(),
    ]);
    let mut their_daemon = Running::spawn_command(cmd);
    their_daemon.wait_for_line("taskhost daemon listening on", LIMIT);

    // Our own directory, with a link to their socket in it.
    let ours = tempfile::tempdir().unwrap();
    let link = ours.path().join("h.sock");
    std::os::unix::fs::symlink(&their_socket, &link).unwrap();
    let out = common::run_host(&["ps", "--socket", link.to_str().unwrap()]);
    assert_eq!(out.code, Some(5), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("runs as another user (uid 65534, you are 0); nothing was sent"),
        "{}",
        out.stderr
    );

    let out = common::run_host(&[
        "serve",
        "--detach",
        "--store",
        "memory",
        "--socket",
        link.to_str().unwrap(),
        "--state-dir",
        ours.path().join("state").to_str().unwrap(),
    ]);
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert!(!out.stderr.contains("started"), "{}", out.stderr);
    assert!(out.stderr.contains("already listening"), "{}", out.stderr);
    their_daemon.signal("TERM");
    let _ = their_daemon.finish(LIMIT);
}

#[test]
fn a_second_daemon_on_the_same_state_directory_is_refused() {
    let d = Daemon::start(&[]);
    d.submit(&[&p("sleeper"), "--name", "held", "--param", "ms=60000"]);
    d.wait_until_state("held", "running");
    let state = d.dir.path().join("state");
    let other = d.dir.path().join("other.sock");
    let out = common::run_host(&[
        "serve",
        "--socket",
        other.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "another daemon (pid {}, socket {}) is using the state directory",
            d.pid(),
            d.socket()
        )),
        "{}",
        out.stderr
    );
    assert!(!other.exists(), "the second daemon did not listen");
    // The first one's task was not recovered by anyone: it still runs.
    let row = d.wait_until_state("held", "running");
    assert_eq!(row["attempts"], 1, "{row}");
    let out = d.run(&["cancel", "held"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Once `host shutdown` has answered, the directory is free at once.
    let mut d = d;
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = common::run_host(&[
        "serve",
        "--detach",
        "--socket",
        other.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = common::run_host(&["shutdown", "--socket", other.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let _ = d.finish(LIMIT);
}

#[test]
fn a_sqlite_file_that_is_not_a_taskhost_store_is_left_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("notes.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('mine');")
            .unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let out = common::run_host(&[
        "serve",
        "--socket",
        tmp.path().join("h.sock").to_str().unwrap(),
        "--state-dir",
        tmp.path().join("state").to_str().unwrap(),
        "--store",
        &format!("sqlite:{}", db.display()),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("is not a taskhost store")
            && out.stderr.contains("so it is left as it is"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read(&db).unwrap(), before, "the file changed");
    assert!(!tmp.path().join("notes.db-wal").exists());
}

#[tokio::test(flavor = "current_thread")]
async fn out_of_range_durations_on_the_wire_are_refused_and_the_daemon_serves_on() {
    let mut d = Daemon::start(&["--store", "memory"]);
    let client = wire::connect(&d.socket).await;
    let reply = wire::call(
        &client,
        Request::Shutdown {
            grace: Some(Duration::MAX),
            cancel_all: true,
        },
    )
    .await;
    match reply {
        Reply::Error { kind, message } => {
            assert_eq!(kind, ErrorKind::Invalid);
            assert!(message.contains("the grace"), "{message}");
            assert!(message.contains("out of range"), "{message}");
        }
        other => panic!("expected an error: {other:?}"),
    }
    let digest = wire::upload_plugin(&client, "hello").await;
    let mut submit = SubmitRequest::new(digest);
    submit.timeout = Some(Duration::MAX);
    match wire::call(&client, Request::Submit(Box::new(submit))).await {
        Reply::Error { kind, message } => {
            assert_eq!(kind, ErrorKind::Invalid);
            assert!(message.contains("the timeout"), "{message}");
        }
        other => panic!("expected an error: {other:?}"),
    }
    drop(client);
    d.assert_served("still here");
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (status, _) = d.finish(LIMIT);
    assert!(status.success(), "{status}");
}

/// What a guest writes to reach the terminal: a clipboard write (OSC 52),
/// a bell, a carriage return that would overwrite the line with a fake
/// summary, and a screen clear.
const HOSTILE: &str = "\x1b]52;c;aGk=\x07\rhello-9 completed in 1 attempt\x1b[2J";
const SHOWN: &str = r"\x1b]52;c;aGk=\x07\rhello-9 completed in 1 attempt\x1b[2J";

fn assert_no_controls(what: &str, text: &str) {
    assert!(
        !text.contains(['\x1b', '\x07', '\r']),
        "{what} passes control characters: {text:?}"
    );
    assert!(
        text.contains(SHOWN),
        "{what} does not show the text: {text:?}"
    );
}

#[test]
fn guest_text_reaches_the_terminal_as_text() {
    let text = format!("text={HOSTILE}");
    let out = common::run_host(&["run", &p("chatty"), "--param", "lines=0", "--param", &text]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_no_controls("host run", &out.stderr);

    let d = Daemon::start(&["--store", "memory"]);
    let id = d.submit(&[&p("chatty"), "--param", "lines=0", "--param", &text]);
    let out = d.run(&["wait", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = d.run(&["logs", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_no_controls("host logs", &out.stdout);
    let out = d.run(&["events"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_no_controls("host events", &out.stdout);
    // Machine-readable forms keep the text as it was.
    let out = d.run(&["logs", &id, "--json"]);
    let line: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(line["text"], HOSTILE);
}

/// `chatty`'s `escapes`: a clipboard write (OSC 52), a window title (OSC
/// 0), a bell, a carriage return with a forged summary, a C1 control
/// sequence introducer and a right-to-left override.
const ESCAPES: &str =
    "\x1b]52;c;aGk=\x07\x1b]0;pwned\x07\rhello-9 completed in 1 attempt \u{9b}31m\u{202e}drow";
/// [`ESCAPES`] as `host` shows them.
const ESCAPES_SHOWN: &str =
    r"\x1b]52;c;aGk=\x07\x1b]0;pwned\x07\rhello-9 completed in 1 attempt \u{9b}31m\u{202e}drow";
/// A task name that would retitle the window: `host run` takes it (and
/// shows it as text); the daemon refuses it (names are printable text), so
/// its verbs run the task as [`DAEMON_NAME`].
const NAME: &str = "\x1b]0;named\x07job";
const NAME_SHOWN: &str = r"\x1b]0;named\x07job";
const DAEMON_NAME: &str = "named-job";

/// Fails if the terminal received a byte of the guest's that acts on it:
/// the guest's sequences are told by their payload, and the only escape
/// `host` writes itself is `\r\x1b[K`, which clears its status line; a
/// pseudo-terminal writes `\r\n` for each newline, so any other `\r` is the
/// guest's.
fn assert_inert(what: &str, text: &str) {
    for raw in [
        "\x1b]52;",
        "\x1b]0;",
        "\x07",
        "\rhello-9",
        "\u{9b}",
        "\u{202e}",
    ] {
        assert!(
            !text.contains(raw),
            "{what}: the guest's {raw:?} reached the terminal: {text:?}"
        );
    }
    let own = text.replace("\r\x1b[K", "").replace("\r\n", "\n");
    let stray: Vec<char> = own
        .chars()
        .filter(|&c| c.is_control() && c != '\n' && c != '\t')
        .collect();
    assert!(
        stray.is_empty(),
        "{what}: control characters {stray:?} reached the terminal: {text:?}"
    );
}

/// Whether run `i` of [`escaping_task`] fails.
fn fails(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// The task flags of run `i`: even runs fail with [`ESCAPES`] (twice, so
/// the first failure is also a live status line and the attempts are
/// listed), odd ones answer them in a three-line output.
fn escaping_task(chatty: &str, i: usize, hold_ms: &'static str, name: &str) -> Vec<String> {
    let mode = if fails(i) {
        "escapes=fail"
    } else {
        "escapes=output"
    };
    [
        chatty,
        "--param",
        "lines=0",
        "--param",
        mode,
        "--param",
        hold_ms,
        "--name",
        name,
        "--restart",
        "on-failure",
        "--max-retries",
        "1",
        "--backoff",
        "20ms,20ms,1,none",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// What `verb` showed for run `i` of [`escaping_task`]: nothing of the
/// guest's acts on the terminal, and all of it is shown as text (the
/// output's newlines as newlines).
fn assert_shown(verb: &str, i: usize, out: &common::OnTerminal, name_shown: &str) {
    let text = out.text();
    let what = format!("{verb} (run {i})");
    assert_inert(&what, &text);
    let screen = out.screen();
    if fails(i) {
        assert_eq!(out.code, Some(1), "{what}: {text:?}");
        let summary = format!("{name_shown} failed after 2 attempts");
        assert!(
            screen
                .iter()
                .any(|l| l.starts_with(&summary) && l.contains(ESCAPES_SHOWN)),
            "{what}: no summary with the reason shown: {screen:#?}"
        );
    } else {
        assert_eq!(out.code, Some(0), "{what}: {text:?}");
        let output = ["first line", ESCAPES_SHOWN, "last line"];
        let at = screen.iter().position(|l| l == output[0]);
        assert!(
            at.is_some_and(|at| screen[at..].starts_with(&output.map(String::from))),
            "{what}: the output is not shown on its own three lines: {screen:#?}"
        );
        let summary = format!("{name_shown} completed in 1 attempt");
        assert!(
            screen.iter().any(|l| l.starts_with(&summary)),
            "{what}: no summary on a line of its own: {screen:#?}"
        );
    }
}

#[test]
fn guest_escapes_reach_no_terminal_in_any_verb_at_any_timing() {
    const RUNS: usize = 20;
    let chatty = p("chatty");
    let on_terminal = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::run_host_on_terminal(&args, LIMIT)
    };
    for i in 0..RUNS {
        let mut args = vec!["run".to_owned()];
        args.extend(escaping_task(&chatty, i, "hold_ms=0", NAME));
        let out = on_terminal(args);
        assert_shown("host run", i, &out, NAME_SHOWN);
        // The guest's stdout, stderr and log lines, as text.
        assert!(
            out.text().matches(ESCAPES_SHOWN).count() >= 3,
            "host run (run {i}) shows the guest's lines: {:?}",
            out.text()
        );
    }

    let d = Daemon::start(&["--store", "memory"]);
    let mut args = vec!["submit".to_owned()];
    args.extend(escaping_task(&chatty, 0, "hold_ms=0", NAME));
    args.extend(["--socket", d.socket()].map(str::to_owned));
    let refused = on_terminal(args);
    assert_eq!(refused.code, Some(2), "{:?}", refused.text());
    assert_inert("a refused name", &refused.text());
    assert!(
        refused.text().contains("holds a control character"),
        "{:?}",
        refused.text()
    );
    // The live status line shows a failed attempt's reason when its event
    // comes before the outcome: the path that raced.
    let status = format!("attempt 1 failed: {ESCAPES_SHOWN}");
    let mut drawn = 0;
    for i in 0..RUNS {
        let mut args = vec!["submit".to_owned()];
        args.extend(escaping_task(&chatty, i, "hold_ms=0", DAEMON_NAME));
        args.extend(["--wait", "--socket", d.socket()].map(str::to_owned));
        let out = on_terminal(args);
        assert_shown("host submit --wait", i, &out, DAEMON_NAME);
        drawn += usize::from(out.text().contains(&status));
    }
    assert!(
        drawn > 0,
        "no `submit --wait` drew a failed attempt's status line: the test missed the path it guards"
    );
    let mut ids = Vec::new();
    for i in 0..RUNS {
        // Held a little, so `wait` often sees the task run and fail.
        let task = escaping_task(&chatty, i, "hold_ms=30", DAEMON_NAME);
        let task: Vec<&str> = task.iter().map(String::as_str).collect();
        let id = d.submit(&task);
        let args = ["wait", &id, "--socket", d.socket()].map(str::to_owned);
        assert_shown("host wait", i, &on_terminal(args.to_vec()), DAEMON_NAME);
        ids.push(id);
    }
    for (i, id) in ids.iter().enumerate() {
        let out = on_terminal(
            ["logs", id, "--socket", d.socket()]
                .map(str::to_owned)
                .to_vec(),
        );
        assert_eq!(out.code, Some(0), "{:?}", out.text());
        assert_inert(&format!("host logs (run {i})"), &out.text());
        assert!(
            out.text().contains(ESCAPES_SHOWN),
            "host logs shows the lines: {:?}",
            out.text()
        );
        let out = on_terminal(
            ["events", "--socket", d.socket()]
                .map(str::to_owned)
                .to_vec(),
        );
        assert_eq!(out.code, Some(0), "{:?}", out.text());
        assert_inert(&format!("host events (run {i})"), &out.text());
        assert!(
            out.text().contains(ESCAPES_SHOWN) && out.text().contains(DAEMON_NAME),
            "host events shows the lines and names: {:?}",
            out.text()
        );
    }
}

#[test]
fn outputs_and_values_are_raw_in_a_pipe_or_with_raw_and_lossless_in_json() {
    let chatty = p("chatty");
    let task = [
        chatty.as_str(),
        "--param",
        "lines=0",
        "--param",
        "escapes=output",
    ];
    let output = format!("first line\n{ESCAPES}\nlast line");

    // A pipe gets the bytes exactly.
    let out = common::run_host(&[&["run"][..], &task].concat());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, output);
    assert_inert("host run's stderr", &out.stderr);

    // --raw writes the output as it is on a terminal too; the guest's lines
    // on stderr stay text.
    let out = common::run_host_on_terminal(&[&["run"][..], &task, &["--raw"]].concat(), LIMIT);
    assert_eq!(out.code, Some(0), "{:?}", out.text());
    let text = out.text();
    assert_eq!(text.matches("\x1b]52;").count(), 1, "{text:?}");
    assert!(text.contains(&output.replace('\n', "\r\n")), "{text:?}");
    assert_eq!(text.matches(ESCAPES_SHOWN).count(), 3, "{text:?}");

    // JSON on a terminal: the same text, every control character escaped.
    let out = common::run_host_on_terminal(&[&["run"][..], &task, &["--json"]].concat(), LIMIT);
    assert_eq!(out.code, Some(0), "{:?}", out.text());
    let text = out.text();
    assert_inert("host run --json", &text);
    let line = out.screen().into_iter().find(|l| l.starts_with('{'));
    let json: serde_json::Value = line
        .and_then(|l| serde_json::from_str(&l).ok())
        .unwrap_or_else(|| panic!("no JSON line: {text:?}"));
    assert_eq!(json["output"], output);

    let d = Daemon::start(&["--store", "memory"]);
    let mut submit = vec!["submit"];
    submit.extend(task);
    submit.extend(["--wait", "--socket", d.socket()]);
    let out = common::run_host(&submit);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, output);
    submit.push("--raw");
    let out = common::run_host_on_terminal(&submit, LIMIT);
    assert_eq!(
        out.text().matches("\x1b]52;").count(),
        1,
        "{:?}",
        out.text()
    );

    // A value a guest stored is printed like an output.
    let stored = [
        "submit",
        &p("counter"),
        "--slot",
        "kept",
        "--input",
        ESCAPES,
        "--wait",
    ];
    let out = d.run(&stored);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let get = d.args(&["kv", "get", "kept", "last"]);
    let out = common::run_host(&get);
    assert_eq!(out.stdout, ESCAPES);
    let out = common::run_host_on_terminal(&get, LIMIT);
    assert_eq!(out.code, Some(0), "{:?}", out.text());
    assert_inert("host kv get", &out.text());
    assert_eq!(out.screen(), [ESCAPES_SHOWN]);
    let out = common::run_host_on_terminal(&[&get[..], &["--raw"]].concat(), LIMIT);
    assert!(out.text().starts_with(ESCAPES), "{:?}", out.text());
}

/// A swap file turned on for the life of the guard (root only).
struct Swap(PathBuf);

impl Swap {
    fn on(dir: &Path) -> Self {
        let file = dir.join("swapfile");
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("run a swap command");
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("fallocate").args(["-l", "16M"]).arg(&file));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        run(Command::new("mkswap").arg(&file));
        run(Command::new("swapon").arg(&file));
        Self(file)
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
    }
}

fn allocator_line(d: &mut Daemon) -> String {
    let process = d.process.as_mut().expect("running");
    process
        .stderr_seen
        .iter()
        .find(|l| l.contains("allocator="))
        .cloned()
        .unwrap_or_else(|| panic!("no allocator in {:?}", process.stderr_seen))
}

#[test]
fn with_swap_on_the_pool_resets_memory_without_the_page_scan() {
    require_root("swapon");
    let tmp = tempfile::tempdir().unwrap();
    let swap = Swap::on(tmp.path());
    let mut d = Daemon::start(&["--store", "memory"]);
    let line = allocator_line(&mut d);
    assert!(
        line.contains("Memset { why: \"swap or zswap is on\" }"),
        "{line}"
    );
    d.assert_served("reset by memset");
    drop(d);
    drop(swap);

    let mut d = Daemon::start(&["--store", "memory"]);
    let line = allocator_line(&mut d);
    assert!(!line.contains("swap"), "{line}");
}

#[test]
fn the_daemon_raises_its_soft_open_file_limit_to_the_hard_one() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=256:4096", common::host_bin()])
        .env("TASKHOST_CACHE_DIR", common::cache_dir())
        .args([
            "serve",
            "--store",
            "memory",
            "--socket",
            tmp.path().join("h.sock").to_str().unwrap(),
            "--state-dir",
            tmp.path().join("state").to_str().unwrap(),
        ]);
    let mut running = Running::spawn_command(cmd);
    running.wait_for_line("taskhost daemon listening on", LIMIT);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", running.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&fields[3..5], ["4096", "4096"], "{line}");
    running.signal("TERM");
    let _ = running.finish(LIMIT);
}

fn finished_ids(d: &Daemon) -> Vec<u64> {
    let out = d.run(&["ps", "--all", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap();
    rows.iter()
        .filter(|r| r["state"] == "finished")
        .map(|r| r["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn retention_bounds_finished_outputs_by_bytes_in_memory_and_in_the_store() {
    let mut d = Daemon::start(&["--retain-bytes", "3MiB"]);
    let mut ids = Vec::new();
    for _ in 0..8 {
        let id = d.submit(&[&p("output-huge"), "--param", "mib=1"]);
        let out = d.run(&["wait", &id, "--json"]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        ids.push(id.parse::<u64>().unwrap());
    }
    let kept = finished_ids(&d);
    assert!(
        !kept.is_empty() && kept.len() <= 3,
        "kept {kept:?} of {ids:?}"
    );
    assert!(kept.contains(ids.last().unwrap()), "{kept:?}");
    let out = d.run(&["wait", &ids[0].to_string()]);
    assert_eq!(out.code, Some(2), "the first is forgotten: {}", out.stderr);

    // The store keeps no more after a restart (the rows are deleted on
    // disk, not only forgotten in memory).
    let process = d.process.take().unwrap();
    let _ = Command::new("kill")
        .args(["-KILL", &process.child.id().to_string()])
        .status();
    let _ = process.finish(LIMIT);
    d.restart(&["--retain-bytes", "3MiB"]);
    let kept = finished_ids(&d);
    assert!(
        !kept.is_empty() && kept.len() <= 3,
        "after a restart {kept:?}"
    );
}

#[test]
fn a_plugin_file_is_flushed_with_its_directory_before_the_submission_is_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("trace");
    let socket = tmp.path().join("h.sock");
    let state = tmp.path().join("state");
    let mut cmd = Command::new("strace");
    // One file per thread: the write, flush, rename and directory flush
    // happen on one blocking thread, so its file has them in order.
    cmd.args(["-ff", "-qq", "-e", "trace=openat,fsync,rename", "-o"])
        .arg(&trace)
        .arg(common::host_bin())
        .env("TASKHOST_CACHE_DIR", common::cache_dir())
        .args([
            "serve",
            "--store",
            "memory",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ])
        .stdin(Stdio::null());
    let mut running = Running::spawn_command(cmd);
    running.wait_for_line("taskhost daemon listening on", LIMIT);
    let out = common::run_host(&[
        "submit",
        &p("hello"),
        "--input",
        "x",
        "--socket",
        socket.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Through the socket: a signal would reach strace, not the daemon.
    let down = common::run_host(&["shutdown", "--socket", socket.to_str().unwrap()]);
    assert_eq!(down.code, Some(0), "{}", down.stderr);
    let _ = running.finish(LIMIT);

    let plugins = state.join("plugins").display().to_string();
    let text = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("trace.")
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .find(|t| t.contains("rename(") && t.contains(&plugins))
        .unwrap_or_else(|| panic!("no thread renamed a file into {plugins}"));
    let lines: Vec<&str> = text.lines().collect();
    let rename = lines
        .iter()
        .position(|l| l.contains("rename(") && l.contains(&plugins))
        .unwrap_or_else(|| panic!("no rename into {plugins}:\n{text}"));
    // The temporary file: opened, then flushed before the rename.
    let fd_of = |line: &str| {
        line.rsplit("= ")
            .next()
            .and_then(|n| n.trim().parse::<i32>().ok())
    };
    let tmp_fd = lines[..rename]
        .iter()
        .rev()
        .find(|l| l.contains("openat(") && l.contains(&plugins) && l.contains(".tmp."))
        .and_then(|l| fd_of(l))
        .unwrap_or_else(|| panic!("no open of the temporary file:\n{text}"));
    assert!(
        lines[..rename]
            .iter()
            .any(|l| l.contains(&format!("fsync({tmp_fd})"))),
        "the file is not flushed before its rename:\n{text}"
    );
    // Then the directory: opened and flushed.
    let dir_open = lines[rename..]
        .iter()
        .position(|l| l.contains(&format!("openat(AT_FDCWD, \"{plugins}\"")))
        .unwrap_or_else(|| panic!("the directory is not opened after the rename:\n{text}"));
    let dir_fd = fd_of(lines[rename + dir_open]).expect("a descriptor");
    assert!(
        lines[rename + dir_open..]
            .iter()
            .any(|l| l.contains(&format!("fsync({dir_fd})"))),
        "the directory is not flushed:\n{text}"
    );
}
