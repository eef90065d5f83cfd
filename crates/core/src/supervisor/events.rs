//! Owns the event vocabulary ([`Event`], [`EventKind`]) and the bounded bus
//! that never blocks the runtime: every reader is a lane that holds at most
//! the bus capacity; a lane that falls behind loses the oldest events and is
//! told how many. Only the crate publishes. Events are best-effort; outcomes
//! (see `waiter`) are not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};

use crate::logline::Stream;
use crate::outcome::{OutcomeKind, RejectionKind, TaskOutcome};

use super::TaskId;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    /// A host with a durable store restarted and found this task
    /// unfinished; `reason` says what became of it (queued again, retried
    /// after an interrupted attempt, ended).
    Recovered,
    /// A delayed submission's time came and it was placed (`delay_ms`: how
    /// late it was placed).
    DelayDue,
    /// A schedule fired: its task was submitted (`schedule`, the task,
    /// `delay_ms`: how late after its due time, `detail`: `on-time`,
    /// `catch-up` or `run`).
    ScheduleFired,
    /// A schedule's firings passed while the host was down or the
    /// schedule paused, and were skipped (`--missed skip`; `reason` says
    /// how many and since when).
    ScheduleMissed,
    /// An attempt could not start: its slot's rate of starts is spent
    /// (`delay_ms`: until the next start the rate allows). It holds no
    /// permit meanwhile.
    AttemptThrottled,
}

/// Why a backoff was scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffSource {
    /// After a failed attempt.
    Failure,
    /// After a successful attempt of a periodic task.
    Success,
}

/// One event. Fields not relevant to the kind are `None`. (Every field is
/// always serialized, `None` included, because the daemon's wire format is
/// not self-describing; JSON writers drop the nulls.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Event {
    /// Process-local, strictly increasing.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    pub kind: EventKind,
    /// The task's id.
    pub task_id: Option<TaskId>,
    /// The task's name.
    pub name: Option<Arc<str>>,
    /// The task's slot.
    pub slot: Option<Arc<str>>,
    /// 1-based attempt number.
    pub attempt: Option<u32>,
    /// A reason, message or guest line.
    pub reason: Option<String>,
    /// The outcome kind, for TaskFinished and rejections.
    pub outcome: Option<OutcomeKind>,
    /// The rejection kind.
    pub rejection: Option<RejectionKind>,
    /// A timeout in ms.
    pub timeout_ms: Option<u64>,
    /// A delay in ms.
    pub delay_ms: Option<u64>,
    /// A duration in ms (of an attempt).
    pub duration_ms: Option<u64>,
    /// An exit code.
    pub exit_code: Option<i32>,
    /// How many events were dropped.
    pub dropped: Option<u64>,
    /// Why a backoff was scheduled.
    pub source: Option<BackoffSource>,
    /// Which guest stream a GuestLog line came from.
    pub stream: Option<Stream>,
    /// Free-form detail (slot transitions `from->to`).
    pub detail: Option<String>,
    /// Progress: units done.
    pub done: Option<u64>,
    /// Progress: units in total (0 if unknown).
    pub total: Option<u64>,
    /// The schedule that fired the task.
    pub schedule: Option<Arc<str>>,
    /// The task that spawned the task (a child task's parent).
    pub parent: Option<TaskId>,
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
            schedule: None,
            parent: None,
        }
    }

    /// The event as one JSON object, without the fields that do not apply
    /// (the form `host events --json` and [`JsonLinesWriter`](super::JsonLinesWriter) write).
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let serde_json::Value::Object(fields) = &mut value {
            fields.retain(|_, v| !v.is_null());
        }
        value
    }

    /// Sets the task identity fields.
    pub fn task(mut self, id: TaskId, name: &Arc<str>, slot: &Arc<str>) -> Self {
        self.task_id = Some(id);
        self.name = Some(Arc::clone(name));
        self.slot = Some(Arc::clone(slot));
        self
    }

    /// Sets the schedule that fired the task, if any.
    pub fn schedule(mut self, schedule: Option<&Arc<str>>) -> Self {
        self.schedule = schedule.cloned();
        self
    }

    /// Sets the task that spawned the task, if any.
    pub fn parent(mut self, parent: Option<TaskId>) -> Self {
        self.parent = parent;
        self
    }

    /// Sets the reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the outcome fields from a final outcome.
    pub(crate) fn outcome(mut self, outcome: &TaskOutcome) -> Self {
        self.outcome = Some(outcome.kind());
        self.reason = outcome.reason().map(str::to_owned);
        self.exit_code = outcome.exit_code();
        self.rejection = outcome.rejection();
        self
    }
}

/// The bounded event bus. Publishing never blocks: a receiver that falls
/// more than `capacity` events behind loses the oldest ones and is told how
/// many. A deep lane ([`Bus::subscribe_deep`]) has a capacity of its own,
/// taken up only by what it holds, and loses the newest events instead.
#[derive(Debug)]
pub(crate) struct Bus {
    senders: Mutex<Option<Senders>>,
    seq: AtomicU64,
    epoch: (Instant, SystemTime),
}

#[derive(Debug)]
struct Senders {
    broadcast: broadcast::Sender<Arc<Event>>,
    deep: Vec<DeepSender>,
    observers: Vec<Observer>,
}

/// What [`Bus::observe`] calls with each event.
type ObserverFn = dyn Fn(&Arc<Event>) + Send + Sync;

/// A function called with each event as it is published ([`Bus::observe`]).
struct Observer(Box<ObserverFn>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

#[derive(Debug)]
struct DeepSender {
    sender: mpsc::Sender<Received>,
    /// Events lost since the lane was last full, told before the next one.
    dropped: u64,
}

impl DeepSender {
    /// Sends `event`; `false` once the reader is gone.
    fn send(&mut self, event: &Arc<Event>) -> bool {
        if self.dropped > 0 {
            match self.sender.try_send(Received::Dropped(self.dropped)) {
                Ok(()) => self.dropped = 0,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.dropped += 1;
                    return true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
            }
        }
        match self.sender.try_send(Received::Event(Arc::clone(event))) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped += 1;
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

impl Bus {
    /// A bus holding at most `capacity` undelivered events per lane.
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        let (broadcast, _) = broadcast::channel(capacity.max(1));
        Arc::new(Self {
            senders: Mutex::new(Some(Senders {
                broadcast,
                deep: Vec::new(),
                observers: Vec::new(),
            })),
            seq: AtomicU64::new(0),
            epoch: (Instant::now(), SystemTime::now()),
        })
    }

    /// Publishes an event, stamping its seq and time. Events published
    /// after [`Bus::close`] are discarded.
    pub fn publish(&self, mut event: Event) {
        let mut guard = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(senders) = guard.as_mut() else {
            return;
        };
        if senders.broadcast.receiver_count() == 0
            && senders.deep.is_empty()
            && senders.observers.is_empty()
        {
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
        let event = Arc::new(event);
        // An observer that panics is dropped, and the publisher goes on.
        senders.observers.retain(|observer| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (observer.0)(&event))).is_ok()
        });
        senders.deep.retain_mut(|lane| lane.send(&event));
        let _ = senders.broadcast.send(event);
    }

    /// A new lane that sees every event published from now on.
    pub fn subscribe(&self) -> EventStream {
        self.subscribe_after().0
    }

    /// Like [`Bus::subscribe`], with the seq of the last event published
    /// before the lane existed: the lane gets exactly the events after it.
    pub fn subscribe_after(&self) -> (EventStream, u64) {
        let guard = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        let stream = EventStream {
            receiver: guard
                .as_ref()
                .map(|s| Receiver::Broadcast(s.broadcast.subscribe())),
        };
        (stream, self.seq.load(Ordering::Relaxed))
    }

    /// A lane of its own holding up to `capacity` unread events, its memory
    /// taken as they arrive: deep enough for a burst without paying for
    /// the depth up front. When full it loses the newest events and says
    /// how many before the next one it delivers.
    pub fn subscribe_deep(&self, capacity: usize) -> EventStream {
        let mut guard = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        let receiver = guard.as_mut().map(|s| {
            let (sender, receiver) = mpsc::channel(capacity.max(2));
            s.deep.push(DeepSender { sender, dropped: 0 });
            Receiver::Deep(receiver)
        });
        EventStream { receiver }
    }

    /// Calls `observer` with every event published from now on, on the
    /// publishing thread, in seq order, under the bus's lock.
    pub(crate) fn observe(&self, observer: impl Fn(&Arc<Event>) + Send + Sync + 'static) {
        let mut guard = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(senders) = guard.as_mut() {
            senders.observers.push(Observer(Box::new(observer)));
        }
    }

    /// Closes the bus: lanes drain what they hold, then end.
    pub(crate) fn close(&self) {
        self.senders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// One subscriber lane: events in publish order, with gaps reported.
#[derive(Debug)]
pub struct EventStream {
    receiver: Option<Receiver>,
}

#[derive(Debug)]
enum Receiver {
    Broadcast(broadcast::Receiver<Arc<Event>>),
    Deep(mpsc::Receiver<Received>),
}

/// What a lane yields.
#[derive(Debug, Clone)]
pub enum Received {
    /// The next event.
    Event(Arc<Event>),
    /// The lane fell behind; this many events were dropped.
    Dropped(u64),
}

fn from_broadcast(result: Result<Arc<Event>, broadcast::error::RecvError>) -> Option<Received> {
    match result {
        Ok(event) => Some(Received::Event(event)),
        Err(broadcast::error::RecvError::Lagged(n)) => Some(Received::Dropped(n)),
        Err(broadcast::error::RecvError::Closed) => None,
    }
}

impl EventStream {
    /// The next event, or `None` once the bus is closed and drained.
    pub async fn recv(&mut self) -> Option<Received> {
        match self.receiver.as_mut()? {
            Receiver::Broadcast(receiver) => from_broadcast(receiver.recv().await),
            Receiver::Deep(receiver) => receiver.recv().await,
        }
    }

    /// The next event if one is ready now, without waiting; `None` when the
    /// lane is empty or closed (a later [`EventStream::recv`] tells which).
    pub fn try_recv(&mut self) -> Option<Received> {
        match self.receiver.as_mut()? {
            Receiver::Broadcast(receiver) => match receiver.try_recv() {
                Ok(event) => Some(Received::Event(event)),
                Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Received::Dropped(n)),
                Err(
                    broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed,
                ) => None,
            },
            Receiver::Deep(receiver) => receiver.try_recv().ok(),
        }
    }

    /// Like [`EventStream::recv`], for threads outside the async runtime.
    pub fn blocking_recv(&mut self) -> Option<Received> {
        match self.receiver.as_mut()? {
            Receiver::Broadcast(receiver) => from_broadcast(receiver.blocking_recv()),
            Receiver::Deep(receiver) => receiver.blocking_recv(),
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
