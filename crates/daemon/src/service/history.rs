//! Owns the daemon's recent events: one reader of the supervisor's bus keeps
//! the last [`EVENT_HISTORY`] events for `host events` and bridges every event
//! to the daemon's `tracing` log, and a follower can be handed the history
//! and a live stream with nothing falling between the two.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use taskhost_core::supervisor::{Event, EventStream, Received, Supervisor, TracingBridge};

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
    /// Starts recording the supervisor's events.
    pub(crate) fn start(supervisor: &Supervisor) -> Arc<Self> {
        let history = Arc::new(Self {
            events: Mutex::new(VecDeque::new()),
            recorded: watch::channel(0).0,
        });
        let stream = supervisor.subscribe();
        tokio::spawn(Arc::clone(&history).record(stream));
        history
    }

    async fn record(self: Arc<Self>, mut stream: EventStream) {
        while let Some(received) = stream.recv().await {
            if let Received::Event(event) = received {
                TracingBridge::trace(&event);
                let seq = event.seq;
                let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
                if events.len() == EVENT_HISTORY {
                    events.pop_front();
                }
                events.push_back(event);
                drop(events);
                self.recorded.send_replace(seq);
            }
        }
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
