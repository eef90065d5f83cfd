//! The `host` binary: a thin command-line edge over the `taskhost` library.
//! It parses flags into typed values, turns library errors into one-line
//! messages with a fix, and maps results to the exit codes of the CLI
//! contract. All behaviour lives in the library.

#![forbid(unsafe_code)]
// Doc comments of the CLI are its --help text, where `<plugin name>` is meant
// literally, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

mod cli;

use std::process::ExitCode;

/// jemalloc instead of the system's malloc: the daemon allocates and frees
/// a few dozen small blocks per task from several threads (see the
/// dependency's note in Cargo.toml and BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    cli::main()
}
