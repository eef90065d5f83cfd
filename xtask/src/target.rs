//! The `wasm32-wasip2` standard library, which the plugins are built with:
//! present in the toolchain's sysroot, or added with rustup, or a stop with
//! the exact fix. Never waits for a compile before saying so.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::Failure;

pub const WASM_TARGET: &str = "wasm32-wasip2";

/// Makes sure the toolchain that builds this workspace has the target.
pub fn ensure() -> Result<(), Failure> {
    let sysroot = sysroot()?;
    if has_target(&sysroot) {
        return Ok(());
    }
    if !rustup_available() {
        return Err(Failure::missing(format!(
            "the Rust toolchain at {} has no {WASM_TARGET} target, which the plugins are \
             built for, and rustup is not installed to add it.\n\
             Fix: install rustup (https://rustup.rs), then run `rustup target add {WASM_TARGET}` \
             in this directory; or install the {WASM_TARGET} standard library for this \
             toolchain by the means it came with.",
            sysroot.display()
        )));
    }
    eprintln!("xtask: installing the {WASM_TARGET} target: rustup target add {WASM_TARGET}");
    let status = Command::new("rustup")
        .args(["target", "add", WASM_TARGET])
        .status()
        .map_err(|e| Failure::missing(format!("cannot run rustup: {e}")))?;
    if !status.success() || !has_target(&sysroot) {
        return Err(Failure::missing(format!(
            "`rustup target add {WASM_TARGET}` failed ({status}), so the plugins cannot be built.\n\
             Fix: run `rustup target add {WASM_TARGET}` in this directory where rustup can reach \
             its distribution server (or set RUSTUP_DIST_SERVER to a mirror), then run this \
             command again."
        )));
    }
    Ok(())
}

fn sysroot() -> Result<PathBuf, Failure> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let output = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| {
            Failure::missing(format!(
                "cannot run {}: {e}. Fix: install Rust (https://rustup.rs)",
                rustc.to_string_lossy()
            ))
        })?;
    if !output.status.success() {
        return Err(Failure::missing(format!(
            "`{} --print sysroot` failed ({}): the toolchain pinned in rust-toolchain.toml may \
             be missing. Fix: `rustup toolchain install` in this directory",
            rustc.to_string_lossy(),
            output.status
        )));
    }
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
    ))
}

fn has_target(sysroot: &std::path::Path) -> bool {
    sysroot
        .join("lib/rustlib")
        .join(WASM_TARGET)
        .join("lib")
        .is_dir()
}

fn rustup_available() -> bool {
    Command::new("rustup")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
