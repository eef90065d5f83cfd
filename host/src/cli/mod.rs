//! Owns the command line: the clap definitions of every verb, the parsing of
//! units at the edge, and the exit codes (0 completed, 1 failed or fatal,
//! 2 usage or invalid input, 3 rejected, 4 canceled or force-aborted,
//! 5 daemon unreachable).

mod args;
mod inspect;
mod report;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for usage errors and invalid input.
pub const EXIT_USAGE: u8 = 2;

/// Runs WebAssembly task plugins under a supervisor with keyed admission.
///
/// Every task body is a sandboxed WebAssembly component: it sees no files,
/// no environment and no network unless granted, it is limited in memory,
/// and a runaway guest is really stopped (epoch interruption).
#[derive(Debug, Parser)]
#[command(name = "host", version, about, long_about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    global: args::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one task in this process (no daemon), wait, print its outcome.
    ///
    /// The plugin's output bytes go to stdout as they are; the guest's log,
    /// stdout and stderr lines and the summary go to stderr, tagged with the
    /// task name. Ctrl-C asks the task to stop; if it has not stopped after
    /// --grace, or on a second Ctrl-C, it is stopped by force.
    ///
    /// Exit codes: 0 completed, 1 failed or fatal, 2 invalid input,
    /// 4 canceled or force-aborted.
    Run(Box<run::RunArgs>),
    /// Validate a plugin and show what it declares.
    ///
    /// Compiles the component, checks it targets the taskhost:plugin world,
    /// calls its describe() under a small time and memory limit, and prints
    /// its name, version, resource template, default policy and capabilities.
    Inspect(inspect::InspectArgs),
}

/// Parses the command line, runs the verb, returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(&cli.global, *args).await,
            Command::Inspect(args) => inspect::inspect(&cli.global, args).await,
        }
    });
    // Do not wait for stray blocking work (a compile of a plugin we no longer
    // need) on the way out.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(err.downcast_ref::<UsageError>().map_or(1, |_| EXIT_USAGE))
        }
    }
}

/// An error that is the user's input's fault (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Wraps any displayable error as a usage error.
pub fn usage(err: impl std::fmt::Display) -> anyhow::Error {
    anyhow::Error::new(UsageError(err.to_string()))
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

/// Where compiled plugins are cached on disk.
fn cache_dir(global: &args::GlobalArgs) -> Option<PathBuf> {
    if global.no_cache {
        None
    } else {
        global
            .cache_dir
            .clone()
            .or_else(taskhost::runtime::default_cache_dir)
    }
}
