//! The invariant checkers over an event history that the controller's
//! tests and the end-to-end tests share (those include this file): they
//! read what happened and say where a rule was broken, or `Ok`.

use std::collections::HashMap;
use std::sync::Arc;

use taskhost_core::supervisor::{Event, EventKind, TaskId};

/// Where a slot held more owners than `capacity` allows: an owner holds its
/// slot from its `TaskAdded` to its `TaskRemoved` (its physical end), so
/// an owner that is still stopping counts. Events are read in `seq` order.
pub fn over_capacity<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    capacity: impl Fn(&str) -> usize,
) -> Result<(), String> {
    let mut events: Vec<&Event> = events.into_iter().collect();
    events.sort_by_key(|e| e.seq);
    let mut owners: HashMap<Arc<str>, Vec<TaskId>> = HashMap::new();
    for e in events {
        let (Some(slot), Some(id)) = (e.slot.clone(), e.task_id) else {
            continue;
        };
        match e.kind {
            EventKind::TaskAdded => {
                let held = owners.entry(Arc::clone(&slot)).or_default();
                held.push(id);
                let most = capacity(&slot);
                if held.len() > most {
                    return Err(format!(
                        "slot {slot} held {} owners at seq {} ({held:?}), capacity {most}",
                        held.len(),
                        e.seq
                    ));
                }
            }
            EventKind::TaskRemoved => owners.entry(slot).or_default().retain(|o| *o != id),
            _ => {}
        }
    }
    Ok(())
}

/// The most owners each slot held at once.
pub fn most_owners<'a>(events: impl IntoIterator<Item = &'a Event>) -> HashMap<String, usize> {
    let mut events: Vec<&Event> = events.into_iter().collect();
    events.sort_by_key(|e| e.seq);
    let mut now: HashMap<String, usize> = HashMap::new();
    let mut most: HashMap<String, usize> = HashMap::new();
    for e in events {
        let Some(slot) = e.slot.as_deref() else {
            continue;
        };
        let held = now.entry(slot.to_owned()).or_default();
        match e.kind {
            EventKind::TaskAdded => *held += 1,
            EventKind::TaskRemoved => *held = held.saturating_sub(1),
            _ => continue,
        }
        let held = *held;
        let top = most.entry(slot.to_owned()).or_default();
        *top = (*top).max(held);
    }
    most
}

/// Where a debounced slot placed a submission that was not the newest one
/// submitted to it: each `DelayDue` of a slot in `debounced` must be of the
/// last task `ControllerSubmitted` to that slot (a newer one supersedes
/// the one held, so at most one run per window, and it is the newest).
pub fn debounce_broken<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    debounced: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let mut events: Vec<&Event> = events.into_iter().collect();
    events.sort_by_key(|e| e.seq);
    let mut newest: HashMap<Arc<str>, TaskId> = HashMap::new();
    for e in events {
        let (Some(slot), Some(id)) = (e.slot.clone(), e.task_id) else {
            continue;
        };
        if !debounced(&slot) {
            continue;
        }
        match e.kind {
            EventKind::ControllerSubmitted => {
                newest.insert(slot, id);
            }
            EventKind::DelayDue if newest.get(&slot) != Some(&id) => {
                return Err(format!(
                    "slot {slot} placed task {id} at seq {} while task {:?} was newer",
                    e.seq,
                    newest.get(&slot)
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where a rate-limited slot started more attempts in one window of its
/// period (half open) than its rate and burst allow (`starts + burst`): `starts` are
/// each attempt's slot and start time, in any order; `rate` gives a
/// slot's `(starts, per, burst)`; `tolerance` narrows each window (clocks
/// read a little apart).
pub fn rate_broken(
    starts: &[(String, std::time::Duration)],
    rate: impl Fn(&str) -> Option<(u32, std::time::Duration, u32)>,
    tolerance: std::time::Duration,
) -> Result<(), String> {
    let mut by_slot: HashMap<&str, Vec<std::time::Duration>> = HashMap::new();
    for (slot, at) in starts {
        by_slot.entry(slot.as_str()).or_default().push(*at);
    }
    for (slot, mut times) in by_slot {
        let Some((most, per, burst)) = rate(slot) else {
            continue;
        };
        times.sort();
        let window = per.saturating_sub(tolerance);
        for (i, first) in times.iter().enumerate() {
            let within = times[i..]
                .iter()
                .take_while(|t| **t < *first + window)
                .count();
            if within > (most + burst) as usize {
                return Err(format!(
                    "slot {slot} started {within} attempts within {window:?} from {first:?}, \
                     its rate allows {}",
                    most + burst
                ));
            }
        }
    }
    Ok(())
}
