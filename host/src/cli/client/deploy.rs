//! `host deploy`, `host deployments ls|history|rm` and `host rollback`:
//! plugins deployed by name and version, each name's current version
//! what `host submit NAME` runs.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use taskhost::daemon::Client;
use taskhost::daemon::protocol::{DeploymentRow, DeploymentVerb, EventWhat};
use taskhost::runtime::Digest;

use super::oci::{self, RegistryArgs};

use super::super::args::SocketArg;
use super::super::exit::{self, usage};
use super::super::report::{print_json, say};
use super::print_table;

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// The plugin to deploy: a WebAssembly component file (.wasm), or one in an OCI registry (oci://REGISTRY/REPOSITORY:TAG or @sha256:DIGEST), uploaded unless the daemon has it.
    #[arg(value_name = "PLUGIN")]
    plugin: String,
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
    registry: RegistryArgs,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// What to publish: a deployment (NAME, its current version, or NAME@VERSION) or a WebAssembly component file (.wasm).
    #[arg(value_name = "SOURCE")]
    source: String,
    /// Where: oci://REGISTRY/REPOSITORY:TAG.
    #[arg(value_name = "DESTINATION")]
    destination: String,
    #[command(flatten)]
    registry: RegistryArgs,
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
    let shown = args.plugin.as_str();
    let bytes = match oci::reference(shown) {
        Some(reference) => oci::pull(&args.registry, &reference?).await?,
        None => {
            std::fs::read(shown).map_err(|e| usage(format!("cannot read plugin `{shown}`: {e}")))?
        }
    };
    taskhost::runtime::check_header(shown, &bytes).map_err(usage)?;
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

pub async fn push(args: PushArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let destination = oci::reference(&args.destination).ok_or_else(|| {
        usage(format!(
            "`{}` is not a registry reference: give oci://REGISTRY/REPOSITORY:TAG",
            args.destination
        ))
    })??;
    let source = args.source.as_str();
    let file = Path::new(source);
    let bytes = if source.ends_with(".wasm") || file.is_file() {
        std::fs::read(file).map_err(|e| usage(format!("cannot read plugin `{source}`: {e}")))?
    } else {
        let client = super::connect(&args.socket, before_verb.as_deref()).await?;
        let digest = deployed_digest(&client, source).await?;
        client.download(digest).await.map_err(exit::client)?
    };
    taskhost::runtime::check_header(source, &bytes).map_err(usage)?;
    let digest = oci::push(&args.registry, &destination, bytes).await?;
    say(&format!("pushed {source} to {}@{digest}", args.destination));
    Ok(0)
}

/// The digest of deployment `NAME` (its current version) or
/// `NAME@VERSION`.
async fn deployed_digest(client: &Client, source: &str) -> anyhow::Result<Digest> {
    let (name, version) = match source.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (source, None),
    };
    let not_found = |what: String| {
        exit::ExitError::error(
            exit::EXIT_USAGE,
            format!("{what}: `host deployments ls` lists the deployments (or give a .wasm file)"),
        )
    };
    let Some(version) = version else {
        let rows = client
            .deployment(DeploymentVerb::List)
            .await
            .map_err(exit::client)?;
        return rows
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.digest)
            .ok_or_else(|| not_found(format!("no deployment `{name}` and no file of that name")));
    };
    let rows = client
        .deployment(DeploymentVerb::History(name.to_owned()))
        .await
        .map_err(exit::client)?;
    match rows.iter().find(|r| r.version == version) {
        Some(row) if row.what != EventWhat::Remove => Ok(row.digest),
        _ => Err(not_found(format!(
            "deployment `{name}` has no version {version}"
        ))),
    }
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
            .map(taskhost::daemon::json::deployment)
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
