//! The supervisor: registers tasks, runs each in its own actor with retries,
//! backoff, timeouts and a global concurrency limit, delivers exactly one
//! final outcome per task, publishes lifecycle events, and shuts down
//! gracefully with force-abort. It knows task bodies only through the
//! [`TaskBody`] trait: a WebAssembly plugin is one kind of body, a native
//! async closure ([`native`]) another. Admission by slot is the controller's
//! business (`crate::controller`), not this module's.
//!
//! | module | owns |
//! |---|---|
//! | `id` | [`TaskId`] and the [`Reservation`] a registration consumes |
//! | `body` | the [`TaskBody`] trait, [`AttemptContext`], native bodies |
//! | `spec` | what a task is: body, restart, backoff, timeout, retry budget |
//! | `backoff` | the delay before retry `i` |
//! | `permits` | the concurrency limit: the semaphore, its permits, parked attempts |
//! | `shares` | share groups: who gets a freed permit (by weight, then by priority and arrival), caps and permits held per group |
//! | `registry` | unique names, stop claims, per-task handles |
//! | `actor` | one task's life: attempts, decisions, stop and force-abort |
//! | `waiter` | reliable outcome delivery |
//! | `events` | the event vocabulary and the bounded bus |
//! | `subscribers` | callbacks on lanes of their own |
//!
//! ```
//! use std::time::Duration;
//! use taskhost_core::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let supervisor = Supervisor::builder().max_concurrent(4).build();
//! let waiter = supervisor.add(TaskSpec::once(
//!     "greet",
//!     native(|ctx| async move { Ok(format!("hello from attempt {}", ctx.attempt()).into_bytes()) }),
//! ));
//! let report = waiter.report().await;
//! assert_eq!(report.outcome, TaskOutcome::Completed { output: b"hello from attempt 1".to_vec() });
//! assert_eq!(supervisor.shutdown(Duration::from_secs(1)).await, ShutdownReport::AllStopped);
//! # }
//! ```

mod actor;
pub mod backoff;
mod body;
mod events;
pub(crate) mod id;
mod permits;
mod registry;
mod shares;
mod spec;
mod subscribers;
mod waiter;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::outcome::{RejectionKind, TaskOutcome};

pub use backoff::{BackoffError, BackoffPolicy, Jitter};
pub use body::{AfterTeardown, AttemptContext, NativeBody, RunFuture, TaskBody, Teardown, native};
pub use events::{BackoffSource, Event, EventKind, EventStream, Received};
pub use id::{Reservation, TaskId};
pub use registry::{TaskInfo, TaskRef};
pub use spec::{RestartPolicy, Resume, TaskDefaults, TaskError, TaskSpec};
pub use subscribers::{DEFAULT_DRAIN_DEADLINE, JsonLinesWriter, Subscriber, TracingBridge};
pub use waiter::{AttemptRecord, MAX_HISTORY, TaskReport, TaskWaiter};

pub(crate) use events::Bus;
pub(crate) use waiter::OutcomeCell;

use id::Ids;
use registry::{RegisterError, Registry, TaskEntry};
use subscribers::SubscriberLane;

/// Builds a [`Supervisor`]; every knob has a default.
pub struct SupervisorBuilder {
    max_concurrent: Option<usize>,
    max_registered_tasks: usize,
    grace: Duration,
    bus_capacity: usize,
    drain_deadline: Duration,
    defaults: TaskDefaults,
    subscribers: Vec<Box<dyn Subscriber>>,
    first_id: u64,
}

impl std::fmt::Debug for SupervisorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisorBuilder")
            .field("max_concurrent", &self.max_concurrent)
            .field("max_registered_tasks", &self.max_registered_tasks)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Default for SupervisorBuilder {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            max_registered_tasks: 100_000,
            grace: Duration::from_secs(60),
            bus_capacity: 4096,
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
            defaults: TaskDefaults::default(),
            subscribers: Vec::new(),
            first_id: 1,
        }
    }
}

impl SupervisorBuilder {
    /// Most attempts running at once (at least 1) [default: unlimited].
    /// Waiting for a permit or backing off holds none. Waiting attempts
    /// get permits by their task's share group ([`TaskSpec::with_share`]),
    /// the groups in turn by weight ([`Supervisor::set_share_weight`]),
    /// each up to its cap ([`Supervisor::set_share_limit`]); within a group
    /// by priority ([`TaskSpec::with_priority`]), highest first, and in the
    /// order they began to wait within one.
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = Some(n.max(1));
        self
    }

    /// Most tasks registered at once, including those still stopping
    /// [default: 100,000]. Over it, `add` resolves to Rejected ResourceLimit.
    pub fn max_registered_tasks(mut self, n: usize) -> Self {
        self.max_registered_tasks = n;
        self
    }

    /// How long a stopped task may take to end before it is force-aborted,
    /// for cancel and remove (shutdown takes its own) [default: 60 s].
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Undelivered events each reader (subscriber or [`EventStream`]) may
    /// hold before it drops the oldest [default: 4096].
    pub fn bus_capacity(mut self, n: usize) -> Self {
        self.bus_capacity = n.max(1);
        self
    }

    /// How long subscribers get to drain at shutdown [default: 2 s].
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    /// Policies for specs that leave them unset.
    pub fn defaults(mut self, defaults: TaskDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// Adds a subscriber: it gets every event on a bounded lane and a thread
    /// of its own.
    pub fn subscriber(mut self, subscriber: impl Subscriber) -> Self {
        self.subscribers.push(Box::new(subscriber));
        self
    }

    /// The first id this supervisor mints [default: 1]. A host that keeps
    /// tasks across restarts starts above every id it has handed out, and
    /// gets the earlier ones back with [`Supervisor::restore`].
    pub fn first_id(mut self, id: u64) -> Self {
        self.first_id = id.max(1);
        self
    }

    /// Builds the supervisor. Needs no runtime; tasks are spawned on the
    /// Tokio runtime of whoever adds them.
    pub fn build(self) -> Supervisor {
        let bus = Bus::new(self.bus_capacity);
        let lanes = self
            .subscribers
            .into_iter()
            .filter_map(|s| match SubscriberLane::start(&bus, s) {
                Ok(lane) => Some(lane),
                Err(err) => {
                    tracing::error!("cannot start a subscriber thread: {err}");
                    None
                }
            })
            .collect();
        let permits = self
            .max_concurrent
            .map(|n| Arc::new(permits::Permits::new(n)));
        Supervisor {
            shared: Arc::new(Shared {
                limits: Limits {
                    max_registered_tasks: self.max_registered_tasks,
                    grace: self.grace,
                    drain_deadline: self.drain_deadline,
                    max_concurrent: self.max_concurrent,
                },
                defaults: self.defaults,
                registry: Registry::default(),
                bus,
                permits,
                ids: Ids::starting_at(self.first_id),
                shutdown: OnceCell::new(),
                subscribers: Mutex::new(lanes),
            }),
        }
    }
}

/// A cancel whose task did not end within the caller's timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task {id} did not end within {timeout:?} of the cancel; it is still stopping")]
pub struct CancelTimedOut {
    /// The task.
    pub id: TaskId,
    /// The caller's timeout.
    pub timeout: Duration,
}

/// How shutdown went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ShutdownReport {
    /// Every task ended within the grace.
    AllStopped,
    /// These tasks did not end within the grace and were force-aborted.
    GraceExceeded {
        /// Their names, sorted.
        stuck: Vec<String>,
    },
}

struct Limits {
    max_registered_tasks: usize,
    grace: Duration,
    drain_deadline: Duration,
    max_concurrent: Option<usize>,
}

/// State shared by the handle and every actor.
pub(crate) struct Shared {
    limits: Limits,
    defaults: TaskDefaults,
    registry: Registry,
    bus: Arc<Bus>,
    permits: Option<Arc<permits::Permits>>,
    ids: Ids,
    shutdown: OnceCell<ShutdownReport>,
    subscribers: Mutex<Vec<SubscriberLane>>,
}

impl Shared {
    fn publish(&self, event: Event) {
        self.bus.publish(event);
    }
}

/// A handle to a supervisor; cheap to clone. Tasks are spawned on the Tokio
/// runtime of the caller of `add`.
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

impl Default for Supervisor {
    fn default() -> Self {
        Self::builder().build()
    }
}

impl Supervisor {
    /// A builder with every default.
    pub fn builder() -> SupervisorBuilder {
        SupervisorBuilder::default()
    }

    /// Mints the id of a task to register later with
    /// [`Supervisor::add_reserved`] (or `Controller::submit_reserved`), for
    /// callers that need the id first (to name the task after it).
    pub fn reserve(&self) -> Reservation {
        self.shared.ids.reserve()
    }

    /// A reservation for an id an earlier run of the host handed out (below
    /// [`SupervisorBuilder::first_id`]), so that recovered work keeps its id.
    /// `None` for any other id, and for an id already restored.
    pub fn restore(&self, id: TaskId) -> Option<Reservation> {
        self.shared.ids.restore(id)
    }

    /// A reservation for an id minted outside this supervisor (a cluster's
    /// database hands out every id). The registry still refuses an id that
    /// is registered, so no entry can be overwritten.
    pub fn adopt(&self, id: TaskId) -> Reservation {
        self.shared.ids.adopt(id)
    }

    /// Stops a registered task at once, whatever stop was requested before
    /// (its grace is cut to zero): for attempts that must not go on, such
    /// as those of a cluster node that lost its lease. False if unknown.
    pub fn abort_now(&self, target: impl Into<TaskRef>) -> bool {
        let Some(entry) = self.shared.registry.get(&target.into()) else {
            return false;
        };
        if entry.claim() {
            self.shared
                .publish(Event::new(EventKind::TaskRemoveRequested).task(
                    entry.id,
                    &entry.name,
                    &entry.slot,
                ));
        }
        entry.request_stop(tokio::time::Instant::now());
        true
    }

    /// A new reader of every event from now on.
    pub fn subscribe(&self) -> EventStream {
        self.shared.bus.subscribe()
    }

    /// A reader of every event from now on with a lane of its own, holding
    /// up to `capacity` unread events and taking memory only for those it
    /// holds: for one reader that must see bursts whole (a terminal's
    /// printer) without a bus that deep for every reader. When full, the
    /// newest events are lost and the lane says how many.
    pub fn subscribe_deep(&self, capacity: usize) -> EventStream {
        self.shared.bus.subscribe_deep(capacity)
    }

    /// Calls `observer` with every event published from now on,
    /// synchronously: on the thread that publishes it, in seq order, while
    /// the bus is locked. For a quick record of events (an in-memory
    /// history, a counter) that must not wake a reader task per event, as
    /// [`Supervisor::subscribe`] does. It must be quick, and must not call
    /// this supervisor (publishing from it would deadlock). One that panics
    /// is removed; the supervisor goes on.
    pub fn observe(&self, observer: impl Fn(&Arc<Event>) + Send + Sync + 'static) {
        self.shared.bus.observe(observer);
    }

    /// Like [`Supervisor::subscribe`], with the seq of the last event
    /// published before the reader existed: it gets exactly the events after.
    pub fn subscribe_after(&self) -> (EventStream, u64) {
        self.shared.bus.subscribe_after()
    }

    pub(crate) fn bus(&self) -> &Arc<Bus> {
        &self.shared.bus
    }

    /// Publishes an event of the host's own (a recovery, a takeover) on the
    /// bus, as the supervisor's own events are: stamped with the next seq,
    /// dropped for a full lane, never blocking.
    pub fn publish(&self, event: Event) {
        self.shared.bus.publish(event);
    }

    /// Registers a task and starts it. The returned waiter resolves to the
    /// final outcome; dropping it is fire-and-forget. A refused registration
    /// resolves at once to Rejected (AlreadyExists, ResourceLimit,
    /// ShuttingDown).
    pub fn add(&self, spec: TaskSpec) -> TaskWaiter {
        self.add_reserved(self.reserve(), spec)
    }

    /// Like [`Supervisor::add`], with an id reserved before.
    pub fn add_reserved(&self, reservation: Reservation, spec: TaskSpec) -> TaskWaiter {
        let cell = Arc::new(OutcomeCell::new(reservation.id()));
        let waiter = cell.waiter(reservation.id());
        let _ = self.admit(reservation, spec, cell, None);
        waiter
    }

    /// Registers and starts a task whose outcome goes to `cell`; `on_gone`
    /// runs in the task's actor after its physical completion (after
    /// TaskRemoved). A refused registration resolves `cell` to Rejected and
    /// never calls `on_gone`.
    pub(crate) fn admit(
        &self,
        reservation: Reservation,
        spec: TaskSpec,
        cell: Arc<OutcomeCell>,
        on_gone: Option<Box<dyn FnOnce() + Send + Sync>>,
    ) -> Result<(), RejectionKind> {
        let shared = &self.shared;
        let id = reservation.id();
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let slot: Arc<str> = spec
            .slot
            .as_deref()
            .map_or_else(|| Arc::clone(&name), Arc::from);
        let schedule = spec.schedule.clone();
        let parent = spec.parent;
        shared.publish(
            Event::new(EventKind::TaskAddRequested)
                .task(id, &name, &slot)
                .schedule(schedule.as_ref())
                .parent(parent),
        );
        let mut entry = TaskEntry::new(
            id,
            Arc::clone(&name),
            Arc::clone(&slot),
            Arc::clone(&spec.body),
            cell,
        );
        entry.schedule = schedule.clone();
        entry.parent = parent;
        let entry = Arc::new(entry);
        entry.attempts_before(spec.resume.attempts);
        let registered = if reservation.issuer() == shared.ids.issuer() {
            shared
                .registry
                .register(&entry, shared.limits.max_registered_tasks)
        } else {
            Err(RegisterError::IdTaken)
        };
        if let Err(err) = registered {
            let (kind, reason) = match err {
                RegisterError::AlreadyExists => (
                    RejectionKind::AlreadyExists,
                    format!("a task named `{name}` is already registered"),
                ),
                RegisterError::IdTaken => (
                    RejectionKind::AdmissionFailed,
                    format!("id {id} was not reserved from this supervisor or is in use"),
                ),
                RegisterError::Full => (
                    RejectionKind::ResourceLimit,
                    format!(
                        "the supervisor already holds its limit of {} tasks",
                        shared.limits.max_registered_tasks
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
                    .schedule(schedule.as_ref())
                    .parent(parent)
                    .outcome(&outcome),
            );
            entry
                .outcome
                .set(TaskReport::never_ran(id, name, slot, outcome));
            return Err(kind);
        }
        shared.publish(
            Event::new(EventKind::TaskAdded)
                .task(id, &name, &slot)
                .schedule(schedule.as_ref())
                .parent(parent),
        );
        let policies = spec.resolve(&shared.defaults);
        let actor = actor::Actor {
            shared: Arc::clone(shared),
            entry,
            body: spec.body,
            policies,
            on_gone,
        };
        // Everything the task's actor and its body log carries its identity;
        // with an OpenTelemetry layer installed (`host serve --otlp`) the
        // span is the task's trace, its own root. The field values are only
        // computed when the span is enabled.
        let span = tracing::debug_span!(
            parent: None,
            "task",
            task.id = id.get(),
            task.name = %actor.entry.name,
            task.slot = %actor.entry.slot,
            plugin.digest = actor.body.code_digest(),
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        tokio::spawn(tracing::Instrument::instrument(actor.run(), span));
        Ok(())
    }

    /// Requests a stop (with the configured grace). True for the one caller
    /// that made the stop claim; false for repeat or concurrent callers, for
    /// unknown tasks, and for tasks whose outcome is already decided.
    pub fn remove(&self, target: impl Into<TaskRef>) -> bool {
        self.claim_stop(&target.into(), self.shared.limits.grace)
            .is_some()
    }

    /// Like [`Supervisor::remove`], then waits for the task's logical end.
    pub async fn cancel(&self, target: impl Into<TaskRef>) -> bool {
        self.cancel_with_grace(target, self.shared.limits.grace)
            .await
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
        match self.claim_stop(&target.into(), self.shared.limits.grace) {
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
        let _no_starts = self.shared.permits.as_ref().map(|p| p.no_starts());
        self.shared.registry.list()
    }

    /// The registered task with this id or name, if any.
    pub fn info(&self, target: impl Into<TaskRef>) -> Option<TaskInfo> {
        self.shared.registry.get(&target.into()).map(|e| e.info())
    }

    /// Whether a task with this name is registered (running, stopping, or
    /// force-aborted but still physically running).
    pub fn is_alive(&self, name: &str) -> bool {
        self.shared
            .registry
            .get(&TaskRef::Name(name.to_owned()))
            .is_some()
    }

    /// Concurrency permits free right now (`None`: no limit). A hint: the
    /// next attempt to start may take the last one.
    pub fn free_permits(&self) -> Option<usize> {
        self.shared.permits.as_ref().map(|p| p.available())
    }

    /// Attempts parked right now: their permit given back while their body
    /// waits ([`AttemptContext::park`]).
    pub fn parked(&self) -> usize {
        self.shared.permits.as_ref().map_or(0, |p| p.parked())
    }

    /// Attempts that may run at once (`None`: no limit).
    pub fn max_concurrent(&self) -> Option<usize> {
        self.shared.limits.max_concurrent
    }

    /// Sets the weight of share group `group` ([`TaskSpec::with_share`];
    /// `None` is the default group) [default: 1; 0 counts as 1]. While
    /// attempts wait for a concurrency permit, the groups with waiting
    /// attempts get permits in turn, each in proportion to its weight. A
    /// group that starts to wait starts level with the groups already
    /// waiting, so time spent idle earns it no burst of permits later. It
    /// applies from the next permit handed out; without a concurrency
    /// limit it does nothing.
    pub fn set_share_weight(&self, group: Option<&str>, weight: u32) {
        if let Some(permits) = &self.shared.permits {
            permits.set_weight(group, weight);
        }
    }

    /// Caps the concurrency permits held at once by the attempts of share
    /// group `group` ([`TaskSpec::with_share`]; `None` is the default
    /// group) at `limit` [default: `None`, no cap]. Attempts over it wait,
    /// shown `Waiting` and holding nothing, until one of the group's
    /// permits comes back; meanwhile free permits go to the other groups.
    /// `Some(0)` lets none of the group's attempts start (they wait until
    /// the cap is raised). A raised or removed cap hands free permits to
    /// the group's waiters at once; a lowered one takes no permit back:
    /// the group holds more than it until enough attempts end. A parked
    /// attempt ([`AttemptContext::park`]) holds no permit, so it does not
    /// count. Without a concurrency limit it does nothing.
    pub fn set_share_limit(&self, group: Option<&str>, limit: Option<usize>) {
        if let Some(permits) = &self.shared.permits {
            permits.set_limit(group, limit);
        }
    }

    /// Concurrency permits held right now by the attempts of share group
    /// `group` (`None` is the default group): its attempts running now,
    /// parked ones aside (an attempt holds its permit until its end is
    /// published, and through its teardown). 0 without a concurrency limit.
    pub fn share_running(&self, group: Option<&str>) -> usize {
        self.shared
            .permits
            .as_ref()
            .map_or(0, |permits| permits.running(group))
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.registry.is_closed()
    }

    /// Shuts down: stops admission, stops every task with `grace`,
    /// force-aborts what remains, waits until every task is physically
    /// gone, drains subscribers within their own deadline, and reports.
    /// Single-flight and terminal: concurrent and later callers get the same
    /// report. A task whose outcome was decided before the shutdown (one an
    /// earlier cancel force-aborted) is waited for but is not "stuck".
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.shared
            .shutdown
            .get_or_init(|| async {
                let shared = &self.shared;
                shared.publish(Event::new(EventKind::ShutdownRequested));
                let entries = shared.registry.close();
                let deadline = tokio::time::Instant::now() + grace;
                let undecided: Vec<bool> = entries.iter().map(|e| !e.outcome.is_set()).collect();
                for entry in &entries {
                    entry.request_stop(deadline);
                }
                let mut stuck = Vec::new();
                for (entry, undecided) in entries.iter().zip(undecided) {
                    entry.gone.cancelled().await;
                    let forced = entry
                        .outcome
                        .waiter(entry.id)
                        .try_outcome()
                        .is_some_and(|o| o == TaskOutcome::ForceAborted);
                    if forced && undecided {
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
        let deadline = std::time::Instant::now() + self.shared.limits.drain_deadline;
        // Joining threads blocks: off the async workers.
        let _ = tokio::task::spawn_blocking(move || {
            for lane in lanes {
                lane.drain(deadline);
            }
        })
        .await;
    }
}
