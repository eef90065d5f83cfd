//! Owns a cluster's schedules: the verbs on the database's table of them.

use std::sync::Arc;

use crate::cluster::node::Cluster;
use crate::service::backend::Scheduled;
use crate::state::Daemon;
use crate::wire::protocol::{ErrorKind, ScheduleVerb};

/// A schedule verb on the cluster's database.
pub(crate) async fn verb(
    _daemon: &Arc<Daemon>,
    _cluster: &Arc<Cluster>,
    _verb: ScheduleVerb,
) -> Result<Scheduled, (ErrorKind, String)> {
    Err((ErrorKind::Internal, "not yet in cluster mode".into()))
}
