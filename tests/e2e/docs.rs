//! The documentation runs: every ```` ```sh ```` block of `README.md`,
//! `docs/*.md` and `guest-sdk/README.md` is executed, so the quick start and
//! the examples cannot drift from the code. Blocks tagged `console` or
//! `text` are shown, not run; a block tagged `bash` or `shell` is refused,
//! so that no block escapes by its tag.
//!
//! One test per file. A file's `sh` blocks run in order as one script in
//! one `bash -xeuo pipefail` process (`-x` so a failure shows which command
//! failed), like a reader pasting them into one shell:
//!
//! - **cwd**: a fresh temporary directory that mirrors the repository root
//!   by symlinks, one per top-level entry (`target` pointing at the target
//!   directory this test was built in), so `host new my-plugin` writes into
//!   the temporary directory, not the repository. Entries git does not track
//!   (a `my-plugin/` left by a reader) are not mirrored; without git, every
//!   entry is.
//! - **environment**: `PATH` unchanged, so the documents' own
//!   `export PATH=$PWD/target/debug:$PATH` is what puts `host` on it: every
//!   file that runs `host` must have that line before its first use (this
//!   test checks it and prepends nothing; README.md, docs/cli.md,
//!   docs/daemon.md, docs/exit-codes.md, docs/plugins.md and
//!   guest-sdk/README.md have it). `HOME` is a fresh directory (so `~` is a
//!   scratch home), `XDG_STATE_HOME` another (the daemon's state), `TMPDIR`
//!   another, `TASKHOST_SOCKET` a socket beside them, `TASKHOST_CACHE_DIR`
//!   the tests' shared compilation cache; `XDG_RUNTIME_DIR`,
//!   `XDG_CONFIG_HOME`, `XDG_DATA_HOME`, `XDG_CACHE_HOME`, `RUST_LOG` and
//!   other `TASKHOST_*` variables are unset; stdin is null. So that a
//!   nested `cargo build` behaves as in a reader's shell, the variables
//!   cargo and rustup set for this test (`CARGO_*`, `RUSTFLAGS`,
//!   `RUSTUP_TOOLCHAIN`) are unset, except `CARGO_HOME` and `RUSTUP_HOME`,
//!   which keep pointing at the real ones (the new `HOME` would otherwise
//!   hide the installed toolchain and the downloaded crates).
//! - **skipped lines**: a line that is exactly `cargo demo`, or starts with
//!   `cargo test` or `cargo xtask test`: those are what runs this test.
//!   Nothing else is skipped.
//! - **daemons**: the documents start `host serve --detach` and end with
//!   `host shutdown`. Afterwards the test runs `host shutdown` on the
//!   socket if it is still there (ignoring how that goes) and kills every
//!   daemon the script started (`--detach` prints its pid) that is still
//!   alive, so no file leaves one running, even when it fails.
//! - **time**: each file gets [`LIMIT`] of wall-clock time; past it, its
//!   script is killed and the test fails. Nothing sleeps to synchronise.
//!
//! A failure names the file and shows the script, its stdout and stderr.
//! When a documented command fails, fix the document (or the host), not
//! this test. README.md builds the one `host new` crate the documents
//! build (a cold compile of a small crate); elsewhere the steps of a new
//! crate are `console` blocks.

use crate::common;

use std::collections::HashSet;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// Wall-clock time one file's script may take.
const LIMIT: Duration = Duration::from_secs(600);

/// The line that puts the `host` of `cargo demo` on the `PATH`.
const EXPORT_PATH: &str = "export PATH=$PWD/target/debug:$PATH";

/// The files whose `sh` blocks run, relative to the repository root.
const FILES: &[&str] = &[
    "README.md",
    "docs/c.md",
    "docs/cli.md",
    "docs/cluster.md",
    "docs/daemon.md",
    "docs/exit-codes.md",
    "docs/javascript.md",
    "docs/limits.md",
    "docs/plugins.md",
    "docs/protocol.md",
    "docs/python.md",
    "docs/remote.md",
    "docs/replay.md",
    "docs/semantics.md",
    "guest-sdk/README.md",
];

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// One fenced code block: its tag, the line of its opening fence (1-based)
/// and its lines, without the fence's indentation.
struct Block {
    tag: String,
    line: usize,
    body: Vec<String>,
}

/// The fenced (```) code blocks of a markdown text, in order. Fences may
/// be indented (inside list items).
fn code_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, Block)> = None; // (indent, ticks, block)
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        match &mut open {
            None if ticks >= 3 => {
                let tag = trimmed[ticks..].split_whitespace().next().unwrap_or("");
                open = Some((
                    indent,
                    ticks,
                    Block {
                        tag: tag.to_owned(),
                        line: i + 1,
                        body: Vec::new(),
                    },
                ));
            }
            None => {}
            Some((_, fence, _)) if ticks >= *fence && trimmed[ticks..].trim().is_empty() => {
                blocks.push(open.take().expect("open").2);
            }
            Some((fence_indent, _, block)) => {
                block
                    .body
                    .push(line[indent.min(*fence_indent)..].to_owned());
            }
        }
    }
    assert!(open.is_none(), "a code block is not closed");
    blocks
}

/// Whether a shell line runs `host` (as a command word, not as part of a
/// path such as `target/debug/host`).
fn runs_host(line: &str) -> bool {
    let line = line.split('#').next().unwrap_or("");
    line.split(|c: char| c.is_whitespace() || ";|&()`$".contains(c))
        .any(|word| word == "host")
}

/// Whether a line is one this test skips because it is what runs the test.
fn skipped(line: &str) -> bool {
    let line = line.trim();
    line == "cargo demo"
        || line == "cargo test"
        || line.starts_with("cargo test ")
        || line == "cargo xtask test"
        || line.starts_with("cargo xtask test ")
}

/// The script of a file's `sh` blocks, or an error saying why it cannot
/// run.
fn script_of(file: &str, markdown: &str) -> Result<String, String> {
    let mut script = String::new();
    let mut path_set = false;
    for block in code_blocks(markdown) {
        match block.tag.as_str() {
            "sh" => {}
            "bash" | "shell" | "zsh" => {
                return Err(format!(
                    "{file}:{}: a `{}` block: tag commands `sh` (this test runs them) or `console` (shown only)",
                    block.line, block.tag
                ));
            }
            _ => continue,
        }
        script.push_str(&format!("# {file}:{}\n", block.line));
        for line in &block.body {
            if skipped(line) {
                script.push_str(&format!("# skipped (it runs this test): {line}\n"));
                continue;
            }
            if line.trim() == EXPORT_PATH {
                path_set = true;
            } else if runs_host(line) && !path_set {
                return Err(format!(
                    "{file}: `{}` runs host before the file puts it on the PATH: add an sh block with `{EXPORT_PATH}` before it",
                    line.trim()
                ));
            }
            script.push_str(line);
            script.push('\n');
        }
    }
    Ok(script)
}

/// The top-level entries of the repository to mirror: those git tracks
/// (every one, without git), but not `target`, which is linked apart.
fn mirrored(root: &Path) -> Vec<OsString> {
    let tracked: Option<HashSet<OsString>> = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success() && !out.stdout.is_empty())
        .map(|out| {
            out.stdout
                .split(|&b| b == 0)
                .filter(|path| !path.is_empty())
                .filter_map(|path| path.split(|&b| b == b'/').next())
                .map(|top| OsString::from(String::from_utf8_lossy(top).into_owned()))
                .collect()
        });
    std::fs::read_dir(root)
        .expect("read the repository root")
        .map(|entry| entry.expect("a directory entry").file_name())
        .filter(|name| name != "target")
        .filter(|name| tracked.as_ref().is_none_or(|t| t.contains(name)))
        .collect()
}

/// The target directory this test was built in (where `cargo demo` put
/// `debug/host` and `plugins/`).
fn target_dir() -> PathBuf {
    Path::new(common::host_bin())
        .parent()
        .and_then(Path::parent)
        .expect("the host binary is in <target>/debug")
        .to_path_buf()
}

/// The real `CARGO_HOME` or `RUSTUP_HOME`: the variable, else `~/<dir>`.
fn tool_home(var: &str, dir: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(dir)))
}

/// Pids of the daemons a script started (`host serve --detach` prints
/// `taskhost daemon started (pid N), …` on stderr).
fn daemon_pids(stderr: &str) -> Vec<u32> {
    stderr
        .match_indices("taskhost daemon started (pid ")
        .filter_map(|(at, prefix)| {
            let rest = &stderr[at + prefix.len()..];
            rest[..rest.find(')')?].parse().ok()
        })
        .collect()
}

/// Whether `pid` is a live `host serve`.
fn is_daemon(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmd| cmd.split(|&b| b == 0).any(|arg| arg == b"serve"))
}

fn kill(args: &[&str]) {
    let _ = Command::new("kill")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Runs the `sh` blocks of `file` and fails with the script and its output
/// if they fail.
fn run_doc(file: &str) {
    let root = repo_root();
    let markdown = std::fs::read_to_string(root.join(file))
        .unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let script = script_of(file, &markdown).unwrap_or_else(|e| panic!("{e}"));
    if script.is_empty() {
        return;
    }

    let tmp = tempfile::tempdir().expect("tempdir");
    let cwd = tmp.path().join("repo");
    let home = tmp.path().join("home");
    let state = tmp.path().join("state");
    let tmpdir = tmp.path().join("tmp");
    let socket = tmp.path().join("h.sock");
    for dir in [&cwd, &home, &state, &tmpdir] {
        std::fs::create_dir(dir).expect("create a scratch directory");
    }
    for name in mirrored(&root) {
        std::os::unix::fs::symlink(root.join(&name), cwd.join(&name)).expect("symlink");
    }
    std::os::unix::fs::symlink(target_dir(), cwd.join("target")).expect("symlink target");

    let mut cmd = Command::new("bash");
    cmd.args(["-xeuo", "pipefail", "-c", &script])
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout kills all of it at once.
        .process_group(0);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let cargo = key.starts_with("CARGO") && key != "CARGO_HOME";
        let ours = key.starts_with("TASKHOST_") || key.starts_with("XDG_");
        let rust = ["RUSTFLAGS", "RUSTDOCFLAGS", "RUSTUP_TOOLCHAIN", "RUST_LOG"].contains(&&*key);
        if cargo || ours || rust {
            cmd.env_remove(&*key);
        }
    }
    if let Some(cargo_home) = tool_home("CARGO_HOME", ".cargo") {
        cmd.env("CARGO_HOME", cargo_home);
    }
    if let Some(rustup_home) = tool_home("RUSTUP_HOME", ".rustup") {
        cmd.env("RUSTUP_HOME", rustup_home);
    }
    cmd.env("HOME", &home)
        .env("XDG_STATE_HOME", &state)
        .env("TMPDIR", &tmpdir)
        .env("TASKHOST_SOCKET", &socket)
        .env("TASKHOST_CACHE_DIR", common::cache_dir());

    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn bash");
    let group = child.id();
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read_all(Box::new(child.stderr.take().expect("stderr")));
    let (done_tx, done_rx) = channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(child.wait());
    });
    let timed_out = match done_rx.recv_timeout(LIMIT) {
        Ok(status) => Some(status),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => panic!("lost bash"),
    };
    // Whatever the script left behind in its group (a stray background
    // job) goes too, so the pipes close; on a timeout, this is the script.
    kill(&["-KILL", "--", &format!("-{group}")]);
    let (status, timed_out) = match timed_out {
        Some(status) => (status, false),
        None => (done_rx.recv().expect("bash is reaped"), true),
    };
    let status = status.expect("wait for bash");
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    let took = started.elapsed();

    // No daemon outlives its file.
    if socket.exists() {
        let _ = common::host()
            .args(["shutdown", "--grace", "1s", "--socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for pid in daemon_pids(&stderr) {
        if is_daemon(pid) {
            kill(&["-KILL", &pid.to_string()]);
        }
    }

    let verdict = if timed_out {
        format!("did not finish within {LIMIT:?} and were killed")
    } else if status.success() {
        eprintln!("{file}: its sh blocks ran in {took:.1?}");
        return;
    } else {
        format!("failed ({status})")
    };
    panic!(
        "the sh blocks of {file} {verdict} after {took:.1?}\n\
         --- script (cwd: a mirror of the repository root) ---\n{script}\
         --- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
}

#[test]
fn readme() {
    run_doc("README.md");
}

#[test]
fn docs_cli() {
    run_doc("docs/cli.md");
}

#[test]
fn docs_cluster() {
    run_doc("docs/cluster.md");
}

#[test]
fn docs_daemon() {
    run_doc("docs/daemon.md");
}

#[test]
fn docs_exit_codes() {
    run_doc("docs/exit-codes.md");
}

#[test]
fn docs_c() {
    run_doc("docs/c.md");
}

#[test]
fn docs_javascript() {
    run_doc("docs/javascript.md");
}

#[test]
fn docs_python() {
    run_doc("docs/python.md");
}

#[test]
fn docs_remote() {
    run_doc("docs/remote.md");
}

#[test]
fn docs_replay() {
    run_doc("docs/replay.md");
}

#[test]
fn docs_limits() {
    run_doc("docs/limits.md");
}

#[test]
fn docs_plugins() {
    run_doc("docs/plugins.md");
}

#[test]
fn docs_protocol() {
    run_doc("docs/protocol.md");
}

#[test]
fn docs_semantics() {
    run_doc("docs/semantics.md");
}

#[test]
fn guest_sdk_readme() {
    run_doc("guest-sdk/README.md");
}

/// A new page in `docs/` gets a test here, or this fails.
#[test]
fn every_page_has_a_test() {
    let docs = repo_root().join("docs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&docs).expect("read docs/") {
        let name = entry.expect("an entry").file_name();
        let name = name.to_string_lossy();
        let file = format!("docs/{name}");
        if name.ends_with(".md") && !FILES.contains(&file.as_str()) {
            missing.push(file);
        }
    }
    assert!(
        missing.is_empty(),
        "add a test for {missing:?} to tests/e2e/docs.rs"
    );
}

/// The parser and the rules, on a small example.
#[test]
fn blocks_are_found_and_checked() {
    let md = "text\n\n```sh\nexport PATH=$PWD/target/debug:$PATH\nhost ps\ncargo demo\n```\n\n\
              - item\n\n  ```sh\n  host version\n  ```\n\n```console\n$ host run x\n```\n";
    let script = script_of("x.md", md).expect("runs");
    assert!(script.contains("\nhost ps\n"), "{script}");
    assert!(script.contains("\nhost version\n"), "{script}");
    assert!(
        script.contains("# skipped (it runs this test): cargo demo\n"),
        "{script}"
    );
    assert!(!script.contains("host run x"), "{script}");

    let err = script_of("x.md", "```sh\nhost ps\n```\n").unwrap_err();
    assert!(err.contains("before the file puts it on the PATH"), "{err}");
    let err = script_of("x.md", "```bash\nls\n```\n").unwrap_err();
    assert!(err.contains("a `bash` block"), "{err}");
    assert!(!runs_host("ls target/debug/host"));
    assert!(runs_host("(cd x && host run y)"));
    assert!(runs_host("TASKHOST_SOCKET=$sock host shutdown"));
    assert_eq!(
        daemon_pids("x\ntaskhost daemon started (pid 42), listening on /s; logs in /l\n"),
        vec![42]
    );
}
