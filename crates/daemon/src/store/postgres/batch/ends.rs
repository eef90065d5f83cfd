//! Owns a batch of ends: the slots locked in order, the claims checked
//! against their tokens, the attempts closed, the reports recorded, each
//! freed slot's next task admitted, in one transaction; the ends whose
//! slot another transaction holds are left for the writer that waits.

use std::collections::{HashMap, HashSet};

use tokio::sync::mpsc;

use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::TaskId;

use super::{FinishJob, gone, notify_ids};
use crate::store::postgres::rules::fill;
use crate::store::postgres::{FINISHED, Pg, all, db, decode, encode, exec, id_of, ms, sql_id};
use crate::store::{Finished, StoreError, now_ms};

/// Answers each end of a batch: recorded or not, or the batch's error;
/// those deferred go to `later`.
pub(super) fn answer_ends(
    jobs: Vec<FinishJob>,
    result: Result<Ends, StoreError>,
    later: Option<&mpsc::UnboundedSender<FinishJob>>,
) {
    match result {
        Ok(ends) => {
            for job in jobs {
                let id = job.1.report.id;
                match later {
                    Some(later) if ends.deferred.contains(&id) => {
                        if let Err(mpsc::error::SendError(job)) = later.send(job) {
                            let _ = job.2.send(Err(gone()));
                        }
                    }
                    _ => {
                        let _ = job.2.send(Ok(ends.recorded.contains(&id)));
                    }
                }
            }
        }
        Err(err) => {
            for (.., reply) in jobs {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

/// What a batch of ends did: the ids recorded, and those whose slot
/// another transaction held (left for the writer that waits).
#[derive(Default)]
pub(super) struct Ends {
    recorded: HashSet<TaskId>,
    deferred: HashSet<TaskId>,
}

/// One transaction for a batch of ends: the slots locked in order (those
/// another transaction holds skipped, unless `wait`), the claims checked,
/// the attempts closed, the reports recorded, each freed slot's next task
/// admitted.
pub(super) async fn finished(pg: &Pg, jobs: &[FinishJob], wait: bool) -> Result<Ends, StoreError> {
    let ids: Vec<i64> = jobs.iter().map(|j| sql_id(j.1.report.id)).collect();
    let tokens: Vec<i64> = jobs.iter().map(|j| j.0).collect();
    let mut client = pg.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(db("cannot start a transaction"))?;
    // The slot's lock first, as every decision in a slot takes it; in
    // order, so that two batches never wait on each other in a circle.
    let lock = if wait {
        "SELECT t.id, s.slot FROM taskhost_tasks t JOIN taskhost_slots s ON s.slot = t.slot \
             WHERE t.id = ANY($1) ORDER BY s.slot FOR UPDATE OF s"
    } else {
        "SELECT t.id, s.slot FROM taskhost_tasks t JOIN taskhost_slots s ON s.slot = t.slot \
             WHERE t.id = ANY($1) ORDER BY s.slot FOR UPDATE OF s SKIP LOCKED"
    };
    let locked: HashMap<i64, String> = all(&tx, "cannot lock the slots", lock, &[&ids])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut ends = Ends::default();
    if !wait {
        ends.deferred = ids
            .iter()
            .filter(|id| !locked.contains_key(id))
            .map(|id| id_of(*id))
            .collect();
    }
    let held: Vec<&str> = locked.values().map(String::as_str).collect();
    let mine: HashMap<i64, String> = all(
        &tx,
        "cannot check the claims",
        "SELECT t.id, t.slot FROM taskhost_tasks t \
             JOIN unnest($1::int8[], $2::int8[]) AS u(id, token) ON t.id = u.id AND t.token = u.token \
             WHERE t.state IN ('running', 'stopping') AND t.slot = ANY($3) ORDER BY t.id FOR UPDATE OF t",
        &[&ids, &tokens, &held],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let ours: Vec<&(i64, Finished, _)> = jobs
        .iter()
        .filter(|j| mine.contains_key(&sql_id(j.1.report.id)))
        .collect();
    if ours.is_empty() {
        tx.commit().await.map_err(db("cannot commit"))?;
        return Ok(ends);
    }
    let ids: Vec<i64> = ours.iter().map(|j| sql_id(j.1.report.id)).collect();
    let tokens: Vec<i64> = ours.iter().map(|j| j.0).collect();
    let ended: Vec<i64> = ours.iter().map(|j| ms(j.1.finished_ms)).collect();
    let outcomes: Vec<&str> = ours
        .iter()
        .map(|j| j.1.report.outcome.kind().as_str())
        .collect();
    exec(
        &tx,
        "cannot close the attempts",
        "UPDATE taskhost_attempts a SET ended_ms = u.ended, result = u.result \
             FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::text[]) AS u(id, token, ended, result) \
             WHERE a.task_id = u.id AND a.token = u.token AND a.ended_ms IS NULL",
        &[&ids, &tokens, &ended, &outcomes],
    )
    .await?;
    // Lines shipped while they ran go; they are the log of an end that
    // brings none of its own.
    let mut shipped: HashMap<i64, Vec<(i64, LogLine)>> = HashMap::new();
    for row in all(
        &tx,
        "cannot take the shipped lines",
        "DELETE FROM taskhost_logs WHERE task_id = ANY($1) RETURNING task_id, seq, line",
        &[&ids],
    )
    .await?
    {
        shipped
            .entry(row.get(0))
            .or_default()
            .push((row.get(1), decode(row.get::<_, &[u8]>(2))?));
    }
    let mut reports = Vec::with_capacity(ours.len());
    let mut logs = Vec::with_capacity(ours.len());
    for (_, f, _) in &ours {
        reports.push(encode(&f.report)?);
        let log = match shipped.remove(&sql_id(f.report.id)) {
            Some(mut lines) if f.log.is_empty() => {
                lines.sort_by_key(|(seq, _)| *seq);
                let lines: Vec<LogLine> = lines.into_iter().map(|(_, l)| l).collect();
                encode(&lines)?
            }
            _ => encode(&f.log)?,
        };
        logs.push(log);
    }
    let attempts: Vec<i32> = ours.iter().map(|j| j.1.report.attempts as i32).collect();
    let records: Vec<Option<&[u8]>> = ours
        .iter()
        .map(|j| Some(&j.1.records[..]).filter(|r| !r.is_empty()))
        .collect();
    exec(
        &tx,
        "cannot record the outcomes",
        "UPDATE taskhost_tasks t SET state = 'finished', finished_ms = $1, outcome = u.outcome, \
             report = u.report, log = u.log, attempts = u.attempts, resume_at_ms = NULL, \
             records = u.records \
             FROM unnest($2::int8[], $3::text[], $4::bytea[], $5::bytea[], $6::int4[], \
             $7::bytea[]) AS u(id, outcome, report, log, attempts, records) WHERE t.id = u.id",
        &[
            &ms(now_ms()),
            &ids,
            &outcomes,
            &reports,
            &logs,
            &attempts,
            &records,
        ],
    )
    .await?;
    let mut slots: Vec<&str> = ids
        .iter()
        .filter_map(|id| mine.get(id).map(String::as_str))
        .collect();
    slots.sort_unstable();
    slots.dedup();
    let promoted = fill(&tx, &slots).await?;
    notify_ids(pg, &tx, FINISHED, &ids).await?;
    // The slots freed here: this node's claims have just ended, so it has
    // room for their next tasks (`announce_ready` tells the others of what
    // it has none for).
    let claim_here = pg.announce_ready(&tx, promoted.len()).await?;
    tx.commit().await.map_err(db("cannot commit"))?;
    if claim_here {
        pg.claim_here();
    }
    ends.recorded = ids.into_iter().map(id_of).collect();
    Ok(ends)
}
