//! Owns the per-slot metrics of flow control: attempts a slot's rate held
//! back and submissions superseded in it (counted from the event bus, by
//! slot, the label set bounded), and at scrape time each rate-limited
//! slot's budget and the owners waiting for it. `metrics` encodes the
//! rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::TaskInfo;

use super::metrics::{Out, TOP_SLOTS, labeled};
use crate::backend::daemon::Daemon;

/// What [`PerSlot`] counts.
pub(super) const THROTTLED: usize = 0;
pub(super) const SUPERSEDED: usize = 1;

/// Slots counted by name; later ones are counted under [`OTHER_SLOTS`].
const COUNTED_SLOTS: usize = 10_000;
const OTHER_SLOTS: &str = "(other)";

/// Per slot: attempts throttled by its rate, and submissions superseded
/// (by a Replace or a newer debounced one).
#[derive(Debug, Default)]
pub(super) struct PerSlot(Mutex<HashMap<Arc<str>, [u64; 2]>>);

impl PerSlot {
    /// Counts one more of `what` for `slot`.
    pub(super) fn count(&self, slot: Option<&Arc<str>>, what: usize) {
        let Some(slot) = slot else { return };
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if counts.len() < COUNTED_SLOTS || counts.contains_key(slot) {
            Arc::clone(slot)
        } else {
            Arc::from(OTHER_SLOTS)
        };
        counts.entry(key).or_default()[what] += 1;
    }

    /// The slots with the most of `what`.
    fn top(&self, what: usize) -> Vec<(String, u64)> {
        let counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut top: Vec<(String, u64)> = counts
            .iter()
            .filter(|(_, n)| n[what] > 0)
            .map(|(slot, n)| (slot.to_string(), n[what]))
            .collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(TOP_SLOTS);
        top
    }

    /// The two counters.
    pub(super) fn encode(&self, enc: &mut DescriptorEncoder<'_>) -> Out {
        labeled(
            enc,
            MetricType::Counter,
            "taskhost_slot_throttled",
            "Attempts a slot's rate held back (AttemptThrottled), for the slots with the most.",
            "slot",
            &self.top(THROTTLED),
        )?;
        labeled(
            enc,
            MetricType::Counter,
            "taskhost_slot_superseded",
            "Submissions superseded in a slot (by a Replace or a newer debounced one), for the slots with the most.",
            "slot",
            &self.top(SUPERSEDED),
        )
    }
}

/// Rate-limited slots now: the starts their budget allows, and the owners
/// waiting for it (of the live `tasks`).
pub(super) fn rates(enc: &mut DescriptorEncoder<'_>, d: &Daemon, tasks: &[TaskInfo]) -> Out {
    let mut budgets = d.controller.rate_budgets();
    budgets.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    budgets.truncate(TOP_SLOTS);
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_slot_rate_budget",
        "Starts a rate-limited slot's budget allows now, one after another (at most burst + 1), the emptiest only.",
        "slot",
        &budgets
            .iter()
            .map(|(slot, now, _)| (slot.clone(), u64::from(*now)))
            .collect::<Vec<_>>(),
    )?;
    let mut throttled: HashMap<String, u64> = HashMap::new();
    for task in tasks {
        if task.phase == TaskState::Throttled {
            *throttled.entry(task.slot.clone()).or_default() += 1;
        }
    }
    let mut throttled: Vec<(String, u64)> = throttled.into_iter().collect();
    throttled.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    throttled.truncate(TOP_SLOTS);
    labeled(
        enc,
        MetricType::Gauge,
        "taskhost_slot_throttled_now",
        "Owners waiting for their slot's rate to allow their next start, for the slots with the most.",
        "slot",
        &throttled,
    )
}
