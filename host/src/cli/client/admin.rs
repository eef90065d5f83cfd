//! `host shutdown`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use taskhost::daemon::protocol::{Reply, Request};
use taskhost::supervisor::ShutdownReport;
use taskhost::units::parse_duration;

use super::super::args::SocketArg;
use super::super::exit::{self, EXIT_DAEMON, ExitError};
use super::super::report::{print_json, say};

#[derive(Debug, Args)]
pub struct ShutdownArgs {
    /// How long running tasks get to stop before they are force-aborted [default: the daemon's --grace].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Print JSON: whether every task stopped within the grace, and the names of those that did not.
    #[arg(long)]
    json: bool,
    /// End every task and queued submission now (canceled, force-aborted after the grace, or rejected) instead of keeping unfinished work in the store for the next start.
    #[arg(long)]
    cancel_all: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

pub async fn shutdown(args: ShutdownArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let reply = client
        .call(Request::Shutdown {
            grace: args.grace,
            cancel_all: args.cancel_all,
        })
        .await
        .map_err(exit::client)?;
    let Reply::ShutdownDone(report) = reply else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered shutdown with something else",
        ));
    };
    let stuck = match &report {
        ShutdownReport::AllStopped => Vec::new(),
        ShutdownReport::GraceExceeded { stuck } => stuck.clone(),
    };
    if args.json {
        print_json(&taskhost::daemon::json::shutdown(&report));
    } else if stuck.is_empty() {
        eprintln!("daemon shut down: every task stopped within the grace");
    } else {
        say(&format!(
            "daemon shut down: force-aborted after the grace: {}",
            stuck.join(", ")
        ));
    }
    Ok(0)
}
