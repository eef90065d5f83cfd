//! Owns the registry of live tasks: the unique-name and id maps, stop claims,
//! and the per-task handles (stop signal with its grace deadline, outcome
//! cell, physical-completion signal, phase and progress, the running
//! attempt's permit) shared by callers and the task's actor. A name stays
//! taken until its task is physically gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::TaskId;
use super::body::{AfterTeardown, TaskBody, Teardown};
use super::permits::{Permit, Permits};
use super::waiter::OutcomeCell;
use crate::lifecycle::TaskState;

/// A task by id or by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskRef {
    /// By id.
    Id(TaskId),
    /// By name.
    Name(String),
}

impl TaskRef {
    /// Reads a command-line `ID|NAME`: all digits is an id, anything else a
    /// name.
    pub fn parse(text: &str) -> Self {
        match text.parse() {
            Ok(id) => Self::Id(TaskId::from_u64(id)),
            Err(_) => Self::Name(text.to_owned()),
        }
    }
}

impl std::fmt::Display for TaskRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Id(id) => write!(f, "id {id}"),
            Self::Name(name) => write!(f, "`{name}`"),
        }
    }
}

impl From<TaskId> for TaskRef {
    fn from(id: TaskId) -> Self {
        Self::Id(id)
    }
}

impl From<&TaskId> for TaskRef {
    fn from(id: &TaskId) -> Self {
        Self::Id(*id)
    }
}

impl From<&str> for TaskRef {
    fn from(name: &str) -> Self {
        Self::Name(name.to_owned())
    }
}

impl From<String> for TaskRef {
    fn from(name: String) -> Self {
        Self::Name(name)
    }
}

/// The phase of a registered task, kept as a byte: `Waiting`, `Running`,
/// `BackingOff`, `Stopping` or `Finishing` of [`TaskState`].
fn phase_of(v: u8) -> TaskState {
    match v {
        0 => TaskState::Waiting,
        1 => TaskState::Running,
        2 => TaskState::BackingOff,
        3 => TaskState::Stopping,
        5 => TaskState::Throttled,
        _ => TaskState::Finishing,
    }
}

fn phase_byte(state: TaskState) -> u8 {
    match state {
        TaskState::Waiting => 0,
        TaskState::Running => 1,
        TaskState::BackingOff => 2,
        TaskState::Stopping => 3,
        TaskState::Throttled => 5,
        _ => 4,
    }
}

/// A registered task as seen from outside (a snapshot; it may be stale when
/// read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Id.
    pub id: TaskId,
    /// Name.
    pub name: String,
    /// Slot.
    pub slot: String,
    /// Phase.
    pub phase: TaskState,
    /// Attempts started so far.
    pub attempts: u32,
    /// Time since it was registered.
    pub age: Duration,
    /// The last progress its body reported: `(done, total)`.
    pub progress: Option<(u64, u64)>,
    /// While `Throttled`: when its slot's rate allows its next start
    /// (milliseconds since the Unix epoch).
    pub next_start_ms: Option<u64>,
    /// What its body is (for a plugin, its name).
    pub body: String,
}

/// The shared handle of one registered task.
pub(crate) struct TaskEntry {
    pub id: TaskId,
    pub name: Arc<str>,
    pub slot: Arc<str>,
    /// The schedule that fired it, if any (its events carry it).
    pub schedule: Option<Arc<str>>,
    /// The task that spawned it, if any (its events carry it).
    pub parent: Option<TaskId>,
    body: Arc<dyn TaskBody>,
    since: Instant,
    /// `Some(deadline)` once a stop is requested: the body must end by then.
    stop: watch::Sender<Option<Instant>>,
    claimed: AtomicBool,
    pub outcome: Arc<OutcomeCell>,
    /// Fires when the task is physically gone (instance dropped, permit and
    /// name released).
    pub gone: CancellationToken,
    phase: AtomicU8,
    attempts: AtomicU32,
    /// The last progress report; `total` is `u64::MAX` until the first one
    /// (the two are read without a lock: a snapshot may mix two reports).
    progress_done: AtomicU64,
    progress_total: AtomicU64,
    /// While throttled: when the next start is allowed (Unix ms; 0: not
    /// throttled).
    next_start_ms: AtomicU64,
    /// The running attempt's abort flag, and the guard of the deadline its
    /// body was told of, so that a stop reaches the body from the stopper's
    /// own thread (the actor's may be held by a spinning guest).
    running: Mutex<Option<RunningAttempt>>,
}

/// What a stop needs of the running attempt.
struct RunningAttempt {
    abort: Arc<AtomicBool>,
    hurry: Option<Box<dyn Send>>,
    /// What the attempt's body handed over to finish it physically.
    teardown: Option<Teardown>,
    /// Its concurrency permit, unless it runs without a limit or is parked.
    permit: Option<Permit>,
    /// Where its permit went back while it is parked (it counts there).
    parked: Option<Arc<Permits>>,
}

impl Drop for RunningAttempt {
    fn drop(&mut self) {
        if let Some(permits) = self.parked.take() {
            permits.count_parked(false);
        }
    }
}

impl std::fmt::Debug for TaskEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskEntry")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TaskEntry {
    pub(crate) fn new(
        id: TaskId,
        name: Arc<str>,
        slot: Arc<str>,
        body: Arc<dyn TaskBody>,
        outcome: Arc<OutcomeCell>,
    ) -> Self {
        Self {
            id,
            name,
            slot,
            schedule: None,
            parent: None,
            body,
            since: Instant::now(),
            stop: watch::channel(None).0,
            claimed: AtomicBool::new(false),
            outcome,
            gone: CancellationToken::new(),
            phase: AtomicU8::new(0),
            attempts: AtomicU32::new(0),
            progress_done: AtomicU64::new(0),
            progress_total: AtomicU64::new(u64::MAX),
            next_start_ms: AtomicU64::new(0),
            running: Mutex::new(None),
        }
    }

    /// Remembers the last progress report (for `list`).
    pub(crate) fn set_progress(&self, done: u64, total: u64) {
        self.progress_done.store(done, Ordering::Relaxed);
        self.progress_total
            .store(total.min(u64::MAX - 1), Ordering::Relaxed);
    }

    /// Requests a stop that must complete by `deadline`; an earlier deadline
    /// from a later request (shutdown after cancel) wins.
    pub(crate) fn request_stop(&self, deadline: Instant) {
        let earlier = self.stop.send_if_modified(|current| match current {
            Some(existing) if *existing <= deadline => false,
            _ => {
                *current = Some(deadline);
                true
            }
        });
        if earlier {
            // Tell a running attempt's body now, not when the actor next
            // runs: a guest that cannot be preempted is stopped at the
            // deadline by the body's own means (a plugin's epoch ticker).
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(attempt) = running.as_mut() {
                attempt.hurry = self.body.hurry(deadline.into_std(), &attempt.abort);
            }
        }
    }

    /// An attempt with this abort flag is running (until `attempt_ended`),
    /// holding `permit`.
    pub(crate) fn attempt_began(&self, abort: &Arc<AtomicBool>, permit: Option<Permit>) {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = Some(RunningAttempt {
            abort: Arc::clone(abort),
            hurry: None,
            teardown: None,
            permit,
            parked: None,
        });
    }

    /// Gives the running attempt's permit back to `permits` (it is parked
    /// until [`TaskEntry::unparked`]); false if it holds none.
    pub(crate) fn park(&self, permits: &Arc<Permits>) -> bool {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(attempt) = running.as_mut() else {
            return false;
        };
        let Some(permit) = attempt.permit.take() else {
            return false;
        };
        permits.count_parked(true);
        attempt.parked = Some(Arc::clone(permits));
        drop(running);
        // Shown waiting before another attempt can run on the permit.
        self.set_phase(TaskState::Waiting);
        // To the first waiter, outside the entry's lock.
        drop(permit);
        true
    }

    /// Whether the running attempt is parked.
    pub(crate) fn is_parked(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|a| a.parked.is_some())
    }

    /// The parked attempt is back, with `permit` (none: it goes on without
    /// one, as it is stopping). A permit that finds no parked attempt (it
    /// ended meanwhile) is given back.
    pub(crate) fn unparked(&self, permit: Option<Permit>) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(attempt) = running.as_mut().filter(|a| a.parked.is_some()) else {
            drop(running);
            drop(permit);
            return;
        };
        if let Some(permits) = attempt.parked.take() {
            permits.count_parked(false);
        }
        attempt.permit = permit;
    }

    /// The running attempt is gone (its deadline guard with it, and a
    /// teardown nobody took, dropped unrun).
    pub(crate) fn attempt_ended(&self) {
        let ended = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(ended);
    }

    /// Adds to what finishes the running attempt physically, after what was
    /// handed over before. Without a running attempt, drops it.
    pub(crate) fn hand_over(&self, teardown: Teardown) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(attempt) = running.as_mut() else {
            drop(running);
            drop(teardown);
            return;
        };
        attempt.teardown = Some(match attempt.teardown.take() {
            None => teardown,
            Some(before) => Box::new(move |then| {
                before(AfterTeardown::new(move || teardown(then)));
            }),
        });
    }

    /// Takes what the running attempt's body handed over, and its permit.
    pub(crate) fn take_leftovers(&self) -> (Option<Teardown>, Option<Permit>) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        match running.as_mut() {
            Some(attempt) => (attempt.teardown.take(), attempt.permit.take()),
            None => (None, None),
        }
    }

    /// Makes the stop claim; true for exactly one caller.
    pub(crate) fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn stop_signal(&self) -> watch::Receiver<Option<Instant>> {
        self.stop.subscribe()
    }

    pub(crate) fn set_phase(&self, phase: TaskState) {
        self.phase.store(phase_byte(phase), Ordering::Relaxed);
    }

    /// Throttled until `at` (its slot's rate allows its next start then).
    pub(crate) fn set_throttled(&self, at: tokio::time::Instant) {
        let wait = at.saturating_duration_since(tokio::time::Instant::now());
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(wait)
            .as_millis();
        self.next_start_ms
            .store(u64::try_from(at_ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.set_phase(TaskState::Throttled);
    }

    /// Continues the attempt numbers of an earlier run.
    pub(crate) fn attempts_before(&self, n: u32) {
        self.attempts.store(n, Ordering::Relaxed);
    }

    pub(crate) fn count_attempt(&self) -> u32 {
        self.attempts.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn info(&self) -> TaskInfo {
        let total = self.progress_total.load(Ordering::Relaxed);
        TaskInfo {
            id: self.id,
            name: self.name.to_string(),
            slot: self.slot.to_string(),
            phase: phase_of(self.phase.load(Ordering::Relaxed)),
            attempts: self.attempts.load(Ordering::Relaxed),
            age: self.since.elapsed(),
            progress: (total != u64::MAX)
                .then(|| (self.progress_done.load(Ordering::Relaxed), total)),
            next_start_ms: Some(self.next_start_ms.load(Ordering::Relaxed)).filter(|at| {
                *at > 0 && phase_of(self.phase.load(Ordering::Relaxed)) == TaskState::Throttled
            }),
            body: self.body.describe(),
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegisterError {
    AlreadyExists,
    /// The id is taken (only a foreign or reused reservation gets here).
    IdTaken,
    Full,
    ShuttingDown,
}

/// Names and ids of registered tasks.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_name: HashMap<Arc<str>, Arc<TaskEntry>, foldhash::fast::RandomState>,
    by_id: HashMap<TaskId, Arc<TaskEntry>, foldhash::fast::RandomState>,
    closed: bool,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an entry if its name is free, the registry has room and it
    /// is still open.
    pub(crate) fn register(&self, entry: &Arc<TaskEntry>, max: usize) -> Result<(), RegisterError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(RegisterError::ShuttingDown);
        }
        if inner.by_name.contains_key(&entry.name) {
            return Err(RegisterError::AlreadyExists);
        }
        if inner.by_id.contains_key(&entry.id) {
            return Err(RegisterError::IdTaken);
        }
        if inner.by_name.len() >= max {
            return Err(RegisterError::Full);
        }
        inner
            .by_name
            .insert(Arc::clone(&entry.name), Arc::clone(entry));
        inner.by_id.insert(entry.id, Arc::clone(entry));
        Ok(())
    }

    /// Frees the entry's name and id (at physical completion).
    pub(crate) fn unregister(&self, entry: &TaskEntry) {
        let mut inner = self.lock();
        if inner
            .by_id
            .get(&entry.id)
            .is_some_and(|e| std::ptr::eq(e.as_ref(), entry))
        {
            inner.by_id.remove(&entry.id);
            inner.by_name.remove(&entry.name);
        }
    }

    pub(crate) fn get(&self, target: &TaskRef) -> Option<Arc<TaskEntry>> {
        let inner = self.lock();
        match target {
            TaskRef::Id(id) => inner.by_id.get(id).cloned(),
            TaskRef::Name(name) => inner.by_name.get(name.as_str()).cloned(),
        }
    }

    /// Refuses new registrations from now on and returns every entry.
    pub(crate) fn close(&self) -> Vec<Arc<TaskEntry>> {
        let mut inner = self.lock();
        inner.closed = true;
        inner.by_id.values().cloned().collect()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub(crate) fn list(&self) -> Vec<TaskInfo> {
        let inner = self.lock();
        let mut tasks: Vec<TaskInfo> = inner.by_id.values().map(|e| e.info()).collect();
        tasks.sort_by_key(|t| t.id);
        tasks
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}
