//! `host schedule add|ls|rm|pause|resume|run`: schedules kept by the
//! daemon, each firing an ordinary task through its slot.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::json;
use taskhost::daemon::protocol::{ScheduleRow, ScheduleSpec, ScheduleVerb};
use taskhost::daemon::schedule::{CronZone, Missed, format_ms};

use super::super::args::{PolicyArgs, RawArg, SocketArg, TaskArgs};
use super::super::exit::{self, usage};
use super::super::report::print_json;
use super::print_table;
use super::submit::{Shown, prepare};

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Verb {
    /// Add a schedule: PLUGIN is submitted with these task flags at every time the cron expression names.
    ///
    /// Each firing is an ordinary task named <schedule>-<id>, in the slot --slot, else the plugin's resource filled from --param, else the schedule's name: so the slot's --policy decides what happens when the last firing still runs (queue behind it, replace it, or drop-if-running). The schedule and its next firing are kept by the daemon's store, across restarts.
    #[command(
        after_long_help = "CRON EXPRESSIONS:\n  5 fields: minute hour day-of-month month day-of-week (0 30 * * MON-FRI)\n  6 fields: a leading seconds field (*/10 * * * * *)\n  @yearly @annually @monthly @weekly @daily @hourly\n  Fields take numbers, names (JAN-DEC, SUN-SAT), * , - / and L, W, # as croner reads them.\n\nEXAMPLES:\n  host schedule add nightly --cron '0 3 * * *' --tz Europe/Berlin target/plugins/hello.wasm --input backup\n  host schedule add every-10s --cron '*/10 * * * * *' target/plugins/sleeper.wasm --param ms=2000 --policy drop-if-running\n  host schedule add report --cron @hourly --missed skip my.wasm --slot reports --priority 5"
    )]
    Add(Box<AddArgs>),
    /// List the schedules, with each one's next firing and its last one's outcome.
    #[command(after_long_help = "EXAMPLES:\n  host schedule ls\n  host schedule ls --json")]
    Ls(ListArgs),
    /// Delete a schedule (tasks it fired go on).
    #[command(after_long_help = "EXAMPLES:\n  host schedule rm nightly")]
    Rm(NameArgs),
    /// Stop a schedule's firings until it is resumed.
    #[command(after_long_help = "EXAMPLES:\n  host schedule pause nightly")]
    Pause(NameArgs),
    /// Let a paused schedule fire again; the firings it missed while paused follow its --missed.
    #[command(after_long_help = "EXAMPLES:\n  host schedule resume nightly")]
    Resume(NameArgs),
    /// Fire a schedule once now (also while paused); its next firing stays as it was.
    #[command(
        after_long_help = "EXAMPLES:\n  host schedule run nightly\n  host schedule run nightly --wait --json"
    )]
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The schedule's name (letters, digits, - _ . /); its firings are named <name>-<id>.
    #[arg(value_name = "NAME", id = "schedule")]
    schedule: String,
    /// When it fires: a cron expression (see below).
    #[arg(long, value_name = "EXPR")]
    cron: String,
    /// The time zone the expression is read in, an IANA name such as Europe/Berlin; daylight-saving changes are handled as cron does (a time skipped by the spring change fires at the first instant after it, a time repeated by the autumn change fires once) [default: UTC].
    #[arg(long, value_name = "ZONE")]
    tz: Option<String>,
    /// Firings missed while the daemon was down or the schedule paused: `once` fires one catch-up firing (never a burst), `skip` fires none and waits for the next [default: once].
    #[arg(long, value_name = "skip|once", value_parser = parse_missed)]
    missed: Option<Missed>,
    #[command(flatten)]
    task: TaskArgs,
    #[command(flatten)]
    policy_flags: PolicyArgs,
    /// What a firing does when the slot is busy (the last firing still runs): queue, replace, drop-if-running [default: the plugin's].
    #[arg(long, value_name = "POLICY")]
    policy: Option<AdmissionPolicy>,
    /// The firings' priority among attempts waiting for the daemon's --max-concurrent [default: 0].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    priority: Option<i32>,
    #[command(flatten)]
    socket: SocketArg,
}

fn parse_missed(text: &str) -> Result<Missed, String> {
    text.parse()
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON: one array of schedules.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// The schedule's name.
    #[arg(value_name = "NAME")]
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The schedule's name.
    #[arg(value_name = "NAME")]
    name: String,
    /// Wait for the firing's final outcome and print it (exit code by outcome).
    #[arg(long)]
    wait: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    raw: RawArg,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn schedule(args: ScheduleArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    match args.verb {
        Verb::Add(args) => add(*args, before_verb).await,
        Verb::Ls(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let rows = client.schedules().await.map_err(exit::client)?;
            if args.json {
                let rows: Vec<_> = rows.iter().map(json::schedule).collect();
                print_json(&rows);
            } else if rows.is_empty() {
                eprintln!("no schedules (add one: host schedule add NAME --cron EXPR PLUGIN)");
            } else {
                list(&rows);
            }
            Ok(0)
        }
        Verb::Rm(args) => one(args, before_verb, ScheduleVerb::Remove, "removed").await,
        Verb::Pause(args) => one(args, before_verb, ScheduleVerb::Pause, "paused").await,
        Verb::Resume(args) => one(args, before_verb, ScheduleVerb::Resume, "resumed").await,
        Verb::Run(args) => {
            let client = super::connect(&args.socket, before_verb.as_deref()).await?;
            let submitted = client
                .run_schedule(&args.name)
                .await
                .map_err(exit::client)?;
            let shown = Shown {
                json: args.json,
                raw: args.raw.raw,
            };
            super::submit::answer(&client, submitted, args.wait, shown).await
        }
    }
}

async fn add(args: AddArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    if args.task.name.is_some() {
        return Err(usage(
            "a schedule's firings are named <schedule>-<id>: drop --name (the schedule's NAME names them)",
        ));
    }
    // Checked here too, so a mistake is exit 2 before anything is sent.
    taskhost::daemon::schedule::check_name(&args.schedule).map_err(usage)?;
    let zone = CronZone::parse(&args.cron, args.tz.as_deref()).map_err(usage)?;
    let prepared = prepare(&args.task, &args.policy_flags, args.policy, args.priority)?;
    let spec = ScheduleSpec {
        name: args.schedule.clone(),
        cron: args.cron.clone(),
        tz: args.tz.clone(),
        missed: args.missed.unwrap_or_default(),
        request: prepared.request.clone(),
    };
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    prepared.upload(&client).await?;
    let row = client
        .schedule(ScheduleVerb::Add(Box::new(spec)))
        .await
        .map_err(|e| prepared.name_the_file(e))?;
    if args.task.json {
        print_json(&json::schedule(&row));
    } else {
        let next = row
            .next_ms
            .map_or_else(|| "never".to_owned(), |at| zone.show(at));
        eprintln!(
            "added schedule {} ({} in {}), next firing {next}",
            row.name, row.cron, row.tz
        );
    }
    Ok(0)
}

/// `rm`, `pause` and `resume`: the schedule as the verb left it.
async fn one(
    args: NameArgs,
    before_verb: Option<PathBuf>,
    verb: fn(String) -> ScheduleVerb,
    done: &str,
) -> anyhow::Result<u8> {
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    let row = client
        .schedule(verb(args.name.clone()))
        .await
        .map_err(exit::client)?;
    if args.json {
        print_json(&json::schedule(&row));
    } else {
        let next = match (row.paused, row.next_ms) {
            (true, _) => String::new(),
            (false, Some(at)) => format!(", next firing {}", format_ms(at)),
            (false, None) => ", no further firing".into(),
        };
        eprintln!("{done} schedule {}{next}", row.name);
    }
    Ok(0)
}

fn list(rows: &[ScheduleRow]) {
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let next = match (r.paused, r.next_ms) {
                (true, _) => "paused".to_owned(),
                (false, Some(at)) => show_in(r, at),
                (false, None) => "never".to_owned(),
            };
            let last = match (r.last_fire_ms, r.last_task) {
                (Some(at), Some(id)) => format!(
                    "{} #{id} {}",
                    show_in(r, at),
                    r.last_outcome.map_or("running", |o| o.as_str())
                ),
                _ => "-".to_owned(),
            };
            vec![
                r.name.clone(),
                r.cron.clone(),
                r.tz.clone(),
                next,
                last,
                r.plugin.clone(),
                r.missed.as_str().to_owned(),
            ]
        })
        .collect();
    print_table(
        &["NAME", "CRON", "TZ", "NEXT", "LAST", "PLUGIN", "MISSED"],
        &table,
    );
}

/// A time in the schedule's own zone.
fn show_in(row: &ScheduleRow, ms: u64) -> String {
    match CronZone::parse("* * * * *", Some(&row.tz)) {
        Ok(zone) => zone.show(ms),
        Err(_) => format_ms(ms),
    }
}
