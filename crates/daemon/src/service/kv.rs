//! Owns one host's key-value state as the daemon serves it: the buckets in
//! memory (`MemoryKv`), each write kept by the store before a guest hears
//! of it, loaded back at start; and the verbs of `host kv` on them. (A
//! cluster node's are in its database: `cluster/kv.rs`.)

use std::sync::Arc;

use taskhost_runtime::kv::{Bucket, KvError, KvFuture, KvRecord, KvWrite};
use taskhost_runtime::{KvLimits, MemoryKv, ScopeQuotas};

use crate::service::error::ServiceError;
use crate::store::Store;
use crate::wire::protocol::{KvRow, KvTarget, KvVerb};

/// How to raise a limit, for the error that names it.
const RAISE: &str = "its operator can raise it with host serve --kv-max-bucket or --kv-max-total";

/// The buckets of a daemon with these limits and its namespaces'
/// `quotas`, empty.
pub(crate) fn buckets(limits: KvLimits, quotas: Arc<ScopeQuotas>) -> Arc<MemoryKv> {
    Arc::new(MemoryKv::with_quotas(limits, RAISE, quotas))
}

/// Puts back what `store` kept and keeps every later write in it before it
/// is answered (a memory store keeps nothing, and answers at once).
pub(crate) fn attach(kv: &MemoryKv, store: &Store) {
    kv.load(
        store
            .take_kv()
            .into_iter()
            .filter_map(|(scope, key, value)| Some((Bucket::from_scope(&scope)?, key, value))),
    );
    let store = store.clone();
    kv.set_journal(Arc::new(move |record: KvRecord| -> KvFuture<()> {
        let ticket = store.kv(record.bucket.scope(), record.key, record.value);
        Box::pin(async move {
            ticket
                .committed()
                .await
                .map_err(|e| KvError(format!("the daemon's store failed: {e}")))
        })
    }));
}

/// What a `host kv` verb answers.
pub(crate) enum KvAnswer {
    /// `ls`.
    Rows(Vec<KvRow>),
    /// `get`, `rm`: the value (before its removal).
    Value(Option<Vec<u8>>),
}

pub(crate) fn bucket(target: KvTarget) -> Bucket {
    match target {
        KvTarget::Slot(name) => Bucket::Slot(name),
        KvTarget::Shared(name) => Bucket::Shared(name),
    }
}

/// Answers one verb on `kv`.
pub(crate) async fn answer(kv: &MemoryKv, verb: KvVerb) -> Result<KvAnswer, ServiceError> {
    Ok(match verb {
        KvVerb::List(None) => KvAnswer::Rows(
            kv.buckets()
                .into_iter()
                .map(|(bucket, keys, bytes)| KvRow {
                    name: bucket.scope(),
                    keys: keys as u64,
                    bytes,
                })
                .collect(),
        ),
        KvVerb::List(Some(target)) => KvAnswer::Rows(
            kv.entries(&bucket(target))
                .into_iter()
                .map(|(key, bytes)| KvRow {
                    name: key,
                    keys: 1,
                    bytes,
                })
                .collect(),
        ),
        KvVerb::Get(target, key) => KvAnswer::Value(kv.value(&bucket(target), &key)),
        KvVerb::Remove(target, key) => {
            let bucket = bucket(target);
            let old = kv.value(&bucket, &key);
            kv.apply(&bucket, KvWrite::Delete(key))
                .await
                .map_err(|e| ServiceError::Internal(e.0))?;
            KvAnswer::Value(old)
        }
    })
}
