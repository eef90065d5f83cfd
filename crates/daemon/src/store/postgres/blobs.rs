//! Owns plugins stored in the database by digest: stored once, fetched by
//! the nodes that lack them, collected once no task refers to them.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use taskhost_runtime::Digest;

use crate::store::{StoreError, now_ms};

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
                     (SELECT 1 FROM taskhost_schedules WHERE digest = $1)",
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
}
