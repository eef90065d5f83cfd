//! Owns claimed work: claims with fencing tokens, the writes of a claimed
//! attempt (its start, pauses, end) conditional on its token, cancels, and
//! a task's end with its slot handed to the next in line.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::GenericClient;

use taskhost_core::lifecycle::TaskState;
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{TaskId, TaskReport};

use crate::store::{Finished, Pause, StoreError, now_ms};

use super::*;

/// The advisory locks of the namespaces with a `--max-running`, each
/// taken by a claim of their work (with `hashtext` of the name).
const NAMESPACE_LOCK: i32 = 2;

/// One namespace as a claim takes from it: its name ('' for the default
/// one), its pass and stride (stride scheduling by weight), and its cap of
/// claimed tasks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimShare {
    pub ns: String,
    pub pass: f64,
    pub stride: f64,
    pub max_running: Option<u64>,
}

/// The report of a task that ends now with `outcome`, from its row.
pub(super) async fn report_of(
    tx: &deadpool_postgres::Transaction<'_>,
    id: TaskId,
    outcome: TaskOutcome,
) -> Result<TaskReport, StoreError> {
    let row = one(
        tx,
        "cannot read a task",
        concat!(
            "SELECT t.name, t.slot, ",
            attempts_started!(),
            " FROM taskhost_tasks t WHERE t.id = $1"
        ),
        &[&sql_id(id)],
    )
    .await?;
    Ok(TaskReport {
        id,
        name: Arc::from(row.get::<_, &str>(0)),
        slot: Arc::from(row.get::<_, &str>(1)),
        outcome,
        attempts: row.get::<_, i32>(2).max(0) as u32,
        history: Vec::new(),
        duration: Duration::ZERO,
    })
}

pub(super) async fn never_ran_row(
    tx: &deadpool_postgres::Transaction<'_>,
    id: TaskId,
    kind: RejectionKind,
    reason: String,
) -> Result<TaskReport, StoreError> {
    report_of(tx, id, TaskOutcome::Rejected { kind, reason }).await
}

/// Records a task's final report (the caller holds its slot's lock), with
/// `log`, else the lines its node shipped (a task ended by a takeover);
/// the shipped lines go.
pub(super) async fn end_task(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    report: &TaskReport,
    log: &[LogLine],
) -> Result<(), StoreError> {
    let shipped = all(
        tx,
        "cannot take the shipped lines",
        "DELETE FROM taskhost_logs WHERE task_id = $1 RETURNING seq, line",
        &[&sql_id(report.id)],
    )
    .await?;
    let encoded = encode(report)?;
    let log = if log.is_empty() && !shipped.is_empty() {
        let mut lines: Vec<(i64, LogLine)> = shipped
            .iter()
            .map(|r| Ok((r.get(0), decode(r.get::<_, &[u8]>(1))?)))
            .collect::<Result<_, StoreError>>()?;
        lines.sort_by_key(|(seq, _)| *seq);
        let lines: Vec<LogLine> = lines.into_iter().map(|(_, l)| l).collect();
        encode(&lines)?
    } else {
        encode(&log)?
    };
    exec(
        tx,
        "cannot record an outcome",
        "UPDATE taskhost_tasks SET state = 'finished', finished_ms = $2, outcome = $3, \
         report = $4, log = $5, attempts = $6, resume_at_ms = NULL WHERE id = $1",
        &[
            &sql_id(report.id),
            &ms(now_ms()),
            &report.outcome.kind().as_str(),
            &encoded,
            &log,
            &(report.attempts as i32),
        ],
    )
    .await?;
    pg.notify(tx, FINISHED, &report.id.get().to_string()).await
}

/// Makes the heads of a slot's queue its owners while it has room (the
/// caller holds the slot's lock and the slot has just lost an owner).
pub(super) async fn promote(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    slot: &str,
) -> Result<(), StoreError> {
    if !super::rules::fill(tx, &[slot]).await?.is_empty() {
        pg.notify(tx, READY, "").await?;
    }
    Ok(())
}

impl Pg {
    /// Claims up to `n` ready tasks for `node` (a dead node claims nothing),
    /// each under a new fencing token, none of the `crowded` slots'. The
    /// tasks come from the namespaces of `shares`: the k-th ready task of a
    /// namespace counts as its pass plus k strides, and the lowest counts
    /// are claimed, so a claim takes from each namespace with ready work
    /// in proportion to its weight. A namespace with a `max_running` is
    /// claimed from up to it, counting every node's claims of it under a
    /// lock of the namespace (claims of such namespaces take turns).
    pub(crate) async fn claim(
        &self,
        node: i64,
        n: i64,
        crowded: &[String],
        shares: &[ClaimShare],
    ) -> Result<Vec<Claimed>, StoreError> {
        let mut client = self.client().await?;
        let names: Vec<&str> = shares.iter().map(|s| s.ns.as_str()).collect();
        let passes: Vec<f64> = shares.iter().map(|s| s.pass).collect();
        let strides: Vec<f64> = shares.iter().map(|s| s.stride).collect();
        let caps: Vec<Option<i64>> = shares
            .iter()
            .map(|s| s.max_running.map(|m| i64::try_from(m).unwrap_or(i64::MAX)))
            .collect();
        let mut capped: Vec<&str> = shares
            .iter()
            .filter(|s| s.max_running.is_some())
            .map(|s| s.ns.as_str())
            .collect();
        capped.sort_unstable();
        let sql = "WITH w AS (SELECT * FROM unnest($4::text[], $5::float8[], $6::float8[], \
                 $7::int8[]) AS w(ns, pass, stride, cap)), \
             c AS (SELECT x.id FROM w CROSS JOIN LATERAL ( \
                 SELECT y.id, row_number() OVER (ORDER BY y.priority DESC, y.id) AS r FROM ( \
                 SELECT id, priority FROM taskhost_tasks WHERE state = 'ready' AND ns = w.ns \
                 AND slot <> ALL($3) ORDER BY priority DESC, id \
                 LIMIT CASE WHEN w.cap IS NULL THEN $2 ELSE greatest(0, least($2, w.cap - \
                 (SELECT count(*) FROM taskhost_tasks h WHERE h.ns = w.ns \
                 AND h.state IN ('running', 'stopping')))) END \
                 FOR UPDATE SKIP LOCKED) y) x \
                 ORDER BY w.pass + x.r * w.stride, x.id LIMIT $2) \
                 UPDATE taskhost_tasks t SET state = 'running', node = $1, \
                 token = nextval('taskhost_fence') FROM c WHERE t.id = c.id \
                 AND EXISTS (SELECT 1 FROM taskhost_nodes WHERE id = $1 AND alive) \
                 RETURNING t.id, t.token, t.request, t.plugin, t.attempts, t.failures, \
                 t.resume_at_ms, t.submitted_ms, (SELECT version FROM taskhost_slot_rules_version), \
                 (SELECT count(*) FROM taskhost_nodes WHERE alive), \
                 (SELECT count(*) FROM taskhost_nodes WHERE alive AND id < $1)";
        let params: sql::Params<'_> = &[&node, &n, &crowded, &names, &passes, &strides, &caps];
        let rows = if capped.is_empty() {
            all(&client, "cannot claim work", sql, params).await?
        } else {
            // Each capped namespace's claims take turns: a claim counts
            // what the others committed before it.
            let tx = client
                .transaction()
                .await
                .map_err(db("cannot start a transaction"))?;
            exec(
                &tx,
                "cannot lock the namespaces",
                "SELECT pg_advisory_xact_lock($1, hashtext(ns)) FROM unnest($2::text[]) AS ns",
                &[&NAMESPACE_LOCK, &capped],
            )
            .await?;
            let rows = all(&tx, "cannot claim work", sql, params).await?;
            tx.commit().await.map_err(db("cannot commit a claim"))?;
            rows
        };
        // The local controller runs a slot's claimed tasks up to their
        // capacity, and starts them at its share of their rate: the node's
        // copy of the rules and its count of live nodes follow the
        // cluster's before it runs them.
        if let Some(row) = rows.first() {
            self.count_nodes(row.get(9), row.get(10));
            self.refresh_rules(&client, row.get(8)).await?;
        }
        let mut claimed: Vec<Claimed> = rows
            .iter()
            .map(Claimed::from_row)
            .collect::<Result<_, StoreError>>()?;
        claimed.sort_by_key(|c| (std::cmp::Reverse(c.request.priority), c.id));
        Ok(claimed)
    }

    /// The tasks claimed by `node` that it does not know it holds (not in
    /// `held`): a claim whose commit landed but whose answer was lost when
    /// the database went away.
    pub(crate) async fn claimed_by(
        &self,
        node: i64,
        held: &[TaskId],
    ) -> Result<Vec<Claimed>, StoreError> {
        let client = self.client().await?;
        let held: Vec<i64> = held.iter().map(|id| sql_id(*id)).collect();
        let rows = all(
            &client,
            "cannot read this node's claims",
            concat!(
                "SELECT t.id, t.token, t.request, t.plugin, ",
                attempts_started!(),
                ", t.failures, t.resume_at_ms, t.submitted_ms FROM taskhost_tasks t \
                 WHERE t.node = $1 AND t.state IN ('running', 'stopping') \
                 AND t.id <> ALL($2) ORDER BY t.priority DESC, t.id"
            ),
            &[&node, &held],
        )
        .await?;
        rows.iter().map(Claimed::from_row).collect()
    }

    /// Records that attempt `attempt` starts under `token`; false if the
    /// claim was taken away (the attempt must not run).
    pub(crate) async fn attempt_started(
        &self,
        id: TaskId,
        token: i64,
        attempt: u32,
    ) -> Result<bool, StoreError> {
        self.writer().started(id, token, attempt).await
    }

    /// Records that attempt `attempts` ended and the next is due after a
    /// pause; false if the claim was taken away.
    pub(crate) async fn pausing(
        &self,
        id: TaskId,
        token: i64,
        attempts: u32,
        pause: Pause,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "WITH t AS (UPDATE taskhost_tasks SET resume_at_ms = $4, failures = $5, attempts = $3 \
                 WHERE id = $1 AND token = $2 AND state IN ('running', 'stopping') RETURNING id) \
                 UPDATE taskhost_attempts SET ended_ms = $6, result = 'ended' \
                 WHERE task_id = $1 AND token = $2 AND ended_ms IS NULL AND EXISTS (SELECT 1 FROM t)",
            )
            .await
            .map_err(db("cannot record a pause"))?;
        let n = client
            .execute(
                &stmt,
                &[
                    &sql_id(id),
                    &token,
                    &(attempts as i32),
                    &ms(pause.until_ms),
                    &(pause.failures as i32),
                    &ms(now_ms()),
                ],
            )
            .await
            .map_err(db("cannot record a pause"))?;
        Ok(n <= 1)
    }

    /// Records a claimed task's end and frees its slot for the next in
    /// line; false if the claim was taken away (nothing is recorded).
    pub(crate) async fn finish(&self, token: i64, finished: &Finished) -> Result<bool, StoreError> {
        self.writer().finished(token, finished.clone()).await
    }

    /// Stops a task wherever it is: queued work is removed, a task not yet
    /// claimed ends Canceled, a running one is marked stopping and its node
    /// told.
    pub(crate) async fn cancel(&self, id: TaskId) -> Result<Canceled, StoreError> {
        retry(|| self.cancel_once(id)).await
    }

    async fn cancel_once(&self, id: TaskId) -> Result<Canceled, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        // Waiting for its time: it holds no slot. (Locked: a node placing
        // it as it comes due is waited for, and then it is no longer
        // delayed.)
        let delayed = opt(
            &tx,
            "cannot read the task",
            "SELECT 1 FROM taskhost_tasks WHERE id = $1 AND state = 'delayed' FOR UPDATE",
            &[&sql_id(id)],
        )
        .await?;
        if delayed.is_some() {
            let report = never_ran_row(
                &tx,
                id,
                RejectionKind::RemovedFromQueue,
                "removed before it was due".into(),
            )
            .await?;
            end_task(self, &tx, &report, &[]).await?;
            tx.commit().await.map_err(db("cannot commit"))?;
            return Ok(Canceled::Claimed { node: None });
        }
        let Some(slot) = lock_slot_of(&tx, id).await? else {
            return Ok(Canceled::Already);
        };
        let row = one(
            &tx,
            "cannot read the task",
            "SELECT state, node FROM taskhost_tasks WHERE id = $1 FOR UPDATE",
            &[&sql_id(id)],
        )
        .await?;
        let state = TaskState::parse(row.get(0));
        let node: Option<i64> = row.get(1);
        let done = match state {
            Some(TaskState::Queued) => {
                let report = never_ran_row(
                    &tx,
                    id,
                    RejectionKind::RemovedFromQueue,
                    "removed from the queue before it ran".into(),
                )
                .await?;
                end_task(self, &tx, &report, &[]).await?;
                Canceled::Claimed { node: None }
            }
            Some(TaskState::Ready) => {
                let report = report_of(&tx, id, TaskOutcome::Canceled).await?;
                end_task(self, &tx, &report, &[]).await?;
                promote(self, &tx, &slot).await?;
                Canceled::Claimed { node: None }
            }
            Some(TaskState::Running) => {
                exec(
                    &tx,
                    "cannot mark the task stopping",
                    "UPDATE taskhost_tasks SET state = 'stopping' WHERE id = $1",
                    &[&sql_id(id)],
                )
                .await?;
                self.notify(&tx, STOP, &id.get().to_string()).await?;
                Canceled::Claimed { node }
            }
            _ => Canceled::Already,
        };
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(done)
    }

    /// This node's tasks that were asked to stop (the polling fallback of
    /// the stop notification).
    pub(crate) async fn stopping_on(&self, node: i64) -> Result<Vec<TaskId>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot read stop requests",
            "SELECT id FROM taskhost_tasks WHERE node = $1 AND state = 'stopping'",
            &[&node],
        )
        .await?;
        Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
    }
}

impl Claimed {
    /// A claim from its row: `id, token, request, plugin, attempts,
    /// failures, resume_at_ms, submitted_ms`.
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, StoreError> {
        Ok(Claimed {
            id: id_of(r.get(0)),
            token: r.get(1),
            request: decode_request(r.get::<_, &[u8]>(2))?,
            plugin: r.get(3),
            attempts: r.get::<_, i32>(4).max(0) as u32,
            failures: r.get::<_, i32>(5).max(0) as u32,
            resume_at_ms: r.get::<_, Option<i64>>(6).map(|v| v.max(0) as u64),
            submitted_ms: r.get::<_, i64>(7).max(0) as u64,
        })
    }
}
