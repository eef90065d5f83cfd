//! Owns what every connection of one daemon shares: its settings, the plugin
//! store (with the runtime), the controller (with the supervisor), the
//! memory of submissions, the durable store, the event history, and the
//! stop request.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::controller::Controller;

use super::config::DaemonConfig;
use super::history::History;
use super::plugins::Plugins;
use super::store::Store;
use super::tasks::Tasks;

/// The shared state of one daemon.
pub(crate) struct Daemon {
    pub config: DaemonConfig,
    pub plugins: Plugins,
    pub controller: Controller,
    pub tasks: Tasks,
    pub history: Arc<History>,
    /// Where accepted work, its state and its outcomes are kept.
    pub store: Store,
    /// Held from a submission's id to its placement, so the store's order
    /// of submissions is the controller's.
    pub admission: Mutex<()>,
    /// Set when a graceful stop keeps unfinished work for the next start:
    /// outcomes the stop itself causes are not recorded.
    pub keep_unfinished: AtomicBool,
    /// Set by a `Shutdown` request (which chose `keep_unfinished` itself).
    pub shutdown_requested: AtomicBool,
    /// Set by a `Shutdown` request: the grace the accept loop shuts down
    /// with.
    pub stop: watch::Sender<Option<Duration>>,
}
