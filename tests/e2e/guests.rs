//! Python and JavaScript guests: the examples of `plugins/guests/` built
//! with their pinned toolchains (componentize-py, componentize-js) and run
//! through the real `host` binary, in process (`host run`) and through a
//! daemon, so regressions in pooling, limits or linking that only these
//! large components hit are caught.
//!
//! The components are built once by `plugins/guests/build.sh` into
//! `<target>/tmp/guests/<lang>/` and reused while their inputs (the
//! examples, the helper modules, the WIT, the build script, the JS lock
//! file) are unchanged. A missing toolchain fails every test here with the
//! reason and the command that installs it (`.ci/run` installs both).

use crate::{common, daemon};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{Running, run_host};
use daemon::Daemon;
use sha2::{Digest as _, Sha256};

/// How long loading a large component may take: its first compile takes
/// several seconds, more on a loaded machine.
const LOAD: Duration = Duration::from_secs(300);

/// The two guest languages, as `build.sh` names them, with the prefix of
/// their components.
#[derive(Debug, Clone, Copy)]
enum Lang {
    Python,
    Js,
}

impl Lang {
    fn arg(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Js => "js",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Python => "py",
            Self::Js => "js",
        }
    }

    /// The example sources of this language.
    fn sources(self) -> PathBuf {
        repo().join("plugins/guests").join(self.arg())
    }
}

fn repo() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// Every file whose content goes into a build of `lang`, sorted.
fn inputs(lang: Lang) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if name == "node_modules" || name == "__pycache__" {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut files = vec![
        repo().join("plugins/guests/build.sh"),
        repo().join("wit/task-plugin.wit"),
    ];
    walk(&lang.sources(), &mut files);
    walk(&repo().join("wit/deps"), &mut files);
    files.sort();
    files
}

/// A digest of the inputs' names and contents.
fn stamp(lang: Lang) -> String {
    let mut hash = Sha256::new();
    for file in inputs(lang) {
        let bytes =
            std::fs::read(&file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        hash.update(file.to_string_lossy().as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Builds the examples of `lang` unless the last build's stamp matches;
/// returns the directory holding `<prefix>-hello.wasm` and
/// `<prefix>-long.wasm`.
fn build(lang: Lang) -> Result<PathBuf, String> {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("guests")
        .join(lang.arg());
    let stamp_file = out.join("stamp");
    let want = stamp(lang);
    let built = ["hello", "long", "fanout"]
        .iter()
        .all(|e| out.join(format!("{}-{e}.wasm", lang.prefix())).is_file());
    if built && std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == want) {
        return Ok(out);
    }
    let _ = std::fs::remove_file(&stamp_file);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let started = Instant::now();
    let result = Command::new(repo().join("plugins/guests/build.sh"))
        .arg(&out)
        .arg(lang.arg())
        .output()
        .map_err(|e| format!("cannot run plugins/guests/build.sh: {e}"))?;
    if !result.status.success() {
        return Err(format!(
            "plugins/guests/build.sh {} failed ({}); .ci/run installs the toolchains:\n{}",
            lang.arg(),
            result.status,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    eprintln!(
        "built the {} examples in {:.1?}",
        lang.arg(),
        started.elapsed()
    );
    std::fs::write(&stamp_file, want)
        .map_err(|e| format!("cannot write {}: {e}", stamp_file.display()))?;
    Ok(out)
}

/// The components of both languages, built once per test process (the two
/// languages in parallel) and compiled into the shared cache, so tests
/// running side by side load them instead of each compiling the same one.
fn built() -> &'static [Result<PathBuf, String>; 2] {
    static BUILT: OnceLock<[Result<PathBuf, String>; 2]> = OnceLock::new();
    BUILT.get_or_init(|| {
        let js = std::thread::spawn(|| build(Lang::Js));
        let python = build(Lang::Python);
        let js = js
            .join()
            .unwrap_or_else(|_| Err("the JavaScript build panicked".into()));
        let built = [python, js];
        for example in ["hello", "long", "fanout"] {
            // Both languages at a time: each compile uses both cores.
            let running: Vec<_> = [(Lang::Python, &built[0]), (Lang::Js, &built[1])]
                .into_iter()
                .filter_map(|(lang, dir)| {
                    let path = dir.as_ref().ok()?;
                    let path = path.join(format!("{}-{example}.wasm", lang.prefix()));
                    common::host()
                        .arg("inspect")
                        .arg(path)
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .ok()
                })
                .collect();
            // A component that fails to compile fails the tests that use it.
            for mut child in running {
                let _ = child.wait();
            }
        }
        built
    })
}

/// The path of one example component, e.g. `guest(Lang::Python, "hello")`;
/// fails the test when its toolchain is missing.
fn guest(lang: Lang, example: &str) -> String {
    let dir = match (lang, built()) {
        (Lang::Python, [Ok(dir), _]) | (Lang::Js, [_, Ok(dir)]) => dir,
        (Lang::Python, [Err(why), _]) | (Lang::Js, [_, Err(why)]) => {
            panic!("cannot build the {} guests: {why}", lang.arg())
        }
    };
    dir.join(format!("{}-{example}.wasm", lang.prefix()))
        .display()
        .to_string()
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

fn hello_returns_its_input(lang: Lang) {
    let out = run_host(&["run", &guest(lang, "hello"), "--input", "hi"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "hi");
    assert!(
        out.stderr.contains("info] hello: got 2 bytes"),
        "the guest's log line: {}",
        out.stderr
    );
}

#[test]
fn python_hello_returns_its_input() {
    hello_returns_its_input(Lang::Python);
}

#[test]
fn js_hello_returns_its_input() {
    hello_returns_its_input(Lang::Js);
}

/// Ctrl-C of `host run` cancels the long task cooperatively: it sees the
/// cancellation in the host's sleep, returns `canceled`, and the host
/// exits 4 long before the task's 60 s are up.
fn long_task_is_canceled_cooperatively(lang: Lang) {
    let mut run = Running::spawn(&[
        "run",
        &guest(lang, "long"),
        "--param",
        "ms=60000",
        "--param",
        "step_ms=20",
        "--json",
    ]);
    run.wait_for_line("attempt 1 started", LOAD);
    let sent = Instant::now();
    run.signal("INT");
    let (_, out) = run.finish(Duration::from_secs(30));
    let took = sent.elapsed();
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert_eq!(json(&out.stdout)["outcome"], "canceled", "{}", out.stderr);
    // Generous (the machine is shared): the grace is 10 s, so anything near
    // it means the guest did not see the cancellation.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        !out.stderr.contains("by force"),
        "stopped cooperatively, not by force: {}",
        out.stderr
    );
}

#[test]
fn python_long_task_is_canceled_cooperatively() {
    long_task_is_canceled_cooperatively(Lang::Python);
}

#[test]
fn js_long_task_is_canceled_cooperatively() {
    long_task_is_canceled_cooperatively(Lang::Js);
}

/// A guest spinning in interpreter code (it never checks for cancellation)
/// is stopped by force once the grace after Ctrl-C runs out, and its
/// timeout stops it too.
fn spinning_guest_is_stopped_by_force(lang: Lang) {
    let long = guest(lang, "long");
    let mut run = Running::spawn(&[
        "run",
        &long,
        "--param",
        "mode=spin",
        "--grace",
        "200ms",
        "--json",
    ]);
    run.wait_for_line("spinning; only a force-abort stops this", LOAD);
    let sent = Instant::now();
    run.signal("INT");
    let (_, out) = run.finish(Duration::from_secs(30));
    let took = sent.elapsed();
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert_eq!(
        json(&out.stdout)["outcome"],
        "force-aborted",
        "{}",
        out.stderr
    );
    assert!(
        took >= Duration::from_millis(200),
        "the grace is honoured: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // The plugin is compiled and cached by now: the timeout is all that
    // takes time.
    let started = Instant::now();
    let out = run_host(&["run", &long, "--param", "mode=spin", "--timeout", "300ms"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("timed out after 300.0ms"),
        "{}",
        out.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn python_spinning_guest_is_stopped_by_force() {
    spinning_guest_is_stopped_by_force(Lang::Python);
}

#[test]
fn js_spinning_guest_is_stopped_by_force() {
    spinning_guest_is_stopped_by_force(Lang::Js);
}

/// Python and JavaScript parents start children through
/// `taskhost:plugin/children` and sum their outputs; the daemon recorded
/// the children's outcomes, so each parent replays identical by its id.
#[test]
fn guests_start_child_tasks_through_a_daemon() {
    let d = Daemon::start_sharing_cache(&[]);
    for lang in [Lang::Python, Lang::Js] {
        let parent = d.submit(&[&guest(lang, "fanout"), "--param", "n=5"]);
        let out = d.run(&["wait", &parent]);
        assert_eq!(out.code, Some(0), "{lang:?}: {out:?}");
        let v: serde_json::Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{lang:?}: {e}: {out:?}"));
        assert_eq!(v["sum"], 30, "{lang:?}: {v}");
        assert_eq!(v["children"].as_array().unwrap().len(), 5, "{lang:?}: {v}");
        let out = d.run(&["replay", &parent, "--json"]);
        let json = out.json();
        assert_eq!(
            (out.code, json["verdict"].as_str()),
            (Some(0), Some("identical")),
            "{lang:?}: {json:#}"
        );
        // Five spawns and five waits, answered from the record.
        assert!(
            json["calls_used"].as_u64() >= Some(10),
            "{lang:?}: {json:#}"
        );
        assert_eq!(json["calls_used"], json["calls_recorded"], "{json:#}");
    }
}

/// Through a daemon whose plugin cache holds only one of these components
/// at a time: both languages' hello run (each load evicts the other), the
/// long task reports progress and `host cancel` ends it `canceled`.
#[test]
fn guests_run_through_a_daemon_with_a_small_plugin_cache() {
    let d = Daemon::start_sharing_cache(&["--plugin-cache", "20MiB"]);
    for (lang, input) in [
        (Lang::Python, "one"),
        (Lang::Js, "two"),
        (Lang::Python, "three"),
    ] {
        let out = d.run(&["submit", &guest(lang, "hello"), "--input", input, "--wait"]);
        assert_eq!(out.code, Some(0), "{lang:?}: {}", out.stderr);
        assert_eq!(out.stdout, input);
    }

    for lang in [Lang::Python, Lang::Js] {
        let name = format!("{}-long-daemon", lang.prefix());
        d.submit(&[
            &guest(lang, "long"),
            "--name",
            &name,
            "--param",
            "ms=60000",
            "--param",
            "step_ms=20",
        ]);
        // Progress arrives after each 20 ms step.
        let deadline = Instant::now() + LOAD;
        loop {
            let row = d
                .ps()
                .into_iter()
                .find(|t| t["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{name} is not listed"));
            if row["progress"]["done"].as_u64().unwrap_or(0) > 0 {
                assert_eq!(row["progress"]["total"], 60000, "{row}");
                break;
            }
            assert!(Instant::now() < deadline, "no progress from {name}: {row}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = d.run(&["cancel", &name]);
        assert_eq!(out.code, Some(0), "cancel: {}", out.stderr);
        let out = d.run(&["wait", &name, "--json"]);
        assert_eq!(out.code, Some(4), "{}", out.stderr);
        assert_eq!(json(&out.stdout)["outcome"], "canceled", "{}", out.stdout);
    }
}

/// A large component built against another version of our WIT package is
/// refused at once, before it is compiled (which takes seconds, and would
/// be announced on stderr).
#[test]
fn a_large_component_of_another_version_is_refused_before_compiling() {
    let bytes = std::fs::read(guest(Lang::Python, "hello")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("py-other-version.wasm");
    std::fs::write(
        &path,
        common::renamed(&bytes, b"plugin/host@0.1.2", b"plugin/host@0.2.0"),
    )
    .unwrap();
    let started = Instant::now();
    let out = run_host(&["inspect", "--no-cache", path.to_str().unwrap()]);
    let took = started.elapsed();
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "imports `taskhost:plugin/host@0.2.0` but this host provides taskhost:plugin@0.1.2"
        ) && out
            .stderr
            .contains("rebuild the plugin against taskhost:plugin@0.1.2"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("compiling"), "{}", out.stderr);
    // Generous: reading the names takes milliseconds, compiling this
    // component several seconds.
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// A compile that takes more than a second is announced on stderr, with
/// the component's size.
#[test]
fn a_long_compile_is_announced() {
    let hello = guest(Lang::Python, "hello");
    let out = run_host(&["inspect", "--no-cache", &hello]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("compiling "))
        .unwrap_or_else(|| panic!("no compiling line: {}", out.stderr));
    assert!(
        line.starts_with(&format!("compiling {hello} ("))
            && line.contains("MiB); without the cache (--no-cache) every run compiles it again"),
        "{line}"
    );
}

/// The daemon's memory stays under its `--plugin-cache` bound plus 100 MiB
/// after many distinct Python plugins: the least recently used compiled
/// plugins are dropped. The variants of py-hello (a custom section each, the
/// same variants in every run) are compiled into the shared compilation
/// cache first, by `host inspect`, so the daemon only loads them: what is
/// measured is the compiled plugins it keeps, not the compiler's own
/// memory. 8 by default: a cache that kept them all would hold about
/// 270 MiB, well past the bound, and a first run compiles each (about 10 s
/// of CPU apiece; later runs load them from the shared cache).
/// `TASKHOST_GUEST_PLUGINS=20` is the long form issue 14 measured.
#[test]
fn daemon_memory_stays_bounded_after_many_large_plugins() {
    let plugins: usize = std::env::var("TASKHOST_GUEST_PLUGINS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    let hello = std::fs::read(guest(Lang::Python, "hello")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let variants: Vec<String> = (0..plugins)
        .map(|i| {
            let path = dir.path().join(format!("py-hello-{i}.wasm"));
            let bytes = plugin_artifacts::with_custom_section(
                &hello,
                "taskhost-test-variant",
                &i.to_le_bytes(),
            );
            std::fs::write(&path, bytes).unwrap();
            path.display().to_string()
        })
        .collect();
    // Two at a time: each compile uses both cores, and memory.
    for pair in variants.chunks(2) {
        let running: Vec<_> = pair
            .iter()
            .map(|v| {
                common::host()
                    .args(["inspect", v])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in running {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    // One compiled py-hello (34 MiB) fits, two do not. Besides the plugin
    // it keeps, the daemon's allocator holds on to about two compiled
    // images' worth of freed memory (measured: 136 MiB after 20 plugins
    // with this bound, 18 MiB before the first).
    let bound_mib = 60;
    let d = Daemon::start_sharing_cache(&["--plugin-cache", &format!("{bound_mib}MiB")]);
    let before = daemon::proc_kib(d.pid(), "VmRSS");
    for (i, variant) in variants.iter().enumerate() {
        let input = format!("v{i}");
        let out = d.run(&["submit", variant, "--input", &input, "--wait"]);
        assert_eq!(out.code, Some(0), "{variant}: {}", out.stderr);
        assert_eq!(out.stdout, input);
    }
    let after = daemon::proc_kib(d.pid(), "VmRSS");
    let loaded = d
        .plugins()
        .into_iter()
        .filter(|p| p["loaded"] == true)
        .count();
    eprintln!(
        "daemon RSS {} MiB before, {} MiB after {plugins} plugins; {loaded} loaded",
        before / 1024,
        after / 1024
    );
    assert!(
        after < (bound_mib + 100) * 1024,
        "the daemon's RSS is {} MiB after {plugins} plugins of 18 MiB, over the {bound_mib} MiB \
         plugin cache plus 100 MiB",
        after / 1024
    );
}

/// Twenty attempts that read the clocks and random bytes, count their runs
/// in key-value state, then trap when a random byte is even and else fail,
/// and five stopped by a timeout at a random moment of their random sleeps:
/// each replays identical (`record` has the Rust guest's).
fn nondeterministic_attempts_replay_identical(lang: Lang) {
    let dir = tempfile::tempdir().unwrap();
    let long = guest(lang, "long");
    let out = crate::record::record_and_replay_all(
        &long,
        &dir.path().join("failed.rec"),
        &[
            "--param",
            "mode=nondet",
            "--param",
            "kv=1",
            "--param",
            "trap=1",
            "--param",
            "fail=1",
        ],
        20,
    );
    // A trap at one chance in two, 20 times: none would be one in a million.
    assert!(
        out.stderr.contains(": failed: the guest trapped"),
        "{lang:?}: {}",
        out.stderr
    );
    // The key-value state an attempt found was what the ones before left.
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains(", last ") && !l.contains(", last 0 bytes")),
        "{lang:?}: {}",
        out.stderr
    );
    crate::record::record_and_replay_all(
        &long,
        &dir.path().join("stopped.rec"),
        &[
            "--param",
            "mode=nondet",
            "--param",
            "steps=1000",
            "--timeout",
            "60ms",
        ],
        5,
    );
}

#[test]
fn python_attempts_replay_identical() {
    nondeterministic_attempts_replay_identical(Lang::Python);
}

#[test]
fn javascript_attempts_replay_identical() {
    nondeterministic_attempts_replay_identical(Lang::Js);
}

/// Python attempts that list and read a granted directory whose files
/// change between runs, and that trap (`os.abort`) when a random byte is
/// even, else fail: all 20 replay identical once the directory is gone.
/// Attempts that list and read a granted directory whose files change
/// between runs, and trap at random: Python through `open()`, JavaScript
/// through `wasi:filesystem` itself. All replay identical once the
/// directory is gone, answered from the record.
fn files_and_traps_replay_identical(lang: Lang) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    let grant = format!("{}::/data:ro", data.display());
    let long = guest(lang, "long");
    let mut trapped = 0;
    let files: Vec<_> = (1..=5)
        .map(|n| {
            let content = format!("content {n} at {:?}", std::time::SystemTime::now());
            std::fs::write(data.join("probe.txt"), &content).unwrap();
            std::fs::write(data.join(format!("entry-{n}")), b"").unwrap();
            let file = dir.path().join(format!("{}-{n}.rec", lang.prefix()));
            let record = file.display().to_string();
            let out = run_host(&[
                "run",
                &long,
                "--record",
                &record,
                "--dir",
                &grant,
                "--param",
                "mode=nondet",
                "--param",
                "dir=/data",
                "--param",
                "trap=1",
                "--param",
                "fail=1",
                "--max-retries",
                "3",
                "--backoff",
                "1ms,2ms",
            ]);
            assert!(out.stderr.contains("recorded 4 attempts"), "{}", out.stderr);
            assert!(
                out.stderr.contains(&format!("probe.txt={content}")),
                "{}",
                out.stderr
            );
            trapped += out.stderr.matches(": failed: the guest trapped").count();
            file
        })
        .collect();
    // A trap at one chance in two, 20 times: none would be one in a million.
    assert!(trapped > 0, "no attempt trapped");
    std::fs::remove_dir_all(&data).unwrap();
    for file in &files {
        for n in 1..=4 {
            let (code, json) = crate::record::replay_json(file, n, &[]);
            assert_eq!(
                (code, json["verdict"].as_str()),
                (Some(0), Some("identical")),
                "{}, attempt {n}: {json:#}",
                file.display()
            );
            assert_eq!(json["calls_used"], json["calls_recorded"], "{json:#}");
        }
    }
}

#[test]
fn python_files_and_traps_replay_identical() {
    files_and_traps_replay_identical(Lang::Python);
}

#[test]
fn javascript_files_and_traps_replay_identical() {
    files_and_traps_replay_identical(Lang::Js);
}

/// Attempts that fetch from a server whose every answer differs (status, a
/// header, the body): JavaScript through `fetch()`, Python through
/// `wasi:http` itself; all replay identical once it is gone, answered
/// from the record.
fn http_replays_identical_once_the_server_is_gone(lang: Lang) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fetch.rec");
    let (port, server) = crate::record::changing_server(20, 20_000);
    let origin = format!("http://127.0.0.1:{port}");
    let url = format!("url={origin}/now");
    let out = crate::record::record_and_replay_all_after(
        &guest(lang, "long"),
        &file,
        &[
            "--param",
            "mode=nondet",
            "--param",
            &url,
            "--param",
            "fail=1",
            "--allow-http",
            &origin,
        ],
        20,
        || {
            server.join().unwrap();
            assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
        },
    );
    // Each attempt saw another answer, the last a 200.
    for n in 1..=20 {
        assert!(
            out.stderr.contains(&format!(": 50{} answer {n} at", n % 4))
                || out.stderr.contains(&format!(": 200 answer {n} at")),
            "{lang:?}: {}",
            out.stderr
        );
    }
}

#[test]
fn javascript_fetches_replay_identical_once_the_server_is_gone() {
    http_replays_identical_once_the_server_is_gone(Lang::Js);
}

#[test]
fn python_http_requests_replay_identical_once_the_server_is_gone() {
    http_replays_identical_once_the_server_is_gone(Lang::Python);
}
