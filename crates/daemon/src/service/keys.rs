//! Owns the idempotency keys of one host: which task a key made, checked
//! at intake before anything is placed. The store keeps every key for the
//! daemon's `idempotency_retention` (written in the commit that stores its
//! task, so a crash between the two is impossible); this cache holds the
//! keys this process placed, so that two submissions of one key arriving
//! together, or one arriving before the other's commit, find each other.
//! It is bounded: past `MAX_CACHED` the oldest go (the store has them).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use taskhost_core::supervisor::TaskId;

use crate::store::now_ms;

/// The most keys remembered in memory.
const MAX_CACHED: usize = 100_000;

/// What a key made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    pub id: TaskId,
    pub fingerprint: [u8; 32],
    pub created_ms: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, KeyEntry>,
    order: VecDeque<String>,
}

/// The keys this process placed (see the module docs).
pub(crate) struct Keys {
    inner: Mutex<Inner>,
    retention: Duration,
}

impl Keys {
    pub(crate) fn new(retention: Duration) -> Self {
        Self {
            inner: Mutex::default(),
            retention,
        }
    }

    /// The oldest creation time still in force.
    pub(crate) fn cutoff_ms(&self) -> u64 {
        cutoff_ms(self.retention)
    }

    /// The entry of `key`, unless it has expired.
    pub(crate) fn get(&self, key: &str) -> Option<KeyEntry> {
        let cutoff = self.cutoff_ms();
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .map
            .get(key)
            .copied()
            .filter(|e| e.created_ms >= cutoff)
    }

    /// Remembers `key` for `entry` unless a live entry holds it: then that
    /// one is returned and nothing changes.
    pub(crate) fn claim(&self, key: &str, entry: KeyEntry) -> Result<(), KeyEntry> {
        let cutoff = self.cutoff_ms();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = inner.map.get(key).filter(|e| e.created_ms >= cutoff) {
            return Err(*held);
        }
        if inner.map.insert(key.to_owned(), entry).is_none() {
            inner.order.push_back(key.to_owned());
        }
        while inner.order.len() > MAX_CACHED {
            if let Some(old) = inner.order.pop_front() {
                inner.map.remove(&old);
            }
        }
        Ok(())
    }

    /// Forgets `key` if it still names `id` (its submission was not
    /// stored after all).
    pub(crate) fn release(&self, key: &str, id: TaskId) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.map.get(key).is_some_and(|e| e.id == id) {
            inner.map.remove(key);
            inner.order.retain(|k| k != key);
        }
    }
}

pub(crate) use crate::store::key_conflict as conflict;

/// The oldest creation time of a key still kept `retention` long.
pub(crate) fn cutoff_ms(retention: Duration) -> u64 {
    now_ms().saturating_sub(retention.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, created_ms: u64) -> KeyEntry {
        KeyEntry {
            id: TaskId::from_u64(id),
            fingerprint: [id as u8; 32],
            created_ms,
        }
    }

    #[test]
    fn a_key_is_claimed_once_until_it_expires_or_is_released() {
        let keys = Keys::new(Duration::from_secs(3600));
        let now = now_ms();
        assert_eq!(keys.claim("k", entry(1, now)), Ok(()));
        assert_eq!(keys.claim("k", entry(2, now)), Err(entry(1, now)));
        assert_eq!(keys.get("k"), Some(entry(1, now)));
        keys.release("k", TaskId::from_u64(2));
        assert!(keys.get("k").is_some(), "only its own id releases it");
        keys.release("k", TaskId::from_u64(1));
        assert_eq!(keys.get("k"), None);
        let old = now - 7_200_000;
        assert_eq!(keys.claim("old", entry(3, old)), Ok(()));
        assert_eq!(keys.get("old"), None, "expired");
        assert_eq!(
            keys.claim("old", entry(4, now)),
            Ok(()),
            "an expired key is free"
        );
    }
}
