//! The flight recorder through the real binary: attempts of `nondet` (the
//! clocks, random bytes, the insecure seed, key-value state, a trap that
//! depends on random data, a stop at a random moment, a spin stopped by
//! force), of `http-get` against a server whose every answer differs, and
//! of `sandbox-probe` reading a file and a listing in a granted directory
//! that change between attempts, recorded by `host run --record` and
//! replayed by `host replay` once the server or the directory is gone,
//! every one identical; a planted divergence (`nondet-changed` reads the
//! clock once more) named at its call; a record replayed in a fresh
//! directory holding only it, the plugin and the binary; truncation,
//! secrets and damaged files. The Python and JavaScript guests' records are
//! in `guests`.

use crate::{common, daemon};

use std::path::Path;
use std::process::Command;

use common::{Finished, run_host};
use daemon::p;

/// Runs `host run PLUGIN --record FILE ARGS`.
fn record(plugin: &str, file: &Path, args: &[&str]) -> Finished {
    let file = file.display().to_string();
    let mut all = vec!["run", plugin, "--record", &file];
    all.extend_from_slice(args);
    run_host(&all)
}

/// Replays attempt `n` of `file` (with `extra` flags): its exit code and
/// JSON verdict.
pub fn replay_json(file: &Path, n: u32, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let file = file.display().to_string();
    let n = n.to_string();
    let mut all = vec!["replay", &file, "--attempt", &n, "--json"];
    all.extend_from_slice(extra);
    let out = run_host(&all);
    (out.code, out.json())
}

/// Records `attempts` attempts of `plugin` with `args` (each ending in a
/// failure, a timeout or a trap, so retried), then replays every one:
/// each must be identical, every recorded call used. The recording run's
/// output.
pub fn record_and_replay_all(plugin: &str, file: &Path, args: &[&str], attempts: u32) -> Finished {
    record_and_replay_all_after(plugin, file, args, attempts, || {})
}

/// [`record_and_replay_all`], running `between` (which takes away what
/// the attempts reached) after recording and before replaying.
pub fn record_and_replay_all_after(
    plugin: &str,
    file: &Path,
    args: &[&str],
    attempts: u32,
    between: impl FnOnce(),
) -> Finished {
    let retries = (attempts - 1).to_string();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--max-retries", &retries, "--backoff", "1ms,2ms"]);
    let out = record(plugin, file, &all);
    between();
    assert!(
        out.stderr.contains(&format!(
            "recorded {attempts} attempts in {}",
            file.display()
        )),
        "{args:?}: {}",
        out.stderr
    );
    for n in 1..=attempts {
        let (code, json) = replay_json(file, n, &[]);
        assert_eq!(
            (code, json["verdict"].as_str()),
            (Some(0), Some("identical")),
            "{args:?}, attempt {n}: {json:#}"
        );
        assert_eq!(json["calls_used"], json["calls_recorded"], "{json:#}");
    }
    out
}

#[test]
fn every_attempt_of_a_nondeterministic_guest_replays_identical() {
    let dir = tempfile::tempdir().unwrap();
    let nondet = p("nondet");
    let cases: [(&str, &[&str], u32); 5] = [
        // The clocks, random bytes, the insecure seed and numbers.
        ("plain", &["--param", "fail=1"], 20),
        // Key-value state that each attempt changes.
        ("kv", &["--param", "kv=1", "--param", "fail=1"], 20),
        // A trap when a random byte is even, else a failure.
        ("trap", &["--param", "trap=1", "--param", "fail=1"], 20),
        // Random sleeps until a timeout stops each at some moment.
        (
            "cancel",
            &["--param", "until_cancelled=1", "--timeout", "40ms"],
            20,
        ),
        // A guest spinning until it is stopped by force.
        ("spin", &["--param", "spin=1", "--timeout", "50ms"], 3),
    ];
    for (name, args, attempts) in cases {
        let file = dir.path().join(format!("{name}.rec"));
        record_and_replay_all(&nondet, &file, args, attempts);
    }
}

/// A server on 127.0.0.1 that answers `count` requests, each differently
/// (status, a header and a body of `size` bytes and more, sent in two
/// parts), the last one with 200, then goes away.
pub fn changing_server(count: usize, size: usize) -> (u16, std::thread::JoinHandle<()>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for n in 1..=count {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|read| read > 2) {
                line.clear();
            }
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let status = if n == count { 200 } else { 500 + n % 4 };
            let mut body = format!("answer {n} at {nanos}\n");
            let pad = (nanos % 26) as u8 + b'a';
            body.extend(std::iter::repeat_n(char::from(pad), size));
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nx-answer: {nanos}\r\nconnection: \
                 close\r\n\r\n",
                body.len()
            );
            let (first, rest) = body.as_bytes().split_at(body.len() / 2);
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(first);
            let _ = stream.flush();
            std::thread::sleep(std::time::Duration::from_millis(5));
            let _ = stream.write_all(rest);
        }
    });
    (port, server)
}

/// Records `http-get` fetching from a [`changing_server`] of `count`
/// answers of `size` bytes, retried until the last, with `extra` flags;
/// returns once the server is gone.
fn record_http(file: &Path, count: usize, size: usize, extra: &[&str]) -> Finished {
    let (port, server) = changing_server(count, size);
    let origin = format!("http://127.0.0.1:{port}");
    let url = format!("url={origin}/now?q=1");
    let retries = (count - 1).to_string();
    let mut args = vec![
        "--param",
        &url,
        "--allow-http",
        &origin,
        "--max-retries",
        &retries,
        "--backoff",
        "1ms,2ms",
    ];
    args.extend_from_slice(extra);
    let out = record(&p("http-get"), file, &args);
    // Every answer was taken: the server is gone, and nothing listens.
    server.join().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    out
}

#[test]
fn outbound_http_replays_identical_from_the_record_once_the_server_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("http.rec");
    let out = record_http(&file, 20, 200_000, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("recorded 20 attempts"),
        "{}",
        out.stderr
    );
    for n in 1..=20 {
        let (code, json) = replay_json(&file, n, &[]);
        assert_eq!(
            (code, json["verdict"].as_str()),
            (Some(0), Some("identical")),
            "attempt {n}: {json:#}"
        );
        assert_eq!(json["calls_used"], json["calls_recorded"], "{json:#}");
        assert_eq!(json["notes"], serde_json::json!([]), "{json:#}");
    }
    // The last attempt's output holds the body the server sent it.
    let out = run_host(&["replay", &file.display().to_string(), "--attempt", "20"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("answer 20 at "), "{}", out.stdout);
}

#[test]
fn a_response_past_the_budget_truncates_the_record_and_reaches_the_guest_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.rec");
    let out = record_http(&file, 1, 300_000, &["--record-budget", "1000"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.starts_with("HTTP 200\nanswer 1 at "),
        "{}",
        out.stderr
    );
    assert!(out.stdout.len() > 300_000, "{}", out.stdout.len());
    let (code, json) = replay_json(&file, 1, &[]);
    assert_eq!(
        (code, json["verdict"].as_str()),
        (Some(1), Some("truncated")),
        "{json:#}"
    );
}

#[test]
fn files_and_listings_read_through_a_grant_replay_identical_once_the_directory_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    let grant = format!("{}::/data:ro", data.display());
    // 20 attempts, each reading a file whose content changed before it,
    // and listing the directory.
    let files: Vec<_> = (1..=20)
        .map(|n| {
            let content = format!("content {n} at {:?}\n", std::time::SystemTime::now());
            std::fs::write(data.join("sub/probe.txt"), &content).unwrap();
            let file = dir.path().join(format!("files-{n}.rec"));
            let read = if n % 2 == 0 {
                "read=/data/sub/probe.txt"
            } else {
                // A path with `.` and `..`, and one that is missing.
                if n % 4 == 1 {
                    "read=/data/./sub/../sub/probe.txt"
                } else {
                    "read=/data/missing.txt"
                }
            };
            // And a listing, whose entries change too.
            std::fs::write(data.join(format!("entry-{n}")), b"").unwrap();
            let out = record(
                &p("sandbox-probe"),
                &file,
                &["--dir", &grant, "--param", read, "--param", "list=/data"],
            );
            assert_eq!(out.code, Some(0), "{}", out.stderr);
            if read.ends_with("probe.txt") {
                assert!(
                    out.stdout.contains(&format!("content {n} at")),
                    "{}",
                    out.stdout
                );
            }
            assert!(out.stdout.contains("sub/"), "{}", out.stdout);
            assert!(out.stdout.contains(&format!("entry-{n}")), "{}", out.stdout);
            file
        })
        .collect();
    std::fs::remove_dir_all(&data).unwrap();
    for file in &files {
        let (code, json) = replay_json(file, 1, &[]);
        assert_eq!(
            (code, json["verdict"].as_str()),
            (Some(0), Some("identical")),
            "{}: {json:#}",
            file.display()
        );
        assert_eq!(json["calls_used"], json["calls_recorded"], "{json:#}");
    }
}

#[test]
fn a_changed_build_is_told_where_it_diverges() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("n.rec");
    let out = record(&p("nondet"), &file, &["--input", "x"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let changed = p("nondet-changed");
    let (code, json) = replay_json(&file, 1, &["--plugin", &changed]);
    assert_eq!(code, Some(1), "{json:#}");
    assert_eq!(json["verdict"], "diverged", "{json:#}");
    assert_eq!(json["same_plugin"], false);
    let divergence = &json["divergence"];
    assert_eq!(divergence["call"], 2, "{json:#}");
    assert_eq!(divergence["asked"], "wasi:clocks/wall-clock.now()");
    assert_eq!(divergence["recorded"], "wasi:clocks/monotonic-clock.now()");
    // In words too, on stderr.
    let out = run_host(&["replay", &file.display().to_string(), "--plugin", &changed]);
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains(
            "diverged at host call 2: the guest asked wasi:clocks/wall-clock.now(), where the \
             record holds wasi:clocks/monotonic-clock.now()"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn an_exported_record_reproduces_a_failure_in_a_fresh_directory() {
    let work = tempfile::tempdir().unwrap();
    // The plugin as deployed somewhere, then gone.
    let deployed = work.path().join("deployed.wasm");
    std::fs::copy(p("nondet"), &deployed).unwrap();
    let file = work.path().join("failure.rec");
    let out = record(
        &deployed.display().to_string(),
        &file,
        &["--param", "trap=1", "--param", "fail=1", "--input", "prod"],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let reason = out.stderr.lines().last().unwrap().to_owned();
    std::fs::remove_file(&deployed).unwrap();
    let gone = run_host(&["replay", &file.display().to_string()]);
    assert_eq!(gone.code, Some(2), "{}", gone.stderr);
    assert!(
        gone.stderr.contains("give it with --plugin PATH"),
        "{}",
        gone.stderr
    );

    // Another machine: a directory with only the binary, the plugin and
    // the record; no cache, no environment.
    let laptop = tempfile::tempdir().unwrap();
    let bin = laptop.path().join("host");
    std::fs::copy(common::host_bin(), &bin).unwrap();
    std::fs::copy(p("nondet"), laptop.path().join("nondet.wasm")).unwrap();
    std::fs::copy(&file, laptop.path().join("failure.rec")).unwrap();
    let out = Command::new(&bin)
        .current_dir(laptop.path())
        .env_clear()
        .env("HOME", laptop.path())
        .args([
            "replay",
            "failure.rec",
            "--plugin",
            "nondet.wasm",
            "--no-cache",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("identical"), "{stderr}");
    // The same failure, word for word.
    let recorded = reason.split_once("): ").map_or(&reason[..], |(_, r)| r);
    assert!(stderr.contains(recorded), "{recorded:?} in {stderr}");
}

#[test]
fn a_record_past_its_budget_is_truncated_and_the_attempt_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.rec");
    let out = record(
        &p("nondet"),
        &file,
        &[
            "--param",
            "until_cancelled=1",
            "--timeout",
            "300ms",
            "--record-budget",
            "100",
        ],
    );
    // Stopped by its timeout as without a record.
    assert!(
        out.stderr.contains("timed out after 300.0ms"),
        "{}",
        out.stderr
    );
    let (code, json) = replay_json(&file, 1, &[]);
    assert_eq!(
        (code, json["verdict"].as_str()),
        (Some(1), Some("truncated")),
        "{json:#}"
    );
    let calls = json["calls_recorded"].as_u64().unwrap();
    assert!(
        (5..=50).contains(&calls),
        "100 bytes hold a few dozen calls: {calls}"
    );
    assert_eq!(json["calls_used"], json["calls_recorded"]);
}

#[test]
fn secrets_are_checked_by_digest_and_never_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.rec");
    let value = "s3cret-value-never-in-a-record";
    let out = common::host()
        .args(["run", &p("nondet"), "--secret", "API_KEY", "--record"])
        .arg(&file)
        .env("API_KEY", value)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let bytes = std::fs::read(&file).unwrap();
    assert!(
        !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
        "the value is in the record"
    );
    let replay = |value: Option<&str>| {
        let mut cmd = common::host();
        cmd.args(["replay"]).arg(&file).env_remove("API_KEY");
        if let Some(value) = value {
            cmd.env("API_KEY", value);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = replay(Some(value));
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = replay(Some("another"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("secret `API_KEY` has another value"),
        "{stderr}"
    );
    let (code, stderr) = replay(None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("API_KEY"), "{stderr}");
    // From a directory of secrets, as a daemon keeps them.
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::set_permissions(
        &secrets,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(secrets.join("API_KEY"), value).unwrap();
    let out = run_host(&[
        "replay",
        &file.display().to_string(),
        "--secrets-dir",
        &secrets.display().to_string(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn damaged_records_are_refused_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.rec");
    let out = record(&p("nondet"), &file, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let good = std::fs::read(&file).unwrap();
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("text", b"hello, world\n".to_vec(), "not a taskhost record"),
        ("cut", good[..good.len() / 2].to_vec(), "damaged"),
        (
            "newer",
            [&good[..8], &[9, 0], &good[10..]].concat(),
            "format version 9",
        ),
        ("empty", Vec::new(), "not a taskhost record"),
    ];
    for (name, bytes, words) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = run_host(&["replay", &path.display().to_string()]);
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        assert!(out.stderr.contains(words), "{name}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{name}: {}", out.stderr);
    }
    let out = run_host(&["replay", &file.display().to_string(), "--attempt", "4"]);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("holds no attempt 4: it holds attempt 1"),
        "{}",
        out.stderr
    );
}

/// A `GET` of the daemon's API with its own token: the whole answer,
/// status line, headers and body, as bytes.
fn api_get_bytes(d: &daemon::Daemon, path: &str) -> Vec<u8> {
    use std::io::{Read, Write};
    let api = crate::http::Api::of(d);
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: {}\r\n\
         Connection: close\r\n\r\n",
        api.port,
        api.bearer()
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    answer
}

/// `host replay --json` of a daemon's task (`extra`: --attempt N, ...).
fn replay_task(d: &daemon::Daemon, task: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["replay", task, "--json"];
    all.extend_from_slice(extra);
    let out = d.run(&all);
    (out.code, out.json())
}

fn assert_identical(d: &daemon::Daemon, task: &str, extra: &[&str]) {
    let (code, json) = replay_task(d, task, extra);
    assert_eq!(
        (code, json["verdict"].as_str()),
        (Some(0), Some("identical")),
        "{task} {extra:?}: {json:#}"
    );
}

/// A daemon records each attempt: a parent with its child's outcome and
/// key-value state, and a retried task's every attempt, replay identical
/// by id, by name, from an exported file and from the store after a
/// restart; the API serves the record to a reader; `--no-record` and
/// `--record-budget 0` keep none, saying so.
#[test]
fn a_daemons_attempts_replay_by_id_from_memory_and_from_the_store() {
    let mut d = daemon::Daemon::start(&["--http", "127.0.0.1:0"]);
    let hello = run_host(&["inspect", &p("hello"), "--json"]).json()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let nondet = p("nondet");
    // The child's plugin, known to the daemon.
    d.run(&["wait", &d.submit(&[&p("hello")])]);
    let child = format!("child={hello}");
    let parent = d.submit(&[&nondet, "--slot", "n", "--param", "kv=1", "--param", &child]);
    let flaky = d.submit(&[
        &nondet,
        "--name",
        "flaky",
        "--param",
        "trap=1",
        "--param",
        "fail=1",
        "--max-retries",
        "4",
        "--backoff",
        "1ms,2ms",
    ]);
    let quiet = d.submit(&[&nondet, "--no-record"]);
    for task in [&parent, &flaky, &quiet] {
        d.run(&["wait", task]);
    }
    assert_identical(&d, &parent, &[]);
    for n in ["1", "3", "5"] {
        assert_identical(&d, "flaky", &["--attempt", n]);
    }
    let out = d.run(&["replay", &flaky, "--attempt", "6"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no record of attempt 6: it keeps attempt 1, 2, 3, 4, 5"),
        "{}",
        out.stderr
    );
    let out = d.run(&["replay", &quiet]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("no recorded attempt"), "{}", out.stderr);

    // Exported, then replayed from the file with the plugin.
    let file = d.dir.path().join("parent.rec");
    let out = d.run(&[
        "record",
        "export",
        &parent,
        "--output",
        &file.display().to_string(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (code, json) = replay_json(&file, 1, &["--plugin", &nondet]);
    assert_eq!(
        (code, json["verdict"].as_str()),
        (Some(0), Some("identical")),
        "{json:#}"
    );

    // The JSON API, to a token that reads: the exported file's bytes.
    let answer = api_get_bytes(&d, &format!("/api/tasks/{parent}/record"));
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(answer.ends_with(&std::fs::read(&file).unwrap()));
    let api = crate::http::Api::of(&d);
    assert_eq!(api.get(&format!("/api/tasks/{quiet}/record")).status, 404);
    let answer = api_get_bytes(&d, "/api/tasks/flaky/record?attempt=2");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // After a restart the records come from the store.
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    d.finish(daemon::LIMIT);
    d.restart(&["--record-budget", "0"]);
    assert_identical(&d, &parent, &[]);
    assert_identical(&d, "flaky", &["--attempt", "2"]);
    let unrecorded = d.submit(&[&nondet]);
    d.run(&["wait", &unrecorded]);
    let out = d.run(&["replay", &unrecorded]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--record-budget 0"), "{}", out.stderr);
}

/// In a cluster a task's records are kept in the database with its end:
/// every attempt of a task run by one node replays identical through the
/// other, its key-value state included.
#[test]
fn a_clusters_attempts_replay_through_any_node() {
    let pg = crate::postgres::Postgres::start();
    let a = crate::cluster::steady_node(&pg, "a", &[]);
    let b = crate::cluster::steady_node(&pg, "b", &[]);
    let id = a.submit(&[
        &p("nondet"),
        "--slot",
        "c",
        "--param",
        "kv=1",
        "--param",
        "fail=1",
        "--max-retries",
        "2",
        "--backoff",
        "1ms,2ms",
    ]);
    let out = a.run(&["wait", &id]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    for n in ["1", "2", "3"] {
        assert_identical(&b, &id, &["--attempt", n]);
        assert_identical(&a, &id, &["--attempt", n]);
    }
}
