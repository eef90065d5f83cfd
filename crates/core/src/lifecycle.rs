//! Owns the words of a task's life, beside `outcome` (how it ended): the
//! states a task can be in from its submission to its end, and where a
//! submission went when it arrived. Every layer uses these: the supervisor
//! reports the states of registered tasks, the controller places
//! submissions, `host ps` and the JSON API show the states, and the stores
//! keep [`TaskState::as_str`] in their rows. It decides nothing.

use serde::{Deserialize, Serialize};

use crate::outcome::TaskOutcome;
use crate::supervisor::id::TaskId;

/// Where a task is in its life. The supervisor sees a registered task as
/// `Waiting`, `Running`, `BackingOff`, `Stopping` or `Finishing`; the
/// controller adds `Queued`; a store adds `Ready` (admitted in a cluster,
/// not yet claimed by a node) and `Finished`.
///
/// The order of the variants is the wire's (postcard numbers them): new
/// ones go last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Waiting in its slot's queue.
    Queued,
    /// Waiting for a concurrency permit.
    Waiting,
    /// An attempt is running.
    Running,
    /// Pausing before the next attempt.
    BackingOff,
    /// Asked to stop; waiting for the body to end within its grace.
    Stopping,
    /// Its outcome is decided; its instance is being dropped.
    Finishing,
    /// Finished (`host ps --all`); see its outcome.
    Finished,
    /// Admitted to its slot in a cluster, not yet claimed by a node
    /// (`host ps` shows it as waiting).
    Ready,
    /// Accepted with a time before which it may not enter its slot (a
    /// delayed submission); `host ps` shows it as waiting, with its due
    /// time.
    Delayed,
    /// Registered, its slot's rate spent: waiting for its next start.
    Throttled,
}

impl TaskState {
    /// Every state, in wire order.
    pub const ALL: [TaskState; 10] = [
        Self::Queued,
        Self::Waiting,
        Self::Running,
        Self::BackingOff,
        Self::Stopping,
        Self::Finishing,
        Self::Finished,
        Self::Ready,
        Self::Delayed,
        Self::Throttled,
    ];

    /// The state as a word: what `host ps` shows and what a store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::BackingOff => "backing-off",
            Self::Stopping => "stopping",
            Self::Finishing => "finishing",
            Self::Finished => "finished",
            Self::Ready => "ready",
            Self::Delayed => "delayed",
            Self::Throttled => "throttled",
        }
    }

    /// The state a word names.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == word)
    }

    /// How `host ps` shows it: a task admitted in a cluster but not yet
    /// claimed waits, as one waiting for a permit does, and so does one
    /// waiting for its due time.
    pub fn shown(self) -> Self {
        match self {
            Self::Ready | Self::Delayed => Self::Waiting,
            other => other,
        }
    }

    /// Whether it has ended.
    pub fn is_finished(self) -> bool {
        self == Self::Finished
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a submission went when it arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Placement {
    /// It owns its slot and runs.
    Running,
    /// It waits in its slot's queue behind `owner`.
    Queued {
        /// The slot's owner.
        owner: Option<TaskId>,
    },
    /// It is the slot's next owner; the current owner was asked to stop.
    Replacing {
        /// The owner asked to stop.
        owner: TaskId,
        /// Its name.
        name: String,
    },
    /// It was rejected at intake: this is its final outcome.
    Rejected(TaskOutcome),
    /// It waits for its due time; then it is placed as if submitted then.
    Delayed {
        /// When it is due, ms since the Unix epoch.
        due_ms: u64,
    },
}

impl Placement {
    /// The state it left the submission in.
    pub fn state(&self) -> TaskState {
        match self {
            Self::Running => TaskState::Waiting,
            Self::Queued { .. } | Self::Replacing { .. } => TaskState::Queued,
            Self::Rejected(_) => TaskState::Finished,
            Self::Delayed { .. } => TaskState::Delayed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_reads_back_from_its_word() {
        for state in TaskState::ALL {
            assert_eq!(TaskState::parse(state.as_str()), Some(state));
        }
        assert_eq!(TaskState::parse("sleeping"), None);
    }
}
