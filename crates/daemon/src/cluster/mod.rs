//! Owns cluster mode's node: one `host serve --store postgres://…` process
//! among several that share one database. The database decides (admission,
//! claims, releases, takeovers: `store::postgres`); the node
//!
//! - answers every client verb for the whole cluster from the database;
//! - claims ready work up to its `max_concurrent` and runs it in its own
//!   supervisor and controller, every write of an attempt conditional on
//!   the claim's fencing token (`Fenced`);
//! - renews its lease, and takes over the work of nodes whose lease ran out
//!   (recovery's `fate` decides each interrupted attempt);
//! - stops its attempts at once when it finds its own lease lost (paused or
//!   cut off past it), records nothing for them, and joins again;
//! - hears about new work, stops and outcomes through LISTEN/NOTIFY, and
//!   polls for the same as the fallback.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::{Notify, broadcast};
use tokio_postgres::AsyncMessage;

use taskhost_core::controller::{AdmissionPolicy, Submission};
use taskhost_core::logline::{LineSink, LogLine, Stream};
use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::{
    AttemptContext, Event, EventKind, Received, Resume, RunFuture, TaskBody, TaskError, TaskId,
    TaskRef, TaskReport,
};
use taskhost_runtime::plugin_task::PluginTask;
use taskhost_runtime::{Digest, Plugin};

use crate::server::connection::Replier;
use crate::server::dispatch::send_pages;
use crate::service::history::EVENT_HISTORY;
use crate::service::submissions;
use crate::service::tasks::{MAX_FINISHED, MAX_LOG_LINES, Outcome, TaskLog, TaskRecord};
use crate::state::{Daemon, RecordingGuard};
use crate::store::postgres::{self, Admission, AdmitError, Canceled, Claimed, Pg};
use crate::store::{Finished, Pause, StoreError, now_ms};
use crate::wire::protocol::{ErrorKind, EventFilter, Reply, Request, TaskState};

/// Lines waiting to be shipped to the database; beyond it, lines are not
/// shipped (they stay in the node's log, and in the outcome's).
const SHIP_QUEUE: usize = 65_536;
/// Most lines shipped in one statement.
const SHIP_BATCH: usize = 1_000;

/// Most tasks claimed in one statement.
const CLAIM_BATCH: usize = 64;
/// How often retention runs on each node.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Orphaned tasks taken over per lease round.
const TAKEOVER_BATCH: i64 = 1_000;

/// A node's cluster settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// This node's name in `host ps` [default: `<hostname>-<pid>`].
    pub node_name: Option<String>,
    /// How long a node's lease lasts without renewal.
    pub lease: Duration,
    /// How often a node renews it (and looks for expired ones).
    pub renew: Duration,
    /// How often a node polls for work, stops and outcomes, in case a
    /// notification was missed.
    pub poll: Duration,
    /// Whether nodes notify each other (LISTEN/NOTIFY); off only to test
    /// the polling fallback.
    pub notify: bool,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            node_name: None,
            lease: Duration::from_secs(10),
            renew: Duration::from_secs(1),
            poll: Duration::from_secs(1),
            notify: true,
        }
    }
}

/// One node's part of the cluster.
pub(crate) struct Cluster {
    pub pg: Pg,
    name: String,
    settings: ClusterSettings,
    capacity: usize,
    /// This node's id (a new one after it lost its lease and joined again).
    node: AtomicI64,
    /// Wakes the claim loop.
    wake: Notify,
    /// Ids of tasks whose outcome was just recorded (from notifications, and
    /// from this node's own records).
    finished: broadcast::Sender<TaskId>,
    /// Ticks at every poll: waiters look at the database again.
    poll_tick: broadcast::Sender<()>,
    /// The tasks this node claimed and still runs, with their tokens.
    claims: Mutex<HashMap<TaskId, i64>>,
    /// Claimed tasks already told to stop here.
    stopped: Mutex<HashSet<TaskId>>,
    /// Set at a graceful stop: no more claims.
    closing: AtomicBool,
    /// Set once the node has left the cluster: its lease is no longer
    /// renewed (nor taken again).
    left: AtomicBool,
    /// When the lease was last renewed.
    renewed: Mutex<Instant>,
    /// Lines of running tasks on their way to the database.
    ship: tokio::sync::mpsc::Sender<(TaskId, i64, LogLine)>,
    shipped: Mutex<Option<tokio::sync::mpsc::Receiver<(TaskId, i64, LogLine)>>>,
}

impl Cluster {
    /// Joins the cluster: registers this node.
    pub(crate) async fn join(
        pg: Pg,
        settings: ClusterSettings,
        capacity: usize,
    ) -> Result<Arc<Self>, StoreError> {
        if settings.renew >= settings.lease {
            return Err(StoreError(format!(
                "the lease renewal ({}) must be shorter than the lease ({})",
                taskhost_core::units::format_duration(settings.renew),
                taskhost_core::units::format_duration(settings.lease)
            )));
        }
        let name = settings.node_name.clone().unwrap_or_else(default_node_name);
        let node = pg.register_node(&name, capacity, settings.lease).await?;
        let (ship, shipped) = tokio::sync::mpsc::channel(SHIP_QUEUE);
        Ok(Arc::new(Self {
            ship,
            shipped: Mutex::new(Some(shipped)),
            pg,
            name,
            settings,
            capacity,
            node: AtomicI64::new(node),
            wake: Notify::new(),
            finished: broadcast::channel(4096).0,
            poll_tick: broadcast::channel(16).0,
            claims: Mutex::default(),
            stopped: Mutex::default(),
            closing: AtomicBool::new(false),
            left: AtomicBool::new(false),
            renewed: Mutex::new(Instant::now()),
        }))
    }

    /// This node's id.
    pub(crate) fn node(&self) -> i64 {
        self.node.load(Ordering::SeqCst)
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, i64>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this node still holds `token` for `id`.
    fn holds(&self, id: TaskId, token: i64) -> bool {
        self.claims().get(&id) == Some(&token)
    }

    /// Forgets a claim that ended here (not a newer claim of the same task).
    fn release(&self, id: TaskId, token: i64) {
        let mut claims = self.claims();
        if claims.get(&id) == Some(&token) {
            claims.remove(&id);
            self.stopped
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        }
    }

    /// Stops claiming (a graceful stop).
    pub(crate) fn stop_claiming(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

fn default_node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into());
    format!("{host}-{}", std::process::id())
}

/// Starts the node's loops: claims, lease and takeover, notifications, and
/// the polling fallback. They hold the daemon weakly and end with it.
pub(crate) fn start(daemon: &Arc<Daemon>) {
    let Some(cluster) = daemon.cluster.as_ref() else {
        return;
    };
    tokio::spawn(claim_loop(Arc::downgrade(daemon)));
    tokio::spawn(lease_loop(Arc::downgrade(daemon)));
    tokio::spawn(poll_loop(Arc::downgrade(daemon)));
    tokio::spawn(event_loop(
        Arc::downgrade(cluster),
        daemon.controller.supervisor().subscribe(),
    ));
    if let Some(lines) = cluster
        .shipped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        tokio::spawn(ship_loop(Arc::downgrade(cluster), lines));
    }
    if cluster.settings.notify {
        tokio::spawn(listen_loop(Arc::downgrade(daemon)));
    }
    tracing::info!(node = cluster.node(), name = %cluster.name, "joined the cluster");
}

/// At a graceful stop, once this node's tasks have ended: it leaves the
/// cluster, and its unfinished work is taken over now (by this node's own
/// last transaction), not after its lease.
pub(crate) async fn leave(daemon: &Arc<Daemon>) {
    let Some(cluster) = daemon.cluster.as_ref() else {
        return;
    };
    let node = cluster.node();
    cluster.left.store(true, Ordering::SeqCst);
    if let Err(err) = cluster.pg.retire_node(node).await {
        tracing::error!("cannot leave the cluster ({err}); other nodes take over after the lease");
        return;
    }
    take_over(daemon, cluster).await;
    tracing::info!(node, "left the cluster");
}

async fn claim_loop(daemon: Weak<Daemon>) {
    loop {
        let Some(d) = daemon.upgrade() else { return };
        let Some(cluster) = d.cluster.clone() else {
            return;
        };
        if cluster.closing.load(Ordering::SeqCst) {
            return;
        }
        let room = cluster.capacity.saturating_sub(cluster.claims().len());
        let mut again = false;
        if room > 0 {
            let batch = room.min(CLAIM_BATCH);
            match cluster.pg.claim(cluster.node(), batch as i64).await {
                Ok(claimed) => {
                    again = claimed.len() == batch;
                    for task in claimed {
                        // Counted at once; a compile of its plugin does not
                        // hold up the next claims.
                        cluster.claims().insert(task.id, task.token);
                        tokio::spawn(run_claimed(Arc::clone(&d), Arc::clone(&cluster), task));
                    }
                }
                Err(err) => tracing::warn!("cannot claim work: {err}"),
            }
        }
        drop(d);
        if again {
            continue;
        }
        let woken = cluster.wake.notified();
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(cluster.settings.poll) => {}
        }
    }
}

/// Ships the lines of the tasks this node runs, in batches.
async fn ship_loop(
    cluster: Weak<Cluster>,
    mut lines: tokio::sync::mpsc::Receiver<(TaskId, i64, LogLine)>,
) {
    let mut batch = Vec::with_capacity(SHIP_BATCH);
    while lines.recv_many(&mut batch, SHIP_BATCH).await > 0 {
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if let Err(err) = cluster.pg.ship_lines(&batch, MAX_LOG_LINES).await {
            tracing::warn!("cannot ship {} log lines: {err}", batch.len());
        }
        batch.clear();
    }
}

/// Ships this node's events to the database in batches (best-effort, like
/// every event stream: a lane that fell behind is said so in the log).
async fn event_loop(cluster: Weak<Cluster>, mut lane: taskhost_core::supervisor::EventStream) {
    let mut batch: Vec<Event> = Vec::new();
    loop {
        let Some(first) = lane.recv().await else {
            return;
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        let mut next = Some(first);
        while let Some(received) = next.take() {
            match received {
                Received::Event(event) => batch.push(Event::clone(&event)),
                Received::Dropped(n) => {
                    tracing::warn!(
                        "{n} events were not shipped to the cluster (the lane fell behind)"
                    );
                }
            }
            if batch.len() >= SHIP_BATCH {
                break;
            }
            if let Ok(Some(more)) = tokio::time::timeout_at(deadline, lane.recv()).await {
                next = Some(more);
            }
        }
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if let Err(err) = cluster.pg.ship_events(cluster.node(), &batch).await {
            tracing::warn!("cannot ship {} events: {err}", batch.len());
        }
        batch.clear();
    }
}

/// `host events` for the whole cluster: the newest recorded events that
/// pass the filter, then (following) new ones as they are shipped.
async fn cluster_events(cluster: &Cluster, reply: &Replier, follow: bool, filter: &EventFilter) {
    // None: the newest first; then everything after the last one seen.
    let mut after: Option<i64> = None;
    loop {
        let newest = after.is_none();
        match cluster.pg.events(after, EVENT_HISTORY as i64).await {
            Ok(events) => {
                let full = !newest && events.len() == EVENT_HISTORY;
                after = Some(after.unwrap_or(0));
                for event in events {
                    after = Some(event.seq as i64);
                    if filter.admits(&event) && !reply.send(Reply::Event(event)).await {
                        return;
                    }
                }
                if full {
                    continue;
                }
            }
            Err(err) => {
                reply.error(ErrorKind::Internal, err.to_string()).await;
                return;
            }
        }
        if !follow {
            break;
        }
        tokio::time::sleep(cluster.settings.poll.min(Duration::from_millis(200))).await;
    }
    reply.send(Reply::End).await;
}

/// A claimed task's lines: into the node's log, and shipped to the
/// database so that every node's `host logs` shows them.
struct Shipping {
    log: Arc<TaskLog>,
    id: TaskId,
    token: i64,
    ship: tokio::sync::mpsc::Sender<(TaskId, i64, LogLine)>,
}

impl LineSink for Shipping {
    fn push(&self, attempt: u32, stream: Stream, text: &str) {
        self.log.push(attempt, stream, text);
        let line = LogLine {
            attempt,
            stream,
            text: text.to_owned(),
        };
        // Full: the line stays in this node's log and in the outcome's.
        let _ = self.ship.try_send((self.id, self.token, line));
    }
}

async fn poll_loop(daemon: Weak<Daemon>) {
    let mut last_prune = Instant::now();
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster.clone()) else {
            return;
        };
        tokio::time::sleep(cluster.settings.poll).await;
        let Some(d) = daemon.upgrade() else { return };
        cluster.wake.notify_one();
        let _ = cluster.poll_tick.send(());
        match cluster.pg.stopping_on(cluster.node()).await {
            Ok(ids) => {
                for id in ids {
                    stop_local(&d, &cluster, id);
                }
            }
            Err(err) => tracing::warn!("cannot read stop requests: {err}"),
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = Instant::now();
            let config = &d.config;
            let retention = (
                config.retain_finished,
                config.retain_for,
                config.retain_bytes,
            );
            if let Err(err) = cluster.pg.prune(retention).await {
                tracing::warn!("cannot apply retention: {err}");
            }
            match cluster
                .pg
                .collect_plugins(d.config.keep_unused_plugins)
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!("collected {n} plugins no task of the cluster uses"),
                Err(err) => tracing::warn!("cannot collect plugins: {err}"),
            }
        }
    }
}

async fn lease_loop(daemon: Weak<Daemon>) {
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster.clone()) else {
            return;
        };
        tokio::time::sleep(cluster.settings.renew).await;
        let Some(d) = daemon.upgrade() else { return };
        // A stopping node keeps its lease (its attempts are still within
        // their grace) until it has left.
        if cluster.left.load(Ordering::SeqCst) {
            return;
        }
        let since = cluster
            .renewed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed();
        match cluster
            .pg
            .renew(cluster.node(), cluster.settings.lease)
            .await
        {
            Ok(true) => {
                *cluster
                    .renewed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Instant::now();
            }
            Ok(false) => lost_lease(&d, &cluster, "another node took this node's work over").await,
            Err(err) if since > cluster.settings.lease => {
                lost_lease(
                    &d,
                    &cluster,
                    &format!("the lease could not be renewed: {err}"),
                )
                .await;
            }
            Err(err) => tracing::warn!("cannot renew the lease: {err}"),
        }
        take_over(&d, &cluster).await;
    }
}

/// Marks nodes whose lease ran out dead and settles their tasks.
async fn take_over(daemon: &Arc<Daemon>, cluster: &Cluster) {
    match cluster.pg.expire_nodes().await {
        Ok(dead) => {
            for name in dead {
                tracing::warn!(node = %name, "a node's lease ran out; taking its work over");
            }
        }
        Err(err) => {
            tracing::warn!("cannot look for expired leases: {err}");
            return;
        }
    }
    let orphans = match cluster.pg.orphans(TAKEOVER_BATCH).await {
        Ok(orphans) => orphans,
        Err(err) => {
            tracing::warn!("cannot look for orphaned tasks: {err}");
            return;
        }
    };
    for id in orphans {
        match cluster.pg.settle(id).await {
            Ok(Some(settled)) => {
                let name: Arc<str> = Arc::from(settled.name.as_str());
                let slot: Arc<str> = Arc::from(settled.slot.as_str());
                daemon.controller.supervisor().publish(
                    Event::new(EventKind::Recovered)
                        .task(settled.id, &name, &slot)
                        .reason(format!("taken over from a stopped node: {}", settled.why)),
                );
                let _ = cluster.finished.send(settled.id);
                cluster.wake.notify_one();
            }
            Ok(None) => {}
            Err(err) => tracing::warn!(task = %id, "cannot take a task over: {err}"),
        }
    }
}

/// This node's lease is gone: its claims were (or may have been) taken
/// over. Its attempts stop at once and record nothing; it joins again as a
/// new node.
async fn lost_lease(daemon: &Arc<Daemon>, cluster: &Cluster, why: &str) {
    let orphaned: Vec<TaskId> = cluster.claims().drain().map(|(id, _)| id).collect();
    tracing::error!(
        node = cluster.node(),
        orphaned = orphaned.len(),
        "this node lost its lease ({why}); stopping its attempts, which now belong to other nodes"
    );
    for id in &orphaned {
        daemon.controller.supervisor().abort_now(*id);
    }
    match cluster
        .pg
        .register_node(&cluster.name, cluster.capacity, cluster.settings.lease)
        .await
    {
        Ok(node) => {
            cluster.node.store(node, Ordering::SeqCst);
            *cluster
                .renewed
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Instant::now();
            tracing::info!(node, "joined the cluster again");
            cluster.wake.notify_one();
        }
        Err(err) => tracing::error!("cannot join the cluster again: {err}"),
    }
}

async fn listen_loop(daemon: Weak<Daemon>) {
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster.clone()) else {
            return;
        };
        match cluster.pg.config().connect(tokio_postgres::NoTls).await {
            Ok((client, mut connection)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(AsyncMessage::Notification(n)) => {
                                if tx
                                    .send((n.channel().to_owned(), n.payload().to_owned()))
                                    .is_err()
                                {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(err) => {
                                tracing::warn!("the notification connection failed: {err}");
                                return;
                            }
                        }
                    }
                });
                let listen = format!(
                    "LISTEN {}; LISTEN {}; LISTEN {}",
                    postgres::READY,
                    postgres::STOP,
                    postgres::FINISHED
                );
                if let Err(err) = client.batch_execute(&listen).await {
                    tracing::warn!("cannot listen for notifications: {err}");
                } else {
                    // Whatever happened while not listening, the poll finds.
                    cluster.wake.notify_one();
                    drop(cluster);
                    while let Some((channel, payload)) = rx.recv().await {
                        let Some(d) = daemon.upgrade() else { return };
                        let Some(cluster) = d.cluster.as_ref() else {
                            return;
                        };
                        let id = payload.parse::<u64>().ok().map(TaskId::from_u64);
                        match (channel.as_str(), id) {
                            (postgres::READY, _) => cluster.wake.notify_one(),
                            (postgres::STOP, Some(id)) => stop_local(&d, cluster, id),
                            (postgres::FINISHED, Some(id)) => {
                                let _ = cluster.finished.send(id);
                            }
                            _ => {}
                        }
                    }
                }
                driver.abort();
            }
            Err(err) => tracing::warn!("cannot open the notification connection: {err}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Asks a task this node runs to stop (once).
fn stop_local(daemon: &Daemon, cluster: &Cluster, id: TaskId) {
    if !cluster.claims().contains_key(&id) {
        return;
    }
    if cluster
        .stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id)
    {
        daemon.controller.remove(id);
    }
}

/// The plugin, from this node's store, else from the cluster's.
async fn ensure_plugin(
    daemon: &Daemon,
    cluster: &Cluster,
    digest: &Digest,
) -> Result<Arc<Plugin>, (ErrorKind, String)> {
    if let Some(plugin) = daemon.plugins.get(digest).await {
        return Ok(plugin);
    }
    let bytes = cluster
        .pg
        .plugin_bytes(digest)
        .await
        .map_err(|e| (ErrorKind::Internal, e.to_string()))?
        .ok_or_else(|| {
            (
                ErrorKind::NotFound,
                format!("the cluster does not know plugin {digest}; upload it first"),
            )
        })?;
    daemon.plugins.store(bytes, Some(*digest)).await
}

/// Runs a claimed task in this node's supervisor, and records its end.
async fn run_claimed(daemon: Arc<Daemon>, cluster: Arc<Cluster>, task: Claimed) {
    let (daemon, cluster) = (&daemon, &cluster);
    let Claimed {
        id,
        token,
        mut request,
        plugin: plugin_name,
        attempts,
        failures,
        resume_at_ms,
        submitted_ms,
    } = task;
    // Claimed again after this node lost it: the old attempt is physically
    // gone before the new one starts here.
    daemon.controller.supervisor().gone(id).await;
    let name = request
        .name
        .clone()
        .unwrap_or_else(|| format!("{plugin_name}-{id}"));
    let slot = request.slot.clone().unwrap_or_else(|| name.clone());
    let checked = match ensure_plugin(daemon, cluster, &request.plugin).await {
        Ok(_) => submissions::check(daemon, &request).await,
        Err(e) => Err(e),
    };
    let (plugin, sandbox) = match checked {
        Ok(found) => found,
        Err(_) if cluster.closing.load(Ordering::SeqCst) => {
            // Claimed as this node began to stop: no attempt started, so
            // leaving the cluster admits it again for the others.
            cluster.release(id, token);
            return;
        }
        Err((_, message)) => {
            // It cannot run here (its plugin or a granted directory is
            // missing on this node): it ends, as it would at submission.
            let report = TaskReport::never_ran(
                id,
                Arc::from(name.as_str()),
                Arc::from(slot.as_str()),
                TaskOutcome::Failed {
                    reason: format!("cannot run on node {}: {message}", cluster.name),
                    exit_code: None,
                },
            );
            let finished = Finished {
                report: TaskReport { attempts, ..report },
                plugin: plugin_name,
                log: Vec::new(),
                submitted_ms,
                finished_ms: now_ms(),
            };
            record_end(cluster, token, &finished).await;
            cluster.release(id, token);
            return;
        }
    };
    let log = TaskLog::new();
    let task = PluginTask::new(daemon.plugins.runtime(), &plugin)
        .input(std::mem::take(&mut request.input))
        .params(std::mem::take(&mut request.params))
        .sandbox(sandbox)
        .sink(Arc::new(Shipping {
            log: Arc::clone(&log),
            id,
            token,
            ship: cluster.ship.clone(),
        }) as _);
    let body = Arc::new(Fenced {
        cluster: Arc::clone(cluster),
        id,
        token,
        task,
        last_write: Mutex::new(None),
    });
    let resume = Resume {
        attempts,
        failures,
        delay: Duration::from_millis(resume_at_ms.map_or(0, |at| at.saturating_sub(now_ms()))),
    };
    let spec = submissions::spec_for(&request, name.clone(), slot.clone(), body, resume);
    let reservation = daemon.controller.supervisor().adopt(id);
    // The database made this node the slot's owner; the local controller
    // only keeps a task stopped here until it is physically gone.
    let (waiter, _) = daemon.controller.submit_placed(
        reservation,
        Submission::new(spec).policy(AdmissionPolicy::Queue),
    );
    // A stop that came while the plugin was fetched or compiled found
    // nothing registered to stop (the claim showed the task running
    // already): it is carried out now. A later one finds the task.
    if cluster
        .stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&id)
    {
        daemon.controller.remove(id);
    }
    let outcome = Outcome::new();
    daemon.tasks.insert(TaskRecord {
        id,
        name,
        slot,
        plugin: plugin_name.clone(),
        digest: request.plugin,
        outcome: outcome.clone(),
        log: Arc::clone(&log),
        submitted: Instant::now()
            .checked_sub(Duration::from_millis(now_ms().saturating_sub(submitted_ms)))
            .unwrap_or_else(Instant::now),
        placed: true,
    });
    let recording = RecordingGuard::new(daemon);
    let daemon = Arc::clone(daemon);
    let cluster = Arc::clone(cluster);
    tokio::spawn(async move {
        let _recording = recording;
        let report = waiter.report().await;
        // The slot is released only at the task's physical end.
        daemon.controller.supervisor().gone(id).await;
        log.close();
        let held = cluster.holds(id, token);
        let left = daemon.keep_unfinished.load(Ordering::SeqCst)
            && submissions::left_for_next_start(&report.outcome);
        if held && !left {
            let finished = Finished {
                report: (*report).clone(),
                plugin: plugin_name,
                log: log.lines(),
                submitted_ms,
                finished_ms: now_ms(),
            };
            if record_end(&cluster, token, &finished).await {
                outcome.set(report);
            }
        }
        daemon.tasks.finished(id);
        cluster.release(id, token);
        cluster.wake.notify_one();
    });
}

/// Records a claimed task's end, retrying while the database is away;
/// false if the claim had been taken away (nothing recorded).
async fn record_end(cluster: &Cluster, token: i64, finished: &Finished) -> bool {
    let id = finished.report.id;
    let mut delay = Duration::from_millis(50);
    loop {
        match cluster.pg.finish(token, finished).await {
            Ok(true) => {
                let _ = cluster.finished.send(id);
                return true;
            }
            Ok(false) => {
                tracing::warn!(task = %id, "not recorded: this node's claim on it was taken over");
                return false;
            }
            Err(err) => {
                if !cluster.holds(id, token) {
                    return false;
                }
                tracing::error!(task = %id, "cannot record the outcome ({err}); retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// A claimed task's body: each attempt starts only once the database has
/// recorded it under the claim's token, and a pause is recorded the same
/// way; once the claim is taken away, no attempt starts.
struct Fenced {
    cluster: Arc<Cluster>,
    id: TaskId,
    token: i64,
    task: PluginTask,
    /// The last pause's write, which the next attempt's write follows.
    last_write: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl TaskBody for Fenced {
    fn attempt(&self, ctx: AttemptContext) -> BoxFuture<'static, Result<RunFuture, TaskError>> {
        let before = self
            .last_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let cluster = Arc::clone(&self.cluster);
        let (id, token) = (self.id, self.token);
        let task = self.task.clone();
        Box::pin(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            match cluster.pg.attempt_started(id, token, ctx.attempt()).await {
                Ok(true) => task.attempt(ctx).await,
                Ok(false) => Err(TaskError::fatal(
                    "this node's claim on the task was taken over (its lease ran out); \
                     another node runs it",
                )),
                Err(err) => Err(TaskError::fail(format!(
                    "the attempt could not be recorded: {err}"
                ))),
            }
        })
    }

    fn hurry(
        &self,
        deadline: Instant,
        abort: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Option<Box<dyn Send>> {
        self.task.hurry(deadline, abort)
    }

    fn pausing(&self, next: Resume) {
        let cluster = Arc::clone(&self.cluster);
        let (id, token) = (self.id, self.token);
        let pause = Pause {
            until_ms: now_ms().saturating_add(next.delay.as_millis() as u64),
            failures: next.failures,
        };
        let write = tokio::spawn(async move {
            if let Err(err) = cluster.pg.pausing(id, token, next.attempts, pause).await {
                tracing::warn!(task = %id, "cannot record a pause: {err}");
            }
        });
        *self
            .last_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(write);
    }

    fn describe(&self) -> String {
        self.task.describe()
    }

    fn code_digest(&self) -> Option<String> {
        self.task.code_digest()
    }
}

/// Handles the requests whose answer is the cluster's; gives the others
/// back to the node's own dispatch.
pub(crate) async fn handle(
    daemon: &Arc<Daemon>,
    cluster: &Arc<Cluster>,
    request: Request,
    reply: Replier,
) -> Option<(Request, Replier)> {
    match request {
        Request::HasPlugin(digest) => {
            let known = daemon.plugins.known(&digest)
                || cluster.pg.has_plugin(&digest).await.unwrap_or(false);
            reply.send(Reply::HasPlugin(known)).await;
        }
        Request::Submit(request) => {
            let plugin = match ensure_plugin(daemon, cluster, &request.plugin).await {
                Ok(plugin) => plugin,
                Err((kind, message)) => {
                    reply.error(kind, message).await;
                    return None;
                }
            };
            if let Err((kind, message)) = submissions::check(daemon, &request).await {
                reply.error(kind, message).await;
                return None;
            }
            let info = plugin.info();
            let admission = Admission {
                names: submissions::names(&request, info),
                request: *request,
                plugin: info.name.clone(),
                max_slot_queue: daemon.config.max_slot_queue,
                max_total_pending: daemon.config.max_total_pending,
            };
            let mut admitted = cluster.pg.admit(&admission).await;
            if matches!(admitted, Err(AdmitError::PluginGone)) {
                // Collected from the database meanwhile: this node still
                // has it; store it again for the others.
                let path = crate::service::plugins::plugin_path(
                    &daemon.config.state_dir,
                    &admission.request.plugin,
                );
                let stored = match std::fs::read(&path) {
                    Ok(bytes) => cluster
                        .pg
                        .put_plugin(&admission.request.plugin, Some(&info.name), &bytes)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
                };
                admitted = match stored {
                    Ok(()) => cluster.pg.admit(&admission).await,
                    Err(e) => Err(AdmitError::Store(StoreError(e))),
                };
            }
            match admitted {
                Err(AdmitError::PluginGone) => {
                    reply
                        .error(
                            ErrorKind::NotFound,
                            format!(
                                "the cluster does not hold plugin {}; upload it again",
                                admission.request.plugin
                            ),
                        )
                        .await;
                }
                Ok(submitted) => {
                    cluster.wake.notify_one();
                    reply.send(Reply::Submitted(submitted)).await;
                }
                Err(AdmitError::Invalid(message)) => reply.error(ErrorKind::Invalid, message).await,
                Err(AdmitError::Store(err)) => {
                    reply
                        .error(
                            ErrorKind::Internal,
                            format!(
                                "the submission could not be stored, so it was not accepted: {err}"
                            ),
                        )
                        .await;
                }
            }
        }
        Request::Wait(target) => {
            // None: the NotFound (or error) reply was sent.
            let found = resolve(cluster, &target, &reply).await?;
            let cluster = Arc::clone(cluster);
            tokio::spawn(async move {
                match reply.until_gone(wait_finished(&cluster, found)).await {
                    Some(Ok(finished)) => {
                        reply.report(&finished.report, Reply::Report).await;
                    }
                    Some(Err(err)) => reply.error(ErrorKind::Internal, err.to_string()).await,
                    None => {}
                }
            });
        }
        Request::Cancel { target, wait } => {
            // None: the NotFound (or error) reply was sent.
            let found = resolve(cluster, &target, &reply).await?;
            let claimed = match cluster.pg.cancel(found).await {
                Ok(Canceled::Claimed { node }) => {
                    if node == Some(cluster.node()) {
                        stop_local(daemon, cluster, found);
                    }
                    true
                }
                Ok(Canceled::Already) => false,
                Err(err) => {
                    reply.error(ErrorKind::Internal, err.to_string()).await;
                    return None;
                }
            };
            if !wait {
                reply
                    .send(Reply::Canceled {
                        claimed,
                        report: None,
                    })
                    .await;
                return None;
            }
            let cluster = Arc::clone(cluster);
            tokio::spawn(async move {
                match reply.until_gone(wait_finished(&cluster, found)).await {
                    Some(Ok(finished)) => {
                        reply
                            .report(&finished.report, |report| Reply::Canceled {
                                claimed,
                                report: Some(report),
                            })
                            .await;
                    }
                    Some(Err(err)) => reply.error(ErrorKind::Internal, err.to_string()).await,
                    None => {}
                }
            });
        }
        Request::List { all } => {
            let mut rows = match cluster.pg.list(all, MAX_FINISHED as i64).await {
                Ok(rows) => rows,
                Err(err) => {
                    reply.error(ErrorKind::Internal, err.to_string()).await;
                    return None;
                }
            };
            // The tasks running here: their progress and exact phase.
            let local: HashMap<TaskId, _> = daemon
                .controller
                .supervisor()
                .list()
                .into_iter()
                .map(|t| (t.id, t))
                .collect();
            for row in &mut rows {
                if let Some(info) = local.get(&row.id) {
                    row.progress = info.progress;
                    if row.state != TaskState::Stopping {
                        row.state = info.phase;
                    }
                }
            }
            send_pages(&reply, rows, Reply::Tasks).await;
        }
        Request::Slots => match cluster.pg.slots().await {
            Ok(slots) => send_pages(&reply, slots, Reply::Slots).await,
            Err(err) => reply.error(ErrorKind::Internal, err.to_string()).await,
        },
        Request::Logs { target, follow } => {
            let found = match cluster.pg.resolve(&target).await {
                Ok(Some(found)) => found,
                Ok(None) => {
                    reply
                        .error(
                            ErrorKind::NotFound,
                            format!("no task with {target} (see `host ps --all`)"),
                        )
                        .await;
                    return None;
                }
                Err(err) => {
                    reply.error(ErrorKind::Internal, err.to_string()).await;
                    return None;
                }
            };
            if daemon.tasks.get(found.id).is_some() && found.state != "finished" {
                // Running here: the node's own log, live.
                return Some((
                    Request::Logs {
                        target: TaskRef::Id(found.id),
                        follow,
                    },
                    reply,
                ));
            }
            match cluster.pg.finished(found.id).await {
                Ok(Some(finished)) => {
                    for line in finished.log {
                        if !reply.send(Reply::Log(line)).await {
                            return None;
                        }
                    }
                    reply.send(Reply::End).await;
                }
                Ok(None) => {
                    // Running elsewhere (or not started): the lines its node
                    // shipped, then (following) new ones until it ends.
                    let cluster = Arc::clone(cluster);
                    tokio::spawn(async move {
                        let _ = reply
                            .until_gone(follow_shipped(&cluster, &reply, found.id, follow))
                            .await;
                    });
                }
                Err(err) => reply.error(ErrorKind::Internal, err.to_string()).await,
            }
        }
        Request::Events { follow, filter } => {
            let cluster = Arc::clone(cluster);
            tokio::spawn(async move {
                let _ = reply
                    .until_gone(cluster_events(&cluster, &reply, follow, &filter))
                    .await;
            });
        }
        Request::RemovePlugins { prefix: None } => {
            // `host plugins prune`: the cluster's unused plugins go at
            // once, then this node's own copies.
            if let Err(err) = cluster.pg.collect_plugins(Duration::ZERO).await {
                reply.error(ErrorKind::Internal, err.to_string()).await;
                return None;
            }
            return Some((Request::RemovePlugins { prefix: None }, reply));
        }
        other => return Some((other, reply)),
    }
    None
}

/// Sends a task's shipped lines; following, polls for more until it ends,
/// then the lines of its recorded log not sent yet.
async fn follow_shipped(cluster: &Cluster, reply: &Replier, id: TaskId, follow: bool) {
    let mut after = 0;
    let mut sent = 0usize;
    loop {
        match cluster.pg.shipped_lines(id, after).await {
            Ok((lines, last)) => {
                after = last;
                let more = lines.len() == SHIP_BATCH;
                for line in lines {
                    if !reply.send(Reply::Log(line)).await {
                        return;
                    }
                    sent += 1;
                }
                if more {
                    continue;
                }
            }
            Err(err) => {
                reply.error(ErrorKind::Internal, err.to_string()).await;
                return;
            }
        }
        if !follow {
            break;
        }
        match cluster.pg.finished(id).await {
            Ok(Some(finished)) => {
                for line in finished.log.into_iter().skip(sent) {
                    if !reply.send(Reply::Log(line)).await {
                        return;
                    }
                }
                break;
            }
            Ok(None) => {}
            Err(err) => {
                reply.error(ErrorKind::Internal, err.to_string()).await;
                return;
            }
        }
        tokio::time::sleep(cluster.settings.poll.min(Duration::from_millis(250))).await;
    }
    reply.send(Reply::End).await;
}

/// The task a target names, or a NotFound reply.
async fn resolve(cluster: &Cluster, target: &TaskRef, reply: &Replier) -> Option<TaskId> {
    match cluster.pg.resolve(target).await {
        Ok(Some(found)) => Some(found.id),
        Ok(None) => {
            reply
                .error(
                    ErrorKind::NotFound,
                    format!("no task with {target} (see `host ps --all`)"),
                )
                .await;
            None
        }
        Err(err) => {
            reply.error(ErrorKind::Internal, err.to_string()).await;
            None
        }
    }
}

/// Waits until a task's outcome is recorded, whichever node ran it: woken
/// by its notification, and looking again at every poll.
async fn wait_finished(cluster: &Cluster, id: TaskId) -> Result<Finished, StoreError> {
    let mut finished = cluster.finished.subscribe();
    let mut ticks = cluster.poll_tick.subscribe();
    loop {
        if let Some(done) = cluster.pg.finished(id).await? {
            return Ok(done);
        }
        loop {
            tokio::select! {
                got = finished.recv() => match got {
                    Ok(done) if done == id => break,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(StoreError("the node is stopping".into()));
                    }
                },
                _ = ticks.recv() => break,
            }
        }
    }
}
