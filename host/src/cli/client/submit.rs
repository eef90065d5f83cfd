//! `host submit`: one task to the daemon (its plugin uploaded once per
//! daemon, by digest), and waiting for a report with live progress on a
//! terminal, which `host wait` shares.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::Client;
use taskhost::daemon::protocol::{
    EventFilter, MAX_SUBMIT_INPUT, Placement, Reply, Request, SubmitRequest,
};
use taskhost::supervisor::{EventKind, TaskRef, TaskReport};
use taskhost::units::{format_duration, format_size};

use super::super::args::{PolicyArgs, SocketArg, TaskArgs};
use super::super::exit::{self, outcome_code, usage};
use super::super::report::{JsonResult, StderrSink, print_result, progress_text};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    task: TaskArgs,
    #[command(flatten)]
    policy_flags: PolicyArgs,
    /// What to do when the slot is busy: queue, replace, drop-if-running [default: the plugin's].
    #[arg(long, value_name = "POLICY")]
    policy: Option<AdmissionPolicy>,
    /// Wait for the final outcome and print it (output on stdout, exit code by outcome).
    #[arg(long)]
    wait: bool,
    /// Make the submission idempotent: the same KEY with the same request gives the task it first made (and, with --wait, its outcome) for the daemon's --idempotency-retention (default 24h), across restarts and cluster nodes; the same KEY with another request is refused (exit 3) naming that task.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    #[command(flatten)]
    pub socket: SocketArg,
}

pub async fn submit(args: SubmitArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    let task = &args.task;
    let params = task.params()?;
    let sandbox = task.sandbox()?;
    let input = task.input()?;
    if input.len() > MAX_SUBMIT_INPUT {
        return Err(usage(format!(
            "the input is {}; a submission carries at most {} (use `host run` for larger inputs, or grant a directory with --dir)",
            format_size(input.len() as u64),
            format_size(MAX_SUBMIT_INPUT as u64)
        )));
    }
    // Checked here so a mistake is a usage error before anything is sent.
    let policies = args.policy_flags.resolve(task.timeout)?;
    let shown = task.plugin.display().to_string();
    let bytes = std::fs::read(&task.plugin)
        .map_err(|e| usage(format!("cannot read plugin `{shown}`: {e}")))?;
    taskhost::runtime::check_header(&shown, &bytes).map_err(usage)?;
    let dirs = sandbox
        .dirs
        .iter()
        .map(|d| {
            let mut grant = d.clone();
            grant.host = std::fs::canonicalize(&d.host).map_err(|e| {
                usage(format!(
                    "cannot grant directory `{}`: {e}",
                    d.host.display()
                ))
            })?;
            Ok(grant)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    // The daemon names plugins by digest; the user knows the file.
    let digest = taskhost::runtime::Digest::of(&bytes);
    let name_the_file = |err: taskhost::daemon::ClientError| {
        let message = err.to_string().replace(&digest.to_string(), &shown);
        match err {
            taskhost::daemon::ClientError::Daemon { kind, .. } => {
                exit::client(taskhost::daemon::ClientError::Daemon { kind, message })
            }
            other => exit::client(other),
        }
    };
    client.ensure_plugin(&bytes).await.map_err(name_the_file)?;
    let mut request = SubmitRequest::new(digest);
    request.name = task.name.clone();
    request.slot = task.slot.clone();
    request.policy = args.policy;
    request.params = params;
    request.input = input;
    request.restart = Some(policies.restart);
    request.max_retries = policies.max_retries;
    request.backoff = policies.backoff;
    request.timeout = policies.timeout;
    request.max_memory = task.max_memory;
    request.dirs = dirs;
    request.env = sandbox.env.clone();
    request.allow_http = sandbox.http.clone();
    request.idempotency_key = args.idempotency_key.clone();
    let submitted = client.submit(request).await.map_err(name_the_file)?;
    answer(&client, submitted, args.wait, task.json).await
}

/// Prints where a submission (or a rerun) went: its id, or with `wait` its
/// result (exit code by outcome).
pub async fn answer(
    client: &Client,
    submitted: Submitted,
    wait: bool,
    json: bool,
) -> anyhow::Result<u8> {
    if let Placement::Rejected(outcome) = &submitted.placement {
        // Rejected at intake: this is the final outcome, with or without --wait.
        let report = TaskReport {
            id: submitted.id,
            name: submitted.name.as_str().into(),
            slot: submitted.slot.as_str().into(),
            outcome: outcome.clone(),
            attempts: 0,
            history: Vec::new(),
            duration: std::time::Duration::ZERO,
        };
        return finish(&report, json);
    }
    if !wait {
        if json {
            println!("{}", taskhost::daemon::json::submitted(&submitted));
        } else {
            println!("{}", submitted.id);
            let Submitted { id, name, slot, .. } = &submitted;
            if submitted.existing {
                eprintln!(
                    "already submitted with this idempotency key: {name} (id {id}) in slot {slot}"
                );
                return Ok(0);
            }
            let place = match &submitted.placement {
                Placement::Running => format!("running in slot {slot}"),
                Placement::Queued { owner: Some(owner) } => {
                    format!("queued in slot {slot} behind id {owner}")
                }
                Placement::Queued { owner: None } => format!("queued in slot {slot}"),
                Placement::Replacing { owner, name } => {
                    format!("replacing {name} (id {owner}) in slot {slot}")
                }
                Placement::Rejected(_) => String::new(),
            };
            eprintln!("submitted {name} (id {id}), {place}");
        }
        return Ok(0);
    }
    let live = !json && std::io::stderr().is_terminal();
    let report = wait_for(client, TaskRef::Id(submitted.id), live).await?;
    finish(&report, json)
}

use taskhost::daemon::protocol::Submitted;

/// Waits for a task's report; on a terminal, shows its progress meanwhile
/// in the format `host run` uses.
pub async fn wait_for(client: &Client, target: TaskRef, live: bool) -> anyhow::Result<TaskReport> {
    let mut wait = client
        .request(Request::Wait(target.clone()))
        .await
        .map_err(exit::client)?;
    let mut events = if live {
        let filter = EventFilter {
            task: Some(target.clone()),
            kinds: vec![
                EventKind::AttemptStarting,
                EventKind::Progress,
                EventKind::AttemptFailed,
                EventKind::AttemptTimedOut,
                EventKind::BackoffScheduled,
            ],
        };
        Some(
            client
                .request(Request::Events {
                    follow: true,
                    filter,
                })
                .await
                .map_err(exit::client)?,
        )
    } else {
        None
    };
    let tag = match &target {
        TaskRef::Id(id) => format!("id {id}"),
        TaskRef::Name(name) => name.clone(),
    };
    let status = StderrSink::new(tag);
    loop {
        let event = async {
            match events.as_mut() {
                Some(events) => events.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            reply = wait.next_reply() => {
                status.clear_progress();
                return match reply.map_err(exit::client)? {
                    Reply::Report(report) => Ok(report),
                    other => Err(exit::ExitError::error(
                        exit::EXIT_DAEMON,
                        format!("the daemon answered a wait with {other:?}"),
                    )),
                };
            }
            reply = event => match reply {
                Some(Reply::Event(event)) => {
                    let attempt = event.attempt.unwrap_or(0);
                    let text = match event.kind {
                        EventKind::AttemptStarting => format!("attempt {attempt} running"),
                        EventKind::Progress => format!(
                            "attempt {attempt}: {}",
                            progress_text(event.done.unwrap_or(0), event.total.unwrap_or(0))
                        ),
                        EventKind::BackoffScheduled => format!(
                            "retrying in {}",
                            format_duration(std::time::Duration::from_millis(event.delay_ms.unwrap_or(0)))
                        ),
                        _ => format!(
                            "attempt {attempt} failed: {}",
                            event.reason.as_deref().unwrap_or("")
                        ),
                    };
                    status.status(&text);
                }
                Some(_) => {}
                None => events = None,
            },
        }
    }
}

/// Prints a final report like `host run` does and returns the exit code.
pub fn finish(report: &TaskReport, json: bool) -> anyhow::Result<u8> {
    if !json
        && report.attempts > 1
        && !matches!(
            report.outcome,
            taskhost::outcome::TaskOutcome::Completed { .. }
        )
    {
        for record in &report.history {
            eprintln!(
                "[{}]   attempt {}: {} ({})",
                report.name,
                record.attempt,
                record.result,
                format_duration(record.duration)
            );
        }
    }
    let json_result = json.then(|| JsonResult::new(report));
    print_result(json_result.as_ref(), report);
    Ok(outcome_code(&report.outcome))
}
