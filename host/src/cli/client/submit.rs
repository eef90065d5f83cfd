//! `host submit`: one task to the daemon (its plugin uploaded once per
//! daemon, by digest), and waiting for a report with live progress on a
//! terminal, which `host wait` shares.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::Client;
use taskhost::daemon::protocol::{
    EventFilter, MAX_SUBMIT_INPUT, NotBefore, Placement, Reply, Request, SubmitRequest,
};
use taskhost::supervisor::{EventKind, TaskRef, TaskReport};
use taskhost::units::{format_duration, format_size, parse_duration};

use super::super::args::{PolicyArgs, RawArg, SocketArg, TaskArgs};
use super::super::exit::{self, outcome_code, usage};
use super::super::report::{
    JsonResult, StderrSink, history, print_json, print_result, progress_text, say,
};

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    task: TaskArgs,
    #[command(flatten)]
    policy_flags: PolicyArgs,
    /// What to do when the slot is busy: queue, replace, drop-if-running [default: the plugin's].
    #[arg(long, value_name = "POLICY")]
    policy: Option<AdmissionPolicy>,
    /// Among attempts waiting for the daemon's --max-concurrent, higher goes first; equal ones in the order they began to wait. It does not reorder a slot's queue [default: 0].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    priority: Option<i32>,
    /// Hold the task this long after the daemon accepts it, such as 90s or 2h: it is acknowledged at once, shown as waiting with its due time in `host ps`, and enters its slot no earlier (kept across restarts).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with = "at")]
    delay: Option<Duration>,
    /// Hold the task until this time, RFC 3339 such as 2026-12-24T18:00:00Z or 2026-12-24T19:00:00+01:00 (as --delay; a time past enters at once).
    #[arg(long, value_name = "TIME", value_parser = parse_at)]
    at: Option<u64>,
    /// Wait for the final outcome and print it (output on stdout, exit code by outcome).
    #[arg(long)]
    wait: bool,
    /// Make the submission idempotent: the same KEY with the same request gives the task it first made (and, with --wait, its outcome) for the daemon's --idempotency-retention (default 24h), across restarts and cluster nodes; the same KEY with another request is refused (exit 3) naming that task.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Submit every task of FILE (`-`: standard input), one JSON object per line as `POST /api/tasks` takes it (`{"params": {"ms": "10"}, "slot": "a"}`; a line without "plugin" runs PLUGIN), in calls of up to 1,000: prints each one's id (or, with --json, its answer) in order, and each refusal with its line; exit 0 when every one was accepted, else the code of the first refusal. The task's settings come from its line, so the other task flags are refused with it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["policy", "priority", "delay", "at", "wait", "idempotency_key"])]
    pub batch: Option<PathBuf>,
    /// Keep no record of this task's attempts (the flight recorder's: `host replay ID`, `host record export`), whatever the daemon's --record-budget.
    #[arg(long)]
    no_record: bool,
    #[command(flatten)]
    raw: RawArg,
    #[command(flatten)]
    pub socket: SocketArg,
}

impl SubmitArgs {
    /// The task's arguments.
    pub fn task(&self) -> &TaskArgs {
        &self.task
    }

    /// The first task flag given besides the plugin and --json (which
    /// `--batch` takes from each line instead).
    pub fn task_flag(&self) -> Option<&'static str> {
        let t = &self.task;
        let p = &self.policy_flags;
        [
            (t.name.is_some(), "--name"),
            (t.slot.is_some(), "--slot"),
            (!t.params.is_empty(), "--param"),
            (!t.args.is_empty() || !t.trailing.is_empty(), "--arg"),
            (t.input.is_some() || t.input_file.is_some(), "--input"),
            (t.timeout.is_some(), "--timeout"),
            (t.max_memory.is_some(), "--max-memory"),
            (!t.dirs.is_empty(), "--dir"),
            (!t.env.is_empty(), "--env"),
            (
                !t.secrets.is_empty() || !t.env_secrets.is_empty(),
                "--secret",
            ),
            (!t.config_vars.is_empty(), "--config-var"),
            (!t.kv.is_empty(), "--kv"),
            (!t.allow_http.is_empty(), "--allow-http"),
            (p.restart.is_some(), "--restart"),
            (p.every.is_some(), "--every"),
            (p.max_retries.is_some(), "--max-retries"),
            (p.backoff.is_some(), "--backoff"),
            (self.raw.raw, "--raw"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// `--at TIME`: RFC 3339, as ms since the Unix epoch.
fn parse_at(text: &str) -> Result<u64, String> {
    taskhost::daemon::schedule::parse_rfc3339(text)
}

/// The deployment a PLUGIN argument names: a reference (`NAME`,
/// `NAME@VERSION`, `NAME@sha256:…`) that is not a file here.
pub fn deployment_of(plugin: &std::path::Path) -> Option<String> {
    let text = plugin.to_str()?;
    if plugin.exists() || text.ends_with(".wasm") {
        return None;
    }
    taskhost::daemon::protocol::Reference::parse(text)
        .ok()
        .map(|_| text.to_owned())
}

/// A submission read from the task flags, with its plugin's bytes.
pub struct Prepared {
    /// The plugin file as the user named it.
    pub shown: String,
    /// The plugin's bytes.
    pub bytes: Vec<u8>,
    /// The request (its plugin by digest).
    pub request: SubmitRequest,
}

/// Reads the task flags into a request: every mistake is a usage error
/// before anything is sent.
pub fn prepare(
    task: &TaskArgs,
    policy_flags: &PolicyArgs,
    policy: Option<AdmissionPolicy>,
    priority: Option<i32>,
) -> anyhow::Result<Prepared> {
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
    let policies = policy_flags.resolve(task.timeout)?;
    let shown = task.plugin.display().to_string();
    // `NAME`, `NAME@VERSION` or `NAME@sha256:…` that is no file: a
    // deployment, which the daemon resolves.
    let deployment = deployment_of(&task.plugin);
    let bytes = match &deployment {
        Some(_) => Vec::new(),
        None => {
            let bytes = std::fs::read(&task.plugin)
                .map_err(|e| usage(format!("cannot read plugin `{shown}`: {e}")))?;
            taskhost::runtime::check_header(&shown, &bytes).map_err(usage)?;
            bytes
        }
    };
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
    let mut request = SubmitRequest::new(match &deployment {
        // The daemon sets it from the deployment.
        Some(_) => taskhost::runtime::Digest([0; 32]),
        None => taskhost::runtime::Digest::of(&bytes),
    });
    request.deployment = deployment;
    request.name = task.name.clone();
    request.slot = task.slot.clone();
    request.policy = policy;
    request.params = params;
    request.args = task.command_args();
    request.input = input;
    request.restart = Some(policies.restart);
    request.max_retries = policies.max_retries;
    request.backoff = policies.backoff;
    request.timeout = policies.timeout;
    request.max_memory = task.max_memory;
    request.dirs = dirs;
    request.env = sandbox.env.clone();
    request.secrets = sandbox.secrets.clone();
    request.config = sandbox.config.clone();
    request.kv = sandbox.kv.clone();
    request.allow_http = sandbox.http.clone();
    request.priority = priority.unwrap_or(0);
    Ok(Prepared {
        shown,
        bytes,
        request,
    })
}

impl Prepared {
    /// Errors of the daemon that name the plugin by digest, with the file's
    /// name instead.
    pub fn name_the_file(&self, err: taskhost::daemon::ClientError) -> anyhow::Error {
        let digest = self.request.plugin.to_string();
        let message = err.to_string().replace(&digest, &self.shown);
        match err {
            taskhost::daemon::ClientError::Daemon { kind, .. } => {
                exit::client(taskhost::daemon::ClientError::Daemon { kind, message })
            }
            other => exit::client(other),
        }
    }

    /// Uploads the plugin unless the daemon has it (a deployment is there).
    pub async fn upload(&self, client: &Client) -> anyhow::Result<()> {
        if self.request.deployment.is_some() {
            return Ok(());
        }
        client
            .ensure_plugin(&self.bytes)
            .await
            .map_err(|e| self.name_the_file(e))?;
        Ok(())
    }
}

pub async fn submit(args: SubmitArgs, before_verb: Option<PathBuf>) -> anyhow::Result<u8> {
    if let Some(file) = &args.batch {
        return super::batch::submit_batch(&args, file, before_verb).await;
    }
    let mut prepared = prepare(&args.task, &args.policy_flags, args.policy, args.priority)?;
    prepared.request.idempotency_key = args.idempotency_key.clone();
    prepared.request.no_record = args.no_record;
    prepared.request.not_before = match (args.delay, args.at) {
        (Some(delay), _) => Some(NotBefore::After(delay)),
        (None, Some(at)) => Some(NotBefore::At(at)),
        (None, None) => None,
    };
    let client = super::connect(&args.socket, before_verb.as_deref()).await?;
    prepared.upload(&client).await?;
    let submitted = client
        .submit(prepared.request.clone())
        .await
        .map_err(|e| prepared.name_the_file(e))?;
    let shown = Shown {
        json: args.task.json,
        raw: args.raw.raw,
    };
    answer(&client, submitted, args.wait, shown).await
}

/// How a verb shows a result: `--json`, `--raw`.
#[derive(Debug, Clone, Copy)]
pub struct Shown {
    pub json: bool,
    pub raw: bool,
}

/// Prints where a submission (or a rerun) went: its id, or with `wait` its
/// result (exit code by outcome).
pub async fn answer(
    client: &Client,
    submitted: Submitted,
    wait: bool,
    shown: Shown,
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
        return finish(&report, shown);
    }
    if !wait {
        if shown.json {
            print_json(&taskhost::daemon::json::submitted(&submitted));
        } else {
            println!("{}", submitted.id);
            let Submitted { id, name, slot, .. } = &submitted;
            if submitted.existing {
                say(&format!(
                    "already submitted with this idempotency key: {name} (id {id}) in slot {slot}"
                ));
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
                Placement::Delayed { due_ms } => format!(
                    "waiting until {} for slot {slot}",
                    taskhost::daemon::schedule::format_ms(*due_ms)
                ),
            };
            say(&format!("submitted {name} (id {id}), {place}"));
        }
        return Ok(0);
    }
    let live = !shown.json && std::io::stderr().is_terminal();
    let report = wait_for(client, TaskRef::Id(submitted.id), live).await?;
    finish(&report, shown)
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
pub fn finish(report: &TaskReport, shown: Shown) -> anyhow::Result<u8> {
    if !shown.json {
        let notes = StderrSink::new(report.name.to_string());
        for line in history(report) {
            notes.note(&line);
        }
    }
    let json_result = shown.json.then(|| JsonResult::new(report));
    print_result(json_result.as_ref(), report, shown.raw);
    Ok(outcome_code(&report.outcome))
}
