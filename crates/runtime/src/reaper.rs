//! Owns the teardown of stopped attempts: dropping a store returns its
//! instance to the pool (resetting the memory and tables it dirtied) and
//! frees the WASI context, tens of microseconds each. Stops come in crowds
//! (a shutdown, a cancel of everything, Replace), and doing those drops on
//! the async workers puts them in front of the outcomes the crowd waits
//! for. A stopped plugin task hands its store to the supervisor, which
//! delivers the outcome first and then waits for the reaper to drop it: the
//! reaper's threads (one per core, up to four) run at the lowest CPU
//! priority, so they use what the workers leave, and each takes a batch of
//! stores at a time, so the attempts waiting for them wake together.
//! Physical completion (the permit, the slot and the name) still comes
//! only after the drop.
//!
//! Attempts that end on their own drop their store inline, since handing
//! those over costs a round trip per task (BENCHMARKS.md). Outside a
//! supervisor ([`crate::PreparedAttempt::run`]) only a current-thread
//! runtime uses the reaper ([`wanted`]).

#![forbid(unsafe_code)]

use std::num::NonZeroUsize;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Whether a stopped attempt that is not run by a supervisor should drop
/// its store on the reaper: only from a current-thread runtime, whose one
/// thread would otherwise do every drop before the attempt returns.
pub(crate) fn wanted() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|rt| rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// One store to drop, and who waits for it.
struct Job {
    remains: Box<dyn Send>,
    done: tokio::sync::oneshot::Sender<()>,
}

/// Threads that drop what they are given, started at first use.
#[derive(Default)]
pub(crate) struct Reaper {
    queue: OnceLock<Option<mpsc::Sender<Job>>>,
}

impl Reaper {
    /// Drops `remains` on a reaper thread and returns once it is gone. If
    /// no thread can be started (or they have died), drops it here.
    pub(crate) async fn reap(&self, remains: Box<dyn Send>) {
        let Some(queue) = self.queue.get_or_init(start) else {
            drop(remains);
            return;
        };
        let (done, gone) = tokio::sync::oneshot::channel();
        match queue.send(Job { remains, done }) {
            // An error means the job was dropped without its answer: the
            // thread panicked while dropping it, so it is gone either way.
            Ok(()) => {
                let _ = gone.await;
            }
            Err(mpsc::SendError(job)) => drop(job),
        }
    }
}

/// The reapers' nice value: the lowest priority. A lone stop's drop still
/// runs at once (a woken thread gets the CPU it slept through); a crowd's
/// waits for the workers to be done with its outcomes.
const NICE: i32 = 19;

/// Jobs a reaper thread takes at once.
const BATCH: usize = 32;

/// Reaper threads at most (one per core up to this).
const MAX_THREADS: usize = 4;

fn start() -> Option<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(MAX_THREADS);
    let mut started = 0;
    for _ in 0..threads {
        let rx = Arc::clone(&rx);
        let spawned = std::thread::Builder::new()
            .name("taskhost-reaper".into())
            .spawn(move || {
                crate::lower_priority(NICE);
                // Ends when the runtime (holding the sender) is dropped. The
                // lock is never held across a drop, so it cannot be poisoned.
                let mut batch = Vec::with_capacity(BATCH);
                loop {
                    {
                        let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
                        let Ok(job) = rx.recv() else { break };
                        batch.push(job);
                        batch.extend(rx.try_iter().take(BATCH - 1));
                    }
                    // Drop them all, then answer them all: the waiting
                    // attempts wake together, not one executor wake-up each.
                    let done: Vec<_> = batch
                        .drain(..)
                        .map(|job| {
                            drop(job.remains);
                            job.done
                        })
                        .collect();
                    for done in done {
                        let _ = done.send(());
                    }
                }
            });
        match spawned {
            Ok(_) => started += 1,
            Err(err) => {
                tracing::warn!("cannot start a store reaper thread: {err}");
                break;
            }
        }
    }
    if started == 0 {
        tracing::warn!("no store reaper thread could be started; stores are dropped inline");
        return None;
    }
    Some(tx)
}
