//! Secrets by name through the real binary: the operator's secrets (a file
//! per secret in a private directory, variables of the daemon's own
//! environment) reach a guest that names them, are looked up when each
//! attempt starts, and appear nowhere else: not in the store, the events,
//! the logs, `ps --json`, or the HTTP API the dashboard reads. A missing
//! secret fails the task naming it; a directory others may enter is
//! refused at start. `host run` takes them from its own environment.
//! Configuration values through `wasi:config/store`: the daemon's, with a
//! submission's over them.

use crate::common::{self, run_host};
use crate::daemon::{Daemon, LIMIT, p};
use crate::http::{Api, get};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;

/// FNV-1a 64, as `sandbox-probe --param show=digest` reports a variable.
fn digest(value: &str) -> String {
    let hash = value.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("digest:{hash:016x}:{}", value.len())
}

fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// What the probe saw of variable `var`, from a `submit --wait --json`.
fn probe_env(daemon: &Daemon, grant: &[&str], var: &str) -> (Value, String) {
    let mut args = vec![
        "submit",
        "sandbox-probe",
        "--param",
        "show=digest",
        "--param",
    ];
    let var_param = format!("var={var}");
    args.push(&var_param);
    args.extend_from_slice(grant);
    args.extend(["--wait", "--json"]);
    let path = p("sandbox-probe");
    args[1] = &path;
    let out = daemon.run(&args);
    assert_eq!(out.code, Some(0), "{out:?}");
    let report = out.json();
    let output: Value = serde_json::from_str(report["output"].as_str().expect("output text"))
        .unwrap_or_else(|e| panic!("{e}: {report}"));
    (
        report,
        output["env"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Every file under `dir`, read whole, that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file()
                && let Ok(bytes) = std::fs::read(&path)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[test]
fn a_secret_reaches_its_guest_at_each_attempt_and_nowhere_else() {
    let secrets = private_dir();
    let file_value = "f1le-s3cret-0b5c9e";
    let env_value = "env-s3cret-77d2a1";
    std::fs::write(secrets.path().join("api-token"), format!("{file_value}\n")).unwrap();
    let dir = secrets.path().to_str().unwrap();
    let mut daemon = Daemon::start_with_env(
        &[
            "--secrets-dir",
            dir,
            "--secret-env",
            "DEPLOY_KEY",
            "--http",
            "127.0.0.1:0",
        ],
        &[("DEPLOY_KEY", env_value)],
    );

    let (first, seen) = probe_env(&daemon, &["--env-secret", "TOKEN=api-token"], "TOKEN");
    assert_eq!(seen, digest(file_value), "{first}");
    assert_eq!(first["outcome"], "completed", "{first}");
    let (_, seen) = probe_env(&daemon, &["--secret", "DEPLOY_KEY"], "DEPLOY_KEY");
    assert_eq!(seen, digest(env_value));

    // A changed file counts from the next attempt: the value is looked up
    // when an attempt starts, not kept from the submission.
    let rotated = "r0tated-s3cret-4e1f";
    std::fs::write(secrets.path().join("api-token"), rotated).unwrap();
    let (_, seen) = probe_env(&daemon, &["--env-secret", "TOKEN=api-token"], "TOKEN");
    assert_eq!(seen, digest(rotated));

    // Everything a user or the dashboard can read of these tasks.
    let id = first["id"].to_string();
    let mut shown = String::new();
    for verb in [
        vec!["ps", "--all", "--json"],
        vec!["events", "--json"],
        vec!["logs", &id],
        vec!["wait", &id, "--json"],
    ] {
        let out = daemon.run(&verb);
        shown.push_str(&out.stdout);
        shown.push_str(&out.stderr);
    }
    let api = Api::of(&daemon);
    for path in [
        "/api/tasks?all=true".to_owned(),
        format!("/api/tasks/{id}"),
        format!("/api/tasks/{id}/logs"),
        "/api/slots".to_owned(),
    ] {
        shown.push_str(&api.get(&path).body);
    }
    shown.push_str(&get(crate::http::http_port(&daemon), "/").body);
    assert!(
        shown.contains("api-token") || shown.contains("TOKEN"),
        "the names may show; this read nothing: {shown}"
    );
    let out = daemon.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let (status, finished) = daemon.finish(LIMIT);
    assert!(status.success(), "{finished:?}");
    let state = daemon.dir.path().join("state");
    // The control: the names are kept, so the search does read the store.
    assert!(
        !files_holding(&state, b"api-token").is_empty(),
        "no secret name found under {}",
        state.display()
    );
    for value in [file_value, env_value, rotated] {
        assert!(!shown.contains(value), "`{value}` shown: {shown}");
        let log = finished.stderr.clone() + &finished.stdout;
        assert!(!log.contains(value), "`{value}` in the daemon's log: {log}");
        let files = files_holding(&state, value.as_bytes());
        assert!(files.is_empty(), "`{value}` stored in {files:?}");
    }
}

#[test]
fn a_missing_secret_fails_its_task_naming_it() {
    let secrets = private_dir();
    let daemon = Daemon::start(&["--secrets-dir", secrets.path().to_str().unwrap()]);
    let out = daemon.run(&[
        "submit",
        &p("sandbox-probe"),
        "--secret",
        "NOT_THERE",
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    let report = out.json();
    // Fatal: retrying cannot find it; the operator adds it, then reruns.
    assert_eq!(report["outcome"], "fatal", "{report}");
    let reason = report["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("secret `NOT_THERE` is not defined here")
            && reason.contains("--secrets-dir"),
        "{report}"
    );
    // A name that could be a path is refused before anything is sent.
    let out = daemon.run(&["submit", &p("sandbox-probe"), "--secret", "../etc"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr.contains("invalid secret name `../etc`"),
        "{out:?}"
    );
}

#[test]
fn the_daemon_refuses_secrets_it_cannot_keep_private() {
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = tempfile::tempdir().unwrap();
    let shown = open.path().display().to_string();
    let socket = state.path().join("h.sock");
    let state_dir = state.path().join("state");
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            state_dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run_host(&args)
    };
    let out = serve(&["--secrets-dir", &shown]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr.contains(&format!("run chmod 700 {shown}")),
        "{out:?}"
    );
    let out = serve(&["--secret-env", "TASKHOST_TEST_UNSET_SECRET"]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr
            .contains("the daemon's environment has no variable `TASKHOST_TEST_UNSET_SECRET`"),
        "{out:?}"
    );
}

#[test]
fn host_run_takes_secrets_from_its_environment() {
    let run = |set: bool| {
        let mut cmd = common::host();
        cmd.args([
            "run",
            &p("sandbox-probe"),
            "--env-secret",
            "PROBE_VAR=RUN_SECRET",
            "--param",
            "show=digest",
        ]);
        if set {
            cmd.env("RUN_SECRET", "from-the-shell");
        }
        cmd.output().expect("host run")
    };
    let out = run(true);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["env"], digest("from-the-shell"), "{v}");
    assert_eq!(v["env_names"], serde_json::json!(["PROBE_VAR"]), "{v}");

    let out = run(false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("secret `RUN_SECRET` is not defined here")
            && stderr.contains("export NAME="),
        "{stderr}"
    );
}

#[test]
fn config_values_reach_the_guest_over_the_daemons_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("host.toml");
    std::fs::write(&file, "[config_vars]\nregion = \"eu\"\ntier = \"free\"\n").unwrap();
    let daemon = Daemon::start(&["--config", file.to_str().unwrap()]);
    let config = |extra: &[&str]| {
        let path = p("sandbox-probe");
        let mut args = vec!["submit", &path, "--wait", "--json"];
        args.extend_from_slice(extra);
        let out = daemon.run(&args);
        assert_eq!(out.code, Some(0), "{out:?}");
        let report = out.json();
        let output: Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
        output["config"].clone()
    };
    assert_eq!(
        config(&[]),
        serde_json::json!({"region": "eu", "tier": "free"})
    );
    assert_eq!(
        config(&["--config-var", "tier=pro", "--config-var", "team=a=b"]),
        serde_json::json!({"region": "eu", "team": "a=b", "tier": "pro"})
    );
    let out = daemon.run(&["submit", &p("sandbox-probe"), "--config-var", "=x"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("use KEY=VALUE"), "{out:?}");

    let out = run_host(&["run", &p("sandbox-probe"), "--config-var", "k=v"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["config"], serde_json::json!({"k": "v"}), "{v}");
}
