//! Owns the operator's slot rules as the controller holds them: setting
//! them (each tracked slot takes its new settings at once), reading them,
//! and the budgets of starts of rate-limited slots. What a rule means is
//! `slot_settings`'s; deciding admissions is the controller's.

use std::sync::Arc;

use super::{Controller, State};
use crate::slot_settings::{SlotRules, SlotSettings, StartBudget};

impl Controller {
    /// The budget of starts of a slot whose settings rate-limit it: the
    /// one it has while its rate and burst stay the same, else one that
    /// takes up where it stood (a full one for a slot that had none).
    /// Budgets that are full again are let go when there are many.
    pub(super) fn budget(
        state: &mut State,
        slot_key: &Arc<str>,
        settings: SlotSettings,
    ) -> Option<Arc<StartBudget>> {
        /// Budgets kept before the full ones are let go.
        const KEPT: usize = 10_000;
        let Some(rate) = settings.rate else {
            if !state.budgets.is_empty() {
                state.budgets.remove(slot_key);
            }
            return None;
        };
        let burst = settings.burst.unwrap_or(0);
        let budget = match state.budgets.get(slot_key) {
            Some(budget) if budget.is_of(rate, burst) => return Some(Arc::clone(budget)),
            // A changed rate takes up where the old one stands.
            Some(old) => Arc::new(StartBudget::after(old, rate, burst)),
            None => Arc::new(StartBudget::new(rate, burst)),
        };
        if let Some(since) = state.rates_held_from {
            budget.hold(since + rate.per);
        }
        if let Some(last) = state.last_starts.get(slot_key) {
            budget.hold(*last + rate.per);
        }
        if state.budgets.len() >= KEPT {
            let now = tokio::time::Instant::now();
            state.budgets.retain(|_, b| !b.is_full(now));
        }
        state
            .budgets
            .insert(Arc::clone(slot_key), Arc::clone(&budget));
        Some(budget)
    }

    /// Each rate-limited slot's budget now: the starts it would allow one
    /// after another, and the most it allows (`burst + 1`), by slot.
    pub fn rate_budgets(&self) -> Vec<(String, u32, u32)> {
        let state = self.lock();
        let now = tokio::time::Instant::now();
        let mut budgets: Vec<_> = state
            .budgets
            .iter()
            .map(|(slot, b)| (slot.to_string(), b.available(now), b.most()))
            .collect();
        budgets.sort();
        budgets
    }

    /// Holds every rate-limited slot's starts until a period of its rate
    /// after `since`, the budgets it has and those it makes later: a
    /// cluster node that (re)joins at `since` cannot know what the other
    /// nodes started in the period before, and they learn of it late.
    pub fn hold_rates(&self, since: tokio::time::Instant) {
        let mut state = self.lock();
        state.rates_held_from = Some(since);
        for budget in state.budgets.values() {
            budget.hold(since + budget.rate().per);
        }
    }

    /// Holds each rate-limited slot of `last` (a slot and its latest
    /// start before a restart) until a period of its rate after that
    /// start: what the budget had left then is not known, and a period
    /// later none of it counts.
    pub fn hold_slot_rates(&self, last: &[(String, tokio::time::Instant)]) {
        let mut state = self.lock();
        for (slot, at) in last {
            if state.rules.for_slot(slot).rate.is_some() {
                state.last_starts.insert(Arc::from(slot.as_str()), *at);
            }
        }
    }

    /// The rate-limited slots with at least a period's worth of starts
    /// (of their rate here) waiting in line: a cluster node claims no more
    /// of their tasks, so that nodes with starts to spare run them.
    pub fn crowded_slots(&self) -> Vec<String> {
        let state = self.lock();
        state
            .budgets
            .iter()
            .filter(|(_, b)| b.is_crowded())
            .map(|(slot, _)| slot.to_string())
            .collect()
    }

    /// Replaces the operator's slot settings. Each tracked slot takes its
    /// new ones at once: a larger capacity admits its waiting heads now; a
    /// smaller one lets the owners it has finish (none is stopped) and
    /// admits none until they are below it.
    pub fn set_slot_rules(&self, rules: SlotRules) {
        let mut state = self.lock();
        let keys: Vec<Arc<str>> = state.slots.keys().cloned().collect();
        for key in &keys {
            let settings = rules.for_slot(key);
            if let Some(slot) = state.slots.get_mut(key) {
                slot.settings = settings;
            }
        }
        state.rules = rules;
        if !state.closed {
            for key in &keys {
                self.fill(&mut state, key);
            }
        }
    }

    /// The operator's slot settings as the controller holds them.
    pub fn slot_rules(&self) -> SlotRules {
        self.lock().rules.clone()
    }
}
