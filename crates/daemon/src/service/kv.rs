//! Owns guests' key-value state as the daemon serves it. One host keeps the
//! buckets in memory (`MemoryKv`), each write kept by the store before a
//! guest hears of it, loaded back at start. A cluster node keeps them in
//! the database (`store/postgres/kv.rs`): each write under the fencing token of
//! the claim its attempt runs under, so a node that lost its lease writes
//! nothing. And the verbs of `host kv`, on either.

use std::sync::{Arc, OnceLock};

use taskhost_core::supervisor::TaskId;

use taskhost_runtime::kv::{Bucket, KvBackend, KvError, KvFuture, KvRecord, KvWrite};
use taskhost_runtime::{KvLimits, MemoryKv};

use crate::cluster::Cluster;
use crate::store::Store;
use crate::store::postgres::kv::KvRefused;
use crate::wire::protocol::{ErrorKind, KvRow, KvTarget, KvVerb};

/// How to raise a limit, for the error that names it.
const RAISE: &str = "its operator can raise it with host serve --kv-max-bucket or --kv-max-total";

/// The buckets of a daemon with these limits, empty.
pub(crate) fn buckets(limits: KvLimits) -> Arc<MemoryKv> {
    Arc::new(MemoryKv::new(limits, RAISE))
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

/// The buckets of a cluster node's guests, in the database; usable once
/// the node has joined ([`ClusterKv::attach`]).
#[derive(Clone)]
pub(crate) struct ClusterKv {
    cluster: Arc<OnceLock<Arc<Cluster>>>,
    limits: KvLimits,
}

impl ClusterKv {
    /// The buckets under these limits, before the node joins.
    pub(crate) fn new(limits: KvLimits) -> Self {
        Self {
            cluster: Arc::default(),
            limits,
        }
    }

    /// The node, once it has joined.
    pub(crate) fn attach(&self, cluster: &Arc<Cluster>) {
        let _ = self.cluster.set(Arc::clone(cluster));
    }

    fn cluster(&self) -> Result<Arc<Cluster>, KvError> {
        self.cluster
            .get()
            .cloned()
            .ok_or_else(|| KvError("the node has not joined its cluster yet".into()))
    }
}

fn store_error(e: crate::store::StoreError) -> KvError {
    KvError(format!("the cluster's database failed: {e}"))
}

impl KvBackend for ClusterKv {
    fn get(&self, _: u64, bucket: &Bucket, key: &str) -> KvFuture<Option<Vec<u8>>> {
        let (this, bucket, key) = (self.clone(), bucket.clone(), key.to_owned());
        Box::pin(async move {
            let cluster = this.cluster()?;
            cluster.pg.kv_get(&bucket, &key).await.map_err(store_error)
        })
    }

    fn write(&self, task: u64, bucket: &Bucket, write: KvWrite) -> KvFuture<Option<u64>> {
        let (this, bucket) = (self.clone(), bucket.clone());
        Box::pin(async move {
            let cluster = this.cluster()?;
            let id = TaskId::from_u64(task);
            let fenced = || {
                tracing::warn!(
                    task,
                    "a key-value write of task {task} was refused: this node no longer holds \
                     its claim"
                );
                KvError(format!(
                    "the write is refused: this node no longer holds task {task} (its claim \
                     was taken over)"
                ))
            };
            // The claim this attempt runs under; the database checks it
            // again in the write's transaction.
            let token = cluster.claims().get(&id).copied().ok_or_else(fenced)?;
            // A write the database could not take is tried again while
            // this node holds the claim: a set or a delete always (doing
            // it twice is doing it once), an increment only if it never
            // reached the database (no connection).
            let idempotent = !matches!(write, KvWrite::Increment(..));
            let mut tries = 0;
            let written = loop {
                let written = cluster
                    .pg
                    .kv_write(Some((id, token)), &bucket, write.clone(), this.limits)
                    .await;
                match &written {
                    Err(KvRefused::Store(e))
                        if e.is_unreachable()
                            && (idempotent || e.sent_nothing())
                            && cluster.holds(id, token) =>
                    {
                        cluster.pg.outage().failed("writing a key-value entry", e);
                        tokio::time::sleep(crate::store::postgres::outage::pause(tries)).await;
                        tries += 1;
                    }
                    _ => break written,
                }
            };
            written.map_err(|e| match e {
                KvRefused::Fenced => fenced(),
                KvRefused::Guest(why) => KvError(why),
                KvRefused::Store(e) => store_error(e),
            })
        })
    }

    fn keys(&self, _: u64, bucket: &Bucket, cursor: u64) -> KvFuture<(Vec<String>, Option<u64>)> {
        let (this, bucket) = (self.clone(), bucket.clone());
        Box::pin(async move {
            let cluster = this.cluster()?;
            cluster
                .pg
                .kv_keys(&bucket, cursor, taskhost_runtime::kv::KV_PAGE)
                .await
                .map_err(store_error)
        })
    }
}

/// Answers one `host kv` verb on a cluster's database.
pub(crate) async fn answer_shared(
    cluster: &Cluster,
    limits: KvLimits,
    verb: KvVerb,
) -> Result<KvAnswer, (ErrorKind, String)> {
    let internal = |e: crate::store::StoreError| (ErrorKind::Internal, e.to_string());
    Ok(match verb {
        KvVerb::List(target) => {
            let bucket = target.map(bucket);
            let rows = cluster
                .pg
                .kv_rows(bucket.as_ref())
                .await
                .map_err(internal)?;
            KvAnswer::Rows(
                rows.into_iter()
                    .map(|(name, keys, bytes)| KvRow { name, keys, bytes })
                    .collect(),
            )
        }
        KvVerb::Get(target, key) => KvAnswer::Value(
            cluster
                .pg
                .kv_get(&bucket(target), &key)
                .await
                .map_err(internal)?,
        ),
        KvVerb::Remove(target, key) => {
            let bucket = bucket(target);
            let old = cluster.pg.kv_get(&bucket, &key).await.map_err(internal)?;
            cluster
                .pg
                .kv_write(None, &bucket, KvWrite::Delete(key), limits)
                .await
                .map_err(|e| match e {
                    KvRefused::Fenced => (ErrorKind::Internal, "fenced".into()),
                    KvRefused::Guest(why) => (ErrorKind::Invalid, why),
                    KvRefused::Store(e) => internal(e),
                })?;
            KvAnswer::Value(old)
        }
    })
}

/// What a `host kv` verb answers.
pub(crate) enum KvAnswer {
    /// `ls`.
    Rows(Vec<KvRow>),
    /// `get`, `rm`: the value (before its removal).
    Value(Option<Vec<u8>>),
}

fn bucket(target: KvTarget) -> Bucket {
    match target {
        KvTarget::Slot(name) => Bucket::Slot(name),
        KvTarget::Shared(name) => Bucket::Shared(name),
    }
}

/// Answers one verb on `kv`.
pub(crate) async fn answer(kv: &MemoryKv, verb: KvVerb) -> Result<KvAnswer, (ErrorKind, String)> {
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
                .map_err(|e| (ErrorKind::Internal, e.0))?;
            KvAnswer::Value(old)
        }
    })
}
