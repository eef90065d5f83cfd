//! `host kv ls|get|rm`: the key-value state guests keep through
//! `wasi:keyvalue`, a slot's own bucket or a shared one.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use taskhost::daemon::protocol::{KvTarget, KvVerb};

use super::super::args::{RawArg, SocketArg};
use super::super::exit::{self, EXIT_USAGE, ExitError};
use super::super::report::{print_json, print_output, say};
use super::print_table;

#[derive(Debug, Args)]
pub struct KvArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Verb {
    /// List the buckets with their keys and bytes; with a SLOT, its keys and the size of each value.
    #[command(
        after_long_help = "EXAMPLES:\n  host kv ls\n  host kv ls deploy/prod\n  host kv ls --shared counters --json"
    )]
    Ls(LsArgs),
    /// Print a key's value (its bytes, as stored; on a terminal shown as text unless --raw) on stdout; exit 2 when there is none.
    #[command(after_long_help = "EXAMPLES:\n  host kv get deploy/prod last-version")]
    Get(GetArgs),
    /// Remove a key (whoever owns the slot sees it gone at its next read).
    #[command(after_long_help = "EXAMPLES:\n  host kv rm deploy/prod last-version")]
    Rm(KeyArgs),
}

#[derive(Debug, Args)]
struct LsArgs {
    /// A slot whose bucket to list [default: every bucket].
    #[arg(value_name = "SLOT")]
    slot: Option<String>,
    /// SLOT is a shared bucket's name (granted with submit --kv), not a slot.
    #[arg(long)]
    shared: bool,
    /// Print JSON: an array of {"name", "keys", "bytes"}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct GetArgs {
    #[command(flatten)]
    key: KeyArgs,
    #[command(flatten)]
    raw: RawArg,
}

#[derive(Debug, Args)]
struct KeyArgs {
    /// The slot whose bucket holds the key.
    #[arg(value_name = "SLOT")]
    slot: String,
    /// The key.
    #[arg(value_name = "KEY")]
    key: String,
    /// SLOT is a shared bucket's name (granted with submit --kv), not a slot.
    #[arg(long)]
    shared: bool,
    #[command(flatten)]
    socket: SocketArg,
}

fn target(name: String, shared: bool) -> KvTarget {
    if shared {
        KvTarget::Shared(name)
    } else {
        KvTarget::Slot(name)
    }
}

fn shown(target: &KvTarget) -> String {
    match target {
        KvTarget::Slot(name) => format!("slot `{name}`"),
        KvTarget::Shared(name) => format!("shared bucket `{name}`"),
    }
}

pub async fn kv(args: KvArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    match args.verb {
        Verb::Ls(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let target = args.slot.map(|s| target(s, args.shared));
            let keys = target.is_some();
            let rows = client.kv_list(target).await.map_err(exit::client)?;
            if args.json {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|r| serde_json::json!({"name": r.name, "keys": r.keys, "bytes": r.bytes}))
                    .collect();
                print_json(&rows);
            } else if rows.is_empty() {
                eprintln!("no key-value state");
            } else if keys {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| vec![r.name.clone(), r.bytes.to_string()])
                    .collect();
                print_table(&["KEY", "BYTES"], &table);
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| vec![r.name.clone(), r.keys.to_string(), r.bytes.to_string()])
                    .collect();
                print_table(&["BUCKET", "KEYS", "BYTES"], &table);
            }
            Ok(0)
        }
        Verb::Get(GetArgs { key: args, raw }) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let target = target(args.slot, args.shared);
            let what = shown(&target);
            let value = client
                .kv_value(KvVerb::Get(target, args.key.clone()))
                .await
                .map_err(exit::client)?;
            let Some(value) = value else {
                return Err(ExitError::error(
                    EXIT_USAGE,
                    format!("no key `{}` in {what} (list them: host kv ls)", args.key),
                ));
            };
            print_output(&value, raw.raw);
            Ok(0)
        }
        Verb::Rm(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let target = target(args.slot, args.shared);
            let what = shown(&target);
            let old = client
                .kv_value(KvVerb::Remove(target, args.key.clone()))
                .await
                .map_err(exit::client)?;
            match old {
                Some(_) => say(&format!("removed `{}` from {what}", args.key)),
                None => say(&format!("no key `{}` in {what}: nothing removed", args.key)),
            }
            Ok(0)
        }
    }
}
