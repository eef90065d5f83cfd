//! A corpus of bad plugins against ONE live daemon: each gets a clear
//! one-line error (exit 2 for a plugin that does not load, naming the
//! problem; exit 1 with a reason naming the limit for a guest that exhausts
//! something), and after each one the daemon still serves
//! `host submit hello.wasm --wait`. The corpus: broken files (truncated,
//! garbage, empty, text, a core module, an unknown layer), components of
//! another world, with an import we do not provide, or built against another
//! version of our WIT package or of WASI, `describe`s that trap,
//! spin or return absurd sizes, and `run`s that return too much output or
//! exhaust memory, stack, tables or time.

use crate::{common, daemon};

use std::path::PathBuf;

use daemon::{Daemon, p};

/// What a bad plugin must produce.
struct Case {
    what: &'static str,
    file: String,
    flags: Vec<&'static str>,
    code: i32,
    /// Substrings the one line must contain.
    says: Vec<&'static str>,
}

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

/// The hand-written `table-grow` component, assembled from its text.
fn table_grow(dir: &std::path::Path) -> String {
    let wat = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/plugins/table-grow.wat");
    let bytes = wat::parse_file(wat).expect("table-grow.wat assembles");
    write(dir, "table-grow.wasm", &bytes)
}

fn corpus(dir: &std::path::Path) -> Vec<Case> {
    let hello = std::fs::read(common::plugin("hello")).unwrap();
    let mut garbage = vec![0u8; 4096];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in &mut garbage {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let load = |what, file, says| Case {
        what,
        file,
        flags: Vec::new(),
        code: 2,
        says,
    };
    let run = |what, file, flags, says| Case {
        what,
        file,
        flags,
        code: 1,
        says,
    };
    vec![
        load(
            "truncated component",
            write(dir, "truncated.wasm", &hello[..hello.len() / 2]),
            vec!["is not a valid component"],
        ),
        load(
            "garbage bytes",
            write(dir, "garbage.wasm", &garbage),
            vec!["not a WebAssembly component", "magic bytes"],
        ),
        load(
            "empty file",
            write(dir, "empty.wasm", b""),
            vec!["the file is empty"],
        ),
        load(
            "WebAssembly text",
            write(dir, "text.wasm", b"(component)"),
            vec!["looks like WebAssembly text"],
        ),
        load(
            "core module",
            write(dir, "core.wasm", b"\0asm\x01\0\0\0"),
            vec![
                "is a core WebAssembly module, not a component",
                "wasm32-wasip2",
            ],
        ),
        load(
            "unknown layer",
            write(dir, "layer.wasm", b"\0asm\x0d\0\x02\0"),
            vec!["unknown WebAssembly layer/version"],
        ),
        load(
            "component of another world",
            p("not-a-task"),
            vec!["is a component but not a task plugin", "describe` and `run"],
        ),
        load(
            "an import we do not provide",
            p("unknown-import"),
            vec!["does not provide", "example:missing/thing@0.1.0"],
        ),
        load(
            "built against another version of the WIT package",
            write(
                dir,
                "other-version.wasm",
                &common::renamed(
                    &common::renamed(&hello, b"plugin/host@0.1.2", b"plugin/host@0.2.0"),
                    b"plugin/types@0.1.2",
                    b"plugin/types@0.2.0",
                ),
            ),
            vec![
                "@0.2.0` but this host provides taskhost:plugin@0.1.2",
                "rebuild the plugin against taskhost:plugin@0.1.2",
            ],
        ),
        load(
            "built for another WASI release",
            write(
                dir,
                "wasi-03.wasm",
                &common::renamed(&hello, b"wasi:cli/stdout@0.2.12", b"wasi:cli/stdout@0.3.12"),
            ),
            vec![
                "imports `wasi:cli/stdout@0.3.12`",
                "this host provides WASI 0.2",
            ],
        ),
        load(
            "describe traps",
            p("describe-trap"),
            vec!["describe() failed", "describe panics on purpose"],
        ),
        load(
            "describe spins",
            p("describe-spin"),
            vec!["describe() did not answer within 2000ms"],
        ),
        load(
            "describe returns absurd sizes",
            p("describe-huge"),
            vec!["returned a name of 1048576 bytes; the limit is 128"],
        ),
        run(
            "output over the limit",
            p("output-huge"),
            vec![],
            vec!["returned 17MiB of output; the limit is 16MiB"],
        ),
        run(
            "memory exhaustion",
            p("oom"),
            vec!["--max-memory", "32MiB"],
            vec!["hit its memory limit of 32MiB"],
        ),
        run(
            "stack exhaustion",
            p("trap"),
            vec!["--param", "kind=stack-overflow"],
            vec!["stack overflow"],
        ),
        run(
            "table exhaustion",
            table_grow(dir),
            vec![],
            vec!["table.grow failed", "table limit of"],
        ),
        run(
            "a loop that never ends",
            p("spin"),
            vec!["--timeout", "300ms"],
            vec!["timed out after 300.0ms"],
        ),
        run(
            "a trap",
            p("trap"),
            vec![],
            vec!["the guest trapped", "unreachable"],
        ),
        run(
            "a panic",
            p("panic"),
            vec![],
            vec!["plugin panicked on purpose"],
        ),
    ]
}

#[test]
fn every_bad_plugin_gets_a_clear_error_and_the_daemon_keeps_serving() {
    let mut d = Daemon::start(&["--grace", "2s"]);
    let files = tempfile::tempdir().unwrap();
    let cases = corpus(files.path());
    d.assert_served("before");
    for case in &cases {
        let mut args = vec!["submit", case.file.as_str(), "--wait"];
        args.extend(case.flags.iter().copied());
        let out = d.run(&args);
        let what = case.what;
        assert_eq!(
            out.code,
            Some(case.code),
            "{what}: exit code; stderr {:?}",
            out.stderr
        );
        assert_eq!(out.stdout, "", "{what}: nothing on stdout");
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: one line, got {lines:?}");
        for needle in &case.says {
            assert!(
                lines[0].contains(needle),
                "{what}: {needle:?} in {:?}",
                lines[0]
            );
        }
        if case.code == 2 {
            assert!(lines[0].starts_with("error: "), "{what}: {:?}", lines[0]);
        }
        d.assert_served(what);
    }
    // Nothing leaked: no task or slot is left behind.
    let ps = d.run(&["ps", "--json"]);
    assert_eq!(ps.stdout.trim(), "[]", "{}", ps.stdout);
    let slots = d.run(&["slots", "--json"]);
    assert_eq!(slots.stdout.trim(), "[]", "{}", slots.stdout);
    eprintln!("bad plugins tried: {}", cases.len());
}
