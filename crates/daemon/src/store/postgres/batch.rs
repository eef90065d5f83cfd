//! Owns the writes a node makes many of at once: attempt starts, ends and
//! admissions. Each kind has one writer task per node that takes every
//! request waiting and records them in one transaction of set-based
//! statements (`unnest` of arrays), with one notification per batch: group
//! commit, as the SQLite writer does. It decides nothing of its own: the
//! admission rules are `admission::decide`'s, applied in arrival order
//! within the batch.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use taskhost_core::admission::{
    self, AdmissionPolicy, Decision, Limits, OwnerState, SlotSummary, Totals,
};
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{TaskId, TaskReport};

use super::{
    Admission, AdmitError, FINISHED, Pg, all, db, decode, encode, exec, id_of, ms, retry, sql_id,
};
use crate::store::{Finished, StoreError, now_ms};
use crate::wire::protocol::{Placement, Submitted};

/// Most requests of one kind recorded in one transaction.
const BATCH: usize = 256;
/// Longest notification payload (the server's limit is 8,000 bytes).
const PAYLOAD: usize = 7_000;

type Reply<T> = oneshot::Sender<T>;
/// An attempt's start: the task, its claim's token, the attempt.
type StartJob = (TaskId, i64, u32, Reply<Result<bool, StoreError>>);
/// A task's end under its claim's token.
type FinishJob = (i64, Finished, Reply<Result<bool, StoreError>>);
type AdmitJob = (Arc<Admission>, Reply<Result<Submitted, AdmitError>>);

/// The node's writer tasks, one per kind of request.
pub(crate) struct Writer {
    start: mpsc::UnboundedSender<StartJob>,
    finish: mpsc::UnboundedSender<FinishJob>,
    admit: mpsc::UnboundedSender<AdmitJob>,
}

/// Runs `record` on every batch (of at most `max`) of the requests that
/// arrive on a new channel.
fn writer<J: Send + 'static, Fut>(
    max: usize,
    record: impl Fn(Vec<J>) -> Fut + Send + 'static,
) -> mpsc::UnboundedSender<J>
where
    Fut: std::future::Future<Output = ()> + Send,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<J>();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut jobs = vec![first];
            while jobs.len() < max {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            record(jobs).await;
        }
    });
    tx
}

fn gone() -> StoreError {
    StoreError::Failed("PostgreSQL: the node's database writer has stopped".into())
}

/// Answers each end of a batch: recorded or not, or the batch's error;
/// those deferred go to `later`.
fn answer_ends(
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

impl Writer {
    /// Starts the writers on `pg`.
    pub(crate) fn start(pg: &Pg) -> Self {
        let (p1, p2, p3, p4, p5) = (pg.clone(), pg.clone(), pg.clone(), pg.clone(), pg.clone());
        // Ends and admissions whose slot another transaction holds (a
        // frozen node's, say) are not waited for by the batch: they go one
        // at a time to a writer of their own, which waits for the lock.
        let slow_ends = writer(1, move |jobs: Vec<FinishJob>| {
            let pg = p4.clone();
            async move {
                let result = retry(|| finished(&pg, &jobs, true)).await;
                answer_ends(jobs, result, None);
            }
        });
        let deferred: Deferred = Arc::default();
        let held = Arc::clone(&deferred);
        let slow_admissions = writer(1, move |jobs: Vec<DeferredJob>| {
            let (pg, held) = (p5.clone(), Arc::clone(&held));
            async move {
                for job in jobs {
                    admit_alone(&pg, job, &held).await;
                }
            }
        });
        Self {
            start: writer(BATCH, move |jobs: Vec<StartJob>| {
                let pg = p1.clone();
                async move {
                    let items: Vec<(TaskId, i64, u32)> =
                        jobs.iter().map(|(id, t, a, _)| (*id, *t, *a)).collect();
                    match retry(|| started(&pg, &items)).await {
                        Ok(recorded) => {
                            for (id, _, _, reply) in jobs {
                                let _ = reply.send(Ok(recorded.contains(&id)));
                            }
                        }
                        Err(err) => {
                            for (.., reply) in jobs {
                                let _ = reply.send(Err(err.clone()));
                            }
                        }
                    }
                }
            }),
            finish: writer(BATCH, move |jobs: Vec<FinishJob>| {
                let (pg, slow) = (p2.clone(), slow_ends.clone());
                async move {
                    let result = retry(|| finished(&pg, &jobs, false)).await;
                    answer_ends(jobs, result, Some(&slow));
                }
            }),
            admit: writer(BATCH, move |jobs: Vec<AdmitJob>| {
                let (pg, slow, deferred) =
                    (p3.clone(), slow_admissions.clone(), Arc::clone(&deferred));
                async move { admit_all(&pg, jobs, &slow, &deferred).await }
            }),
        }
    }

    /// Records that attempt `attempt` of a claimed task began; false if
    /// the claim was taken away.
    pub(crate) async fn started(
        &self,
        id: TaskId,
        token: i64,
        attempt: u32,
    ) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.start
            .send((id, token, attempt, tx))
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Records a claimed task's end and frees its slot for the next in
    /// line; false if the claim was taken away (nothing is recorded).
    pub(crate) async fn finished(&self, token: i64, f: Finished) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.finish.send((token, f, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Queues a submission for the next batch now; the future resolves
    /// with the decision of the controller's rules.
    pub(crate) fn admit(
        &self,
        a: Arc<Admission>,
    ) -> impl std::future::Future<Output = Result<Submitted, AdmitError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let queued = self.admit.send((a, tx));
        async move {
            queued.map_err(|_| AdmitError::Store(gone()))?;
            rx.await.map_err(|_| AdmitError::Store(gone()))?
        }
    }
}

/// One transaction for a batch of attempt starts; the ids recorded.
async fn started(pg: &Pg, items: &[(TaskId, i64, u32)]) -> Result<HashSet<TaskId>, StoreError> {
    let ids: Vec<i64> = items.iter().map(|i| sql_id(i.0)).collect();
    let tokens: Vec<i64> = items.iter().map(|i| i.1).collect();
    let attempts: Vec<i32> = items.iter().map(|i| i.2 as i32).collect();
    let client = pg.client().await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&ids, &tokens, &attempts, &ms(now_ms())];
    let plain = client.prepare_cached(START).await.map_err(db(START_WHAT))?;
    let rows = match client.query(&plain, &params).await {
        // A start tried again after a commit whose answer was lost (the
        // database restarted) finds its attempt's row there: then the
        // batch is recorded again without adding the rows it has.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            let again = client
                .prepare_cached(START_AGAIN)
                .await
                .map_err(db(START_WHAT))?;
            client
                .query(&again, &params)
                .await
                .map_err(db(START_WHAT))?
        }
        rows => rows.map_err(db(START_WHAT))?,
    };
    Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
}

const START_WHAT: &str = "cannot record an attempt";

/// Attempt starts: the tasks' rows under their tokens, and a row each.
const START: &str = "WITH u AS (SELECT * FROM unnest($1::int8[], $2::int8[], $3::int4[]) \
     AS u(id, token, attempt)), \
     t AS (UPDATE taskhost_tasks t SET attempts = u.attempt, resume_at_ms = NULL FROM u \
           WHERE t.id = u.id AND t.token = u.token AND t.state IN ('running', 'stopping') \
           RETURNING t.id, t.token, u.attempt, t.slot, t.node) \
     INSERT INTO taskhost_attempts (task_id, attempt, token, slot, node, started_ms) \
     SELECT id, attempt, token, slot, node, $4 FROM t RETURNING task_id";

/// [`START`], where some of the rows may be there already.
const START_AGAIN: &str = "WITH u AS (SELECT * FROM unnest($1::int8[], $2::int8[], $3::int4[]) \
     AS u(id, token, attempt)), \
     t AS (UPDATE taskhost_tasks t SET attempts = u.attempt, resume_at_ms = NULL FROM u \
           WHERE t.id = u.id AND t.token = u.token AND t.state IN ('running', 'stopping') \
           RETURNING t.id, t.token, u.attempt, t.slot, t.node), \
     i AS (INSERT INTO taskhost_attempts (task_id, attempt, token, slot, node, started_ms) \
           SELECT id, attempt, token, slot, node, $4 FROM t ON CONFLICT DO NOTHING) \
     SELECT id FROM t";

/// What a batch of ends did: the ids recorded, and those whose slot
/// another transaction held (left for the writer that waits).
#[derive(Default)]
struct Ends {
    recorded: HashSet<TaskId>,
    deferred: HashSet<TaskId>,
}

/// One transaction for a batch of ends: the slots locked in order (those
/// another transaction holds skipped, unless `wait`), the claims checked,
/// the attempts closed, the reports recorded, each freed slot's next task
/// admitted.
async fn finished(pg: &Pg, jobs: &[FinishJob], wait: bool) -> Result<Ends, StoreError> {
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
    exec(
        &tx,
        "cannot record the outcomes",
        "UPDATE taskhost_tasks t SET state = 'finished', finished_ms = $1, outcome = u.outcome, \
             report = u.report, log = u.log, attempts = u.attempts, resume_at_ms = NULL \
             FROM unnest($2::int8[], $3::text[], $4::bytea[], $5::bytea[], $6::int4[]) \
             AS u(id, outcome, report, log, attempts) WHERE t.id = u.id",
        &[&ms(now_ms()), &ids, &outcomes, &reports, &logs, &attempts],
    )
    .await?;
    let mut slots: Vec<&str> = ids
        .iter()
        .filter_map(|id| mine.get(id).map(String::as_str))
        .collect();
    slots.sort_unstable();
    slots.dedup();
    let promoted = all(
        &tx,
        "cannot admit the next in the slots",
        "UPDATE taskhost_tasks SET state = 'ready' WHERE id IN \
             (SELECT DISTINCT ON (slot) id FROM taskhost_tasks WHERE slot = ANY($1) \
              AND state = 'queued' ORDER BY slot, pos, id) RETURNING id",
        &[&slots],
    )
    .await?;
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

/// Notifies `channel` of `ids`, as few notifications as fit them
/// (comma-separated).
async fn notify_ids(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    channel: &str,
    ids: &[i64],
) -> Result<(), StoreError> {
    let mut payload = String::new();
    for id in ids {
        if payload.len() > PAYLOAD {
            pg.notify(tx, channel, &payload).await?;
            payload.clear();
        }
        if !payload.is_empty() {
            payload.push(',');
        }
        payload.push_str(&id.to_string());
    }
    if !payload.is_empty() {
        pg.notify(tx, channel, &payload).await?;
    }
    Ok(())
}

/// A slot as the admissions of one batch see it: read once, then kept up
/// to date with each decision of the batch.
struct SlotNow {
    owner: Option<(TaskId, OwnerState)>,
    queued: usize,
    last_pos: Option<i64>,
    head: Option<TaskId>,
    /// A Replace in this batch changed it in ways only the database
    /// follows: later submissions to it are admitted one by one.
    stale: bool,
}

/// Slots with admissions waiting in the writer that waits for locks, with
/// how many each: later admissions to them wait there too, in order.
type Deferred = Arc<std::sync::Mutex<HashMap<String, usize>>>;

/// An admission whose slot another transaction held, with the id and
/// names the batch gave it.
struct DeferredJob {
    admission: Arc<Admission>,
    id: i64,
    names: (String, String, AdmissionPolicy),
    reply: Reply<Result<Submitted, AdmitError>>,
}

/// What a batch of admissions decided: an answer for each, except those
/// whose slot was held (index, id, names), left for `admit_alone`.
type Decided = (
    Vec<Option<Result<Submitted, AdmitError>>>,
    Vec<(usize, i64, (String, String, AdmissionPolicy))>,
);

/// Admits one deferred submission in a transaction of its own, waiting
/// (within `lock_timeout`) for its slot.
async fn admit_alone(pg: &Pg, job: DeferredJob, held: &Deferred) {
    let result = retry(|| async {
        let mut client = pg.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let submitted = pg
            .admit_in(&tx, &job.admission, job.id, job.names.clone())
            .await?;
        tx.commit()
            .await
            .map_err(db("cannot commit the submission"))?;
        Ok(submitted)
    })
    .await;
    let _ = job.reply.send(result);
    let mut held = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = held.get_mut(&job.names.1) {
        *n -= 1;
        if *n == 0 {
            held.remove(&job.names.1);
        }
    }
}

/// A decided row on its way into `taskhost_tasks`.
struct NewRow {
    id: i64,
    name: String,
    slot: String,
    plugin: String,
    digest: Vec<u8>,
    request: Vec<u8>,
    state: &'static str,
    pos: i64,
    placed: bool,
    priority: i32,
    schedule: Option<String>,
    /// A rejected one is recorded finished at once.
    outcome: Option<&'static str>,
    report: Option<Vec<u8>>,
    log: Option<Vec<u8>>,
}

/// Admits a batch of submissions and answers each (those whose slot was
/// held, once `admit_alone` has).
async fn admit_all(
    pg: &Pg,
    jobs: Vec<AdmitJob>,
    slow: &mpsc::UnboundedSender<DeferredJob>,
    deferred: &Deferred,
) {
    let admissions: Vec<&Admission> = jobs.iter().map(|(a, _)| &**a).collect();
    let decided = retry(|| {
        let waiting: HashSet<String> = deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        let admissions = &admissions;
        async move { admit_batch(pg, admissions, &waiting).await }
    })
    .await;
    match decided {
        Ok((results, later)) => {
            let mut later: HashMap<usize, (i64, (String, String, AdmissionPolicy))> =
                later.into_iter().map(|(i, id, n)| (i, (id, n))).collect();
            {
                let mut held = deferred
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for (_, names) in later.values() {
                    *held.entry(names.1.clone()).or_default() += 1;
                }
            }
            for (i, ((admission, reply), result)) in jobs.into_iter().zip(results).enumerate() {
                match (later.remove(&i), result) {
                    (Some((id, names)), _) => {
                        let job = DeferredJob {
                            admission,
                            id,
                            names,
                            reply,
                        };
                        if let Err(mpsc::error::SendError(job)) = slow.send(job) {
                            let _ = job.reply.send(Err(AdmitError::Store(gone())));
                        }
                    }
                    (None, Some(result)) => {
                        let _ = reply.send(result);
                    }
                    (None, None) => {
                        let _ = reply.send(Err(AdmitError::Store(StoreError::Failed(
                            "PostgreSQL: the submission was not decided".into(),
                        ))));
                    }
                }
            }
        }
        Err(err) => {
            for (_, reply) in jobs {
                let _ = reply.send(Err(AdmitError::Store(err.clone())));
            }
        }
    }
}

/// One transaction for a batch of admissions, decided in arrival order as
/// if one at a time: ids, the plugins' presence, every slot's row locked
/// (in order) and read, each decision made on the slots as the earlier ones
/// left them, then every new row in one statement and one notification.
async fn admit_batch(
    pg: &Pg,
    admissions: &[&Admission],
    waiting: &HashSet<String>,
) -> Result<Decided, StoreError> {
    let mut client = pg.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(db("cannot start a transaction"))?;
    let ids: Vec<i64> = all(
        &tx,
        "cannot allocate ids",
        "SELECT nextval('taskhost_task_ids') FROM generate_series(1, $1)",
        &[&(admissions.len() as i32)],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let mut results: Vec<Option<Result<Submitted, AdmitError>>> =
        admissions.iter().map(|_| None).collect();
    let mut named = Vec::with_capacity(admissions.len());
    for (i, a) in admissions.iter().enumerate() {
        match (a.names)(id_of(ids[i])) {
            Ok(names) => named.push(Some(names)),
            Err(e) => {
                results[i] = Some(Err(AdmitError::Invalid(e)));
                named.push(None);
            }
        }
    }
    // The plugins stay while this transaction runs (collection locks one
    // to delete it), and the task rows then keep them.
    let digests: Vec<&[u8]> = admissions.iter().map(|a| &a.request.plugin.0[..]).collect();
    let present: HashSet<Vec<u8>> = all(
        &tx,
        "cannot check the plugins",
        "SELECT digest FROM taskhost_plugins WHERE digest = ANY($1) FOR KEY SHARE",
        &[&digests],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    for (i, a) in admissions.iter().enumerate() {
        if results[i].is_none() && !present.contains(&a.request.plugin.0[..]) {
            results[i] = Some(Err(AdmitError::PluginGone));
            named[i] = None;
        }
    }
    let mut slots: Vec<String> = named
        .iter()
        .flatten()
        .map(|(_, slot, _)| slot.clone())
        .collect();
    slots.sort_unstable();
    slots.dedup();
    // Every slot's row, created if new, then locked in order: admissions
    // and releases in these slots wait for this transaction from here on.
    // A slot another transaction holds is not waited for: its admissions
    // (and every later one to it) are left for `admit_alone`.
    slots.retain(|slot| !waiting.contains(slot));
    exec(
        &tx,
        "cannot create the slots",
        "INSERT INTO taskhost_slots (slot) SELECT s FROM unnest($1::text[]) AS s ORDER BY s \
             ON CONFLICT (slot) DO NOTHING",
        &[&slots],
    )
    .await?;
    let locked: HashSet<String> = all(
        &tx,
        "cannot lock the slots",
        "SELECT slot FROM taskhost_slots WHERE slot = ANY($1) ORDER BY slot \
             FOR UPDATE SKIP LOCKED",
        &[&slots],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    slots.retain(|slot| locked.contains(slot));
    let mut later = Vec::new();
    for (i, names) in named.iter_mut().enumerate() {
        if names
            .as_ref()
            .is_some_and(|(_, slot, _)| !locked.contains(slot))
            && let Some(names) = names.take()
        {
            later.push((i, ids[i], names));
        }
    }
    let mut now: HashMap<String, SlotNow> = HashMap::new();
    // The pending work of the whole cluster comes with each slot's row.
    let mut pending = 0;
    for row in all(
        &tx,
        "cannot read the slots",
        "SELECT s.slot, o.id, o.state, q.n, q.last, h.id, \
             (SELECT count(*) FROM taskhost_tasks WHERE state = 'queued') FROM unnest($1::text[]) AS s(slot) \
             LEFT JOIN taskhost_tasks o ON o.slot = s.slot AND o.state IN ('ready', 'running', 'stopping') \
             LEFT JOIN LATERAL (SELECT count(*) AS n, max(pos) AS last FROM taskhost_tasks \
                 WHERE slot = s.slot AND state = 'queued') q ON TRUE \
             LEFT JOIN LATERAL (SELECT id FROM taskhost_tasks WHERE slot = s.slot AND state = 'queued' \
                 ORDER BY pos, id LIMIT 1) h ON TRUE",
        &[&slots],
    )
    .await?
    {
        pending = row.get::<_, i64>(6).max(0) as usize;
        let owner = row.get::<_, Option<i64>>(1).map(|id| {
            let state = match row.get::<_, Option<&str>>(2) {
                Some("stopping") => OwnerState::Stopping,
                _ => OwnerState::Running,
            };
            (id_of(id), state)
        });
        now.insert(
            row.get(0),
            SlotNow {
                owner,
                queued: row.get::<_, i64>(3).max(0) as usize,
                last_pos: row.get(4),
                head: row.get::<_, Option<i64>>(5).map(id_of),
                stale: false,
            },
        );
    }
    let names: Vec<&str> = named
        .iter()
        .flatten()
        .map(|(name, _, _)| name.as_str())
        .collect();
    // Live holders of the names (a name is held by one live task).
    let mut holders: HashMap<String, (String, i64)> = HashMap::new();
    for row in all(
        &tx,
        "cannot read the names",
        "SELECT name, slot, id FROM taskhost_tasks WHERE name = ANY($1) \
             AND state IN ('ready', 'running', 'stopping')",
        &[&names],
    )
    .await?
    {
        holders.insert(row.get(0), (row.get(1), row.get(2)));
    }
    let count_pending = async |tx: &deadpool_postgres::Transaction<'_>| {
        all(
            tx,
            "cannot count the pending work",
            "SELECT count(*) FROM taskhost_tasks WHERE state = 'queued'",
            &[],
        )
        .await
        .map(|rows| {
            rows.first()
                .map_or(0, |r| r.get::<_, i64>(0).max(0) as usize)
        })
    };
    let mut rows: Vec<NewRow> = Vec::new();
    let mut ready = 0;
    let mut rejected: Vec<i64> = Vec::new();
    for (i, a) in admissions.iter().enumerate() {
        let Some((name, slot, policy)) = named[i].take() else {
            continue;
        };
        let id = id_of(ids[i]);
        let state = now
            .get_mut(&slot)
            .ok_or_else(|| StoreError::Failed(format!("PostgreSQL: slot `{slot}` was not read")))?;
        let held_elsewhere = holders
            .get(&name)
            .filter(|(held_in, _)| *held_in != slot)
            .map(|(_, holder)| *holder);
        let limits = Limits {
            max_slot_queue: a.max_slot_queue,
            max_total_pending: a.max_total_pending,
            // Slot rows stay in the database: it bounds no slot count.
            max_slots: usize::MAX,
            holder: "the cluster",
        };
        // The registry's rule first (a name is held by one live task),
        // then the slot's; None: the single admission's to decide.
        let decision = match held_elsewhere {
            Some(holder) => Some(Decision::Reject {
                kind: RejectionKind::AlreadyExists,
                reason: format!(
                    "task name `{name}` is held by task {} in another slot",
                    id_of(holder)
                ),
            }),
            None if state.stale => None,
            None => {
                let summary = SlotSummary {
                    owner: state.owner,
                    queued: state.queued,
                    head: state.head,
                    tracked: true,
                };
                let totals = Totals { pending, slots: 0 };
                Some(admission::decide(
                    &slot, &summary, policy, totals, &limits, false,
                ))
            }
        };
        let mut request = a.request.clone();
        request.name = Some(name.clone());
        request.slot = Some(slot.clone());
        request.policy = Some(policy);
        let row = |state: &'static str, pos: i64, placed: bool| -> Result<NewRow, StoreError> {
            Ok(NewRow {
                id: ids[i],
                name: name.clone(),
                slot: slot.clone(),
                plugin: a.plugin.clone(),
                digest: a.request.plugin.0.to_vec(),
                request: encode(&request)?,
                state,
                pos,
                placed,
                priority: request.priority,
                schedule: request.schedule.clone(),
                outcome: None,
                report: None,
                log: None,
            })
        };
        let placement = match decision {
            Some(Decision::Reject { kind, reason }) => {
                let outcome = TaskOutcome::Rejected { kind, reason };
                let report = TaskReport::never_ran(
                    id,
                    Arc::from(name.as_str()),
                    Arc::from(slot.as_str()),
                    outcome.clone(),
                );
                let mut new = row("finished", 0, false)?;
                new.outcome = Some(outcome.kind().as_str());
                new.report = Some(encode(&report)?);
                new.log = Some(encode(&Vec::<LogLine>::new())?);
                rows.push(new);
                rejected.push(ids[i]);
                Placement::Rejected(outcome)
            }
            Some(Decision::Admit) => {
                rows.push(row("ready", 0, true)?);
                state.owner = Some((id, OwnerState::Running));
                ready += 1;
                holders.insert(name.clone(), (slot.clone(), ids[i]));
                Placement::Running
            }
            Some(Decision::Enqueue) => {
                let pos = state.last_pos.unwrap_or(0) + 1;
                rows.push(row("queued", pos, true)?);
                state.queued += 1;
                state.last_pos = Some(pos);
                state.head = state.head.or(Some(id));
                pending += 1;
                Placement::Queued {
                    owner: state.owner.map(|o| o.0),
                }
            }
            None | Some(Decision::Replace { .. }) => {
                // What a Replace displaces and stops is the single
                // admission's to do, on the slot as this batch has left it
                // (and so is every later admission to that slot).
                insert(&tx, std::mem::take(&mut rows)).await?;
                state.stale = true;
                let result = pg
                    .admit_in(&tx, a, ids[i], (name.clone(), slot, policy))
                    .await;
                match &result {
                    Ok(s) if !matches!(s.placement, Placement::Rejected(_)) => {
                        holders.insert(name, (s.slot.clone(), ids[i]));
                    }
                    Err(AdmitError::Store(e)) => return Err(e.clone()),
                    _ => {}
                }
                pending = count_pending(&tx).await?;
                results[i] = Some(result);
                continue;
            }
        };
        results[i] = Some(Ok(Submitted {
            id,
            name,
            slot: request.slot.clone().unwrap_or_default(),
            placement,
            existing: false,
        }));
    }
    insert(&tx, rows).await?;
    let claim_here = pg.announce_ready(&tx, ready).await?;
    notify_ids(pg, &tx, FINISHED, &rejected).await?;
    tx.commit()
        .await
        .map_err(db("cannot commit the submissions"))?;
    if claim_here {
        pg.claim_here();
    }
    Ok((results, later))
}

/// Inserts decided rows in one statement.
async fn insert(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: Vec<NewRow>,
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let now = ms(now_ms());
    let mut c = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let (mut outcomes, mut reports, mut logs, mut finished) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut priorities, mut schedules) = (Vec::new(), Vec::new());
    for r in rows {
        c.0.push(r.id);
        c.1.push(r.name);
        c.2.push(r.slot);
        c.3.push(r.plugin);
        c.4.push(r.digest);
        c.5.push(r.request);
        c.6.push(r.state);
        c.7.push(r.pos);
        c.8.push(r.placed);
        priorities.push(r.priority);
        schedules.push(r.schedule);
        finished.push(r.outcome.map(|_| now));
        outcomes.push(r.outcome);
        reports.push(r.report);
        logs.push(r.log);
    }
    exec(
        tx,
        "cannot record the submissions",
        "INSERT INTO taskhost_tasks (id, name, slot, plugin, digest, request, state, pos, placed, \
             submitted_ms, outcome, report, log, finished_ms, priority, schedule) \
         SELECT id, name, slot, plugin, digest, request, state, pos, placed, $10, outcome, report, \
             log, finished_ms, priority, schedule FROM unnest($1::int8[], $2::text[], $3::text[], \
             $4::text[], $5::bytea[], $6::bytea[], $7::text[], $8::int8[], $9::bool[], $11::text[], \
             $12::bytea[], $13::bytea[], $14::int8[], $15::int4[], $16::text[]) \
             AS u(id, name, slot, plugin, digest, request, state, pos, placed, outcome, report, \
             log, finished_ms, priority, schedule) ORDER BY id",
        &[
            &c.0, &c.1, &c.2, &c.3, &c.4, &c.5, &c.6, &c.7, &c.8, &now, &outcomes, &reports, &logs,
            &finished, &priorities, &schedules,
        ],
    )
    .await?;
    Ok(())
}
