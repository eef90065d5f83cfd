//! Owns the daemon's recent events: an observer of the supervisor's bus
//! (called as each event is published, so no task wakes per event) keeps
//! the last [`EVENT_HISTORY`] events for `host events` and bridges every
//! event to the daemon's `tracing` log, and a follower can be handed the
//! history and a live stream with nothing falling between the two.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use taskhost_core::supervisor::{Event, Supervisor, TracingBridge};

/// Recent events kept for `host events` without `--follow`.
pub const EVENT_HISTORY: usize = 1_000;

/// The recent events of one daemon.
#[derive(Debug)]
pub(crate) struct History {
    events: Mutex<VecDeque<Arc<Event>>>,
    /// The seq of the newest event taken in.
    recorded: watch::Sender<u64>,
}

impl History {
    /// Starts recording the supervisor's events: synchronously as each is
    /// published, so no task is woken per event.
    pub(crate) fn start(supervisor: &Supervisor) -> Arc<Self> {
        let history = Arc::new(Self {
            events: Mutex::new(VecDeque::new()),
            recorded: watch::channel(0).0,
        });
        let recorder = Arc::clone(&history);
        supervisor.observe(move |event| recorder.record(event));
        history
    }

    fn record(&self, event: &Arc<Event>) {
        TracingBridge::trace(event);
        let seq = event.seq;
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() == EVENT_HISTORY {
            events.pop_front();
        }
        events.push_back(Arc::clone(event));
        drop(events);
        // Waking a receiver costs eight locks whether or not one waits; an
        // `up_to` that subscribes after this reads the new seq anyway.
        self.recorded.send_if_modified(|newest| {
            *newest = seq;
            self.recorded.receiver_count() > 0
        });
    }

    /// The recorded events up to and including `seq`, oldest first, once the
    /// recorder has caught up with `seq` (or after half a second: a gap left
    /// by a recorder that fell behind shows as missing seqs).
    pub(crate) async fn up_to(&self, seq: u64) -> Vec<Arc<Event>> {
        let mut recorded = self.recorded.subscribe();
        let _ = tokio::time::timeout(
            Duration::from_millis(500),
            recorded.wait_for(|newest| *newest >= seq),
        )
        .await;
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|e| e.seq <= seq)
            .cloned()
            .collect()
    }
}
