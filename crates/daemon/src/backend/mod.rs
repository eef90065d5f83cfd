//! Owns the one seam between the verbs and where the work is kept: a
//! daemon's own store and controller (`Local`: SQLite or memory, the
//! controller decides) or a cluster's shared database (`Shared`: PostgreSQL
//! decides, this node runs what it claimed). Every verb the socket and the
//! HTTP listener serve asks it, and gets the same answer in both modes:
//! data for the answers that are one value, a bounded channel of [`Item`]s
//! for the ones that stream (logs, events). A caller that goes away closes
//! the channel, which ends its producer. Like tokio's scheduler handle, the
//! enum only dispatches: each flavour's bodies are in its own file.
//!
//! It also holds what the verbs' bodies share: [`Daemon`], which
//! assembles the services, the store or the cluster node, the controller
//! and the runtime, and the work that needs all of them (submissions,
//! recovery, schedules, child tasks, a node's loops). The services below
//! take only the handles they use; nothing below imports this folder.
//!
//! | file | owns |
//! |---|---|
//! | `local` | one host's bodies of the verbs: its store, its controller |
//! | `deployments` | named deployments on one host: the verbs, a submission's name resolved to its digest |
//! | `namespaces` | `host ns`, a submission's quotas, the namespace's keys of the names a verb carries |
//! | `shared` | a cluster node's bodies of the verbs: the database, this node's part |
//! | `daemon` | what the connections share: the assembly of one daemon's parts, the outcomes still to record |
//! | `submit` | a submit request checked, named and placed: into the controller (one host) or the database (a cluster) |
//! | `record` | the body that keeps each attempt's state and outcome in the store, or under a claim's fencing token |
//! | `children` | child tasks: a guest's spawn as a submission with its parent's grants and key, the wait, the cascade of a cancel |
//! | `recovery` | rebuilding the controller from the store at start |
//! | `schedules` | one host's schedules: their table, the firing loop, the verbs |
//! | `node` | a cluster node's loops: claims, lease and takeover, fencing, notifications, polling |
//! | `shares` | a cluster node's fair share of its claims between namespaces, by weight |
//! | `time` | a cluster's schedule verbs; the loop that places delayed submissions and fires schedules when due |

pub(crate) mod children;
pub(crate) mod daemon;
pub(crate) mod deployments;
mod local;
mod namespaces;
pub(crate) mod node;
pub(crate) mod record;
pub(crate) mod recovery;
pub(crate) mod schedules;
mod shared;
mod shares;
pub(crate) mod submit;
pub(crate) mod time;

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use taskhost_core::controller::SlotView;
use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, TaskId, TaskRef, TaskReport};
use taskhost_runtime::Digest;

use crate::backend::daemon::{Daemon, Storage};
use crate::backend::submit::Accepted;
use crate::service::error::ServiceError;
use crate::service::namespace::{Ns, View, bare};
use crate::service::tasks::TaskRecord;
use crate::store::{Finished, StoreError};
use crate::wire::protocol::{
    EventFilter, NamespaceRow, ScheduleRow, ScheduleVerb, SlotRuleRow, SlotRuleVerb, SubmitRequest,
    TaskRow,
};
pub(crate) use local::{Local, OneHost};
pub(crate) use namespaces::set_namespace;
pub(crate) use shared::Shared;

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
    Shared {
        id: TaskId,
        name: String,
        finished: bool,
    },
}

impl Found {
    /// The task's name (its namespace's key).
    fn name(&self) -> &str {
        match self {
            Found::Live(record) => &record.name,
            Found::Stored(finished) => &finished.report.name,
            Found::Shared { name, .. } => name,
        }
    }

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

/// What a schedule verb answers.
pub(crate) enum Scheduled {
    /// `ls`.
    Rows(Vec<ScheduleRow>),
    /// `add`, `rm`, `pause`, `resume`: the schedule as it left it.
    Row(ScheduleRow),
    /// `run`: the firing, answered as a submission.
    Fired(Accepted),
}

/// What a namespace verb answers.
pub(crate) enum Namespaced {
    /// `ls`.
    Rows(Vec<NamespaceRow>),
    /// `add`, `set`: the namespace as it is now; `rm`: as it was.
    Row(NamespaceRow),
}

/// What a slot-rule verb answers.
pub(crate) enum SlotRuled {
    /// `ls`.
    Rows(Vec<SlotRuleRow>),
    /// `set`: the rule as set; `unset`: the rule removed.
    Row(SlotRuleRow),
}

/// The seam: which backend this daemon's verbs go to, and what the caller
/// sees of it (its namespace, or every one).
pub(crate) struct Backend<'a> {
    kind: Kind<'a>,
    view: View,
}

enum Kind<'a> {
    Local(Local<'a>),
    Shared(Shared<'a>),
}

/// A store failure as a verb's answer.
fn internal(err: StoreError) -> ServiceError {
    ServiceError::Store(err)
}

/// The answer to a reference that names no task.
fn not_found(target: &TaskRef) -> ServiceError {
    ServiceError::NotFound(format!("no task with {target} (see `host ps --all`)"))
}

impl<'a> Backend<'a> {
    /// The backend as the default namespace sees it (the HTTP JSON API's
    /// in this version).
    pub(crate) fn of(daemon: &'a Arc<Daemon>) -> Self {
        Self::within(daemon, View::default())
    }

    /// The backend as the daemon itself sees it: every namespace (its own
    /// work: a child's lookups, a cascade).
    pub(crate) fn daemon_wide(daemon: &'a Arc<Daemon>) -> Self {
        Self::within(
            daemon,
            View {
                acting: Ns::default(),
                all: true,
            },
        )
    }

    /// The backend as `view` sees it.
    pub(crate) fn within(daemon: &'a Arc<Daemon>, view: View) -> Self {
        let kind = match &daemon.storage {
            Storage::Local(host) => Kind::Local(Local { daemon, host }),
            Storage::Shared(cluster) => Kind::Shared(Shared { daemon, cluster }),
        };
        Backend { kind, view }
    }

    /// Whether accepted work outlives this process (a graceful stop then
    /// keeps unfinished work for the next start).
    pub(crate) fn is_durable(&self) -> bool {
        match &self.kind {
            Kind::Local(local) => local.host.store.is_durable(),
            Kind::Shared(..) => true,
        }
    }

    /// Stops taking new work (a graceful stop has begun).
    pub(crate) fn stop_taking(&self) {
        if let Kind::Shared(shared) = &self.kind {
            shared.cluster.stop_claiming();
        }
    }

    /// Whether a submission may name this plugin without uploading it.
    pub(crate) async fn has_plugin(&self, digest: &Digest) -> bool {
        match &self.kind {
            Kind::Local(local) => local.daemon.plugins.known(digest),
            Kind::Shared(shared) => shared.has_plugin(digest).await,
        }
    }

    /// Stores an uploaded plugin (compiled here; in a cluster, kept in the
    /// database for every node too); returns its name.
    pub(crate) async fn upload(
        &self,
        digest: Digest,
        bytes: Vec<u8>,
    ) -> Result<String, ServiceError> {
        match &self.kind {
            Kind::Local(local) => local.upload(digest, bytes).await,
            Kind::Shared(shared) => shared.upload(digest, bytes).await,
        }
    }

    /// Places one submission, in the order it was sent, in the namespace
    /// the caller acts in (within its quotas).
    pub(crate) async fn submit(
        &self,
        mut request: SubmitRequest,
    ) -> Result<Accepted, ServiceError> {
        let ns = &self.view.acting;
        request.namespace = ns.as_request();
        if !ns.is_default() {
            self.within_quotas(ns, &mut request).await?;
        }
        match &self.kind {
            // One host resolves a deployment as it places the task.
            Kind::Local(local) => local.submit(request).await,
            Kind::Shared(shared) => {
                // An idempotency key holds the request as given, as on one
                // host: a retry naming a deployment is the same request
                // whichever version is current by then.
                let given = (request.idempotency_key.as_ref()).map(|_| request.fingerprint());
                self.resolve_shared(&mut request).await?;
                shared.submit(request, given).await
            }
        }
    }

    /// A schedule verb (`host schedule …`).
    pub(crate) async fn schedule(&self, verb: ScheduleVerb) -> Result<Scheduled, ServiceError> {
        let verb = self.keyed_schedule(verb).await?;
        let answer = match &self.kind {
            Kind::Local(local) => local.schedule(verb).await,
            Kind::Shared(shared) => shared.schedule(verb).await,
        };
        match answer {
            Ok(Scheduled::Rows(mut rows)) => {
                rows.retain(|row| self.view.sees(&row.name));
                Ok(Scheduled::Rows(rows))
            }
            other => other,
        }
    }

    /// The task a reference names, among those the caller sees (a name
    /// in the namespace it acts in); another namespace's is not found.
    pub(crate) async fn find(&self, target: &TaskRef) -> Result<Found, ServiceError> {
        let key = match target {
            TaskRef::Name(name) => TaskRef::Name(self.view.key(name)),
            TaskRef::Id(id) => TaskRef::Id(*id),
        };
        let found = match &self.kind {
            Kind::Local(local) => local.find(&key).await,
            Kind::Shared(shared) => shared.find(&key).await,
        };
        match found {
            Ok(found) if self.view.sees(found.name()) => Ok(found),
            Ok(_) | Err(ServiceError::NotFound(_)) => Err(not_found(target)),
            Err(e) => Err(e),
        }
    }

    /// The stored plugins as `host plugins ls` lists them: to an operator
    /// seeing every namespace, all of them; to a namespace, those its tasks
    /// and schedules use, with its own counts (the default namespace also
    /// sees those nobody uses, as before namespaces).
    pub(crate) async fn plugin_rows(
        &self,
    ) -> Result<Vec<crate::wire::protocol::PluginRow>, ServiceError> {
        let daemon = Arc::clone(self.daemon());
        let view = self.view.clone();
        if let Kind::Shared(shared) = &self.kind {
            // The cluster's plugins, counted from its database.
            let only = (!view.all).then(|| view.acting.share().unwrap_or_default());
            let rows = (shared.cluster.pg.plugin_rows(only.as_deref()).await)
                .map_err(ServiceError::Store)?;
            let unused_to_all = view.acting.is_default();
            let runtime = daemon.plugins.runtime();
            return Ok(rows
                .into_iter()
                .filter(|(row, anyone)| {
                    view.all || row.unfinished + row.finished > 0 || (unused_to_all && !anyone)
                })
                .map(|(mut row, _)| {
                    row.loaded = runtime.is_cached(&row.digest);
                    row
                })
                .collect());
        }
        tokio::task::spawn_blocking(move || {
            let users = daemon.plugin_users();
            let refs = |only| {
                crate::service::plugins::refs(users.store, users.tasks, users.schedules, only)
            };
            let every = refs(None);
            let rows = daemon.plugins.list(&every);
            if view.all {
                return rows;
            }
            let own = refs(Some(&view.acting));
            let unused_to_all = view.acting.is_default();
            rows.into_iter()
                .filter_map(|mut row| match own.get(&row.digest) {
                    Some(used) => {
                        (row.unfinished, row.finished) = (used.unfinished, used.finished);
                        Some(row)
                    }
                    None => (unused_to_all && !every.contains_key(&row.digest)).then_some(row),
                })
                .collect()
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("the plugins could not be listed: {e}")))
    }

    /// The request a task was submitted with (resolved: its name, slot
    /// and policy as placed), for `host rerun`; its idempotency key and
    /// the schedule that fired it are left out.
    pub(crate) async fn request_of(&self, found: &Found) -> Result<SubmitRequest, ServiceError> {
        let id = found.id();
        let request = match (&self.kind, found) {
            (Kind::Local(_), Found::Live(record)) if record.request.is_some() => {
                record.request.as_deref().cloned()
            }
            (Kind::Local(local), _) => local.stored_request(id).await,
            (Kind::Shared(shared), _) => shared.stored_request(id).await?,
        };
        let mut request = request.ok_or_else(|| {
            ServiceError::NotFound(format!(
                "task {id}'s request is no longer kept (retention), so it cannot be rerun"
            ))
        })?;
        request.idempotency_key = None;
        // A rerun is nobody's firing: a client submits it.
        request.schedule = None;
        // Its names as its namespace gives them (they are keyed again).
        request.name = request.name.map(|n| bare(&n).to_owned());
        request.slot = request.slot.map(|s| bare(&s).to_owned());
        Ok(request)
    }

    /// The task's report once it has one.
    pub(crate) fn outcome(
        &self,
        found: &Found,
    ) -> BoxFuture<'static, Result<Arc<TaskReport>, ServiceError>> {
        match (&self.kind, found) {
            (_, Found::Live(record)) => {
                let outcome = record.outcome.clone();
                Box::pin(async move { Ok(outcome.report().await) })
            }
            (_, Found::Stored(finished)) => {
                let report = Arc::new(finished.report.clone());
                Box::pin(async move { Ok(report) })
            }
            (Kind::Shared(shared), Found::Shared { id, .. }) => shared.outcome(*id),
            (Kind::Local(..), Found::Shared { .. }) => {
                Box::pin(async { Err(ServiceError::Internal("not a cluster node".to_owned())) })
            }
        }
    }

    /// Makes the stop claim on a task (queued work is removed); false if
    /// it was already stopping or had ended.
    pub(crate) async fn stop(&self, found: &Found) -> Result<bool, ServiceError> {
        match (&self.kind, found) {
            (Kind::Local(local), Found::Live(record)) => Ok(local.stop(record.id)),
            (Kind::Shared(shared), Found::Live(record)) => {
                Ok(shared.daemon.controller.remove(record.id))
            }
            (_, Found::Stored(_)) => Ok(false),
            (Kind::Shared(shared), Found::Shared { id, .. }) => shared.stop(*id).await,
            (Kind::Local(..), Found::Shared { .. }) => Ok(false),
        }
    }

    /// Stops each task of `rows` as [`Backend::stop`] would (its stop
    /// claimed once), oldest first; on a cluster node the queued ones in a
    /// few transactions. How many this call stopped.
    pub(crate) async fn stop_all(&self, rows: &[TaskRow]) -> Result<u64, ServiceError> {
        let mut ids: Vec<TaskId> = rows.iter().map(|row| row.id).collect();
        ids.sort_unstable();
        let mut stopped = 0;
        if let Kind::Shared(shared) = &self.kind {
            let queued: Vec<TaskId> = rows
                .iter()
                .filter(|row| row.state == crate::wire::protocol::TaskState::Queued)
                .map(|row| row.id)
                .collect();
            let ended: std::collections::HashSet<TaskId> =
                shared.cancel_queued(&queued).await?.into_iter().collect();
            stopped = ended.len() as u64;
            ids.retain(|id| !ended.contains(id));
        }
        // Oldest first: each is then near the head of its slot's queue.
        for id in ids {
            // One that ended meanwhile is not found, or not claimed.
            if let Ok(found) = self.find(&TaskRef::Id(id)).await
                && let Ok(true) = self.stop(&found).await
            {
                stopped += 1;
            }
        }
        Ok(stopped)
    }

    /// The rows of `host ps` (with `all`, `host ps --all`), by id.
    pub(crate) async fn rows(&self, all: bool) -> Result<Vec<TaskRow>, ServiceError> {
        let mut rows = match &self.kind {
            Kind::Local(local) => local.rows(all).await,
            Kind::Shared(shared) => shared.rows(all).await?,
        };
        rows.retain(|row| self.view.sees(&row.name));
        Ok(rows)
    }

    /// One page of `page`; with a limit read as far as the page needs: on
    /// one host the store by its key, in a cluster the database's.
    pub(crate) async fn page(
        &self,
        page: &crate::wire::protocol::TaskPage,
    ) -> Result<Vec<TaskRow>, ServiceError> {
        let all = page.all || page.filter.outcome.is_some();
        match (page.limit, &self.kind) {
            (Some(limit), Kind::Local(local)) => {
                return Ok(local
                    .page(page.clone(), limit as usize, self.view.clone())
                    .await);
            }
            (Some(limit), Kind::Shared(shared)) => {
                return self.shared_page(shared, page, limit as usize).await;
            }
            (None, _) => {}
        }
        let mut rows: Vec<TaskRow> = self
            .rows(all)
            .await?
            .into_iter()
            .filter(|row| page.before.is_none_or(|before| row.id < before))
            .filter(|row| page.filter.admits(row))
            .collect();
        rows.sort_unstable_by_key(|row| std::cmp::Reverse(row.id));
        if let Some(limit) = page.limit {
            rows.truncate(limit as usize);
        }
        Ok(rows)
    }

    /// A cluster's page: its live tasks, then its finished ones read
    /// newest first in chunks until the page is full (or none is left).
    async fn shared_page(
        &self,
        shared: &Shared<'_>,
        page: &crate::wire::protocol::TaskPage,
        limit: usize,
    ) -> Result<Vec<TaskRow>, ServiceError> {
        // Chunks grow from 1,000 to 64,000 rows: a first page takes one,
        // a filter that matches few finished tasks a few round trips.
        let mut chunk_size = 1_000;
        let admits = |row: &TaskRow| {
            page.before.is_none_or(|before| row.id < before) && page.filter.admits(row)
        };
        let mut rows: Vec<TaskRow> = self.rows(false).await?;
        rows.retain(admits);
        if page.all || page.filter.outcome.is_some() {
            let (mut cursor, mut found) = (page.before, 0);
            while found < limit {
                let chunk = shared
                    .finished_before(cursor, page.filter.outcome, chunk_size)
                    .await?;
                let more = chunk.len() == chunk_size;
                cursor = chunk.last().map(|row| row.id);
                for row in chunk {
                    if found < limit && self.view.sees(&row.name) && admits(&row) {
                        found += 1;
                        rows.push(row);
                    }
                }
                if !more {
                    break;
                }
                chunk_size = (chunk_size * 4).min(64_000);
            }
        }
        // A task that finished between the two reads is kept as finished.
        rows.sort_unstable_by_key(|row| {
            (
                std::cmp::Reverse(row.id),
                row.state != crate::wire::protocol::TaskState::Finished,
            )
        });
        rows.dedup_by_key(|row| row.id);
        rows.truncate(limit);
        Ok(rows)
    }

    /// A verb on the operator's slot rules (`host slot …`).
    pub(crate) async fn slot_rule(&self, verb: SlotRuleVerb) -> Result<SlotRuled, ServiceError> {
        let verb = self.keyed_slot_rule(verb);
        let answer = match &self.kind {
            Kind::Local(local) => local.slot_rule(verb).await,
            Kind::Shared(shared) => shared.slot_rule(verb).await,
        };
        match answer {
            Ok(SlotRuled::Rows(mut rows)) => {
                rows.retain(|row| self.view.sees(&row.pattern));
                Ok(SlotRuled::Rows(rows))
            }
            other => other,
        }
    }

    /// The slots of `host slots`.
    pub(crate) async fn slots(&self) -> Result<Vec<SlotView>, ServiceError> {
        let mut slots = match &self.kind {
            Kind::Local(local) => local.daemon.controller.snapshot(),
            Kind::Shared(shared) => shared.cluster.pg.slots().await.map_err(internal)?,
        };
        slots.retain(|slot| self.view.sees(&slot.key));
        Ok(slots)
    }

    /// A task's log lines; following, new ones until it ends. Subscribed
    /// before it returns: lines written after the request are seen.
    pub(crate) async fn log(&self, found: Found, follow: bool) -> Items {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        match (&self.kind, found) {
            (_, Found::Live(record)) => follow_local(&tx, &record, follow),
            (_, Found::Stored(finished)) => {
                tokio::spawn(send_all(tx, finished.log));
            }
            (Kind::Shared(shared), Found::Shared { id, finished, .. }) => {
                shared.log(tx, id, finished, follow);
            }
            (Kind::Local(..), Found::Shared { .. }) => {}
        }
        rx
    }

    /// `host events`: the recorded history, then (with `follow`) live
    /// events, with nothing falling between the two.
    pub(crate) fn events(&self, follow: bool, mut filter: EventFilter) -> Items {
        if let Some(TaskRef::Name(name)) = &filter.task {
            filter.task = Some(TaskRef::Name(self.view.key(name)));
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        match &self.kind {
            Kind::Local(local) => local.events(tx, follow, filter),
            Kind::Shared(shared) => shared.events(tx, follow, filter),
        }
        if self.view.all {
            return rx;
        }
        seen_only(self.view.clone(), rx)
    }

    /// The record of one attempt of a task (`attempt`; none: the last one
    /// recorded), as a record file of that attempt alone.
    pub(crate) async fn record(
        &self,
        found: Found,
        attempt: Option<u32>,
    ) -> Result<Vec<u8>, ServiceError> {
        let id = found.id();
        let file = match (&self.kind, found) {
            (_, Found::Live(record)) => Some(record.log.records()).filter(|r| !r.is_empty()),
            (Kind::Local(local), Found::Stored(_)) => local.host.store.records(id),
            (Kind::Shared(shared), Found::Shared { finished, .. }) => {
                if !finished {
                    return Err(ServiceError::NotFound(format!(
                        "task {id} has not finished: a cluster keeps its attempts' records \
                         from its end on (wait for it: host wait {id})"
                    )));
                }
                shared.cluster.pg.records(id).await?
            }
            (Kind::Local(..), Found::Shared { .. }) | (Kind::Shared(..), Found::Stored(_)) => None,
        };
        let none = || {
            ServiceError::NotFound(format!(
                "task {id} has no recorded attempt: it was submitted with --no-record, the \
                 daemon records nothing (--record-budget 0), or no attempt has ended yet"
            ))
        };
        let file = taskhost_runtime::record::RecordFile::decode(&file.ok_or_else(none)?)
            .map_err(|e| ServiceError::Internal(format!("task {id}'s records: {e}")))?;
        let one = file.take_attempt(attempt).map_err(|held| {
            ServiceError::NotFound(format!(
                "task {id} has no record of attempt {}: it keeps attempt {held} (the newest {} \
                 attempts of a task are kept)",
                attempt.unwrap_or(0),
                crate::service::tasks::MAX_RECORDS_KEPT
            ))
        })?;
        Ok(taskhost_runtime::record::RecordFile {
            attempts: vec![one],
        }
        .encode())
    }

    /// A task as the HTTP API details it.
    pub(crate) async fn detail(&self, found: Found) -> Result<Detail, ServiceError> {
        match found {
            Found::Live(record) => {
                let row = self
                    .rows(false)
                    .await?
                    .into_iter()
                    .find(|r| r.id == record.id);
                Ok(Detail {
                    row,
                    report: record.outcome.get(),
                    log: record.log.lines(),
                    id: record.id,
                    name: record.name,
                    slot: record.slot,
                    plugin: record.plugin,
                })
            }
            Found::Stored(finished) => Ok(stored_detail(*finished)),
            Found::Shared { id, finished, .. } => match &self.kind {
                Kind::Shared(shared) => shared.detail(id, finished).await,
                Kind::Local(_) => Err(not_found(&TaskRef::Id(id))),
            },
        }
    }

    /// `host plugins prune`: in a cluster, the database's unused plugins
    /// go first (the node's own copies are then collected as on one host).
    pub(crate) async fn prune_shared_plugins(&self) -> Result<(), ServiceError> {
        match &self.kind {
            Kind::Local(..) => Ok(()),
            Kind::Shared(shared) => shared.prune_plugins().await,
        }
    }

    /// A `host kv` verb: one host's buckets; a cluster node has none.
    pub(crate) async fn kv(
        &self,
        verb: crate::wire::protocol::KvVerb,
    ) -> Result<crate::service::kv::KvAnswer, ServiceError> {
        let listing_buckets = verb == crate::wire::protocol::KvVerb::List(None);
        let verb = self.keyed_kv(verb);
        let answer = match &self.kind {
            Kind::Local(local) => crate::service::kv::answer(&local.host.kv, verb).await,
            Kind::Shared(shared) => shared.kv(verb).await,
        };
        match answer {
            Ok(crate::service::kv::KvAnswer::Rows(mut rows)) if listing_buckets => {
                // A bucket's row is `slot:KEY` or `shared:NAME`.
                rows.retain(|row| {
                    let name = row.name.split_once(':').map_or("", |(_, name)| name);
                    self.view.sees(name)
                });
                Ok(crate::service::kv::KvAnswer::Rows(rows))
            }
            other => other,
        }
    }

    fn daemon(&self) -> &'a Arc<Daemon> {
        match &self.kind {
            Kind::Local(local) => local.daemon,
            Kind::Shared(shared) => shared.daemon,
        }
    }
}

/// The events of `items` that `view` sees (an event names its task or its
/// slot; one that names neither is the daemon's, which the default
/// namespace sees).
fn seen_only(view: View, mut items: Items) -> Items {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        while let Some(item) = items.recv().await {
            if let Item::Event(event) = &item {
                let key = event.name.as_deref().or(event.slot.as_deref());
                let seen = match key {
                    Some(key) => view.sees(key),
                    None => view.acting.is_default(),
                };
                if !seen {
                    continue;
                }
            }
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// A finished task as the HTTP API details it.
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
