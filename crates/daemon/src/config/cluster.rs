//! Owns a cluster node's settings: its name, its lease and how often it
//! renews it, polling and notifications, and when it fences itself.

use std::time::Duration;

/// A node's cluster settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// This node's name in `host ps` [default: `<hostname>-<pid>`].
    pub node_name: Option<String>,
    /// How long a node's lease lasts without renewal.
    pub lease: Duration,
    /// How often a node renews it (and looks for expired ones).
    pub renew: Duration,
    /// How often a node polls for work, stops and outcomes, in case a
    /// notification was missed.
    pub poll: Duration,
    /// Whether nodes notify each other (LISTEN/NOTIFY); off only to test
    /// the polling fallback.
    pub notify: bool,
}

impl ClusterSettings {
    /// How long a node goes on without a successful renewal before it
    /// fences itself (stops its attempts, as if it had lost its lease): the
    /// lease less a quarter of it, counted by the node's own clock from the
    /// start of its last successful renewal. The quarter is the margin for
    /// the attempts to stop, and for the database's clock, before any other
    /// node may take the work over.
    pub fn fence_after(&self) -> Duration {
        self.lease - self.lease / 4
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            node_name: None,
            lease: Duration::from_secs(10),
            renew: Duration::from_secs(1),
            poll: Duration::from_secs(1),
            notify: true,
        }
    }
}
