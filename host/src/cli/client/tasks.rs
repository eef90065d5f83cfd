//! `host wait`, `host cancel`, `host remove`, `host ps` and `host slots`.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use taskhost::daemon::json;
use taskhost::daemon::protocol::{Reply, Request, TaskPage};
use taskhost::supervisor::{TaskId, TaskRef};
use taskhost::units::format_duration;

use super::super::args::{RawArg, SocketArg};
use super::super::exit::{self, EXIT_DAEMON, ExitError};
use super::super::report::{print_json, progress_text, say, summary};
use super::print_table;
use super::submit::{Shown, finish, wait_for};

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// The task: its id, or its name (a name means the live task holding it, else the newest finished one).
    #[arg(value_name = "ID|NAME")]
    target: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    raw: RawArg,
}

#[derive(Debug, Args)]
pub struct RerunArgs {
    /// The task whose request to submit again: its id, or its name.
    #[arg(
        value_name = "ID|NAME",
        required_unless_present = "filter",
        conflicts_with = "filter"
    )]
    target: Option<String>,
    /// Every finished task that matches instead of one (of those `host ps --all` lists), each submitted again as it would be alone, in one call: outcome=OUTCOME (failed, fatal, canceled, force-aborted, panicked, rejected, completed), slot=GLOB, name=GLOB, plugin=NAME, since=TIME and until=TIME (submitted in that range: RFC 3339, or a duration ago such as 2h); repeat it or separate with commas, all must hold. Prints how many it submitted.
    #[arg(
        long,
        value_name = "KEY=VALUE",
        value_delimiter = ',',
        conflicts_with = "wait"
    )]
    filter: Vec<String>,
    /// With --filter: submit nothing, print the ids that match (the newest 1,000) and their count.
    #[arg(long, requires = "filter")]
    dry_run: bool,
    /// Wait for the new task's final outcome and print it (exit code by outcome).
    #[arg(long)]
    wait: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    raw: RawArg,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// `host rerun`: a new task with the request of a finished (or any) one.
pub async fn rerun(args: RerunArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let Some(target) = &args.target else {
        let filter = super::bulk::task_filter(&args.filter)?;
        let request = Request::RerunMatching {
            filter,
            dry_run: args.dry_run,
        };
        return super::bulk::by_filter(&client, request, args.dry_run, args.json).await;
    };
    let submitted = client
        .rerun(TaskRef::parse(target))
        .await
        .map_err(exit::client)?;
    let shown = Shown {
        json: args.json,
        raw: args.raw.raw,
    };
    super::submit::answer(&client, submitted, args.wait, shown).await
}

pub async fn wait(args: WaitArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let WaitArgs { target: args, raw } = args;
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let live = !args.json && std::io::stderr().is_terminal();
    let report = wait_for(&client, TaskRef::parse(&args.target), live).await?;
    let shown = Shown {
        json: args.json,
        raw: raw.raw,
    };
    finish(&report, shown)
}

/// `cancel` (waits for the end) and `remove` (does not).
#[derive(Debug, Args)]
pub struct StopArgs {
    /// The task: its id, or its name (a name means the live task holding it, else the newest finished one).
    #[arg(
        value_name = "ID|NAME",
        required_unless_present = "filter",
        conflicts_with = "filter"
    )]
    target: Option<String>,
    /// Every live task that matches instead of one, each stopped as it would be alone (queued work removed) without waiting for their ends: state=STATE (as `host ps` shows it: queued, running, waiting, ...), slot=GLOB, name=GLOB (`*` any run, `?` one character), plugin=NAME, since=TIME and until=TIME (submitted in that range: RFC 3339, or a duration ago such as 2h); repeat it or separate with commas, all must hold. Prints how many it stopped.
    #[arg(long, value_name = "KEY=VALUE", value_delimiter = ',')]
    filter: Vec<String>,
    /// With --filter: stop nothing, print the ids that match (the newest 1,000) and their count.
    #[arg(long, requires = "filter")]
    dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

pub async fn cancel(
    args: StopArgs,
    wait: bool,
    before_verb: Option<PathBuf>,
) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let Some(target) = args.target.clone() else {
        let filter = super::bulk::task_filter(&args.filter)?;
        let request = Request::CancelMatching {
            filter,
            dry_run: args.dry_run,
        };
        return super::bulk::by_filter(&client, request, args.dry_run, args.json).await;
    };
    let args = TargetArgs {
        target,
        json: args.json,
        socket: args.socket,
    };
    let target = TaskRef::parse(&args.target);
    let Reply::Canceled { claimed, report } = client
        .call(Request::Cancel { target, wait })
        .await
        .map_err(exit::client)?
    else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered a cancel with something else",
        ));
    };
    if args.json {
        print_json(&json::canceled(claimed, report.as_ref()));
    } else {
        say(&match (&report, claimed) {
            (Some(r), true) => summary(r),
            (Some(r), false) => format!(
                "{} was already stopping or finished: {}",
                args.target,
                summary(r)
            ),
            (None, true) => format!("stop requested for {}", args.target),
            (None, false) => format!("{} is already stopping or finished", args.target),
        });
    }
    Ok(if claimed { 0 } else { 1 })
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Also list recently finished tasks (the daemon remembers the last 10,000).
    #[arg(long, short)]
    all: bool,
    /// Only the tasks that match, newest first: state=STATE, slot=GLOB, name=GLOB (`*` any run, `?` one character), plugin=NAME, outcome=OUTCOME (finished ones: failed, canceled, ...), since=TIME and until=TIME (submitted in that range: RFC 3339, or a duration ago such as 2h); repeat it or separate with commas, all must hold.
    #[arg(long, value_name = "KEY=VALUE", value_delimiter = ',')]
    filter: Vec<String>,
    /// At most N tasks, newest first; the last one's id is the --before of the next page.
    #[arg(long, value_name = "N")]
    limit: Option<u32>,
    /// Only tasks older than this id (the cursor: the last id of the page before), newest first.
    #[arg(long, value_name = "ID")]
    before: Option<u64>,
    /// Print JSON: one array of rows.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

pub async fn ps(args: PsArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let paged = !args.filter.is_empty() || args.limit.is_some() || args.before.is_some();
    let tasks = if paged {
        let page = TaskPage {
            all: args.all,
            filter: super::bulk::task_filter(&args.filter)?,
            before: args.before.map(TaskId::from_u64),
            limit: args.limit,
        };
        client.page(page).await.map_err(exit::client)?
    } else {
        client.list(args.all).await.map_err(exit::client)?
    };
    if let (Some(limit), Some(last)) = (args.limit, tasks.last())
        && tasks.len() == limit as usize
        && !args.json
    {
        say(&format!("more may follow: --before {}", last.id));
    }
    if args.json {
        let rows: Vec<_> = tasks.iter().map(json::task_row).collect();
        print_json(&rows);
        return Ok(0);
    }
    if tasks.is_empty() && paged {
        eprintln!("no task matches");
    } else if tasks.is_empty() && !args.all {
        eprintln!("no live tasks (finished ones: host ps --all)");
    }
    let clustered = tasks.iter().any(|t| t.node.is_some());
    let due = tasks.iter().any(|t| t.due_ms.is_some());
    let children = tasks.iter().any(|t| t.parent.is_some());
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let state = match t.outcome {
                Some(outcome) => format!("{} ({outcome})", t.state.as_str()),
                None => t.state.as_str().to_owned(),
            };
            let mut row = vec![
                t.id.to_string(),
                t.name.clone(),
                t.slot.clone(),
                state,
                t.attempts.to_string(),
                format_duration(t.age),
                t.progress
                    .map_or_else(|| "-".into(), |(done, total)| progress_text(done, total)),
                t.plugin.clone(),
            ];
            if due {
                row.push(
                    t.due_ms
                        .map_or_else(|| "-".into(), taskhost::daemon::schedule::format_ms),
                );
            }
            if clustered {
                row.push(t.node.clone().unwrap_or_else(|| "-".into()));
            }
            if children {
                row.push(t.parent.map_or_else(|| "-".into(), |p| p.to_string()));
            }
            row
        })
        .collect();
    let mut header = vec![
        "ID", "NAME", "SLOT", "STATE", "ATTEMPTS", "AGE", "PROGRESS", "PLUGIN",
    ];
    if due {
        header.push("DUE");
    }
    if clustered {
        header.push("NODE");
    }
    if children {
        header.push("PARENT");
    }
    print_table(&header, &rows);
    Ok(0)
}

#[derive(Debug, Args)]
pub struct SlotsArgs {
    /// Print JSON: one array of slots.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

pub async fn slots(args: SlotsArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let slots = client.slots().await.map_err(exit::client)?;
    if args.json {
        // Each slot with the rate its rule sets, as `/api/slots` shows it.
        let rules = json::rules_of(client.slot_rules().await.map_err(exit::client)?);
        let rows: Vec<_> = slots
            .iter()
            .map(|s| json::slot_with_rule(s, &rules))
            .collect();
        print_json(&rows);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = slots
        .iter()
        .map(|s| {
            vec![
                s.key.clone(),
                serde_json::to_value(s.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                s.owner.map_or_else(|| "-".into(), |o| o.to_string()),
                format!("{}/{}", s.owners.len(), s.capacity),
                s.queue_depth.to_string(),
                format_duration(s.in_state_for),
            ]
        })
        .collect();
    print_table(&["SLOT", "STATE", "OWNER", "OWNERS", "QUEUE", "FOR"], &rows);
    Ok(0)
}
