//! Owns the admission rules of a slot (docs/semantics.md §6), written once:
//! what becomes of a submission given a summary of its slot, its policy,
//! the totals and the limits. It is a pure function; the in-process
//! [`Controller`](crate::controller::Controller) applies its decisions to
//! memory, and cluster mode's store applies them in its database
//! transaction, so the two cannot drift apart.
//!
//! ```
//! use taskhost_core::admission::{Decision, Limits, SlotSummary, Totals, decide};
//! use taskhost_core::controller::AdmissionPolicy;
//! use taskhost_core::supervisor::TaskId;
//!
//! let limits = Limits::default();
//! let owner = TaskId::from_u64(1);
//! let busy = SlotSummary { owners: 1, capacity: 1, oldest_running: Some(owner), queued: 0, head: None, tracked: true };
//! let totals = Totals { pending: 0, slots: 1 };
//! assert_eq!(decide("db", &busy, AdmissionPolicy::Queue, totals, &limits, false), Decision::Enqueue);
//! assert_eq!(
//!     decide("db", &busy, AdmissionPolicy::Replace, totals, &limits, false),
//!     Decision::Replace { displaced: None, stop: Some(owner) }
//! );
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::outcome::RejectionKind;
use crate::supervisor::TaskId;

/// What becomes of a submission whose slot is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdmissionPolicy {
    /// Wait in the slot's FIFO queue.
    #[default]
    Queue,
    /// Stop the current owner and go next.
    Replace,
    /// Give up when the slot is busy (Rejected SlotBusy).
    DropIfRunning,
}

impl std::fmt::Display for AdmissionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Queue => "queue",
            Self::Replace => "replace",
            Self::DropIfRunning => "drop-if-running",
        })
    }
}

impl std::str::FromStr for AdmissionPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "queue" => Ok(Self::Queue),
            "replace" => Ok(Self::Replace),
            "drop-if-running" => Ok(Self::DropIfRunning),
            other => Err(format!(
                "unknown policy `{other}`: use queue, replace or drop-if-running"
            )),
        }
    }
}

/// The state of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The state as a word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Admitting => "admitting",
            Self::Running => "running",
            Self::Terminating => "terminating",
        }
    }
}

/// A point-in-time view of one slot (it may be stale when read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotView {
    /// The slot key.
    pub key: String,
    /// Its state.
    pub state: SlotState,
    /// The oldest owner's task id.
    pub owner: Option<TaskId>,
    /// Every owner's task id, oldest first (one at most unless the slot's
    /// capacity is higher).
    #[serde(default)]
    pub owners: Vec<TaskId>,
    /// How many owners it may hold at once.
    #[serde(default = "one")]
    pub capacity: usize,
    /// Submissions waiting behind the owner.
    pub queue_depth: usize,
    /// How long it has been in this state.
    pub in_state_for: Duration,
    /// The ids waiting, in order.
    pub queued: Vec<TaskId>,
}

fn one() -> usize {
    1
}

impl SlotView {
    /// Adds an owner in its state: the slot's state is its busiest owner's
    /// (running, then admitting, then terminating).
    pub fn owned(&mut self, id: TaskId, state: SlotState) {
        let rank = |s: SlotState| match s {
            SlotState::Running => 3,
            SlotState::Admitting => 2,
            SlotState::Terminating => 1,
            SlotState::Idle => 0,
        };
        if rank(state) > rank(self.state) {
            self.state = state;
        }
        self.owner.get_or_insert(id);
        self.owners.push(id);
    }
}

/// The bounds the rules enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Pending submissions behind one owner, counting a replacement head.
    pub max_slot_queue: usize,
    /// What `max_slot_queue` is called in a refusal (`max_slot_queue`, or
    /// `max_queue of its slot rule` where a rule bounds the slot).
    pub queue_bound: &'static str,
    /// Pending submissions over all slots.
    pub max_total_pending: usize,
    /// Slots tracked at once, owned or with a queue.
    pub max_slots: usize,
    /// Who holds the pending submissions, in the reason of a refusal
    /// (`the controller`, `the cluster`).
    pub holder: &'static str,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_slot_queue: 100,
            queue_bound: "max_slot_queue",
            max_total_pending: 10_000,
            max_slots: 10_000,
            holder: "the controller",
        }
    }
}

/// How far the slot's owner is in its life, as the rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// Admitted and not asked to stop: running, waiting for a permit,
    /// backing off, or (in a cluster) not claimed by a node yet.
    Running,
    /// Asked to stop; the slot frees at its physical end.
    Stopping,
}

/// What the rules read of one slot when a submission arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotSummary {
    /// Its owners, running or asked to stop (an owner counts until its
    /// physical end).
    pub owners: usize,
    /// How many owners it may hold at once (at least 1).
    pub capacity: usize,
    /// Its oldest owner not asked to stop yet: the one a Replace on a full
    /// slot stops.
    pub oldest_running: Option<TaskId>,
    /// Submissions waiting in its queue (a replacement head included).
    pub queued: usize,
    /// The first of them.
    pub head: Option<TaskId>,
    /// Whether the slot is tracked already (it has an owner or a queue).
    pub tracked: bool,
}

impl SlotSummary {
    /// An untracked slot: no owner, no queue.
    pub const IDLE: Self = Self {
        owners: 0,
        capacity: 1,
        oldest_running: None,
        queued: 0,
        head: None,
        tracked: false,
    };
}

/// Counts over every slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Submissions waiting in any slot's queue.
    pub pending: usize,
    /// Slots tracked.
    pub slots: usize,
}

/// What becomes of a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It owns the slot at once.
    Admit,
    /// It waits last in the slot's queue.
    Enqueue,
    /// It becomes the first in the slot's queue (the tail behind it stays):
    /// the head it displaces ends Rejected SupersededByReplace, and `stop`,
    /// a running owner, is asked to stop once.
    Replace {
        /// The head it displaces.
        displaced: Option<TaskId>,
        /// The owner to stop.
        stop: Option<TaskId>,
    },
    /// It ends at once with this rejection.
    Reject {
        /// Why, as a kind.
        kind: RejectionKind,
        /// Why, in words.
        reason: String,
    },
}

/// The rules: a closing host rejects; a slot with a free place (fewer
/// owners than its capacity) admits every policy (within the slot bound);
/// a full one queues (within the slot's and the total bounds), replaces (a
/// new head counts against the total bound, a displaced one does not; the
/// oldest owner not asked to stop yet is asked to) or rejects by policy. A
/// slot with a free place and a queue (in a cluster, a release cut short)
/// queues everything behind its head.
pub fn decide(
    slot_key: &str,
    slot: &SlotSummary,
    policy: AdmissionPolicy,
    totals: Totals,
    limits: &Limits,
    closing: bool,
) -> Decision {
    let reject = |kind, reason| Decision::Reject { kind, reason };
    if closing {
        return reject(
            RejectionKind::ShuttingDown,
            "the host is shutting down".to_owned(),
        );
    }
    let pending_full = || {
        reject(
            RejectionKind::ResourceLimit,
            format!(
                "{} already holds its limit of {} pending submissions",
                limits.holder, limits.max_total_pending
            ),
        )
    };
    if slot.owners < slot.capacity.max(1) {
        if slot.queued > 0 {
            return Decision::Enqueue;
        }
        if !slot.tracked && totals.slots >= limits.max_slots {
            return reject(
                RejectionKind::ResourceLimit,
                format!(
                    "{} already tracks its limit of {} slots",
                    limits.holder, limits.max_slots
                ),
            );
        }
        return Decision::Admit;
    }
    match policy {
        AdmissionPolicy::DropIfRunning => reject(
            RejectionKind::SlotBusy,
            format!("slot `{slot_key}` is busy and the policy is drop-if-running"),
        ),
        AdmissionPolicy::Queue if slot.queued >= limits.max_slot_queue => reject(
            RejectionKind::QueueFull,
            format!(
                "slot `{slot_key}` already has {} waiting ({} {})",
                slot.queued, limits.queue_bound, limits.max_slot_queue
            ),
        ),
        AdmissionPolicy::Queue if totals.pending >= limits.max_total_pending => pending_full(),
        AdmissionPolicy::Queue => Decision::Enqueue,
        AdmissionPolicy::Replace
            if slot.head.is_none() && totals.pending >= limits.max_total_pending =>
        {
            pending_full()
        }
        AdmissionPolicy::Replace => Decision::Replace {
            displaced: slot.head,
            stop: slot.oldest_running,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> TaskId {
        TaskId::from_u64(n)
    }

    fn busy(queued: usize, state: OwnerState) -> SlotSummary {
        SlotSummary {
            owners: 1,
            capacity: 1,
            oldest_running: (state == OwnerState::Running).then(|| id(1)),
            queued,
            head: (queued > 0).then(|| id(2)),
            tracked: true,
        }
    }

    const NONE: Totals = Totals {
        pending: 0,
        slots: 0,
    };

    #[test]
    fn an_idle_slot_admits_every_policy_within_the_slot_bound() {
        let limits = Limits {
            max_slots: 1,
            ..Limits::default()
        };
        for policy in [
            AdmissionPolicy::Queue,
            AdmissionPolicy::Replace,
            AdmissionPolicy::DropIfRunning,
        ] {
            assert_eq!(
                decide("s", &SlotSummary::IDLE, policy, NONE, &limits, false),
                Decision::Admit
            );
            let full = Totals {
                pending: 0,
                slots: 1,
            };
            assert!(matches!(
                decide("s", &SlotSummary::IDLE, policy, full, &limits, false),
                Decision::Reject {
                    kind: RejectionKind::ResourceLimit,
                    ..
                }
            ));
        }
    }

    #[test]
    fn a_busy_slot_decides_by_policy_and_bounds() {
        let limits = Limits {
            max_slot_queue: 2,
            max_total_pending: 3,
            ..Limits::default()
        };
        let running = busy(1, OwnerState::Running);
        let t = Totals {
            pending: 1,
            slots: 1,
        };
        assert_eq!(
            decide("s", &running, AdmissionPolicy::Queue, t, &limits, false),
            Decision::Enqueue
        );
        assert_eq!(
            decide("s", &running, AdmissionPolicy::Replace, t, &limits, false),
            Decision::Replace {
                displaced: Some(id(2)),
                stop: Some(id(1))
            }
        );
        let Decision::Reject { kind, reason } = decide(
            "s",
            &running,
            AdmissionPolicy::DropIfRunning,
            t,
            &limits,
            false,
        ) else {
            panic!("drop-if-running on a busy slot")
        };
        assert_eq!(kind, RejectionKind::SlotBusy);
        assert_eq!(reason, "slot `s` is busy and the policy is drop-if-running");
        // Queue: the slot's bound, then the total bound.
        let Decision::Reject { kind, .. } = decide(
            "s",
            &busy(2, OwnerState::Running),
            AdmissionPolicy::Queue,
            t,
            &limits,
            false,
        ) else {
            panic!()
        };
        assert_eq!(kind, RejectionKind::QueueFull);
        let full = Totals {
            pending: 3,
            slots: 1,
        };
        let Decision::Reject { kind, .. } =
            decide("s", &running, AdmissionPolicy::Queue, full, &limits, false)
        else {
            panic!()
        };
        assert_eq!(kind, RejectionKind::ResourceLimit);
        // Replace ignores the slot's bound, and displacing a head adds none.
        assert!(matches!(
            decide(
                "s",
                &busy(2, OwnerState::Running),
                AdmissionPolicy::Replace,
                full,
                &limits,
                false
            ),
            Decision::Replace { .. }
        ));
        assert!(matches!(
            decide(
                "s",
                &busy(0, OwnerState::Running),
                AdmissionPolicy::Replace,
                full,
                &limits,
                false
            ),
            Decision::Reject {
                kind: RejectionKind::ResourceLimit,
                ..
            }
        ));
        // A stopping owner is not asked again.
        assert_eq!(
            decide(
                "s",
                &busy(0, OwnerState::Stopping),
                AdmissionPolicy::Replace,
                t,
                &limits,
                false
            ),
            Decision::Replace {
                displaced: None,
                stop: None
            }
        );
    }

    #[test]
    fn a_slot_with_room_admits_and_a_full_one_stops_its_oldest_running_owner() {
        let limits = Limits::default();
        let t = Totals {
            pending: 0,
            slots: 1,
        };
        let slot = |owners, oldest_running| SlotSummary {
            owners,
            capacity: 3,
            oldest_running,
            queued: 0,
            head: None,
            tracked: true,
        };
        for policy in [AdmissionPolicy::DropIfRunning, AdmissionPolicy::Replace] {
            assert_eq!(
                decide("s", &slot(2, Some(id(1))), policy, t, &limits, false),
                Decision::Admit
            );
        }
        assert_eq!(
            decide(
                "s",
                &slot(3, Some(id(4))),
                AdmissionPolicy::Replace,
                t,
                &limits,
                false
            ),
            Decision::Replace {
                displaced: None,
                stop: Some(id(4))
            }
        );
        // Every owner asked to stop already: none is asked again.
        assert_eq!(
            decide(
                "s",
                &slot(3, None),
                AdmissionPolicy::Replace,
                t,
                &limits,
                false
            ),
            Decision::Replace {
                displaced: None,
                stop: None
            }
        );
        assert!(matches!(
            decide(
                "s",
                &slot(3, Some(id(4))),
                AdmissionPolicy::DropIfRunning,
                t,
                &limits,
                false
            ),
            Decision::Reject {
                kind: RejectionKind::SlotBusy,
                ..
            }
        ));
    }

    #[test]
    fn a_closing_host_rejects_and_an_ownerless_queue_queues() {
        let limits = Limits::default();
        assert!(matches!(
            decide(
                "s",
                &SlotSummary::IDLE,
                AdmissionPolicy::Queue,
                NONE,
                &limits,
                true
            ),
            Decision::Reject {
                kind: RejectionKind::ShuttingDown,
                ..
            }
        ));
        let cut_short = SlotSummary {
            owners: 0,
            capacity: 1,
            oldest_running: None,
            queued: 1,
            head: Some(id(2)),
            tracked: true,
        };
        assert_eq!(
            decide(
                "s",
                &cut_short,
                AdmissionPolicy::DropIfRunning,
                NONE,
                &limits,
                false
            ),
            Decision::Enqueue
        );
    }
}
