//! `host run` and `host inspect` end to end: the real binary on the real
//! plugins, checking the output and exit-code contract of docs/cli.md and docs/exit-codes.md.

use crate::common;

use std::time::{Duration, Instant};

use common::{Running, plugin, run_host};

fn p(name: &str) -> String {
    plugin(name).display().to_string()
}

fn json(stdout: &str) -> serde_json::Value {
    let mut lines = stdout.lines();
    let first = lines.next().expect("one JSON line on stdout");
    assert_eq!(
        lines.next(),
        None,
        "stdout holds exactly one JSON object: {stdout:?}"
    );
    serde_json::from_str(first).expect("valid JSON")
}

#[test]
fn hello_prints_exactly_its_input() {
    let out = run_host(&["run", &p("hello"), "--input", "hi"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hi");
    assert!(
        out.stderr.contains("[hello-1 info]"),
        "guest log is tagged on stderr: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("hello-1 completed in 1 attempt"),
        "{}",
        out.stderr
    );
}

#[test]
fn hello_json_is_one_object() {
    let out = run_host(&["run", &p("hello"), "--input", "hi", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["output"], "hi");
    assert_eq!(v["output_encoding"], "utf8");
    assert_eq!(v["attempts"], 1);
    assert_eq!(v["name"], "hello-1");
    assert_eq!(v["slot"], "hello-1");
    assert_eq!(v["id"], 1);
}

#[test]
fn input_file_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.bin");
    std::fs::write(&file, [0xff, 0x00, 0x01]).unwrap();
    let out = run_host(&[
        "run",
        &p("hello"),
        "--input-file",
        file.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["output_encoding"], "base64");
    assert_eq!(v["output"], "/wAB");

    let mut child = common::host()
        .args(["run", &p("hello"), "--input-file", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"from stdin");
}

#[test]
fn spin_times_out_within_a_second() {
    let mut run = Running::spawn(&["run", &p("spin"), "--timeout", "200ms"]);
    run.wait_for_line("attempt 1 started", Duration::from_secs(60));
    let started = Instant::now();
    let (_, out) = run.finish(Duration::from_secs(10));
    let took = started.elapsed();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    // Generous: a missed timeout would spin until finish() gives up at 10 s.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        out.stderr.contains("timed out after 200.0ms"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn sigint_cancels_a_cooperative_sleeper_quickly() {
    let mut run = Running::spawn(&["run", &p("sleeper"), "--param", "ms=60000", "--json"]);
    run.wait_for_line("attempt 1 started", Duration::from_secs(60));
    let sent = Instant::now();
    run.signal("INT");
    let (_, out) = run.finish(Duration::from_secs(10));
    let took = sent.elapsed();
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    // Generous (the machine is shared): the guest sleeps 60 s, so anything
    // near it means the cancellation did not reach the guest. The tight
    // figure is the cancel-latency benchmark's.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(json(&out.stdout)["outcome"], "canceled");
}

#[test]
fn sigint_force_aborts_a_spinner_after_its_grace() {
    let mut run = Running::spawn(&["run", &p("spin"), "--grace", "100ms", "--json"]);
    run.wait_for_line("attempt 1 started", Duration::from_secs(60));
    let sent = Instant::now();
    run.signal("INT");
    let (_, out) = run.finish(Duration::from_secs(10));
    let took = sent.elapsed();
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(
        took >= Duration::from_millis(100),
        "the grace is honoured: {took:?}"
    );
    // Generous: a spinner that was never force-aborted runs until finish()
    // gives up at 10 s.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(json(&out.stdout)["outcome"], "force-aborted");
}

#[test]
fn oom_hits_the_memory_limit_and_the_host_stays_small() {
    let out = std::process::Command::new("/usr/bin/time")
        .args([
            "-f",
            "peak-rss-kib=%M",
            common::host_bin(),
            "run",
            &p("oom"),
            "--max-memory",
            "32MiB",
        ])
        .env("TASKHOST_CACHE_DIR", common::cache_dir())
        .output()
        .expect("run /usr/bin/time (Debian package `time`)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("memory limit of 32MiB"), "{stderr}");
    let peak: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("peak-rss-kib="))
        .and_then(|v| v.trim().parse().ok())
        .expect("peak RSS line");
    assert!(peak < 200 * 1024, "peak RSS {peak} KiB");
}

#[test]
fn panic_reason_carries_the_guest_message() {
    let out = run_host(&["run", &p("panic"), "--param", "message=the sky fell"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the guest trapped: wasm `unreachable` instruction executed"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("the sky fell"), "{}", out.stderr);
}

#[test]
fn traps_are_named() {
    let out = run_host(&["run", &p("trap")]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("unreachable"), "{}", out.stderr);

    let out = run_host(&[
        "run",
        &p("trap"),
        "--param",
        "kind=stack-overflow",
        "--json",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "failed");
    assert!(
        v["reason"].as_str().unwrap().contains("stack overflow"),
        "{v}"
    );
}

#[test]
fn guest_stdio_goes_to_the_task_log_not_stdout() {
    let out = run_host(&["run", &p("chatty"), "--param", "lines=2"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "chatty done");
    for line in [
        "[chatty-1 stdout] stdout line 1",
        "[chatty-1 stdout] stdout line 2",
        "[chatty-1 stderr] stderr line 1",
        "[chatty-1 stderr] stderr line 2",
    ] {
        assert!(
            out.stderr.lines().any(|l| l == line),
            "missing {line:?} in {}",
            out.stderr
        );
    }
}

#[test]
fn a_burst_of_guest_lines_reaches_stderr_whole_and_in_order() {
    // 60,000 lines in one attempt, more than the supervisor's event bus
    // holds (4,096): host run reads them on a deep lane of its own, and
    // prints what is ready in one write, so none is lost.
    let out = run_host(&["run", &p("chatty"), "--param", "lines=30000"]);
    assert_eq!(
        out.code,
        Some(0),
        "{}",
        &out.stderr[..out.stderr.len().min(2000)]
    );
    assert!(!out.stderr.contains("dropped"), "a drop was reported");
    let mut next = [1u32, 1u32];
    for line in out.stderr.lines() {
        for (i, stream) in ["stdout", "stderr"].iter().enumerate() {
            if let Some(rest) = line.strip_prefix(&format!("[chatty-1 {stream}] {stream} line ")) {
                assert_eq!(rest, next[i].to_string(), "{stream} out of order");
                next[i] += 1;
            }
        }
    }
    assert_eq!(next, [30_001, 30_001], "every line of both streams");
}

fn probe(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["run", "sandbox-probe-path"];
    all.extend_from_slice(args);
    let path = p("sandbox-probe");
    all[1] = &path;
    let out = run_host(&all);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    serde_json::from_str(&out.stdout).expect("probe output is JSON")
}

fn starts(v: &serde_json::Value, prefix: &str) -> bool {
    v.as_str().is_some_and(|s| s.starts_with(prefix))
}

#[test]
fn sandbox_grants_nothing_by_default() {
    // SAFETY of the test: the variable is set on the child only.
    let v = probe(&[]);
    assert!(starts(&v["read"], "denied"), "{v}");
    assert!(starts(&v["write"], "denied"), "{v}");
    assert_eq!(v["env"], "missing", "{v}");
    assert_eq!(v["env_count"], 0, "{v}");
    assert!(starts(&v["socket"], "denied"), "{v}");
}

#[test]
fn sandbox_dir_grants_are_scoped_and_read_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("probe.txt"), "secret-ish").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("other.txt"), "other").unwrap();
    let grant_ro = format!("{}::/data:ro", dir.path().display());
    let v = probe(&["--dir", &grant_ro]);
    assert_eq!(v["read"], "ok:secret-ish", "{v}");
    assert!(starts(&v["write"], "denied"), "{v}");
    assert!(!dir.path().join("probe-write.txt").exists());

    // Only the granted directory is visible: not its parent, not elsewhere.
    let escape = format!("/data/../{}", outside.path().join("other.txt").display());
    let v = probe(&["--dir", &grant_ro, "--param", &format!("read={escape}")]);
    assert!(starts(&v["read"], "denied"), "{v}");

    let grant_rw = format!("{}::/data", dir.path().display());
    let v = probe(&["--dir", &grant_rw]);
    assert_eq!(v["write"], "ok", "{v}");
    assert!(dir.path().join("probe-write.txt").exists());
}

#[test]
fn sandbox_env_passes_only_named_variables() {
    let out = common::host()
        .args(["run", &p("sandbox-probe"), "--env", "PROBE_VAR=granted"])
        .env("SHOULD_NOT_LEAK", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["env"], "ok:granted", "{v}");
    assert_eq!(v["env_count"], 1, "{v}");
    assert!(starts(&v["socket"], "denied"), "{v}");
}

fn assert_usage_error(out: &common::Finished, needle: &str) {
    assert_eq!(out.code, Some(2), "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {:?}", out.stderr);
    assert!(lines[0].starts_with("error: "), "{lines:?}");
    assert!(
        lines[0].contains(needle),
        "{:?} should mention {needle:?}",
        lines[0]
    );
    assert!(!out.stderr.contains("panicked") && !out.stderr.contains("backtrace"));
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.wasm");
    let out = run_host(&["run", missing.to_str().unwrap()]);
    assert_usage_error(&out, "No such file or directory");

    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "just some text").unwrap();
    assert_usage_error(&run_host(&["run", text.to_str().unwrap()]), "magic bytes");

    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    assert_usage_error(
        &run_host(&["run", core.to_str().unwrap()]),
        "core WebAssembly module, not a component",
    );

    assert_usage_error(&run_host(&["run", &p("not-a-task")]), "not a task plugin");
    assert_usage_error(
        &run_host(&["inspect", &p("not-a-task")]),
        "not a task plugin",
    );

    assert_usage_error(&run_host(&["run", &p("deploy")]), "--param env=VALUE");
    assert_usage_error(
        &run_host(&["run", &p("hello"), "--param", "novalue"]),
        "KEY=VALUE",
    );
    assert_usage_error(
        &run_host(&["run", &p("hello"), "--dir", "/nonexistent-dir::/x"]),
        "cannot grant directory",
    );
}

#[test]
fn deploy_fills_its_resource_from_params() {
    let out = run_host(&[
        "run",
        &p("deploy"),
        "--param",
        "env=prod",
        "--param",
        "ms=1",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["slot"], "deploy/prod");
    assert_eq!(v["output"], "deployed to prod (dry run: no endpoint)");
}

#[test]
fn inspect_shows_what_deploy_declares() {
    let out = run_host(&["inspect", &p("deploy"), "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["name"], "deploy");
    assert_eq!(v["version"], "2.0.0");
    assert_eq!(v["resource"], "deploy/{env}");
    assert_eq!(v["resource_params"], serde_json::json!(["env"]));
    assert_eq!(v["default_policy"], "replace");
    assert!(v["digest"].as_str().unwrap().starts_with("sha256:"));

    let out = run_host(&["inspect", &p("deploy")]);
    assert_eq!(out.code, Some(0));
    assert!(
        out.stdout.contains("deploy/{env}") && out.stdout.contains("replace"),
        "{}",
        out.stdout
    );
}

#[test]
fn flaky_fails_with_its_exit_code_without_retries() {
    let out = run_host(&["run", &p("flaky"), "--param", "fail_times=1", "--json"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["exit_code"], 3);
}

#[test]
fn flaky_retries_until_it_succeeds() {
    let out = run_host(&[
        "run",
        &p("flaky"),
        "--param",
        "fail_times=2",
        "--restart",
        "on-failure",
        "--json",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["attempts"], 3);
    assert_eq!(v["output"], "ok after 3 attempts");
    assert_eq!(
        out.stderr.matches("failed: flaky: attempt").count(),
        2,
        "{}",
        out.stderr
    );
}

#[test]
fn retry_budget_and_history() {
    let out = run_host(&[
        "run",
        &p("flaky"),
        "--param",
        "fail_times=9",
        "--restart",
        "on-failure",
        "--max-retries",
        "2",
        "--backoff",
        "1ms,2ms,2,none",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("[flaky-1] 3 attempts:"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("retry limit reached: 3 consecutive failed attempts (max retries 2)"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("[exit code 3]"), "{}", out.stderr);
}

#[test]
fn policy_flags_are_checked() {
    let out = run_host(&["run", &p("hello"), "--restart", "never", "--every", "1s"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--every"), "{}", out.stderr);
    let out = run_host(&["run", &p("hello"), "--backoff", "1s,10ms"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("must not exceed the maximum"),
        "{}",
        out.stderr
    );
}

#[test]
fn max_retries_implies_restart_on_failure() {
    let out = run_host(&[
        "run",
        &p("flaky"),
        "--param",
        "fail_times=2",
        "--max-retries",
        "3",
        "--backoff",
        "1ms,2ms,2,none",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "ok after 3 attempts");
    assert!(
        out.stderr.contains("flaky-1 completed in 3 attempts"),
        "{}",
        out.stderr
    );
}

#[test]
fn max_retries_with_restart_never_is_refused_naming_both() {
    let never = ["--max-retries", "3", "--restart", "never"];
    let flaky = p("flaky");
    // `submit` and `schedule add` refuse before they look for a daemon.
    let socket = ["--socket", "/nonexistent/taskhost/h.sock"];
    let verbs: [Vec<&str>; 3] = [
        vec!["run", &flaky],
        [&["submit", &flaky][..], &socket].concat(),
        [
            &["schedule", "add", "s", "--cron", "@daily", &flaky][..],
            &socket,
        ]
        .concat(),
    ];
    for verb in verbs {
        let out = run_host(&[&verb[..], &never].concat());
        assert_eq!(out.code, Some(2), "{verb:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("--max-retries") && out.stderr.contains("--restart never"),
            "{verb:?} names both flags: {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{verb:?}: {}", out.stdout);
    }
}

#[test]
fn on_a_terminal_an_output_without_a_final_newline_ends_its_line() {
    let out = common::run_host_on_terminal(
        &["run", &p("hello"), "--input", "hi"],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{:?}", out.text());
    let screen = out.screen();
    let at = screen.iter().position(|l| l == "hi");
    assert!(
        at.is_some_and(|at| screen
            .get(at + 1)
            .is_some_and(|l| l.starts_with("hello-1 completed in 1 attempt"))),
        "the output is a line of its own, the summary the next: {screen:#?}"
    );
    // A pipe gets the bytes exactly (`hello_prints_exactly_its_input`).
}

/// The compiled artifacts in a cache directory.
fn cache_entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .count()
    })
}

/// A relative `--cache-dir` or `TASKHOST_CACHE_DIR` is taken relative to
/// the working directory, and the cache works.
#[test]
fn a_relative_cache_dir_still_caches() {
    let cwd = tempfile::tempdir().unwrap();
    let out = common::host()
        .current_dir(cwd.path())
        .env_remove("TASKHOST_CACHE_DIR")
        .args([
            "run",
            "--cache-dir",
            "rel-flag",
            &p("hello"),
            "--input",
            "hi",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        cache_entries(&cwd.path().join("rel-flag")) > 0,
        "the compiled plugin is cached under the working directory"
    );
    let out = common::host()
        .current_dir(cwd.path())
        .env("TASKHOST_CACHE_DIR", "rel-env")
        .args(["run", &p("hello"), "--input", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(cache_entries(&cwd.path().join("rel-env")) > 0);
}

/// So is a relative `host serve --state-dir`: its compilation cache is
/// `<state dir>/wasmtime-cache`, under the daemon's working directory.
#[test]
fn a_relative_state_dir_still_caches() {
    let cwd = tempfile::tempdir().unwrap();
    let socket = cwd.path().join("h.sock");
    let socket = socket.to_str().unwrap();
    let mut cmd = common::host();
    cmd.current_dir(cwd.path())
        .args(["serve", "--socket", socket, "--state-dir", "rel-state"]);
    let mut daemon = Running::spawn_command(cmd);
    daemon.wait_for_line("taskhost daemon listening on", Duration::from_secs(60));
    let out = run_host(&[
        "submit",
        &p("hello"),
        "--input",
        "hi",
        "--wait",
        "--socket",
        socket,
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hi");
    let out = run_host(&["shutdown", "--socket", socket]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (status, _) = daemon.finish(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert!(
        cache_entries(&cwd.path().join("rel-state/wasmtime-cache")) > 0,
        "the daemon's compilation cache is under its relative state directory"
    );
}

/// The verbs' arguments are built only for the verb being parsed: every
/// verb's help still says what it does, and the generators still see every
/// verb, nested ones and their flags.
#[test]
fn help_completions_and_man_pages_cover_every_verb() {
    let top = run_host(&["--help"]);
    assert_eq!(top.code, Some(0), "{}", top.stderr);
    for (verb, says) in [
        ("wait", "Wait for a task's final outcome"),
        ("submit", "Send one task to the daemon"),
        ("run", "Run one task in this process"),
        ("schedule", "Run tasks at times"),
    ] {
        assert!(
            top.stdout.contains(says),
            "`host --help` lists {verb}: {}",
            top.stdout
        );
        let help = run_host(&[verb, "--help"]);
        assert_eq!(help.code, Some(0), "{}", help.stderr);
        assert!(
            help.stdout.starts_with(says),
            "`host {verb} --help` starts with what it does: {}",
            help.stdout
        );
    }
    let nested = run_host(&["help", "schedule", "add"]);
    assert_eq!(nested.code, Some(0), "{}", nested.stderr);
    assert!(nested.stdout.contains("--cron"), "{}", nested.stdout);

    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run_host(&["completions", shell]);
        assert_eq!(script.code, Some(0), "{shell}: {}", script.stderr);
        // Flags without their dashes: fish writes `-l cron`.
        for word in [
            "schedule",
            "prune",
            "max-concurrent",
            "token-file",
            "missed",
        ] {
            assert!(script.stdout.contains(word), "{shell} completes {word}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let bash = dir.path().join("host.bash");
    std::fs::write(&bash, run_host(&["completions", "bash"]).stdout).unwrap();
    let checked = std::process::Command::new("bash")
        .arg("-n")
        .arg(&bash)
        .output()
        .expect("bash runs");
    assert!(checked.status.success(), "{checked:?}");

    let pages = dir.path().join("man");
    let man = run_host(&["man", "--out-dir", pages.to_str().unwrap()]);
    assert_eq!(man.code, Some(0), "{}", man.stderr);
    let page = std::fs::read_to_string(pages.join("host-schedule-add.1")).expect("a page per verb");
    assert!(page.contains("cron"), "{page}");
}
