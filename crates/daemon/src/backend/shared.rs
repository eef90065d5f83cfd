//! Owns a cluster node's bodies of the verbs: the shared database decides
//! and answers for the whole cluster; this node adds what only it knows
//! (the tasks it runs: their progress, phase and live log).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{broadcast, mpsc};

use taskhost_core::outcome::OutcomeKind;
use taskhost_core::supervisor::{Event, TaskId, TaskRef, TaskReport};
use taskhost_runtime::Digest;

use super::{
    Detail, Found, Item, Scheduled, SlotRuled, follow_local, internal, not_found, stored_detail,
    until_closed,
};
use crate::backend::daemon::Daemon;
use crate::backend::submit::{self, Accepted};
use crate::cluster::node::{Cluster, SHIP_BATCH};
use crate::service::error::ServiceError;
use crate::service::history::EVENT_HISTORY;
use crate::service::keys;
use crate::service::plugins::plugin_path;
use crate::service::tasks::MAX_FINISHED;
use crate::store::postgres::{Admission, AdmitError, Canceled};
use crate::store::{self, StoreError};
use crate::wire::protocol::{
    EventFilter, Quota, ScheduleVerb, SlotRuleRow, SlotRuleVerb, SubmitRequest, Submitted, TaskRow,
    TaskState,
};

/// A cluster node: the daemon and its part of the cluster.
pub(crate) struct Shared<'a> {
    pub(crate) daemon: &'a Arc<Daemon>,
    pub(crate) cluster: &'a Arc<Cluster>,
}

impl Shared<'_> {
    /// `host slot`: the rules every node reads.
    pub(super) async fn slot_rule(&self, verb: SlotRuleVerb) -> Result<SlotRuled, ServiceError> {
        let pg = &self.cluster.pg;
        let (pattern, settings) = match verb {
            SlotRuleVerb::List => {
                let rows = pg.slot_rules().await.map_err(internal)?;
                let rows = rows
                    .into_iter()
                    .map(|(pattern, settings)| SlotRuleRow { pattern, settings })
                    .collect();
                return Ok(SlotRuled::Rows(rows));
            }
            SlotRuleVerb::Set(row) => (row.pattern, Some(row.settings)),
            SlotRuleVerb::Unset(pattern) => (pattern, None),
        };
        match pg
            .set_slot_rule(&pattern, settings)
            .await
            .map_err(internal)?
        {
            Err(refused) => Err(ServiceError::Invalid(refused)),
            Ok(None) if settings.is_none() => Err(ServiceError::NotFound(format!(
                "no slot rule for `{pattern}` (see `host slot ls`)"
            ))),
            Ok(old) => Ok(SlotRuled::Row(SlotRuleRow {
                pattern,
                settings: settings.or(old).unwrap_or_default(),
            })),
        }
    }

    /// Whether this node or the database holds the plugin.
    pub(super) async fn has_plugin(&self, digest: &Digest) -> bool {
        self.daemon.plugins.known(digest)
            || self.cluster.pg.has_plugin(digest).await.unwrap_or(false)
    }

    /// Stores an uploaded plugin here and in the database; returns its
    /// name.
    pub(super) async fn upload(
        &self,
        digest: Digest,
        bytes: Vec<u8>,
    ) -> Result<String, ServiceError> {
        let plugin = self
            .daemon
            .plugins
            .store(bytes.clone(), Some(digest))
            .await?;
        let name = plugin.info().name.clone();
        self.cluster
            .pg
            .put_plugin(&digest, Some(&name), &bytes)
            .await
            .map_err(internal)?;
        Ok(name)
    }

    /// Queues one submission for the database's decision.
    /// Places one submission; `given` is the fingerprint of the request as
    /// it came, before its deployment was resolved.
    pub(super) async fn submit(
        &self,
        request: SubmitRequest,
        given: Option<[u8; 32]>,
    ) -> Result<Accepted, ServiceError> {
        shared_submit(self.daemon, self.cluster, request, given).await
    }

    /// A schedule verb on the database's schedules.
    pub(super) async fn schedule(&self, verb: ScheduleVerb) -> Result<Scheduled, ServiceError> {
        crate::backend::time::verb(self.daemon, self.cluster, verb).await
    }

    /// The task a reference names, in the database.
    pub(super) async fn find(&self, target: &TaskRef) -> Result<Found, ServiceError> {
        match self.cluster.pg.resolve(target).await {
            Ok(Some(found)) => Ok(Found::Shared {
                name: found.name,
                id: found.id,
                finished: found.state.is_some_and(TaskState::is_finished),
            }),
            Ok(None) => Err(not_found(target)),
            Err(err) => Err(internal(err)),
        }
    }

    /// A request as the database keeps it.
    pub(super) async fn stored_request(
        &self,
        id: TaskId,
    ) -> Result<Option<SubmitRequest>, ServiceError> {
        self.cluster.pg.request_of(id).await.map_err(internal)
    }

    /// A task's report, once the database has it.
    pub(super) fn outcome(
        &self,
        id: TaskId,
    ) -> BoxFuture<'static, Result<Arc<TaskReport>, ServiceError>> {
        let cluster = Arc::clone(self.cluster);
        Box::pin(async move {
            let finished = cluster.wait_finished(id).await.map_err(internal)?;
            Ok(Arc::new(finished.report))
        })
    }

    /// Makes the stop claim in the database; tells this node's task at
    /// once if it runs here.
    pub(super) async fn stop(&self, id: TaskId) -> Result<bool, ServiceError> {
        match self.cluster.pg.cancel(id).await.map_err(internal)? {
            Canceled::Claimed { node } => {
                if node == Some(self.cluster.node()) {
                    self.cluster.stop_local(&self.daemon.controller, id);
                }
                Ok(true)
            }
            Canceled::Already => Ok(false),
        }
    }

    /// Ends the tasks of `ids` still queued, in a few transactions; the
    /// ids it ended.
    pub(super) async fn cancel_queued(&self, ids: &[TaskId]) -> Result<Vec<TaskId>, ServiceError> {
        self.cluster.pg.cancel_queued(ids).await.map_err(internal)
    }

    /// The cluster's `ps` rows, with the exact phase and progress of the
    /// tasks running here.
    pub(super) async fn rows(&self, all: bool) -> Result<Vec<TaskRow>, ServiceError> {
        let mut rows = self
            .cluster
            .pg
            .list(all, MAX_FINISHED as i64)
            .await
            .map_err(internal)?;
        let local: HashMap<TaskId, _> = self
            .daemon
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

    /// Finished tasks below `before`, newest first, at most `limit`.
    pub(super) async fn finished_before(
        &self,
        before: Option<TaskId>,
        outcome: Option<OutcomeKind>,
        limit: usize,
    ) -> Result<Vec<TaskRow>, ServiceError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        (self
            .cluster
            .pg
            .finished_before(before, outcome, limit)
            .await)
            .map_err(internal)
    }

    /// Streams a task's lines into `tx`: live from this node's memory if
    /// it runs here, else from the database.
    pub(super) fn log(&self, tx: mpsc::Sender<Item>, id: TaskId, finished: bool, follow: bool) {
        match self.daemon.tasks.get(id) {
            Some(record) if !finished => follow_local(&tx, &record, follow),
            _ => {
                let cluster = Arc::clone(self.cluster);
                tokio::spawn(async move {
                    until_closed(&tx, shared_log(&cluster, &tx, id, follow)).await;
                });
            }
        }
    }

    /// Streams the cluster's events into `tx`.
    pub(super) fn events(&self, tx: mpsc::Sender<Item>, follow: bool, filter: EventFilter) {
        let cluster = Arc::clone(self.cluster);
        tokio::spawn(async move {
            until_closed(&tx, shared_events(&cluster, &tx, follow, &filter)).await;
        });
    }

    /// A task of the database as the HTTP API details it.
    pub(super) async fn detail(&self, id: TaskId, finished: bool) -> Result<Detail, ServiceError> {
        let unfinished = if finished {
            None
        } else {
            self.rows(false).await?.into_iter().find(|r| r.id == id)
        };
        let Some(row) = unfinished else {
            // Finished (perhaps between the two reads): from the record.
            return match self.cluster.pg.finished(id).await.map_err(internal)? {
                Some(finished) => Ok(stored_detail(finished)),
                None => Err(not_found(&TaskRef::Id(id))),
            };
        };
        let (tx, mut lines) = mpsc::channel(super::STREAM_BUFFER);
        self.log(tx, id, false, false);
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

    /// Collects the database's unused plugins.
    pub(super) async fn prune_plugins(&self) -> Result<(), ServiceError> {
        self.cluster
            .pg
            .collect_plugins(Duration::ZERO)
            .await
            .map(|_| ())
            .map_err(internal)
    }

    /// A `host kv` verb on the database's buckets.
    pub(super) async fn kv(
        &self,
        verb: crate::wire::protocol::KvVerb,
    ) -> Result<crate::service::kv::KvAnswer, ServiceError> {
        let limits = taskhost_runtime::KvLimits {
            max_bucket_bytes: self.daemon.config.kv_max_bucket,
            max_total_bytes: self.daemon.config.kv_max_total,
        };
        crate::cluster::kv::answer_shared(self.cluster, limits, verb).await
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
    given: Option<[u8; 32]>,
) -> Result<Accepted, ServiceError> {
    let plugin = cluster
        .ensure_plugin(&daemon.plugins, &request.plugin)
        .await?;
    submit::check(daemon, &request).await?;
    let info = plugin.info();
    // A delayed one is recorded as such (its own transaction); its time
    // counts from now.
    let now = store::now_ms();
    let due = request
        .not_before
        .map(|at| at.at(now))
        .filter(|due| *due > now)
        .map(|due| (due, daemon.config.max_delayed));
    // A namespace's own bound on a spawn tree, when it is the lower one.
    let ns = crate::service::namespace::Ns::named(request.namespace.as_deref());
    let ns_settings = daemon.namespaces.settings(&ns);
    let tree_quota = ns_settings
        .limit(Quota::Descendants)
        .map(|q| usize::try_from(q).unwrap_or(usize::MAX))
        .filter(|q| *q < daemon.config.max_descendants);
    let admission = Arc::new(Admission {
        names: crate::service::intake::names(&request, info),
        plugin: request
            .deployment
            .clone()
            .unwrap_or_else(|| info.name.clone()),
        request,
        max_slot_queue: daemon.config.max_slot_queue,
        max_total_pending: daemon.config.max_total_pending,
        declared: Some(info.capacity),
        max_descendants: tree_quota.unwrap_or(daemon.config.max_descendants),
        due,
        // A bound on a namespace's running tasks is counted by the claims.
        claim_here: ns_settings.limit(Quota::Running).is_none(),
    });
    let keyed = admission.request.idempotency_key.clone().map(|key| {
        (
            key,
            given.unwrap_or_else(|| admission.request.fingerprint()),
        )
    });
    let since = keys::cutoff_ms(daemon.config.idempotency_retention) as i64;
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
            Err(AdmitError::PluginGone) => Err(ServiceError::NotFound(format!(
                "the cluster does not hold plugin {}; upload it again",
                admission.request.plugin
            ))),
            Err(AdmitError::Invalid(message)) => Err(ServiceError::Invalid(message)),
            Err(AdmitError::Conflict(message)) => Err(ServiceError::Conflict(message)),
            Err(AdmitError::TreeFull { root, max }) => {
                Err(ServiceError::Invalid(match tree_quota {
                    Some(quota) => crate::service::namespace::over_quota(
                        &ns,
                        Quota::Descendants,
                        quota as u64,
                        "unfinished descendants of one spawn tree",
                    )
                    .to_string(),
                    None => crate::store::too_many_descendants(root, max),
                }))
            }
            Err(AdmitError::Store(err)) => Err(ServiceError::Internal(format!(
                "the submission could not be stored, so it was not accepted: {err}"
            ))),
        }
    })))
}
