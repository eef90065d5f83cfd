//! `cargo demo` (an alias in `.cargo/config.toml`): the main job. Building
//! this target builds the `host` binary and every plugin under `plugins/`
//! (`plugin-artifacts` is a dev-dependency), in the same dev profile that
//! `cargo test` uses, so running the tests afterwards compiles nothing large
//! again. Then it runs `host run target/plugins/hello.wasm --input hi` with
//! the terminal as its stdout and stderr, and exits with its exit code.
//! It also runs as part of `cargo test`, where it must succeed.
//!
//! Being a test of the `taskhost` package is what makes `cargo test
//! --workspace` build `target/debug/host` for the end-to-end tests in
//! `tests/` too: cargo builds a package's binaries only for that package's
//! own tests (see `host_bin` in tests/e2e/common/mod.rs).

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let host = env!("CARGO_BIN_EXE_host");
    let hello = plugin_artifacts::HELLO;
    let show = |p: &str| {
        // Paths relative to the repository root read better.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let root = root.canonicalize().unwrap_or(root);
        std::path::Path::new(p)
            .strip_prefix(&root)
            .map(|r| r.display().to_string())
            .unwrap_or_else(|_| p.to_owned())
    };
    eprintln!("$ {} run {} --input hi", show(host), show(hello));
    let status = Command::new(host)
        .args(["run", hello, "--input", "hi"])
        .status();
    match status {
        Ok(status) if status.success() => {
            eprintln!(
                "\nThe host is {}; the example plugins are in {}/.\nNext: {} --help, or see README.md.",
                show(host),
                std::path::Path::new(&show(hello))
                    .parent()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                show(host)
            );
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("host run failed: {status}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("cannot start {host}: {err}");
            ExitCode::FAILURE
        }
    }
}
