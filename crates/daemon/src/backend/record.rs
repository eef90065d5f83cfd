//! Owns the body that keeps each attempt in the store before it runs: on
//! one host in its durable store, in a cluster under the claim's fencing
//! token, so that after a crash a started attempt is never mistaken for
//! one that never ran.

use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

use taskhost_core::supervisor::{AttemptContext, Resume, RunFuture, TaskBody, TaskError, TaskId};
use taskhost_runtime::plugin_task::PluginTask;

use crate::cluster::Cluster;
use crate::store::{Pause, Store, Ticket, now_ms};

/// A plugin task whose attempts start only once they are recorded, so that
/// after a crash a started attempt is never mistaken for one that never
/// ran (a run-once task must not run twice); its pauses are recorded too.
pub(crate) struct Recorded {
    id: TaskId,
    task: PluginTask,
    journal: Journal,
}

/// Where a [`Recorded`] task's attempts are written.
enum Journal {
    /// One host's durable store; `first` is the submission's commit when it
    /// recorded attempt 1 as started.
    Store {
        store: Store,
        first: Mutex<Option<Ticket>>,
    },
    /// The cluster's database, every write conditional on the claim's
    /// fencing token: once the claim is taken away, no attempt starts.
    Claim {
        cluster: Arc<Cluster>,
        token: i64,
        /// The last pause's write, which the next attempt's write follows.
        last_write: Mutex<Option<tokio::task::JoinHandle<()>>>,
    },
}

impl Recorded {
    /// Attempts recorded in one host's store.
    pub(crate) fn stored(
        id: TaskId,
        task: PluginTask,
        store: Store,
        first: Option<Ticket>,
    ) -> Self {
        let first = Mutex::new(first);
        let journal = Journal::Store { store, first };
        Self { id, task, journal }
    }

    /// Attempts of a claimed task, recorded under its token.
    pub(crate) fn claimed(id: TaskId, task: PluginTask, cluster: Arc<Cluster>, token: i64) -> Self {
        let last_write = Mutex::new(None);
        let journal = Journal::Claim {
            cluster,
            token,
            last_write,
        };
        Self { id, task, journal }
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

impl TaskBody for Recorded {
    fn attempt(&self, ctx: AttemptContext) -> BoxFuture<'static, Result<RunFuture, TaskError>> {
        let task = self.task.clone();
        let unrecorded = |e| TaskError::fail(format!("the attempt could not be recorded: {e}"));
        match &self.journal {
            Journal::Store { store, first } => {
                let first = if ctx.attempt() == 1 {
                    take(first)
                } else {
                    None
                };
                let ticket =
                    first.unwrap_or_else(|| store.attempt_started(ctx.task_id(), ctx.attempt()));
                Box::pin(async move {
                    ticket.committed().await.map_err(unrecorded)?;
                    task.attempt(ctx).await
                })
            }
            Journal::Claim {
                cluster,
                token,
                last_write,
            } => {
                let before = take(last_write);
                let (cluster, id, token) = (Arc::clone(cluster), self.id, *token);
                Box::pin(async move {
                    if let Some(before) = before {
                        let _ = before.await;
                    }
                    // Tried again while the database is away and this node
                    // holds the claim; a stop meanwhile ends the attempt
                    // before it starts.
                    let attempt = ctx.attempt();
                    let started = tokio::select! {
                        biased;
                        () = ctx.cancellation().cancelled() => return Err(TaskError::Canceled),
                        started = cluster.while_held(id, token, "recording an attempt's start", || {
                            cluster.pg.attempt_started(id, token, attempt)
                        }) => started,
                    };
                    match started {
                        Some(Ok(true)) => task.attempt(ctx).await,
                        Some(Ok(false)) | None => Err(TaskError::fatal(
                            "this node's claim on the task was taken over (its lease ran out); \
                             another node runs it",
                        )),
                        Some(Err(err)) => Err(unrecorded(err)),
                    }
                })
            }
        }
    }

    fn hurry(
        &self,
        deadline: std::time::Instant,
        abort: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Option<Box<dyn Send>> {
        self.task.hurry(deadline, abort)
    }

    fn pausing(&self, next: Resume) {
        let pause = Pause {
            until_ms: now_ms().saturating_add(next.delay.as_millis() as u64),
            failures: next.failures,
        };
        match &self.journal {
            Journal::Store { store, .. } => store.pausing(self.id, next.attempts, pause),
            Journal::Claim {
                cluster,
                token,
                last_write,
            } => {
                let (cluster, id, token) = (Arc::clone(cluster), self.id, *token);
                let write = tokio::spawn(async move {
                    let written = cluster
                        .while_held(id, token, "recording a pause", || {
                            cluster.pg.pausing(id, token, next.attempts, pause)
                        })
                        .await;
                    if let Some(Err(err)) = written {
                        tracing::warn!(task = %id, "cannot record a pause: {err}");
                    }
                });
                *last_write.lock().unwrap_or_else(PoisonError::into_inner) = Some(write);
            }
        }
    }

    fn describe(&self) -> String {
        self.task.describe()
    }

    fn code_digest(&self) -> Option<String> {
        self.task.code_digest()
    }
}
