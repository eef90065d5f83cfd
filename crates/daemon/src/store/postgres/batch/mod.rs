//! Owns the writes a node makes many of at once: attempt starts, ends and
//! admissions. Each kind has one writer task per node (admissions one per
//! namespace) that takes every request waiting and records them in one
//! transaction of set-based statements (`unnest` of arrays), with one
//! notification per batch: group commit, as the SQLite writer does. It decides nothing of its own: the
//! admission rules are `admission::decide`'s, applied in arrival order
//! within the batch.
//!
//! | file | owns |
//! |---|---|
//! | `starts` | a batch of attempt starts under their claims' tokens |
//! | `ends` | a batch of ends: claims checked, attempts closed, reports recorded, the freed slots' next admitted |
//! | `admissions` | a batch of admissions decided in arrival order; those whose slot another transaction holds, one at a time |
//! | `cancels` | a bulk cancel's queued tasks, ended in transactions of 1,000 |

mod admissions;
mod cancels;
mod ends;
mod starts;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use taskhost_core::supervisor::TaskId;

use super::{Admission, AdmitError, Pg, retry};
use crate::store::{Finished, StoreError};
use crate::wire::protocol::Submitted;
use admissions::{Deferred, DeferredJob, admit_all, admit_deferred};
use ends::{answer_ends, finished};
use starts::started;

/// Most requests of one kind recorded in one transaction.
const BATCH: usize = 256;
/// Most admissions decided in one transaction: two batch calls' worth,
/// so that a call's items (sent one after the other) are decided
/// together and the slots' reads (which count the cluster's queue) are
/// made once for them.
const ADMIT_BATCH: usize = 2 * crate::wire::protocol::MAX_BATCH;
/// Longest notification payload (the server's limit is 8,000 bytes).
const PAYLOAD: usize = 7_000;

type Reply<T> = oneshot::Sender<T>;
/// An attempt's start: the task, its claim's token, the attempt.
type StartJob = (TaskId, i64, u32, u64, Reply<Result<bool, StoreError>>);
/// A task's end under its claim's token.
type FinishJob = (i64, Finished, Reply<Result<bool, StoreError>>);
type AdmitJob = (Arc<Admission>, Reply<Result<Submitted, AdmitError>>);

/// Starts a writer of admissions.
type AdmitWriter = Box<dyn Fn() -> mpsc::UnboundedSender<AdmitJob> + Send + Sync>;

/// The node's writer tasks, one per kind of request, and one of
/// admissions per namespace.
pub(crate) struct Writer {
    start: mpsc::UnboundedSender<StartJob>,
    finish: mpsc::UnboundedSender<FinishJob>,
    /// The default namespace's admissions.
    admit: mpsc::UnboundedSender<AdmitJob>,
    /// Each other namespace's, started at its first submission here: its
    /// batches are transactions of their own (their slots are not
    /// another's), so one namespace's flood of submissions does not queue
    /// another's behind it.
    admit_in: std::sync::Mutex<std::collections::HashMap<String, mpsc::UnboundedSender<AdmitJob>>>,
    new_admit: AdmitWriter,
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

impl Writer {
    /// Starts the writers on `pg`.
    pub(crate) fn start(pg: &Pg) -> Self {
        let (p1, p2, p3, p4, p5) = (pg.clone(), pg.clone(), pg.clone(), pg.clone(), pg.clone());
        // Ends and admissions whose slot another transaction holds (a
        // frozen node's, or a busy slot's) are not waited for by the batch:
        // they go to writers of their own, which wait for the locks, in
        // batches too.
        let slow_ends = writer(BATCH, move |jobs: Vec<FinishJob>| {
            let pg = p4.clone();
            async move {
                let result = retry(|| finished(&pg, &jobs, true)).await;
                answer_ends(jobs, result, None);
            }
        });
        let deferred: Deferred = Arc::default();
        let held = Arc::clone(&deferred);
        let slow_admissions = writer(ADMIT_BATCH, move |jobs: Vec<DeferredJob>| {
            let (pg, held) = (p5.clone(), Arc::clone(&held));
            async move { admit_deferred(&pg, jobs, &held).await }
        });
        let new_admit: AdmitWriter = Box::new(move || {
            let (pg, slow, deferred) = (p3.clone(), slow_admissions.clone(), Arc::clone(&deferred));
            writer(ADMIT_BATCH, move |jobs: Vec<AdmitJob>| {
                let (pg, slow, deferred) = (pg.clone(), slow.clone(), Arc::clone(&deferred));
                async move { admit_all(&pg, jobs, &slow, &deferred).await }
            })
        });
        Self {
            admit: new_admit(),
            admit_in: Default::default(),
            new_admit,
            start: writer(BATCH, move |jobs: Vec<StartJob>| {
                let pg = p1.clone();
                async move {
                    let items: Vec<(TaskId, i64, u32, u64)> = jobs
                        .iter()
                        .map(|(id, t, a, at, _)| (*id, *t, *a, *at))
                        .collect();
                    match retry(|| started(&pg, &items)).await {
                        Ok(recorded) => {
                            for (id, _, _, _, reply) in jobs {
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
        }
    }

    /// Records that attempt `attempt` of a claimed task began (now, by
    /// this node's clock: the time its rate's budget let it start, whatever
    /// the batch's wait); false if the claim was taken away.
    pub(crate) async fn started(
        &self,
        id: TaskId,
        token: i64,
        attempt: u32,
    ) -> Result<bool, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.start
            .send((id, token, attempt, crate::store::now_ms(), tx))
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
        let queued = match a.request.namespace.clone() {
            None => self.admit.send((a, tx)),
            Some(ns) => {
                let mut writers = (self.admit_in.lock()).unwrap_or_else(|e| e.into_inner());
                let writer = writers.entry(ns).or_insert_with(|| (self.new_admit)());
                writer.send((a, tx))
            }
        };
        async move {
            queued.map_err(|_| AdmitError::Store(gone()))?;
            rx.await.map_err(|_| AdmitError::Store(gone()))?
        }
    }
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
