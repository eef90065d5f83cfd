//! Owns what every connection of one daemon shares: its settings, the plugin
//! store (with the runtime), the controller (with the supervisor), the
//! memory of submissions, the durable store, the event history, and the
//! stop request.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use taskhost_core::controller::Controller;

use crate::backend::local::OneHost;
use crate::cluster::node::Cluster;
use crate::config::DaemonConfig;
use crate::service::history::History;
use crate::service::plugins::{Plugins, Users};
use crate::service::tasks::Tasks;
use crate::store::Store;

/// The shared state of one daemon.
pub(crate) struct Daemon {
    pub config: DaemonConfig,
    pub plugins: Plugins,
    pub controller: Controller,
    pub tasks: Tasks,
    pub history: Arc<History>,
    /// Where accepted work, its state and its outcomes are kept.
    pub storage: Storage,
    /// Held from a submission's id to its placement, so the store's order
    /// of submissions is the controller's.
    pub admission: Mutex<()>,
    /// Set when a graceful stop keeps unfinished work for the next start:
    /// outcomes the stop itself causes are not recorded.
    pub keep_unfinished: AtomicBool,
    /// Set by a `Shutdown` request (which chose `keep_unfinished` itself).
    pub shutdown_requested: AtomicBool,
    /// Outcomes being recorded: the daemon exits only after they are.
    pub recording: Recording,
    /// Spawn trees: who spawned whom in this run, each root's unfinished
    /// descendants.
    pub trees: crate::service::trees::Trees,
    /// The namespaces, their weights and quotas.
    pub namespaces: crate::service::namespace::Namespaces,
    /// Set by a `Shutdown` request: the grace the accept loop shuts down
    /// with.
    pub stop: watch::Sender<Option<Duration>>,
    /// Set once a stopping daemon has closed its store and released its
    /// state directory (the answer to `Shutdown` waits for it).
    pub closed: watch::Sender<bool>,
}

/// Where a daemon keeps its work: one of the two backends of
/// [`Backend`](crate::backend::Backend).
pub(crate) enum Storage {
    /// Its own store (SQLite or memory) and what else one host keeps
    /// itself: the controller decides.
    Local(Arc<OneHost>),
    /// A cluster's shared database (PostgreSQL): the database decides,
    /// this node runs what it claims.
    Shared(Arc<Cluster>),
}

impl Storage {
    /// Whether accepted work outlives this process.
    pub(crate) fn is_durable(&self) -> bool {
        match self {
            Self::Local(host) => host.store.is_durable(),
            Self::Shared(_) => true,
        }
    }
}

impl Daemon {
    /// Its own store, unless it is a cluster node.
    pub(crate) fn local_store(&self) -> Option<&Store> {
        self.one_host().map(|host| &host.store)
    }

    /// What one host keeps itself, unless it is a cluster node.
    pub(crate) fn one_host(&self) -> Option<&Arc<OneHost>> {
        match &self.storage {
            Storage::Local(host) => Some(host),
            Storage::Shared(_) => None,
        }
    }

    /// Its part of the cluster, if it is a node of one.
    pub(crate) fn cluster(&self) -> Option<&Arc<Cluster>> {
        match &self.storage {
            Storage::Local(_) => None,
            Storage::Shared(cluster) => Some(cluster),
        }
    }

    /// The handles removing plugins needs.
    pub(crate) fn plugin_users(&self) -> Users<'_> {
        Users {
            plugins: &self.plugins,
            store: self.local_store(),
            tasks: &self.tasks,
            schedules: self.one_host().map(|host| &**host as _),
            admission: &self.admission,
        }
    }
}

/// Counts the tasks whose outcome is still to be recorded, so the daemon
/// does not exit (and lose the store's last writes) before they are.
#[derive(Debug, Default)]
pub(crate) struct Recording {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One task's outcome still to be recorded; dropping it says it is.
pub(crate) struct RecordingGuard(Arc<Daemon>);

impl Recording {
    /// Waits until no outcome is left to record.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl RecordingGuard {
    pub(crate) fn new(daemon: &Arc<Daemon>) -> Self {
        daemon.recording.count.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(daemon))
    }
}

impl Drop for RecordingGuard {
    fn drop(&mut self) {
        if self.0.recording.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.recording.idle.notify_waiters();
        }
    }
}
