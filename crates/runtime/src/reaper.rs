//! Owns the teardown of stopped attempts: dropping a store returns its
//! instance to the pool (resetting the memory and tables it dirtied) and
//! frees the WASI context, tens of microseconds each. Stops come in crowds
//! (a shutdown, a cancel of everything, Replace), and doing those drops on
//! the async workers puts them in front of the outcomes the crowd waits
//! for. A stopped plugin task hands its store to the supervisor, which
//! delivers the outcome first and then gives the store to a reaper with
//! the rest of the task's physical completion (the permit, the name, the
//! slot), which the reaper runs right after the drop. The reaper's threads
//! (one per core, up to four) run at the lowest CPU priority, so they use
//! what the workers leave, and each takes a batch of stores at a time.
//!
//! Attempts that end on their own drop their store inline, since handing
//! those over costs a round trip per task (BENCHMARKS.md). Outside a
//! supervisor ([`crate::PreparedAttempt::run`]) only a current-thread
//! runtime uses the reaper ([`wanted`]).
//!
//! Lowering a thread's CPU priority ([`lower_priority`]) is here too: the
//! reaper's threads and the compile threads of `runtime` share it.

#![forbid(unsafe_code)]

use std::num::NonZeroUsize;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Raises the calling thread's nice value by `nice` (on Linux the value is
/// the thread's own). Best effort: a thread that stays at its priority only
/// competes more with the tasks.
pub(crate) fn lower_priority(nice: i32) {
    if let Err(err) = rustix::process::nice(nice) {
        tracing::debug!("cannot lower a thread's priority: {err}");
    }
}

/// Whether a stopped attempt that is not run by a supervisor should drop
/// its store on the reaper: only from a current-thread runtime, whose one
/// thread would otherwise do every drop before the attempt returns.
pub(crate) fn wanted() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|rt| rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// One store to drop, and what comes after.
struct Job {
    remains: Box<dyn Send>,
    then: Box<dyn FnOnce() + Send>,
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
        let (done, gone) = tokio::sync::oneshot::channel();
        self.reap_then(
            remains,
            Box::new(move || {
                let _ = done.send(());
            }),
        );
        // An error means the job was dropped without its answer: a reaper
        // panicked while dropping it, so it is gone either way.
        let _ = gone.await;
    }

    /// Drops `remains` on a reaper thread, then calls `then` there. If no
    /// thread can be started (or they have died), does both here.
    pub(crate) fn reap_then(&self, remains: Box<dyn Send>, then: Box<dyn FnOnce() + Send>) {
        let job = Job { remains, then };
        let job = match self.queue.get_or_init(start) {
            Some(queue) => match queue.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        drop(job.remains);
        (job.then)();
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
                lower_priority(NICE);
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
                    // Drop them all, then go on with them all: what waits
                    // for them wakes together, not one wake-up each.
                    let thens: Vec<_> = batch
                        .drain(..)
                        .map(|job| {
                            drop(job.remains);
                            job.then
                        })
                        .collect();
                    for then in thens {
                        // A panic there is the caller's bug; the reaper
                        // goes on with the others.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(then));
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
