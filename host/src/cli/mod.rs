//! Owns the command line: the clap definitions of every verb, the parsing of
//! units at the edge, and the exit codes (0 completed, 1 failed or fatal,
//! 2 usage or invalid input, 3 rejected, 4 canceled or force-aborted,
//! 5 daemon unreachable).

mod args;
mod client;
mod daemon;
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
    /// Run the daemon in the foreground: supervisor and controller behind a
    /// Unix socket only its owner can use.
    ///
    /// Logs go to stderr (RUST_LOG filters them). SIGINT, SIGTERM or
    /// `host shutdown` stop it gracefully: running tasks get the grace, then
    /// are force-aborted; queued work is rejected; the socket is removed.
    Serve(Box<daemon::ServeArgs>),
    /// Send one task to the daemon; prints its id (or, with --wait, its result).
    ///
    /// The plugin is uploaded once per daemon (by content digest). The slot
    /// is --slot, else the plugin's resource filled from --param, else the
    /// task name. Exit codes with --wait: as `host run`; 3 when rejected.
    Submit(Box<daemon::SubmitArgs>),
    /// Wait for a task's final outcome and print it (exit code by outcome).
    Wait(daemon::TargetArgs),
    /// Stop a task (queued work is removed) and wait until it has ended.
    Cancel(daemon::TargetArgs),
    /// Ask a task to stop (queued work is removed) without waiting.
    Remove(daemon::TargetArgs),
    /// List the daemon's live tasks, queued ones included.
    Ps(daemon::ListArgs),
    /// Show the controller's slots: state, owner, queue depth, time in state.
    Slots(daemon::ListArgs),
    /// Print the daemon's recent events; --follow keeps streaming.
    Events(daemon::EventsArgs),
    /// Print a task's guest output and log lines; --follow keeps streaming.
    Logs(daemon::LogsArgs),
    /// Shut the daemon down gracefully.
    Shutdown(daemon::ShutdownArgs),
}

/// Parses the command line, runs the verb, returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let json_logs =
        matches!(&cli.command, Command::Serve(a) if a.log_format == daemon::LogFormat::Json);
    let default_level = if matches!(cli.command, Command::Serve(_)) {
        "info"
    } else {
        "warn"
    };
    init_tracing(default_level, json_logs);
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
            Command::Serve(args) => daemon::serve_cmd(*args).await,
            Command::Submit(args) => daemon::submit(*args).await,
            Command::Wait(args) => daemon::wait(args).await,
            Command::Cancel(args) => daemon::cancel(args, true).await,
            Command::Remove(args) => daemon::cancel(args, false).await,
            Command::Ps(args) => daemon::ps(args).await,
            Command::Slots(args) => daemon::slots(args).await,
            Command::Events(args) => daemon::events(args).await,
            Command::Logs(args) => daemon::logs(args).await,
            Command::Shutdown(args) => daemon::shutdown(args).await,
        }
    });
    // Do not wait for stray blocking work (a compile of a plugin we no longer
    // need) on the way out.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(err.downcast_ref::<ExitError>().map_or(1, |e| e.code))
        }
    }
}

/// An error with the exit code it means (2 for the user's input, 5 for the
/// daemon, ...).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExitError {
    code: u8,
    message: String,
}

impl ExitError {
    /// An error that exits with `code`.
    pub fn error(code: u8, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Self {
            code,
            message: message.into(),
        })
    }
}

/// Wraps any displayable error as a usage error (exit code 2).
pub fn usage(err: impl std::fmt::Display) -> anyhow::Error {
    ExitError::error(EXIT_USAGE, err.to_string())
}

fn init_tracing(default_level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
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
