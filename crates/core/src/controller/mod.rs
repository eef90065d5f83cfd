//! The keyed admission controller (docs/semantics.md): each slot has at most one
//! owner (or its capacity's number, [`SlotRules`]) from admission until
//! physical completion; a full slot queues, replaces or rejects new work
//! according to the submission's policy; every queue is bounded. It decides *when* a task may enter the supervisor;
//! everything after admission is the supervisor's business.
//!
//! Intake is synchronous: a submission is placed (admitted, queued or
//! rejected) under one lock before `submit` returns, so there is no command
//! queue to bound; the slot queues and the slot table are bounded (see
//! [`ControllerBuilder`]).
//!
//! ```
//! use std::time::Duration;
//! use taskhost_core::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let controller = Controller::builder(Supervisor::default()).max_slot_queue(10).build();
//! let job = |n: u32| native(move |_ctx| async move { Ok(n.to_string().into_bytes()) });
//! let first = controller.submit(Submission::new(TaskSpec::once("a", job(1)).with_slot("db")));
//! let second = controller.submit(Submission::new(TaskSpec::once("b", job(2)).with_slot("db")));
//! // "b" waits in the queue of slot `db` until "a" is physically gone.
//! assert_eq!(first.wait().await, TaskOutcome::Completed { output: b"1".to_vec() });
//! assert_eq!(second.wait().await, TaskOutcome::Completed { output: b"2".to_vec() });
//! controller.shutdown(Duration::from_secs(1)).await;
//! # }
//! ```
//!
//! | module | owns |
//! |---|---|
//! | `delayed` | submissions held until their due time: the bound, the one timer task, placing them when due |
//! | `views` | what the controller shows: slot views, queued and delayed submissions |
//! | `rules` | the operator's slot rules as it holds them, and rate-limited slots' budgets of starts |

mod delayed;
mod rules;
mod views;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::admission::{self, Decision, Limits, SlotSummary, Totals};
pub use crate::admission::{AdmissionPolicy, SlotState, SlotView};
pub use crate::lifecycle::Placement;
use crate::outcome::{RejectionKind, TaskOutcome};
use crate::slot_settings::{SlotRules, SlotSettings, StartBudget};
use crate::supervisor::{
    Event, EventKind, OutcomeCell, Reservation, ShutdownReport, Supervisor, TaskId, TaskRef,
    TaskReport, TaskSpec, TaskWaiter,
};
use delayed::Delayed;
pub use views::QueuedView;

/// Who a submission that never ran was: id, name, slot, schedule and parent.
type Who<'a> = (
    TaskId,
    &'a Arc<str>,
    &'a Arc<str>,
    Option<&'a Arc<str>>,
    Option<TaskId>,
);
/// Builds a [`Controller`]; every bound has a default.
#[derive(Debug)]
pub struct ControllerBuilder {
    supervisor: Supervisor,
    limits: Limits,
    max_delayed: usize,
}

impl ControllerBuilder {
    /// Pending submissions behind one owner, counting a replacement head
    /// [default: 100]. Over it, Queue submissions are Rejected QueueFull.
    pub fn max_slot_queue(mut self, n: usize) -> Self {
        self.limits.max_slot_queue = n;
        self
    }

    /// Pending submissions over all slots [default: 10,000]. Over it,
    /// submissions are Rejected ResourceLimit.
    pub fn max_total_pending(mut self, n: usize) -> Self {
        self.limits.max_total_pending = n;
        self
    }

    /// Slots tracked at once, owned or with a queue [default: 10,000].
    pub fn max_slots(mut self, n: usize) -> Self {
        self.limits.max_slots = n;
        self
    }

    /// Delayed submissions waiting for their due time at once [default:
    /// 100,000]. Over it, delayed submissions are Rejected ResourceLimit.
    pub fn max_delayed(mut self, n: usize) -> Self {
        self.max_delayed = n;
        self
    }

    /// Builds the controller.
    pub fn build(self) -> Controller {
        Controller {
            inner: Arc::new(Inner {
                supervisor: self.supervisor,
                config: self.limits,
                max_delayed: self.max_delayed,
                state: Mutex::new(State::default()),
                due: Arc::new(Notify::new()),
            }),
        }
    }
}

/// The default of [`ControllerBuilder::max_delayed`].
pub const DEFAULT_MAX_DELAYED: usize = 100_000;

/// One submission: a task and the policy for a busy slot. The slot is the
/// spec's slot ([`TaskSpec::with_slot`]), else its name.
#[derive(Debug, Clone)]
pub struct Submission {
    spec: TaskSpec,
    policy: AdmissionPolicy,
    not_before: Option<tokio::time::Instant>,
}

impl Submission {
    /// A submission with the Queue policy.
    pub fn new(spec: TaskSpec) -> Self {
        Self {
            spec,
            policy: AdmissionPolicy::Queue,
            not_before: None,
        }
    }

    /// Sets the policy for a busy slot.
    pub fn policy(mut self, policy: AdmissionPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Holds the submission until `due`: it is accepted now (it has its id,
    /// `remove` and `cancel` take it out, shutdown rejects it), and placed
    /// at `due` as if it were submitted then, by its policy against the
    /// slot as it is then. A time already past places it at once. Its
    /// first attempt's start is measured from `due`.
    pub fn not_before(mut self, due: tokio::time::Instant) -> Self {
        self.not_before = Some(due);
        self
    }

    /// The task.
    pub fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    /// The policy for a busy slot.
    pub fn admission_policy(&self) -> AdmissionPolicy {
        self.policy
    }

    /// The slot it asks for.
    pub fn slot(&self) -> &str {
        self.spec.slot().unwrap_or(self.spec.name())
    }
}

struct Pending {
    reservation: Reservation,
    spec: TaskSpec,
    cell: Arc<OutcomeCell>,
    since: Instant,
}

impl Pending {
    fn id(&self) -> TaskId {
        self.reservation.id()
    }
}

/// One owner of a slot, in its state (`Admitting`, `Running` or
/// `Terminating`).
struct Owner {
    id: TaskId,
    state: SlotState,
}

struct Slot {
    /// Oldest first; one inline, so a slot of one owner allocates none.
    owners: SmallVec<[Owner; 1]>,
    /// The operator's settings for it, read when it was tracked and again
    /// when they change.
    settings: SlotSettings,
    /// The capacity its latest submission's plugin declared (what counts
    /// when the settings set none).
    declared: Option<u32>,
    since: Instant,
    queue: VecDeque<Pending>,
}

impl Slot {
    fn new(settings: SlotSettings, declared: Option<u32>) -> Self {
        Self {
            owners: SmallVec::new(),
            settings,
            declared,
            since: Instant::now(),
            queue: VecDeque::new(),
        }
    }

    /// How many owners it may hold: the operator's rule, else what its
    /// latest submission's plugin declared, else 1.
    fn capacity(&self) -> usize {
        self.settings
            .capacity
            .or(self.declared)
            .map_or(1, |c| c as usize)
    }

    /// Its oldest owner.
    fn first_owner(&self) -> Option<TaskId> {
        self.owners.first().map(|o| o.id)
    }

    fn has_room(&self) -> bool {
        self.owners.len() < self.capacity()
    }
}

#[derive(Default)]
struct State {
    slots: HashMap<Arc<str>, Slot, foldhash::fast::RandomState>,
    /// Queued id -> slot key.
    queued: HashMap<TaskId, Arc<str>, foldhash::fast::RandomState>,
    /// Owner id -> slot key.
    owners: HashMap<TaskId, Arc<str>, foldhash::fast::RandomState>,
    pending: usize,
    closed: bool,
    /// Delayed submissions by due time.
    delayed: BTreeMap<(tokio::time::Instant, TaskId), Delayed>,
    /// Delayed id -> its due time.
    delayed_at: HashMap<TaskId, tokio::time::Instant, foldhash::fast::RandomState>,
    /// Whether the task that places delayed submissions when due runs.
    timer: bool,
    /// Rate-limited slots' budgets of starts, kept while the slot is
    /// forgotten (a slot tracked again must not start with a full one).
    budgets: HashMap<Arc<str>, Arc<StartBudget>, foldhash::fast::RandomState>,
    /// Since when rates are held for a period (`hold_rates`).
    rates_held_from: Option<tokio::time::Instant>,
    /// Rate-limited slots' latest starts before a restart
    /// (`hold_slot_rates`).
    last_starts: HashMap<Arc<str>, tokio::time::Instant, foldhash::fast::RandomState>,
    /// Slots whose debounce holds a submission: the one held, and when the
    /// run of superseding submissions it ends began.
    debouncing: HashMap<Arc<str>, (TaskId, tokio::time::Instant), foldhash::fast::RandomState>,
    /// The operator's settings of slots.
    rules: SlotRules,
}

struct Inner {
    supervisor: Supervisor,
    config: Limits,
    max_delayed: usize,
    state: Mutex<State>,
    /// Told when a delayed submission is due sooner than the timer knew.
    due: Arc<Notify>,
}

/// The controller; cheap to clone.
#[derive(Clone)]
pub struct Controller {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").finish_non_exhaustive()
    }
}

impl Controller {
    /// A builder for a controller admitting into `supervisor`.
    pub fn builder(supervisor: Supervisor) -> ControllerBuilder {
        ControllerBuilder {
            supervisor,
            limits: Limits::default(),
            max_delayed: DEFAULT_MAX_DELAYED,
        }
    }

    /// The supervisor behind the controller.
    pub fn supervisor(&self) -> &Supervisor {
        &self.inner.supervisor
    }

    /// Takes a submission in: admits it (idle slot), queues it, makes it
    /// the replacement head, or rejects it. Returns once it is placed; the
    /// waiter resolves to Rejected or to the task's final outcome.
    pub fn submit(&self, submission: Submission) -> TaskWaiter {
        self.submit_reserved(self.inner.supervisor.reserve(), submission)
    }

    /// Like [`Controller::submit`] with an id reserved before
    /// ([`Supervisor::reserve`]).
    pub fn submit_reserved(&self, reservation: Reservation, submission: Submission) -> TaskWaiter {
        self.submit_placed(reservation, submission).0
    }

    /// Like [`Controller::submit_reserved`], and says where the submission
    /// went.
    pub fn submit_placed(
        &self,
        reservation: Reservation,
        submission: Submission,
    ) -> (TaskWaiter, Placement) {
        let Submission {
            mut spec,
            policy,
            not_before,
        } = submission;
        let schedule = spec.schedule_name().cloned();
        let parent = spec.parent_id();
        let id = reservation.id();
        let name: Arc<str> = Arc::from(spec.name());
        let slot: Arc<str> = Arc::from(spec.slot().unwrap_or(spec.name()));
        let cell = Arc::new(OutcomeCell::new(id));
        let waiter = cell.waiter(id);
        let mut event = Event::new(EventKind::ControllerSubmitted)
            .task(id, &name, &slot)
            .schedule(schedule.as_ref())
            .parent(parent);
        event.detail = Some(policy.to_string());
        self.inner.supervisor.bus().publish(event);

        let now = tokio::time::Instant::now();
        let mut state = self.lock();
        // A submission of its own time waits for it; else its slot's
        // debounce may hold it (and end the one it held before).
        let (due, superseded) = match not_before.filter(|due| *due > now) {
            Some(due) => (Some(due), None),
            None => self.debounce(&mut state, &slot, id, now),
        };
        if let Some(due) = not_before.or(due) {
            spec = spec.due(due);
        }
        let pending = Pending {
            reservation,
            spec,
            cell: Arc::clone(&cell),
            since: Instant::now(),
        };
        let placed = match due {
            Some(due) => self.hold(&mut state, due, pending, policy, &name, &slot),
            None => self.place(&mut state, pending, policy, &slot),
        };
        drop(state);
        if let Some(old) = superseded {
            let why =
                format!("debounced: a newer submission ({id}) to slot `{slot}` took its place");
            self.reject_delayed(&old, RejectionKind::SupersededByReplace, why);
        }
        let placed = match placed {
            Ok(Some(placed)) => placed,
            // Registration failed: the waiter holds the Rejected.
            Ok(None) => {
                Placement::Rejected(waiter.try_outcome().unwrap_or(TaskOutcome::Panicked {
                    reason: "a refused registration left no outcome (host bug)".into(),
                }))
            }
            Err((kind, reason)) => {
                self.resolve_rejected(
                    (id, &name, &slot, schedule.as_ref(), parent),
                    &cell,
                    kind,
                    reason.clone(),
                );
                Placement::Rejected(TaskOutcome::Rejected { kind, reason })
            }
        };
        (waiter, placed)
    }

    /// Decides a submission against its slot as it is now and carries the
    /// decision out.
    fn place(
        &self,
        state: &mut State,
        pending: Pending,
        policy: AdmissionPolicy,
        slot: &Arc<str>,
    ) -> Result<Option<Placement>, (RejectionKind, String)> {
        let (summary, owner, max_queue) = match state.slots.get_mut(slot) {
            None => (SlotSummary::IDLE, None, None),
            Some(s) => (
                SlotSummary {
                    owners: s.owners.len(),
                    capacity: {
                        s.declared = pending.spec.declared_capacity;
                        s.capacity()
                    },
                    oldest_running: s
                        .owners
                        .iter()
                        .find(|o| o.state != SlotState::Terminating)
                        .map(|o| o.id),
                    queued: s.queue.len(),
                    head: s.queue.front().map(Pending::id),
                    tracked: true,
                },
                s.first_owner(),
                s.settings.max_queue,
            ),
        };
        let totals = Totals {
            pending: state.pending,
            slots: state.slots.len(),
        };
        let own_bound;
        let limits = match max_queue {
            Some(max_slot_queue) => {
                own_bound = Limits {
                    max_slot_queue,
                    queue_bound: "max_queue of its slot rule",
                    ..self.inner.config.clone()
                };
                &own_bound
            }
            None => &self.inner.config,
        };
        let decision = admission::decide(slot, &summary, policy, totals, limits, state.closed);
        self.apply(state, slot, owner, decision, pending)
    }

    /// Carries out an admission decision on the slot table.
    fn apply(
        &self,
        state: &mut State,
        slot_key: &Arc<str>,
        owner: Option<TaskId>,
        decision: Decision,
        pending: Pending,
    ) -> Result<Option<Placement>, (RejectionKind, String)> {
        let id = pending.id();
        match decision {
            Decision::Reject { kind, reason } => Err((kind, reason)),
            Decision::Admit => Ok(self
                .admit(state, slot_key, pending)
                .then_some(Placement::Running)),
            Decision::Enqueue => {
                let Some(slot) = state.slots.get_mut(slot_key) else {
                    return Err(vanished());
                };
                slot.queue.push_back(pending);
                state.pending += 1;
                state.queued.insert(id, Arc::clone(slot_key));
                Ok(Some(Placement::Queued { owner }))
            }
            Decision::Replace { displaced, stop } => {
                let Some(slot) = state.slots.get_mut(slot_key) else {
                    return Err(vanished());
                };
                let old = displaced.and_then(|_| slot.queue.pop_front());
                slot.queue.push_front(pending);
                if let Some(stop) = stop {
                    self.transition(
                        slot_key,
                        slot,
                        stop,
                        SlotState::Terminating,
                        "replaced by a newer submission",
                    );
                }
                state.queued.insert(id, Arc::clone(slot_key));
                match old {
                    Some(old) => {
                        state.queued.remove(&old.id());
                        let name: Arc<str> = Arc::from(old.spec.name());
                        self.resolve_rejected(
                            (
                                old.id(),
                                &name,
                                slot_key,
                                old.spec.schedule_name(),
                                old.spec.parent_id(),
                            ),
                            &old.cell,
                            RejectionKind::SupersededByReplace,
                            format!("a newer Replace submission ({id}) took its place"),
                        );
                    }
                    None => state.pending += 1,
                }
                Ok(Some(match stop {
                    Some(owner) => {
                        let name = self
                            .inner
                            .supervisor
                            .info(owner)
                            .map(|info| info.name)
                            .unwrap_or_default();
                        self.inner.supervisor.remove(owner);
                        Placement::Replacing { owner, name }
                    }
                    None => Placement::Queued { owner },
                }))
            }
        }
    }

    /// Makes `pending` the owner of `slot_key` and registers it; false if
    /// the supervisor refused it (its waiter then holds the Rejected).
    fn admit(&self, state: &mut State, slot_key: &Arc<str>, pending: Pending) -> bool {
        let settings = match state.slots.get(slot_key) {
            Some(slot) => slot.settings,
            None => state.rules.for_slot(slot_key),
        };
        let declared = pending.spec.declared_capacity;
        let spec = match Self::budget(state, slot_key, settings) {
            Some(budget) => pending.spec.with_start_budget(budget),
            None => pending.spec,
        };
        let slot = state
            .slots
            .entry(Arc::clone(slot_key))
            .or_insert_with(|| Slot::new(settings, declared));
        let id = pending.reservation.id();
        slot.owners.push(Owner {
            id,
            state: SlotState::Idle,
        });
        self.transition(slot_key, slot, id, SlotState::Admitting, "admitted");
        let controller = self.clone();
        let key = Arc::clone(slot_key);
        let on_gone: Box<dyn FnOnce() + Send + Sync> =
            Box::new(move || controller.owner_gone(&key, id));
        match self
            .inner
            .supervisor
            .admit(pending.reservation, spec, pending.cell, Some(on_gone))
        {
            Ok(()) => {
                state.owners.insert(id, Arc::clone(slot_key));
                if let Some(slot) = state.slots.get_mut(slot_key) {
                    self.transition(slot_key, slot, id, SlotState::Running, "registered");
                }
                true
            }
            Err(_) => {
                // The waiter already holds the Rejected outcome; the slot
                // moves on at once.
                self.release(state, slot_key, id, "registration failed");
                false
            }
        }
    }

    /// Called by the owner's actor once it is physically gone.
    fn owner_gone(&self, slot_key: &Arc<str>, id: TaskId) {
        let mut state = self.lock();
        state.owners.remove(&id);
        self.release(&mut state, slot_key, id, "owner physically completed");
    }

    /// Frees owner `id`'s place in a slot and admits its queue's heads
    /// while it has room (unless closed); forgets a slot left with no
    /// owner and no queue.
    fn release(&self, state: &mut State, slot_key: &Arc<str>, id: TaskId, why: &str) {
        let Some(slot) = state.slots.get_mut(slot_key) else {
            return;
        };
        if !slot.owners.iter().any(|o| o.id == id) {
            return;
        }
        self.transition(slot_key, slot, id, SlotState::Idle, why);
        if !state.closed {
            self.fill(state, slot_key);
        }
    }

    /// Admits a slot's queue heads while it has room; forgets it when it has
    /// no owner and no queue.
    fn fill(&self, state: &mut State, slot_key: &Arc<str>) {
        loop {
            let Some(slot) = state.slots.get_mut(slot_key) else {
                return;
            };
            if !slot.has_room() {
                return;
            }
            let Some(next) = slot.queue.pop_front() else {
                if slot.owners.is_empty() {
                    state.slots.remove(slot_key);
                }
                return;
            };
            state.pending -= 1;
            state.queued.remove(&next.id());
            self.admit(state, slot_key, next);
        }
    }

    /// Moves owner `id` of a slot to `to` (to `Idle`: out of the slot) and
    /// says so in an event.
    fn transition(&self, key: &Arc<str>, slot: &mut Slot, id: TaskId, to: SlotState, why: &str) {
        let Some(at) = slot.owners.iter().position(|o| o.id == id) else {
            return;
        };
        let from = slot.owners[at].state;
        if to == SlotState::Idle {
            slot.owners.remove(at);
        } else {
            slot.owners[at].state = to;
        }
        slot.since = Instant::now();
        let mut event = Event::new(EventKind::ControllerSlotTransition).reason(why);
        event.slot = Some(Arc::clone(key));
        event.task_id = (to != SlotState::Idle).then_some(id);
        let mut detail = String::with_capacity(24);
        detail.push_str(from.as_str());
        detail.push_str("->");
        detail.push_str(to.as_str());
        event.detail = Some(detail);
        self.inner.supervisor.bus().publish(event);
    }

    /// Ends a submission that never ran: `who` is its id, name, slot,
    /// schedule and parent.
    fn resolve_rejected(
        &self,
        (id, name, slot, schedule, parent): Who<'_>,
        cell: &OutcomeCell,
        kind: RejectionKind,
        reason: String,
    ) {
        let outcome = TaskOutcome::Rejected { kind, reason };
        self.inner.supervisor.bus().publish(
            Event::new(EventKind::ControllerRejected)
                .task(id, name, slot)
                .schedule(schedule)
                .parent(parent)
                .outcome(&outcome),
        );
        cell.set(TaskReport::never_ran(
            id,
            Arc::clone(name),
            Arc::clone(slot),
            outcome,
        ));
    }

    /// Removes queued work (it ends Rejected RemovedFromQueue) or asks a
    /// registered task to stop. True for the one caller that made the claim.
    pub fn remove(&self, target: impl Into<TaskRef>) -> bool {
        let target = target.into();
        if self.remove_queued(&target) {
            return true;
        }
        self.mark_terminating(&target);
        self.inner.supervisor.remove(target)
    }

    /// Like [`Controller::remove`], then waits for the logical end of a
    /// registered task.
    pub async fn cancel(&self, target: impl Into<TaskRef>) -> bool {
        let target = target.into();
        if self.remove_queued(&target) {
            return true;
        }
        self.mark_terminating(&target);
        self.inner.supervisor.cancel(target).await
    }

    fn remove_queued(&self, target: &TaskRef) -> bool {
        if self.remove_delayed(target) {
            return true;
        }
        let mut state = self.lock();
        let found = match target {
            TaskRef::Id(id) => state.queued.get(id).map(|slot| (*id, Arc::clone(slot))),
            TaskRef::Name(name) => {
                if self.inner.supervisor.is_alive(name) {
                    None
                } else {
                    state.slots.iter().find_map(|(key, slot)| {
                        slot.queue
                            .iter()
                            .find(|p| p.spec.name() == name)
                            .map(|p| (p.id(), Arc::clone(key)))
                    })
                }
            }
        };
        let Some((id, key)) = found else { return false };
        let Some(slot) = state.slots.get_mut(&key) else {
            return false;
        };
        let Some(pos) = slot.queue.iter().position(|p| p.id() == id) else {
            return false;
        };
        let Some(pending) = slot.queue.remove(pos) else {
            return false;
        };
        state.pending -= 1;
        state.queued.remove(&id);
        drop(state);
        let name: Arc<str> = Arc::from(pending.spec.name());
        self.resolve_rejected(
            (
                id,
                &name,
                &key,
                pending.spec.schedule_name(),
                pending.spec.parent_id(),
            ),
            &pending.cell,
            RejectionKind::RemovedFromQueue,
            "removed from the queue before it ran".into(),
        );
        true
    }

    fn mark_terminating(&self, target: &TaskRef) {
        let id = match target {
            TaskRef::Id(id) => Some(*id),
            TaskRef::Name(_) => self.inner.supervisor.watch(target.clone()).map(|w| w.id()),
        };
        let Some(id) = id else { return };
        let mut state = self.lock();
        let Some(key) = state.owners.get(&id).cloned() else {
            return;
        };
        if let Some(slot) = state.slots.get_mut(&key)
            && slot
                .owners
                .iter()
                .any(|o| o.id == id && o.state == SlotState::Running)
        {
            self.transition(
                &key,
                slot,
                id,
                SlotState::Terminating,
                "owner asked to stop",
            );
        }
    }

    /// Shuts down: no queued work starts (it ends Rejected ShuttingDown),
    /// new submissions are rejected, then the supervisor shuts down with
    /// `grace`.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let rejected: Vec<(Arc<str>, Pending)> = {
            let mut state = self.lock();
            state.closed = true;
            let mut out = Vec::new();
            for (key, slot) in state.slots.iter_mut() {
                out.extend(slot.queue.drain(..).map(|p| (Arc::clone(key), p)));
            }
            state.pending = 0;
            state.queued.clear();
            let delayed = std::mem::take(&mut state.delayed);
            state.delayed_at.clear();
            out.extend(delayed.into_values().map(|d| (d.slot, d.pending)));
            out
        };
        for (slot, p) in rejected {
            let name: Arc<str> = Arc::from(p.spec.name());
            self.resolve_rejected(
                (
                    p.id(),
                    &name,
                    &slot,
                    p.spec.schedule_name(),
                    p.spec.parent_id(),
                ),
                &p.cell,
                RejectionKind::ShuttingDown,
                "the host shut down before it ran".into(),
            );
        }
        self.inner.supervisor.shutdown(grace).await
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn vanished() -> (RejectionKind, String) {
    (
        RejectionKind::AdmissionFailed,
        "the slot vanished (host bug)".into(),
    )
}
