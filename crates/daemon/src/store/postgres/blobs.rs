//! Owns plugins stored in the database by digest: stored once, fetched by
//! the nodes that lack them, listed with the tasks that use them, collected
//! once no task refers to them.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use taskhost_runtime::Digest;

use crate::store::{StoreError, now_ms};
use crate::wire::protocol::PluginRow;

use super::*;

impl Pg {
    /// Whether the cluster holds this plugin.
    pub(crate) async fn has_plugin(&self, digest: &Digest) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(opt(
            &client,
            "cannot look a plugin up",
            "SELECT 1 FROM taskhost_plugins WHERE digest = $1",
            &[&&digest.0[..]],
        )
        .await?
        .is_some())
    }

    /// Stores a plugin for the whole cluster (once per digest).
    pub(crate) async fn put_plugin(
        &self,
        digest: &Digest,
        name: Option<&str>,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        // Every node is told (at the commit) to fetch it ahead of its tasks.
        exec(
            &client,
            "cannot store a plugin",
            "WITH put AS (INSERT INTO taskhost_plugins (digest, name, bytes, stored_ms) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (digest) DO UPDATE SET stored_ms = excluded.stored_ms RETURNING 1) \
             SELECT pg_notify($5, $6) FROM put",
            &[
                &&digest.0[..],
                &name,
                &bytes,
                &ms(now_ms()),
                &super::PLUGINS,
                &digest.to_string(),
            ],
        )
        .await?;
        Ok(())
    }

    /// Deletes the stored plugins that no task (unfinished, or finished and
    /// retained) refers to and that were last stored before `keep` ago;
    /// returns how many. A plugin an admission is using is locked, so it
    /// is skipped.
    pub(crate) async fn collect_plugins(&self, keep: Duration) -> Result<u64, StoreError> {
        let cutoff = ms(now_ms().saturating_sub(keep.as_millis() as u64));
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let old = all(
            &tx,
            "cannot list plugins",
            "SELECT digest FROM taskhost_plugins WHERE stored_ms < $1 FOR UPDATE SKIP LOCKED",
            &[&cutoff],
        )
        .await?;
        let mut removed = 0;
        for row in &old {
            let digest: &[u8] = row.get(0);
            // A new statement, so a new snapshot: admissions that committed
            // while this waited are seen.
            removed += exec(
                &tx,
                "cannot collect a plugin",
                "DELETE FROM taskhost_plugins WHERE digest = $1 AND NOT EXISTS \
                     (SELECT 1 FROM taskhost_tasks WHERE digest = $1) AND NOT EXISTS \
                     (SELECT 1 FROM taskhost_schedules WHERE digest = $1) AND NOT EXISTS \
                     (SELECT 1 FROM taskhost_deployments d WHERE d.digest = $1 \
                      AND d.what <> 'remove' AND NOT EXISTS \
                      (SELECT 1 FROM taskhost_deployments r WHERE r.name = d.name \
                       AND r.version = d.version AND r.what = 'remove' AND r.seq > d.seq))",
                &[&digest],
            )
            .await?;
        }
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(removed)
    }

    /// A plugin's bytes, if the cluster holds it.
    pub(crate) async fn plugin_bytes(
        &self,
        digest: &Digest,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        Ok(opt(
            &client,
            "cannot read a plugin",
            "SELECT bytes FROM taskhost_plugins WHERE digest = $1",
            &[&&digest.0[..]],
        )
        .await?
        .map(|r| r.get(0)))
    }

    /// The cluster's stored plugins, oldest first, each with its tasks
    /// (unfinished and retained finished ones) and schedules of namespace
    /// `only` ('' the default one; `None` every namespace), and whether
    /// anything of any namespace uses it.
    pub(crate) async fn plugin_rows(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<(PluginRow, bool)>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot list the plugins",
            "WITH used AS ( \
                 SELECT digest, count(*) FILTER (WHERE state <> 'finished') AS unfinished, \
                     count(*) FILTER (WHERE state = 'finished') AS finished \
                 FROM taskhost_tasks WHERE $1::text IS NULL OR ns = $1 GROUP BY digest \
                 UNION ALL \
                 SELECT digest, count(*), 0 FROM taskhost_schedules WHERE $1::text IS NULL \
                     OR CASE WHEN $1 = '' THEN strpos(name, chr(31)) = 0 \
                         ELSE starts_with(name, $1 || chr(31)) END GROUP BY digest) \
             SELECT p.digest, p.name, octet_length(p.bytes)::int8, p.stored_ms, \
                 coalesce(sum(u.unfinished), 0)::int8, coalesce(sum(u.finished), 0)::int8, \
                 EXISTS (SELECT 1 FROM taskhost_tasks t WHERE t.digest = p.digest) \
                     OR EXISTS (SELECT 1 FROM taskhost_schedules s WHERE s.digest = p.digest) \
             FROM taskhost_plugins p LEFT JOIN used u ON u.digest = p.digest \
             GROUP BY p.digest ORDER BY p.stored_ms, p.digest",
            &[&only],
        )
        .await?;
        let n = |v: i64| v.max(0) as u64;
        rows.iter()
            .map(|row| {
                let digest: &[u8] = row.get(0);
                let digest = Digest(digest.try_into().map_err(|_| {
                    StoreError::Failed("a stored plugin's digest is not 32 bytes".into())
                })?);
                let plugin = PluginRow {
                    digest,
                    name: row.get(1),
                    bytes: n(row.get(2)),
                    stored_ms: n(row.get(3)),
                    unfinished: n(row.get(4)),
                    finished: n(row.get(5)),
                    loaded: false,
                };
                Ok((plugin, row.get(6)))
            })
            .collect()
    }
}
