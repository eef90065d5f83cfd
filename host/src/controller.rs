//! The keyed admission controller (SEMANTICS §6): each slot has at most one
//! owner from admission until physical completion; a busy slot queues,
//! replaces or rejects new work according to the submission's policy; every
//! queue is bounded. It decides *when* a task may enter the supervisor;
//! everything after admission is the supervisor's business.
//!
//! Intake is synchronous: a submission is placed (admitted, queued or
//! rejected) under one lock before `submit` returns, so there is no command
//! queue to bound; the slot queues and the slot table are bounded by
//! [`ControllerConfig`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::outcome::{RejectionKind, TaskOutcome};
use crate::resource::{ResourceTemplate, TemplateError};
use crate::runtime::AdmissionPolicy;
use crate::supervisor::{
    Event, EventKind, OutcomeCell, ShutdownReport, Supervisor, TaskRef, TaskReport, TaskSpec,
    TaskWaiter,
};

/// Bounds of the controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Pending submissions behind one owner, counting a replacement head.
    pub max_slot_queue: usize,
    /// Pending submissions over all slots.
    pub max_total_pending: usize,
    /// Slots tracked at once (owned or with a queue).
    pub max_slots: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            max_slot_queue: 100,
            max_total_pending: 10_000,
            max_slots: 10_000,
        }
    }
}

/// One submission: a task, the policy for a busy slot, and its slot.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The task.
    pub spec: TaskSpec,
    /// What to do if the slot is busy.
    pub policy: AdmissionPolicy,
}

impl Submission {
    /// A submission whose slot is the spec's slot (set with
    /// [`TaskSpec::with_slot`]), else its name.
    pub fn new(spec: TaskSpec, policy: AdmissionPolicy) -> Self {
        Self { spec, policy }
    }
}

/// Resolves a submission's slot: an explicit slot wins, else the plugin's
/// resource template filled from the params, else the task name.
pub fn resolve_slot(
    explicit: Option<&str>,
    template: Option<&ResourceTemplate>,
    params: &[(String, String)],
    name: &str,
) -> Result<String, TemplateError> {
    match (explicit, template) {
        (Some(slot), _) => Ok(slot.to_owned()),
        (None, Some(template)) => template.fill(params),
        (None, None) => Ok(name.to_owned()),
    }
}

/// The state of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlotState {
    /// No owner (slots are forgotten when idle with an empty queue).
    Idle,
    /// The owner is being registered with the supervisor.
    Admitting,
    /// The owner is registered and running (or backing off, or waiting for
    /// a permit).
    Running,
    /// The owner was asked to stop; the slot frees at its physical end.
    Terminating,
}

impl SlotState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Admitting => "admitting",
            Self::Running => "running",
            Self::Terminating => "terminating",
        }
    }
}

/// A point-in-time view of one slot (it may be stale when read).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotView {
    /// The slot key.
    pub key: String,
    /// Its state.
    pub state: SlotState,
    /// The owner's task id.
    pub owner: Option<u64>,
    /// Submissions waiting behind the owner.
    pub queue_depth: usize,
    /// How long it has been in this state.
    pub in_state_for: Duration,
    /// The ids waiting, in order.
    pub queued: Vec<u64>,
}

struct Pending {
    id: u64,
    spec: TaskSpec,
    cell: Arc<OutcomeCell>,
}

struct Slot {
    state: SlotState,
    owner: Option<u64>,
    since: Instant,
    queue: VecDeque<Pending>,
}

#[derive(Default)]
struct State {
    slots: HashMap<Arc<str>, Slot>,
    /// Queued id -> slot key.
    queued: HashMap<u64, Arc<str>>,
    /// Owner id -> slot key.
    owners: HashMap<u64, Arc<str>>,
    pending: usize,
    closed: bool,
}

struct Inner {
    supervisor: Supervisor,
    config: ControllerConfig,
    state: Mutex<State>,
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
    /// A controller admitting into `supervisor`.
    pub fn new(supervisor: Supervisor, config: ControllerConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                supervisor,
                config,
                state: Mutex::new(State::default()),
            }),
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
        let id = self.inner.supervisor.next_id();
        self.submit_with_id(id, submission)
    }

    /// Like [`Controller::submit`] with an id from
    /// [`Supervisor::next_id`].
    pub fn submit_with_id(&self, id: u64, submission: Submission) -> TaskWaiter {
        let Submission { spec, policy } = submission;
        let name: Arc<str> = Arc::from(spec.name());
        let slot: Arc<str> = Arc::from(spec.slot().unwrap_or(spec.name()));
        let cell = Arc::new(OutcomeCell::new());
        let waiter = cell.waiter(id);
        let mut event = Event::new(EventKind::ControllerSubmitted).task(id, &name, &slot);
        event.detail = Some(policy.to_string());
        self.inner.supervisor.bus().publish(event);

        let mut state = self.lock();
        let reject = |kind: RejectionKind, reason: String| (kind, reason);
        let rejection = if state.closed {
            Some(reject(
                RejectionKind::ShuttingDown,
                "the host is shutting down".into(),
            ))
        } else {
            match state.slots.get(&slot).map(|s| s.state) {
                None | Some(SlotState::Idle) => {
                    if !state.slots.contains_key(&slot)
                        && state.slots.len() >= self.inner.config.max_slots
                    {
                        Some(reject(
                            RejectionKind::ResourceLimit,
                            format!(
                                "the controller already tracks its limit of {} slots",
                                self.inner.config.max_slots
                            ),
                        ))
                    } else {
                        self.admit(
                            &mut state,
                            &slot,
                            Pending {
                                id,
                                spec,
                                cell: Arc::clone(&cell),
                            },
                        );
                        None
                    }
                }
                Some(_) => self.place_busy(
                    &mut state,
                    &slot,
                    policy,
                    Pending {
                        id,
                        spec,
                        cell: Arc::clone(&cell),
                    },
                ),
            }
        };
        drop(state);
        if let Some((kind, reason)) = rejection {
            self.resolve_rejected(id, &name, &slot, &cell, kind, reason);
        }
        waiter
    }

    /// Places a submission into a busy slot per its policy; returns the
    /// rejection, if any.
    fn place_busy(
        &self,
        state: &mut State,
        slot_key: &Arc<str>,
        policy: AdmissionPolicy,
        pending: Pending,
    ) -> Option<(RejectionKind, String)> {
        let config = &self.inner.config;
        let total = state.pending;
        let Some(slot) = state.slots.get_mut(slot_key) else {
            return Some((
                RejectionKind::AdmissionFailed,
                "the slot vanished (host bug)".into(),
            ));
        };
        let pending_full = || {
            (
                RejectionKind::ResourceLimit,
                format!(
                    "the controller already holds its limit of {} pending submissions",
                    config.max_total_pending
                ),
            )
        };
        match policy {
            AdmissionPolicy::DropIfRunning => Some((
                RejectionKind::SlotBusy,
                format!("slot `{slot_key}` is busy and the policy is drop-if-running"),
            )),
            AdmissionPolicy::Queue => {
                if slot.queue.len() >= config.max_slot_queue {
                    return Some((
                        RejectionKind::QueueFull,
                        format!(
                            "slot `{slot_key}` already has {} waiting (max_slot_queue {})",
                            slot.queue.len(),
                            config.max_slot_queue
                        ),
                    ));
                }
                if total >= config.max_total_pending {
                    return Some(pending_full());
                }
                let id = pending.id;
                slot.queue.push_back(pending);
                state.pending += 1;
                state.queued.insert(id, Arc::clone(slot_key));
                None
            }
            AdmissionPolicy::Replace => {
                let displaced = slot.queue.pop_front();
                if displaced.is_none() && total >= config.max_total_pending {
                    return Some(pending_full());
                }
                let id = pending.id;
                slot.queue.push_front(pending);
                let retire = (slot.state == SlotState::Running)
                    .then_some(slot.owner)
                    .flatten();
                if retire.is_some() {
                    self.transition(
                        slot_key,
                        slot,
                        SlotState::Terminating,
                        "replaced by a newer submission",
                    );
                }
                state.queued.insert(id, Arc::clone(slot_key));
                match displaced {
                    Some(old) => {
                        state.queued.remove(&old.id);
                        let name: Arc<str> = Arc::from(old.spec.name());
                        self.resolve_rejected(
                            old.id,
                            &name,
                            slot_key,
                            &old.cell,
                            RejectionKind::SupersededByReplace,
                            format!("a newer Replace submission ({id}) took its place"),
                        );
                    }
                    None => state.pending += 1,
                }
                if let Some(owner) = retire {
                    self.inner.supervisor.remove(owner);
                }
                None
            }
        }
    }

    /// Makes `pending` the owner of `slot_key` and registers it.
    fn admit(&self, state: &mut State, slot_key: &Arc<str>, pending: Pending) {
        let now = Instant::now();
        let slot = state
            .slots
            .entry(Arc::clone(slot_key))
            .or_insert_with(|| Slot {
                state: SlotState::Idle,
                owner: None,
                since: now,
                queue: VecDeque::new(),
            });
        slot.owner = Some(pending.id);
        self.transition(slot_key, slot, SlotState::Admitting, "admitted");
        let controller = self.clone();
        let key = Arc::clone(slot_key);
        let id = pending.id;
        let on_gone: Box<dyn FnOnce() + Send + Sync> =
            Box::new(move || controller.owner_gone(&key, id));
        match self
            .inner
            .supervisor
            .admit(id, pending.spec, pending.cell, Some(on_gone))
        {
            Ok(()) => {
                state.owners.insert(id, Arc::clone(slot_key));
                if let Some(slot) = state.slots.get_mut(slot_key) {
                    self.transition(slot_key, slot, SlotState::Running, "registered");
                }
            }
            Err(_) => {
                // The waiter already holds the Rejected outcome; the slot
                // moves on at once.
                self.release(state, slot_key, "registration failed");
            }
        }
    }

    /// Called by the owner's actor once it is physically gone.
    fn owner_gone(&self, slot_key: &Arc<str>, id: u64) {
        let mut state = self.lock();
        state.owners.remove(&id);
        if state
            .slots
            .get(slot_key)
            .is_some_and(|s| s.owner == Some(id))
        {
            self.release(&mut state, slot_key, "owner physically completed");
        }
    }

    /// Frees a slot and admits its queue head, if any (unless closed).
    fn release(&self, state: &mut State, slot_key: &Arc<str>, why: &str) {
        let Some(slot) = state.slots.get_mut(slot_key) else {
            return;
        };
        slot.owner = None;
        self.transition(slot_key, slot, SlotState::Idle, why);
        if state.closed {
            return;
        }
        let next = slot.queue.pop_front();
        match next {
            Some(next) => {
                state.pending -= 1;
                state.queued.remove(&next.id);
                self.admit(state, slot_key, next);
            }
            None => {
                state.slots.remove(slot_key);
            }
        }
    }

    fn transition(&self, key: &Arc<str>, slot: &mut Slot, to: SlotState, why: &str) {
        let from = slot.state;
        slot.state = to;
        slot.since = Instant::now();
        let mut event = Event::new(EventKind::ControllerSlotTransition).reason(why);
        event.slot = Some(Arc::clone(key));
        event.task_id = slot.owner;
        event.detail = Some(format!("{}->{}", from.as_str(), to.as_str()));
        self.inner.supervisor.bus().publish(event);
    }

    fn resolve_rejected(
        &self,
        id: u64,
        name: &Arc<str>,
        slot: &Arc<str>,
        cell: &OutcomeCell,
        kind: RejectionKind,
        reason: String,
    ) {
        let outcome = TaskOutcome::Rejected { kind, reason };
        self.inner.supervisor.bus().publish(
            Event::new(EventKind::ControllerRejected)
                .task(id, name, slot)
                .outcome(&outcome),
        );
        cell.set(TaskReport {
            id,
            name: Arc::clone(name),
            slot: Arc::clone(slot),
            outcome,
            attempts: 0,
            history: Vec::new(),
        });
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
                            .map(|p| (p.id, Arc::clone(key)))
                    })
                }
            }
        };
        let Some((id, key)) = found else { return false };
        let Some(slot) = state.slots.get_mut(&key) else {
            return false;
        };
        let Some(pos) = slot.queue.iter().position(|p| p.id == id) else {
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
            id,
            &name,
            &key,
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
            && slot.state == SlotState::Running
            && slot.owner == Some(id)
        {
            self.transition(&key, slot, SlotState::Terminating, "owner asked to stop");
        }
    }

    /// A view of every tracked slot, sorted by key.
    pub fn snapshot(&self) -> Vec<SlotView> {
        let state = self.lock();
        let now = Instant::now();
        let mut views: Vec<SlotView> = state
            .slots
            .iter()
            .map(|(key, slot)| SlotView {
                key: key.to_string(),
                state: slot.state,
                owner: slot.owner,
                queue_depth: slot.queue.len(),
                in_state_for: now.saturating_duration_since(slot.since),
                queued: slot.queue.iter().map(|p| p.id).collect(),
            })
            .collect();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        views
    }

    /// The slot a queued submission waits in, if it is queued.
    pub fn queued_slot(&self, id: u64) -> Option<String> {
        self.lock().queued.get(&id).map(|s| s.to_string())
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
            out
        };
        for (slot, p) in rejected {
            let name: Arc<str> = Arc::from(p.spec.name());
            self.resolve_rejected(
                p.id,
                &name,
                &slot,
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
