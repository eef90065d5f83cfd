//! The project's own commands, in Rust so that they run the same everywhere
//! cargo does (rust-analyzer's `xtask` habit). This crate owns one decision:
//! whether this machine has what the main job and the tests need, and what
//! to install when it has not. It has no dependencies, so it compiles in a
//! few seconds, before anything large, and says what is missing at once.
//!
//! - `cargo demo` (alias of `cargo xtask demo`): checks the `wasm32-wasip2`
//!   target (installing it with rustup when rustup is there), then builds the
//!   host and the example plugins and runs `hello` (`host/tests/demo.rs`).
//! - `cargo xtask test`: checks every component the tests start, installs the
//!   missing ones when allowed, then runs every test binary to its end.
//! - `cargo xtask lint`: the target check, then clippy with `-D warnings`,
//!   as the compiler of a build of every target (see [`linted`]).

#![forbid(unsafe_code)]

mod components;
mod target;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use components::Permission;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  demo                 the main job: check the wasm32-wasip2 target (install it with
                       rustup if missing), build the host and the example plugins,
                       and run the `hello` plugin (`cargo demo` is this)
  test [-- ARGS]       check every component the tests start (wasm target,
                       PostgreSQL, Chromium, componentize-py, componentize-js,
                       schemathesis, openapi-python-client, openapi-typescript,
                       /usr/bin/time, setpriv), install what is missing when
                       allowed, then run `cargo test --workspace --no-fail-fast
                       ARGS`, which reports every failing test binary
  setup                the checks and installs of `test`, without the tests
  lint                 the target check, then clippy with -D warnings on every
                       target of the workspace: `cargo test --workspace
                       --all-targets --no-run` with clippy-driver as the
                       workspace's compiler (what `cargo clippy` runs), so the
                       tests reuse the build

options of test and setup:
  --install            install missing components even when not root (apt-get
                       through sudo, pip --user); also TASKHOST_INSTALL=1
  --no-install         never install; list what is missing and how to install it

As root, missing components are installed with apt-get, pip and npm unless
--no-install is given; otherwise the command stops before compiling anything
and prints the commands to run.";

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Some(command) = args.first().cloned() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    args.remove(0);
    let root = repo_root();
    let command = command.to_string_lossy().into_owned();
    let result = match command.as_str() {
        "demo" => no_options(&args).and_then(|()| demo(&root)),
        "test" => test(&root, args, true),
        "setup" => test(&root, args, false),
        "lint" => no_options(&args).and_then(|()| lint(&root)),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(Failure::usage(format!("unknown command `{other}`"))),
    };
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Why a command stopped: its message (which names the fix) and exit code.
pub struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    /// A component is missing or could not be installed: exit 1.
    pub fn missing(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 1,
        }
    }

    fn usage(message: impl Into<String>) -> Self {
        Self {
            message: format!("{}\n\n{USAGE}", message.into()),
            code: 2,
        }
    }
}

fn no_options(args: &[OsString]) -> Result<(), Failure> {
    match args.first() {
        None => Ok(()),
        Some(arg) => Err(Failure::usage(format!(
            "unexpected argument `{}`",
            arg.to_string_lossy()
        ))),
    }
}

/// The workspace root: this crate's parent directory.
fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The cargo that started us (rustup's proxy or a toolchain's own), without
/// the variables `cargo run` set for this program: build scripts (ring's,
/// through the `cc` crate) rerun when `CARGO_PKG_NAME` and the like change,
/// so passing ours on would rebuild them, and everything above them, on
/// every switch between `cargo demo` and a plain `cargo test`.
fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(cargo);
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn demo(root: &std::path::Path) -> Result<ExitCode, Failure> {
    target::ensure()?;
    // `--workspace`, though only the demo target is built and run, so that
    // features are unified exactly as for `cargo test --workspace`: the tests
    // then reuse this build instead of compiling wasmtime a second time.
    let mut cmd = cargo();
    linted(&mut cmd, root, false)?;
    let status = cmd
        .current_dir(root)
        .args(["test", "--workspace", "--test", "demo"])
        .status()
        .map_err(|e| Failure::missing(format!("cannot run cargo: {e}")))?;
    Ok(exit_code(status))
}

fn lint(root: &std::path::Path) -> Result<ExitCode, Failure> {
    // The plugins' build script runs under clippy too, and needs the target.
    target::ensure()?;
    // Every target built (the benches too: linting one alone with `cargo
    // rustc --emit=metadata` resolves the features of its package only, and
    // compiled a dozen dependencies again, slower than building them all).
    let mut cmd = cargo();
    linted(&mut cmd, root, true)?;
    let status = cmd
        .current_dir(root)
        .args(["test", "--workspace", "--all-targets", "--no-run"])
        .status()
        .map_err(|e| Failure::missing(format!("cannot run cargo: {e}")))?;
    Ok(exit_code(status))
}

/// Makes `cmd`'s builds compile the workspace's crates with clippy-driver
/// and `-D warnings`, as `cargo clippy -- -D warnings` does, but building
/// (not only checking): every verb here builds this way, so the lint gate,
/// the demo and the tests share one build, and a dependency is compiled
/// once rather than once checked for clippy and once built for the tests
/// (the four minutes of a cold `.ci/run` the check took on 2 cores).
/// Dependencies are compiled by plain rustc, as under `cargo clippy`.
/// Without clippy (a toolchain without the component) the demo and the
/// tests build with plain rustc, and only the lint gate stops, with the fix.
fn linted(cmd: &mut Command, root: &std::path::Path, required: bool) -> Result<(), Failure> {
    match clippy_driver(root) {
        Ok(driver) => {
            cmd.env("RUSTC_WORKSPACE_WRAPPER", driver).env(
                "CLIPPY_ARGS",
                "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
            );
            Ok(())
        }
        Err(missing) if required => Err(missing),
        Err(_) => Ok(()),
    }
}

/// The toolchain's clippy-driver, beside its rustc.
fn clippy_driver(root: &std::path::Path) -> Result<PathBuf, Failure> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let sysroot = Command::new(rustc)
        .current_dir(root)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| Failure::missing(format!("cannot run rustc: {e}")))?;
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_owned();
    let driver = PathBuf::from(sysroot).join("bin").join("clippy-driver");
    if !driver.is_file() {
        return Err(Failure::missing(format!(
            "clippy is not installed ({} is missing). Fix: rustup component add clippy",
            driver.display()
        )));
    }
    Ok(driver)
}

fn test(root: &std::path::Path, args: Vec<OsString>, run: bool) -> Result<ExitCode, Failure> {
    let mut permission = Permission::from_environment();
    let mut cargo_args = Vec::new();
    let mut rest = args.into_iter();
    for arg in rest.by_ref() {
        match arg.to_str() {
            Some("--install") => permission = Permission::Granted,
            Some("--no-install") => permission = Permission::Refused,
            Some("--") => break,
            _ if !run => {
                return Err(Failure::usage(format!(
                    "unexpected argument `{}`",
                    arg.to_string_lossy()
                )));
            }
            _ => {
                return Err(Failure::usage(format!(
                    "unexpected argument `{}` (arguments for cargo test go after `--`)",
                    arg.to_string_lossy()
                )));
            }
        }
    }
    cargo_args.extend(rest);

    target::ensure()?;
    let path = components::ensure(root, permission)?;
    if !run {
        eprintln!("xtask: every test component is installed");
        return Ok(ExitCode::SUCCESS);
    }

    let started = Instant::now();
    let mut cmd = cargo();
    linted(&mut cmd, root, false)?;
    cmd.current_dir(root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(&cargo_args);
    // Most end-to-end tests wait on daemons and processes (about 1.2 busy
    // cores of 2 with two at a time), so three at a time finish sooner.
    if std::env::var_os("RUST_TEST_THREADS").is_none() {
        cmd.env("RUST_TEST_THREADS", "3");
    }
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    let status = cmd
        .status()
        .map_err(|e| Failure::missing(format!("cannot run cargo: {e}")))?;
    let took = started.elapsed().as_secs();
    if status.success() {
        eprintln!(
            "xtask: every test passed ({} min {} s)",
            took / 60,
            took % 60
        );
    } else {
        // cargo's last lines above list every test binary that failed.
        eprintln!(
            "xtask: some tests failed ({} min {} s); cargo lists the failing test binaries above",
            took / 60,
            took % 60
        );
    }
    Ok(exit_code(status))
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    }
}
