//! Owns what the controller shows of its state: the slots
//! ([`SlotView`]), the queued and delayed submissions ([`QueuedView`]),
//! whether a slot is free. Each view is taken under the controller's lock
//! and changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Controller, Pending, SlotState, SlotView};
use crate::supervisor::{TaskId, TaskRef};

/// A queued submission as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedView {
    /// Its id.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// The slot it waits for.
    pub slot: String,
    /// What its body is.
    pub body: String,
    /// How long it has waited.
    pub age: Duration,
    /// For a delayed submission, how long until it is due (zero once due).
    pub due_in: Option<Duration>,
}

impl Controller {
    /// A view of every tracked slot, sorted by key.
    pub fn snapshot(&self) -> Vec<SlotView> {
        let state = self.lock();
        let now = Instant::now();
        let mut views: Vec<SlotView> = state
            .slots
            .iter()
            .map(|(key, slot)| {
                let mut view = SlotView {
                    key: key.to_string(),
                    state: SlotState::Idle,
                    owner: None,
                    owners: Vec::with_capacity(slot.owners.len()),
                    capacity: slot.capacity(),
                    queue_depth: slot.queue.len(),
                    in_state_for: now.saturating_duration_since(slot.since),
                    queued: slot.queue.iter().map(Pending::id).collect(),
                };
                for owner in &slot.owners {
                    view.owned(owner.id, owner.state);
                }
                view
            })
            .collect();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        views
    }

    /// Whether a submission into `slot` would be admitted at once (no owner,
    /// no queue, not closing). Exact while no other submission or removal
    /// happens meanwhile.
    pub fn is_slot_free(&self, slot: &str) -> bool {
        let state = self.lock();
        !state.closed
            && state
                .slots
                .get(slot)
                .is_none_or(|s| s.has_room() && s.queue.is_empty())
    }

    /// The slot a queued submission waits in, if it is queued.
    pub fn queued_slot(&self, id: TaskId) -> Option<String> {
        self.lock().queued.get(&id).map(|s| s.to_string())
    }

    /// The queued submission with this id or name, if any (a name finds the
    /// oldest queued submission of that name).
    pub fn queued(&self, target: &TaskRef) -> Option<QueuedView> {
        let state = self.lock();
        let now = Instant::now();
        let view = |key: &Arc<str>, p: &Pending| QueuedView {
            id: p.id(),
            name: p.spec.name().to_owned(),
            slot: key.to_string(),
            body: p.spec.body().describe(),
            age: now.saturating_duration_since(p.since),
            due_in: None,
        };
        let delayed = state
            .delayed
            .values()
            .map(|d| d.view(tokio::time::Instant::now()));
        let delayed: Vec<QueuedView> = match target {
            TaskRef::Id(id) => delayed.filter(|v| v.id == *id).collect(),
            TaskRef::Name(name) => delayed.filter(|v| &v.name == name).collect(),
        };
        match target {
            TaskRef::Id(id) => {
                if let Some(view) = delayed.into_iter().next() {
                    return Some(view);
                }
                let key = state.queued.get(id)?;
                let slot = state.slots.get(key)?;
                slot.queue
                    .iter()
                    .find(|p| p.id() == *id)
                    .map(|p| view(key, p))
            }
            TaskRef::Name(name) => state
                .slots
                .iter()
                .flat_map(|(key, slot)| slot.queue.iter().map(move |p| (key, p)))
                .filter(|(_, p)| p.spec.name() == name)
                .map(|(key, p)| view(key, p))
                .chain(delayed)
                .min_by_key(|v| v.id),
        }
    }

    /// How many delayed submissions wait for their time.
    pub fn delayed_count(&self) -> usize {
        self.lock().delayed.len()
    }

    /// Every queued submission, by id (delayed ones included, with their
    /// `due_in`).
    pub fn queued_all(&self) -> Vec<QueuedView> {
        let state = self.lock();
        let now = Instant::now();
        let mut all: Vec<QueuedView> = state
            .slots
            .iter()
            .flat_map(|(key, slot)| {
                slot.queue.iter().map(move |p| QueuedView {
                    id: p.id(),
                    name: p.spec.name().to_owned(),
                    slot: key.to_string(),
                    body: p.spec.body().describe(),
                    age: now.saturating_duration_since(p.since),
                    due_in: None,
                })
            })
            .collect();
        let later = tokio::time::Instant::now();
        all.extend(state.delayed.values().map(|d| d.view(later)));
        all.sort_by_key(|q| q.id);
        all
    }
}
