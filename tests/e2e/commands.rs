//! Any WASI command component as a task: programs no one here wrote, built
//! from their crates.io sources for `wasm32-wasip2` and natively by this
//! file's set-up, give through the daemon the bytes their native build
//! gives; and the `command-probe` plugin (a plain `main`) shows arguments,
//! standard input, output and error, exit statuses, grants, retries, a
//! force-abort of a command that never ends, the output limit, and the
//! JSON API's `args`.
//!
//! The programs are installed once with `cargo install --locked` into
//! `<target>/tmp/commands/{wasm,native}` (a build directory of their own
//! beside them, so a later run finds them installed); this needs the
//! crates.io registry, which `.ci/run` has. A failed install fails every
//! test that needs it, with cargo's own words.

use crate::{common, daemon, http};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use daemon::{Daemon, p};
use sha2::Digest as _;

/// The programs, pinned: a JSON formatter, a Markdown renderer, a
/// compressor.
const PROGRAMS: &[(&str, &str)] = &[
    ("jsonxf", "1.1.1"),
    ("pulldown-cmark", "0.13.6"),
    ("brotli", "9.1.3"),
];

fn commands_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("commands")
}

/// Installs every program for `target` (none: this machine) under
/// `<commands>/<root>/bin`.
fn install(target: Option<&str>, root: &str) -> Result<PathBuf, String> {
    let dir = commands_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["install", "--locked", "--quiet", "--root"])
        .arg(dir.join(root))
        .arg("--target-dir")
        .arg(dir.join("build"));
    match target {
        Some(target) => cmd.args(["--target", target]),
        // The native builds only give the bytes to compare with: a debug
        // build gives the same ones in a third of the time.
        None => cmd.arg("--debug"),
    };
    for (name, version) in PROGRAMS {
        cmd.arg(format!("{name}@{version}"));
    }
    // The test process's own cargo settings are not the install's.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CARGO_") && key != "CARGO_HOME" {
            cmd.env_remove(key);
        }
    }
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run cargo install: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo install {} failed ({}); it needs the crates.io registry:\n{}",
            root,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!("installed the {root} programs in {:.1?}", started.elapsed());
    Ok(dir.join(root).join("bin"))
}

/// The two builds of every program, installed once per test process.
fn programs() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let wasm = install(Some("wasm32-wasip2"), "wasm")?;
        let native = install(None, "native")?;
        Ok((wasm, native))
    });
    match built {
        Ok(dirs) => dirs,
        Err(why) => panic!("cannot build the command programs: {why}"),
    }
}

/// Runs the native build of `program` with `args` and `input` on stdin.
fn native(program: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(programs().1.join(program))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "native {program} {args:?}: {out:?}");
    out.stdout
}

/// `host ARGS` against the daemon, its stdout as bytes.
fn host_bytes(daemon: &Daemon, args: &[&str]) -> (Option<i32>, Vec<u8>, String) {
    let out = common::host()
        .args(daemon.args(args))
        .output()
        .expect("spawn host");
    (
        out.status.code(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn repo_file(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)).unwrap()
}

#[test]
fn programs_from_crates_io_give_the_output_of_their_native_build() {
    let wasm = programs().0.clone();
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let json = br#"{"name": "taskhost", "tags": ["wasm", "tasks"], "n": [1, 2.5, -3e2], "ok": true, "none": null}"#;
    let markdown = repo_file("README.md");
    let text = repo_file("ARCHITECTURE.md");
    let compressed = native("brotli", &["-c", "-q9"], &text);
    let cases: [(&str, &[&str], &[u8]); 6] = [
        ("jsonxf", &[], json),
        ("jsonxf", &["--minimize"], json),
        ("pulldown-cmark", &[], &markdown),
        ("pulldown-cmark", &["-T"], &markdown),
        ("brotli", &["-c", "-q9"], &text),
        ("brotli", &[], &compressed),
    ];
    for (i, (program, args, input)) in cases.iter().enumerate() {
        let expected = native(program, args, input);
        assert!(!expected.is_empty(), "{program} {args:?} printed nothing");
        let input_file = dir.path().join(format!("input-{i}"));
        std::fs::write(&input_file, input).unwrap();
        let component = wasm.join(format!("{program}.wasm")).display().to_string();
        let mut submit = vec![
            "submit",
            component.as_str(),
            "--input-file",
            input_file.to_str().unwrap(),
            "--wait",
            "--",
        ];
        submit.extend_from_slice(args);
        let (code, stdout, stderr) = host_bytes(&daemon, &submit);
        assert_eq!(code, Some(0), "{program} {args:?}: {stderr}");
        assert!(
            stdout == expected,
            "{program} {args:?}: {} bytes through the daemon against {} natively",
            stdout.len(),
            expected.len()
        );
    }
    // The round trip: what the component compressed, it decompresses.
    assert_eq!(native("brotli", &[], &compressed), text);
    // In process too, with the arguments given as --arg.
    let out = common::run_host(&[
        "run",
        wasm.join("jsonxf.wasm").to_str().unwrap(),
        "--input",
        r#"{"a": [1, 2]}"#,
        "--arg",
        "--minimize",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, r#"{"a":[1,2]}"#);
    // Each ran as a task of the plugin `command`, its slot its name.
    let ps = daemon.run(&["ps", "--all", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&ps.stdout).unwrap();
    assert_eq!(rows.len(), cases.len());
    for row in rows {
        assert_eq!(row["plugin"], "command", "{row}");
        assert_eq!(row["slot"], row["name"], "{row}");
    }
}

#[test]
fn a_command_takes_arguments_input_grants_and_logs_its_standard_error() {
    let daemon = Daemon::start(&[]);
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("note.txt"), "from the granted dir\n").unwrap();
    let probe = p("command-probe");
    let out = daemon.run(&[
        "submit",
        &probe,
        "--name",
        "echoer",
        "--input",
        "the input\n",
        "--arg",
        "echo",
        "--arg",
        "--looks-like-a-flag",
        "--wait",
        "--",
        "two words",
        "-x",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout, "echoer\n--looks-like-a-flag\ntwo words\n-x\nthe input\n",
        "argv[0] is the task's name, then --arg, then `-- ARGS`, then stdin"
    );
    let logs = daemon.run(&["logs", "echoer"]);
    assert!(
        logs.stdout.contains("echo: 10 bytes of input"),
        "standard error is the task's log: {:?}",
        logs.stdout
    );
    let grant = format!("{}::/data:ro", data.path().display());
    let out = daemon.run(&[
        "submit",
        &probe,
        "--dir",
        &grant,
        "--wait",
        "--",
        "cat",
        "/data/note.txt",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "from the granted dir\n");
    let out = daemon.run(&["submit", &probe, "--wait", "--", "cat", "/etc/passwd"]);
    assert_eq!(out.code, Some(1), "no grant, no file: {out:?}");
    let out = daemon.run(&[
        "submit",
        &probe,
        "--env",
        "REGION=eu",
        "--wait",
        "--",
        "env",
        "REGION",
    ]);
    assert_eq!(out.stdout, "eu\n", "{}", out.stderr);
    // A task plugin takes no arguments: refused before it is queued.
    let out = daemon.run(&["submit", &p("hello"), "--wait", "--", "x"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(
        out.stderr
            .contains("is a task plugin, which takes no arguments")
            && out.stderr.contains("--param"),
        "{}",
        out.stderr
    );
    let out = common::run_host(&["run", &p("hello"), "--arg", "x"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    // `host inspect` says which kind each is.
    let out = common::run_host(&["inspect", &probe, "--json"]);
    assert_eq!(out.json()["kind"], "command", "{}", out.stdout);
    let out = common::run_host(&["inspect", &p("hello"), "--json"]);
    assert_eq!(out.json()["kind"], "plugin", "{}", out.stdout);
    let out = common::run_host(&["inspect", &probe]);
    assert!(
        out.stdout.starts_with("kind         WASI command"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_failing_command_is_retried_and_a_flood_of_output_fails_it() {
    let daemon = Daemon::start(&[]);
    let probe = p("command-probe");
    let out = daemon.run(&[
        "submit",
        &probe,
        "--restart",
        "on-failure",
        "--max-retries",
        "2",
        "--backoff",
        "10ms,100ms,2,none",
        "--wait",
        "--json",
        "--",
        "exit",
        "3",
    ]);
    let result = out.json();
    assert_eq!(result["outcome"], "failed", "{result}");
    assert_eq!(
        result["attempts"], 3,
        "a non-zero exit is retryable: {result}"
    );
    assert!(
        result["reason"]
            .as_str()
            .unwrap()
            .contains("the command exited with status 1"),
        "{result}"
    );
    let logs = daemon.run(&["logs", &result["id"].to_string()]);
    assert_eq!(logs.stdout.matches("exiting with 3").count(), 3, "{logs:?}");
    let out = daemon.run(&["submit", &probe, "--wait", "--json", "--", "flood", "17"]);
    let result = out.json();
    assert_eq!(result["outcome"], "failed", "{result}");
    assert!(
        result["reason"]
            .as_str()
            .unwrap()
            .contains("wrote more than 16MiB to standard output"),
        "{result}"
    );
    // Up to the limit is output, whole.
    let (code, stdout, stderr) =
        host_bytes(&daemon, &["submit", &probe, "--wait", "--", "flood", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.len(), 2 << 20);
}

#[test]
fn a_command_that_never_ends_is_force_aborted_within_the_grace() {
    let daemon = Daemon::start(&["--grace", "500ms"]);
    let id = daemon.submit(&[&p("command-probe"), "--name", "forever", "--", "spin"]);
    daemon.wait_until_state("forever", "running");
    let started = Instant::now();
    let out = daemon.run(&["cancel", &id]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let waited = daemon.run(&["wait", &id, "--json"]).json();
    let took = started.elapsed();
    assert_eq!(waited["outcome"], "force-aborted", "{waited}");
    // Generous: the grace, then the next epoch tick, on a loaded machine.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // The spinning guest is gone: the daemon runs the next task at once.
    let out = daemon.run(&["submit", &p("command-probe"), "--wait", "--", "echo"]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn the_json_api_takes_a_commands_arguments() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = http::Api::of(&daemon);
    let probe = p("command-probe");
    let bytes = std::fs::read(&probe).unwrap();
    let digest = format!("{:x}", sha2::Sha256::digest(&bytes));
    let upload = http::request_bytes(
        api.port,
        "PUT",
        &format!("/api/plugins/{digest}"),
        &[("Authorization", api.bearer().as_str())],
        &bytes,
    );
    assert_eq!(upload.status, 200, "{}", upload.body);
    let body = serde_json::json!({
        "plugin": digest,
        "name": "from-api",
        "args": ["echo", "a b", "--c"],
        "input": "in",
    });
    let answer = api.request(
        "POST",
        "/api/tasks",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    assert_eq!(answer.status, 201, "{answer:?}");
    let out = daemon.run(&["wait", "from-api"]);
    assert_eq!(out.stdout, "from-api\na b\n--c\nin", "{}", out.stderr);
    // Arguments for a task plugin are refused, naming the fix.
    let hello = daemon.submit(&[&p("hello")]);
    let _ = daemon.run(&["wait", &hello]);
    let hello_digest = format!(
        "{:x}",
        sha2::Sha256::digest(std::fs::read(p("hello")).unwrap())
    );
    let body = serde_json::json!({"plugin": hello_digest, "args": ["x"]});
    let answer = api.request(
        "POST",
        "/api/tasks",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(
        answer.body.contains("takes no arguments"),
        "{}",
        answer.body
    );
}
