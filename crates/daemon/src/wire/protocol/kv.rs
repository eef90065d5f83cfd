//! The messages of `host kv`: which bucket, what is asked, a row of the
//! answer.

use serde::{Deserialize, Serialize};

/// Which bucket `host kv` means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvTarget {
    /// A slot's own.
    Slot(String),
    /// A shared bucket (`--kv NAME`).
    Shared(String),
}

/// What `host kv` asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvVerb {
    /// With a bucket, its keys and their sizes; without, every bucket with
    /// its count of keys and bytes: pages of [`Reply::KvRows`](super::Reply::KvRows), then
    /// [`Reply::End`](super::Reply::End).
    List(Option<KvTarget>),
    /// One value: [`Reply::KvValue`](super::Reply::KvValue).
    Get(KvTarget, String),
    /// Removes one key: [`Reply::KvValue`](super::Reply::KvValue) with what it held.
    Remove(KvTarget, String),
}

/// A line of `host kv ls`: a bucket (its keys, bytes) or a key (1, the
/// size of its value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvRow {
    /// `slot:NAME`, `shared:NAME`, or a key.
    pub name: String,
    /// Keys in the bucket (1 for a key).
    pub keys: u64,
    /// Bytes of keys and values (for a key, of its value).
    pub bytes: u64,
}
