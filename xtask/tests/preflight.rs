//! The checks run before anything compiles: the real `xtask` binary with a
//! stand-in toolchain on its `PATH` (a `rustc` that prints a sysroot, a
//! `rustup` that fails, a `cargo` that records being started), so each case
//! is what a machine without rustup, with an uninstallable target or
//! without the test components looks like.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    /// A `PATH` of stand-ins only; the sysroot has the wasm target when
    /// `with_target`.
    fn new(with_target: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sysroot = dir.path().join("sysroot");
        std::fs::create_dir_all(sysroot.join("lib/rustlib/x86_64-unknown-linux-gnu/lib")).unwrap();
        if with_target {
            std::fs::create_dir_all(sysroot.join("lib/rustlib/wasm32-wasip2/lib")).unwrap();
        }
        let machine = Self { dir };
        std::fs::create_dir(machine.bin()).unwrap();
        machine.script("rustc", &format!("echo {}", sysroot.display()));
        // Started only if a check let a compile through.
        let marker = machine.dir.path().join("cargo-ran");
        machine.script("cargo", &format!(": > {}; exit 0", marker.display()));
        machine
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn script(&self, name: &str, body: &str) {
        let path = self.bin().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn cargo_ran(&self) -> bool {
        self.dir.path().join("cargo-ran").exists()
    }

    /// Runs xtask with only the stand-ins to find (they run under /bin/sh).
    fn xtask(&self, args: &[&str]) -> (Output, Duration) {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(args)
            .env_clear()
            .env("PATH", self.bin())
            .env("CARGO", self.bin().join("cargo"))
            .env("HOME", self.dir.path())
            .output()
            .expect("run xtask");
        (out, started.elapsed())
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Generous: the checks take milliseconds; a compile would take minutes.
const SECONDS: Duration = Duration::from_secs(10);

#[test]
fn without_rustup_and_the_target_the_main_job_stops_at_once_with_the_fix() {
    let m = Machine::new(false);
    let (out, took) = m.xtask(&["demo"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < SECONDS, "took {took:?}");
    assert!(
        err.contains("has no wasm32-wasip2 target")
            && err.contains("rustup is not installed")
            && err.contains("rustup target add wasm32-wasip2"),
        "{err}"
    );
    assert!(!m.cargo_ran(), "cargo was started: {err}");
}

#[test]
fn an_uninstallable_target_stops_the_main_job_with_the_fix() {
    let m = Machine::new(false);
    m.script(
        "rustup",
        "case \"$1\" in --version) echo 'rustup 1.28.2';; *) echo 'error: no network' >&2; exit 1;; esac",
    );
    let (out, took) = m.xtask(&["demo"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < SECONDS, "took {took:?}");
    assert!(
        err.contains("xtask: installing the wasm32-wasip2 target: rustup target add wasm32-wasip2"),
        "{err}"
    );
    assert!(
        err.contains("`rustup target add wasm32-wasip2` failed") && err.contains("no network"),
        "{err}"
    );
    assert!(!m.cargo_ran(), "cargo was started: {err}");
}

#[test]
fn a_target_added_by_rustup_lets_the_main_job_go_on() {
    let m = Machine::new(false);
    let sysroot = m.dir.path().join("sysroot");
    m.script(
        "rustup",
        &format!(
            "case \"$1\" in --version) echo 'rustup 1.28.2';; target) /bin/mkdir -p {}/lib/rustlib/wasm32-wasip2/lib;; esac",
            sysroot.display()
        ),
    );
    let (out, _) = m.xtask(&["demo"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("installing the wasm32-wasip2 target"), "{err}");
    assert!(m.cargo_ran(), "cargo did not run: {err}");
}

#[test]
fn missing_test_components_are_listed_with_their_install_commands_before_compiling() {
    let m = Machine::new(true);
    // No python3, node, npm, setpriv, componentize-py, schemathesis or
    // openapi-python-client on this PATH.
    let (out, took) = m.xtask(&["test", "--no-install"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(took < SECONDS, "took {took:?}");
    for what in [
        "setpriv",
        "python3 with pip",
        "componentize-py 0.25.1",
        "schemathesis 4.32.5",
        "openapi-python-client 0.29.1",
        "Node.js 20 or newer with npm",
        "apt-get install -y",
        // One pip call for the three (`--user` before them when not root).
        "componentize-py==0.25.1 schemathesis==4.32.5 openapi-python-client==0.29.1",
        "cargo xtask test --install",
    ] {
        assert!(err.contains(what), "{what:?} missing from: {err}");
    }
    assert!(!m.cargo_ran(), "cargo was started: {err}");
}

#[test]
fn arguments_for_cargo_test_go_after_a_double_dash() {
    let m = Machine::new(true);
    let (out, _) = m.xtask(&["test", "--nocapture"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("arguments for cargo test go after `--`"),
        "{err}"
    );
    assert!(!Path::new(&m.dir.path().join("cargo-ran")).exists());
}
