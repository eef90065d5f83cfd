//! Owns the nodes' leases: a node's registration, its renewals on a
//! connection of its own, its retirement, and the takeover of the tasks of
//! a node whose lease ran out (recovery's `fate` decides each).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::GenericClient;

use taskhost_core::recovery::{Fate, fate};
use taskhost_core::supervisor::{TaskId, TaskReport};

use crate::store::{Pause, StoreError, Unfinished, now_ms};
use crate::wire::protocol::TaskState;

use super::*;

/// A task row's state for recovery's `fate`.
pub(super) fn unfinished_state(state: &str) -> TaskState {
    match TaskState::parse(state) {
        Some(TaskState::Stopping) => TaskState::Stopping,
        Some(TaskState::Queued | TaskState::Ready) => TaskState::Queued,
        _ => TaskState::Running,
    }
}

impl Pg {
    /// Registers a node; returns its id.
    pub(crate) async fn register_node(
        &self,
        name: &str,
        capacity: usize,
        lease: Duration,
    ) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = one(
            &client,
            "cannot register this node",
            "INSERT INTO taskhost_nodes (name, started_ms, lease_until, capacity) \
                 VALUES ($1, $2, now() + ($3::float8 * interval '1 millisecond'), $4) \
                 RETURNING id, (SELECT count(*) FROM taskhost_nodes WHERE alive) + 1",
            &[
                &name,
                &ms(now_ms()),
                &(lease.as_millis() as f64),
                &(i32::try_from(capacity).unwrap_or(i32::MAX)),
            ],
        )
        .await?;
        // The live nodes with it; those before it all have smaller ids.
        let live: i64 = row.get(1);
        self.count_nodes(live, live - 1);
        Ok(row.get(0))
    }

    /// Renews a node's lease on its own connection; false once it has lost
    /// it (another node took its work over). A renewal that gets no answer
    /// within `deadline` fails, and its connection is given up.
    pub(crate) async fn renew(
        &self,
        node: i64,
        lease: Duration,
        deadline: Duration,
    ) -> Result<bool, StoreError> {
        let mut held = self.lease.lock().await;
        let renewal = tokio::time::timeout(deadline, async {
            let session = match held.take() {
                Some(session) => session,
                None => self.link.connect(None).await?,
            };
            let rows = session
                .client
                .query(
                    "UPDATE taskhost_nodes SET lease_until = now() + ($2::float8 * interval '1 millisecond') \
                         WHERE id = $1 AND alive \
                         RETURNING id, (SELECT count(*) FROM taskhost_nodes WHERE alive), \
                         (SELECT count(*) FROM taskhost_nodes WHERE alive AND id < $1)",
                    &[&node, &(lease.as_millis() as f64)],
                )
                .await
                .map_err(db("cannot renew the lease"))?;
            Ok((session, rows))
        })
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Unreachable(format!(
                "PostgreSQL: the lease renewal got no answer within {}",
                taskhost_core::units::format_duration(deadline)
            )))
        });
        // A failed renewal's session is dropped (a new one next time).
        let (session, rows) = renewal?;
        *held = Some(session);
        if let Some(row) = rows.first() {
            self.count_nodes(row.get(1), row.get(2));
        }
        Ok(!rows.is_empty())
    }

    /// Marks this node dead (a graceful stop: its work is taken over now,
    /// not after its lease).
    pub(crate) async fn retire_node(&self, node: i64) -> Result<(), StoreError> {
        let client = self.client().await?;
        exec(
            &client,
            "cannot retire this node",
            "UPDATE taskhost_nodes SET alive = FALSE WHERE id = $1",
            &[&node],
        )
        .await?;
        Ok(())
    }

    /// Marks every node whose lease ran out dead; returns their names.
    pub(crate) async fn expire_nodes(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot expire leases",
            "UPDATE taskhost_nodes SET alive = FALSE WHERE id IN \
                 (SELECT id FROM taskhost_nodes WHERE alive AND lease_until < now() \
                  FOR UPDATE SKIP LOCKED) RETURNING name",
            &[],
        )
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Tasks claimed by nodes that are dead (at most `limit`).
    pub(crate) async fn orphans(&self, limit: i64) -> Result<Vec<TaskId>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot find orphaned tasks",
            // The dead nodes first: while none is, the claimed tasks'
            // index is not read at all.
            "SELECT t.id FROM taskhost_tasks t \
                 WHERE t.node = ANY(ARRAY(SELECT id FROM taskhost_nodes WHERE NOT alive)) \
                 AND t.state IN ('running', 'stopping') ORDER BY t.id LIMIT $1",
            &[&limit],
        )
        .await?;
        Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
    }

    /// Takes over one task of a dead node, as recovery would after a crash:
    /// its interrupted attempt is closed and its restart policy decides
    /// (`fate`). None if another node settled it first. It waits at most
    /// `lock_wait` for a lock (a frozen node may hold the slot's).
    pub(crate) async fn settle(
        &self,
        id: TaskId,
        lock_wait: Duration,
    ) -> Result<Option<Settled>, StoreError> {
        retry(|| self.settle_once(id, lock_wait)).await
    }

    async fn settle_once(
        &self,
        id: TaskId,
        lock_wait: Duration,
    ) -> Result<Option<Settled>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let settled = {
            let tx = &tx;
            {
                let wait = format!("{}ms", lock_wait.as_millis().max(1));
                exec(
                    tx,
                    "cannot bound the takeover's lock waits",
                    "SELECT set_config('lock_timeout', $1, true)",
                    &[&wait],
                )
                .await?;
                let Some(slot) = lock_slot_of(tx, id).await? else {
                    return Ok(None);
                };
                let Some(row) = opt(
                    tx,
                    "cannot read an orphaned task",
                    concat!(
                        "SELECT t.state, t.request, t.plugin, ",
                        attempts_started!(),
                        ", t.failures, t.resume_at_ms, t.submitted_ms, t.name \
                         FROM taskhost_tasks t JOIN taskhost_nodes n ON n.id = t.node \
                         WHERE t.id = $1 AND t.state IN ('running', 'stopping') AND NOT n.alive \
                         FOR UPDATE OF t"
                    ),
                    &[&sql_id(id)],
                )
                .await?
                else {
                    return Ok(None);
                };
                let state: String = row.get(0);
                let request = decode_request(row.get::<_, &[u8]>(1))?;
                let plugin: String = row.get(2);
                let attempts = row.get::<_, i32>(3).max(0) as u32;
                let failures = row.get::<_, i32>(4).max(0) as u32;
                let resume_at: Option<i64> = row.get(5);
                let submitted_ms = row.get::<_, i64>(6).max(0) as u64;
                let name: String = row.get(7);
                let now = ms(now_ms());
                let interrupted = exec(
                    tx,
                    "cannot close an interrupted attempt",
                    "UPDATE taskhost_attempts SET ended_ms = $2, result = 'interrupted' \
                         WHERE task_id = $1 AND ended_ms IS NULL",
                    &[&sql_id(id), &now],
                )
                .await?;
                // Claimed, but no attempt had started since (and none was
                // pausing): nothing was interrupted; it is admitted again.
                let state = match unfinished_state(&state) {
                    TaskState::Running if interrupted == 0 && resume_at.is_none() => {
                        TaskState::Queued
                    }
                    other => other,
                };
                let unfinished = Unfinished {
                    id,
                    plugin: plugin.clone(),
                    request,
                    state,
                    attempts,
                    submitted_ms,
                    pause: resume_at.map(|until| Pause {
                        until_ms: until.max(0) as u64,
                        failures,
                    }),
                };
                let why = match fate(&unfinished.lost()) {
                    Fate::Place(resume, why) => {
                        let resume_at = now.saturating_add(resume.delay.as_millis() as i64);
                        exec(
                            tx,
                            "cannot requeue a task",
                            "UPDATE taskhost_tasks SET state = 'ready', node = NULL, token = NULL, \
                             attempts = $2, failures = $3, resume_at_ms = $4 WHERE id = $1",
                            &[
                                &sql_id(id),
                                &(resume.attempts as i32),
                                &(resume.failures as i32),
                                &resume_at,
                            ],
                        )
                        .await?;
                        self.notify(tx, READY, "").await?;
                        why
                    }
                    Fate::End(outcome, why) => {
                        let report = TaskReport {
                            id,
                            name: Arc::from(name.as_str()),
                            slot: Arc::from(slot.as_str()),
                            outcome,
                            attempts,
                            history: Vec::new(),
                            duration: Duration::ZERO,
                        };
                        end_task(self, tx, &report, &[]).await?;
                        promote(self, tx, &slot).await?;
                        why
                    }
                };
                Some(Settled {
                    id,
                    name,
                    slot: slot.clone(),
                    why,
                })
            }
        };
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(settled)
    }
}
