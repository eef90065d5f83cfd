//! Owns the vocabulary of how a task ends: the final [`TaskOutcome`] every
//! watcher receives exactly once, its [`OutcomeKind`], and the
//! [`RejectionKind`] of work that never ran. Deciding *which* outcome a task
//! gets is the supervisor's and the controller's business; what an outcome
//! means for a process exit code is the CLI's.

use serde::{Deserialize, Serialize};

/// Why a submission never ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectionKind {
    /// A task with this name is already registered.
    AlreadyExists,
    /// A batch it belonged to was rejected as a whole.
    BatchRejected,
    /// The slot was busy and the policy was drop-if-running.
    SlotBusy,
    /// The slot's queue (or a command queue) was full.
    QueueFull,
    /// A later Replace submission took its place at the head of the queue.
    SupersededByReplace,
    /// It was canceled or removed while still queued.
    RemovedFromQueue,
    /// The host was shutting down.
    ShuttingDown,
    /// Admission failed for another reason (bad params, missing grants).
    AdmissionFailed,
    /// A configured bound (registry size, slots, pending work) was reached.
    ResourceLimit,
}

impl std::fmt::Display for RejectionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AlreadyExists => "AlreadyExists",
            Self::BatchRejected => "BatchRejected",
            Self::SlotBusy => "SlotBusy",
            Self::QueueFull => "QueueFull",
            Self::SupersededByReplace => "SupersededByReplace",
            Self::RemovedFromQueue => "RemovedFromQueue",
            Self::ShuttingDown => "ShuttingDown",
            Self::AdmissionFailed => "AdmissionFailed",
            Self::ResourceLimit => "ResourceLimit",
        })
    }
}

/// The final outcome of a task, delivered to every watcher exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskOutcome {
    /// The body succeeded and no stop was requested.
    Completed {
        /// The plugin's output bytes.
        #[serde(with = "serde_bytes")]
        output: Vec<u8>,
    },
    /// A retryable error under restart Never, or the retry budget ran out.
    Failed {
        /// What happened.
        reason: String,
        /// The guest's exit code, if any.
        exit_code: Option<i32>,
    },
    /// A non-retryable error.
    Fatal {
        /// What happened.
        reason: String,
        /// The guest's exit code, if any.
        exit_code: Option<i32>,
    },
    /// A stop was requested and the task ended within its grace, or the body
    /// returned canceled.
    Canceled,
    /// The grace expired and the instance was stopped by force.
    ForceAborted,
    /// The host-side actor panicked (a host bug, caught and reported).
    Panicked {
        /// The panic message.
        reason: String,
    },
    /// The body never ran.
    Rejected {
        /// Why.
        kind: RejectionKind,
        /// Details for people.
        reason: String,
    },
}

/// The kind of a [`TaskOutcome`], without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutcomeKind {
    /// [`TaskOutcome::Completed`].
    Completed,
    /// [`TaskOutcome::Failed`].
    Failed,
    /// [`TaskOutcome::Fatal`].
    Fatal,
    /// [`TaskOutcome::Canceled`].
    Canceled,
    /// [`TaskOutcome::ForceAborted`].
    ForceAborted,
    /// [`TaskOutcome::Panicked`].
    Panicked,
    /// [`TaskOutcome::Rejected`].
    Rejected,
}

impl OutcomeKind {
    /// Every kind.
    pub const ALL: [Self; 7] = [
        Self::Completed,
        Self::Failed,
        Self::Fatal,
        Self::Canceled,
        Self::ForceAborted,
        Self::Panicked,
        Self::Rejected,
    ];

    /// The kind named by its word ([`OutcomeKind::as_str`]).
    pub fn from_word(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == word)
    }

    /// The kind as a stable lowercase word, as used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Fatal => "fatal",
            Self::Canceled => "canceled",
            Self::ForceAborted => "force-aborted",
            Self::Panicked => "panicked",
            Self::Rejected => "rejected",
        }
    }
}

impl std::fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TaskOutcome {
    /// The outcome's kind.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Self::Completed { .. } => OutcomeKind::Completed,
            Self::Failed { .. } => OutcomeKind::Failed,
            Self::Fatal { .. } => OutcomeKind::Fatal,
            Self::Canceled => OutcomeKind::Canceled,
            Self::ForceAborted => OutcomeKind::ForceAborted,
            Self::Panicked { .. } => OutcomeKind::Panicked,
            Self::Rejected { .. } => OutcomeKind::Rejected,
        }
    }

    /// The rejection kind, for a rejected outcome.
    pub fn rejection(&self) -> Option<RejectionKind> {
        match self {
            Self::Rejected { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// The reason, for outcomes that carry one.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Failed { reason, .. }
            | Self::Fatal { reason, .. }
            | Self::Panicked { reason }
            | Self::Rejected { reason, .. } => Some(reason),
            Self::Completed { .. } | Self::Canceled | Self::ForceAborted => None,
        }
    }

    /// The guest's exit code, for outcomes that carry one.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Failed { exit_code, .. } | Self::Fatal { exit_code, .. } => *exit_code,
            _ => None,
        }
    }
}
