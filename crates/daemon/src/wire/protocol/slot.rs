//! The messages of `host slot`: the operator's rules of slots.

use serde::{Deserialize, Serialize};

use taskhost_core::slot_settings::SlotSettings;

/// A verb on the operator's slot rules (`host slot …`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotRuleVerb {
    /// Set the rule of a pattern (replacing one there was); answered with
    /// [`Reply::SlotRule`](super::Reply::SlotRule).
    Set(SlotRuleRow),
    /// Remove the rule of a pattern; answered with the rule it removed.
    Unset(String),
    /// Every rule: pages of [`Reply::SlotRules`](super::Reply::SlotRules),
    /// then [`Reply::End`](super::Reply::End).
    List,
}

/// One rule: a slot's exact name or a glob pattern, and what the slots it
/// matches may hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRuleRow {
    /// The slot's name, or a pattern (`*` any run, `?` one character).
    pub pattern: String,
    /// What it sets.
    pub settings: SlotSettings,
}
