//! `host run PLUGIN`: one task in this process, no daemon. Ctrl-C (or
//! SIGTERM) asks the task to stop; after --grace, or on a second signal, the
//! instance is stopped by force.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use taskhost::outcome::TaskOutcome;
use taskhost::runtime::{
    AttemptError, AttemptFacts, AttemptRequest, Runtime, RuntimeConfig, StopSignals,
};
use taskhost::units::{format_duration, parse_duration};
use tokio::signal::unix::{SignalKind, signal};

use super::args::{GlobalArgs, TaskArgs};
use super::report::{JsonResult, StderrSink, print_result};
use super::usage;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    task: TaskArgs,
    /// After Ctrl-C, how long the task may take to stop before it is stopped by force.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    grace: Duration,
}

/// The id of the one task an embedded run registers.
const TASK_ID: u64 = 1;

pub async fn run(global: &GlobalArgs, args: RunArgs) -> anyhow::Result<u8> {
    let task = &args.task;
    let params = task.params()?;
    let sandbox = task.sandbox()?;
    let input = task.input()?;

    let config = RuntimeConfig {
        cache_dir: super::cache_dir(global),
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::new(&config)?;
    let plugin = runtime.load_file(&task.plugin).await.map_err(usage)?;
    let info = plugin.info();
    let name = task
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{TASK_ID}", info.name));
    let slot = match (&task.slot, &info.resource) {
        (Some(slot), _) => slot.clone(),
        (None, Some(template)) => template.fill(&params).map_err(usage)?,
        (None, None) => name.clone(),
    };
    sandbox
        .check_capabilities(&info.capabilities)
        .map_err(usage)?;

    let sink = Arc::new(StderrSink::new(name.clone()));
    let request = AttemptRequest {
        facts: Arc::new(AttemptFacts {
            task_id: TASK_ID,
            name: name.clone(),
            slot: slot.clone(),
            attempt: 1,
            params,
        }),
        input: input.into(),
        sandbox: Arc::new(sandbox),
        sink: sink.clone(),
    };

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let signals = StopSignals::default();
    let timeout = task.timeout.filter(|t| !t.is_zero());
    let started = Instant::now();
    sink.note("attempt 1 started");
    let attempt = runtime.run_attempt(&plugin, &request, &signals);
    tokio::pin!(attempt);

    let far = Duration::from_secs(86400 * 365);
    let timeout_at = tokio::time::Instant::now() + timeout.unwrap_or(far);
    let mut grace_at = tokio::time::Instant::now() + far;
    let (mut timed_out, mut stop_requested, mut forced) = (false, false, false);
    let result = loop {
        tokio::select! {
            result = &mut attempt => break result,
            () = tokio::time::sleep_until(timeout_at), if timeout.is_some() && !timed_out => {
                timed_out = true;
                signals.abort();
            }
            _ = async { tokio::select! { _ = interrupt.recv() => {}, _ = terminate.recv() => {} } } => {
                if stop_requested {
                    forced = true;
                    signals.abort();
                } else {
                    stop_requested = true;
                    grace_at = tokio::time::Instant::now() + args.grace;
                    sink.note(&format!(
                        "stop requested; waiting up to {} (signal again to stop it now)",
                        format_duration(args.grace)
                    ));
                    signals.cancel();
                }
            }
            () = tokio::time::sleep_until(grace_at), if stop_requested && !forced => {
                forced = true;
                signals.abort();
            }
        }
    };
    let took = started.elapsed();
    sink.clear_progress();

    let outcome = if forced {
        TaskOutcome::ForceAborted
    } else if timed_out {
        TaskOutcome::Failed {
            reason: format!(
                "attempt 1 timed out after {}",
                format_duration(timeout.unwrap_or_default())
            ),
            exit_code: None,
        }
    } else if stop_requested {
        TaskOutcome::Canceled
    } else {
        match result {
            Ok(output) => TaskOutcome::Completed { output },
            Err(AttemptError::Fail { reason, exit_code }) => {
                TaskOutcome::Failed { reason, exit_code }
            }
            Err(AttemptError::Fatal { reason, exit_code }) => {
                TaskOutcome::Fatal { reason, exit_code }
            }
            Err(AttemptError::Canceled | AttemptError::Aborted) => TaskOutcome::Canceled,
        }
    };
    let json = task
        .json
        .then(|| JsonResult::new(TASK_ID, &name, &slot, &outcome, 1, took));
    print_result(json.as_ref(), &name, &outcome, 1, took);
    Ok(outcome.process_exit_code())
}
