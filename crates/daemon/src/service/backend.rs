//! Owns the one seam between the verbs and where the work is kept: a
//! daemon's own store and controller (`Local`: SQLite or memory, the
//! controller decides) or a cluster's shared database (`Shared`: PostgreSQL
//! decides, this node runs what it claimed). Every verb the socket and the
//! HTTP listener serve asks it, and gets the same answer in both modes:
//! data for the answers that are one value, a bounded channel of [`Item`]s
//! for the ones that stream (logs, events). A caller that goes away closes
//! the channel, which ends its producer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{broadcast, mpsc};

use taskhost_core::controller::SlotView;
use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, Received, TaskId, TaskRef, TaskReport};
use taskhost_runtime::Digest;

use crate::cluster::node::{Cluster, SHIP_BATCH};
use crate::service::history::EVENT_HISTORY;
use crate::service::plugins::plugin_path;
use crate::service::submissions::{self, Accepted};
use crate::service::tasks::{MAX_FINISHED, TaskRecord};
use crate::state::{Daemon, Storage};
use crate::store::postgres::{Admission, AdmitError, Canceled};
use crate::store::{self, Finished, Store, StoreError};
use crate::wire::protocol::{
    ErrorKind, EventFilter, NotBefore, ScheduleRow, ScheduleVerb, SubmitRequest, Submitted,
    TaskRow, TaskState,
};

/// Items in flight to one streaming reader.
const STREAM_BUFFER: usize = 256;

/// What a streaming verb yields, in order; the stream ends after the last.
pub(crate) enum Item {
    Log(LogLine),
    Event(Box<Event>),
    /// This many items were lost (a reader that fell behind, a lane that
    /// overflowed): said, never skipped silently.
    Dropped(u64),
    /// The stream could not go on (the database is away).
    Failed(String),
}

/// A streaming answer.
pub(crate) type Items = mpsc::Receiver<Item>;

/// What a task reference names.
pub(crate) enum Found {
    /// A task this daemon placed (one host).
    Live(TaskRecord),
    /// Finished before, as the daemon's store keeps it (one host).
    Stored(Box<Finished>),
    /// A task of the cluster's database.
    Shared { id: TaskId, finished: bool },
}

impl Found {
    /// The task's id.
    pub(crate) fn id(&self) -> TaskId {
        match self {
            Found::Live(record) => record.id,
            Found::Stored(finished) => finished.report.id,
            Found::Shared { id, .. } => *id,
        }
    }
}

/// A task as `GET /api/tasks/{id}` shows it.
pub(crate) struct Detail {
    pub id: TaskId,
    pub name: String,
    pub slot: String,
    pub plugin: String,
    /// Its `ps` row while it is unfinished.
    pub row: Option<TaskRow>,
    pub report: Option<Arc<TaskReport>>,
    pub log: Vec<LogLine>,
}

impl Backend<'_> {
    /// A `host kv` verb: one host's buckets; a cluster node has none.
    pub(crate) async fn kv(
        &self,
        verb: crate::wire::protocol::KvVerb,
    ) -> Result<crate::service::kv::KvAnswer, (ErrorKind, String)> {
        match self {
            Self::Local(daemon, _) => crate::service::kv::answer(&daemon.kv, verb).await,
            Self::Shared(daemon, cluster) => {
                let limits = taskhost_runtime::KvLimits {
                    max_bucket_bytes: daemon.config.kv_max_bucket,
                    max_total_bytes: daemon.config.kv_max_total,
                };
                crate::service::kv::answer_shared(cluster, limits, verb).await
            }
        }
    }
}

/// What a schedule verb answers.
pub(crate) enum Scheduled {
    /// `ls`.
    Rows(Vec<ScheduleRow>),
    /// `add`, `rm`, `pause`, `resume`: the schedule as it left it.
    Row(ScheduleRow),
    /// `run`: the firing, answered as a submission.
    Fired(Accepted),
}

/// The seam: which backend this daemon's verbs go to.
pub(crate) enum Backend<'a> {
    Local(&'a Arc<Daemon>, &'a Store),
    Shared(&'a Arc<Daemon>, &'a Arc<Cluster>),
}

fn internal(err: StoreError) -> (ErrorKind, String) {
    (ErrorKind::Internal, err.to_string())
}

fn not_found(target: &TaskRef) -> (ErrorKind, String) {
    (
        ErrorKind::NotFound,
        format!("no task with {target} (see `host ps --all`)"),
    )
}

impl<'a> Backend<'a> {
    pub(crate) fn of(daemon: &'a Arc<Daemon>) -> Self {
        match &daemon.storage {
            Storage::Local(store) => Self::Local(daemon, store),
            Storage::Shared(cluster) => Self::Shared(daemon, cluster),
        }
    }

    fn daemon(&self) -> &'a Arc<Daemon> {
        match self {
            Self::Local(daemon, _) | Self::Shared(daemon, _) => daemon,
        }
    }

    /// Whether accepted work outlives this process (a graceful stop then
    /// keeps unfinished work for the next start).
    pub(crate) fn is_durable(&self) -> bool {
        match self {
            Self::Local(_, store) => store.is_durable(),
            Self::Shared(..) => true,
        }
    }

    /// Stops taking new work (a graceful stop has begun).
    pub(crate) fn stop_taking(&self) {
        if let Self::Shared(_, cluster) = self {
            cluster.stop_claiming();
        }
    }

    /// Whether a submission may name this plugin without uploading it.
    pub(crate) async fn has_plugin(&self, digest: &Digest) -> bool {
        let known = self.daemon().plugins.known(digest);
        match self {
            Self::Local(..) => known,
            Self::Shared(_, cluster) => {
                known || cluster.pg.has_plugin(digest).await.unwrap_or(false)
            }
        }
    }

    /// Stores an uploaded plugin (compiled here; in a cluster, kept in the
    /// database for every node too); returns its name.
    pub(crate) async fn upload(
        &self,
        digest: Digest,
        bytes: Vec<u8>,
    ) -> Result<String, (ErrorKind, String)> {
        let shared = matches!(self, Self::Shared(..)).then(|| bytes.clone());
        let plugin = self.daemon().plugins.store(bytes, Some(digest)).await?;
        let name = plugin.info().name.clone();
        if let (Self::Shared(_, cluster), Some(bytes)) = (self, shared) {
            cluster
                .pg
                .put_plugin(&digest, Some(&name), &bytes)
                .await
                .map_err(internal)?;
        }
        Ok(name)
    }

    /// Places one submission, in the order it was sent.
    pub(crate) async fn submit(
        &self,
        request: SubmitRequest,
    ) -> Result<Accepted, (ErrorKind, String)> {
        match self {
            Self::Local(daemon, store) => submissions::submit(daemon, store, request).await,
            Self::Shared(daemon, cluster) => shared_submit(daemon, cluster, request).await,
        }
    }

    /// A schedule verb (`host schedule …`).
    pub(crate) async fn schedule(
        &self,
        verb: ScheduleVerb,
    ) -> Result<Scheduled, (ErrorKind, String)> {
        use crate::service::schedules;
        match self {
            Self::Local(daemon, store) => Ok(match verb {
                ScheduleVerb::Add(spec) => {
                    Scheduled::Row(schedules::add(daemon, store, *spec).await?)
                }
                ScheduleVerb::List => Scheduled::Rows(schedules::list(daemon, store).await),
                ScheduleVerb::Remove(name) => {
                    Scheduled::Row(schedules::remove(daemon, store, &name).await?)
                }
                ScheduleVerb::Pause(name) => {
                    Scheduled::Row(schedules::set_paused(daemon, store, &name, true).await?)
                }
                ScheduleVerb::Resume(name) => {
                    Scheduled::Row(schedules::set_paused(daemon, store, &name, false).await?)
                }
                ScheduleVerb::Run(name) => {
                    let (submitted, ticket) = schedules::run(daemon, store, &name).await?;
                    Scheduled::Fired(if ticket.is_immediate() {
                        Accepted::Now(submitted)
                    } else {
                        Accepted::Later(Box::pin(async move {
                            ticket.committed().await.map_err(|e| {
                                (
                                    ErrorKind::Internal,
                                    format!("the firing could not be stored: {e}"),
                                )
                            })?;
                            Ok(submitted)
                        }))
                    })
                }
            }),
            Self::Shared(daemon, cluster) => {
                crate::cluster::time::verb(daemon, cluster, verb).await
            }
        }
    }

    /// The task a reference names.
    pub(crate) async fn find(&self, target: &TaskRef) -> Result<Found, (ErrorKind, String)> {
        match self {
            Self::Local(daemon, store) => {
                if let Some(record) = daemon.tasks.resolve(target, &daemon.controller) {
                    return Ok(Found::Live(record));
                }
                let store = Store::clone(store);
                let wanted = target.clone();
                // The store is read off the async workers.
                tokio::task::spawn_blocking(move || stored(&store, &wanted))
                    .await
                    .ok()
                    .flatten()
                    .ok_or_else(|| not_found(target))
            }
            Self::Shared(_, cluster) => match cluster.pg.resolve(target).await {
                Ok(Some(found)) => Ok(Found::Shared {
                    id: found.id,
                    finished: found.state == "finished",
                }),
                Ok(None) => Err(not_found(target)),
                Err(err) => Err(internal(err)),
            },
        }
    }

    /// The stored plugins, as `host plugins ls` shows them.
    pub(crate) async fn plugin_rows(&self) -> Vec<crate::wire::protocol::PluginRow> {
        let daemon = Arc::clone(self.daemon());
        tokio::task::spawn_blocking(move || {
            daemon.plugins.list(&crate::service::plugins::refs(
                daemon.local_store(),
                &daemon.tasks,
                &daemon.schedules,
            ))
        })
        .await
        .unwrap_or_default()
    }

    /// The request a task was submitted with (resolved: its name, slot
    /// and policy as placed), for `host rerun`; its idempotency key and
    /// the schedule that fired it are left out.
    pub(crate) async fn request_of(
        &self,
        found: &Found,
    ) -> Result<SubmitRequest, (ErrorKind, String)> {
        let id = found.id();
        let request = match (self, found) {
            (_, Found::Live(record)) if record.request.is_some() => {
                record.request.as_deref().cloned()
            }
            (Self::Local(_, store), _) => {
                let store = Store::clone(store);
                tokio::task::spawn_blocking(move || store.request_of(id))
                    .await
                    .ok()
                    .flatten()
            }
            (Self::Shared(_, cluster), _) => cluster.pg.request_of(id).await.map_err(internal)?,
        };
        let mut request = request.ok_or_else(|| {
            (
                ErrorKind::NotFound,
                format!("task {id}'s request is no longer kept (retention), so it cannot be rerun"),
            )
        })?;
        request.idempotency_key = None;
        // A rerun is nobody's firing: a client submits it.
        request.schedule = None;
        Ok(request)
    }

    /// The task's report once it has one.
    pub(crate) fn outcome(
        &self,
        found: &Found,
    ) -> BoxFuture<'static, Result<Arc<TaskReport>, (ErrorKind, String)>> {
        match (self, found) {
            (_, Found::Live(record)) => {
                let outcome = record.outcome.clone();
                Box::pin(async move { Ok(outcome.report().await) })
            }
            (_, Found::Stored(finished)) => {
                let report = Arc::new(finished.report.clone());
                Box::pin(async move { Ok(report) })
            }
            (Self::Shared(_, cluster), Found::Shared { id, .. }) => {
                let (cluster, id) = (Arc::clone(cluster), *id);
                Box::pin(async move {
                    let finished = cluster.wait_finished(id).await.map_err(internal)?;
                    Ok(Arc::new(finished.report))
                })
            }
            (Self::Local(..), Found::Shared { .. }) => {
                Box::pin(async { Err((ErrorKind::Internal, "not a cluster node".to_owned())) })
            }
        }
    }

    /// Makes the stop claim on a task (queued work is removed); false if
    /// it was already stopping or had ended.
    pub(crate) async fn stop(&self, found: &Found) -> Result<bool, (ErrorKind, String)> {
        let daemon = self.daemon();
        match (self, found) {
            (_, Found::Live(record)) => {
                let claimed = daemon.controller.remove(record.id);
                if claimed && let Self::Local(_, store) = self {
                    store.stopping(record.id);
                }
                Ok(claimed)
            }
            (_, Found::Stored(_)) => Ok(false),
            (Self::Shared(_, cluster), Found::Shared { id, .. }) => {
                match cluster.pg.cancel(*id).await.map_err(internal)? {
                    Canceled::Claimed { node } => {
                        if node == Some(cluster.node()) {
                            cluster.stop_local(&daemon.controller, *id);
                        }
                        Ok(true)
                    }
                    Canceled::Already => Ok(false),
                }
            }
            (Self::Local(..), Found::Shared { .. }) => Ok(false),
        }
    }

    /// The rows of `host ps` (with `all`, `host ps --all`), by id.
    pub(crate) async fn rows(&self, all: bool) -> Result<Vec<TaskRow>, (ErrorKind, String)> {
        match self {
            Self::Local(daemon, store) if all => {
                let (daemon, store) = (Arc::clone(daemon), Store::clone(store));
                // The store is read: off the async workers.
                Ok(
                    tokio::task::spawn_blocking(move || local_rows(&daemon, &store, true))
                        .await
                        .unwrap_or_default(),
                )
            }
            Self::Local(daemon, store) => Ok(local_rows(daemon, store, false)),
            Self::Shared(daemon, cluster) => {
                let mut rows = cluster
                    .pg
                    .list(all, MAX_FINISHED as i64)
                    .await
                    .map_err(internal)?;
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
                Ok(rows)
            }
        }
    }

    /// The slots of `host slots`.
    pub(crate) async fn slots(&self) -> Result<Vec<SlotView>, (ErrorKind, String)> {
        match self {
            Self::Local(daemon, _) => Ok(daemon.controller.snapshot()),
            Self::Shared(_, cluster) => cluster.pg.slots().await.map_err(internal),
        }
    }

    /// A task's log lines; following, new ones until it ends. Subscribed
    /// before it returns: lines written after the request are seen.
    pub(crate) async fn log(&self, found: Found, follow: bool) -> Items {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        match (self, found) {
            (_, Found::Live(record)) => follow_local(&tx, &record, follow),
            (_, Found::Stored(finished)) => {
                tokio::spawn(send_all(tx, finished.log));
            }
            (Self::Shared(daemon, cluster), Found::Shared { id, finished }) => {
                match daemon.tasks.get(id) {
                    // Running here: the node's own log, live.
                    Some(record) if !finished => follow_local(&tx, &record, follow),
                    _ => {
                        let cluster = Arc::clone(cluster);
                        tokio::spawn(async move {
                            until_closed(&tx, shared_log(&cluster, &tx, id, follow)).await;
                        });
                    }
                }
            }
            (Self::Local(..), Found::Shared { .. }) => {}
        }
        rx
    }

    /// `host events`: the recorded history, then (with `follow`) live
    /// events, with nothing falling between the two.
    pub(crate) fn events(&self, follow: bool, filter: EventFilter) -> Items {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        match self {
            Self::Local(daemon, _) => {
                // Subscribe before copying the history (in order: events of
                // requests sent after this one are seen), and let the
                // history catch up with the events published before.
                let (live, before) = daemon.controller.supervisor().subscribe_after();
                let history = Arc::clone(&daemon.history);
                tokio::spawn(async move {
                    let local = local_events(&tx, &history, live, before, follow, &filter);
                    until_closed(&tx, local).await;
                });
            }
            Self::Shared(_, cluster) => {
                let cluster = Arc::clone(cluster);
                tokio::spawn(async move {
                    until_closed(&tx, shared_events(&cluster, &tx, follow, &filter)).await;
                });
            }
        }
        rx
    }

    /// A task as the HTTP API details it.
    pub(crate) async fn detail(&self, found: Found) -> Result<Detail, (ErrorKind, String)> {
        let (id, finished) = match found {
            Found::Live(record) => {
                let row = self
                    .rows(false)
                    .await?
                    .into_iter()
                    .find(|r| r.id == record.id);
                return Ok(Detail {
                    row,
                    report: record.outcome.get(),
                    log: record.log.lines(),
                    id: record.id,
                    name: record.name,
                    slot: record.slot,
                    plugin: record.plugin,
                });
            }
            Found::Stored(finished) => return Ok(stored_detail(*finished)),
            Found::Shared { id, finished } => (id, finished),
        };
        let Self::Shared(..) = self else {
            return Err(not_found(&TaskRef::Id(id)));
        };
        let unfinished = if finished {
            None
        } else {
            self.rows(false).await?.into_iter().find(|r| r.id == id)
        };
        let Some(row) = unfinished else {
            // Finished (perhaps between the two reads): from the record.
            let Self::Shared(_, cluster) = self else {
                unreachable!("matched above")
            };
            return match cluster.pg.finished(id).await.map_err(internal)? {
                Some(finished) => Ok(stored_detail(finished)),
                None => Err(not_found(&TaskRef::Id(id))),
            };
        };
        let mut lines = self
            .log(
                Found::Shared {
                    id,
                    finished: false,
                },
                false,
            )
            .await;
        let mut log = Vec::new();
        while let Some(item) = lines.recv().await {
            if let Item::Log(line) = item {
                log.push(line);
            }
        }
        Ok(Detail {
            id,
            name: row.name.clone(),
            slot: row.slot.clone(),
            plugin: row.plugin.clone(),
            row: Some(row),
            report: None,
            log,
        })
    }

    /// `host plugins prune`: in a cluster, the database's unused plugins
    /// go first (the node's own copies are then collected as on one host).
    pub(crate) async fn prune_shared_plugins(&self) -> Result<(), (ErrorKind, String)> {
        match self {
            Self::Local(..) => Ok(()),
            Self::Shared(_, cluster) => cluster
                .pg
                .collect_plugins(Duration::ZERO)
                .await
                .map(|_| ())
                .map_err(internal),
        }
    }
}

fn stored_detail(finished: Finished) -> Detail {
    Detail {
        id: finished.report.id,
        name: finished.report.name.to_string(),
        slot: finished.report.slot.to_string(),
        plugin: finished.plugin,
        row: None,
        log: finished.log,
        report: Some(Arc::new(finished.report)),
    }
}

/// Runs a producer until it ends or its reader goes away.
async fn until_closed(tx: &mpsc::Sender<Item>, work: impl Future<Output = ()>) {
    tokio::select! {
        () = work => {}
        () = tx.closed() => {}
    }
}

async fn send_all(tx: mpsc::Sender<Item>, lines: Vec<LogLine>) {
    for line in lines {
        if tx.send(Item::Log(line)).await.is_err() {
            return;
        }
    }
}

/// A task's lines in this daemon's memory; following, the live ones until
/// it ends.
fn follow_local(tx: &mpsc::Sender<Item>, record: &TaskRecord, follow: bool) {
    let (lines, mut live) = record.log.follow();
    let follow = follow && record.outcome.get().is_none();
    let tx = tx.clone();
    tokio::spawn(async move {
        for line in lines {
            if tx.send(Item::Log(line)).await.is_err() {
                return;
            }
        }
        if !follow {
            return;
        }
        use tokio::sync::broadcast::error::RecvError;
        until_closed(&tx, async {
            loop {
                let item = match live.recv().await {
                    Ok(Some(line)) => Item::Log(line),
                    Ok(None) | Err(RecvError::Closed) => return,
                    Err(RecvError::Lagged(n)) => Item::Dropped(n),
                };
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        })
        .await;
    });
}

/// A task finished before, as the store keeps it.
fn stored(store: &Store, target: &TaskRef) -> Option<Found> {
    let stored = match target {
        TaskRef::Id(id) => store.finished_task(*id),
        TaskRef::Name(name) => store.finished_named(name),
    };
    stored.map(|finished| Found::Stored(Box::new(finished)))
}

/// One host's `ps` rows: registered tasks, queued ones, and with `all` the
/// finished ones the daemon still remembers or its store keeps.
fn local_rows(daemon: &Daemon, store: &Store, all: bool) -> Vec<TaskRow> {
    let supervisor = daemon.controller.supervisor();
    let schedule_of = |record: Option<&TaskRecord>| {
        record
            .and_then(|r| r.request.as_ref())
            .and_then(|r| r.schedule.clone())
    };
    let parent_of = |record: Option<&TaskRecord>| {
        record
            .and_then(|r| r.request.as_ref())
            .and_then(|r| r.parent)
    };
    let mut rows: Vec<TaskRow> = supervisor
        .list()
        .into_iter()
        .map(|t| {
            let record = daemon.tasks.get(t.id);
            TaskRow {
                id: t.id,
                state: t.phase,
                name: t.name,
                slot: t.slot,
                attempts: t.attempts,
                age: record.as_ref().map_or(t.age, |r| r.submitted.elapsed()),
                progress: t.progress,
                plugin: t.body,
                outcome: None,
                node: None,
                due_ms: None,
                schedule: schedule_of(record.as_ref()),
                parent: parent_of(record.as_ref()),
            }
        })
        .collect();
    let now = store::now_ms();
    rows.extend(daemon.controller.queued_all().into_iter().map(|q| {
        let record = daemon.tasks.get(q.id);
        TaskRow {
            id: q.id,
            name: q.name,
            slot: q.slot,
            // Waiting for its time, or for its turn in the slot.
            state: if q.due_in.is_some() {
                TaskState::Waiting
            } else {
                TaskState::Queued
            },
            attempts: 0,
            age: q.age,
            progress: None,
            plugin: q.body,
            outcome: None,
            node: None,
            // The time it was given (exact), else from the controller.
            due_ms: q.due_in.map(|d| {
                match record.as_ref().and_then(|r| r.request.as_ref()?.not_before) {
                    Some(NotBefore::At(at)) => at,
                    _ => now.saturating_add(d.as_millis() as u64),
                }
            }),
            schedule: schedule_of(record.as_ref()),
            parent: parent_of(record.as_ref()),
        }
    }));
    if all {
        let live: std::collections::HashSet<_> = rows.iter().map(|r| r.id).collect();
        rows.extend(
            daemon
                .tasks
                .finished_records()
                .into_iter()
                .filter(|r| !live.contains(&r.id))
                .filter_map(|r| {
                    let report = r.outcome.get()?;
                    Some(TaskRow {
                        id: r.id,
                        name: r.name,
                        slot: r.slot,
                        state: TaskState::Finished,
                        attempts: report.attempts,
                        age: r.submitted.elapsed(),
                        progress: None,
                        plugin: r.plugin,
                        outcome: Some(report.outcome.kind()),
                        node: None,
                        due_ms: None,
                        schedule: r.request.as_ref().and_then(|q| q.schedule.clone()),
                        parent: r.request.as_ref().and_then(|q| q.parent),
                    })
                }),
        );
        // Finished before this run of the daemon: from the store.
        let known: std::collections::HashSet<_> = rows.iter().map(|r| r.id).collect();
        rows.extend(
            store
                .finished_recent(MAX_FINISHED)
                .into_iter()
                .filter(|f| {
                    !known.contains(&f.report.id) && daemon.tasks.get(f.report.id).is_none()
                })
                .map(|f| TaskRow {
                    id: f.report.id,
                    name: f.report.name.to_string(),
                    slot: f.report.slot.to_string(),
                    state: TaskState::Finished,
                    attempts: f.report.attempts,
                    age: Duration::from_millis(now.saturating_sub(f.submitted_ms)),
                    progress: None,
                    plugin: f.plugin,
                    outcome: Some(f.report.outcome.kind()),
                    node: None,
                    due_ms: None,
                    schedule: None,
                    parent: f.parent,
                }),
        );
    }
    rows.sort_by_key(|r| r.id);
    rows
}

/// One host's events: its history up to `before`, then the live lane.
async fn local_events(
    tx: &mpsc::Sender<Item>,
    history: &crate::service::history::History,
    mut live: taskhost_core::supervisor::EventStream,
    before: u64,
    follow: bool,
    filter: &EventFilter,
) {
    let recorded = history.up_to(before).await;
    let last_seq = recorded.last().map_or(0, |e| e.seq);
    for event in recorded.iter().filter(|e| filter.admits(e)) {
        if tx
            .send(Item::Event(Box::new(Event::clone(event))))
            .await
            .is_err()
        {
            return;
        }
    }
    if !follow {
        return;
    }
    if last_seq < before && last_seq > 0 {
        // The recorder lost these; say so rather than skip them.
        if tx.send(Item::Dropped(before - last_seq)).await.is_err() {
            return;
        }
    }
    while let Some(received) = live.recv().await {
        let item = match received {
            Received::Event(e) if e.seq <= before || !filter.admits(&e) => continue,
            Received::Event(e) => Item::Event(Box::new(Event::clone(&e))),
            Received::Dropped(n) => Item::Dropped(n),
        };
        if tx.send(item).await.is_err() {
            return;
        }
    }
}

/// The cluster's events: the newest recorded ones that pass the filter,
/// then (following) new ones from the node's feed.
async fn shared_events(
    cluster: &Arc<Cluster>,
    tx: &mpsc::Sender<Item>,
    follow: bool,
    filter: &EventFilter,
) {
    // Subscribed before the history is read: nothing between is missed.
    let feed = if follow {
        match crate::cluster::follow_events(cluster).await {
            Ok(feed) => Some(feed),
            Err(err) => {
                let _ = tx.send(Item::Failed(err.to_string())).await;
                return;
            }
        }
    } else {
        None
    };
    let mut last = 0;
    match cluster.pg.events(None, EVENT_HISTORY as i64).await {
        Ok(events) => {
            for event in events {
                last = event.seq;
                if filter.admits(&event) && tx.send(Item::Event(Box::new(event))).await.is_err() {
                    return;
                }
            }
        }
        Err(err) => {
            let _ = tx.send(Item::Failed(err.to_string())).await;
            return;
        }
    }
    let Some(mut feed) = feed else { return };
    loop {
        let item = match feed.recv().await {
            Ok(event) if event.seq <= last => continue,
            Ok(event) => {
                last = event.seq;
                if !filter.admits(&event) {
                    continue;
                }
                Item::Event(Box::new(Event::clone(&event)))
            }
            Err(broadcast::error::RecvError::Lagged(n)) => Item::Dropped(n),
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(item).await.is_err() {
            return;
        }
    }
}

/// A task's lines from the cluster's database: its recorded log once it
/// has finished, else the lines its node shipped so far.
async fn shared_log(cluster: &Cluster, tx: &mpsc::Sender<Item>, id: TaskId, follow: bool) {
    match cluster.pg.finished(id).await {
        Ok(Some(finished)) => {
            for line in finished.log {
                if tx.send(Item::Log(line)).await.is_err() {
                    return;
                }
            }
        }
        // Running elsewhere (or not started): what its node shipped, then
        // (following) new lines until it ends.
        Ok(None) => follow_shipped(cluster, tx, id, follow).await,
        Err(err) => {
            let _ = tx.send(Item::Failed(err.to_string())).await;
        }
    }
}

/// A task's shipped lines; following, polls for more until it ends, then
/// the lines of its recorded log not sent yet.
async fn follow_shipped(cluster: &Cluster, tx: &mpsc::Sender<Item>, id: TaskId, follow: bool) {
    let mut after = 0;
    let mut sent = 0usize;
    loop {
        match cluster.pg.shipped_lines(id, after).await {
            Ok((lines, last)) => {
                after = last;
                let more = lines.len() == SHIP_BATCH;
                for line in lines {
                    if tx.send(Item::Log(line)).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
                if more {
                    continue;
                }
            }
            Err(err) => {
                let _ = tx.send(Item::Failed(err.to_string())).await;
                return;
            }
        }
        if !follow {
            return;
        }
        match cluster.pg.finished(id).await {
            Ok(Some(finished)) => {
                for line in finished.log.into_iter().skip(sent) {
                    if tx.send(Item::Log(line)).await.is_err() {
                        return;
                    }
                }
                return;
            }
            Ok(None) => {}
            Err(err) => {
                let _ = tx.send(Item::Failed(err.to_string())).await;
                return;
            }
        }
        tokio::time::sleep(cluster.settings.poll.min(Duration::from_millis(250))).await;
    }
}

/// A submission to the cluster: checked here, then queued for the
/// database's next batch of admissions (in the order sent), which decides.
async fn shared_submit(
    daemon: &Arc<Daemon>,
    cluster: &Arc<Cluster>,
    request: SubmitRequest,
) -> Result<Accepted, (ErrorKind, String)> {
    let plugin = cluster
        .ensure_plugin(&daemon.plugins, &request.plugin)
        .await?;
    submissions::check(daemon, &request).await?;
    let info = plugin.info();
    // A delayed one is recorded as such (its own transaction); its time
    // counts from now.
    let now = store::now_ms();
    let due = request
        .not_before
        .map(|at| at.at(now))
        .filter(|due| *due > now)
        .map(|due| (due, daemon.config.max_delayed));
    let admission = Arc::new(Admission {
        names: submissions::names(&request, info),
        request,
        plugin: info.name.clone(),
        max_slot_queue: daemon.config.max_slot_queue,
        max_total_pending: daemon.config.max_total_pending,
        max_descendants: daemon.config.max_descendants,
        due,
    });
    let keyed = admission
        .request
        .idempotency_key
        .clone()
        .map(|key| (key, admission.request.fingerprint()));
    let since = daemon.keys.cutoff_ms() as i64;
    let decide = {
        let (cluster, admission) = (Arc::clone(cluster), Arc::clone(&admission));
        move || -> BoxFuture<'static, Result<Submitted, AdmitError>> {
            match keyed.clone() {
                // A transaction of its own, which inserts the key first.
                Some((key, fingerprint)) => {
                    let (cluster, admission) = (Arc::clone(&cluster), Arc::clone(&admission));
                    Box::pin(async move {
                        cluster
                            .pg
                            .admit_keyed(&admission, &key, fingerprint, since)
                            .await
                    })
                }
                None if admission.due.is_some() => {
                    let (cluster, admission) = (Arc::clone(&cluster), Arc::clone(&admission));
                    Box::pin(async move { cluster.pg.delay(&admission).await })
                }
                None => Box::pin(cluster.pg.admit_queued(Arc::clone(&admission))),
            }
        }
    };
    let decided = decide();
    let (daemon, cluster) = (Arc::clone(daemon), Arc::clone(cluster));
    Ok(Accepted::Deciding(Box::pin(async move {
        let mut admitted = decided.await;
        if matches!(admitted, Err(AdmitError::PluginGone)) {
            // Collected from the database meanwhile: this node still has
            // it; store it again for the others.
            let digest = &admission.request.plugin;
            let path = plugin_path(&daemon.config.state_dir, digest);
            let name = &admission.plugin;
            let stored = match std::fs::read(&path) {
                Ok(bytes) => cluster
                    .pg
                    .put_plugin(digest, Some(name), &bytes)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
            };
            admitted = match stored {
                Ok(()) => decide().await,
                Err(e) => Err(AdmitError::Store(StoreError::Failed(e))),
            };
        }
        match admitted {
            Ok(submitted) => {
                cluster.wake.notify_one();
                Ok(submitted)
            }
            Err(AdmitError::PluginGone) => Err((
                ErrorKind::NotFound,
                format!(
                    "the cluster does not hold plugin {}; upload it again",
                    admission.request.plugin
                ),
            )),
            Err(AdmitError::Invalid(message)) => Err((ErrorKind::Invalid, message)),
            Err(AdmitError::Conflict(message)) => Err((ErrorKind::Conflict, message)),
            Err(AdmitError::TreeFull { root, max }) => Err((
                ErrorKind::Invalid,
                crate::store::too_many_descendants(root, max),
            )),
            Err(AdmitError::Store(err)) => Err((
                ErrorKind::Internal,
                format!("the submission could not be stored, so it was not accepted: {err}"),
            )),
        }
    })))
}
