//! The plugins of `plugins/`, built for `wasm32-wasip2`, for tests and
//! benchmarks.
//!
//! Building this crate (any `cargo build`, `cargo test` or `cargo clippy` of
//! the root workspace that includes it) runs a nested
//! `cargo build --release --target wasm32-wasip2` on `plugins/Cargo.toml`
//! with its own target directory, `target/wasm-plugins`, and copies every
//! component to `target/plugins/<name>.wasm`, where `<name>` is the crate name
//! (`target/plugins/hello.wasm`, `target/plugins/sandbox-probe.wasm`). It
//! needs the target: `rustup target add wasm32-wasip2`.
//!
//! Each plugin has a constant holding the absolute path of its component,
//! named after the crate in SCREAMING_SNAKE_CASE ([`HELLO`],
//! [`SANDBOX_PROBE`], [`NOT_A_TASK`], ...); [`ALL`] lists them and [`path`]
//! looks one up by name:
//!
//! ```
//! let hello = std::fs::read(plugin_artifacts::HELLO).unwrap();
//! assert_eq!(&hello[..8], b"\0asm\x0d\0\x01\0"); // a component, not a core module
//! assert_eq!(plugin_artifacts::path("hello").to_str(), Some(plugin_artifacts::HELLO));
//! ```
//!
//! The plugins (params are the task's `--param K=V`):
//!
//! | name | does |
//! |---|---|
//! | `hello` | returns its input; logs `hello: got N bytes` |
//! | `flaky` | fails (exit code 3) while attempt <= `fail_times` (default 1), then returns `ok after N attempts` |
//! | `spin` | busy-loops forever without calling the host |
//! | `sleeper` | sleeps `ms` (default 1000) in cancellable steps of `step_ms` (default 50) with progress; `slept N ms` or canceled |
//! | `panic` | panics with `message` (default `plugin panicked on purpose`) |
//! | `trap` | `kind=unreachable` (default) or `kind=stack-overflow` |
//! | `oom` | allocates `chunk_mib` (default 1) MiB chunks until allocation fails |
//! | `chatty` | prints `lines` (default 3) lines to stdout and stderr; returns `chatty done` |
//! | `sandbox-probe` | tries file `read`/`write`, env `var`, TCP `port`; returns a JSON report |
//! | `deploy` | resource `deploy/{env}`, policy replace; sleeps `ms` (default 50), then POSTs JSON to `endpoint` (needs `--allow-http`; non-2xx fails): `deployed to <env>`; without `endpoint` a dry run |
//! | `http-get` | declares `network`; fetches `url` (or the input), `method`, `max_redirects`, `timeout_ms`; logs `requesting METHOD URL`; `HTTP <status>` and the body |
//! | `not-a-task` | a component of another world (exports `example:other/greeter`), neither a plugin nor a command: the host must refuse it |
//! | `command-probe` | a WASI command (a plain `main`), by its first argument: `echo ARGS` (argv and stdin to stdout), `exit N`, `spin` (forever), `flood MIB` (to stdout), `cat PATH`, `env NAME` |
//! | `describe-trap` | `describe()` panics: the host must refuse it at load |
//! | `describe-spin` | `describe()` busy-loops forever: refused after the describe time limit |
//! | `describe-huge` | `describe()` returns a 1 MiB name and 100,000 capabilities: refused, naming the limit |
//! | `output-huge` | `run` returns `mib` (default 17) MiB: over the 16 MiB output limit, the attempt fails |
//! | `hog` | opens `path` (default `/data/hog.txt`) again and again (`what=files`, the default) or makes timer pollables (`what=handles`), keeping each, up to `count` (default 100000); a refused open fails it (with `release=PATH`, first logs `holding N open files` and waits until PATH exists): tests the per-attempt caps |
//! | `http-burst` | declares `network`; starts `count` (default 4) GETs to `url` at once, then waits for each: `N: HTTP <status>` lines, or fails with `N: error <code>` for those refused; `header=N` adds an `x-pad` header of N bytes to each |
//! | `pool` | resource `pool/{name}` (`name` required), declares capacity 2 (WIT 0.1.2); sleeps `ms` (default 1000) in cancellable 50 ms steps with progress: `worked N ms` |
//! | `nondet` | reads the clocks, random bytes and insecure seed and answers them as JSON; `kv`, `child=DIGEST`, `trap` (when a random byte is even), `until_cancelled` (random sleeps), `spin`, `fail`: the flight recorder's guest |
//! | `nondet-changed` | `nondet`, reading the wall clock once more: a planted divergence |
//! | `unknown-import` | built with wit-bindgen directly; also imports `example:missing/thing`, which no host provides: refused at load |

#![warn(missing_docs)]

use std::path::PathBuf;

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

/// The path of the component of the plugin called `name` (its crate name, such
/// as `hello` or `sandbox-probe`; underscores are accepted for hyphens).
///
/// # Panics
///
/// If there is no such plugin; the message lists the plugins there are.
pub fn path(name: &str) -> PathBuf {
    let wanted = name.replace('_', "-");
    match ALL.iter().find(|(n, _)| *n == wanted) {
        Some((_, path)) => PathBuf::from(path),
        None => {
            let names: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
            panic!(
                "plugin-artifacts: no plugin called `{name}`; the plugins are: {}. \
                 A new plugin must be a member of plugins/Cargo.toml.",
                names.join(", ")
            )
        }
    }
}

/// `component` with a custom section appended (`name`, then `payload`): the
/// same component to wasmtime, but other bytes, so another digest to the
/// host and another entry in the compilation cache. For tests and benches
/// that need many distinct plugins.
pub fn with_custom_section(component: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    let mut out = component.to_vec();
    out.push(0); // custom section
    leb128(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPONENT_HEADER: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn every_plugin_is_a_component() {
        let expected = [
            "chatty",
            "command-probe",
            "counter",
            "deploy",
            "describe-huge",
            "describe-spin",
            "describe-trap",
            "fanout",
            "flaky",
            "hello",
            "hog",
            "http-burst",
            "http-get",
            "nondet",
            "nondet-changed",
            "not-a-task",
            "oom",
            "output-huge",
            "panic",
            "pool",
            "sandbox-probe",
            "sleeper",
            "spin",
            "trap",
            "unknown-import",
        ];
        let names: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, expected);
        for (name, path) in ALL {
            let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{name}: {path}: {e}"));
            assert!(
                bytes.starts_with(COMPONENT_HEADER),
                "{name} is not a component"
            );
            assert!(
                path.ends_with(&format!("target/plugins/{name}.wasm")),
                "{path}"
            );
        }
    }

    #[test]
    fn path_accepts_hyphens_and_underscores() {
        assert_eq!(path("sandbox-probe"), PathBuf::from(SANDBOX_PROBE));
        assert_eq!(path("sandbox_probe"), PathBuf::from(SANDBOX_PROBE));
    }

    #[test]
    #[should_panic(
        expected = "no plugin called `nope`; the plugins are: chatty, command-probe, counter, deploy"
    )]
    fn path_panics_for_unknown_names() {
        path("nope");
    }
}
