//! Owns what one node of a cluster holds between its loops and the verbs
//! it answers: the shared database, its id and lease, the tasks it claimed
//! and their fencing tokens, and the signals (new work, outcomes, polls)
//! that wake them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::{Notify, broadcast, watch};

use taskhost_core::controller::Controller;
use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, TaskId};
use taskhost_runtime::{Digest, Plugin};

use crate::config::ClusterSettings;
use crate::service::error::ServiceError;
use crate::service::plugins::Plugins;
use crate::store::postgres::{Claimed, Pg};
use crate::store::{Finished, StoreError};

/// Lines waiting to be shipped to the database; beyond it, lines are not
/// shipped (they stay in the node's log, and in the outcome's).
const SHIP_QUEUE: usize = 65_536;
/// Most lines shipped in one statement.
pub(crate) const SHIP_BATCH: usize = 1_000;

/// One node's part of the cluster.
pub(crate) struct Cluster {
    pub(crate) pg: Pg,
    pub(crate) name: String,
    pub(crate) settings: ClusterSettings,
    pub(crate) capacity: usize,
    /// This node's id (a new one after it lost its lease and joined again).
    pub(crate) node: AtomicI64,
    /// Wakes the claim loop.
    pub(crate) wake: Notify,
    /// Wakes the time loop (a due time may have changed).
    pub(crate) time: Notify,
    /// Wakes the feed (a node shipped events).
    pub(crate) events: Notify,
    /// Ids of tasks whose outcome was just recorded (from notifications, and
    /// from this node's own records).
    pub(crate) finished: broadcast::Sender<TaskId>,
    /// The tasks clients wait on through this node, with how many wait on
    /// each: every poll looks them all up in one statement, and tells
    /// `finished` of those that ended.
    pub(crate) waited: Mutex<HashMap<TaskId, usize>>,
    /// The cluster's new events, read once per poll for all of this node's
    /// followers (`cluster::follow_events`).
    pub(crate) feed: broadcast::Sender<Arc<Event>>,
    /// True once the feed's reader has its starting point.
    pub(crate) feed_ready: watch::Sender<bool>,
    pub(crate) feed_started: AtomicBool,
    /// The tasks this node claimed and still runs, with their tokens.
    pub(crate) claims: Mutex<HashMap<TaskId, i64>>,
    /// Claimed tasks already told to stop here.
    pub(crate) stopped: Mutex<HashSet<TaskId>>,
    /// Tasks whose claim this node gave up with its lease while their
    /// attempt still ran here: the events of their end are this node's
    /// alone (another node owns the task now), so they are not shipped.
    /// Each leaves the set at its `TaskRemoved`.
    pub(crate) fenced: Mutex<HashSet<TaskId>>,
    /// Set at a graceful stop: no more claims.
    pub(crate) closing: AtomicBool,
    /// Set once the node has left the cluster: its lease is no longer
    /// renewed (nor taken again).
    pub(crate) left: AtomicBool,
    /// When the last successful renewal (or registration) of the lease
    /// started: the node fences itself `fence_after` later unless another
    /// one succeeds.
    pub(crate) renewed: Mutex<Instant>,
    /// Held while the node gives up a lost lease and joins again.
    pub(crate) rejoin: tokio::sync::Mutex<()>,
    /// Set from the moment the node gives up a lost lease until it has
    /// joined again: it renews nothing and claims nothing meanwhile (its
    /// old id's work is the cluster's to take over).
    pub(crate) rejoining: AtomicBool,
    /// Set while a takeover of dead nodes' work runs (one at a time, off
    /// the lease loop).
    pub(crate) taking_over: AtomicBool,
    /// Held while a plugin is fetched from the database.
    pub(crate) fetching: tokio::sync::Mutex<()>,
    /// Lines of running tasks on their way to the database.
    pub(crate) ship: tokio::sync::mpsc::Sender<(TaskId, i64, LogLine)>,
    pub(crate) shipped: Mutex<Option<tokio::sync::mpsc::Receiver<(TaskId, i64, LogLine)>>>,
    /// Deployments' events by name, each as read from the database and
    /// when that read started: submissions by name resolve from it for
    /// [`DEPLOYMENTS_FRESH`], and a deploy answers only after that long,
    /// so no node resolves to a version older than the last answered.
    pub(crate) deployments:
        Mutex<HashMap<String, (Instant, Arc<crate::service::deployments::Deployments>)>>,
    /// Room held for claims on their way (a claim's statement, or an
    /// admission that claims what it inserts); counted under `claims`.
    pub(crate) reserved: AtomicUsize,
    /// Tasks this node's admissions claimed at their insert, to run.
    pub(crate) direct: tokio::sync::mpsc::UnboundedSender<Claimed>,
    pub(crate) directed: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Claimed>>>,
    /// Set when a commit that claimed tasks went unanswered: the claim
    /// loop reads this node's claims back.
    pub(crate) recheck: AtomicBool,
}

/// How long a node resolves submissions by name from the events it read
/// (see [`Cluster::deployments`]).
pub(crate) const DEPLOYMENTS_FRESH: std::time::Duration = std::time::Duration::from_millis(100);

impl Cluster {
    /// Joins the cluster: registers this node.
    pub(crate) async fn join(
        pg: Pg,
        settings: ClusterSettings,
        capacity: usize,
        lane: usize,
    ) -> Result<Arc<Self>, StoreError> {
        if settings.renew >= settings.fence_after() {
            return Err(StoreError::Failed(format!(
                "the lease renewal ({}) must be shorter than three quarters of the lease ({}): \
                 a node that has not renewed its lease for {} fences itself",
                taskhost_core::units::format_duration(settings.renew),
                taskhost_core::units::format_duration(settings.lease),
                taskhost_core::units::format_duration(settings.fence_after())
            )));
        }
        let name = settings.node_name.clone().unwrap_or_else(default_node_name);
        let registering = Instant::now();
        let node = pg.register_node(&name, capacity, settings.lease).await?;
        let (ship, shipped) = tokio::sync::mpsc::channel(SHIP_QUEUE);
        let (direct, directed) = tokio::sync::mpsc::unbounded_channel();
        Ok(Arc::new_cyclic(|me: &std::sync::Weak<Self>| {
            let (room, wake, id) = (me.clone(), me.clone(), me.clone());
            let (reserve, claimed, unsure) = (me.clone(), me.clone(), me.clone());
            pg.set_node(crate::store::postgres::NodeHooks {
                room: Box::new(move || room.upgrade().map_or(0, |c| c.room())),
                wake: Box::new(move || {
                    if let Some(c) = wake.upgrade() {
                        c.wake.notify_one();
                    }
                }),
                id: Box::new(move || id.upgrade().map_or(0, |c| c.node())),
                reserve: Box::new(move |n| reserve.upgrade().map_or(0, |c| c.reserve(n))),
                claimed: Box::new(move |tasks, held| {
                    if let Some(c) = claimed.upgrade() {
                        c.claimed_here(tasks, held);
                    }
                }),
                unsure: Box::new(move || {
                    if let Some(c) = unsure.upgrade() {
                        c.recheck.store(true, Ordering::SeqCst);
                        c.wake.notify_one();
                    }
                }),
            });
            Self {
                ship,
                shipped: Mutex::new(Some(shipped)),
                pg,
                name,
                settings,
                capacity,
                node: AtomicI64::new(node),
                wake: Notify::new(),
                time: Notify::new(),
                events: Notify::new(),
                finished: broadcast::channel(4096).0,
                waited: Mutex::default(),
                feed: broadcast::channel(lane.max(1)).0,
                feed_ready: watch::channel(false).0,
                feed_started: AtomicBool::new(false),
                claims: Mutex::default(),
                stopped: Mutex::default(),
                fenced: Mutex::default(),
                closing: AtomicBool::new(false),
                left: AtomicBool::new(false),
                renewed: Mutex::new(registering),
                rejoin: tokio::sync::Mutex::new(()),
                rejoining: AtomicBool::new(false),
                deployments: Mutex::default(),
                taking_over: AtomicBool::new(false),
                fetching: tokio::sync::Mutex::new(()),
                reserved: AtomicUsize::new(0),
                direct,
                directed: Mutex::new(Some(directed)),
                recheck: AtomicBool::new(false),
            }
        }))
    }

    /// This node's id.
    pub(crate) fn node(&self) -> i64 {
        self.node.load(Ordering::SeqCst)
    }

    pub(crate) fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, i64>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this node still holds `token` for `id`.
    pub(crate) fn holds(&self, id: TaskId, token: i64) -> bool {
        self.claims().get(&id) == Some(&token)
    }

    /// Runs a write of the attempt this node runs for `id` under `token`
    /// until the database takes it: one that could not reach the database
    /// is tried again after the outage's pause, for as long as this node
    /// holds the claim (it gives it up when it fences itself, a quarter of
    /// a lease before another node may take the task over). `None` once
    /// the claim is gone; an error that is not the database being away is
    /// the write's answer.
    pub(crate) async fn while_held<T, F, Fut>(
        &self,
        id: TaskId,
        token: i64,
        what: &str,
        mut write: F,
    ) -> Option<Result<T, StoreError>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut tries = 0;
        loop {
            if !self.holds(id, token) {
                return None;
            }
            match write().await {
                Err(err) if err.is_unreachable() => {
                    self.pg.outage().failed(what, &err);
                    tokio::time::sleep(crate::store::postgres::outage::pause(tries)).await;
                    tries += 1;
                }
                answer => {
                    if answer.is_ok() {
                        self.pg.outage().reached();
                    }
                    return Some(answer);
                }
            }
        }
    }

    /// Forgets a claim that ended here (not a newer claim of the same task).
    pub(crate) fn release(&self, id: TaskId, token: i64) {
        let mut claims = self.claims();
        if claims.get(&id) == Some(&token) {
            claims.remove(&id);
            self.stopped
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        }
    }

    /// How many more tasks this node would claim now.
    pub(crate) fn room(&self) -> usize {
        self.room_in(&self.claims())
    }

    fn room_in(&self, claims: &HashMap<TaskId, i64>) -> usize {
        if self.closing.load(Ordering::SeqCst) || self.rejoining.load(Ordering::SeqCst) {
            return 0;
        }
        self.capacity
            .saturating_sub(claims.len() + self.reserved.load(Ordering::SeqCst))
    }

    /// Holds up to `n` of this node's room for claims on their way; how
    /// many it holds (freed by [`Cluster::unreserve`], or by the claims).
    pub(crate) fn reserve(&self, n: usize) -> usize {
        let claims = self.claims();
        let held = n.min(self.room_in(&claims));
        self.reserved.fetch_add(held, Ordering::SeqCst);
        held
    }

    pub(crate) fn unreserve(&self, held: usize) {
        let _claims = self.claims();
        self.reserved.fetch_sub(held, Ordering::SeqCst);
    }

    /// Counts the tasks an admission claimed at their insert as this
    /// node's, frees the room `held` for them, and hands them to be run.
    fn claimed_here(&self, tasks: Vec<Claimed>, held: usize) {
        {
            let mut claims = self.claims();
            for task in &tasks {
                claims.insert(task.id, task.token);
            }
            self.reserved.fetch_sub(held, Ordering::SeqCst);
        }
        for task in tasks {
            let _ = self.direct.send(task);
        }
    }

    /// Stops claiming (a graceful stop).
    pub(crate) fn stop_claiming(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Asks a task this node runs to stop (once).
    pub(crate) fn stop_local(&self, controller: &Controller, id: TaskId) {
        if !self.claims().contains_key(&id) {
            return;
        }
        if self
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id)
        {
            controller.remove(id);
        }
    }

    /// The plugin, from this node's store, else from the cluster's.
    pub(crate) async fn ensure_plugin(
        &self,
        plugins: &Plugins,
        digest: &Digest,
    ) -> Result<Arc<Plugin>, ServiceError> {
        self.ensure_plugin_for(plugins, digest, None).await
    }

    /// [`Cluster::ensure_plugin`] for the attempt this node runs under
    /// `claim`: a fetch the database cannot answer is tried again while
    /// the claim is held (`while_held`).
    pub(crate) async fn ensure_plugin_for(
        &self,
        plugins: &Plugins,
        digest: &Digest,
        claim: Option<(TaskId, i64)>,
    ) -> Result<Arc<Plugin>, ServiceError> {
        if let Some(plugin) = plugins.get(digest).await {
            return Ok(plugin);
        }
        // One fetch at a time: the claims of many tasks of a plugin new to
        // this node wait for the first to bring it.
        let _fetching = self.fetching.lock().await;
        if let Some(plugin) = plugins.get(digest).await {
            return Ok(plugin);
        }
        let fetched = match claim {
            None => self.pg.plugin_bytes(digest).await,
            Some((id, token)) => self
                .while_held(id, token, "fetching a plugin", || {
                    self.pg.plugin_bytes(digest)
                })
                .await
                .unwrap_or_else(|| {
                    Err(StoreError::Failed(
                        "this node's claim on the task was taken over while it fetched its \
                         plugin"
                            .into(),
                    ))
                }),
        };
        let bytes = fetched
            .map_err(|e| ServiceError::Internal(e.to_string()))?
            .ok_or_else(|| {
                ServiceError::NotFound(format!(
                    "the cluster does not know plugin {digest}; upload it first"
                ))
            })?;
        plugins.store(bytes, Some(*digest)).await
    }

    /// Waits until a task's outcome is recorded, whichever node ran it: woken
    /// by its notification, or by the poll that looks up every waited task.
    pub(crate) async fn wait_finished(&self, id: TaskId) -> Result<Finished, StoreError> {
        let mut finished = self.finished.subscribe();
        let _waiting = Waiting::new(self, id);
        loop {
            if let Some(done) = self.pg.finished(id).await? {
                return Ok(done);
            }
            loop {
                match finished.recv().await {
                    Ok(done) if done == id => break,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(StoreError::Failed("the node is stopping".into()));
                    }
                }
            }
        }
    }

    /// The tasks waited on through this node.
    pub(crate) fn waited(&self) -> Vec<TaskId> {
        self.waited
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }
}

/// One client waiting on a task, counted in `Cluster::waited` while it
/// waits.
struct Waiting<'a> {
    cluster: &'a Cluster,
    id: TaskId,
}

impl<'a> Waiting<'a> {
    fn new(cluster: &'a Cluster, id: TaskId) -> Self {
        *cluster
            .waited
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_default() += 1;
        Self { cluster, id }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waited = self
            .cluster
            .waited
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = waited.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                waited.remove(&self.id);
            }
        }
    }
}

fn default_node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into());
    format!("{host}-{}", std::process::id())
}
