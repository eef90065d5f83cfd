//! Helpers shared by the supervisor tests: body builders, a runtime with the
//! shared compilation cache, an event recorder that tests synchronise on, the
//! [`Fixture`] most tests start from (a supervisor, its recorder, run a spec
//! to its report, compare a task's events), and the event sequences the
//! tests expect, written out once.

#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use taskhost_core::supervisor::{Event, EventKind, EventKind as K, EventStream, Received};
use taskhost_runtime::Plugin;
use taskhost_runtime::prelude::*;

/// Milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fails the test with `what` if `fut` does not finish within `limit`. On a
/// paused clock this only fires when everything is blocked, that is, on a
/// hang.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

/// The most a plugin test waits for anything before it calls it a hang.
pub const WASM_LIMIT: Duration = Duration::from_secs(30);
/// The same for native tests (virtual time on a paused clock).
pub const NATIVE_LIMIT: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------

/// A native body that returns `output` at once.
pub fn returns(output: &'static [u8]) -> impl TaskBody {
    native(move |_| async move { Ok(output.to_vec()) })
}

/// A cooperative native body that runs until it is asked to stop, then
/// returns canceled.
pub fn until_canceled() -> impl TaskBody {
    native(|ctx| async move {
        ctx.cancellation().cancelled().await;
        Err(TaskError::Canceled)
    })
}

/// A native body that ignores stop requests and never returns.
pub fn stubborn() -> impl TaskBody {
    native(|_| std::future::pending())
}

/// A native body that sleeps `d` (on the Tokio clock), then returns `ok`.
pub fn sleeps(d: Duration) -> impl TaskBody {
    native(move |_| async move {
        tokio::time::sleep(d).await;
        Ok(b"ok".to_vec())
    })
}

/// One runtime per test, with the compilation cache shared by all tests.
pub fn runtime() -> Arc<Runtime> {
    let config = RuntimeConfig::default().cache_dir(Some(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasmtime-cache"),
    ));
    Arc::new(Runtime::new(&config).expect("the runtime starts"))
}

/// A plugin built from `plugins/`.
pub async fn load(runtime: &Runtime, name: &str) -> Arc<Plugin> {
    runtime
        .load_file(&plugin_artifacts::path(name))
        .await
        .unwrap_or_else(|e| panic!("plugin {name} loads: {e}"))
}

/// Task params from string pairs, for [`PluginTask::params`].
pub fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

// ---------------------------------------------------------------------------
// Event sequences
// ---------------------------------------------------------------------------

/// How every admitted task's events begin.
pub const REGISTERED: [EventKind; 2] = [K::TaskAddRequested, K::TaskAdded];
/// How every admitted task's events end.
pub const ENDED: [EventKind; 2] = [K::TaskFinished, K::TaskRemoved];

/// One attempt that succeeded, and the task completed.
pub const COMPLETED_ONCE: [EventKind; 6] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::AttemptStarting,
    K::AttemptSucceeded,
    K::TaskFinished,
    K::TaskRemoved,
];
/// One attempt that failed (Fail or Fatal), and it was final.
pub const FAILED_ONCE: [EventKind; 6] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::AttemptStarting,
    K::AttemptFailed,
    K::TaskFinished,
    K::TaskRemoved,
];
/// One attempt that timed out, and it was final.
pub const TIMED_OUT_ONCE: [EventKind; 6] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::AttemptStarting,
    K::AttemptTimedOut,
    K::TaskFinished,
    K::TaskRemoved,
];
/// One attempt that returned canceled without being asked to.
pub const CANCELED_BY_THE_BODY: [EventKind; 6] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::AttemptStarting,
    K::AttemptCanceled,
    K::TaskFinished,
    K::TaskRemoved,
];
/// Stopped while its first attempt ran, and it ended within the grace.
pub const CANCELED_WHILE_RUNNING: [EventKind; 7] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::AttemptStarting,
    K::TaskRemoveRequested,
    K::AttemptCanceled,
    K::TaskFinished,
    K::TaskRemoved,
];
/// Stopped while its first attempt ran, and force-aborted at the grace (a
/// force-aborted attempt has no end event of its own).
pub const FORCE_ABORTED_WHILE_RUNNING: [EventKind; 6] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::AttemptStarting,
    K::TaskRemoveRequested,
    K::TaskFinished,
    K::TaskRemoved,
];
/// Stopped before any attempt started (waiting for a permit).
pub const CANCELED_BEFORE_AN_ATTEMPT: [EventKind; 5] = [
    K::TaskAddRequested,
    K::TaskAdded,
    K::TaskRemoveRequested,
    K::TaskFinished,
    K::TaskRemoved,
];
/// Refused at registration.
pub const REJECTED_AT_ADD: [EventKind; 2] = [K::TaskAddRequested, K::TaskAddFailed];

/// A round of a restarting task: an attempt that succeeded, then the pause
/// before the next one.
pub const SUCCEEDED_THEN_PAUSED: [EventKind; 3] =
    [K::AttemptStarting, K::AttemptSucceeded, K::BackoffScheduled];
/// A round of a retrying task: an attempt that failed, then the backoff.
pub const FAILED_THEN_PAUSED: [EventKind; 3] =
    [K::AttemptStarting, K::AttemptFailed, K::BackoffScheduled];
/// A round of a retrying task: an attempt that timed out, then the backoff.
pub const TIMED_OUT_THEN_PAUSED: [EventKind; 3] =
    [K::AttemptStarting, K::AttemptTimedOut, K::BackoffScheduled];

/// An event sequence made of parts: `sequence(&[&REGISTERED,
/// &FAILED_THEN_PAUSED.repeat(2), &[K::AttemptStarting, K::AttemptSucceeded],
/// &ENDED])`.
pub fn sequence(parts: &[&[EventKind]]) -> Vec<EventKind> {
    parts.concat()
}

// ---------------------------------------------------------------------------
// Recording events
// ---------------------------------------------------------------------------

/// Guest output kinds, left out when sequences are compared.
pub fn is_guest_output(kind: EventKind) -> bool {
    matches!(kind, EventKind::GuestLog | EventKind::Progress)
}

/// Records every event of one lane and lets a test wait for the one it
/// needs. A lane that reports dropped events fails the test: exact
/// sequences need every event (the default bus holds 4096 per lane).
pub struct Recorder {
    stream: EventStream,
    limit: Duration,
    /// Every event seen so far, in seq order.
    pub seen: Vec<Arc<Event>>,
}

impl Recorder {
    /// Subscribes now: call before adding the tasks of interest.
    pub fn new(sup: &Supervisor, limit: Duration) -> Self {
        Self {
            stream: sup.subscribe(),
            limit,
            seen: Vec::new(),
        }
    }

    /// Reads until an event matching `pred` arrives and returns it.
    pub async fn until(&mut self, mut pred: impl FnMut(&Event) -> bool) -> Arc<Event> {
        let limit = self.limit;
        let seen = &mut self.seen;
        let stream = &mut self.stream;
        within(limit, "waiting for an event", async move {
            loop {
                match stream.recv().await {
                    Some(Received::Event(event)) => {
                        seen.push(Arc::clone(&event));
                        if pred(&event) {
                            return event;
                        }
                    }
                    Some(Received::Dropped(n)) => {
                        panic!("the test's event lane dropped {n} events")
                    }
                    None => panic!("the bus closed before the awaited event"),
                }
            }
        })
        .await
    }

    /// The first event of `kind` for task `id`, reading until it arrives
    /// if it has not been read yet.
    pub async fn until_kind(&mut self, id: TaskId, kind: EventKind) -> Arc<Event> {
        let matches = |e: &Event| e.task_id == Some(id) && e.kind == kind;
        if let Some(event) = self.seen.iter().find(|e| matches(e)) {
            return Arc::clone(event);
        }
        self.until(matches).await
    }

    /// Reads until at least `n` events of `kind` for task `id` have been
    /// seen (counting those already read).
    pub async fn until_count(&mut self, id: TaskId, kind: EventKind, n: usize) {
        let mut have = self
            .seen
            .iter()
            .filter(|e| e.task_id == Some(id) && e.kind == kind)
            .count();
        if have >= n {
            return;
        }
        self.until(|e| {
            if e.task_id == Some(id) && e.kind == kind {
                have += 1;
            }
            have >= n
        })
        .await;
    }

    /// Reads until task `id` is removed (its last event).
    pub async fn until_removed(&mut self, id: TaskId) -> Arc<Event> {
        self.until_kind(id, EventKind::TaskRemoved).await
    }

    /// Reads until the bus closes (after shutdown).
    pub async fn until_closed(&mut self) {
        let limit = self.limit;
        let seen = &mut self.seen;
        let stream = &mut self.stream;
        within(limit, "waiting for the bus to close", async move {
            while let Some(received) = stream.recv().await {
                match received {
                    Received::Event(event) => seen.push(event),
                    Received::Dropped(n) => panic!("the test's event lane dropped {n} events"),
                }
            }
        })
        .await;
    }

    /// The events of task `id`, without guest output.
    pub fn of(&self, id: TaskId) -> Vec<Arc<Event>> {
        self.seen
            .iter()
            .filter(|e| e.task_id == Some(id) && !is_guest_output(e.kind))
            .cloned()
            .collect()
    }

    /// The event kinds of task `id`, without guest output.
    pub fn kinds(&self, id: TaskId) -> Vec<EventKind> {
        self.of(id).iter().map(|e| e.kind).collect()
    }

    /// The events of task `id` of one kind.
    pub fn of_kind(&self, id: TaskId, kind: EventKind) -> Vec<Arc<Event>> {
        self.of(id).into_iter().filter(|e| e.kind == kind).collect()
    }

    /// Every event of `kind`, of any task.
    pub fn all_of_kind(&self, kind: EventKind) -> Vec<Arc<Event>> {
        self.seen
            .iter()
            .filter(|e| e.kind == kind)
            .cloned()
            .collect()
    }
}

// ---------------------------------------------------------------------------
// The fixture
// ---------------------------------------------------------------------------

/// A supervisor with a [`Recorder`] subscribed before any task is added,
/// and a limit after which waiting for anything is a hang.
pub struct Fixture {
    /// The supervisor under test.
    pub sup: Supervisor,
    /// Every event since the fixture was made.
    pub events: Recorder,
    limit: Duration,
}

impl Fixture {
    /// `sup` with a recorder; `limit` is [`NATIVE_LIMIT`] or [`WASM_LIMIT`].
    pub fn new(sup: Supervisor, limit: Duration) -> Self {
        let events = Recorder::new(&sup, limit);
        Self { sup, events, limit }
    }

    /// A supervisor with every default, for native bodies (paused clock).
    pub fn native() -> Self {
        Self::new(Supervisor::default(), NATIVE_LIMIT)
    }

    /// A supervisor with every default, for plugin bodies (real clock).
    pub fn wasm() -> Self {
        Self::new(Supervisor::default(), WASM_LIMIT)
    }

    /// Adds a task (without waiting for anything).
    pub fn add(&self, spec: TaskSpec) -> TaskWaiter {
        self.sup.add(spec)
    }

    /// Adds a task and runs it to its end: its report (within the limit) and
    /// its TaskRemoved, so that its events are complete.
    pub async fn run(&mut self, spec: TaskSpec) -> (TaskId, Arc<TaskReport>) {
        let waiter = self.sup.add(spec);
        self.settle(waiter).await
    }

    /// Waits for a task's report (within the limit) and its TaskRemoved.
    pub async fn settle(&mut self, waiter: TaskWaiter) -> (TaskId, Arc<TaskReport>) {
        let id = waiter.id();
        let report = within(self.limit, "the task's report", waiter.report()).await;
        assert_eq!(report.id, id, "the report is the task's");
        self.events.until_removed(id).await;
        (id, report)
    }

    /// Asserts the event kinds of task `id` (without guest output).
    #[track_caller]
    pub fn assert_kinds(&self, id: TaskId, expected: &[EventKind]) {
        assert_eq!(self.events.kinds(id), expected, "the events of task {id}");
    }
}
