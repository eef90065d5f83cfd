//! `host ns add|set|rm|ls`: namespaces, each with its weight (its share of
//! the run permits) and its quotas, and what each uses of them.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use taskhost::daemon::json;
use taskhost::daemon::protocol::{NamespaceChange, NamespaceRow, NamespaceVerb, Quota};
use taskhost::units::{format_size, parse_size};

use super::super::args::SocketArg;
use super::super::exit::{self, EXIT_USAGE, ExitError};
use super::super::report::{print_json, say};
use super::print_table;

#[derive(Debug, Args)]
pub struct NsArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Verb {
    /// Add a namespace: its own tasks, names, slots, slot rules, schedules, idempotency keys and slots' buckets, and its share of the run permits.
    ///
    /// Work goes to it with `host --namespace NAME ...`, or from a token of it (a `submit TOKEN NAME` line in the daemon's --http-token-file). Anything of another namespace answers as if it did not exist. The operator's (the socket's owner, or a token of every namespace).
    #[command(
        after_long_help = "EXAMPLES:\n  host ns add alpha --weight 2 --max-waiting 1000\n  host ns add beta --max-submit-rate 50 --memory-ceiling 256MiB\n  host --namespace alpha submit target/plugins/hello.wasm --wait"
    )]
    Add(ChangeArgs),
    /// Change a namespace's weight or quotas (`none` makes a quota unlimited); the next decisions follow it.
    #[command(
        after_long_help = "EXAMPLES:\n  host ns set alpha --weight 3\n  host ns set alpha --max-waiting none"
    )]
    Set(ChangeArgs),
    /// Remove a namespace that holds no unfinished task and no schedule.
    #[command(after_long_help = "EXAMPLES:\n  host ns rm alpha")]
    Rm(RmArgs),
    /// List the namespaces this credential reaches, with each quota and what it uses of it.
    #[command(after_long_help = "EXAMPLES:\n  host ns ls\n  host ns ls --json")]
    Ls(LsArgs),
}

#[derive(Debug, Args)]
struct ChangeArgs {
    /// The namespace: 1 to 63 lowercase letters, digits and dashes (`default` is the one without a name).
    #[arg(value_name = "NAME")]
    name: String,
    /// Its share of the run permits when --max-concurrent is the bottleneck, against the other namespaces' weights [default: 1].
    #[arg(long, value_name = "N")]
    weight: Option<u32>,
    /// Attempts of its tasks running at once (holding a run permit); more wait for one of its own to end. In a cluster: its tasks claimed by any node, between attempts too [default: none].
    #[arg(long, value_name = "N|none")]
    max_running: Option<Limit>,
    /// Tasks accepted and not running (queued, delayed, waiting for a permit or a retry); a submission over it is refused (exit 3) [default: none].
    #[arg(long, value_name = "N|none")]
    max_waiting: Option<Limit>,
    /// Schedules; `host schedule add` over it is refused [default: none].
    #[arg(long, value_name = "N|none")]
    max_schedules: Option<Limit>,
    /// Submissions per second, with a burst of one second's worth; over it a submission is refused (exit 3) [default: none].
    #[arg(long, value_name = "N|none")]
    max_submit_rate: Option<Limit>,
    /// Bytes its guests' key-value buckets (slots' and shared) may hold together, keys and values counted; a write over it fails in the guest, naming it [default: none].
    #[arg(long, value_name = "SIZE|none")]
    max_kv_bytes: Option<SizeLimit>,
    /// The most memory one attempt may ask for (--max-memory); a submission without one gets the daemon's max_memory or this, whichever is less [default: the daemon's memory ceiling].
    #[arg(long, value_name = "SIZE|none")]
    memory_ceiling: Option<SizeLimit>,
    /// Unfinished descendants of one spawn tree (a plugin's children, theirs, ...); a spawn over it fails in the guest, naming it [default: the daemon's --max-descendants].
    #[arg(long, value_name = "N|none")]
    max_descendants: Option<Limit>,
    /// Let its tasks name the daemon's secret NAME (`--secret NAME`); repeat for more. The default namespace may name every secret; any other only those granted.
    #[arg(long, value_name = "NAME")]
    allow_secret: Vec<String>,
    /// Take back a secret granted with --allow-secret; repeat for more.
    #[arg(long, value_name = "NAME")]
    deny_secret: Vec<String>,
    /// Print JSON: the namespace as the verb left it.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct RmArgs {
    /// The namespace.
    #[arg(value_name = "NAME")]
    name: String,
    /// Print JSON: the namespace removed.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct LsArgs {
    /// Print JSON: an array of {"name", "weight", "quotas": {KEY: N}, "usage": {KEY: N}}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

/// A count, or `none` (unlimited).
#[derive(Debug, Clone, Copy)]
struct Limit(Option<u64>);

impl std::str::FromStr for Limit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(Limit(None));
        }
        s.parse::<u64>()
            .map(|n| Limit(Some(n)))
            .map_err(|_| format!("`{s}` is not a count: a whole number, or `none`"))
    }
}

/// A size, or `none` (unlimited).
#[derive(Debug, Clone, Copy)]
struct SizeLimit(Option<u64>);

impl std::str::FromStr for SizeLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "none" {
            return Ok(SizeLimit(None));
        }
        parse_size(s)
            .map(|n| SizeLimit(Some(n)))
            .map_err(|e| format!("{e}, or `none`"))
    }
}

impl ChangeArgs {
    fn change(&self) -> NamespaceChange {
        let mut quotas = Vec::new();
        for (quota, limit) in [
            (Quota::Running, self.max_running),
            (Quota::Waiting, self.max_waiting),
            (Quota::Schedules, self.max_schedules),
            (Quota::SubmitRate, self.max_submit_rate),
            (Quota::Descendants, self.max_descendants),
        ] {
            if let Some(Limit(limit)) = limit {
                quotas.push((quota, limit));
            }
        }
        for (quota, limit) in [
            (Quota::KvBytes, self.max_kv_bytes),
            (Quota::Memory, self.memory_ceiling),
        ] {
            if let Some(SizeLimit(limit)) = limit {
                quotas.push((quota, limit));
            }
        }
        NamespaceChange {
            weight: self.weight,
            quotas,
            allow_secrets: self.allow_secret.clone(),
            deny_secrets: self.deny_secret.clone(),
        }
    }
}

fn value(quota: Quota, n: u64) -> String {
    if quota.is_bytes() {
        format_size(n)
    } else {
        n.to_string()
    }
}

fn describe(row: &NamespaceRow) -> String {
    let mut text = format!("`{}`: weight {}", row.name, row.settings.weight);
    for (quota, limit) in &row.settings.quotas {
        text.push_str(&format!(", {} {}", quota.key(), value(*quota, *limit)));
    }
    if !row.settings.secrets.is_empty() {
        text.push_str(&format!(", secrets {}", row.settings.secrets.join(" ")));
    }
    text
}

pub async fn ns(args: NsArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let (client, verb, json_out, done) = match args.verb {
        Verb::Ls(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let rows = client.namespaces().await.map_err(exit::client)?;
            if args.json {
                print_json(&rows.iter().map(json::namespace).collect::<Vec<_>>());
                return Ok(0);
            }
            let cell = |row: &NamespaceRow, quota: Quota| {
                let used = row.usage.iter().find(|(q, _)| *q == quota).map(|(_, n)| *n);
                let limit = row.settings.limit(quota);
                match (used, limit) {
                    (Some(used), Some(limit)) => {
                        format!("{}/{}", value(quota, used), value(quota, limit))
                    }
                    (Some(used), None) => value(quota, used),
                    (None, Some(limit)) => value(quota, limit),
                    (None, None) => "-".to_owned(),
                }
            };
            let table: Vec<Vec<String>> = rows
                .iter()
                .map(|row| {
                    let mut cells = vec![row.name.clone(), row.settings.weight.to_string()];
                    cells.extend(
                        [
                            Quota::Running,
                            Quota::Waiting,
                            Quota::Schedules,
                            Quota::SubmitRate,
                            Quota::Memory,
                        ]
                        .map(|q| cell(row, q)),
                    );
                    cells
                })
                .collect();
            print_table(
                &[
                    "NAMESPACE",
                    "WEIGHT",
                    "RUNNING",
                    "WAITING",
                    "SCHEDULES",
                    "SUBMIT-RATE",
                    "MEMORY-CEILING",
                ],
                &table,
            );
            return Ok(0);
        }
        Verb::Add(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let verb = NamespaceVerb::Add(args.name.clone(), args.change());
            (client, verb, args.json, "added namespace")
        }
        Verb::Set(args) => {
            let change = args.change();
            if change.weight.is_none()
                && change.quotas.is_empty()
                && change.allow_secrets.is_empty()
                && change.deny_secrets.is_empty()
            {
                return Err(ExitError::error(
                    EXIT_USAGE,
                    "host ns set: give --weight or a quota such as --max-waiting N (see host ns \
                     set --help)"
                        .to_owned(),
                ));
            }
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            (
                client,
                NamespaceVerb::Set(args.name.clone(), change),
                args.json,
                "set namespace",
            )
        }
        Verb::Rm(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            (
                client,
                NamespaceVerb::Remove(args.name),
                args.json,
                "removed namespace",
            )
        }
    };
    let row = client.namespace(verb).await.map_err(exit::client)?;
    if json_out {
        print_json(&json::namespace(&row));
    } else {
        say(&format!("{done} {}", describe(&row)));
    }
    Ok(0)
}
