//! A real `host serve` for the robustness tests: started on a socket in a
//! temporary directory, killed on drop if still running. Include it with
//! `#[path = "common/daemon.rs"] mod daemon;` next to `mod common;`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use super::common::{self, Finished, Running};

/// How long anything may take before a test gives up.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A plugin path as a string.
pub fn p(name: &str) -> String {
    common::plugin(name).display().to_string()
}

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub process: Option<Running>,
}

impl Daemon {
    /// Starts `host serve` with extra flags; returns once it listens.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_at("h.sock", extra)
    }

    /// Starts `host serve` with its socket at `socket` under a fresh
    /// tempdir (a subdirectory the daemon creates itself, if any).
    pub fn start_at(socket: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join(socket);
        let process = Self::serve(&socket, &dir.path().join("state"), extra);
        Self {
            dir,
            socket,
            process: Some(process),
        }
    }

    /// Like [`Daemon::start`], with these environment variables set for
    /// the daemon.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("h.sock");
        let state = dir.path().join("state");
        let mut cmd = common::host();
        cmd.args([
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ])
        .args(extra)
        .envs(env.iter().copied());
        let mut process = Running::spawn_command(cmd);
        process.wait_for_line("taskhost daemon listening on", LIMIT);
        Self {
            dir,
            socket,
            process: Some(process),
        }
    }

    /// Starts `host serve` under a descriptor limit of its own: bash sets
    /// `ulimit -n LIMIT` (soft and hard; where the hard limit is lower
    /// already, it stays) and then runs the daemon, so a test can show that
    /// a guest cannot use up the daemon's descriptors.
    pub fn start_with_fd_limit(limit: u32, extra: &[&str]) -> Self {
        Self::start_in_shell(
            &format!(
                "hard=$(ulimit -Hn); \
                 if [ \"$hard\" = unlimited ] || [ \"$hard\" -gt {limit} ]; then \
                 ulimit -n {limit} || exit 1; fi; exec \"$0\" \"$@\""
            ),
            extra,
        )
    }

    /// Starts `host serve` from a bash `script` that ends by running the
    /// daemon's command line, `"$0" "$@"` (after setting limits, say).
    pub fn start_in_shell(script: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("h.sock");
        let state = dir.path().join("state");
        let mut cmd = std::process::Command::new("bash");
        common::host_env(&mut cmd);
        cmd.args([
            "-c",
            script,
            common::host_bin(),
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ])
        .args(extra);
        let mut process = Running::spawn_command(cmd);
        process.wait_for_line("taskhost daemon listening on", LIMIT);
        Self {
            dir,
            socket,
            process: Some(process),
        }
    }

    /// Starts `host serve` whose compilation cache (`<state>/wasmtime-cache`)
    /// is a symlink to the tests' shared one, so that large plugins compiled
    /// by earlier tests or runs load from it instead of compiling again.
    pub fn start_sharing_cache(extra: &[&str]) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("h.sock");
        let state = dir.path().join("state");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&state)
            .expect("create the state directory");
        let shared = common::cache_dir();
        std::fs::create_dir_all(&shared).expect("create the shared cache");
        std::os::unix::fs::symlink(&shared, state.join("wasmtime-cache"))
            .expect("link the shared cache");
        let process = Self::serve(&socket, &state, extra);
        Self {
            dir,
            socket,
            process: Some(process),
        }
    }

    /// Starts `host serve` again on the same socket and state directory
    /// (after the last one was killed or shut down), so it finds the first
    /// one's store.
    pub fn restart(&mut self, extra: &[&str]) {
        assert!(self.process.is_none(), "the old daemon is gone");
        let state = self.dir.path().join("state");
        self.process = Some(Self::serve(&self.socket, &state, extra));
    }

    fn serve(socket: &std::path::Path, state: &std::path::Path, extra: &[&str]) -> Running {
        let mut args = vec![
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut process = Running::spawn(&args);
        process.wait_for_line("taskhost daemon listening on", LIMIT);
        process
    }

    pub fn socket(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("running").child.id()
    }

    /// `args` with `--socket` (before a `--`, whose words after it are a
    /// command's arguments).
    pub fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = args.to_vec();
        let at = all.iter().position(|a| *a == "--").unwrap_or(all.len());
        all.splice(at..at, ["--socket", self.socket()]);
        all
    }

    /// Runs a client verb against this daemon to completion.
    pub fn run(&self, args: &[&str]) -> Finished {
        common::run_host(&self.args(args))
    }

    /// Starts a client verb in the background; its stdout lines arrive on
    /// the channel as they are written (stderr is discarded).
    pub fn spawn_stdout_lines(
        &self,
        args: &[&str],
    ) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead, BufReader};
        let mut child = common::host()
            .args(self.args(args))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn host");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }

    /// Starts a client verb in the background.
    pub fn spawn(&self, args: &[&str]) -> Running {
        Running::spawn(&self.args(args))
    }

    /// Asserts the daemon process is still alive.
    pub fn assert_alive(&mut self) {
        let process = self.process.as_mut().expect("running");
        assert_eq!(
            process.child.try_wait().expect("try_wait"),
            None,
            "the daemon exited; stderr {:?}",
            process.stderr_seen
        );
    }

    /// Asserts `host submit hello.wasm --wait` is served.
    pub fn assert_served(&mut self, input: &str) {
        self.assert_alive();
        let out = self.run(&["submit", &p("hello"), "--input", input, "--wait"]);
        assert_eq!(out.code, Some(0), "after {input}: {}", out.stderr);
        assert_eq!(out.stdout, input);
    }

    /// `host ps --json`.
    pub fn ps(&self) -> Vec<serde_json::Value> {
        let out = self.run(&["ps", "--json"]);
        assert_eq!(out.code, Some(0), "ps: {}", out.stderr);
        serde_json::from_str(&out.stdout).expect("ps --json is an array")
    }

    /// The rows of `host plugins ls --json`.
    /// The ids of `host ps --all`, newest first.
    pub fn ps_all_ids(&self) -> Vec<u64> {
        let out = self.run(&["ps", "--all", "--json"]);
        assert_eq!(out.code, Some(0), "{out:?}");
        let rows: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).expect("JSON");
        let mut ids: Vec<u64> = rows.iter().filter_map(|r| r["id"].as_u64()).collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        ids
    }

    pub fn plugins(&self) -> Vec<serde_json::Value> {
        let out = self.run(&["plugins", "ls", "--json"]);
        assert_eq!(out.code, Some(0), "plugins ls: {}", out.stderr);
        serde_json::from_str(&out.stdout).expect("plugins ls --json is an array")
    }

    /// Polls `host ps` (a bounded number of times) until the task called
    /// `name` is in `state`; returns its row.
    pub fn wait_until_state(&self, name: &str, state: &str) -> serde_json::Value {
        for _ in 0..1000 {
            if let Some(row) = self
                .ps()
                .into_iter()
                .find(|t| t["name"] == name && t["state"] == state)
            {
                return row;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // How the others ended, for a task that never came (its parent's
        // outcome, say).
        let all = self.run(&["ps", "--all", "--json"]);
        panic!(
            "`{name}` never became {state}: ps shows {:?}; ps --all: {}",
            self.ps(),
            all.stdout
        );
    }

    /// Submits without waiting; returns the id.
    pub fn submit(&self, args: &[&str]) -> String {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert_eq!(out.code, Some(0), "submit {args:?}: {}", out.stderr);
        let id = out.stdout.trim_end().to_owned();
        assert!(
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()),
            "stdout is just the id: {:?}",
            out.stdout
        );
        id
    }

    /// Client connections the daemon holds: its socket descriptors less
    /// `baseline` (the listener and the runtime's own, counted at start).
    pub fn socket_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("/proc fd")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().starts_with("socket:"))
            .count()
    }

    /// Kills the daemon with SIGKILL and reaps it.
    pub fn kill_9(&mut self) {
        let mut process = self.process.take().expect("running");
        process.child.kill().expect("SIGKILL");
        let _ = process.child.wait();
    }

    /// Waits for the daemon to exit on its own.
    pub fn finish(&mut self, limit: Duration) -> (ExitStatus, Finished) {
        self.process.take().expect("running").finish(limit)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(process) = self.process.as_mut() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}
