//! `host run PLUGIN`: one task in an in-process supervisor, no daemon.
//! Ctrl-C (or SIGTERM) asks the task to stop; after --grace, or on a second
//! signal, the instance is stopped by force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use taskhost::plugin_task::{PluginTask, resolve_slot};
use taskhost::runtime::record::{AttemptRecord, RecordFile, RecordSettings, RecordSink};
use taskhost::runtime::{
    ComponentKind, GuestLimits, KvLimits, MemoryKv, Runtime, Sandbox, Secrets,
};
use taskhost::supervisor::{Event, EventKind, Received, Supervisor, TaskId, TaskSpec};
use taskhost::units::{format_duration, parse_duration, parse_size};
use tokio::signal::unix::{SignalKind, signal};

use super::args::{CacheArgs, GuestLimitArgs, OtlpArg, PolicyArgs, RawArg, TaskArgs};
use super::exit::{outcome_code, usage};
use super::report::{JsonResult, StderrSink, history, print_result, progress_text};

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    task: TaskArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    limits: GuestLimitArgs,
    #[command(flatten)]
    pub otlp: OtlpArg,
    #[command(flatten)]
    raw: RawArg,
    /// After Ctrl-C, how long the task may take to stop before it is stopped by force.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    grace: Duration,
    #[command(flatten)]
    record: RecordArgs,
}

// `host run`'s recording flags. (Not a doc comment: clap would make it
// `host run`'s own description.)
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Record every attempt into FILE: the answers of the host calls that could differ between two runs (clocks, the seed of its random numbers, cancellation, sleeps, key-value reads, outbound HTTP responses with their whole bodies, the content of each file opened to read through a --dir grant and each directory entry listed there), in order, and how it ended; `host replay FILE` runs it again from the record.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Bytes of host calls one attempt's record keeps; past them (a response body or a file too large for what is left, say) the record is marked truncated and the attempt goes on unaffected.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1MiB")]
    record_budget: u64,
}

/// Collects the records of a `host run`'s attempts.
#[derive(Default)]
struct Collected(Mutex<RecordFile>);

impl RecordSink for Collected {
    fn recorded(&self, record: AttemptRecord) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .attempts
            .push(record);
    }
}

/// Writes the collected records to `path` (whole, or not at all).
fn write_records(path: &Path, collected: &Collected) -> anyhow::Result<()> {
    let file = collected.0.lock().unwrap_or_else(PoisonError::into_inner);
    let bytes = file.encode();
    let tmp = path.with_extension("record-partial");
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| anyhow::anyhow!("cannot write the record to `{}`: {e}", path.display()))
}

/// The secrets `sandbox` names, from this process's environment: `run`
/// has no daemon to hold them, and a variable that is not set fails here,
/// before anything runs.
fn secrets_of(sandbox: &Sandbox) -> anyhow::Result<Secrets> {
    let names = sandbox.secrets.iter().map(|s| s.name.as_str());
    let secrets = Secrets::from_environment(names).map_err(usage)?;
    for secret in &sandbox.secrets {
        secrets.resolve(&secret.name).map_err(usage)?;
    }
    Ok(secrets)
}

pub async fn run(args: RunArgs) -> anyhow::Result<u8> {
    let task = &args.task;
    let params = task.params()?;
    let sandbox = task.sandbox()?;
    let input = task.input()?;
    let policies = args.policy.resolve(task.timeout)?;

    let config = args.cache.runtime_config()?;
    let config = config
        .guest_limits(args.limits.apply(GuestLimits::default()))
        .secrets(secrets_of(&sandbox)?)
        // State lives as long as this process: enough to try a plugin's
        // buckets across its attempts; a daemon keeps them.
        .key_value(Arc::new(MemoryKv::new(
            KvLimits::default(),
            "host run keeps its buckets in memory, up to the daemon's defaults",
        )));
    let runtime = Arc::new(Runtime::new(&config)?);
    let plugin = runtime.load_file(&task.plugin).await.map_err(usage)?;
    let command_args = task.command_args();
    if !command_args.is_empty() && plugin.info().kind != ComponentKind::Command {
        return Err(usage(format!(
            "`{}` is a task plugin, which takes no arguments: give it --param K=V (arguments, \
             --arg and `-- ARGS`, are for WASI commands)",
            task.plugin.display()
        )));
    }
    sandbox
        .check_capabilities(&plugin.info().capabilities)
        .map_err(usage)?;

    // Its one reader has a deep lane of its own (below): the shared lanes
    // need no depth.
    let supervisor = Supervisor::builder()
        .max_concurrent(1)
        .grace(args.grace)
        .bus_capacity(1)
        .build();
    let reservation = supervisor.reserve();
    let id = reservation.id();
    let info = plugin.info();
    let name = task
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{id}", info.name));
    let slot = resolve_slot(task.slot.as_deref(), info.resource.as_ref(), &params, &name)
        .map_err(usage)?;
    let sink = Arc::new(StderrSink::new(name.clone()));
    // Guest lines reach stderr through the event stream, so they and the
    // lifecycle notes come out in one order.
    let body = PluginTask::new(&runtime, &plugin)
        .input(input)
        .params(params)
        .args(command_args)
        .sandbox(sandbox);
    let collected = Arc::new(Collected::default());
    let body = match &args.record.record {
        Some(_) => body.record(RecordSettings {
            budget: usize::try_from(args.record.record_budget).unwrap_or(usize::MAX),
            source: std::path::absolute(&task.plugin)
                .unwrap_or_else(|_| task.plugin.clone())
                .display()
                .to_string(),
            sink: Arc::clone(&collected) as Arc<dyn RecordSink>,
        }),
        None => body,
    };
    let spec = policies.apply(TaskSpec::from_defaults(name.clone(), body).with_slot(slot));

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    // One task and one fast reader: room for a burst of guest output.
    let mut events = supervisor.subscribe_deep(1 << 16);
    let waiter = supervisor.add_reserved(reservation, spec);
    let printer = {
        let sink = Arc::clone(&sink);
        tokio::spawn(async move {
            // What is ready is printed in one write: a chatty guest is
            // drained faster than it writes, and its lines are not dropped.
            while let Some(received) = events.recv().await {
                sink.hold();
                print_event(&sink, id, received);
                while let Some(received) = events.try_recv() {
                    print_event(&sink, id, received);
                }
                sink.release();
            }
        })
    };
    let report = waiter.clone().report();
    tokio::pin!(report);
    let mut stop_requested = false;
    let report = loop {
        tokio::select! {
            report = &mut report => break report,
            _ = async { tokio::select! { _ = interrupt.recv() => {}, _ = terminate.recv() => {} } } => {
                if stop_requested {
                    sink.note("stopping it by force");
                    // The earlier deadline wins: the actor force-aborts now.
                    let supervisor = supervisor.clone();
                    tokio::spawn(async move { supervisor.shutdown(Duration::ZERO).await });
                } else {
                    stop_requested = true;
                    sink.note(&format!(
                        "stop requested; waiting up to {} (signal again to stop it now)",
                        format_duration(args.grace)
                    ));
                    supervisor.remove(id);
                }
            }
        }
    };
    // Wait until the instance is gone and the event printer has caught up.
    supervisor.shutdown(Duration::ZERO).await;
    let _ = printer.await;
    sink.clear_progress();
    let history = history(&report);
    if !history.is_empty() {
        sink.note(&format!("{} attempts:", report.attempts));
        for line in &history {
            sink.note(line);
        }
    }
    if let Some(path) = &args.record.record {
        write_records(path, &collected)?;
        let n = collected
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .attempts
            .len();
        let plural = if n == 1 { "" } else { "s" };
        let file = path.display();
        sink.note(&format!(
            "recorded {n} attempt{plural} in {file}: replay with `host replay {file}`"
        ));
    }
    let json = task.json.then(|| JsonResult::new(&report));
    print_result(json.as_ref(), &report, args.raw.raw);
    Ok(outcome_code(&report.outcome))
}

/// Prints one event of the lane, if it is about task `id`.
fn print_event(sink: &StderrSink, id: TaskId, received: Received) {
    let event = match received {
        Received::Event(event) => event,
        Received::Dropped(n) => {
            sink.note(&format!(
                "{n} events were dropped (the guest wrote faster than stderr took it)"
            ));
            return;
        }
    };
    if event.task_id != Some(id) {
        return;
    }
    match (event.kind, event.stream, &event.reason) {
        (EventKind::GuestLog, Some(stream), Some(text)) => sink.line(stream, text),
        (EventKind::Progress, _, _) => sink.status(&format!(
            "attempt {}: {}",
            event.attempt.unwrap_or(0),
            progress_text(event.done.unwrap_or(0), event.total.unwrap_or(0))
        )),
        _ => {
            if let Some(note) = lifecycle_note(&event) {
                sink.note(&note);
            }
        }
    }
}

/// The host-side line for a lifecycle event of the task, if it gets one.
fn lifecycle_note(event: &Event) -> Option<String> {
    let attempt = event.attempt.unwrap_or(0);
    let ms = |v: Option<u64>| format_duration(Duration::from_millis(v.unwrap_or(0)));
    Some(match event.kind {
        EventKind::AttemptStarting => format!("attempt {attempt} started"),
        EventKind::AttemptFailed => format!(
            "attempt {attempt} failed: {}",
            event.reason.as_deref().unwrap_or("no reason given")
        ),
        EventKind::AttemptTimedOut => {
            format!("attempt {attempt} timed out after {}", ms(event.timeout_ms))
        }
        EventKind::BackoffScheduled => match event.source {
            Some(taskhost::supervisor::BackoffSource::Success) => {
                format!("next run in {}", ms(event.delay_ms))
            }
            _ => format!("retrying in {}", ms(event.delay_ms)),
        },
        _ => return None,
    })
}
