//! Owns the shape of spawn trees as one host counts them: the children
//! each parent of this run spawned (its keys are the parents that may
//! wait parked), and the unfinished descendants of each root, bounded by
//! `--max-descendants` (a cluster counts them in the admission's
//! statement instead). The spawns and waits themselves are
//! `backend/children.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The trees of this run; cheap to clone (clones share them).
#[derive(Default, Clone)]
pub(crate) struct Trees(Arc<Inner>);

#[derive(Default)]
struct Inner {
    /// The children each parent of this run spawned: its keys are the
    /// parents, each one parked while it waits.
    of: Mutex<HashMap<u64, HashSet<u64>>>,
    /// The unfinished descendants of each root (one host's).
    roots: Mutex<HashMap<u64, usize>>,
}

impl Trees {
    /// The children of each parent of this run.
    pub(crate) fn links(&self) -> MutexGuard<'_, HashMap<u64, HashSet<u64>>> {
        self.0.of.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn roots(&self) -> MutexGuard<'_, HashMap<u64, usize>> {
        self.0.roots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more unfinished descendant of `root`, if that stays
    /// within `max` (`None`: counts it anyway, for recovered work).
    pub(crate) fn descend(&self, root: u64, max: Option<usize>) -> Result<(), String> {
        let mut roots = self.roots();
        let count = roots.entry(root).or_default();
        if let Some(max) = max
            && *count >= max
        {
            return Err(crate::store::too_many_descendants(root, max));
        }
        *count += 1;
        Ok(())
    }

    /// A descendant of `root` has finished.
    pub(crate) fn ascend(&self, root: u64) {
        let mut roots = self.roots();
        if let Some(count) = roots.get_mut(&root) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                roots.remove(&root);
            }
        }
    }
}
