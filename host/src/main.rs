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

fn main() -> ExitCode {
    cli::main()
}
