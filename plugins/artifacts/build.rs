//! Builds every crate of the `plugins/` workspace for `wasm32-wasip2` with a
//! nested cargo (like wasmtime's `crates/test-programs/artifacts`), copies each
//! component to `<target dir>/plugins/<name>.wasm`, and writes
//! `$OUT_DIR/plugins.rs` with one path constant per plugin. The target dir is
//! the outer build's (so `CARGO_TARGET_DIR` and `build.target-dir` are
//! honoured); the nested build's progress goes to the terminal, when there is
//! one, because cargo shows a build script's own output only if it fails.

use std::env;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

const WASM_TARGET: &str = "wasm32-wasip2";

fn main() {
    // Cargo records the run's start a little before this; a margin keeps
    // the copies' times before it.
    let started = SystemTime::now() - Duration::from_secs(2);
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .join("../..")
        .canonicalize()
        .expect("the workspace root (two levels above plugins/artifacts) exists");
    let plugins_dir = root.join("plugins");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let target_dir = outer_target_dir(&out_dir).unwrap_or_else(|| root.join("target"));
    let wasm_target_dir = target_dir.join("wasm-plugins");
    let copy_dir = target_dir.join("plugins");
    check_wasm_target();

    // Inputs that do not show up in the build output below.
    for input in [
        plugins_dir.join("Cargo.toml"),
        plugins_dir.join("Cargo.lock"),
        root.join("guest-sdk").join("Cargo.toml"),
        root.join("guest-sdk").join("src"),
        root.join("wit"),
    ] {
        rerun_if_changed(&input);
    }

    let artifacts = build_plugins(&plugins_dir, &wasm_target_dir);

    fs::create_dir_all(&copy_dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", copy_dir.display()));
    let mut plugins = Vec::new();
    for artifact in &artifacts {
        rerun_if_changed(&artifact.package_dir.join("Cargo.toml"));
        rerun_if_changed(&artifact.package_dir.join("src"));
        let dest = copy_dir.join(format!("{}.wasm", artifact.name));
        copy_if_changed(&artifact.wasm, &dest, started);
        // Rerun (and copy again) if someone deletes or edits the copy.
        rerun_if_changed(&dest);
        plugins.push((artifact.name.clone(), dest));
    }
    plugins.sort();
    plugins.dedup_by(|a, b| a.0 == b.0);

    let generated = generate(&plugins);
    fs::write(out_dir.join("plugins.rs"), generated).expect("write $OUT_DIR/plugins.rs");
}

/// The outer build's target directory: the nearest ancestor of `OUT_DIR`
/// (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`) that holds the
/// `CACHEDIR.TAG` cargo writes at the root of every target directory.
fn outer_target_dir(out_dir: &Path) -> Option<PathBuf> {
    out_dir
        .ancestors()
        .skip(3)
        .take(3)
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

/// Fails early, naming the one command that fixes it, when the toolchain
/// has no `wasm32-wasip2` standard library (rustup installs it from
/// `rust-toolchain.toml`, unless auto-install is disabled).
fn check_wasm_target() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let Ok(output) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return;
    };
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let lib = sysroot.join("lib/rustlib").join(WASM_TARGET);
    if output.status.success() && !lib.exists() {
        panic!(
            "\n\nThe plugins are built for {WASM_TARGET}, and this toolchain ({}) has no \
             {WASM_TARGET} target.\nFix: rustup target add {WASM_TARGET}\n\n",
            sysroot.display()
        );
    }
}

/// Writes the nested build's progress lines to the terminal, if any.
fn forward_progress(stderr: impl Read) -> String {
    let mut tty = fs::OpenOptions::new().write(true).open("/dev/tty").ok();
    let mut all = String::new();
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let trimmed = line.trim_start();
        if let Some(tty) = tty.as_mut()
            && [
                "Compiling",
                "Finished",
                "Updating",
                "Downloading",
                "Downloaded",
            ]
            .iter()
            .any(|w| trimmed.starts_with(w))
        {
            let _ = writeln!(tty, "\r\x1b[2K     plugins {trimmed} ({WASM_TARGET})");
        }
        all.push_str(&line);
        all.push('\n');
    }
    all
}

/// One component produced by the nested build.
struct Artifact {
    /// The plugin's name: its crate name, with hyphens.
    name: String,
    /// The `.wasm` file in the nested target directory.
    wasm: PathBuf,
    /// The directory of the crate's Cargo.toml.
    package_dir: PathBuf,
}

/// Runs `cargo build --release --target wasm32-wasip2` on `plugins/Cargo.toml`
/// and returns the components it produced (built now or already fresh).
fn build_plugins(plugins_dir: &Path, target_dir: &Path) -> Vec<Artifact> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--target")
        .arg(WASM_TARGET)
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(plugins_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    // The outer build's flags, target, wrappers (clippy-driver under
    // `cargo clippy`) and profile overrides are meant for the host target,
    // not for the plugins. CARGO_MAKEFLAGS stays, so the nested cargo shares
    // the outer jobserver instead of starting as many jobs again.
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let scrub = matches!(
            key,
            "RUSTFLAGS"
                | "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_BUILD_RUSTFLAGS"
                | "CARGO_TARGET_DIR"
                | "CARGO_BUILD_TARGET_DIR"
                | "CARGO_BUILD_TARGET"
                | "RUSTC_WRAPPER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "CARGO_BUILD_RUSTC_WRAPPER"
                | "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER"
        ) || key.starts_with("CARGO_PROFILE_")
            || (key.starts_with("CARGO_TARGET_") && key.ends_with("_RUSTFLAGS"));
        if scrub {
            cmd.env_remove(key);
        }
    }
    eprintln!("running: {cmd:?}");

    let mut child = match cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(e) => panic!("plugin-artifacts: cannot run {cmd:?}: {e}"),
    };
    let stderr = child.stderr.take().expect("piped stderr");
    let progress = std::thread::spawn(move || forward_progress(stderr));
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut stdout)
        .expect("read the nested cargo's output");
    let stderr = progress.join().expect("the progress thread");
    let status = child.wait().expect("wait for the nested cargo");

    if !status.success() {
        // Cargo shows a build script's stderr when it fails.
        eprintln!("{stderr}");
        for line in stdout.lines().filter(|l| !l.starts_with('{')) {
            eprintln!("{line}");
        }
        let target_missing = [
            "target may not be installed",
            "can't find crate for `std`",
            "can't find crate for `core`",
        ]
        .iter()
        .any(|needle| stderr.contains(needle) || stdout.contains(needle));
        if target_missing {
            panic!(
                "plugin-artifacts: building the plugins needs the {WASM_TARGET} target, which is \
                 not installed. Install it with `rustup target add {WASM_TARGET}` and build again."
            );
        }
        panic!(
            "plugin-artifacts: building the plugins in {} for {WASM_TARGET} failed ({}); \
             the compiler output is above. To reproduce: cargo build --release --target \
             {WASM_TARGET} --manifest-path plugins/Cargo.toml",
            plugins_dir.display(),
            status
        );
    }

    let mut artifacts = Vec::new();
    for line in stdout.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let kinds = message["target"]["kind"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !kinds.iter().any(|k| k == "cdylib" || k == "bin") {
            continue;
        }
        let Some(manifest) = message["manifest_path"].as_str() else {
            continue;
        };
        let package_dir = Path::new(manifest)
            .parent()
            .expect("a manifest path has a parent")
            .to_path_buf();
        let filenames = message["filenames"].as_array().cloned().unwrap_or_default();
        for file in filenames.iter().filter_map(|f| f.as_str()) {
            let wasm = PathBuf::from(file);
            if wasm.extension().is_some_and(|e| e == "wasm") {
                let stem = wasm
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .expect("UTF-8 file name");
                // Cargo writes `sandbox_probe.wasm` for the cdylib of crate
                // `sandbox-probe`; plugin crates use hyphens, never underscores.
                let name = stem.replace('_', "-");
                artifacts.push(Artifact {
                    name,
                    wasm,
                    package_dir: package_dir.clone(),
                });
            }
        }
    }
    assert!(
        !artifacts.is_empty(),
        "plugin-artifacts: the nested cargo build succeeded but reported no .wasm artifact"
    );
    artifacts
}

/// Copies `from` to `to` unless `to` already has the same contents; writes
/// through a temporary file so readers never see a partial component, and
/// gives the copy the source's modification time, or `started` when the
/// source is newer (the nested build made it during this run), so that
/// tracking the copy with `rerun-if-changed` does not rerun this script on
/// the next build: cargo reruns it for a path newer than the run's start,
/// and every crate that depends on this one would compile again (a minute
/// of a cold `.ci/run`).
fn copy_if_changed(from: &Path, to: &Path, started: SystemTime) {
    let bytes = fs::read(from).unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display()));
    if fs::read(to).is_ok_and(|old| old == bytes) {
        return;
    }
    let tmp = to.with_extension(format!("wasm.tmp{}", std::process::id()));
    fs::write(&tmp, &bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    if let Ok(modified) = fs::metadata(from).and_then(|m| m.modified()) {
        let _ = fs::File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(modified.min(started)));
    }
    fs::rename(&tmp, to)
        .unwrap_or_else(|e| panic!("cannot move {} to {}: {e}", tmp.display(), to.display()));
}

/// The contents of `$OUT_DIR/plugins.rs`.
fn generate(plugins: &[(String, PathBuf)]) -> String {
    let mut code = String::from("// Generated by plugins/artifacts/build.rs.\n\n");
    for (name, path) in plugins {
        let path = path.to_str().expect("plugin paths are UTF-8");
        writeln!(
            code,
            "/// The `{name}` plugin component: `{path}`.\npub const {}: &str = {path:?};\n",
            shouty_snake(name)
        )
        .unwrap();
    }
    code.push_str("/// Every plugin as `(name, path)`, sorted by name.\n");
    code.push_str("pub const ALL: &[(&str, &str)] = &[\n");
    for (name, _) in plugins {
        writeln!(code, "    ({name:?}, {}),", shouty_snake(name)).unwrap();
    }
    code.push_str("];\n");
    code
}

/// `sandbox-probe` -> `SANDBOX_PROBE`.
fn shouty_snake(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn rerun_if_changed(path: &Path) {
    println!("cargo::rerun-if-changed={}", path.display());
}
