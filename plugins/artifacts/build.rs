//! Builds every crate of the `plugins/` workspace for `wasm32-wasip2` with a
//! nested cargo (like wasmtime's `crates/test-programs/artifacts`), copies each
//! component to `<root>/target/plugins/<name>.wasm`, and writes
//! `$OUT_DIR/plugins.rs` with one path constant per plugin.

use std::env;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const WASM_TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .join("../..")
        .canonicalize()
        .expect("the workspace root (two levels above plugins/artifacts) exists");
    let plugins_dir = root.join("plugins");
    let wasm_target_dir = root.join("target").join("wasm-plugins");
    let copy_dir = root.join("target").join("plugins");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));

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
        copy_if_changed(&artifact.wasm, &dest);
        // Rerun (and copy again) if someone deletes or edits the copy.
        rerun_if_changed(&dest);
        plugins.push((artifact.name.clone(), dest));
    }
    plugins.sort();
    plugins.dedup_by(|a, b| a.0 == b.0);

    let generated = generate(&plugins);
    fs::write(out_dir.join("plugins.rs"), generated).expect("write $OUT_DIR/plugins.rs");
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

    let output = match cmd.output() {
        Ok(output) => output,
        Err(e) => panic!("plugin-artifacts: cannot run {cmd:?}: {e}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    if !output.status.success() {
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
        .any(|needle| stderr.contains(needle));
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
            output.status
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
/// gives the copy the source's modification time so that tracking the copy
/// with `rerun-if-changed` does not rerun this script on every build.
fn copy_if_changed(from: &Path, to: &Path) {
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
            .and_then(|f| f.set_modified(modified));
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
