//! Owns one host's bodies of the verbs and what one host keeps itself
//! ([`OneHost`]: the store, schedules, idempotency keys and guests' buckets
//! a cluster keeps in its database): its store (SQLite or memory) and its
//! controller decide, and its memory of submissions answers first.

use crate::service::deployments::Deployments;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use taskhost_core::slot_settings::SlotSettings;
use taskhost_core::supervisor::{Event, Received, TaskId, TaskRef};
use taskhost_runtime::{Digest, MemoryKv};

use super::{Found, Item, Scheduled, SlotRuled, not_found, until_closed};
use crate::backend::daemon::Daemon;
use crate::backend::schedules::Schedules;
use crate::backend::submit::{self, Accepted};
use crate::service::error::ServiceError;
use crate::service::history::History;
use crate::service::keys::Keys;
use crate::service::tasks::{MAX_FINISHED, TaskRecord};
use crate::store::{self, Store};
use crate::wire::protocol::{
    EventFilter, NotBefore, ScheduleVerb, SlotRuleRow, SlotRuleVerb, SubmitRequest, TaskPage,
    TaskRow, TaskState,
};

/// One host: the daemon and what it keeps itself.
pub(crate) struct Local<'a> {
    pub(crate) daemon: &'a Arc<Daemon>,
    pub(crate) host: &'a Arc<OneHost>,
}

/// What one host keeps itself (a cluster keeps it in its database): its
/// store, its schedules, the idempotency keys it placed, and its guests'
/// key-value buckets.
pub(crate) struct OneHost {
    pub(crate) store: Store,
    pub(crate) schedules: Schedules,
    pub(crate) keys: Keys,
    pub(crate) kv: Arc<MemoryKv>,
    /// Held by a slot-rule verb from its change to the controller's, so
    /// the store's order of rules is the controller's.
    pub(crate) rules_turn: tokio::sync::Mutex<()>,
    /// The named deployments, as the store's events make them.
    pub(crate) deployments: std::sync::Mutex<Deployments>,
    /// Held by a deployment verb from its decision to its change in
    /// memory, so that two verbs on one name never decide on the same
    /// state.
    pub(crate) deploying: tokio::sync::Mutex<()>,
}

/// What holds plugins on one host besides its tasks: its schedules and
/// the versions it keeps deployed (a plugin is never collected while one
/// of them needs it).
impl crate::service::plugins::Holders for OneHost {
    fn plugins(
        &self,
        only: Option<&crate::service::namespace::Ns>,
    ) -> std::collections::HashMap<taskhost_runtime::Digest, u64> {
        let mut held = self.schedules.plugins(only);
        let deployments = self
            .deployments
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for digest in deployments.digests(|key| only.is_none_or(|ns| ns.owns(key))) {
            *held.entry(digest).or_default() += 1;
        }
        held
    }
}

impl OneHost {
    /// A store's, with no schedule yet and no key placed; its deployments
    /// as the store kept them.
    pub(crate) fn new(store: Store, key_retention: Duration, kv: Arc<MemoryKv>) -> Self {
        let deployments = Deployments::from_events(store.take_deployments());
        Self {
            deployments: std::sync::Mutex::new(deployments),
            deploying: tokio::sync::Mutex::new(()),
            store,
            schedules: Schedules::default(),
            keys: Keys::new(key_retention),
            kv,
            rules_turn: tokio::sync::Mutex::new(()),
        }
    }
}

impl Local<'_> {
    /// Stores an uploaded plugin (compiled here); returns its name.
    pub(super) async fn upload(
        &self,
        digest: Digest,
        bytes: Vec<u8>,
    ) -> Result<String, ServiceError> {
        let plugin = self.daemon.plugins.store(bytes, Some(digest)).await?;
        Ok(plugin.info().name.clone())
    }

    /// Places one submission, in the order it was sent.
    pub(super) async fn submit(&self, request: SubmitRequest) -> Result<Accepted, ServiceError> {
        submit::submit(self.daemon, self.host, request).await
    }

    /// A schedule verb on this host's schedules.
    pub(super) async fn schedule(&self, verb: ScheduleVerb) -> Result<Scheduled, ServiceError> {
        use crate::backend::schedules;
        Ok(match verb {
            ScheduleVerb::Add(spec) => {
                Scheduled::Row(schedules::add(self.daemon, self.host, *spec).await?)
            }
            ScheduleVerb::List => Scheduled::Rows(schedules::list(self.daemon, self.host).await),
            ScheduleVerb::Remove(name) => {
                Scheduled::Row(schedules::remove(self.host, &name).await?)
            }
            ScheduleVerb::Pause(name) => {
                Scheduled::Row(schedules::set_paused(self.daemon, self.host, &name, true).await?)
            }
            ScheduleVerb::Resume(name) => {
                Scheduled::Row(schedules::set_paused(self.daemon, self.host, &name, false).await?)
            }
            ScheduleVerb::Run(name) => {
                let (submitted, ticket) = schedules::run(self.daemon, self.host, &name).await?;
                Scheduled::Fired(if ticket.is_immediate() {
                    Accepted::Now(submitted)
                } else {
                    Accepted::Later(Box::pin(async move {
                        ticket.committed().await.map_err(|e| {
                            ServiceError::Internal(format!("the firing could not be stored: {e}"))
                        })?;
                        Ok(submitted)
                    }))
                })
            }
        })
    }

    /// A verb on the operator's slot rules: a change is stored, then the
    /// controller takes it (for its next decision).
    pub(super) async fn slot_rule(&self, verb: SlotRuleVerb) -> Result<SlotRuled, ServiceError> {
        let controller = &self.daemon.controller;
        let _turn = self.host.rules_turn.lock().await;
        let mut rules = controller.slot_rules();
        let (row, settings) = match verb {
            SlotRuleVerb::List => {
                let rows = rules.rules().into_iter().map(rule_row).collect();
                return Ok(SlotRuled::Rows(rows));
            }
            SlotRuleVerb::Set(row) => {
                rules
                    .set(&row.pattern, row.settings)
                    .map_err(ServiceError::Invalid)?;
                let settings = Some(row.settings);
                (row, settings)
            }
            SlotRuleVerb::Unset(pattern) => {
                let old = rules
                    .rules()
                    .into_iter()
                    .find(|(p, _)| *p == pattern)
                    .ok_or_else(|| {
                        ServiceError::NotFound(format!(
                            "no slot rule for `{pattern}` (see `host slot ls`)"
                        ))
                    })?;
                rules.unset(&pattern);
                (rule_row(old), None)
            }
        };
        self.host
            .store
            .slot_rule(&row.pattern, settings)
            .committed()
            .await
            .map_err(|e| {
                ServiceError::Internal(format!("the slot rule could not be stored: {e}"))
            })?;
        controller.set_slot_rules(rules);
        Ok(SlotRuled::Row(row))
    }

    /// The task a reference names: in memory, else in the store.
    pub(super) async fn find(&self, target: &TaskRef) -> Result<Found, ServiceError> {
        let daemon = self.daemon;
        if let Some(record) = daemon.tasks.resolve(target, &daemon.controller) {
            return Ok(Found::Live(record));
        }
        let store = Store::clone(&self.host.store);
        let wanted = target.clone();
        // The store is read off the async workers.
        tokio::task::spawn_blocking(move || stored(&store, &wanted))
            .await
            .ok()
            .flatten()
            .ok_or_else(|| not_found(target))
    }

    /// A request as the store keeps it.
    pub(super) async fn stored_request(&self, id: TaskId) -> Option<SubmitRequest> {
        let store = Store::clone(&self.host.store);
        tokio::task::spawn_blocking(move || store.request_of(id))
            .await
            .ok()
            .flatten()
    }

    /// Makes the stop claim on a task this host placed (recorded as
    /// stopping); false if someone else did.
    pub(super) fn stop(&self, id: TaskId) -> bool {
        let claimed = self.daemon.controller.remove(id);
        if claimed {
            self.host.store.stopping(id);
        }
        claimed
    }

    /// The rows of `host ps`: with `all`, read off the async workers (the
    /// store is read too).
    pub(super) async fn rows(&self, all: bool) -> Vec<TaskRow> {
        if !all {
            return local_rows(self.daemon, &self.host.store, false);
        }
        let (daemon, store) = (Arc::clone(self.daemon), Store::clone(&self.host.store));
        tokio::task::spawn_blocking(move || local_rows(&daemon, &store, true))
            .await
            .unwrap_or_default()
    }

    /// One page with a limit (see [`local_page`]).
    pub(super) async fn page(
        &self,
        page: TaskPage,
        limit: usize,
        view: crate::service::namespace::View,
    ) -> Vec<TaskRow> {
        let (daemon, store) = (Arc::clone(self.daemon), Store::clone(&self.host.store));
        tokio::task::spawn_blocking(move || {
            local_page(&daemon, &store, &page, limit, &|name| view.sees(name))
        })
        .await
        .unwrap_or_default()
    }

    /// Streams this host's events into `tx`.
    pub(super) fn events(&self, tx: mpsc::Sender<Item>, follow: bool, filter: EventFilter) {
        // Subscribe before copying the history (in order: events of
        // requests sent after this one are seen), and let the history
        // catch up with the events published before.
        let (live, before) = self.daemon.controller.supervisor().subscribe_after();
        let history = Arc::clone(&self.daemon.history);
        tokio::spawn(async move {
            let local = local_events(&tx, &history, live, before, follow, &filter);
            until_closed(&tx, local).await;
        });
    }
}

fn rule_row((pattern, settings): (String, SlotSettings)) -> SlotRuleRow {
    SlotRuleRow { pattern, settings }
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
                // A deployment's `NAME@VERSION`, else the plugin's name.
                plugin: record.as_ref().map_or(t.body, |r| r.plugin.clone()),
                outcome: None,
                node: None,
                // A throttled task's next start.
                due_ms: t.next_start_ms,
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
            plugin: record.as_ref().map_or(q.body, |r| r.plugin.clone()),
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
                .iter()
                .filter(|r| !live.contains(&r.id))
                .filter_map(finished_row),
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
                .map(|f| stored_row(f, now)),
        );
    }
    rows.sort_by_key(|r| r.id);
    rows
}

/// The row of a finished task this daemon remembers.
fn finished_row(r: &TaskRecord) -> Option<TaskRow> {
    let report = r.outcome.get()?;
    Some(TaskRow {
        id: r.id,
        name: r.name.clone(),
        slot: r.slot.clone(),
        state: TaskState::Finished,
        attempts: report.attempts,
        age: r.submitted.elapsed(),
        progress: None,
        plugin: r.plugin.clone(),
        outcome: Some(report.outcome.kind()),
        node: None,
        due_ms: None,
        schedule: r.request.as_ref().and_then(|q| q.schedule.clone()),
        parent: r.request.as_ref().and_then(|q| q.parent),
    })
}

/// The row of a finished task as the store keeps it.
fn stored_row(f: store::Finished, now: u64) -> TaskRow {
    TaskRow {
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
    }
}

/// The store's rows read at a time while filling a page.
const PAGE_CHUNK: usize = 512;

/// One page of `page` with a limit: the live tasks and, with finished
/// ones, those this daemon remembers (by id, newest first) and those the
/// store keeps, read newest first only as far as the page needs; `sees`
/// keeps the caller's namespace.
fn local_page(
    daemon: &Daemon,
    store: &Store,
    page: &TaskPage,
    limit: usize,
    sees: &dyn Fn(&str) -> bool,
) -> Vec<TaskRow> {
    let before = page.before.unwrap_or(TaskId::from_u64(u64::MAX));
    let wanted = |row: &TaskRow| row.id < before && sees(&row.name) && page.filter.admits(row);
    let live_rows = local_rows(daemon, store, false);
    let live: std::collections::HashSet<TaskId> = live_rows.iter().map(|r| r.id).collect();
    let mut rows: Vec<TaskRow> = live_rows.into_iter().filter(|r| wanted(r)).collect();
    if page.all || page.filter.outcome.is_some() {
        rows.extend(daemon.tasks.finished_page(before, limit, |r| {
            let row = finished_row(r).filter(|row| !live.contains(&row.id))?;
            wanted(&row).then_some(row)
        }));
        rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.id));
        // A stored row at or below the page's last one cannot enter it.
        let floor = rows
            .get(limit.saturating_sub(1))
            .filter(|_| rows.len() >= limit);
        let floor = floor.map_or(0, |r| r.id.get());
        let now = store::now_ms();
        let mut cursor = before.get();
        let mut stored = Vec::new();
        'chunks: while stored.len() < limit && cursor > floor + 1 {
            let chunk = store.finished_before(cursor, PAGE_CHUNK);
            let full = chunk.len() == PAGE_CHUNK;
            for f in chunk {
                let id = f.report.id;
                cursor = id.get();
                if id.get() <= floor {
                    break 'chunks;
                }
                if live.contains(&id) || daemon.tasks.get(id).is_some() {
                    continue;
                }
                let row = stored_row(f, now);
                if wanted(&row) {
                    stored.push(row);
                    if stored.len() == limit {
                        break 'chunks;
                    }
                }
            }
            if !full {
                break;
            }
        }
        rows.extend(stored);
    }
    rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.id));
    rows.truncate(limit);
    rows
}

/// One host's events: its history up to `before`, then the live lane.
async fn local_events(
    tx: &mpsc::Sender<Item>,
    history: &History,
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
