//! Owns a cluster node's key-value buckets: its guests' reads and writes
//! in the database under their attempts' fencing tokens, and `host kv` on
//! the database.

use std::sync::{Arc, OnceLock};

use taskhost_core::supervisor::TaskId;
use taskhost_runtime::kv::{Bucket, KvBackend, KvError, KvFuture, KvWrite};
use taskhost_runtime::{KvLimits, ScopeQuotas};

use crate::cluster::Cluster;
use crate::service::error::ServiceError;
use crate::service::kv::{KvAnswer, bucket};
use crate::store::postgres::kv::KvRefused;
use crate::wire::protocol::{KvRow, KvVerb};

/// The buckets of a cluster node's guests, in the database; usable once
/// the node has joined ([`ClusterKv::attach`]).
#[derive(Clone)]
pub(crate) struct ClusterKv {
    cluster: Arc<OnceLock<Arc<Cluster>>>,
    limits: KvLimits,
    /// The namespaces' quotas on their buckets' bytes.
    quotas: Arc<ScopeQuotas>,
}

impl ClusterKv {
    /// The buckets under these limits and the namespaces' `quotas`,
    /// before the node joins.
    pub(crate) fn new(limits: KvLimits, quotas: Arc<ScopeQuotas>) -> Self {
        Self {
            cluster: Arc::default(),
            limits,
            quotas,
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
                    .kv_write(
                        Some((id, token)),
                        &bucket,
                        write.clone(),
                        this.limits,
                        this.quotas.get(bucket.scope_name()),
                    )
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
) -> Result<KvAnswer, ServiceError> {
    let internal = ServiceError::Store;
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
                .kv_write(None, &bucket, KvWrite::Delete(key), limits, None)
                .await
                .map_err(|e| match e {
                    KvRefused::Fenced => ServiceError::Internal("fenced".into()),
                    KvRefused::Guest(why) => ServiceError::Invalid(why),
                    KvRefused::Store(e) => internal(e),
                })?;
            KvAnswer::Value(old)
        }
    })
}
