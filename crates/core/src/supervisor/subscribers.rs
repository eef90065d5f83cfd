//! Owns subscribers: callbacks that receive every event on a bounded lane
//! of their own thread, so a slow or panicking subscriber stalls nobody
//! (its lane drops and reports the drop, its panics are reported as events),
//! plus the two stock subscribers, [`TracingBridge`] and [`JsonLinesWriter`].

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::events::{Bus, Event, EventKind, Received};

/// A callback that receives events on its own thread.
pub trait Subscriber: Send + 'static {
    /// A short name for diagnostics.
    fn name(&self) -> &str;
    /// Handles one event. May be slow; may panic (it is reported, and the
    /// lane carries on).
    fn on_event(&mut self, event: &Event);
}

/// A running subscriber lane.
#[derive(Debug)]
pub(crate) struct SubscriberLane {
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
    name: String,
}

impl SubscriberLane {
    /// Starts a thread feeding `subscriber` from a new lane of `bus`.
    pub(crate) fn start(
        bus: &Arc<Bus>,
        mut subscriber: Box<dyn Subscriber>,
    ) -> std::io::Result<Self> {
        let mut stream = bus.subscribe();
        let bus_for_lane = Arc::downgrade(bus);
        let name = subscriber.name().to_owned();
        let (done_tx, done) = std::sync::mpsc::channel();
        let lane_name = name.clone();
        let thread = std::thread::Builder::new()
            .name(format!("taskhost-sub-{name}"))
            .spawn(move || {
                // Events this lane lost and has not reported yet. The report
                // waits until the lane has read the next event: right after a
                // drop the lane stands at the oldest event of a full lane, and
                // publishing then would push out exactly that event, make the
                // lane drop again, and so on forever.
                let mut missed = 0u64;
                while let Some(received) = stream.blocking_recv() {
                    match received {
                        Received::Event(event) => {
                            if missed > 0
                                && let Some(bus) = bus_for_lane.upgrade()
                            {
                                let mut e = Event::new(EventKind::SubscriberOverflow)
                                    .reason(format!("subscriber `{lane_name}` fell behind"));
                                e.dropped = Some(missed);
                                bus.publish(e);
                            }
                            missed = 0;
                            let result =
                                catch_unwind(AssertUnwindSafe(|| subscriber.on_event(&event)));
                            if result.is_err()
                                && event.kind != EventKind::SubscriberPanicked
                                && let Some(bus) = bus_for_lane.upgrade()
                            {
                                bus.publish(Event::new(EventKind::SubscriberPanicked).reason(
                                    format!(
                                        "subscriber `{lane_name}` panicked on event {}",
                                        event.seq
                                    ),
                                ));
                            }
                        }
                        Received::Dropped(n) => missed = missed.saturating_add(n),
                    }
                }
                let _ = done_tx.send(());
            })?;
        Ok(Self {
            done,
            thread: Some(thread),
            name,
        })
    }

    /// Waits until the lane has drained (after the bus closed), at most
    /// until `deadline`. Returns false if it did not finish in time (its
    /// thread is left to finish on its own).
    pub(crate) fn drain(mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        let finished = self.done.recv_timeout(left).is_ok();
        if finished && let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if !finished {
            tracing::warn!(subscriber = %self.name, "subscriber did not drain before its deadline");
        }
        finished
    }
}

/// Forwards events to `tracing` (target `taskhost::events`).
#[derive(Debug, Default)]
pub struct TracingBridge;

impl Subscriber for TracingBridge {
    fn name(&self) -> &str {
        "tracing"
    }

    fn on_event(&mut self, event: &Event) {
        TracingBridge::trace(event);
    }
}

impl TracingBridge {
    /// Emits one event to `tracing`: failures and grace overruns at warn,
    /// guest output at trace, everything else at debug. Usable without a
    /// lane of its own by a component that already reads the bus.
    pub fn trace(e: &Event) {
        let name = e.name.as_deref().unwrap_or("");
        let kind = e.kind;
        match kind {
            EventKind::AttemptFailed
            | EventKind::AttemptTimedOut
            | EventKind::GraceExceeded
            | EventKind::TaskAddFailed => {
                tracing::warn!(target: "taskhost::events", seq = e.seq, ?kind, task_id = e.task_id.map(|id| id.get()), name, attempt = e.attempt, reason = e.reason.as_deref())
            }
            EventKind::GuestLog | EventKind::Progress => {
                tracing::trace!(target: "taskhost::events", seq = e.seq, ?kind, task_id = e.task_id.map(|id| id.get()), name, line = e.reason.as_deref())
            }
            _ => {
                tracing::debug!(target: "taskhost::events", seq = e.seq, ?kind, task_id = e.task_id.map(|id| id.get()), name, attempt = e.attempt, outcome = e.outcome.map(|o| o.as_str()), reason = e.reason.as_deref())
            }
        }
    }
}

/// Writes every event as one JSON line.
pub struct JsonLinesWriter<W: Write + Send + 'static> {
    out: W,
}

impl<W: Write + Send + 'static> JsonLinesWriter<W> {
    /// Writes to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }
}

impl<W: Write + Send + 'static> Subscriber for JsonLinesWriter<W> {
    fn name(&self) -> &str {
        "json-lines"
    }

    fn on_event(&mut self, event: &Event) {
        let _ = writeln!(self.out, "{}", event.to_json());
        let _ = self.out.flush();
    }
}

/// How long subscribers get to drain at shutdown by default.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(2);
