//! Owns a bulk cancel's queued tasks: their slots locked in order, each
//! task still queued in one of them ended as removed from its queue, in
//! one transaction per chunk (what `Pg::cancel` does for one).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{TaskId, TaskReport};

use super::notify_ids;
use crate::store::postgres::{
    FINISHED, Pg, all, db, decode, encode, exec, id_of, ms, retry, sql_id,
};
use crate::store::{StoreError, now_ms};

/// Queued tasks ended in one transaction.
const CHUNK: usize = 1_000;

impl Pg {
    /// Ends each of `ids` that is still queued as removed from its queue,
    /// as [`Pg::cancel`] would one by one; the ids it ended (one promoted,
    /// delayed or ended meanwhile is left to the caller).
    pub(crate) async fn cancel_queued(&self, ids: &[TaskId]) -> Result<Vec<TaskId>, StoreError> {
        let mut ended = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let ids: Vec<i64> = chunk.iter().map(|id| sql_id(*id)).collect();
            ended.extend(retry(|| cancel_chunk(self, &ids)).await?);
        }
        Ok(ended)
    }
}

async fn cancel_chunk(pg: &Pg, ids: &[i64]) -> Result<Vec<TaskId>, StoreError> {
    let mut client = pg.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(db("cannot start a transaction"))?;
    // The slots' locks first, in order, as every decision in a slot
    // takes its lock; then only the tasks still queued in those slots.
    let slots: Vec<String> = all(
        &tx,
        "cannot lock the slots",
        "SELECT s.slot FROM taskhost_slots s WHERE s.slot IN \
             (SELECT slot FROM taskhost_tasks WHERE id = ANY($1) AND state = 'queued') \
             ORDER BY s.slot FOR UPDATE",
        &[&ids],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let rows = all(
        &tx,
        "cannot read the queued tasks",
        "SELECT id, name, slot, attempts FROM taskhost_tasks \
             WHERE id = ANY($1) AND state = 'queued' AND slot = ANY($2) ORDER BY id FOR UPDATE",
        &[&ids, &slots],
    )
    .await?;
    if rows.is_empty() {
        tx.commit().await.map_err(db("cannot commit"))?;
        return Ok(Vec::new());
    }
    let queued: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    // A task queued again after it ran keeps the lines it shipped.
    let mut shipped: HashMap<i64, Vec<(i64, LogLine)>> = HashMap::new();
    for row in all(
        &tx,
        "cannot take the shipped lines",
        "DELETE FROM taskhost_logs WHERE task_id = ANY($1) RETURNING task_id, seq, line",
        &[&queued],
    )
    .await?
    {
        shipped
            .entry(row.get(0))
            .or_default()
            .push((row.get(1), decode(row.get::<_, &[u8]>(2))?));
    }
    let outcome = TaskOutcome::Rejected {
        kind: RejectionKind::RemovedFromQueue,
        reason: "removed from the queue before it ran".into(),
    };
    let (mut reports, mut logs) = (
        Vec::with_capacity(rows.len()),
        Vec::with_capacity(rows.len()),
    );
    for r in &rows {
        let id: i64 = r.get(0);
        let report = TaskReport {
            id: id_of(id),
            name: Arc::from(r.get::<_, &str>(1)),
            slot: Arc::from(r.get::<_, &str>(2)),
            outcome: outcome.clone(),
            attempts: r.get::<_, i32>(3).max(0) as u32,
            history: Vec::new(),
            duration: Duration::ZERO,
        };
        reports.push(encode(&report)?);
        let mut lines = shipped.remove(&id).unwrap_or_default();
        lines.sort_by_key(|(seq, _)| *seq);
        let lines: Vec<LogLine> = lines.into_iter().map(|(_, l)| l).collect();
        logs.push(encode(&lines)?);
    }
    exec(
        &tx,
        "cannot record the outcomes",
        "UPDATE taskhost_tasks t SET state = 'finished', finished_ms = $1, outcome = $2, \
             report = u.report, log = u.log, resume_at_ms = NULL \
             FROM unnest($3::int8[], $4::bytea[], $5::bytea[]) AS u(id, report, log) \
             WHERE t.id = u.id",
        &[
            &ms(now_ms()),
            &outcome.kind().as_str(),
            &queued,
            &reports,
            &logs,
        ],
    )
    .await?;
    notify_ids(pg, &tx, FINISHED, &queued).await?;
    tx.commit().await.map_err(db("cannot commit"))?;
    Ok(queued.into_iter().map(id_of).collect())
}
