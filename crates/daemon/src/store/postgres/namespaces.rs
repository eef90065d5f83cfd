//! Owns a cluster's namespaces in its database: their settings, the same
//! for every node (each node keeps a copy it reads again every second and
//! on a name it does not know), and what each one uses, counted from the
//! tasks' rows (a namespaced row's name starts with its namespace's name
//! and U+001F).

use taskhost_core::slot_settings::SCOPE_SEPARATOR;

use super::*;
use crate::wire::protocol::NamespaceSettings;

/// What a namespace uses of its counted quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NamespaceUse {
    /// Its tasks running now (or stopping).
    pub running: u64,
    /// Its unfinished tasks.
    pub unfinished: u64,
    /// Its schedules.
    pub schedules: u64,
}

impl Pg {
    /// Every namespace the database holds.
    pub(crate) async fn namespaces(&self) -> Result<Vec<(String, NamespaceSettings)>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot read the namespaces",
            "SELECT name, settings FROM taskhost_namespaces ORDER BY name",
            &[],
        )
        .await?;
        let mut out = Vec::new();
        for row in rows {
            let name: String = row.get(0);
            match serde_json::from_str(row.get::<_, &str>(1)) {
                Ok(settings) => out.push((name, settings)),
                Err(e) => {
                    tracing::warn!("namespace `{name}` is left out: its settings do not read: {e}")
                }
            }
        }
        Ok(out)
    }

    /// Sets (`Some`) or removes a namespace, for every node.
    pub(crate) async fn set_namespace(
        &self,
        name: &str,
        settings: Option<&NamespaceSettings>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        match settings {
            Some(settings) => {
                let json = serde_json::to_string(settings)
                    .map_err(|e| StoreError::Failed(format!("cannot encode a namespace: {e}")))?;
                exec(
                    &client,
                    "cannot store the namespace",
                    "INSERT INTO taskhost_namespaces (name, settings) VALUES ($1, $2) \
                     ON CONFLICT (name) DO UPDATE SET settings = excluded.settings",
                    &[&name, &json],
                )
                .await?;
            }
            None => {
                exec(
                    &client,
                    "cannot remove the namespace",
                    "DELETE FROM taskhost_namespaces WHERE name = $1",
                    &[&name],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// What a namespace uses now, across every node (`None`: the default
    /// one, whose names hold no separator).
    pub(crate) async fn namespace_use(
        &self,
        name: Option<&str>,
    ) -> Result<NamespaceUse, StoreError> {
        let client = self.client().await?;
        let prefix = name.map(|name| format!("{name}{SCOPE_SEPARATOR}"));
        let row = one(
            &client,
            "cannot count a namespace's tasks",
            "SELECT count(*) FILTER (WHERE state IN ('running', 'stopping')), count(*), \
             (SELECT count(*) FROM taskhost_schedules WHERE CASE WHEN $1::text IS NULL \
                THEN strpos(name, chr(31)) = 0 ELSE starts_with(name, $1) END) \
             FROM taskhost_tasks WHERE (state = 'queued' OR state = 'delayed' \
                OR state IN ('ready', 'running', 'stopping')) AND CASE WHEN $1::text IS NULL \
                THEN strpos(name, chr(31)) = 0 ELSE starts_with(name, $1) END",
            &[&prefix],
        )
        .await?;
        let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
        Ok(NamespaceUse {
            running: n(0),
            unfinished: n(1),
            schedules: n(2),
        })
    }

    /// Takes one submission of namespace `name` from its rate of `rate`
    /// per second (a burst of as many), for every node's submissions: one
    /// bucket in the database, filled by the database's clock. False when
    /// the bucket holds less than one.
    pub(crate) async fn take_submission(&self, name: &str, rate: u64) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let rate = rate.max(1) as f64;
        let took = opt(
            &client,
            "cannot count a namespace's submissions",
            "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS ms) \
             INSERT INTO taskhost_submit_rates AS r (ns, tokens, at_ms) \
                 SELECT $1, $2::float8 - 1, ms FROM now \
             ON CONFLICT (ns) DO UPDATE SET at_ms = excluded.at_ms, tokens = \
                 least($2, r.tokens + greatest(0, excluded.at_ms - r.at_ms) * $2 / 1000.0) - 1 \
             WHERE least($2, r.tokens + greatest(0, excluded.at_ms - r.at_ms) * $2 / 1000.0) >= 1 \
             RETURNING 1",
            &[&name, &rate],
        )
        .await?;
        Ok(took.is_some())
    }
}
