//! Owns what every connection of one daemon shares: its settings, the plugin
//! store (with the runtime), the controller (with the supervisor), the
//! memory of submissions, the event history, and the stop request.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::controller::Controller;

use super::config::DaemonConfig;
use super::history::History;
use super::plugins::Plugins;
use super::tasks::Tasks;

/// The shared state of one daemon.
pub(crate) struct Daemon {
    pub config: DaemonConfig,
    pub plugins: Plugins,
    pub controller: Controller,
    pub tasks: Tasks,
    pub history: Arc<History>,
    /// Set by a `Shutdown` request: the grace the accept loop shuts down
    /// with.
    pub stop: watch::Sender<Option<Duration>>,
}
