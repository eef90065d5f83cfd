//! Helpers shared by the end-to-end tests: the real `host` binary, the real
//! plugins built from `plugins/`, and line-by-line readers of its output that
//! tests synchronise on (never sleeps).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The `host` binary under test.
pub fn host_bin() -> &'static str {
    env!("CARGO_BIN_EXE_host")
}

/// A plugin built from `plugins/` by the `plugin-artifacts` build step.
pub fn plugin(name: &str) -> PathBuf {
    plugin_artifacts::path(name)
}

/// A shared compilation cache for all tests, so each plugin compiles once.
pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasmtime-cache")
}

/// A `host` command with the test cache and a quiet environment.
pub fn host() -> Command {
    let mut cmd = Command::new(host_bin());
    host_env(&mut cmd);
    cmd
}

/// Gives `cmd` (`host`, or a wrapper that runs it) the environment of
/// [`host`]: the test cache, no log filter, no trace export, no stdin.
pub fn host_env(cmd: &mut Command) -> &mut Command {
    cmd.env("TASKHOST_CACHE_DIR", cache_dir())
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdin(Stdio::null())
}

/// The result of a finished `host` process.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Its stdout as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?} / {:?}", self.stdout, self.stderr))
    }
}

/// Runs `host` with these arguments to completion.
pub fn run_host(args: &[&str]) -> Finished {
    let out = host().args(args).output().expect("spawn host");
    Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A running `host` whose stderr lines arrive on a channel as they are
/// written, so a test can wait for "attempt 1 started" before acting.
pub struct Running {
    pub child: Child,
    lines: Receiver<String>,
    pub stderr_seen: Vec<String>,
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl Running {
    pub fn spawn(args: &[&str]) -> Self {
        let mut cmd = host();
        cmd.args(args);
        Self::spawn_command(cmd)
    }

    /// Spawns any command (a wrapper around `host`, say) with its output
    /// read like [`Running::spawn`]'s.
    pub fn spawn_command(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn host");
        let stderr = child.stderr.take().expect("stderr");
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        Self {
            child,
            lines,
            stderr_seen: Vec::new(),
            stdout: Some(stdout),
        }
    }

    /// Waits (at most `limit`) for a stderr line containing `needle`.
    pub fn wait_for_line(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr_seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no stderr line with {needle:?} within {limit:?}; saw {:?}",
                        self.stderr_seen
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "host exited before printing {needle:?}; saw {:?}",
                        self.stderr_seen
                    )
                }
            }
        }
    }

    /// The stderr lines written since the last look (kept in
    /// `stderr_seen` too), without waiting.
    pub fn lines_so_far(&mut self) -> Vec<String> {
        let mut new = Vec::new();
        while let Ok(line) = self.lines.try_recv() {
            self.stderr_seen.push(line.clone());
            new.push(line);
        }
        new
    }

    /// Sends a signal by name (`INT`, `TERM`) with the `kill` command.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for exit (at most `limit`), returning the status and all output.
    pub fn finish(mut self, limit: Duration) -> (ExitStatus, Finished) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "host did not exit within {limit:?}; stderr so far {:?}",
                    self.stderr_seen
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stderr_seen.push(line);
        }
        let stderr = self.stderr_seen.join("\n");
        (
            status,
            Finished {
                code: status.code(),
                stdout,
                stderr,
            },
        )
    }
}

/// `bytes` with every `from` replaced by `to` (of the same length), such as
/// an import's version.
pub fn renamed(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut found = false;
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            found = true;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(
        found,
        "{} is in the component",
        String::from_utf8_lossy(from)
    );
    out
}

/// Whether this test process runs as root (the tests that need a second
/// user become `nobody` then; CI runs as root).
pub fn is_root() -> bool {
    taskhost::daemon::socket::current_uid() == Some(0)
}

/// A command that runs `program` as user `nobody` (uid and gid 65534) with
/// `setpriv` (util-linux; `cargo xtask test` installs it).
pub fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(program)
        .stdin(Stdio::null());
    cmd
}

/// A path of the `host` binary that `nobody` may run: the binary itself
/// when it can, else a copy in a world-readable temporary directory (kept
/// alive by the returned guard).
pub fn host_for_nobody() -> (PathBuf, Option<tempfile::TempDir>) {
    use std::os::unix::fs::PermissionsExt;
    let host = PathBuf::from(host_bin());
    let runs = as_nobody(&host)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if runs {
        return (host, None);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("host");
    std::fs::copy(&host, &copy).expect("copy host");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    (copy, Some(dir))
}

/// What a `host` run under a pseudo-terminal wrote to it (stdout and
/// stderr both), as the terminal received it, and its exit code.
#[derive(Debug)]
pub struct OnTerminal {
    pub code: Option<i32>,
    pub bytes: Vec<u8>,
}

impl OnTerminal {
    /// The bytes as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The lines the terminal shows: see [`screen`].
    pub fn screen(&self) -> Vec<String> {
        screen(&self.bytes)
    }
}

/// Runs `host` with these arguments under a pseudo-terminal, util-linux's
/// `script -qec CMD /dev/null`, so that its stdout and stderr are both a
/// terminal (`script` itself writes what the terminal received to a pipe).
/// The arguments reach `host` through the environment, so any bytes
/// (escape sequences too) pass the shell unchanged. Fails after `limit`.
pub fn run_host_on_terminal(args: &[&str], limit: Duration) -> OnTerminal {
    let mut cmd = Command::new("script");
    host_env(&mut cmd);
    let mut line = String::from("exec \"$TASKHOST_PTY_0\"");
    cmd.env("SHELL", "/bin/sh")
        .env("TASKHOST_PTY_0", host_bin());
    for (i, arg) in args.iter().enumerate() {
        let var = format!("TASKHOST_PTY_{}", i + 1);
        line.push_str(&format!(" \"${var}\""));
        cmd.env(var, arg);
    }
    cmd.args(["-qec", &line, "/dev/null"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .expect("run `script` (util-linux's bsdutils; apt-get install bsdutils)");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("host {args:?} on a terminal did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    assert!(stderr.is_empty(), "script said {stderr:?}");
    OnTerminal {
        code: status.code(),
        bytes: reader.join().unwrap_or_default(),
    }
}

/// The lines a terminal shows for `bytes`, as far as `host` draws: `\r`
/// moves to the start of the line, `\x1b[K` clears from there to its end,
/// `\n` ends the line; every other character (an escape sequence's too) is
/// text.
pub fn screen(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = Vec::new();
    let (mut line, mut col): (Vec<char>, usize) = (Vec::new(), 0);
    let mut rest = text.as_ref();
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("\x1b[K") {
            line.truncate(col);
            rest = after;
            continue;
        }
        match c {
            '\n' => {
                lines.push(line.drain(..).collect());
                col = 0;
            }
            '\r' => col = 0,
            c if col < line.len() => {
                line[col] = c;
                col += 1;
            }
            c => {
                line.push(c);
                col += 1;
            }
        }
        rest = &rest[c.len_utf8()..];
    }
    if !line.is_empty() {
        lines.push(line.into_iter().collect());
    }
    lines
}
