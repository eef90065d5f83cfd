//! `host slot set|unset|ls`: the operator's rules of slots, by exact name
//! or glob pattern (how many owners the slots may hold at once, how many
//! submissions may wait in each).

use std::path::PathBuf;

use std::time::Duration;

use clap::{Args, Subcommand};
use taskhost::daemon::json;
use taskhost::daemon::protocol::{SlotRuleRow, SlotRuleVerb};
use taskhost::units::{format_duration, parse_duration};
use taskhost_core::slot_settings::{Rate, SlotSettings};

use super::super::args::SocketArg;
use super::super::exit::{self, EXIT_USAGE, ExitError};
use super::super::report::{print_json, say};
use super::print_table;

#[derive(Debug, Args)]
pub struct SlotArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Verb {
    /// Set the rule of a slot or of a pattern of slots (replacing the rule it had); the next admission decision follows it.
    ///
    /// A slot takes the rule that names it exactly, else the longest pattern that matches it (`*` any run of characters, `/` included; `?` one character). A larger capacity admits waiting work at once; a smaller one stops no owner, and admits none until fewer than it are left. Rules are kept in the store and survive restarts.
    #[command(
        after_long_help = "EXAMPLES:\n  host slot set 'db/*' --capacity 4\n  host slot set db/main --capacity 1 --max-queue 10\n  host slot set '*' --max-queue 20"
    )]
    Set(SetArgs),
    /// Remove the rule of a pattern (exactly as it was set); its slots take the next rule that matches, or the defaults.
    #[command(after_long_help = "EXAMPLES:\n  host slot unset 'db/*'")]
    Unset(UnsetArgs),
    /// List the rules, by pattern.
    #[command(after_long_help = "EXAMPLES:\n  host slot ls\n  host slot ls --json")]
    Ls(LsArgs),
}

#[derive(Debug, Args)]
struct SetArgs {
    /// A slot's name, or a glob pattern of names (quote it in a shell).
    #[arg(value_name = "PATTERN")]
    pattern: String,
    /// Owners the slot may hold at once: a Queue submission takes a free place or waits, drop-if-running takes one or is rejected, Replace takes one or stops the oldest owner [default: 1].
    #[arg(long, value_name = "N")]
    capacity: Option<u32>,
    /// Submissions that may wait in the slot, a replacement head counted; past it a Queue submission is rejected (QueueFull) [default: the daemon's --max-slot-queue].
    #[arg(long, value_name = "N")]
    max_queue: Option<usize>,
    /// A submission to the slot waits this long before it is placed; a newer one in that time takes its place (the older ends rejected, SupersededByReplace, naming it) and waits again [default: none].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    debounce: Option<Duration>,
    /// With --debounce: a run of superseding submissions is placed this long after its first at the latest [default: no bound].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    max_wait: Option<Duration>,
    /// Attempts of the slot's tasks that may start per period, STARTS/PERIOD such as 100/s or 5/10s; a restart or a retry is a start too. A task whose start the rate does not allow yet is `throttled` (holding no --max-concurrent permit) until it does [default: none].
    #[arg(long, value_name = "RATE")]
    rate: Option<Rate>,
    /// With --rate: starts the slot may make beyond the rate's pace; in any window of the period at most STARTS + BURST start [default: 0].
    #[arg(long, value_name = "N")]
    burst: Option<u32>,
    /// Print JSON: the rule as set.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct UnsetArgs {
    /// The pattern, exactly as it was set.
    #[arg(value_name = "PATTERN")]
    pattern: String,
    /// Print JSON: the rule removed.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
struct LsArgs {
    /// Print JSON: an array of {"pattern", "capacity", "max_queue", "debounce_ms", "max_wait_ms", "rate", "burst"}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

fn shown(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn describe(row: &SlotRuleRow) -> String {
    let settings = &row.settings;
    let mut text = format!(
        "`{}`: capacity {}, max queue {}",
        row.pattern,
        settings.capacity.unwrap_or(1),
        settings
            .max_queue
            .map_or_else(|| "the daemon's".to_owned(), |q| q.to_string())
    );
    if let Some(debounce) = settings.debounce {
        text.push_str(&format!(", debounce {}", format_duration(debounce)));
    }
    if let Some(most) = settings.max_wait {
        text.push_str(&format!(
            " (at most {} after the first)",
            format_duration(most)
        ));
    }
    if let Some(rate) = settings.rate {
        let burst = settings.burst.unwrap_or(0);
        text.push_str(&format!(", rate {rate} (burst {burst})"));
    }
    text
}

pub async fn slot(args: SlotArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    match args.verb {
        Verb::Set(args) => {
            if args.capacity.is_none()
                && args.max_queue.is_none()
                && args.debounce.is_none()
                && args.max_wait.is_none()
                && args.rate.is_none()
                && args.burst.is_none()
            {
                return Err(ExitError::error(
                    EXIT_USAGE,
                    "host slot set: give --capacity, --max-queue, --debounce or --rate (or remove the rule: host slot unset PATTERN)"
                        .to_owned(),
                ));
            }
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let row = SlotRuleRow {
                pattern: args.pattern,
                settings: SlotSettings {
                    capacity: args.capacity,
                    max_queue: args.max_queue,
                    debounce: args.debounce,
                    max_wait: args.max_wait,
                    rate: args.rate,
                    burst: args.burst,
                },
            };
            let row = client
                .slot_rule(SlotRuleVerb::Set(row))
                .await
                .map_err(exit::client)?;
            if args.json {
                print_json(&json::slot_rule(&row));
            } else {
                say(&format!("set slot rule {}", describe(&row)));
            }
            Ok(0)
        }
        Verb::Unset(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let row = client
                .slot_rule(SlotRuleVerb::Unset(args.pattern))
                .await
                .map_err(exit::client)?;
            if args.json {
                print_json(&json::slot_rule(&row));
            } else {
                say(&format!("removed slot rule {}", describe(&row)));
            }
            Ok(0)
        }
        Verb::Ls(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let rows = client.slot_rules().await.map_err(exit::client)?;
            if args.json {
                print_json(&rows.iter().map(json::slot_rule).collect::<Vec<_>>());
            } else if rows.is_empty() {
                eprintln!("no slot rules (set one: host slot set PATTERN --capacity N)");
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.pattern.clone(),
                            shown(r.settings.capacity),
                            shown(r.settings.max_queue),
                            shown(r.settings.debounce.map(format_duration)),
                            shown(r.settings.max_wait.map(format_duration)),
                            shown(r.settings.rate),
                            shown(r.settings.burst),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "PATTERN",
                        "CAPACITY",
                        "MAX-QUEUE",
                        "DEBOUNCE",
                        "MAX-WAIT",
                        "RATE",
                        "BURST",
                    ],
                    &table,
                );
            }
            Ok(0)
        }
    }
}
