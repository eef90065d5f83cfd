//! Owns guests' key-value state in a cluster's database: each write in one
//! transaction that first holds its task's row under the writer's fencing
//! token (`FOR SHARE`, so a takeover that changes the token waits for it,
//! or it finds the token changed and writes nothing), then checks the
//! bucket's and the cluster's limits; reads without a lock; and the verbs
//! of `host kv`.

use taskhost_core::slot_settings::SCOPE_SEPARATOR;
use taskhost_core::supervisor::TaskId;
use taskhost_runtime::ScopeQuota;
use taskhost_runtime::kv::{Bucket, KvLimits, KvWrite, MAX_KV_KEY, MAX_KV_VALUE, incremented};

use super::{Pg, all, db, opt, sql_id};
use crate::store::StoreError;

/// Why a write did not happen: a limit or a lost claim (for the guest), or
/// the database.
pub(crate) enum KvRefused {
    /// The writer's claim is no longer the task's (its fencing token moved
    /// on): nothing was written.
    Fenced,
    /// Said to the guest as is.
    Guest(String),
    /// The database failed.
    Store(StoreError),
}

impl From<StoreError> for KvRefused {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

fn size(key: &str, value: &[u8]) -> i64 {
    (key.len() + value.len()) as i64
}

impl Pg {
    /// The value of `key` in `bucket`.
    pub(crate) async fn kv_get(
        &self,
        bucket: &Bucket,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let row = opt(
            &client,
            "cannot read a key",
            "SELECT value FROM taskhost_kv WHERE scope = $1 AND key = $2",
            &[&bucket.scope(), &key],
        )
        .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// A page of `bucket`'s keys from `cursor`, and the next cursor.
    pub(crate) async fn kv_keys(
        &self,
        bucket: &Bucket,
        cursor: u64,
        page: usize,
    ) -> Result<(Vec<String>, Option<u64>), StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot list keys",
            "SELECT key FROM taskhost_kv WHERE scope = $1 ORDER BY key OFFSET $2 LIMIT $3",
            &[&bucket.scope(), &(cursor as i64), &(page as i64 + 1)],
        )
        .await?;
        let mut keys: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        let next = (keys.len() > page).then(|| cursor + page as u64);
        keys.truncate(page);
        Ok((keys, next))
    }

    /// Every bucket with its keys and bytes, or one bucket's keys with the
    /// size of each value.
    pub(crate) async fn kv_rows(
        &self,
        bucket: Option<&Bucket>,
    ) -> Result<Vec<(String, u64, u64)>, StoreError> {
        let client = self.client().await?;
        let rows = match bucket {
            None => all(
                &client,
                "cannot list buckets",
                "SELECT scope, count(*), sum(length(key) + length(value)) FROM taskhost_kv \
                 GROUP BY scope ORDER BY scope",
                &[],
            )
            .await?
            .iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, i64>(1) as u64,
                    r.get::<_, i64>(2) as u64,
                )
            })
            .collect(),
            Some(bucket) => all(
                &client,
                "cannot list keys",
                "SELECT key, length(value) FROM taskhost_kv WHERE scope = $1 ORDER BY key",
                &[&bucket.scope()],
            )
            .await?
            .iter()
            .map(|r| (r.get::<_, String>(0), 1, r.get::<_, i32>(1) as u64))
            .collect(),
        };
        Ok(rows)
    }

    /// Applies one write of task `task`'s attempt under its fencing token
    /// `token` (`None`: the operator's `host kv rm`, unfenced), within
    /// `limits` and its namespace's `quota`; an increment gives the new
    /// number.
    pub(crate) async fn kv_write(
        &self,
        task: Option<(TaskId, i64)>,
        bucket: &Bucket,
        write: KvWrite,
        limits: KvLimits,
        quota: Option<ScopeQuota>,
    ) -> Result<Option<u64>, KvRefused> {
        let key = match &write {
            KvWrite::Set(k, _) | KvWrite::Delete(k) | KvWrite::Increment(k, _) => k.clone(),
        };
        if key.len() > MAX_KV_KEY {
            return Err(KvRefused::Guest(format!(
                "the key is {} bytes, over the limit of {MAX_KV_KEY}",
                key.len()
            )));
        }
        let scope = bucket.scope();
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        if let Some((id, token)) = task {
            let held = opt(
                &tx,
                "cannot check the task's claim",
                "SELECT 1 FROM taskhost_tasks WHERE id = $1 AND token = $2 \
                 AND state IN ('running', 'stopping') FOR SHARE",
                &[&sql_id(id), &token],
            )
            .await?;
            if held.is_none() {
                return Err(KvRefused::Fenced);
            }
        }
        let current: Option<Vec<u8>> = opt(
            &tx,
            "cannot read a key",
            "SELECT value FROM taskhost_kv WHERE scope = $1 AND key = $2 FOR UPDATE",
            &[&scope, &key],
        )
        .await?
        .map(|r| r.get(0));
        let (value, number) = match write {
            KvWrite::Delete(_) => (None, None),
            KvWrite::Set(_, value) => (Some(value), None),
            KvWrite::Increment(_, delta) => {
                let (value, sum) = incremented(&key, current.as_deref(), delta)
                    .map_err(|e| KvRefused::Guest(e.0))?;
                (Some(value), Some(sum))
            }
        };
        if let Some(v) = &value
            && v.len() > MAX_KV_VALUE
        {
            return Err(KvRefused::Guest(format!(
                "the value is {} bytes, over the limit of {MAX_KV_VALUE}",
                v.len()
            )));
        }
        let old = current.as_deref().map_or(0, |v| size(&key, v));
        let new = value.as_deref().map_or(0, |v| size(&key, v));
        if new > old {
            let held: i64 = opt(
                &tx,
                "cannot size a bucket",
                "SELECT coalesce(sum(length(key) + length(value)), 0)::bigint FROM taskhost_kv \
                 WHERE scope = $1",
                &[&scope],
            )
            .await?
            .map_or(0, |r| r.get(0));
            if held - old + new > limits.max_bucket_bytes as i64 {
                return Err(KvRefused::Guest(format!(
                    "{bucket} would hold {} bytes, over its limit of {} (its operator can raise \
                     it with host serve --kv-max-bucket or --kv-max-total)",
                    held - old + new,
                    limits.max_bucket_bytes
                )));
            }
            if let Some(quota) = quota {
                let held = scope_bytes(&tx, bucket.scope_name()).await?;
                let bytes = u64::try_from(held - old + new).unwrap_or(0);
                if bytes > quota.bytes {
                    return Err(KvRefused::Guest(format!(
                        "the write would bring the buckets to {bytes} bytes, {}",
                        quota.refusal
                    )));
                }
            }
        }
        if new != old {
            let total: i64 = opt(
                &tx,
                "cannot count the buckets' bytes",
                "UPDATE taskhost_kv_total SET bytes = bytes + $1 RETURNING bytes",
                &[&(new - old)],
            )
            .await?
            .map_or(0, |r| r.get(0));
            if new > old && total > limits.max_total_bytes as i64 {
                return Err(KvRefused::Guest(format!(
                    "all buckets would hold {total} bytes, over the limit of {} (its operator \
                     can raise it with host serve --kv-max-total)",
                    limits.max_total_bytes
                )));
            }
        }
        match &value {
            Some(v) => {
                tx.execute(
                    "INSERT INTO taskhost_kv (scope, key, value) VALUES ($1, $2, $3) \
                     ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value",
                    &[&scope, &key, v],
                )
                .await
                .map_err(db("cannot write a key"))?;
            }
            None if current.is_some() => {
                tx.execute(
                    "DELETE FROM taskhost_kv WHERE scope = $1 AND key = $2",
                    &[&scope, &key],
                )
                .await
                .map_err(db("cannot remove a key"))?;
            }
            None => {}
        }
        tx.commit().await.map_err(db("cannot commit a write"))?;
        Ok(number)
    }
}

/// The bytes the buckets of namespace `scope` hold together (`""`: the
/// default namespace's, whose names have no separator).
async fn scope_bytes(
    client: &impl deadpool_postgres::GenericClient,
    scope: &str,
) -> Result<i64, StoreError> {
    let slots = format!("slot:{scope}{SCOPE_SEPARATOR}");
    let shared = format!("shared:{scope}{SCOPE_SEPARATOR}");
    Ok(opt(
        client,
        "cannot size a namespace's buckets",
        "SELECT coalesce(sum(length(key) + length(value)), 0)::bigint FROM taskhost_kv \
         WHERE CASE WHEN $1 = '' THEN strpos(scope, chr(31)) = 0 \
         ELSE starts_with(scope, $2) OR starts_with(scope, $3) END",
        &[&scope, &slots, &shared],
    )
    .await?
    .map_or(0, |r| r.get(0)))
}

impl Pg {
    /// The bytes the buckets of namespace `name` (`None`: the default
    /// one) hold together.
    pub(crate) async fn namespace_kv_bytes(&self, name: Option<&str>) -> Result<u64, StoreError> {
        let client = self.client().await?;
        Ok(scope_bytes(&client, name.unwrap_or("")).await?.max(0) as u64)
    }
}
