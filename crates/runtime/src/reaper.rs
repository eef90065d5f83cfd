//! Owns the teardown of stopped attempts: dropping a store returns its
//! instance to the pool (resetting the memory and tables it dirtied) and
//! frees the WASI context, tens of microseconds each. When many attempts
//! stop at once (a shutdown, a cancel of everything), doing that on the
//! async worker that resumed each guest serialises it behind the guests; a
//! thread of its own does it beside them. The attempt still waits for its
//! store to be gone before it ends, so physical completion (and with it the
//! permit, the slot and the name) comes after the drop, as before.
//!
//! Only stopped attempts on a current-thread runtime use it ([`wanted`]).

#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::sync::mpsc;

/// Whether the store of an attempt that was asked to stop should go to the
/// reaper: only from a current-thread runtime, whose one thread would
/// otherwise do every drop. On a multi-thread runtime the other workers
/// already share the load, so the reaper's hop only adds to a shutdown;
/// attempts that end on their own stay inline everywhere, since handing
/// those over too costs a round trip per task (BENCHMARKS.md, the suite's
/// shutdown and one-shot rows).
pub(crate) fn wanted() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|rt| rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// One store to drop, and who waits for it.
struct Job {
    remains: Box<dyn Send>,
    done: tokio::sync::oneshot::Sender<()>,
}

/// A thread that drops what it is given, started at first use.
#[derive(Default)]
pub(crate) struct Reaper {
    queue: OnceLock<Option<mpsc::Sender<Job>>>,
}

impl Reaper {
    /// Drops `remains` on the reaper's thread and returns once it is gone.
    /// If the thread cannot be started (or has died), drops it here.
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

fn start() -> Option<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("taskhost-reaper".into())
        .spawn(move || {
            // Ends when the runtime (holding the sender) is dropped.
            for job in rx {
                drop(job.remains);
                let _ = job.done.send(());
            }
        });
    match spawned {
        Ok(_) => Some(tx),
        Err(err) => {
            tracing::warn!(
                "cannot start the store reaper thread ({err}); stores are dropped inline"
            );
            None
        }
    }
}
