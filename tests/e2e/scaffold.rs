//! `host new`: the scaffold builds and runs with no edits. Builds the new
//! crate with the real cargo for wasm32-wasip2 (its dependencies come from
//! the lockfile the scaffold carries, the same versions as `plugins/`), then
//! runs the component with the real `host run`.

use crate::common;

use std::process::Command;

use common::run_host;

#[test]
fn host_new_scaffolds_a_plugin_that_builds_and_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crate_dir = dir.path().join("greeter-plugin");
    let out = run_host(&[
        "new",
        "greeter-plugin",
        "--dir",
        crate_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("cargo build --release"),
        "{}",
        out.stderr
    );

    // A second scaffold into the same place is refused, naming the problem.
    let again = run_host(&[
        "new",
        "greeter-plugin",
        "--dir",
        crate_dir.to_str().unwrap(),
    ]);
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(again.stderr.contains("not empty"), "{}", again.stderr);
    let bad = run_host(&["new", "Bad Name"]);
    assert_eq!(bad.code, Some(2));
    assert!(
        bad.stderr.contains("is not a plugin name"),
        "{}",
        bad.stderr
    );

    // A target directory that survives between runs keeps this test fast
    // once warm; the crate itself is new every time.
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = Command::new(cargo)
        .args(["build", "--release"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .expect("run cargo");
    assert!(
        build.status.success(),
        "the scaffold builds: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let wasm = target.join("wasm32-wasip2/release/greeter_plugin.wasm");
    let out = run_host(&["run", wasm.to_str().unwrap(), "--input", "world"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hello, world!");
    assert!(out.stderr.contains("greeting world"), "{}", out.stderr);
}
