//! Owns a cluster's named deployments in its database: every deploy,
//! rollback and removal, in order, the same for every node. A verb reads a
//! name's events, decides (`service::deployments`, in the backend), and
//! appends its event only after the newest one it read: a node that
//! decided on older events is told so and decides again.

use super::*;
use crate::wire::protocol::{DeploymentEvent, EventWhat};

/// A name's events as read, with the seq of its newest (0: none).
pub(crate) struct Events {
    pub events: Vec<DeploymentEvent>,
    pub newest: i64,
}

fn what(word: &str) -> Option<EventWhat> {
    match word {
        "deploy" => Some(EventWhat::Deploy),
        "rollback" => Some(EventWhat::Rollback),
        "remove" => Some(EventWhat::Remove),
        _ => None,
    }
}

impl Pg {
    /// The events of deployment `name`, or of every name, oldest first.
    pub(crate) async fn deployment_events(&self, name: Option<&str>) -> Result<Events, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot read the deployments",
            "SELECT seq, name, version, digest, at_ms, what FROM taskhost_deployments \
             WHERE $1::text IS NULL OR name = $1 ORDER BY seq",
            &[&name],
        )
        .await?;
        let mut events = Vec::with_capacity(rows.len());
        let mut newest = 0;
        for row in rows {
            newest = newest.max(row.get::<_, i64>(0));
            let name: String = row.get(1);
            let Some(what) = what(row.get(5)) else {
                tracing::warn!("a deployment event of `{name}` is left out: its kind is unknown");
                continue;
            };
            let Ok(digest) = <[u8; 32]>::try_from(row.get::<_, &[u8]>(3)) else {
                tracing::warn!("a deployment event of `{name}` is left out: its digest is damaged");
                continue;
            };
            events.push(DeploymentEvent {
                name,
                version: row.get(2),
                digest: taskhost_runtime::Digest(digest),
                at_ms: row.get::<_, i64>(4) as u64,
                what,
            });
        }
        Ok(Events { events, newest })
    }

    /// Appends `event` after the name's event `prev` (0: it has none).
    /// False when another node appended one after `prev` first.
    pub(crate) async fn append_deployment(
        &self,
        event: &DeploymentEvent,
        prev: i64,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let appended = exec(
            &client,
            "cannot store the deployment",
            "INSERT INTO taskhost_deployments (name, prev, version, digest, at_ms, what) \
             SELECT $1, $2, $3, $4, $5, $6 \
             WHERE coalesce((SELECT max(seq) FROM taskhost_deployments WHERE name = $1), 0) = $2 \
             ON CONFLICT (name, prev) DO NOTHING",
            &[
                &event.name,
                &prev,
                &event.version,
                &&event.digest.0[..],
                &(event.at_ms as i64),
                &event.what.word(),
            ],
        )
        .await?;
        Ok(appended == 1)
    }
}
