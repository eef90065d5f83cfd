//! The daemon verbs: `serve` and the client verbs that talk to it (`submit`,
//! `wait`, `cancel`, `remove`, `ps`, `slots`, `events`, `logs`,
//! `shutdown`), with aligned human output and `--json`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use taskhost::daemon::protocol::{Reply, Request, SubmitRequest, Target, WireDir, WireReport};
use taskhost::daemon::{DaemonConfig, default_state_dir, serve, socket};
use taskhost::supervisor::TaskReport;
use taskhost::units::{format_duration, parse_duration, parse_size};

use super::args::{PolicyArgs, TaskArgs};
use super::client::{Client, EXIT_DAEMON};
use super::report::{JsonResult, print_result, summary};
use super::{ExitError, usage};

/// The largest input `submit` sends (the frame limit less room for the
/// rest of the request).
const MAX_SUBMIT_INPUT: usize = taskhost::daemon::protocol::MAX_FRAME - (64 << 10);

/// `--socket` for every client verb.
#[derive(Debug, Args)]
pub struct SocketArg {
    /// The daemon's socket [default: $TASKHOST_SOCKET, else $XDG_RUNTIME_DIR/taskhost/host.sock, else /tmp/taskhost-<uid>/host.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Where uploaded plugins and the compilation cache live [default: $XDG_STATE_HOME/taskhost, else ~/.local/state/taskhost].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A TOML file with settings (keys: state_dir, grace, max_concurrent, max_slot_queue, max_total_pending, max_memory, epoch_tick, max_connections, pool_instances, event_lane_capacity); flags win over it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Grace for running tasks on shutdown and cancel [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Most attempts running at once [default: 256].
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// Pending submissions per slot [default: 100].
    #[arg(long, value_name = "N")]
    max_slot_queue: Option<usize>,
    /// Pending submissions over all slots [default: 10000].
    #[arg(long, value_name = "N")]
    max_total_pending: Option<usize>,
    /// Default memory limit of a guest [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// Instance slots of the pooling allocator; attempts running at once never exceed it (below 16: the on-demand allocator) [default: 1000].
    #[arg(long, value_name = "N")]
    pool_instances: Option<u32>,
    /// Epoch tick: the granularity of interruption [default: 10ms].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    epoch_tick: Option<Duration>,
    /// Log format on stderr (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// How `host serve` writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

pub async fn serve_cmd(args: ServeArgs) -> anyhow::Result<u8> {
    let socket_path = socket::resolve(args.socket.socket.as_deref());
    let mut config = DaemonConfig::with_state_dir(default_state_dir());
    if let Some(file) = &args.config {
        config.apply_file(file).map_err(usage)?;
    }
    if let Some(v) = args.state_dir {
        config.state_dir = v;
    }
    if let Some(v) = args.grace {
        config.grace = v;
    }
    if let Some(v) = args.max_concurrent {
        config.max_concurrent = v.max(1);
    }
    if let Some(v) = args.max_slot_queue {
        config.max_slot_queue = v;
    }
    if let Some(v) = args.max_total_pending {
        config.max_total_pending = v;
    }
    if let Some(v) = args.max_memory {
        config.max_memory = v;
    }
    if let Some(v) = args.pool_instances {
        config.pool_instances = v;
    }
    if let Some(v) = args.epoch_tick {
        if v < Duration::from_millis(1) {
            return Err(usage("--epoch-tick must be at least 1ms"));
        }
        config.epoch_tick = v;
    }
    serve(socket_path, config)
        .await
        .map_err(|e| ExitError::error(1, e))?;
    Ok(0)
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    task: TaskArgs,
    #[command(flatten)]
    policy_flags: PolicyArgs,
    /// What to do when the slot is busy: queue, replace, drop-if-running [default: the plugin's].
    #[arg(long, value_parser = ["queue", "replace", "drop-if-running"])]
    policy: Option<String>,
    /// Wait for the final outcome and print it (output on stdout, exit code by outcome).
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<u8> {
    let task = &args.task;
    let params = task.params()?;
    let sandbox = task.sandbox()?;
    let input = task.input()?;
    if input.len() > MAX_SUBMIT_INPUT {
        return Err(usage(format!(
            "the input is {}; a submission carries at most {} (use `host run` for larger inputs, or grant a directory with --dir)",
            taskhost::units::format_size(input.len() as u64),
            taskhost::units::format_size(MAX_SUBMIT_INPUT as u64)
        )));
    }
    // Checked here so a mistake is a usage error before anything is sent.
    args.policy_flags.resolve(task.timeout)?;
    let bytes = std::fs::read(&task.plugin).map_err(|e| {
        usage(format!(
            "cannot read plugin `{}`: {e}",
            task.plugin.display()
        ))
    })?;
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let digest = client.ensure_plugin(&bytes).await?;
    let dirs = sandbox
        .dirs
        .iter()
        .map(|d| {
            let host = std::fs::canonicalize(&d.host).map_err(|e| {
                usage(format!(
                    "cannot grant directory `{}`: {e}",
                    d.host.display()
                ))
            })?;
            Ok(WireDir {
                host: host.display().to_string(),
                guest: d.guest.clone(),
                read_only: d.read_only,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let flags = &args.policy_flags;
    let request = SubmitRequest {
        digest: digest.0,
        name: task.name.clone(),
        slot: task.slot.clone(),
        policy: args.policy.clone(),
        params,
        input,
        restart: flags.restart.map(|r| {
            match r {
                super::args::Restart::Never => "never",
                super::args::Restart::OnFailure => "on-failure",
                super::args::Restart::Always => "always",
            }
            .to_owned()
        }),
        every_ms: flags.every.map(|d| d.as_millis() as u64),
        max_retries: flags.max_retries,
        backoff: flags.backoff.as_ref().map(super::args::BackoffSpec::wire),
        timeout_ms: task.timeout.map(|d| d.as_millis() as u64),
        max_memory: task.max_memory,
        dirs,
        env: sandbox.env.clone(),
    };
    let started = Instant::now();
    let Reply::Submitted {
        id,
        name,
        slot,
        queued,
        rejected,
    } = client.call(Request::Submit(Box::new(request))).await?
    else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered a submission with something else",
        ));
    };
    if let Some(outcome) = rejected {
        // Rejected at intake: this is the final outcome, with or without --wait.
        let report = WireReport {
            id,
            name,
            slot,
            outcome,
            attempts: 0,
            history: Vec::new(),
        };
        return finish(&report, task.json, started.elapsed());
    }
    if !args.wait {
        if task.json {
            println!(
                "{}",
                json!({ "id": id, "name": name, "slot": slot, "queued": queued })
            );
        } else {
            println!("{id}");
            let place = if queued { "queued in" } else { "running in" };
            eprintln!("submitted {name} (id {id}), {place} slot {slot}");
        }
        return Ok(0);
    }
    let live = !task.json && std::io::stderr().is_terminal();
    let report = wait_for(&mut client, Target::Id(id), live).await?;
    finish(&report, task.json, started.elapsed())
}

/// Waits for a task's report; on a terminal, shows its progress meanwhile.
async fn wait_for(client: &mut Client, target: Target, live: bool) -> anyhow::Result<WireReport> {
    let wait_id = client.send(Request::Wait(target.clone())).await?;
    let task_id = match &target {
        Target::Id(id) => Some(*id),
        Target::Name(_) => None,
    };
    if live {
        client.send(Request::Events { follow: true }).await?;
    }
    let mut status = String::new();
    loop {
        let reply = client.recv().await?;
        if reply.id == wait_id {
            if !status.is_empty() {
                eprint!("\r\x1b[K");
            }
            return match super::client::check(reply.body)? {
                Reply::Report(report) => Ok(report),
                _ => Err(ExitError::error(
                    EXIT_DAEMON,
                    "the daemon answered a wait with something else",
                )),
            };
        }
        if let Reply::Event(event) = reply.body
            && task_id.is_some()
            && event.task_id == task_id
            && let Some(line) = live_status(&event.json)
        {
            status = line;
            eprint!("\r\x1b[K{status}");
            let _ = std::io::stderr().flush();
        }
    }
}

/// The one-line status of a task from one of its events.
fn live_status(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let name = v["name"].as_str().unwrap_or("task");
    let attempt = v["attempt"].as_u64().unwrap_or(0);
    Some(match v["kind"].as_str()? {
        "AttemptStarting" => format!("[{name}] attempt {attempt} running"),
        "Progress" => {
            let (done, total) = (
                v["done"].as_u64().unwrap_or(0),
                v["total"].as_u64().unwrap_or(0),
            );
            if total > 0 {
                format!(
                    "[{name}] attempt {attempt}: {done}/{total} ({:.0}%)",
                    done as f64 * 100.0 / total as f64
                )
            } else {
                format!("[{name}] attempt {attempt}: {done}")
            }
        }
        "AttemptFailed" | "AttemptTimedOut" => format!(
            "[{name}] attempt {attempt} failed: {}",
            v["reason"].as_str().unwrap_or("")
        ),
        "BackoffScheduled" => format!(
            "[{name}] retrying in {}",
            format_duration(Duration::from_millis(v["delay_ms"].as_u64().unwrap_or(0)))
        ),
        _ => return None,
    })
}

/// Prints a final report like `host run` does and returns the exit code.
fn finish(report: &WireReport, json: bool, took: Duration) -> anyhow::Result<u8> {
    let local = TaskReport {
        id: report.id,
        name: Arc::from(report.name.as_str()),
        slot: Arc::from(report.slot.as_str()),
        outcome: report.outcome.clone(),
        attempts: report.attempts,
        history: Vec::new(),
    };
    if !json
        && report.attempts > 1
        && !matches!(
            report.outcome,
            taskhost::outcome::TaskOutcome::Completed { .. }
        )
    {
        for line in &report.history {
            eprintln!("[{}]   {line}", report.name);
        }
    }
    let json_result = json.then(|| JsonResult::new(&local, took));
    print_result(json_result.as_ref(), &local, took);
    Ok(report.outcome.process_exit_code())
}

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// The task: its id, or its name.
    #[arg(value_name = "ID|NAME")]
    target: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn wait(args: TargetArgs) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let started = Instant::now();
    let live = !args.json && std::io::stderr().is_terminal();
    let report = wait_for(&mut client, Target::parse(&args.target), live).await?;
    finish(&report, args.json, started.elapsed())
}

pub async fn cancel(args: TargetArgs, wait: bool) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let target = Target::parse(&args.target);
    let Reply::Canceled { claimed, report } = client.call(Request::Cancel { target, wait }).await?
    else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered a cancel with something else",
        ));
    };
    if args.json {
        let report = report.as_ref().map(|r| {
            json!({ "id": r.id, "name": r.name, "outcome": r.outcome.kind(), "reason": r.outcome.reason(),
                    "rejection": match &r.outcome { taskhost::outcome::TaskOutcome::Rejected { kind, .. } => Some(kind.to_string()), _ => None } })
        });
        println!("{}", json!({ "claimed": claimed, "report": report }));
    } else {
        match (&report, claimed) {
            (Some(r), _) => eprintln!("{}", summary(&r.name, &r.outcome, r.attempts, None)),
            (None, true) => eprintln!("stop requested for {}", args.target),
            (None, false) => eprintln!("{} is already stopping or finished", args.target),
        }
    }
    Ok(if claimed { 0 } else { 1 })
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn ps(args: ListArgs) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let Reply::Tasks(tasks) = client.call(Request::List).await? else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered ps with something else",
        ));
    };
    if args.json {
        // The wire rows are the JSON rows: id, name, slot, state, attempts.
        println!("{}", serde_json::to_string(&tasks)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.name.clone(),
                t.slot.clone(),
                t.state.clone(),
                t.attempts.to_string(),
            ]
        })
        .collect();
    print_table(&["ID", "NAME", "SLOT", "STATE", "ATTEMPTS"], &rows);
    Ok(0)
}

pub async fn slots(args: ListArgs) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let Reply::Slots(slots) = client.call(Request::Slots).await? else {
        return Err(ExitError::error(
            EXIT_DAEMON,
            "the daemon answered slots with something else",
        ));
    };
    if args.json {
        // The wire rows are the JSON rows: key, state, owner, queue_depth,
        // in_state_ms.
        println!("{}", serde_json::to_string(&slots)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = slots
        .iter()
        .map(|s| {
            vec![
                s.key.clone(),
                s.state.clone(),
                s.owner.map_or_else(|| "-".into(), |o| o.to_string()),
                s.queue_depth.to_string(),
                format_duration(Duration::from_millis(s.in_state_ms)),
            ]
        })
        .collect();
    print_table(&["SLOT", "STATE", "OWNER", "QUEUE", "FOR"], &rows);
    Ok(0)
}

fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(stdout, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep streaming new events until interrupted.
    #[arg(long)]
    follow: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn events(args: EventsArgs) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let id = client
        .send(Request::Events {
            follow: args.follow,
        })
        .await?;
    let mut stdout = std::io::stdout().lock();
    loop {
        let reply = client.recv().await?;
        if reply.id != id {
            continue;
        }
        match super::client::check(reply.body)? {
            Reply::Event(e) => {
                let line = if args.json {
                    e.json
                } else {
                    let v: serde_json::Value = serde_json::from_str(&e.json).unwrap_or_default();
                    let mut line = format!("{:>6} {:<26}", e.seq, e.kind);
                    if let Some(id) = e.task_id {
                        line.push_str(&format!(" {id} {}", e.name.unwrap_or_default()));
                    }
                    for key in [
                        "slot",
                        "attempt",
                        "outcome",
                        "rejection",
                        "delay_ms",
                        "detail",
                        "reason",
                    ] {
                        if let Some(value) = v.get(key).filter(|v| !v.is_null()) {
                            let text = value
                                .as_str()
                                .map_or_else(|| value.to_string(), str::to_owned);
                            line.push_str(&format!(" {key}={text}"));
                        }
                    }
                    line
                };
                if writeln!(stdout, "{line}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return Ok(0);
                }
            }
            Reply::Dropped(n) => eprintln!("({n} events were dropped: this reader fell behind)"),
            Reply::End => return Ok(0),
            _ => {}
        }
    }
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The task: its id, or its name.
    #[arg(value_name = "ID|NAME")]
    target: String,
    /// Keep streaming until the task ends.
    #[arg(long)]
    follow: bool,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn logs(args: LogsArgs) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let id = client
        .send(Request::Logs {
            target: Target::parse(&args.target),
            follow: args.follow,
        })
        .await?;
    let mut stdout = std::io::stdout().lock();
    loop {
        let reply = client.recv().await?;
        if reply.id != id {
            continue;
        }
        match super::client::check(reply.body)? {
            Reply::Log(line) => {
                let written = writeln!(stdout, "[{}] {}", line.stream, line.text)
                    .and_then(|()| stdout.flush());
                // A closed stdout (`| head`) ends the stream quietly.
                if written.is_err() {
                    return Ok(0);
                }
            }
            Reply::Dropped(n) => eprintln!("({n} log lines were dropped: this reader fell behind)"),
            Reply::End => return Ok(0),
            _ => {}
        }
    }
}

#[derive(Debug, Args)]
pub struct ShutdownArgs {
    /// How long running tasks get to stop before they are force-aborted [default: the daemon's --grace].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    grace: Option<Duration>,
    #[command(flatten)]
    socket: SocketArg,
}

pub async fn shutdown(args: ShutdownArgs) -> anyhow::Result<u8> {
    let mut client = Client::connect(args.socket.socket.as_deref()).await?;
    let reply = client
        .call(Request::Shutdown {
            grace_ms: args.grace.map(|g| g.as_millis() as u64),
        })
        .await?;
    match reply {
        Reply::ShutdownDone { stuck } if stuck.is_empty() => {
            eprintln!("daemon shut down: every task stopped within the grace");
        }
        Reply::ShutdownDone { stuck } => {
            eprintln!(
                "daemon shut down: force-aborted after the grace: {}",
                stuck.join(", ")
            );
        }
        _ => {
            return Err(ExitError::error(
                EXIT_DAEMON,
                "the daemon answered shutdown with something else",
            ));
        }
    }
    Ok(0)
}
