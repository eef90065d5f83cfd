//! Owns task identity: the opaque [`TaskId`] and the [`Reservation`] that a
//! registration consumes. Only a supervisor mints reservations, and each is
//! used at most once, so two live tasks can never share an id.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// A task's id: strictly increasing within a supervisor, never reused.
///
/// Ids are minted by [`Supervisor::reserve`](super::Supervisor::reserve) (or
/// implicitly by `add`/`submit`). [`TaskId::from_u64`] exists for lookups of
/// ids read back from outside (a command line, the wire, a store): looking up
/// an id that was never minted simply finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(u64);

impl TaskId {
    /// The id as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// An id read back from outside, for lookups only.
    pub const fn from_u64(id: u64) -> Self {
        Self(id)
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<TaskId> for u64 {
    fn from(id: TaskId) -> Self {
        id.0
    }
}

/// An id minted for one task that is not registered yet. Registering the
/// task (`Supervisor::add_reserved`, `Controller::submit_reserved`) consumes
/// it; it cannot be cloned, so it cannot be used twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation does nothing until a task is registered with it"]
pub struct Reservation {
    id: TaskId,
    issuer: u64,
}

impl Reservation {
    /// The id the task will have.
    pub fn id(&self) -> TaskId {
        self.id
    }

    pub(crate) fn issuer(&self) -> u64 {
        self.issuer
    }
}

/// Mints ids for one supervisor.
#[derive(Debug)]
pub(crate) struct Ids {
    issuer: u64,
    next: AtomicU64,
    /// Ids below this were minted by an earlier run (a store recovers them).
    first: u64,
    restored: Mutex<HashSet<u64>>,
}

/// Distinguishes the reservations of different supervisors in one process.
static ISSUERS: AtomicU64 = AtomicU64::new(1);

impl Ids {
    pub(crate) fn starting_at(first: u64) -> Self {
        let first = first.max(1);
        Self {
            issuer: ISSUERS.fetch_add(1, Ordering::Relaxed),
            next: AtomicU64::new(first),
            first,
            restored: Mutex::new(HashSet::new()),
        }
    }

    pub(crate) fn issuer(&self) -> u64 {
        self.issuer
    }

    pub(crate) fn reserve(&self) -> Reservation {
        Reservation {
            id: TaskId(self.next.fetch_add(1, Ordering::Relaxed)),
            issuer: self.issuer,
        }
    }

    /// A reservation for an id minted elsewhere (a cluster's database).
    pub(crate) fn adopt(&self, id: TaskId) -> Reservation {
        Reservation {
            id,
            issuer: self.issuer,
        }
    }

    /// A reservation for an id an earlier run minted: only below the first
    /// id of this run, and once per id.
    pub(crate) fn restore(&self, id: TaskId) -> Option<Reservation> {
        if id.0 == 0 || id.0 >= self.first {
            return None;
        }
        let mut restored = self.restored.lock().unwrap_or_else(PoisonError::into_inner);
        restored.insert(id.0).then_some(Reservation {
            id,
            issuer: self.issuer,
        })
    }
}
