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

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use taskhost_core::controller::Submission;
use taskhost_core::supervisor::{Reservation, Resume, TaskBody, TaskId, TaskRef, TaskWaiter};
use taskhost_runtime::plugin_task::PluginTask;

use taskhost_runtime::Sandbox;

use crate::backend::OneHost;
use crate::backend::daemon::{Daemon, RecordingGuard};
use crate::backend::record::Recorded;
use crate::service::error::ServiceError;
use crate::service::intake::{
    check_dir_ceiling, check_env_ceiling, check_http_ceiling, check_memory_ceiling,
    left_for_next_start, naming, spec_for,
};
use crate::service::keys::{self, KeyEntry, Keys};
use crate::service::tasks::{Outcome, TaskLog, TaskRecord};
use crate::store::{Finished, Firing, NewTask, Store, Ticket, now_ms};
use crate::wire::protocol::{
    MAX_SUBMIT_INPUT, NotBefore, Placement, Quota, SubmitRequest, Submitted,
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
    Later(BoxFuture<'static, Result<Submitted, ServiceError>>),
    /// Resolves when the cluster's database has decided it, in the order
    /// it was sent among the submissions before and after it; what the
    /// same client sends next (other than submissions) waits for it.
    Deciding(BoxFuture<'static, Result<Submitted, ServiceError>>),
}

/// Places one submission, in the order it was sent; the caller sends the
/// acknowledgement once it is durable.
pub(crate) async fn submit(
    daemon: &Arc<Daemon>,
    host: &OneHost,
    request: SubmitRequest,
) -> Result<Accepted, ServiceError> {
    let key = match request.idempotency_key.clone() {
        None => None,
        Some(key) => {
            let fingerprint = request.fingerprint();
            if let Some(made) = made_before(host, &key).await {
                return existing(daemon, &host.store, &key, made, fingerprint).map(Accepted::Now);
            }
            Some((key, fingerprint))
        }
    };
    let (submitted, ticket) = place(
        daemon,
        host,
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
                if let (Some((key, _)), Some(host)) = (&key, daemon.one_host()) {
                    host.keys.release(key, submitted.id);
                }
                daemon.controller.remove(submitted.id);
                Err(ServiceError::Internal(format!(
                    "the submission could not be stored, so it was not accepted: {err}"
                )))
            }
        }
    })))
}

/// What `key` made, if this process or the store remembers it.
async fn made_before(host: &OneHost, key: &str) -> Option<KeyEntry> {
    if let Some(entry) = host.keys.get(key) {
        return Some(entry);
    }
    if !host.store.is_durable() {
        return None;
    }
    let (store, key, since) = (host.store.clone(), key.to_owned(), host.keys.cutoff_ms());
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
) -> Result<Submitted, ServiceError> {
    if made.fingerprint != fingerprint {
        return Err(ServiceError::Conflict(keys::conflict(key, made.id)));
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

/// The checks every submission passes before anything is recorded: the
/// daemon is taking work, the input fits, the plugin is known, the grants
/// are valid and cover what the plugin declares. Returns the plugin and the
/// sandbox its attempts get.
pub(crate) async fn check(
    daemon: &Daemon,
    request: &SubmitRequest,
) -> Result<(Arc<taskhost_runtime::Plugin>, Sandbox), ServiceError> {
    let invalid = |m: String| ServiceError::Invalid(m);
    let controller = &daemon.controller;
    if controller.supervisor().is_shutting_down() {
        return Err(ServiceError::Unavailable(
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
        ServiceError::NotFound(format!(
            "the daemon does not know plugin {}; upload it first",
            request.plugin
        ))
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
    host: &OneHost,
    mut request: SubmitRequest,
    origin: Origin,
) -> Result<(Submitted, Ticket), ServiceError> {
    let store = &host.store;
    let invalid = |m: String| ServiceError::Invalid(m);
    crate::backend::deployments::resolve(host, &mut request)?;
    let (plugin, sandbox) = check(daemon, &request).await?;
    let info = plugin.info();
    // What `ps` shows: the deployment's `NAME@VERSION`, else the plugin's.
    let shown = request
        .deployment
        .clone()
        .unwrap_or_else(|| info.name.clone());

    // From here to the decision, one submission at a time.
    let admission = daemon
        .admission
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    still_stored(daemon, &request)?;
    let Start {
        reservation,
        submitted_ms,
        resume,
        key,
        fired,
        recovered,
    } = match begin(daemon, &host.keys, origin) {
        Begin::Placing(start) => start,
        Begin::Made(k, made, fingerprint) => {
            drop(admission);
            return existing(daemon, store, &k, made, fingerprint)
                .map(|submitted| (submitted, Ticket::done()));
        }
    };
    let id = reservation.id();
    let (name, slot, policy) = naming(&request, info, id).map_err(invalid)?;
    count(
        daemon,
        &host.keys,
        &request,
        key.as_ref(),
        id,
        submitted_ms,
        recovered,
    )
    .map_err(invalid)?;
    let root = request.root;
    // A delayed submission keeps its due time (a `--delay` from now);
    // until then it waits outside its slot.
    let due_ms = request.not_before.map(|at| at.at(submitted_ms));
    request.not_before = due_ms.map(NotBefore::At);
    let now = now_ms();
    let wait = due_ms
        .filter(|due| *due > now)
        .map(|due| Duration::from_millis(due - now));
    let started =
        store.is_durable() && !recovered && wait.is_none() && starts_at_once(daemon, store, &slot);
    // Kept resolved (for the store and `host rerun`), so a recovery or a
    // rerun places it exactly the same way.
    let resolved = Arc::new(SubmitRequest {
        name: Some(name.clone()),
        slot: Some(slot.clone()),
        policy: Some(policy),
        ..request.clone()
    });
    let ticket = if store.is_durable() && !recovered {
        store.submit(NewTask {
            id,
            name: name.clone(),
            slot: slot.clone(),
            plugin: shown.clone(),
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
    let body = body_of(
        daemon,
        &plugin,
        sandbox,
        &mut request,
        &log,
        store
            .is_durable()
            .then(|| (store, started.then(|| ticket.clone()))),
        id,
    );
    let mut spec = spec_for(&request, name.clone(), slot.clone(), body, resume)
        .with_declared_capacity(info.capacity);
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
    let submission = Submission::new(spec).policy(policy);
    let (waiter, placement) = hand_over(daemon, store, reservation, submission, due_ms, wait);
    let age = Duration::from_millis(now_ms().saturating_sub(submitted_ms));
    let outcome = Outcome::new();
    daemon.tasks.insert(TaskRecord {
        id,
        name: name.clone(),
        slot: slot.clone(),
        plugin: shown.clone(),
        digest: request.plugin,
        outcome: outcome.clone(),
        log: Arc::clone(&log),
        submitted: Instant::now().checked_sub(age).unwrap_or_else(Instant::now),
        placed: !matches!(placement, Placement::Rejected(_)),
        request: Some(resolved),
    });
    drop(admission);

    on_end(
        daemon,
        store,
        waiter,
        Ending {
            id,
            root,
            log,
            outcome,
            plugin: shown,
            submitted_ms,
            // A firing whose commit fails was not made (the next start
            // catches it up, as it would after a crash): its task is
            // withdrawn. (A client's submission is withdrawn by `submit`,
            // which answers it.)
            firing: fired.is_some().then(|| ticket.clone()),
        },
    );
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

/// Refuses a submission whose plugin was removed (`host plugins
/// rm|prune`) after it was looked up: nothing accepted may refer to it.
fn still_stored(daemon: &Daemon, request: &SubmitRequest) -> Result<(), ServiceError> {
    if daemon.plugins.is_stored(&request.plugin) {
        return Ok(());
    }
    Err(ServiceError::NotFound(format!(
        "plugin {} was just removed from the daemon; upload it again",
        request.plugin
    )))
}

/// Where a new submission starts, or the task its idempotency key already
/// made.
enum Begin {
    Placing(Start),
    /// The key, the task it made, the new request's fingerprint.
    Made(String, KeyEntry, [u8; 32]),
}

/// A submission's id and time, where its attempts stand, and what it
/// brings.
struct Start {
    reservation: Reservation,
    submitted_ms: u64,
    resume: Resume,
    key: Option<(String, [u8; 32])>,
    fired: Option<Firing>,
    /// The store kept it across a restart.
    recovered: bool,
}

/// Where a submission starts (under the admission lock: of two
/// submissions of a key sent together one is placed, the other finds it).
fn begin(daemon: &Daemon, keys: &Keys, origin: Origin) -> Begin {
    match origin {
        Origin::New { key, fired } => {
            if let Some((k, fingerprint)) = &key
                && let Some(made) = keys.get(k)
            {
                return Begin::Made(k.clone(), made, *fingerprint);
            }
            Begin::Placing(Start {
                reservation: daemon.controller.supervisor().reserve(),
                submitted_ms: now_ms(),
                resume: Resume::default(),
                key,
                fired,
                recovered: false,
            })
        }
        Origin::Recovered {
            reservation,
            submitted_ms,
            resume,
        } => Begin::Placing(Start {
            reservation,
            submitted_ms,
            resume,
            key: None,
            fired: None,
            recovered: true,
        }),
    }
}

/// Counts a submission where it counts: a spawned task in its tree until
/// it finishes (recovered work whatever the bound: it was accepted
/// before), a key as the one that made it (free: checked under the same
/// admission lock).
fn count(
    daemon: &Daemon,
    keys: &Keys,
    request: &SubmitRequest,
    key: Option<&(String, [u8; 32])>,
    id: TaskId,
    submitted_ms: u64,
    recovered: bool,
) -> Result<(), String> {
    if let Some(root) = request.root {
        // A namespace's own bound, when it is the lower one.
        let ns = crate::service::namespace::Ns::named(request.namespace.as_deref());
        let quota = daemon
            .namespaces
            .settings(&ns)
            .limit(Quota::Descendants)
            .map(|q| q.min(usize::MAX as u64) as usize)
            .filter(|q| *q < daemon.config.max_descendants && !recovered);
        match quota {
            Some(quota) => daemon.trees.descend(root, Some(quota)).map_err(|_| {
                crate::service::namespace::over_quota(
                    &ns,
                    Quota::Descendants,
                    quota as u64,
                    "unfinished descendants of one spawn tree",
                )
                .to_string()
            })?,
            None => {
                let max = (!recovered).then_some(daemon.config.max_descendants);
                daemon.trees.descend(root, max)?;
            }
        }
    }
    if let Some((k, fingerprint)) = key {
        let entry = KeyEntry {
            id,
            fingerprint: *fingerprint,
            created_ms: submitted_ms,
        };
        let _ = keys.claim(k, entry);
    }
    Ok(())
}

/// Whether a new submission due now is recorded with its first attempt
/// started: admitted at once with a permit free, that attempt waits for
/// this same commit (one commit fewer between a submission and its
/// outcome). Under the admission lock nothing else is placed meanwhile;
/// should another attempt take the last permit first, this task waits
/// recorded as started, and a crash then ends a run-once task as
/// interrupted: never run twice. Only when the writer is idle: under a
/// stream of submissions the attempt's own write joins a later group
/// commit anyway, and starting the attempts early takes the CPU from the
/// intake.
fn starts_at_once(daemon: &Daemon, store: &Store, slot: &str) -> bool {
    let controller = &daemon.controller;
    store.is_idle()
        && controller.is_slot_free(slot)
        && controller.supervisor().free_permits() != Some(0)
}

/// Hands a submission to the controller, held until `wait` has passed if
/// it is delayed; says the placement with the due time as it was given
/// (the controller's is counted on its clock), and tells the store of an
/// owner it replaces.
fn hand_over(
    daemon: &Daemon,
    store: &Store,
    reservation: Reservation,
    mut submission: Submission,
    due_ms: Option<u64>,
    wait: Option<Duration>,
) -> (TaskWaiter, Placement) {
    if let Some(wait) = wait {
        submission = submission.not_before(tokio::time::Instant::now() + wait);
    }
    let (waiter, mut placement) = daemon.controller.submit_placed(reservation, submission);
    if let (Placement::Delayed { due_ms: told }, Some(due)) = (&mut placement, due_ms) {
        *told = due;
    }
    if let Placement::Replacing { owner, .. } = &placement {
        store.stopping(*owner);
    }
    (waiter, placement)
}

/// A submission's task body: its plugin with the request's input, params
/// and sandbox, its lines into `log`; on a durable store (`journal`) inside
/// the wrapper that records each attempt before it starts (`first`: the
/// submission's own commit, when that commit records attempt 1 as
/// started).
fn body_of(
    daemon: &Daemon,
    plugin: &Arc<taskhost_runtime::Plugin>,
    sandbox: Sandbox,
    request: &mut SubmitRequest,
    log: &Arc<TaskLog>,
    journal: Option<(&Store, Option<Ticket>)>,
    id: TaskId,
) -> Arc<dyn TaskBody> {
    let plugin_task = PluginTask::new(daemon.plugins.runtime(), plugin)
        .input(std::mem::take(&mut request.input))
        .params(std::mem::take(&mut request.params))
        .args(std::mem::take(&mut request.args))
        .sandbox(sandbox)
        .sink(Arc::clone(log) as _);
    let plugin_task = recorded(daemon, request, plugin_task, log);
    match journal {
        Some((store, first)) => Arc::new(Recorded::stored(id, plugin_task, store.clone(), first)),
        None => Arc::new(plugin_task),
    }
}

/// `task`, its attempts recorded into `log` unless the daemon or the
/// request says not to.
pub(crate) fn recorded(
    daemon: &Daemon,
    request: &SubmitRequest,
    task: PluginTask,
    log: &Arc<TaskLog>,
) -> PluginTask {
    let budget = daemon.config.record_budget;
    if budget == 0 || request.no_record {
        return task;
    }
    let source = match &request.deployment {
        Some(name) => name.clone(),
        None => request.plugin.to_string(),
    };
    task.record(taskhost_runtime::record::RecordSettings {
        budget: usize::try_from(budget).unwrap_or(usize::MAX),
        source,
        sink: Arc::clone(log) as _,
    })
}

/// What a placed task's end needs.
struct Ending {
    id: TaskId,
    /// The root of its spawn tree, if it was spawned.
    root: Option<u64>,
    log: Arc<TaskLog>,
    outcome: Outcome,
    plugin: String,
    submitted_ms: u64,
    /// A schedule's firing: the commit that holds it.
    firing: Option<Ticket>,
}

/// Arranges what a placed task's end does: record the outcome (on a
/// durable store), then show it.
fn on_end(daemon: &Arc<Daemon>, store: &Store, waiter: TaskWaiter, ending: Ending) {
    let Ending {
        id,
        root,
        log,
        outcome,
        plugin: plugin_name,
        submitted_ms,
        firing,
    } = ending;
    let watcher = Arc::clone(daemon);
    let store = store.clone();
    let recording = RecordingGuard::new(daemon);
    // What the task's end does: record the outcome (on a durable store),
    // then show it. It runs when the supervisor delivers the report, not in
    // a task spawned now beside the attempt: a second task spawned here
    // would push the attempt out of this worker's next slot and wake the
    // other worker to take it.
    let finish = move |report: Arc<taskhost_core::supervisor::TaskReport>| async move {
        let _recording = recording;
        if let Some(root) = root {
            watcher.trees.ascend(root);
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
            let finished = Finished::now((*report).clone(), plugin_name, log.lines(), submitted_ms)
                .with_records(log.records());
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
}
