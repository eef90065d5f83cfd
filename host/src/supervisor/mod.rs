//! The supervisor: registers tasks, runs each in its own actor with retries,
//! backoff, timeouts and a global concurrency limit, delivers exactly one
//! final outcome per task, publishes lifecycle events, and shuts down
//! gracefully with force-abort (SEMANTICS §1-5, §7). Task bodies are plugin
//! attempts or native Rust futures; both go through the same actor.
//!
//! | module | owns |
//! |---|---|
//! | `spec` | what a task is: body, restart, backoff, timeout, retry budget |
//! | `backoff` | the delay before retry `i` |
//! | `registry` | ids, unique names, stop claims, per-task handles |
//! | `actor` | one task's life: attempts, decisions, stop and force-abort |
//! | `waiter` | reliable outcome delivery |
//! | `events` | the event vocabulary, the bounded bus, subscriber lanes |

mod actor;
pub mod backoff;
pub mod events;
mod registry;
pub mod spec;
mod waiter;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OnceCell, Semaphore};

use crate::outcome::{RejectionKind, TaskOutcome};

pub use backoff::{BackoffError, BackoffPolicy, Jitter};
pub use events::{
    BackoffSource, Bus, DEFAULT_DRAIN_DEADLINE, Event, EventKind, EventStream, JsonLinesWriter,
    Received, Subscriber, TracingBridge,
};
pub use registry::{TaskInfo, TaskPhase, TaskRef};
pub use spec::{
    NativeContext, NativeFn, PluginBody, RestartPolicy, TaskBody, TaskDefaults, TaskError,
    TaskSpec, native,
};
pub(crate) use waiter::OutcomeCell;
pub use waiter::{AttemptRecord, MAX_HISTORY, TaskReport, TaskWaiter};

use events::SubscriberLane;
use registry::{RegisterError, Registry, TaskEntry};

/// Limits and defaults of a supervisor.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Most attempts running at once; `None` is unlimited.
    pub max_concurrent: Option<usize>,
    /// Most tasks registered at once (including those still stopping).
    pub max_registered_tasks: usize,
    /// How long a stopped task may take to end before it is force-aborted
    /// (for cancel and remove; shutdown takes its own).
    pub grace: Duration,
    /// Undelivered events each subscriber lane may hold before it drops.
    pub bus_capacity: usize,
    /// How long subscribers get to drain at shutdown.
    pub drain_deadline: Duration,
    /// Policies for specs that leave them unset.
    pub defaults: TaskDefaults,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            max_registered_tasks: 100_000,
            grace: Duration::from_secs(60),
            bus_capacity: 4096,
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
            defaults: TaskDefaults::default(),
        }
    }
}

/// A cancel whose task did not end within the caller's timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task {id} did not end within {timeout:?} of the cancel; it is still stopping")]
pub struct CancelTimedOut {
    /// The task.
    pub id: u64,
    /// The caller's timeout.
    pub timeout: Duration,
}

/// How shutdown went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShutdownReport {
    /// Every task ended within the grace.
    AllStopped,
    /// These tasks did not end within the grace and were force-aborted.
    GraceExceeded {
        /// Their names, sorted.
        stuck: Vec<String>,
    },
}

/// State shared by the handle and every actor.
pub(crate) struct Shared {
    config: SupervisorConfig,
    registry: Registry,
    bus: Arc<Bus>,
    permits: Option<Arc<Semaphore>>,
    next_id: AtomicU64,
    shutdown: OnceCell<ShutdownReport>,
    subscribers: Mutex<Vec<SubscriberLane>>,
}

impl Shared {
    fn publish(&self, event: Event) {
        self.bus.publish(event);
    }
}

/// A handle to a supervisor; cheap to clone. Must be used inside a Tokio
/// runtime (it spawns one actor per task).
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("tasks", &self.shared.registry.len())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A supervisor with these limits and no subscribers.
    pub fn new(config: SupervisorConfig) -> Self {
        Self::with_subscribers(config, Vec::new())
    }

    /// A supervisor whose subscribers each get their own bounded lane and
    /// thread.
    pub fn with_subscribers(
        config: SupervisorConfig,
        subscribers: Vec<Box<dyn Subscriber>>,
    ) -> Self {
        let bus = Bus::new(config.bus_capacity);
        let lanes = subscribers
            .into_iter()
            .filter_map(|s| match SubscriberLane::start(&bus, s) {
                Ok(lane) => Some(lane),
                Err(err) => {
                    tracing::error!("cannot start a subscriber thread: {err}");
                    None
                }
            })
            .collect();
        let permits = config
            .max_concurrent
            .map(|n| Arc::new(Semaphore::new(n.max(1))));
        Self {
            shared: Arc::new(Shared {
                config,
                registry: Registry::default(),
                bus,
                permits,
                next_id: AtomicU64::new(1),
                shutdown: OnceCell::new(),
                subscribers: Mutex::new(lanes),
            }),
        }
    }

    /// The next task id (strictly increasing, never reused). The controller
    /// uses it to give queued submissions an id before they register.
    pub fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A new event lane that sees every event from now on.
    pub fn subscribe(&self) -> EventStream {
        self.shared.bus.subscribe()
    }

    /// The event bus (for components built on the supervisor).
    pub fn bus(&self) -> &Arc<Bus> {
        &self.shared.bus
    }

    /// Registers a task and starts it. The returned waiter resolves to the
    /// final outcome; dropping it is fire-and-forget. A refused registration
    /// resolves at once to Rejected (AlreadyExists, ResourceLimit,
    /// ShuttingDown).
    pub fn add(&self, spec: TaskSpec) -> TaskWaiter {
        let id = self.next_id();
        self.add_with_id(id, spec)
    }

    /// Like [`Supervisor::add`], with an id from [`Supervisor::next_id`].
    pub fn add_with_id(&self, id: u64, spec: TaskSpec) -> TaskWaiter {
        let cell = Arc::new(OutcomeCell::new());
        let waiter = cell.waiter(id);
        let _ = self.admit(id, spec, cell, None);
        waiter
    }

    /// Registers and starts a task whose outcome goes to `cell`; `on_gone`
    /// runs in the task's actor after its physical completion (after
    /// TaskRemoved). A refused registration resolves `cell` to Rejected and
    /// never calls `on_gone`.
    pub(crate) fn admit(
        &self,
        id: u64,
        spec: TaskSpec,
        cell: Arc<OutcomeCell>,
        on_gone: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> Result<(), RejectionKind> {
        let shared = &self.shared;
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let slot: Arc<str> = spec
            .slot
            .as_deref()
            .map_or_else(|| Arc::clone(&name), Arc::from);
        shared.publish(Event::new(EventKind::TaskAddRequested).task(id, &name, &slot));
        let entry = Arc::new(TaskEntry::new(
            id,
            Arc::clone(&name),
            Arc::clone(&slot),
            cell,
        ));
        if let Err(err) = shared
            .registry
            .register(&entry, shared.config.max_registered_tasks)
        {
            let (kind, reason) = match err {
                RegisterError::AlreadyExists => (
                    RejectionKind::AlreadyExists,
                    format!("a task named `{name}` is already registered"),
                ),
                RegisterError::Full => (
                    RejectionKind::ResourceLimit,
                    format!(
                        "the supervisor already holds its limit of {} tasks",
                        shared.config.max_registered_tasks
                    ),
                ),
                RegisterError::ShuttingDown => (
                    RejectionKind::ShuttingDown,
                    "the host is shutting down".to_owned(),
                ),
            };
            let outcome = TaskOutcome::Rejected { kind, reason };
            shared.publish(
                Event::new(EventKind::TaskAddFailed)
                    .task(id, &name, &slot)
                    .outcome(&outcome),
            );
            entry.outcome.set(TaskReport {
                id,
                name,
                slot,
                outcome,
                attempts: 0,
                history: Vec::new(),
            });
            return Err(kind);
        }
        shared.publish(Event::new(EventKind::TaskAdded).task(id, &name, &slot));
        let policies = spec.resolve(&shared.config.defaults);
        let actor = actor::Actor {
            shared: Arc::clone(shared),
            entry,
            body: spec.body,
            policies,
            on_gone,
        };
        // Everything the task's actor and runtime log carries its identity.
        let span =
            tracing::debug_span!("task", id, name = %actor.entry.name, slot = %actor.entry.slot);
        tokio::spawn(tracing::Instrument::instrument(actor.run(), span));
        Ok(())
    }

    /// Requests a stop (with the configured grace). True for the one caller
    /// that made the stop claim; false for repeat or concurrent callers, for
    /// unknown tasks, and for tasks whose outcome is already decided.
    pub fn remove(&self, target: impl Into<TaskRef>) -> bool {
        self.claim_stop(&target.into(), self.shared.config.grace)
            .is_some()
    }

    /// Like [`Supervisor::remove`], then waits for the task's logical end.
    pub async fn cancel(&self, target: impl Into<TaskRef>) -> bool {
        match self.claim_stop(&target.into(), self.shared.config.grace) {
            Some(waiter) => {
                waiter.wait().await;
                true
            }
            None => false,
        }
    }

    /// Like [`Supervisor::cancel`] with its own grace for this stop.
    pub async fn cancel_with_grace(&self, target: impl Into<TaskRef>, grace: Duration) -> bool {
        match self.claim_stop(&target.into(), grace) {
            Some(waiter) => {
                waiter.wait().await;
                true
            }
            None => false,
        }
    }

    /// Like [`Supervisor::cancel`], but waits at most `timeout` for the
    /// logical end. `Ok(true)`: this call made the stop claim and the task
    /// ended in time; `Ok(false)`: no claim (unknown, already stopping or
    /// decided); `Err`: the claim was made but the task has not ended yet
    /// (the stop goes on: it is force-aborted at its grace).
    pub async fn cancel_with_timeout(
        &self,
        target: impl Into<TaskRef>,
        timeout: Duration,
    ) -> Result<bool, CancelTimedOut> {
        match self.claim_stop(&target.into(), self.shared.config.grace) {
            Some(waiter) => {
                let id = waiter.id();
                tokio::time::timeout(timeout, waiter.wait())
                    .await
                    .map(|_| true)
                    .map_err(|_| CancelTimedOut { id, timeout })
            }
            None => Ok(false),
        }
    }

    fn claim_stop(&self, target: &TaskRef, grace: Duration) -> Option<TaskWaiter> {
        let entry = self.shared.registry.get(target)?;
        if entry.outcome.is_set() || !entry.claim() {
            return None;
        }
        self.shared
            .publish(Event::new(EventKind::TaskRemoveRequested).task(
                entry.id,
                &entry.name,
                &entry.slot,
            ));
        entry.request_stop(tokio::time::Instant::now() + grace);
        Some(entry.outcome.waiter(entry.id))
    }

    /// A waiter for a registered task.
    pub fn watch(&self, target: impl Into<TaskRef>) -> Option<TaskWaiter> {
        self.shared
            .registry
            .get(&target.into())
            .map(|e| e.outcome.waiter(e.id))
    }

    /// Resolves when the task is physically gone (immediately if unknown).
    pub async fn gone(&self, target: impl Into<TaskRef>) {
        if let Some(entry) = self.shared.registry.get(&target.into()) {
            entry.gone.cancelled().await;
        }
    }

    /// The registered tasks, by id.
    pub fn list(&self) -> Vec<TaskInfo> {
        self.shared.registry.list()
    }

    /// Whether a task with this name is registered (running, stopping, or
    /// force-aborted but still physically running).
    pub fn is_alive(&self, name: &str) -> bool {
        self.shared
            .registry
            .get(&TaskRef::Name(name.to_owned()))
            .is_some()
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.registry.is_closed()
    }

    /// Shuts down: stops admission, stops every task with `grace`,
    /// force-aborts what remains, waits until every task is physically
    /// gone, drains subscribers within their own deadline, and reports.
    /// Single-flight and terminal: concurrent and later callers get the same
    /// report.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.shared
            .shutdown
            .get_or_init(|| async {
                let shared = &self.shared;
                shared.publish(Event::new(EventKind::ShutdownRequested));
                let entries = shared.registry.close();
                let deadline = tokio::time::Instant::now() + grace;
                for entry in &entries {
                    entry.request_stop(deadline);
                }
                let mut stuck = Vec::new();
                for entry in &entries {
                    entry.gone.cancelled().await;
                    let forced = entry
                        .outcome
                        .waiter(entry.id)
                        .try_outcome()
                        .is_some_and(|o| o == TaskOutcome::ForceAborted);
                    if forced {
                        stuck.push(entry.name.to_string());
                    }
                }
                stuck.sort();
                let report = if stuck.is_empty() {
                    shared.publish(Event::new(EventKind::AllStoppedWithinGrace));
                    ShutdownReport::AllStopped
                } else {
                    shared.publish(Event::new(EventKind::GraceExceeded).reason(format!(
                        "force-aborted after the grace: {}",
                        stuck.join(", ")
                    )));
                    ShutdownReport::GraceExceeded { stuck }
                };
                self.drain_subscribers().await;
                report
            })
            .await
            .clone()
    }

    async fn drain_subscribers(&self) {
        self.shared.bus.close();
        let lanes: Vec<SubscriberLane> = std::mem::take(
            &mut *self
                .shared
                .subscribers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if lanes.is_empty() {
            return;
        }
        let deadline = std::time::Instant::now() + self.shared.config.drain_deadline;
        // Joining threads blocks: off the async workers.
        let _ = tokio::task::spawn_blocking(move || {
            for lane in lanes {
                lane.drain(deadline);
            }
        })
        .await;
    }
}
