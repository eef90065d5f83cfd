//! `host record export`: a task's attempt's record from the daemon, as a
//! file `host replay FILE` takes anywhere; and the fetch `host replay ID`
//! uses.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use taskhost::daemon::Client;
use taskhost::daemon::protocol::{Reply, Request};
use taskhost::supervisor::TaskRef;

use super::SocketArg;
use crate::cli::exit::{self, usage};

#[derive(Debug, Args)]
pub struct RecordArgs {
    #[command(subcommand)]
    verb: RecordVerb,
}

#[derive(Debug, Subcommand)]
enum RecordVerb {
    /// Write the record of a task's attempt (by default its last) to stdout or --output: replay it on any machine with `host replay FILE --plugin PATH`.
    #[command(
        after_long_help = "EXAMPLES:\n  host record export 42 > 42.rec\n  host record export nightly-report --attempt 2 --output report-2.rec\n  host replay 42.rec --plugin report.wasm"
    )]
    Export(ExportArgs),
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// The task: its id, or its name.
    #[arg(value_name = "ID|NAME")]
    target: String,
    /// Which attempt [default: the last one recorded].
    #[arg(long, value_name = "N")]
    attempt: Option<u32>,
    /// Write the record to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    socket: SocketArg,
}

/// The record file of attempt `attempt` (none: the last) of `target`.
pub async fn fetch(client: &Client, target: &str, attempt: Option<u32>) -> anyhow::Result<Vec<u8>> {
    let mut replies = client
        .request(Request::Record {
            target: TaskRef::parse(target),
            attempt,
        })
        .await
        .map_err(exit::client)?;
    let mut bytes = Vec::new();
    loop {
        match replies.next_reply().await.map_err(exit::client)? {
            Reply::RecordPart(part) => bytes.extend_from_slice(&part),
            Reply::End => return Ok(bytes),
            other => anyhow::bail!("the daemon answered a record request with {other:?}"),
        }
    }
}

pub async fn record(args: RecordArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let RecordVerb::Export(args) = args.verb;
    if args.output.is_none() && std::io::stdout().is_terminal() {
        return Err(usage(format!(
            "a record is binary: send it to a file, `host record export {} > {}.rec` (or --output FILE)",
            args.target, args.target
        )));
    }
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let bytes = fetch(&client, &args.target, args.attempt).await?;
    match &args.output {
        Some(path) => {
            let tmp = path.with_extension("record-partial");
            std::fs::write(&tmp, &bytes)
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(|e| anyhow::anyhow!("cannot write `{}`: {e}", path.display()))?;
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)
                .and_then(|()| out.flush())
                .map_err(|e| anyhow::anyhow!("cannot write the record to stdout: {e}"))?;
        }
    }
    Ok(0)
}
