//! `host deploy`, `host deployments ls|history|rm` and `host rollback`:
//! plugins deployed by name and version, each name's current version
//! what `host submit NAME` runs.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use taskhost::daemon::protocol::{DeploymentRow, DeploymentVerb};

use super::super::args::SocketArg;
use super::super::exit::{self, usage};
use super::super::report::{print_json, say};
use super::print_table;

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// The plugin to deploy: a WebAssembly component file (.wasm), uploaded unless the daemon has it.
    #[arg(value_name = "PLUGIN")]
    plugin: PathBuf,
    /// The deployment's name [default: the plugin's declared name; a WASI command needs one].
    #[arg(long)]
    name: Option<String>,
    /// The version [default: the plugin's declared version]. A version keeps its bytes for good: another build needs another version.
    #[arg(long)]
    version: Option<String>,
    /// Print JSON: the deployment as it is now.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The deployment.
    #[arg(value_name = "NAME")]
    name: String,
    /// The version to make current [default: the one current before the current one].
    #[arg(long, value_name = "VERSION")]
    to: Option<String>,
    /// Print JSON: the deployment as it is now.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
pub struct DeploymentsArgs {
    #[command(subcommand)]
    command: DeploymentsCommand,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum DeploymentsCommand {
    /// List each deployment's current version.
    #[command(after_long_help = "EXAMPLES:\n  host deployments ls\n  host deployments ls --json")]
    Ls(ListArgs),
    /// Show one deployment's deploys, rollbacks and removals, newest first.
    #[command(after_long_help = "EXAMPLES:\n  host deployments history resize")]
    History(HistoryArgs),
    /// Remove a version: refused for the current one and while an unfinished task or a schedule uses it.
    #[command(after_long_help = "EXAMPLES:\n  host deployments rm resize 1.3.2")]
    Rm(RemoveArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Print JSON: one array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct HistoryArgs {
    /// The deployment.
    #[arg(value_name = "NAME")]
    name: String,
    /// Print JSON: one array, newest first.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct RemoveArgs {
    /// The deployment.
    #[arg(value_name = "NAME")]
    name: String,
    /// The version to remove.
    #[arg(value_name = "VERSION")]
    release: String,
    /// Print JSON: the removal.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn deploy(args: DeployArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let shown = args.plugin.display().to_string();
    let bytes = std::fs::read(&args.plugin)
        .map_err(|e| usage(format!("cannot read plugin `{shown}`: {e}")))?;
    taskhost::runtime::check_header(&shown, &bytes).map_err(usage)?;
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let digest = client.ensure_plugin(&bytes).await.map_err(exit::client)?;
    let verb = DeploymentVerb::Deploy {
        digest,
        name: args.name,
        version: args.version,
    };
    let rows = client.deployment(verb).await.map_err(exit::client)?;
    if args.json {
        print_rows(&rows, true);
    } else {
        for row in &rows {
            say(&format!(
                "{}@{} is current ({})",
                row.name, row.version, row.digest
            ));
        }
    }
    Ok(0)
}

pub async fn rollback(args: RollbackArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let verb = DeploymentVerb::Rollback {
        name: args.name,
        to: args.to,
    };
    let rows = client.deployment(verb).await.map_err(exit::client)?;
    if args.json {
        print_rows(&rows, true);
    } else {
        for row in &rows {
            say(&format!(
                "{}@{} is current again ({})",
                row.name, row.version, row.digest
            ));
        }
    }
    Ok(0)
}

pub async fn deployments(
    args: DeploymentsArgs,
    before_verb: Option<PathBuf>,
) -> anyhow::Result<u8> {
    let (socket, verb, json) = match args.command {
        DeploymentsCommand::Ls(a) => (a.socket, DeploymentVerb::List, a.json),
        DeploymentsCommand::History(a) => (a.socket, DeploymentVerb::History(a.name), a.json),
        DeploymentsCommand::Rm(a) => (
            a.socket,
            DeploymentVerb::Remove {
                name: a.name,
                version: a.release,
            },
            a.json,
        ),
    };
    let removing = matches!(verb, DeploymentVerb::Remove { .. });
    let client = super::connect(&socket, before_verb.as_deref()).await?;
    let rows = client.deployment(verb).await.map_err(exit::client)?;
    if removing && !json {
        for row in &rows {
            say(&format!("removed {}@{}", row.name, row.version));
        }
        return Ok(0);
    }
    print_rows(&rows, json);
    Ok(0)
}

fn print_rows(rows: &[DeploymentRow], as_json: bool) {
    if as_json {
        let rows: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "version": r.version,
                    "digest": r.digest.to_string(),
                    "at_ms": r.at_ms,
                    "what": r.what.word(),
                    "versions": r.versions,
                })
            })
            .collect();
        print_json(&rows);
        return;
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.version.clone(),
                r.digest.hex()[..12].to_owned(),
                r.what.word().to_owned(),
                taskhost::daemon::schedule::format_ms(r.at_ms),
            ]
        })
        .collect();
    print_table(&["NAME", "VERSION", "DIGEST", "BY", "AT"], &table);
}
