//! Helpers shared by the end-to-end tests: the real `host` binary, the real
//! plugins built from `plugins/`, and line-by-line readers of its output that
//! tests synchronise on (never sleeps).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant, SystemTime};

/// The `host` binary under test: the one the workspace built,
/// `<target>/<profile>/host`, beside the `deps/` folder that holds this
/// test executable.
///
/// These tests are a package of their own (`taskhost-tests`), so cargo
/// gives them no `CARGO_BIN_EXE_host`, and builds `host` only when a test
/// of its own package, `taskhost`, is selected: `cargo test --workspace`
/// and `cargo demo` build it (the `demo` test is `taskhost`'s), `cargo test
/// -p taskhost-tests` and `cargo test --workspace --test e2e` do not. So
/// that no test runs a binary older than the code, a missing `host`, or one
/// older than a file it is built from ([`HOST_INPUTS`]), panics saying to
/// build it first, with the command.
pub fn host_bin() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    // A panic leaves it unset: every test that needs it fails the same way.
    HOST.get_or_init(|| match built_host() {
        Ok(host) => host.display().to_string(),
        Err(why) => panic!("{why}"),
    })
}

/// What `host` is built from, relative to the repository root: the sources
/// of its package and of the crates it depends on, and the files they embed
/// (the migrations, the WIT, the dashboard's page, the plugins' lock file).
/// These are the files cargo lists as the binary's inputs in
/// `target/<profile>/host.d` (it writes that file only when `host` itself is
/// asked for, as by `cargo build`, not when a test needs it, as in `cargo
/// test --workspace`, so it cannot be read here), and cargo builds `host`
/// again when one of them changed after its last build: one newer than the
/// binary means the binary is out of date, and building it as
/// [`build_command`] says makes it newer than all of them. Hidden files and
/// editors' backups (`~`) are passed over; xtask/tests/code_map.rs keeps the
/// crates' `src/` folders free of other files. (A `Cargo.toml` is not looked
/// at: cargo builds nothing again for an edit that changes nothing in it.)
const HOST_INPUTS: &[&str] = &[
    "host/src",
    "crates/core/src",
    "crates/runtime/src",
    "crates/daemon/src",
    "crates/daemon/migrations",
    "wit",
    "plugins/Cargo.lock",
];

/// [`host_bin`]'s look-up, or why the binary cannot be used.
fn built_host() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this test's own executable: {e}"))?;
    // <target>/[<triple>/]<profile>/deps/<test>-<hash>
    let profile_dir = exe
        .parent()
        .filter(|deps| deps.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent)
        .ok_or_else(|| {
            format!(
                "this test's executable, {}, is not in the <profile>/deps/ folder of a \
                 cargo target directory, beside which the `host` binary would be: run the \
                 tests with cargo (`cargo xtask test`)",
                exe.display()
            )
        })?;
    let host = profile_dir.join(format!("host{}", std::env::consts::EXE_SUFFIX));
    let why = match std::fs::metadata(&host).and_then(|m| m.modified()) {
        Err(_) => "is missing".to_owned(),
        Ok(built) => match newer_input(built) {
            None => return Ok(host),
            Some(input) => format!(
                "is older than {}, one of the files it is built from",
                input.display()
            ),
        },
    };
    Err(format!(
        "the `host` binary these tests run, {}, {why}.\n\
         Build it first, then run the tests again:\n\n    {}\n\n\
         (`cargo demo`, `cargo xtask test` and `cargo test --workspace` build it; \
         `cargo test -p taskhost-tests` and `--test e2e` alone do not: cargo builds a \
         binary only for the tests of its own package, `taskhost`.)",
        host.display(),
        build_command(profile_dir)
    ))
}

/// The command that builds `host` into `profile_dir`
/// (`<target>/[<triple>/]<profile>`): `cargo demo` for the usual dev
/// build. Like `cargo test --workspace`, it builds `host` with the features
/// the whole workspace unifies; `cargo build -p taskhost --bin host` would
/// do too, but unifies fewer features (today those of opentelemetry's
/// `rand`), so its `host` is another build, and the next `cargo test
/// --workspace` builds and links `host` again.
fn build_command(profile_dir: &Path) -> String {
    let mut options = String::new();
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => options.push_str(" --release"),
        Some(profile) => options.push_str(&format!(" --profile {profile}")),
    }
    // A build for an explicit `--target` sits in a folder named after the
    // target's triple (`x86_64-unknown-linux-gnu/debug`).
    if let Some(triple) = profile_dir
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .filter(|n| {
            n.strip_prefix(std::env::consts::ARCH)
                .is_some_and(|rest| rest.starts_with('-') && rest.contains(std::env::consts::OS))
        })
    {
        options.push_str(&format!(" --target {triple}"));
    }
    if options.is_empty() {
        "cargo demo".to_owned()
    } else {
        format!("cargo test --workspace --test demo --no-run{options}")
    }
}

/// A file of [`HOST_INPUTS`] modified after `built`, if any, relative to
/// the repository root.
fn newer_input(built: SystemTime) -> Option<PathBuf> {
    fn newer(path: &Path, built: SystemTime) -> Option<PathBuf> {
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_dir() {
            return meta
                .modified()
                .is_ok_and(|at| at > built)
                .then(|| path.to_path_buf());
        }
        std::fs::read_dir(path).ok()?.flatten().find_map(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name.ends_with('~') {
                return None;
            }
            newer(&entry.path(), built)
        })
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().unwrap_or(root);
    HOST_INPUTS.iter().find_map(|input| {
        newer(&root.join(input), built)
            .map(|p| p.strip_prefix(&root).map(Path::to_path_buf).unwrap_or(p))
    })
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
