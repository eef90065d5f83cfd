//! Owns the daemon's life: preparing the socket (owner-only, a stale one
//! replaced, a live one or a foreign file refused) and the state directory,
//! building the runtime, supervisor and controller from the settings, the
//! accept loop (bounded), and the graceful shutdown on a signal or a request.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{Semaphore, watch};

use taskhost_core::controller::Controller;
use taskhost_core::slot_settings::SlotRules;
use taskhost_core::supervisor::{ShutdownReport, Supervisor};
use taskhost_core::units::format_duration;
use taskhost_runtime::kv::KvBackend;
use taskhost_runtime::{
    DEFAULT_POOL_INSTANCES, KvLimits, MemoryKv, POOL_RESERVE, Runtime, RuntimeConfig, ScopeQuotas,
};

use crate::backend::OneHost;
use crate::backend::children::Children;
use crate::backend::daemon::{Daemon, Storage};
use crate::backend::recovery;
use crate::cluster::Cluster;
use crate::cluster::kv::ClusterKv;
use crate::config::DaemonConfig;
use crate::server::connection;
use crate::server::http;
use crate::service::history::History;
use crate::service::namespace::Ns;
use crate::service::plugins::{self, Plugins};
use crate::service::tasks::Tasks;
use crate::service::trees::Trees;
use crate::state_dir::{self, StateLock};
use crate::store::{Retention, Store, StoreSpec, Unfinished, postgres};
use crate::wire::socket;

/// How long, after the shutdown, open connections get to deliver their last
/// replies (the final reports of waiters, the shutdown answer) before the
/// process exits.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServeError(String);

/// Runs the daemon until SIGINT, SIGTERM or a shutdown request; removes the
/// socket on the way out. `ready` is called once the socket accepts
/// connections (for `--detach` and systemd's readiness notification).
///
/// Start-up goes in this order, each phase a function below: the places
/// (socket path, private state directory, its lock), the runtime and the
/// services guests reach through it, what the runtime's pool leaves room
/// for, the store (or the cluster's database), the supervisor and the
/// controller, the listeners, recovery and the background work; then the
/// accept loop, and the shutdown.
pub async fn serve(
    socket_path: PathBuf,
    config: DaemonConfig,
    ready: impl FnOnce(),
) -> Result<ShutdownReport, ServeError> {
    let http_plan = http::plan(&config).map_err(ServeError)?;
    let state_lock = claim_places(&socket_path, &config).await?;
    let spec = StoreSpec::parse(&config.store, &config.state_dir).map_err(ServeError)?;
    if matches!(spec, StoreSpec::Postgres(_)) && !config.namespaces.is_empty() {
        return Err(ServeError(
            "the config file's `namespaces` table is one host's: a cluster's namespaces live \
             in its database, the same for every node; set them with `host ns add|set` and \
             remove the `namespaces` table to serve a cluster"
                .into(),
        ));
    }
    if matches!(spec, StoreSpec::Postgres(_)) && !config.slot_rules.is_empty() {
        return Err(ServeError(
            "the config file's `slots` table is one host's: a cluster's rules live in its \
             database, the same for every node; set them with `host slot set` and remove the \
             `slots` table to serve a cluster"
                .into(),
        ));
    }
    let guests = GuestServices::new(&config);
    let runtime = start_runtime(&config, &guests, &spec)?;
    let (max_concurrent, settings) = fit_to_pool(&runtime, &config);
    let store_lock = lock_store_file(&spec, &config, &socket_path)?;
    let (storage, unfinished) = open_storage(&spec, &config, max_concurrent, &guests).await?;
    let controller = controller(&config, &storage, max_concurrent);
    let http_bound = match http_plan {
        Some(plan) => Some(http::bind(plan).await.map_err(ServeError)?),
        None => None,
    };
    if let Some(bound) = &http_bound {
        // Guests' outbound HTTP reaches this listener only by its address.
        runtime.add_own_address(bound.local_addr());
    }
    let listener = UnixListener::bind(&socket_path)
        .map_err(|e| ServeError(format!("cannot listen on `{}`: {e}", socket_path.display())))?;
    socket::restrict(&socket_path).map_err(ServeError)?;

    let runtime = Arc::new(runtime);
    let history = History::start(controller.supervisor());
    let (stop, stop_rx) = watch::channel(None);
    let daemon = Arc::new(Daemon {
        config: settings,
        plugins: Plugins::new(Arc::clone(&runtime), config.state_dir.clone()),
        controller,
        tasks: Tasks::retaining(storage.is_durable(), config.retention()),
        history,
        storage,
        admission: Mutex::new(()),
        keep_unfinished: AtomicBool::new(false),
        shutdown_requested: AtomicBool::new(false),
        recording: Default::default(),
        trees: guests.children.trees(),
        namespaces: crate::service::namespace::Namespaces::with_kv_quotas(Arc::clone(
            &guests.kv_quotas,
        )),
        stop,
        closed: watch::channel(false).0,
    });
    guests.children.attach(&daemon);
    let http_server = start_work(&daemon, http_bound, unfinished).await;
    tracing::info!(
        socket = %socket_path.display(),
        state_dir = %config.state_dir.display(),
        store = %match &daemon.storage {
            Storage::Local(host) => format!("{:?}", host.store),
            Storage::Shared(c) => format!("{:?} (node {})", c.pg, c.node()),
        },
        allocator = ?runtime.allocator(),
        realtime_ticker = runtime.realtime_ticker(),
        max_concurrent,
        max_parked = daemon.config.max_parked,
        worker_threads = config.worker_threads,
        "taskhost daemon listening"
    );
    // The handlers first: a SIGTERM right after readiness (systemd, a
    // script) is a graceful stop, not the default action's kill.
    let signals = Signals::install().map_err(|e| ServeError(e.to_string()))?;
    ready();

    let connections = Arc::new(Semaphore::new(config.max_connections));
    let grace = accept(&listener, &daemon, &connections, signals, stop_rx).await;
    // Stop taking connections first, so nobody submits into a closing host.
    drop(listener);
    let (report, http_draining) = shut_down(&daemon, grace, &socket_path, http_server).await;
    // Everything is committed: another daemon may use the directory now.
    drop(store_lock);
    drop(state_lock);
    daemon.closed.send_replace(true);
    // Every waiter's report is on its way: let the connections put them on
    // the wire before the process exits (a client gets its report and
    // leaves; one that lingers is not waited for long).
    let all = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(FLUSH_GRACE, connections.acquire_many(all)).await;
    if let Some(draining) = http_draining {
        draining.drained(FLUSH_GRACE).await;
    }
    Ok(report)
}

/// Makes the daemon's places its own: the socket's directory and path, the
/// private state directory, its lock (one daemon per state directory, and
/// so per store file: taken before the store is opened, so a second daemon
/// never recovers the first one's live work) and its plugins directory;
/// and raises the limit on open files.
async fn claim_places(socket_path: &Path, config: &DaemonConfig) -> Result<StateLock, ServeError> {
    socket::prepare_dir(socket_path).map_err(ServeError)?;
    claim_socket_path(socket_path).await.map_err(ServeError)?;
    state_dir::prepare(&config.state_dir).map_err(ServeError)?;
    let state_lock = StateLock::acquire(
        &config.state_dir.join(state_dir::LOCK_FILE),
        socket_path,
        &format!("the state directory {}", config.state_dir.display()),
    )
    .map_err(ServeError)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(config.state_dir.join("plugins"))
        .map_err(|e| {
            ServeError(format!(
                "cannot create the state directory `{}`: {e}",
                config.state_dir.display()
            ))
        })?;
    raise_descriptor_limit();
    Ok(state_lock)
}

/// What guests reach through the runtime besides the sandbox: key-value
/// buckets (one host's in memory, journaled to its store; a cluster's in
/// its database) and child tasks.
struct GuestServices {
    kv: Arc<MemoryKv>,
    /// The namespaces' quotas on their buckets' bytes.
    kv_quotas: Arc<ScopeQuotas>,
    cluster_kv: ClusterKv,
    children: Children,
}

impl GuestServices {
    fn new(config: &DaemonConfig) -> Self {
        let limits = KvLimits {
            max_bucket_bytes: config.kv_max_bucket,
            max_total_bytes: config.kv_max_total,
        };
        let kv_quotas = Arc::<ScopeQuotas>::default();
        Self {
            kv: crate::service::kv::buckets(limits, Arc::clone(&kv_quotas)),
            cluster_kv: ClusterKv::new(limits, Arc::clone(&kv_quotas)),
            kv_quotas,
            children: Children::new(Trees::default()),
        }
    }

    /// The buckets guests of this store use.
    fn kv_backend(&self, spec: &StoreSpec) -> Arc<dyn KvBackend> {
        match spec {
            StoreSpec::Postgres(_) => Arc::new(self.cluster_kv.clone()),
            _ => Arc::clone(&self.kv) as _,
        }
    }
}

/// The runtime: its cache under the state directory, its instance pool,
/// the guests' limits, secrets, configuration values, buckets and
/// children.
fn start_runtime(
    config: &DaemonConfig,
    guests: &GuestServices,
    spec: &StoreSpec,
) -> Result<Runtime, ServeError> {
    /// How much lower than the daemon's the priority of its compiles is.
    const COMPILE_NICE: i32 = 10;
    let secrets =
        taskhost_runtime::Secrets::for_daemon(config.secrets_dir.as_deref(), &config.secret_env)
            .map_err(|e| ServeError(e.to_string()))?;
    Runtime::new(
        &RuntimeConfig::default()
            .cache_dir(Some(config.state_dir.join("wasmtime-cache")))
            .epoch_tick(config.epoch_tick)
            .pool_instances(config.pool_instances.unwrap_or_else(|| {
                // Room for every attempt the daemon may run at once, every
                // parent parked while it waits for its children, and the
                // `describe` calls of plugins loaded meanwhile.
                let wanted = config
                    .max_concurrent
                    .saturating_add(config.max_parked)
                    .saturating_add(POOL_RESERVE as usize);
                u32::try_from(wanted)
                    .unwrap_or(u32::MAX)
                    .max(DEFAULT_POOL_INSTANCES)
            }))
            .plugin_cache_bytes(Some(config.plugin_cache))
            .guest_limits(config.guest_limits())
            .secrets(secrets)
            .config(config.config_vars.clone())
            .key_value(guests.kv_backend(spec))
            .child_tasks(Arc::new(guests.children.clone()))
            // Running tasks first: a compile takes the cores they leave.
            .compile_nice(Some(COMPILE_NICE)),
    )
    .map_err(|e| ServeError(e.to_string()))
}
/// What the runtime's instance pool leaves room for: the attempts that may
/// run at once (they wait for a permit rather than find the pool full),
/// and the settings the daemon runs with, its parked parents cut to what
/// running attempts leave of the pool (they hold instances too).
fn fit_to_pool(runtime: &Runtime, config: &DaemonConfig) -> (usize, DaemonConfig) {
    let mut max_concurrent = config.max_concurrent;
    if let Some(capacity) = runtime.allocator().attempt_capacity()
        && capacity < max_concurrent
    {
        tracing::warn!(
            "max_concurrent {max_concurrent} is more than this process can run at once; \
             running at most {capacity} attempts at once, bounded by {}",
            runtime.allocator().capacity_reason()
        );
        max_concurrent = capacity;
    }
    let mut settings = config.clone();
    if let Some(capacity) = runtime.allocator().attempt_capacity() {
        let room = capacity.saturating_sub(max_concurrent);
        if room < settings.max_parked {
            tracing::warn!(
                "max_parked {} is more than the instance pool leaves beside {max_concurrent} \
                 running attempts; at most {room} parents may wait parked at once (raise \
                 --pool-instances, or lower --max-concurrent)",
                settings.max_parked
            );
            settings.max_parked = room;
        }
    }
    if !runtime.realtime_ticker() {
        tracing::info!(
            "the epoch ticker runs at normal priority (real-time priority needs CAP_SYS_NICE \
             or an RLIMIT_RTPRIO of at least 1, e.g. systemd's LimitRTPRIO=1): while guests \
             hold every core, a force-abort or timeout can be late by a scheduler tick"
        );
    }
    (max_concurrent, settings)
}

/// A store file outside the state directory gets a lock of its own.
fn lock_store_file(
    spec: &StoreSpec,
    config: &DaemonConfig,
    socket_path: &Path,
) -> Result<Option<StateLock>, ServeError> {
    match spec {
        StoreSpec::Sqlite(path) if !path.starts_with(&config.state_dir) => {
            let mut lock = path.as_os_str().to_owned();
            lock.push(".lock");
            StateLock::acquire(
                Path::new(&lock),
                socket_path,
                &format!("the store {}", path.display()),
            )
            .map(Some)
            .map_err(ServeError)
        }
        _ => Ok(None),
    }
}

/// Opens where accepted work is kept: this host's store (with the
/// unfinished work it holds, and the guests' buckets loaded from it), or a
/// cluster's database, which this node joins.
async fn open_storage(
    spec: &StoreSpec,
    config: &DaemonConfig,
    max_concurrent: usize,
    guests: &GuestServices,
) -> Result<(Storage, Vec<Unfinished>), ServeError> {
    let fail = |e: &dyn std::fmt::Display| ServeError(e.to_string());
    match spec {
        StoreSpec::Postgres(url) => {
            let pool = config.max_connections.clamp(4, 16);
            let pg = postgres::open(
                url,
                crate::cluster::timeouts(&config.cluster),
                config.cluster.notify,
                pool,
            )
            .await
            .map_err(|e| fail(&e))?;
            let cluster = Cluster::join(
                pg,
                config.cluster.clone(),
                max_concurrent,
                config.event_lane_capacity,
            )
            .await
            .map_err(|e| fail(&e))?;
            guests.cluster_kv.attach(&cluster);
            Ok((Storage::Shared(cluster), Vec::new()))
        }
        local => {
            let (max_finished, max_bytes) = config.retention();
            let retention = Retention {
                max_finished,
                max_age: config.retain_for,
                max_bytes,
                key_age: config.idempotency_retention,
            };
            let (store, unfinished) = Store::open(local, retention).map_err(|e| fail(&e))?;
            if !store.is_durable() {
                tracing::warn!("the store is memory: accepted work is lost when the daemon stops");
            }
            crate::service::kv::attach(&guests.kv, &store);
            let host = OneHost::new(store, config.idempotency_retention, Arc::clone(&guests.kv));
            Ok((Storage::Local(Arc::new(host)), unfinished))
        }
    }
}

/// The supervisor (its ids continuing the store's; a cluster's come from
/// its database) under the controller.
fn controller(config: &DaemonConfig, storage: &Storage, max_concurrent: usize) -> Controller {
    let first_id = match storage {
        Storage::Local(host) => host.store.first_id(),
        Storage::Shared(_) => 1,
    };
    let supervisor = Supervisor::builder()
        .first_id(first_id)
        .max_concurrent(max_concurrent)
        .grace(config.grace)
        .bus_capacity(config.event_lane_capacity)
        .build();
    // Every attempt the daemon may run and every pending submission may
    // have a slot of its own (the controller's default of 10,000 refused
    // the 10,001st slot of a daemon running 10,000 tasks).
    let max_slots = config
        .max_concurrent
        .saturating_add(config.max_total_pending)
        .max(10_000);
    Controller::builder(supervisor)
        .max_slot_queue(config.max_slot_queue)
        .max_total_pending(config.max_total_pending)
        .max_delayed(config.max_delayed)
        .max_slots(max_slots)
        .build()
}

/// Starts what runs beside the connections: the HTTP listener (before
/// recovery, so the metrics count the recovered work too), the recovery of
/// the store's unfinished work, the schedules, a cluster node's loops, and
/// the collection of unused plugins.
async fn start_work(
    daemon: &Arc<Daemon>,
    http_bound: Option<http::Bound>,
    unfinished: Vec<Unfinished>,
) -> Option<http::Server> {
    let http_server = http_bound.map(|bound| http::start(bound, daemon));
    if let Some(host) = daemon.one_host() {
        // Before recovery: recovered work is placed by the slots' rules.
        let mut rules = SlotRules::default();
        let stored = host.store.take_slot_rules();
        for (pattern, settings) in stored.into_iter().chain(daemon.config.slot_rules.clone()) {
            if let Err(e) = rules.set(&pattern, settings) {
                tracing::error!("slot rule `{pattern}` cannot be used ({e}); skipping it");
            }
        }
        daemon.controller.set_slot_rules(rules);
        let file = (daemon.config.namespaces.iter()).map(|(n, e)| (n.clone(), e.clone().into()));
        for (name, settings) in host.store.take_namespaces().into_iter().chain(file) {
            crate::backend::set_namespace(daemon, Ns::named(Some(&name)), Some(settings));
        }
        // A rate-limited slot starts nothing until a period after the
        // latest start the store recorded (the budget before the restart
        // is not known). A start longer ago than the longest rate's
        // period holds nothing, so only those since are read.
        let now = (tokio::time::Instant::now(), crate::store::now_ms());
        let rules = daemon.controller.slot_rules().rules();
        let longest = rules
            .iter()
            .filter_map(|(_, s)| s.rate.map(|r| r.per))
            .max();
        let starts = longest.map_or_else(Vec::new, |per| {
            host.store
                .last_starts(now.1.saturating_sub(per.as_millis() as u64))
        });
        let last: Vec<(String, tokio::time::Instant)> = starts
            .into_iter()
            .filter_map(|(slot, ms)| {
                let ago = std::time::Duration::from_millis(now.1.saturating_sub(ms));
                Some((slot, now.0.checked_sub(ago)?))
            })
            .collect();
        daemon.controller.hold_slot_rates(&last);
    }
    if let Some(host) = daemon.one_host()
        && !unfinished.is_empty()
    {
        let started = std::time::Instant::now();
        let done = recovery::recover(daemon, host, unfinished).await;
        tracing::info!(
            requeued = done.requeued,
            retried = done.retried,
            ended = done.ended,
            took = %format_duration(started.elapsed()),
            "recovered unfinished work from the store"
        );
    }
    crate::backend::schedules::start(daemon).await;
    crate::backend::node::start(daemon);
    collect_unused_plugins(daemon);
    http_server
}

/// Collects unused plugins before the daemon listens, then every minute
/// (blocking file work under the admission lock, off the async workers).
fn collect_unused_plugins(daemon: &Arc<Daemon>) {
    plugins::collect(daemon.plugin_users(), daemon.config.keep_unused_plugins);
    // Weak: the collector must not keep the daemon (and its store's
    // writer, which folds the WAL in when it ends) alive past the stop.
    let daemon = Arc::downgrade(daemon);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(plugins::COLLECT_EVERY);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(daemon) = daemon.upgrade() else {
                return;
            };
            let _ = tokio::task::spawn_blocking(move || {
                plugins::collect(daemon.plugin_users(), daemon.config.keep_unused_plugins)
            })
            .await;
        }
    });
}

/// The signals that stop the daemon gracefully.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }
}

/// Accepts connections (at most `max_connections` at once; one more is
/// closed at once) until a signal or a shutdown request; returns the grace
/// the running tasks get.
async fn accept(
    listener: &UnixListener,
    daemon: &Arc<Daemon>,
    connections: &Arc<Semaphore>,
    mut signals: Signals,
    mut stop_rx: watch::Receiver<Option<Duration>>,
) -> Duration {
    let config = &daemon.config;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of file descriptors and the like: do not spin.
                        tracing::warn!("accept failed: {err}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(connections).try_acquire_owned() else {
                    tracing::warn!("connection refused: {} connections are open", config.max_connections);
                    continue;
                };
                let daemon = Arc::clone(daemon);
                tokio::spawn(async move {
                    if let Err(err) = connection::serve(daemon, stream).await {
                        tracing::debug!("connection ended: {err}");
                    }
                    drop(permit);
                });
            }
            _ = signals.interrupt.recv() => return config.grace,
            _ = signals.terminate.recv() => return config.grace,
            changed = stop_rx.changed() => {
                if changed.is_ok() && let Some(grace) = *stop_rx.borrow() {
                    return grace;
                }
            }
        }
    }
}

/// The graceful stop once no connection is taken: the HTTP listener
/// closed (returned draining), unfinished work kept for the next start
/// when the store is durable (unless a request said otherwise), a cluster
/// node's claiming stopped, the socket removed, the tasks given `grace`,
/// every outcome recorded and the store closed, and a cluster node's
/// unfinished work left to the others.
async fn shut_down(
    daemon: &Arc<Daemon>,
    grace: Duration,
    socket_path: &Path,
    http_server: Option<http::Server>,
) -> (ShutdownReport, Option<http::Draining>) {
    let http_draining = http_server.map(http::Server::stop);
    // A signal is a graceful stop: with a durable store, unfinished work
    // waits for the next start (a shutdown request has set this already,
    // unless it asked to cancel everything).
    if !daemon.shutdown_requested.load(Ordering::SeqCst) {
        daemon
            .keep_unfinished
            .store(daemon.storage.is_durable(), Ordering::SeqCst);
    }
    if let Some(cluster) = daemon.cluster() {
        cluster.stop_claiming();
    }
    let _ = std::fs::remove_file(socket_path);
    tracing::info!(grace = %format_duration(grace), "taskhost daemon shutting down");
    // Single-flight: if a client asked for the shutdown, this is its report.
    let report = daemon.controller.shutdown(grace).await;
    match &report {
        ShutdownReport::AllStopped => tracing::info!("all tasks stopped within the grace"),
        ShutdownReport::GraceExceeded { stuck } => {
            tracing::warn!("force-aborted after the grace: {}", stuck.join(", "));
        }
    }
    // Every task has ended: their outcomes are recorded, and everything
    // written so far is committed, before the process may exit.
    if tokio::time::timeout(FLUSH_GRACE, daemon.recording.idle())
        .await
        .is_err()
    {
        tracing::warn!("some outcomes were still being recorded at exit");
    }
    if let Some(store) = daemon.local_store()
        && let Err(err) = store.close().committed().await
    {
        tracing::error!("the store's last writes failed: {err}");
    }
    // A cluster node's unfinished work goes to the other nodes now.
    crate::backend::node::leave(daemon).await;
    (report, http_draining)
}

/// Makes the socket path free: a live daemon there is an error, a stale
/// socket is removed, any other file is left alone and refused.
async fn claim_socket_path(socket_path: &Path) -> Result<(), String> {
    if !socket_path.exists() {
        return Ok(());
    }
    if UnixStream::connect(socket_path).await.is_ok() {
        return Err(format!(
            "a daemon is already listening on `{}`; stop it with `host shutdown` or choose another --socket",
            socket_path.display()
        ));
    }
    // Only a socket is a stale daemon's to replace; never delete a file.
    let is_socket = std::fs::symlink_metadata(socket_path)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
    if !is_socket {
        return Err(format!(
            "`{}` exists and is not a socket; choose another --socket",
            socket_path.display()
        ));
    }
    std::fs::remove_file(socket_path).map_err(|e| {
        format!(
            "cannot remove the stale socket `{}`: {e}",
            socket_path.display()
        )
    })
}

/// Raises this process's soft limit on open files to its hard limit: every
/// connection, plugin file and guest's open file holds a descriptor, and a
/// daemon that runs out cannot accept its own clients.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::debug!(
                "raised the open-file limit from {:?} to {:?}",
                limit.current,
                limit.maximum
            ),
            Err(e) => tracing::warn!("cannot raise the open-file limit: {e}"),
        }
    }
}
