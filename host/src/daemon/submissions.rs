//! Owns turning a [`SubmitRequest`] into a controller submission: the plugin
//! by digest, the task name and slot, the grants checked against the
//! plugin's capabilities, the policies, a log for its lines; then placing it
//! and remembering it so that later requests (a Wait sent right after, a
//! `host ps`) find it.

use std::sync::Arc;
use std::time::Instant;

use crate::controller::{AdmissionPolicy, Placed, Submission};
use crate::plugin_task::{PluginTask, resolve_slot};
use crate::runtime::Sandbox;
use crate::supervisor::{RestartPolicy, TaskSpec};

use super::connection::Replier;
use super::protocol::{ErrorKind, MAX_SUBMIT_INPUT, Placement, Reply, SubmitRequest, Submitted};
use super::state::Daemon;
use super::tasks::{TaskLog, TaskRecord};

/// Handles one submission, in the order it was sent.
pub(crate) async fn submit(daemon: &Arc<Daemon>, request: SubmitRequest, reply: &Replier) {
    match place(daemon, request).await {
        Ok(submitted) => {
            reply.send(Reply::Submitted(submitted)).await;
        }
        Err((kind, message)) => reply.error(kind, message).await,
    }
}

async fn place(
    daemon: &Arc<Daemon>,
    request: SubmitRequest,
) -> Result<Submitted, (ErrorKind, String)> {
    let invalid = |m: String| (ErrorKind::Invalid, m);
    let controller = &daemon.controller;
    if controller.supervisor().is_shutting_down() {
        return Err((
            ErrorKind::ShuttingDown,
            "the daemon is shutting down".into(),
        ));
    }
    if request.input.len() > MAX_SUBMIT_INPUT {
        return Err(invalid(format!(
            "the input is over the limit of {} bytes",
            MAX_SUBMIT_INPUT
        )));
    }
    let plugin = daemon.plugins.get(&request.plugin).await.ok_or_else(|| {
        (
            ErrorKind::NotFound,
            format!(
                "the daemon does not know plugin {}; upload it first",
                request.plugin
            ),
        )
    })?;
    let info = plugin.info();
    let sandbox = Sandbox {
        dirs: request.dirs,
        env: request.env,
        max_memory: request.max_memory.unwrap_or(daemon.config.max_memory),
    };
    if sandbox.max_memory < 64 << 10 {
        return Err(invalid(
            "--max-memory must be at least 64KiB (one WebAssembly page)".into(),
        ));
    }
    if let Some(dir) = sandbox.dirs.iter().find(|d| !d.host.is_absolute()) {
        return Err(invalid(format!(
            "directory grant `{}` is not an absolute path",
            dir.host.display()
        )));
    }
    sandbox.check_dirs().map_err(|e| invalid(e.to_string()))?;
    sandbox
        .check_capabilities(&info.capabilities)
        .map_err(|e| invalid(e.to_string()))?;

    let reservation = controller.supervisor().reserve();
    let id = reservation.id();
    let name = request
        .name
        .unwrap_or_else(|| format!("{}-{id}", info.name));
    let slot = resolve_slot(
        request.slot.as_deref(),
        info.resource.as_ref(),
        &request.params,
        &name,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let policy = request
        .policy
        .unwrap_or_else(|| AdmissionPolicy::from(info.default_policy));
    let log = TaskLog::new();
    let body = PluginTask::new(daemon.plugins.runtime(), &plugin)
        .input(request.input)
        .params(request.params)
        .sandbox(sandbox)
        .sink(Arc::clone(&log) as _);
    let mut spec = TaskSpec::from_defaults(name.clone(), body)
        .with_slot(slot.clone())
        .with_restart(request.restart.unwrap_or(RestartPolicy::Never))
        .with_max_retries(request.max_retries)
        .with_timeout(request.timeout.unwrap_or_default());
    if let Some(backoff) = request.backoff {
        spec = spec.with_backoff(backoff);
    }

    let (waiter, placed) =
        controller.submit_placed(reservation, Submission::new(spec).policy(policy));
    let placement = match placed {
        Placed::Admitted => Placement::Running,
        Placed::Queued { owner } => Placement::Queued { owner },
        Placed::Replacing { owner } => Placement::Replacing {
            owner,
            name: daemon.tasks.get(owner).map(|r| r.name).unwrap_or_default(),
        },
        Placed::Rejected => Placement::Rejected(waiter.try_outcome().unwrap_or(
            crate::outcome::TaskOutcome::Panicked {
                reason: "a rejected submission has no outcome (host bug)".into(),
            },
        )),
    };
    daemon.tasks.insert(TaskRecord {
        id,
        name: name.clone(),
        slot: slot.clone(),
        plugin: info.name.clone(),
        waiter: waiter.clone(),
        log: Arc::clone(&log),
        submitted: Instant::now(),
        placed: !matches!(placement, Placement::Rejected(_)),
    });
    let watcher = Arc::clone(daemon);
    tokio::spawn(async move {
        waiter.report().await;
        log.close();
        watcher.tasks.finished(id);
    });
    Ok(Submitted {
        id,
        name,
        slot,
        placement,
    })
}
