//! Owns reliable outcome delivery: one write-once cell per task that every
//! [`TaskWaiter`] reads, whether it started waiting before or after the end,
//! independent of the (lossy) event bus.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::outcome::TaskOutcome;

use super::TaskId;

/// Most attempt records kept in a report (the newest ones).
pub const MAX_HISTORY: usize = 32;

/// One attempt, as remembered for the final report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// 1-based attempt number.
    pub attempt: u32,
    /// How it ended, for people (`succeeded`, `failed: ...`, `timed out ...`).
    pub result: String,
    /// How long it ran.
    pub duration: Duration,
}

/// A task's final outcome with the facts that led to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReport {
    /// The task's id.
    pub id: TaskId,
    /// The task's name.
    pub name: Arc<str>,
    /// The task's slot.
    pub slot: Arc<str>,
    /// The final outcome.
    pub outcome: TaskOutcome,
    /// How many attempts started.
    pub attempts: u32,
    /// The newest attempts (at most [`MAX_HISTORY`]).
    pub history: Vec<AttemptRecord>,
    /// The task's own run time: from the start of its first attempt to its
    /// outcome (zero if no attempt started).
    pub duration: Duration,
}

impl TaskReport {
    /// The report of a task that never ran.
    pub fn never_ran(id: TaskId, name: Arc<str>, slot: Arc<str>, outcome: TaskOutcome) -> Self {
        Self {
            id,
            name,
            slot,
            outcome,
            attempts: 0,
            history: Vec::new(),
            duration: Duration::ZERO,
        }
    }
}

/// What [`TaskWaiter::on_report`] is given.
type ReportHook = Box<dyn FnOnce(Arc<TaskReport>) + Send>;

/// The hooks of one cell: `Some` while they wait for the report, `None`
/// once they were called.
struct Hooks(Mutex<Option<Vec<ReportHook>>>);

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

impl Hooks {
    fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(Some(Vec::new()))))
    }

    /// Takes the waiting hooks; `None` once they were taken.
    fn fire(&self) -> Option<Vec<ReportHook>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Calls each hook with `report`; one that panics does not stop the others
/// or the task's supervisor.
fn call(hooks: Vec<ReportHook>, report: &Arc<TaskReport>) {
    for hook in hooks {
        let report = Arc::clone(report);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(report)));
    }
}

/// The writing side: set exactly once.
#[derive(Debug)]
pub(crate) struct OutcomeCell {
    id: TaskId,
    tx: watch::Sender<Option<Arc<TaskReport>>>,
    hooks: Arc<Hooks>,
}

impl OutcomeCell {
    pub(crate) fn new(id: TaskId) -> Self {
        Self {
            id,
            tx: watch::channel(None).0,
            hooks: Hooks::new(),
        }
    }

    /// Delivers the report to every current and future waiter, then calls
    /// the hooks. A second call is ignored: the first outcome is final.
    pub(crate) fn set(&self, report: TaskReport) -> bool {
        let report = Arc::new(report);
        let delivered = self.tx.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(Arc::clone(&report));
            true
        });
        if delivered && let Some(hooks) = self.hooks.fire() {
            call(hooks, &report);
        }
        delivered
    }

    pub(crate) fn is_set(&self) -> bool {
        self.tx.borrow().is_some()
    }

    pub(crate) fn waiter(&self, id: TaskId) -> TaskWaiter {
        TaskWaiter {
            id,
            rx: self.tx.subscribe(),
            hooks: Arc::clone(&self.hooks),
        }
    }
}

impl Drop for OutcomeCell {
    /// A cell dropped without an outcome (a host bug) still calls its hooks,
    /// with the report [`TaskWaiter::report`] gives then.
    fn drop(&mut self) {
        if self.tx.borrow().is_none()
            && let Some(hooks) = self.hooks.fire()
            && !hooks.is_empty()
        {
            call(hooks, &lost(self.id));
        }
    }
}

/// Waits for one task's final outcome. Cheap to clone; every clone gets the
/// same outcome.
#[derive(Debug, Clone)]
pub struct TaskWaiter {
    id: TaskId,
    rx: watch::Receiver<Option<Arc<TaskReport>>>,
    hooks: Arc<Hooks>,
}

impl TaskWaiter {
    /// The task's id (assigned even if it was rejected).
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The final report, once there is one.
    pub async fn report(mut self) -> Arc<TaskReport> {
        let id = self.id;
        let found = match self.rx.wait_for(Option::is_some).await {
            Ok(report) => report.as_ref().map(Arc::clone),
            Err(_) => None,
        };
        found
            .or_else(|| self.rx.borrow().as_ref().map(Arc::clone))
            .unwrap_or_else(|| lost(id))
    }

    /// Calls `f` with the final report: right after it is delivered, on
    /// the thread that delivers it (usually the task's own, as it ends), or
    /// here and now if it already was. No task waits for it, so nothing is
    /// woken to run it. `f` must be quick (start a task for anything slow)
    /// and must not wait on this supervisor; one that panics is ignored.
    pub fn on_report(&self, f: impl FnOnce(Arc<TaskReport>) + Send + 'static) {
        let mut hooks = self.hooks.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waiting) = hooks.as_mut() {
            waiting.push(Box::new(f));
            return;
        }
        drop(hooks);
        // Already called: the report is in the cell (or the cell is gone).
        let report = self
            .rx
            .borrow()
            .as_ref()
            .map(Arc::clone)
            .unwrap_or_else(|| lost(self.id));
        call(vec![Box::new(f)], &report);
    }

    /// The final outcome, once there is one.
    pub async fn wait(self) -> TaskOutcome {
        self.report().await.outcome.clone()
    }

    /// The outcome if it is already decided.
    pub fn try_outcome(&self) -> Option<TaskOutcome> {
        self.rx.borrow().as_ref().map(|r| r.outcome.clone())
    }

    /// The report if the outcome is already decided.
    pub fn try_report(&self) -> Option<Arc<TaskReport>> {
        self.rx.borrow().as_ref().map(Arc::clone)
    }
}

/// The writer vanished without an outcome: a host bug, reported as such.
fn lost(id: TaskId) -> Arc<TaskReport> {
    Arc::new(TaskReport::never_ran(
        id,
        Arc::from(""),
        Arc::from(""),
        TaskOutcome::Panicked {
            reason: "the task's outcome was lost (host bug)".into(),
        },
    ))
}
