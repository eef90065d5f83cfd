//! Owns observability: the [`Event`] vocabulary, the bounded bus that never
//! blocks the runtime (a full lane drops and counts), and subscribers as
//! bounded lanes on their own threads, so a slow or panicking subscriber
//! stalls nobody. Events are best-effort; outcomes (see `waiter`) are not.

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::outcome::{RejectionKind, TaskOutcome};
use crate::runtime::Stream;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub enum EventKind {
    /// `add` was called.
    TaskAddRequested,
    /// The task was registered.
    TaskAdded,
    /// Registration was refused (see `rejection`).
    TaskAddFailed,
    /// An attempt is about to start (it holds a permit).
    AttemptStarting,
    /// An attempt succeeded.
    AttemptSucceeded,
    /// An attempt failed (Fail or Fatal; see `reason`).
    AttemptFailed,
    /// An attempt timed out.
    AttemptTimedOut,
    /// An attempt ended because of a stop request or returned canceled.
    AttemptCanceled,
    /// A pause before the next attempt (see `delay_ms`, `source`).
    BackoffScheduled,
    /// A stop was requested (cancel, remove, shutdown, replace).
    TaskRemoveRequested,
    /// The task's final outcome is decided (see `outcome`).
    TaskFinished,
    /// The task is gone: instance dropped, name and permit released.
    TaskRemoved,
    /// The controller took a submission in.
    ControllerSubmitted,
    /// The controller rejected a submission.
    ControllerRejected,
    /// A controller slot changed state.
    ControllerSlotTransition,
    /// Shutdown began.
    ShutdownRequested,
    /// Every task stopped within the grace.
    AllStoppedWithinGrace,
    /// Some tasks had to be force-aborted (see `reason` for their names).
    GraceExceeded,
    /// A subscriber fell behind and missed `dropped` events.
    SubscriberOverflow,
    /// A subscriber panicked while handling an event.
    SubscriberPanicked,
    /// A line the guest wrote (see `stream`, `reason` holds the text).
    GuestLog,
    /// A guest progress report (`done`, `total`).
    Progress,
}

/// Why a backoff was scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffSource {
    /// After a failed attempt.
    Failure,
    /// After a successful attempt of a periodic task.
    Success,
}

/// One event. Fields not relevant to the kind are `None`.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Process-local, strictly increasing.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    pub kind: EventKind,
    /// The task's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<u64>,
    /// The task's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    /// The task's slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<Arc<str>>,
    /// 1-based attempt number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// A reason, message or guest line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The outcome kind (`completed`, `failed`, ...), for TaskFinished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'static str>,
    /// The rejection kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection: Option<RejectionKind>,
    /// A timeout in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// A delay in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// A duration in ms (of an attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// An exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How many events were dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
    /// Why a backoff was scheduled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<BackoffSource>,
    /// Which guest stream a GuestLog line came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<Stream>,
    /// Free-form detail (slot transitions `from->to`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Progress: units done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done: Option<u64>,
    /// Progress: units in total (0 if unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
}

impl Event {
    /// An event of this kind with every field empty (seq and time are set
    /// when it is published).
    pub fn new(kind: EventKind) -> Self {
        Self {
            seq: 0,
            at_ms: 0,
            kind,
            task_id: None,
            name: None,
            slot: None,
            attempt: None,
            reason: None,
            outcome: None,
            rejection: None,
            timeout_ms: None,
            delay_ms: None,
            duration_ms: None,
            exit_code: None,
            dropped: None,
            source: None,
            stream: None,
            detail: None,
            done: None,
            total: None,
        }
    }

    /// Sets the task identity fields.
    pub fn task(mut self, id: u64, name: &Arc<str>, slot: &Arc<str>) -> Self {
        self.task_id = Some(id);
        self.name = Some(Arc::clone(name));
        self.slot = Some(Arc::clone(slot));
        self
    }

    /// Sets the reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the outcome fields from a final outcome.
    pub fn outcome(mut self, outcome: &TaskOutcome) -> Self {
        self.outcome = Some(outcome.kind());
        self.reason = outcome.reason().map(str::to_owned);
        self.exit_code = outcome.exit_code();
        if let TaskOutcome::Rejected { kind, .. } = outcome {
            self.rejection = Some(*kind);
        }
        self
    }
}

/// The bounded event bus. Publishing never blocks: a receiver that falls
/// more than `capacity` events behind loses the oldest ones and is told how
/// many.
#[derive(Debug)]
pub struct Bus {
    sender: Mutex<Option<broadcast::Sender<Arc<Event>>>>,
    seq: AtomicU64,
    capacity: usize,
    epoch: (Instant, SystemTime),
}

impl Bus {
    /// A bus holding at most `capacity` undelivered events per lane.
    pub fn new(capacity: usize) -> Arc<Self> {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Arc::new(Self {
            sender: Mutex::new(Some(sender)),
            seq: AtomicU64::new(0),
            capacity: capacity.max(1),
            epoch: (Instant::now(), SystemTime::now()),
        })
    }

    /// Publishes an event, stamping its seq and time. Events published
    /// after [`Bus::close`] are discarded.
    pub fn publish(&self, mut event: Event) {
        let guard = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(sender) = guard.as_ref() else { return };
        if sender.receiver_count() == 0 {
            // Nobody listens: keep the seq increasing, skip the allocation.
            self.seq.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Seq is assigned under the lock so that seq order is delivery order.
        event.seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.epoch.1 + self.epoch.0.elapsed();
        event.at_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let _ = sender.send(Arc::new(event));
    }

    /// A new lane that sees every event published from now on.
    pub fn subscribe(&self) -> EventStream {
        self.subscribe_after().0
    }

    /// Like [`Bus::subscribe`], with the seq of the last event published
    /// before the lane existed: the lane gets exactly the events after it.
    pub fn subscribe_after(&self) -> (EventStream, u64) {
        let guard = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let stream = EventStream {
            receiver: guard.as_ref().map(|s| s.subscribe()),
        };
        (stream, self.seq.load(Ordering::Relaxed))
    }

    /// The bound of every lane.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Closes the bus: lanes drain what they hold, then end.
    pub fn close(&self) {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// One subscriber lane: events in publish order, with gaps reported.
#[derive(Debug)]
pub struct EventStream {
    receiver: Option<broadcast::Receiver<Arc<Event>>>,
}

/// What a lane yields.
#[derive(Debug, Clone)]
pub enum Received {
    /// The next event.
    Event(Arc<Event>),
    /// The lane fell behind; this many events were dropped.
    Dropped(u64),
}

impl EventStream {
    /// The next event, or `None` once the bus is closed and drained.
    pub async fn recv(&mut self) -> Option<Received> {
        let receiver = self.receiver.as_mut()?;
        match receiver.recv().await {
            Ok(event) => Some(Received::Event(event)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Received::Dropped(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// Like [`EventStream::recv`], for threads outside the async runtime.
    pub fn blocking_recv(&mut self) -> Option<Received> {
        let receiver = self.receiver.as_mut()?;
        match receiver.blocking_recv() {
            Ok(event) => Some(Received::Event(event)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Received::Dropped(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event skipping drop reports, or `None` when closed.
    pub async fn next_event(&mut self) -> Option<Arc<Event>> {
        loop {
            match self.recv().await? {
                Received::Event(e) => return Some(e),
                Received::Dropped(_) => continue,
            }
        }
    }
}

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
                tracing::warn!(target: "taskhost::events", seq = e.seq, ?kind, task_id = e.task_id, name, attempt = e.attempt, reason = e.reason.as_deref())
            }
            EventKind::GuestLog | EventKind::Progress => {
                tracing::trace!(target: "taskhost::events", seq = e.seq, ?kind, task_id = e.task_id, name, line = e.reason.as_deref())
            }
            _ => {
                tracing::debug!(target: "taskhost::events", seq = e.seq, ?kind, task_id = e.task_id, name, attempt = e.attempt, outcome = e.outcome, reason = e.reason.as_deref())
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
        if let Ok(line) = serde_json::to_string(event) {
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
        }
    }
}

/// How long subscribers get to drain at shutdown by default.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(2);
