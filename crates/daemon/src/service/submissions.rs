//! Owns turning a [`SubmitRequest`] into a controller submission: the plugin
//! by digest, the task name and slot, the grants checked against the
//! plugin's capabilities, the policies, a log for its lines; then recording
//! it in the store, placing it, and remembering it so that later requests (a
//! Wait sent right after, a `host ps`) find it. The same path re-places the
//! work a durable store recovered at start, under its old id.
//!
//! Order: the id, the store write and the controller's decision happen
//! under one lock, so the store's order of submissions is the order the
//! controller decided them in (recovery replays that order). The
//! acknowledgement waits for the store's commit; the next request is
//! decided meanwhile (group commit).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use taskhost_core::controller::{AdmissionPolicy, Submission};
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{
    AttemptContext, Reservation, RestartPolicy, Resume, RunFuture, TaskBody, TaskError, TaskId,
    TaskRef, TaskSpec,
};
use taskhost_core::units::format_size;
use taskhost_runtime::PluginInfo;
use taskhost_runtime::plugin_task::{PluginTask, resolve_slot};

use taskhost_runtime::{DirGrant, HttpAllow, Sandbox};

use crate::cluster::node::Cluster;
use crate::config::DirAllow;
use crate::service::keys::{self, KeyEntry};
use crate::service::tasks::{Outcome, TaskLog, TaskRecord};
use crate::state::{Daemon, RecordingGuard};
use crate::store::postgres::Names;
use crate::store::{Finished, Firing, NewTask, Pause, Store, Ticket, now_ms};
use crate::wire::protocol::{
    ErrorKind, MAX_SUBMIT_INPUT, NotBefore, Placement, SubmitRequest, Submitted,
};

/// Where a submission comes from.
pub(crate) enum Origin {
    /// A client sent it now, perhaps with an idempotency key and its
    /// request's fingerprint; or a schedule fired it (`fired`).
    New {
        key: Option<(String, [u8; 32])>,
        fired: Option<Firing>,
    },
    /// The store kept it across a restart; it keeps its id.
    Recovered {
        reservation: Reservation,
        submitted_ms: u64,
        /// Where its attempts and retry budget stood.
        resume: Resume,
    },
}

/// A submission that was placed: acknowledged at once, or once the store
/// has committed it.
pub(crate) enum Accepted {
    Now(Submitted),
    /// Resolves when the store's commit holding it lands; a failed commit
    /// has withdrawn it (not durable, so not accepted).
    Later(BoxFuture<'static, Result<Submitted, (ErrorKind, String)>>),
    /// Resolves when the cluster's database has decided it, in the order
    /// it was sent among the submissions before and after it; what the
    /// same client sends next (other than submissions) waits for it.
    Deciding(BoxFuture<'static, Result<Submitted, (ErrorKind, String)>>),
}

/// Places one submission, in the order it was sent; the caller sends the
/// acknowledgement once it is durable.
pub(crate) async fn submit(
    daemon: &Arc<Daemon>,
    store: &Store,
    request: SubmitRequest,
) -> Result<Accepted, (ErrorKind, String)> {
    let key = match request.idempotency_key.clone() {
        None => None,
        Some(key) => {
            let fingerprint = request.fingerprint();
            if let Some(made) = made_before(daemon, store, &key).await {
                return existing(daemon, store, &key, made, fingerprint).map(Accepted::Now);
            }
            Some((key, fingerprint))
        }
    };
    let (submitted, ticket) = place(
        daemon,
        store,
        request,
        Origin::New {
            key: key.clone(),
            fired: None,
        },
    )
    .await?;
    if ticket.is_immediate() {
        return Ok(Accepted::Now(submitted));
    }
    let daemon = Arc::clone(daemon);
    Ok(Accepted::Later(Box::pin(async move {
        match ticket.committed().await {
            Ok(()) => Ok(submitted),
            Err(err) => {
                if let Some((key, _)) = &key {
                    daemon.keys.release(key, submitted.id);
                }
                daemon.controller.remove(submitted.id);
                Err((
                    ErrorKind::Internal,
                    format!("the submission could not be stored, so it was not accepted: {err}"),
                ))
            }
        }
    })))
}

/// What `key` made, if this process or the store remembers it.
async fn made_before(daemon: &Arc<Daemon>, store: &Store, key: &str) -> Option<KeyEntry> {
    if let Some(entry) = daemon.keys.get(key) {
        return Some(entry);
    }
    if !store.is_durable() {
        return None;
    }
    let (store, key, since) = (store.clone(), key.to_owned(), daemon.keys.cutoff_ms());
    tokio::task::spawn_blocking(move || store.key(&key, since))
        .await
        .ok()
        .flatten()
        .map(|(id, fingerprint, created_ms)| KeyEntry {
            id,
            fingerprint,
            created_ms,
        })
}

/// The answer to a submission whose key made a task before: that task
/// (its placement is not told again), or, for another request, the
/// refusal naming it.
fn existing(
    daemon: &Daemon,
    store: &Store,
    key: &str,
    made: KeyEntry,
    fingerprint: [u8; 32],
) -> Result<Submitted, (ErrorKind, String)> {
    if made.fingerprint != fingerprint {
        return Err((ErrorKind::Conflict, keys::conflict(key, made.id)));
    }
    let id = made.id;
    let (name, slot, placement) = match daemon.tasks.resolve(&TaskRef::Id(id), &daemon.controller) {
        Some(record) => (record.name, record.slot, Placement::Running),
        None => match store.finished_task(id) {
            Some(finished) => (
                finished.report.name.to_string(),
                finished.report.slot.to_string(),
                Placement::Running,
            ),
            None => (id.to_string(), String::new(), Placement::Running),
        },
    };
    Ok(Submitted {
        id,
        name,
        slot,
        placement,
        existing: true,
    })
}

/// Refuses outbound HTTP grants beyond the daemon's own `allow_http`,
/// naming the first one and how the operator widens the ceiling.
fn check_http_ceiling(ceiling: &[HttpAllow], wanted: &[HttpAllow]) -> Result<(), String> {
    let Some(over) = HttpAllow::first_uncovered(ceiling, wanted) else {
        return Ok(());
    };
    Err(if ceiling.is_empty() {
        format!(
            "--allow-http {over}: this daemon allows no outbound HTTP; its operator can allow \
             it with `allow_http = [\"{over}\"]` in the config file or `host serve --allow-http {over}`"
        )
    } else {
        let allowed: Vec<String> = ceiling.iter().map(ToString::to_string).collect();
        format!(
            "--allow-http {over} is beyond what this daemon allows ({}); ask for one of \
             those, or its operator can add `{over}` to allow_http in the config file \
             or `host serve --allow-http {over}`",
            allowed.join(", ")
        )
    })
}

/// Refuses a directory grant outside the daemon's `allow_dirs` (compared
/// once symbolic links and `..` are resolved), or a writable one under a
/// read-only entry.
fn check_dir_ceiling(allowed: &[DirAllow], dirs: &[DirGrant]) -> Result<(), String> {
    let roots: Vec<(std::path::PathBuf, &DirAllow)> = allowed
        .iter()
        .filter_map(|a| Some((std::fs::canonicalize(&a.path).ok()?, a)))
        .collect();
    for dir in dirs {
        let real = std::fs::canonicalize(&dir.host).map_err(|e| {
            format!(
                "directory grant `{}` cannot be resolved: {e}",
                dir.host.display()
            )
        })?;
        let within = |(root, _): &&(std::path::PathBuf, &DirAllow)| real.starts_with(root);
        if roots
            .iter()
            .filter(within)
            .any(|(_, a)| dir.read_only || !a.read_only)
        {
            continue;
        }
        let grant = format!("{}::{}", dir.host.display(), dir.guest);
        return Err(if roots.iter().any(|r| within(&r)) {
            format!(
                "--dir {grant}: this daemon allows only read-only grants there; add `:ro`, \
                 or its operator can allow writing with `host serve --allow-dir {}`",
                dir.host.display()
            )
        } else if allowed.is_empty() {
            format!(
                "--dir {grant}: this daemon allows no directory grants; its operator can \
                 allow some with `host serve --allow-dir {}` or `allow_dirs = [\"{}\"]` in \
                 the config file",
                dir.host.display(),
                dir.host.display()
            )
        } else {
            let shown: Vec<String> = allowed.iter().map(ToString::to_string).collect();
            format!(
                "--dir {grant} is outside the directories this daemon allows ({}); grant \
                 one under those, or its operator can add it with `host serve --allow-dir {}`",
                shown.join(", "),
                dir.host.display()
            )
        });
    }
    Ok(())
}

/// Refuses an environment variable the daemon's `allow_env` does not name.
fn check_env_ceiling<'a>(
    allowed: &[String],
    mut names: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    let covered = |name: &str| {
        allowed.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => a == name,
        })
    };
    match names.find(|name| !covered(name)) {
        None => Ok(()),
        Some(name) => Err(format!(
            "--env {name}: this daemon does not let submissions set `{name}` (its allow_env: \
             {}); its operator can add it with `host serve --allow-env {name}`",
            if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.join(", ")
            }
        )),
    }
}

/// Refuses a memory limit above the daemon's `memory_ceiling`, naming both
/// and the fix: `asked` is the submission's `--max-memory`, `limit` what
/// its attempts would get (the daemon's default when it asked for none).
fn check_memory_ceiling(ceiling: u64, asked: Option<u64>, limit: u64) -> Result<(), String> {
    if limit <= ceiling {
        return Ok(());
    }
    let (limit_text, ceiling_text) = (format_size(limit), format_size(ceiling));
    Err(match asked {
        Some(_) => format!(
            "--max-memory {limit_text} is above this daemon's memory ceiling of \
             {ceiling_text}; ask for {ceiling_text} or less, or its operator can raise it \
             with `host serve --memory-ceiling {limit_text}` or `memory_ceiling = \
             \"{limit_text}\"` in the config file"
        ),
        None => format!(
            "this daemon's default memory limit ({limit_text}, its max_memory) is above its \
             memory ceiling of {ceiling_text}; ask for --max-memory {ceiling_text} or less, \
             or its operator can lower max_memory or raise memory_ceiling"
        ),
    })
}

/// A submission's name, slot and policy once it has its id, written once
/// for a daemon and for a cluster: the name given, else `<plugin>-<id>`
/// (`<schedule>-<id>` for a schedule's firing); the slot given, else the
/// plugin's resource template filled from the params, else the name (the
/// schedule's name for its firings); the policy given, else the plugin's
/// default.
pub(crate) fn naming(
    request: &SubmitRequest,
    info: &PluginInfo,
    id: TaskId,
) -> Result<(String, String, AdmissionPolicy), String> {
    let name = request.name.clone().unwrap_or_else(|| {
        let prefix = request.schedule.as_deref().unwrap_or(&info.name);
        format!("{prefix}-{id}")
    });
    // A schedule's firings share the schedule's slot unless told
    // otherwise, so that its policy decides what an overlap does.
    let slot = resolve_slot(
        request.slot.as_deref(),
        info.resource.as_ref(),
        &request.params,
        request.schedule.as_deref().unwrap_or(&name),
    )
    .map_err(|e| e.to_string())?;
    let policy = request
        .policy
        .unwrap_or_else(|| AdmissionPolicy::from(info.default_policy));
    Ok((name, slot, policy))
}

/// [`naming`] for the cluster's database, which gives the id.
pub(crate) fn names(request: &SubmitRequest, info: &PluginInfo) -> Names {
    let (request, info) = (request.clone(), info.clone());
    Box::new(move |id| naming(&request, &info, id))
}

/// The checks every submission passes before anything is recorded: the
/// daemon is taking work, the input fits, the plugin is known, the grants
/// are valid and cover what the plugin declares. Returns the plugin and the
/// sandbox its attempts get.
pub(crate) async fn check(
    daemon: &Daemon,
    request: &SubmitRequest,
) -> Result<(Arc<taskhost_runtime::Plugin>, Sandbox), (ErrorKind, String)> {
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
        dirs: request.dirs.clone(),
        env: request.env.clone(),
        secrets: request.secrets.clone(),
        config: request.config.clone(),
        kv: request.kv.clone(),
        http: request.allow_http.clone(),
        max_memory: request.max_memory.unwrap_or(daemon.config.max_memory),
    };
    if sandbox.max_memory < 64 << 10 {
        return Err(invalid(
            "--max-memory must be at least 64KiB (one WebAssembly page)".into(),
        ));
    }
    check_memory_ceiling(
        daemon.config.memory_ceiling,
        request.max_memory,
        sandbox.max_memory,
    )
    .map_err(invalid)?;
    if let Some(dir) = sandbox.dirs.iter().find(|d| !d.host.is_absolute()) {
        return Err(invalid(format!(
            "directory grant `{}` is not an absolute path",
            dir.host.display()
        )));
    }
    sandbox.check_dirs().map_err(|e| invalid(e.to_string()))?;
    for secret in &sandbox.secrets {
        taskhost_runtime::check_secret_name(&secret.name).map_err(|e| invalid(e.to_string()))?;
    }
    sandbox
        .check_secrets()
        .map_err(|e| invalid(e.to_string()))?;
    for bucket in &sandbox.kv {
        taskhost_runtime::kv::check_bucket_name(bucket).map_err(invalid)?;
        if !daemon.config.allow_kv.contains(bucket) {
            return Err(invalid(format!(
                "--kv {bucket}: this daemon does not share bucket `{bucket}` (its allow_kv: {}); \
                 its operator can add it with `host serve --allow-kv {bucket}`",
                if daemon.config.allow_kv.is_empty() {
                    "none".to_owned()
                } else {
                    daemon.config.allow_kv.join(", ")
                }
            )));
        }
    }
    let allow_dirs = match &daemon.config.allow_dirs {
        Some(allowed) => Some(allowed.as_slice()),
        None if daemon.cluster().is_some() => Some(&[][..]),
        None => None,
    };
    if let Some(allowed) = allow_dirs {
        check_dir_ceiling(allowed, &sandbox.dirs).map_err(invalid)?;
    }
    if let Some(allowed) = &daemon.config.allow_env {
        let names = sandbox.env.iter().map(|(k, _)| k.as_str());
        let secret_vars = sandbox.secrets.iter().map(|s| s.var.as_str());
        check_env_ceiling(allowed, names.chain(secret_vars)).map_err(invalid)?;
    }
    check_http_ceiling(&daemon.config.allow_http, &sandbox.http).map_err(invalid)?;
    sandbox
        .check_capabilities(&info.capabilities)
        .map_err(|e| invalid(e.to_string()))?;

    Ok((plugin, sandbox))
}

/// Validates, records and places one submission.
pub(crate) async fn place(
    daemon: &Arc<Daemon>,
    store: &Store,
    mut request: SubmitRequest,
    origin: Origin,
) -> Result<(Submitted, Ticket), (ErrorKind, String)> {
    let invalid = |m: String| (ErrorKind::Invalid, m);
    let controller = &daemon.controller;
    let (plugin, sandbox) = check(daemon, &request).await?;
    let info = plugin.info();

    // From here to the decision, one submission at a time.
    let admission = daemon
        .admission
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A plugin removed (`host plugins rm|prune`) after it was looked up
    // above is gone now: nothing accepted may refer to it.
    if !daemon.plugins.is_stored(&request.plugin) {
        return Err((
            ErrorKind::NotFound,
            format!(
                "plugin {} was just removed from the daemon; upload it again",
                request.plugin
            ),
        ));
    }
    let recovered = matches!(origin, Origin::Recovered { .. });
    let mut key = None;
    let mut fired = None;
    let (reservation, submitted_ms, resume) = match origin {
        Origin::New {
            key: keyed,
            fired: firing,
        } => {
            // Under the admission lock: one of two submissions of a key
            // sent together is placed, the other finds it.
            if let Some((k, fingerprint)) = &keyed
                && let Some(made) = daemon.keys.get(k)
            {
                drop(admission);
                return existing(daemon, store, k, made, *fingerprint)
                    .map(|submitted| (submitted, Ticket::done()));
            }
            key = keyed;
            fired = firing;
            (
                controller.supervisor().reserve(),
                now_ms(),
                Resume::default(),
            )
        }
        Origin::Recovered {
            reservation,
            submitted_ms,
            resume,
        } => (reservation, submitted_ms, resume),
    };
    let id = reservation.id();
    let (name, slot, policy) = naming(&request, info, id).map_err(invalid)?;
    // A spawned task counts in its tree until it finishes (recovered
    // work counts whatever the bound: it was accepted before).
    if let Some(root) = request.root {
        let max = (!recovered).then_some(daemon.config.max_descendants);
        daemon.children.descend(root, max).map_err(invalid)?;
    }
    let root = request.root;
    if let Some((k, fingerprint)) = &key {
        let entry = KeyEntry {
            id,
            fingerprint: *fingerprint,
            created_ms: submitted_ms,
        };
        // Free: checked under this same lock just above.
        let _ = daemon.keys.claim(k, entry);
    }
    // Admitted at once with a permit free: the submission is recorded with
    // its first attempt started, and that attempt waits for this same commit
    // (one commit fewer between a submission and its outcome). Under the
    // admission lock nothing else is placed meanwhile; should another attempt
    // take the last permit first, this task waits recorded as started, and a
    // crash then ends a run-once task as interrupted: never run twice.
    // Only when the writer is idle: under a stream of submissions the
    // attempt's own write joins a later group commit anyway, and starting
    // the attempts early takes the CPU from the intake.
    // A delayed submission keeps its due time (a `--delay` from now);
    // until then it waits outside its slot.
    let due_ms = request.not_before.map(|at| at.at(submitted_ms));
    request.not_before = due_ms.map(NotBefore::At);
    let now = now_ms();
    let wait = due_ms
        .filter(|due| *due > now)
        .map(|due| Duration::from_millis(due - now));
    let started = store.is_durable()
        && !recovered
        && wait.is_none()
        && store.is_idle()
        && controller.is_slot_free(&slot)
        && controller.supervisor().free_permits() != Some(0);
    // Kept resolved (for the store and `host rerun`), so a recovery or a
    // rerun places it exactly the same way.
    let mut resolved = request.clone();
    resolved.name = Some(name.clone());
    resolved.slot = Some(slot.clone());
    resolved.policy = Some(policy);
    let resolved = Arc::new(resolved);
    let ticket = if store.is_durable() && !recovered {
        store.submit(NewTask {
            id,
            name: name.clone(),
            slot: slot.clone(),
            plugin: info.name.clone(),
            request: Arc::clone(&resolved),
            submitted_ms,
            started,
            key,
            fired: fired.clone(),
        })
    } else {
        Ticket::done()
    };
    let log = TaskLog::new();
    let plugin_task = PluginTask::new(daemon.plugins.runtime(), &plugin)
        .input(std::mem::take(&mut request.input))
        .params(std::mem::take(&mut request.params))
        .sandbox(sandbox)
        .sink(Arc::clone(&log) as _);
    let body: Arc<dyn TaskBody> = if store.is_durable() {
        Arc::new(Recorded::stored(
            id,
            plugin_task,
            store.clone(),
            started.then(|| ticket.clone()),
        ))
    } else {
        Arc::new(plugin_task)
    };
    let mut spec = spec_for(&request, name.clone(), slot.clone(), body, resume);
    // Its first attempt's start is measured from its due time: a schedule
    // firing's, or the time a delayed submission was held for (not a time
    // already past when it was submitted).
    if let Some(due) =
        due_ms.filter(|due| wait.is_none() && (*due >= submitted_ms || fired.is_some()))
    {
        let late = Duration::from_millis(now.saturating_sub(due));
        let now = tokio::time::Instant::now();
        spec = spec.due(now.checked_sub(late).unwrap_or(now));
    }
    let mut submission = Submission::new(spec).policy(policy);
    if let Some(wait) = wait {
        submission = submission.not_before(tokio::time::Instant::now() + wait);
    }
    let (waiter, mut placement) = controller.submit_placed(reservation, submission);
    // The time as it was given (the controller's is counted on its clock).
    if let (Placement::Delayed { due_ms: told }, Some(due)) = (&mut placement, due_ms) {
        *told = due;
    }
    if let Placement::Replacing { owner, .. } = &placement {
        store.stopping(*owner);
    }
    let age = Duration::from_millis(now_ms().saturating_sub(submitted_ms));
    let outcome = Outcome::new();
    daemon.tasks.insert(TaskRecord {
        id,
        name: name.clone(),
        slot: slot.clone(),
        plugin: info.name.clone(),
        digest: request.plugin,
        outcome: outcome.clone(),
        log: Arc::clone(&log),
        submitted: Instant::now().checked_sub(age).unwrap_or_else(Instant::now),
        placed: !matches!(placement, Placement::Rejected(_)),
        request: Some(resolved),
    });
    drop(admission);

    let watcher = Arc::clone(daemon);
    let store = store.clone();
    let plugin_name = info.name.clone();
    let recording = RecordingGuard::new(daemon);
    // A firing whose commit fails was not made (the next start catches it
    // up, as it would after a crash): its task is withdrawn. (A client's
    // submission is withdrawn by `submit`, which answers it.)
    let firing = fired.is_some().then(|| ticket.clone());
    // What the task's end does: record the outcome (on a durable store),
    // then show it. It runs when the supervisor delivers the report, not in
    // a task spawned now beside the attempt: a second task spawned here
    // would push the attempt out of this worker's next slot and wake the
    // other worker to take it.
    let finish = move |report: Arc<taskhost_core::supervisor::TaskReport>| async move {
        let _recording = recording;
        if let Some(root) = root {
            watcher.children.ascend(root);
        }
        log.close();
        if store.is_durable() {
            if watcher.keep_unfinished.load(Ordering::SeqCst)
                && left_for_next_start(&report.outcome)
            {
                // Stopped by a graceful stop that keeps work: the next
                // start decides its end. Nobody sees an outcome now.
                return;
            }
            let finished = Finished::now((*report).clone(), plugin_name, log.lines(), submitted_ms);
            // Nobody sees an outcome the store does not hold (a crash
            // would take it back): a failed write (a full disk) is retried
            // until it lands; a stop meanwhile leaves the task to the next
            // start, which decides it as interrupted.
            let mut delay = Duration::from_millis(50);
            while let Err(err) = store.finished(finished.clone()).committed().await {
                tracing::error!(
                    task = %id,
                    "cannot record the outcome ({err}); retrying in {}",
                    taskhost_core::units::format_duration(delay)
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
        outcome.set(report);
        watcher.tasks.finished(id);
    };
    match firing {
        Some(firing) => {
            let withdraw = Arc::clone(daemon);
            tokio::spawn(async move {
                if let Err(err) = firing.committed().await {
                    tracing::error!(task = %id, "a schedule's firing could not be stored: {err}");
                    withdraw.controller.remove(id);
                }
                finish(waiter.report().await).await;
            });
        }
        None => {
            let runtime = tokio::runtime::Handle::current();
            waiter.on_report(move |report| {
                let mut finishing = Box::pin(finish(report));
                // Without a durable store it is done at once, here.
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                if finishing.as_mut().poll(&mut cx).is_pending() {
                    runtime.spawn(finishing);
                }
            });
        }
    }
    Ok((
        Submitted {
            id,
            name,
            slot,
            placement,
            existing: false,
        },
        ticket,
    ))
}

/// The supervisor's spec of a submission's task: its policies from the
/// request, resuming where it stood.
pub(crate) fn spec_for(
    request: &SubmitRequest,
    name: String,
    slot: String,
    body: Arc<dyn TaskBody>,
    resume: Resume,
) -> TaskSpec {
    let mut spec = TaskSpec::with_body(name, body)
        .with_slot(slot)
        .with_restart(request.restart.unwrap_or(RestartPolicy::Never))
        .with_max_retries(request.max_retries)
        .with_timeout(request.timeout.unwrap_or_default())
        .with_priority(request.priority)
        .resuming(resume);
    if let Some(schedule) = &request.schedule {
        spec = spec.with_schedule(schedule.as_str());
    }
    if let Some(parent) = request.parent {
        spec = spec.with_parent(TaskId::from_u64(parent));
    }
    if let Some(backoff) = request.backoff.clone() {
        spec = spec.with_backoff(backoff);
    }
    spec
}

/// The outcomes a graceful stop with a durable store gives, which the next
/// start replaces with the real end.
pub(crate) fn left_for_next_start(outcome: &TaskOutcome) -> bool {
    matches!(
        outcome,
        TaskOutcome::Canceled
            | TaskOutcome::ForceAborted
            | TaskOutcome::Rejected {
                kind: RejectionKind::ShuttingDown,
                ..
            }
    )
}

/// A plugin task whose attempts start only once they are recorded, so that
/// after a crash a started attempt is never mistaken for one that never
/// ran (a run-once task must not run twice); its pauses are recorded too.
pub(crate) struct Recorded {
    id: TaskId,
    task: PluginTask,
    journal: Journal,
}

/// Where a [`Recorded`] task's attempts are written.
enum Journal {
    /// One host's durable store; `first` is the submission's commit when it
    /// recorded attempt 1 as started.
    Store {
        store: Store,
        first: Mutex<Option<Ticket>>,
    },
    /// The cluster's database, every write conditional on the claim's
    /// fencing token: once the claim is taken away, no attempt starts.
    Claim {
        cluster: Arc<Cluster>,
        token: i64,
        /// The last pause's write, which the next attempt's write follows.
        last_write: Mutex<Option<tokio::task::JoinHandle<()>>>,
    },
}

impl Recorded {
    /// Attempts recorded in one host's store.
    pub(crate) fn stored(
        id: TaskId,
        task: PluginTask,
        store: Store,
        first: Option<Ticket>,
    ) -> Self {
        let first = Mutex::new(first);
        let journal = Journal::Store { store, first };
        Self { id, task, journal }
    }

    /// Attempts of a claimed task, recorded under its token.
    pub(crate) fn claimed(id: TaskId, task: PluginTask, cluster: Arc<Cluster>, token: i64) -> Self {
        let last_write = Mutex::new(None);
        let journal = Journal::Claim {
            cluster,
            token,
            last_write,
        };
        Self { id, task, journal }
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

impl TaskBody for Recorded {
    fn attempt(&self, ctx: AttemptContext) -> BoxFuture<'static, Result<RunFuture, TaskError>> {
        let task = self.task.clone();
        let unrecorded = |e| TaskError::fail(format!("the attempt could not be recorded: {e}"));
        match &self.journal {
            Journal::Store { store, first } => {
                let first = if ctx.attempt() == 1 {
                    take(first)
                } else {
                    None
                };
                let ticket =
                    first.unwrap_or_else(|| store.attempt_started(ctx.task_id(), ctx.attempt()));
                Box::pin(async move {
                    ticket.committed().await.map_err(unrecorded)?;
                    task.attempt(ctx).await
                })
            }
            Journal::Claim {
                cluster,
                token,
                last_write,
            } => {
                let before = take(last_write);
                let (cluster, id, token) = (Arc::clone(cluster), self.id, *token);
                Box::pin(async move {
                    if let Some(before) = before {
                        let _ = before.await;
                    }
                    // Tried again while the database is away and this node
                    // holds the claim; a stop meanwhile ends the attempt
                    // before it starts.
                    let attempt = ctx.attempt();
                    let started = tokio::select! {
                        biased;
                        () = ctx.cancellation().cancelled() => return Err(TaskError::Canceled),
                        started = cluster.while_held(id, token, "recording an attempt's start", || {
                            cluster.pg.attempt_started(id, token, attempt)
                        }) => started,
                    };
                    match started {
                        Some(Ok(true)) => task.attempt(ctx).await,
                        Some(Ok(false)) | None => Err(TaskError::fatal(
                            "this node's claim on the task was taken over (its lease ran out); \
                             another node runs it",
                        )),
                        Some(Err(err)) => Err(unrecorded(err)),
                    }
                })
            }
        }
    }

    fn hurry(
        &self,
        deadline: std::time::Instant,
        abort: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Option<Box<dyn Send>> {
        self.task.hurry(deadline, abort)
    }

    fn pausing(&self, next: Resume) {
        let pause = Pause {
            until_ms: now_ms().saturating_add(next.delay.as_millis() as u64),
            failures: next.failures,
        };
        match &self.journal {
            Journal::Store { store, .. } => store.pausing(self.id, next.attempts, pause),
            Journal::Claim {
                cluster,
                token,
                last_write,
            } => {
                let (cluster, id, token) = (Arc::clone(cluster), self.id, *token);
                let write = tokio::spawn(async move {
                    let written = cluster
                        .while_held(id, token, "recording a pause", || {
                            cluster.pg.pausing(id, token, next.attempts, pause)
                        })
                        .await;
                    if let Some(Err(err)) = written {
                        tracing::warn!(task = %id, "cannot record a pause: {err}");
                    }
                });
                *last_write.lock().unwrap_or_else(PoisonError::into_inner) = Some(write);
            }
        }
    }

    fn describe(&self) -> String {
        self.task.describe()
    }

    fn code_digest(&self) -> Option<String> {
        self.task.code_digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_above_the_ceiling_names_both_and_the_fix() {
        assert_eq!(
            check_memory_ceiling(64 << 20, Some(64 << 20), 64 << 20),
            Ok(())
        );
        assert_eq!(check_memory_ceiling(64 << 20, None, 32 << 20), Ok(()));
        assert_eq!(
            check_memory_ceiling(64 << 20, Some(128 << 20), 128 << 20).unwrap_err(),
            "--max-memory 128MiB is above this daemon's memory ceiling of 64MiB; ask for \
             64MiB or less, or its operator can raise it with `host serve --memory-ceiling \
             128MiB` or `memory_ceiling = \"128MiB\"` in the config file"
        );
        let default = check_memory_ceiling(64 << 20, None, 256 << 20).unwrap_err();
        assert!(
            default.starts_with("this daemon's default memory limit (256MiB"),
            "{default}"
        );
    }
}
