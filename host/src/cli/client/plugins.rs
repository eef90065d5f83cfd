//! `host plugins ls|rm|prune`: the plugins the daemon keeps under its state
//! directory, and removing the ones no task needs.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use taskhost::daemon::protocol::PluginRow;
use taskhost::units::{format_duration, format_size};

/// An age for people: `45.0s`, `12m03s`, `5h`, `3d`.
fn age(ms: u64) -> String {
    let hours = ms / 3_600_000;
    match hours {
        0 => format_duration(std::time::Duration::from_millis(ms)),
        1..24 => format!("{hours}h"),
        _ => format!("{}d", hours / 24),
    }
}

use super::super::args::SocketArg;
use super::super::exit;
use super::super::report::{print_json, say};
use super::print_table;

#[derive(Debug, Args)]
pub struct PluginsArgs {
    #[command(subcommand)]
    command: PluginsCommand,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum PluginsCommand {
    /// List the stored plugins: digest, name, size, age, and the tasks that use them.
    ///
    /// UNFINISHED counts queued, running and pausing tasks (they need the
    /// plugin); FINISHED counts finished tasks the store still retains;
    /// LOADED says whether it is compiled in the daemon's memory (bounded by
    /// `host serve --plugin-cache`).
    #[command(after_long_help = "EXAMPLES:\n  host plugins ls\n  host plugins ls --json")]
    Ls(ListArgs),
    /// Delete one stored plugin by its digest or a unique start of it.
    ///
    /// Refused while an unfinished task uses it. A later submission of the
    /// same file uploads it again.
    #[command(after_long_help = "EXAMPLES:\n  host plugins rm 3f9a1c")]
    Rm(RemoveArgs),
    /// Delete every stored plugin no task uses (none unfinished, none
    /// finished and retained), now.
    ///
    /// The daemon also does this by itself for plugins unused for longer
    /// than `host serve --keep-unused-plugins` (default 1h).
    #[command(after_long_help = "EXAMPLES:\n  host plugins prune\n  host plugins prune --json")]
    Prune(ListArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Print JSON: one array of plugins.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct RemoveArgs {
    /// The plugin's digest (as `host plugins ls` shows it), or a unique start of it.
    #[arg(value_name = "DIGEST")]
    digest: String,
    /// Print JSON: the removed plugin.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn plugins(args: PluginsArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    match args.command {
        PluginsCommand::Ls(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let rows = client.plugins().await.map_err(exit::client)?;
            print_rows(&rows, args.json);
        }
        PluginsCommand::Rm(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let rows = client
                .remove_plugins(Some(args.digest))
                .await
                .map_err(exit::client)?;
            report_removed(&rows, args.json);
        }
        PluginsCommand::Prune(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let rows = client.remove_plugins(None).await.map_err(exit::client)?;
            report_removed(&rows, args.json);
        }
    }
    Ok(0)
}

fn report_removed(rows: &[PluginRow], as_json: bool) {
    if as_json {
        print_rows(rows, true);
        return;
    }
    let bytes: u64 = rows.iter().map(|r| r.bytes).sum();
    for row in rows {
        say(&format!(
            "removed {} ({}, {})",
            row.digest,
            row.name.as_deref().unwrap_or("-"),
            format_size(row.bytes)
        ));
    }
    eprintln!(
        "{} plugin(s) removed, {} freed",
        rows.len(),
        format_size(bytes)
    );
}

fn print_rows(rows: &[PluginRow], as_json: bool) {
    if as_json {
        let rows: Vec<_> = rows
            .iter()
            .map(taskhost::daemon::json::plugin_row)
            .collect();
        print_json(&rows);
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.digest.hex()[..12].to_owned(),
                r.name.clone().unwrap_or_else(|| "-".into()),
                format_size(r.bytes),
                age(now.saturating_sub(r.stored_ms)),
                r.unfinished.to_string(),
                r.finished.to_string(),
                if r.loaded { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    print_table(
        &[
            "DIGEST",
            "NAME",
            "SIZE",
            "AGE",
            "UNFINISHED",
            "FINISHED",
            "LOADED",
        ],
        &table,
    );
}
