//! Owns the global concurrency limit: a counting semaphore whose waiters are
//! served by priority, highest first, and in arrival order within one
//! priority. A released permit goes straight to the first waiter (nobody
//! arriving later can take it first), so the order is exact. A waiter that
//! gives up (its task was stopped) leaves no trace: a permit handed to it
//! at that very moment goes on to the next. It also counts the attempts
//! that gave their permit back while they wait (parked): they hold an
//! instance but no permit.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// A waiter's place: priority first (highest first), then arrival.
type Place = (Reverse<i32>, u64);

/// The semaphore.
#[derive(Debug)]
pub(crate) struct Permits {
    state: Mutex<State>,
    /// Attempts parked: their permit given back while they wait.
    parked: AtomicUsize,
}

#[derive(Debug)]
struct State {
    available: usize,
    arrivals: u64,
    waiters: BTreeMap<Place, oneshot::Sender<()>>,
}

/// One permit; dropping it gives it back (to the first waiter, if any).
#[derive(Debug)]
pub(crate) struct Permit {
    permits: Arc<Permits>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.permits.release();
    }
}

impl Permits {
    /// `n` permits.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            state: Mutex::new(State {
                available: n,
                arrivals: 0,
                waiters: BTreeMap::new(),
            }),
            parked: AtomicUsize::new(0),
        }
    }

    /// Attempts parked right now.
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// Counts one attempt parked (`true`) or back (`false`).
    pub(crate) fn count_parked(&self, parked: bool) {
        if parked {
            self.parked.fetch_add(1, Ordering::Relaxed);
        } else {
            self.parked.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Permits free right now.
    pub(crate) fn available(&self) -> usize {
        self.lock().available
    }

    /// Waits for a permit at `priority`. Cancel-safe: dropping the future
    /// gives back a permit it was handed and not yet took.
    pub(crate) async fn acquire(self: &Arc<Self>, priority: i32) -> Permit {
        loop {
            let (place, rx) = {
                let mut state = self.lock();
                if state.available > 0 && state.waiters.is_empty() {
                    state.available -= 1;
                    return Permit {
                        permits: Arc::clone(self),
                    };
                }
                state.arrivals += 1;
                let place = (Reverse(priority), state.arrivals);
                let (tx, rx) = oneshot::channel();
                state.waiters.insert(place, tx);
                (place, rx)
            };
            let mut waiting = Waiting {
                permits: self,
                place,
                rx: Some(rx),
            };
            let granted = match waiting.rx.as_mut() {
                Some(rx) => rx.await.is_ok(),
                None => false,
            };
            waiting.rx = None;
            if granted {
                return Permit {
                    permits: Arc::clone(self),
                };
            }
            // A sender dropped unused (never, as senders are only dropped
            // once their receiver is gone): wait again rather than invent a
            // permit.
        }
    }

    /// Gives a permit back: to the first waiter still waiting, else to the
    /// pool.
    fn release(&self) {
        let mut state = self.lock();
        while let Some((_, tx)) = state.waiters.pop_first() {
            if tx.send(()).is_ok() {
                return;
            }
        }
        state.available += 1;
    }
}

/// A waiter's registration; on drop, it leaves the line, and a permit it
/// was handed but never took goes on.
struct Waiting<'a> {
    permits: &'a Arc<Permits>,
    place: Place,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut state = self.permits.lock();
        if state.waiters.remove(&self.place).is_some() {
            return;
        }
        // Handed a permit under the lock, before this drop took it.
        drop(state);
        if rx.try_recv().is_ok() {
            self.permits.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_by_priority_then_arrival() {
        let permits = Arc::new(Permits::new(1));
        let first = permits.acquire(0).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for (label, priority) in [("low-a", 0), ("high", 5), ("low-b", 0), ("mid", 2)] {
            let (permits, order) = (Arc::clone(&permits), Arc::clone(&order));
            handles.push(tokio::spawn(async move {
                let _permit = permits.acquire(priority).await;
                order.lock().unwrap().push(label);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for handle in handles {
            handle.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high", "mid", "low-a", "low-b"]);
        assert_eq!(permits.available(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_loses_nothing() {
        let permits = Arc::new(Permits::new(1));
        let held = permits.acquire(0).await;
        let gave_up = {
            let permits = Arc::clone(&permits);
            tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(std::time::Duration::from_millis(5), permits.acquire(9))
                        .await;
            })
        };
        gave_up.await.unwrap();
        drop(held);
        assert_eq!(permits.available(), 1, "the permit came back");
        let again = permits.acquire(0).await;
        drop(again);
        assert_eq!(permits.available(), 1);
    }
}
