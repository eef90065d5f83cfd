//! Owns the reads the verbs answer from the database: finished tasks and
//! their requests, a reference resolved, `ps` rows and `slots`.

use std::time::Duration;

use taskhost_core::admission::{SlotState, SlotView};
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::OutcomeKind;
use taskhost_core::supervisor::{TaskId, TaskRef, TaskReport};

use crate::store::{Finished, StoreError, now_ms};
use crate::wire::protocol::{SubmitRequest, TaskRow, TaskState};

use super::*;

impl Pg {
    /// A finished task, if it has finished.
    pub(crate) async fn finished(&self, id: TaskId) -> Result<Option<Finished>, StoreError> {
        let client = self.client().await?;
        let Some(row) = opt(
            &client,
            "cannot read a task",
            "SELECT report, log, plugin, submitted_ms, finished_ms, parent FROM taskhost_tasks \
                 WHERE id = $1 AND state = 'finished'",
            &[&sql_id(id)],
        )
        .await?
        else {
            return Ok(None);
        };
        let report: TaskReport = decode(row.get::<_, &[u8]>(0))?;
        let log: Vec<LogLine> = row
            .get::<_, Option<&[u8]>>(1)
            .map(decode)
            .transpose()?
            .unwrap_or_default();
        Ok(Some(Finished {
            report,
            plugin: row.get(2),
            log,
            submitted_ms: row.get::<_, i64>(3).max(0) as u64,
            finished_ms: row.get::<_, Option<i64>>(4).unwrap_or(0).max(0) as u64,
            parent: row.get::<_, Option<i64>>(5).map(|p| p.max(0) as u64),
            records: Vec::new(),
        }))
    }

    /// The records of a finished task's attempts (a record file), if kept.
    pub(crate) async fn records(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let row = opt(
            &client,
            "cannot read a task's records",
            "SELECT records FROM taskhost_tasks WHERE id = $1 AND state = 'finished'",
            &[&sql_id(id)],
        )
        .await?;
        Ok(row
            .and_then(|r| r.get::<_, Option<Vec<u8>>>(0))
            .filter(|r| !r.is_empty()))
    }

    /// Which of these tasks have finished.
    pub(crate) async fn finished_among(&self, ids: &[TaskId]) -> Result<Vec<TaskId>, StoreError> {
        let client = self.client().await?;
        let ids: Vec<i64> = ids.iter().map(|id| sql_id(*id)).collect();
        let rows = all(
            &client,
            "cannot look up waited tasks",
            "SELECT id FROM taskhost_tasks WHERE id = ANY($1) AND state = 'finished'",
            &[&ids],
        )
        .await?;
        Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
    }

    /// The request (resolved) a task was admitted with, while its row is
    /// kept.
    pub(crate) async fn request_of(&self, id: TaskId) -> Result<Option<SubmitRequest>, StoreError> {
        let client = self.client().await?;
        let row = opt(
            &client,
            "cannot read the task's request",
            "SELECT request FROM taskhost_tasks WHERE id = $1",
            &[&(id.get() as i64)],
        )
        .await?;
        Ok(row.and_then(|r| SubmitRequest::decode_stored(r.get::<_, &[u8]>(0)).ok()))
    }

    /// The task a target refers to: an id is that task; a name is the live
    /// task holding it (its slot's owner, else the oldest queued), else the
    /// newest finished one that held it. A rejected submission never held
    /// its name.
    pub(crate) async fn resolve(&self, target: &TaskRef) -> Result<Option<Found>, StoreError> {
        let client = self.client().await?;
        let row = match target {
            TaskRef::Id(id) => opt(
     &client,
     "cannot find the task",
     "SELECT t.id, t.state, t.node, n.name, t.name FROM taskhost_tasks t \
                     LEFT JOIN taskhost_nodes n ON n.id = t.node WHERE t.id = $1",
     &[&sql_id(*id)],
 )
 .await?,
            TaskRef::Name(name) => opt(
     &client,
     "cannot find the task",
     "SELECT t.id, t.state, t.node, n.name, t.name FROM taskhost_tasks t \
                     LEFT JOIN taskhost_nodes n ON n.id = t.node WHERE t.name = $1 AND t.placed \
                     ORDER BY CASE WHEN t.state = 'finished' THEN 2 WHEN t.state IN ('queued', 'delayed') THEN 1 ELSE 0 END, \
                     CASE WHEN t.state = 'finished' THEN -t.id ELSE t.id END LIMIT 1",
     &[name],
 )
 .await?,
        };
        Ok(row.map(|r| Found {
            id: id_of(r.get(0)),
            state: TaskState::parse(r.get(1)),
            name: r.get(4),
        }))
    }

    /// `host ps`: every unfinished task of the cluster, with its node; with
    /// `all`, the newest `recent` finished ones too.
    pub(crate) async fn list(
        &self,
        everything: bool,
        recent: i64,
    ) -> Result<Vec<TaskRow>, StoreError> {
        let client = self.client().await?;
        let now = now_ms();
        // The unfinished states one by one, each read from its partial
        // index: `state <> 'finished'` reads every task kept.
        let mut rows: Vec<TaskRow> = all(
            &client,
            "cannot list tasks",
            concat!(
                "SELECT t.id, t.name, t.slot, t.state, ",
                attempts_started!(),
                ", t.submitted_ms, t.plugin, n.name, \
                 t.resume_at_ms, t.due_ms, t.schedule, t.parent FROM taskhost_tasks t \
                 LEFT JOIN taskhost_nodes n ON n.id = t.node \
                 WHERE t.state = 'queued' OR t.state = 'delayed' \
                    OR t.state IN ('ready', 'running', 'stopping') ORDER BY t.id"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            let state = TaskState::parse(r.get(3));
            let pausing = r.get::<_, Option<i64>>(8).is_some();
            TaskRow {
                id: id_of(r.get(0)),
                name: r.get(1),
                slot: r.get(2),
                state: match state {
                    Some(TaskState::Queued) => TaskState::Queued,
                    Some(TaskState::Ready | TaskState::Delayed) => TaskState::Waiting,
                    Some(TaskState::Stopping) => TaskState::Stopping,
                    _ if pausing => TaskState::BackingOff,
                    _ => TaskState::Running,
                },
                attempts: r.get::<_, i32>(4).max(0) as u32,
                age: Duration::from_millis(now.saturating_sub(r.get::<_, i64>(5).max(0) as u64)),
                progress: None,
                plugin: r.get(6),
                outcome: None,
                node: r.get(7),
                due_ms: (state == Some(TaskState::Delayed))
                    .then(|| r.get::<_, Option<i64>>(9).map(|v| v.max(0) as u64))
                    .flatten(),
                schedule: r.get(10),
                parent: r.get::<_, Option<i64>>(11).map(|p| p.max(0) as u64),
            }
        })
        .collect();
        if everything {
            let finished = all(
                &client,
                "cannot list finished tasks",
                "SELECT id, name, slot, attempts, submitted_ms, plugin, outcome, schedule, parent \
                     FROM taskhost_tasks WHERE state = 'finished' ORDER BY finished_ms DESC LIMIT $1",
                &[&recent],
            )
            .await?;
            rows.extend(finished.iter().map(|r| finished_row(r, now)));
            rows.sort_by_key(|r| r.id);
        }
        Ok(rows)
    }

    /// Finished tasks with an id below `before` (any without) and, if
    /// given, that `outcome`, newest first, at most `limit`: the primary
    /// key read backwards, as far as the page needs.
    pub(crate) async fn finished_before(
        &self,
        before: Option<TaskId>,
        outcome: Option<OutcomeKind>,
        limit: i64,
    ) -> Result<Vec<TaskRow>, StoreError> {
        let client = self.client().await?;
        let now = now_ms();
        let before = before.map_or(i64::MAX, sql_id);
        let outcome = outcome.map(OutcomeKind::as_str);
        Ok(all(
            &client,
            "cannot list finished tasks",
            "SELECT id, name, slot, attempts, submitted_ms, plugin, outcome, schedule, parent \
                 FROM taskhost_tasks WHERE state = 'finished' AND id < $1 \
                 AND ($2::text IS NULL OR outcome = $2) ORDER BY id DESC LIMIT $3",
            &[&before, &outcome, &limit],
        )
        .await?
        .iter()
        .map(|r| finished_row(r, now))
        .collect())
    }

    /// `host slots`: each slot with an owner or a queue.
    pub(crate) async fn slots(&self) -> Result<Vec<SlotView>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot list slots",
            "SELECT t.slot, t.id, t.state, coalesce(s.capacity, s.declared, 1) FROM taskhost_tasks t \
                 JOIN taskhost_slots s ON s.slot = t.slot \
                 WHERE t.state = 'queued' OR t.state IN ('ready', 'running', 'stopping') \
                 ORDER BY t.slot, t.state = 'queued', t.pos, t.id",
            &[],
        )
        .await?;
        let mut slots: Vec<SlotView> = Vec::new();
        for r in &rows {
            let key: String = r.get(0);
            let id = id_of(r.get(1));
            let state = TaskState::parse(r.get(2));
            if slots.last().is_none_or(|s| s.key != key) {
                slots.push(SlotView {
                    key: key.clone(),
                    state: SlotState::Idle,
                    owner: None,
                    owners: Vec::new(),
                    capacity: r.get::<_, i32>(3).max(1) as usize,
                    queue_depth: 0,
                    in_state_for: Duration::ZERO,
                    queued: Vec::new(),
                });
            }
            let Some(view) = slots.last_mut() else {
                continue;
            };
            match state {
                Some(TaskState::Queued) => {
                    view.queued.push(id);
                    view.queue_depth += 1;
                }
                Some(TaskState::Ready) => view.owned(id, SlotState::Admitting),
                Some(TaskState::Stopping) => view.owned(id, SlotState::Terminating),
                _ => view.owned(id, SlotState::Running),
            }
        }
        Ok(slots)
    }
}

/// A finished task's `ps` row from its columns (id, name, slot, attempts,
/// submitted_ms, plugin, outcome, schedule, parent), its age at `now`.
fn finished_row(r: &tokio_postgres::Row, now: u64) -> TaskRow {
    TaskRow {
        id: id_of(r.get(0)),
        name: r.get(1),
        slot: r.get(2),
        state: TaskState::Finished,
        attempts: r.get::<_, i32>(3).max(0) as u32,
        age: Duration::from_millis(now.saturating_sub(r.get::<_, i64>(4).max(0) as u64)),
        progress: None,
        plugin: r.get(5),
        outcome: r
            .get::<_, Option<String>>(6)
            .as_deref()
            .and_then(OutcomeKind::from_word),
        node: None,
        due_ms: None,
        schedule: r.get(7),
        parent: r.get::<_, Option<i64>>(8).map(|p| p.max(0) as u64),
    }
}
