//! Owns delayed submissions (`Submission::not_before`): holding one until
//! its due time outside the slots, within [`ControllerBuilder::max_delayed`]
//! (it has its id at once; `remove`, `cancel` and shutdown reject it), the
//! one timer task that sleeps until the soonest is due, and placing each
//! when due, in due order, as if it were submitted then. Deciding against
//! the slot is the rest of the controller's business.
//!
//! [`ControllerBuilder::max_delayed`]: super::ControllerBuilder::max_delayed

use std::sync::{Arc, Weak};

use tokio::sync::Notify;

use super::{AdmissionPolicy, Controller, Inner, Pending, Placement, QueuedView, State};
use crate::outcome::RejectionKind;
use crate::supervisor::{Event, EventKind, TaskId, TaskRef};

/// A submission held until its due time.
pub(super) struct Delayed {
    pub(super) pending: Pending,
    policy: AdmissionPolicy,
    pub(super) name: Arc<str>,
    pub(super) slot: Arc<str>,
}

impl Delayed {
    /// How it shows among the queued submissions, its `due_in` counted
    /// from `now`.
    pub(super) fn view(&self, now: tokio::time::Instant) -> QueuedView {
        let due = self.pending.spec.due_at().unwrap_or(now);
        QueuedView {
            id: self.pending.id(),
            name: self.name.to_string(),
            slot: self.slot.to_string(),
            body: self.pending.spec.body().describe(),
            age: self.pending.since.elapsed(),
            due_in: Some(due.saturating_duration_since(now)),
        }
    }
}

impl Controller {
    /// The due time a slot's debounce gives submission `id` (none without
    /// one), and the submission it held before, which `id` supersedes (out
    /// of the delayed ones now; the caller ends it). A run of superseding
    /// submissions is placed `debounce` after the newest, and `max_wait`
    /// after the first at the latest.
    pub(super) fn debounce(
        &self,
        state: &mut State,
        slot: &Arc<str>,
        id: TaskId,
        now: tokio::time::Instant,
    ) -> (Option<tokio::time::Instant>, Option<Delayed>) {
        if !state.rules.debounces() {
            return (None, None);
        }
        let settings = match state.slots.get(slot) {
            Some(tracked) => tracked.settings,
            None => state.rules.for_slot(slot),
        };
        let Some(wait) = settings.debounce else {
            return (None, None);
        };
        let held = state.debouncing.remove(slot).and_then(|(held, first)| {
            let due = state.delayed_at.remove(&held)?;
            Some((first, state.delayed.remove(&(due, held))?))
        });
        let (first, superseded) = match held {
            Some((first, old)) => (first, Some(old)),
            None => (now, None),
        };
        let latest = settings.max_wait.map_or(now + wait, |most| first + most);
        state.debouncing.insert(Arc::clone(slot), (id, first));
        (Some((now + wait).min(latest).max(now)), superseded)
    }

    /// Forgets a slot's debounce if it holds `id` (placed, or removed).
    fn debounced(state: &mut State, slot: &Arc<str>, id: TaskId) {
        if state.debouncing.get(slot).is_some_and(|held| held.0 == id) {
            state.debouncing.remove(slot);
        }
    }

    /// Holds a submission until `due`, within the bound of delayed ones.
    pub(super) fn hold(
        &self,
        state: &mut State,
        due: tokio::time::Instant,
        pending: Pending,
        policy: AdmissionPolicy,
        name: &Arc<str>,
        slot: &Arc<str>,
    ) -> Result<Option<Placement>, (RejectionKind, String)> {
        if state.closed {
            return Err((
                RejectionKind::ShuttingDown,
                "the host is shutting down".into(),
            ));
        }
        if state.delayed.len() >= self.inner.max_delayed {
            return Err((
                RejectionKind::ResourceLimit,
                format!(
                    "{} delayed submissions already wait for their time, the most this host \
                     holds (max_delayed)",
                    state.delayed.len()
                ),
            ));
        }
        let id = pending.id();
        let wait = due.saturating_duration_since(tokio::time::Instant::now());
        let due_ms = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_add(wait)
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let sooner = state
            .delayed
            .first_key_value()
            .is_none_or(|(k, _)| due < k.0);
        state.delayed.insert(
            (due, id),
            Delayed {
                pending,
                policy,
                name: Arc::clone(name),
                slot: Arc::clone(slot),
            },
        );
        state.delayed_at.insert(id, due);
        if !state.timer {
            state.timer = true;
            tokio::spawn(place_when_due(
                Arc::downgrade(&self.inner),
                Arc::clone(&self.inner.due),
            ));
        } else if sooner {
            self.inner.due.notify_one();
        }
        Ok(Some(Placement::Delayed { due_ms }))
    }

    /// Places every delayed submission due by now, in due order; returns
    /// when the next is due, or `None` (and marks the timer stopped) when
    /// none is left.
    fn place_due(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let mut state = self.lock();
        loop {
            let Some(entry) = state.delayed.first_entry() else {
                state.timer = false;
                return None;
            };
            let (due, id) = *entry.key();
            if due > now {
                return Some(due);
            }
            let delayed = entry.remove();
            state.delayed_at.remove(&id);
            Self::debounced(&mut state, &delayed.slot, id);
            let mut event = Event::new(EventKind::DelayDue)
                .task(id, &delayed.name, &delayed.slot)
                .schedule(delayed.pending.spec.schedule_name())
                .parent(delayed.pending.spec.parent_id());
            event.delay_ms = Some(now.saturating_duration_since(due).as_millis() as u64);
            self.inner.supervisor.bus().publish(event);
            crate::stats::DELAYS_DUE.observe(now.saturating_duration_since(due));
            let cell = Arc::clone(&delayed.pending.cell);
            let schedule = delayed.pending.spec.schedule_name().cloned();
            let parent = delayed.pending.spec.parent_id();
            if let Err((kind, reason)) =
                self.place(&mut state, delayed.pending, delayed.policy, &delayed.slot)
            {
                let who = (id, &delayed.name, &delayed.slot, schedule.as_ref(), parent);
                self.resolve_rejected(who, &cell, kind, reason);
            }
        }
    }

    /// Takes a delayed submission out (it ends Rejected RemovedFromQueue).
    pub(super) fn remove_delayed(&self, target: &TaskRef) -> bool {
        let mut state = self.lock();
        let found = match target {
            TaskRef::Id(id) => state.delayed_at.get(id).map(|due| (*due, *id)),
            TaskRef::Name(name) => {
                if self.inner.supervisor.is_alive(name) {
                    None
                } else {
                    state
                        .delayed
                        .iter()
                        .find(|(_, d)| &*d.name == name.as_str())
                        .map(|(key, _)| *key)
                }
            }
        };
        let Some(key) = found else { return false };
        let Some(delayed) = state.delayed.remove(&key) else {
            return false;
        };
        state.delayed_at.remove(&key.1);
        Self::debounced(&mut state, &delayed.slot, key.1);
        drop(state);
        let why = "removed before it was due".to_owned();
        self.reject_delayed(&delayed, RejectionKind::RemovedFromQueue, why);
        true
    }

    /// Ends a held submission that never ran (taken out of the delayed
    /// ones by the caller).
    pub(super) fn reject_delayed(&self, held: &Delayed, kind: RejectionKind, why: String) {
        let spec = &held.pending.spec;
        let who = (
            held.pending.id(),
            &held.name,
            &held.slot,
            spec.schedule_name(),
            spec.parent_id(),
        );
        self.resolve_rejected(who, &held.pending.cell, kind, why);
    }
}

/// The task that places delayed submissions when they are due: it sleeps
/// until the soonest, and is woken when a sooner one arrives. It holds the
/// controller only while it places, and ends when none is left (the next
/// delayed submission starts it again) or the controller is gone.
async fn place_when_due(inner: Weak<Inner>, sooner: Arc<Notify>) {
    loop {
        let next = match inner.upgrade() {
            Some(inner) => Controller { inner }.place_due(),
            None => return,
        };
        let Some(next) = next else { return };
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = sooner.notified() => {}
        }
    }
}
