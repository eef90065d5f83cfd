//! Owns what a cluster node does that one host does not (the verbs it
//! answers are `shared.rs`'s). A node is
//! one `host serve --store postgres://…` process
//! among several that share one database. The database decides (admission,
//! claims, releases, takeovers: `store::postgres`); the node
//!
//! - claims ready work up to its `max_concurrent` and runs it in its own
//!   supervisor and controller, every write of an attempt conditional on
//!   the claim's fencing token (`record::Recorded::claimed`);
//! - renews its lease, and takes over the work of nodes whose lease ran out
//!   (recovery's `fate` decides each interrupted attempt);
//! - stops its attempts at once when it finds its own lease lost (paused or
//!   cut off past it), or by its own clock when no renewal has succeeded for
//!   three quarters of the lease (it fences itself before any other node may
//!   take its work over), records nothing for them, and joins again;
//! - hears about new work, stops and outcomes through LISTEN/NOTIFY, and
//!   polls for the same as the fallback.
//!

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use taskhost_core::controller::{AdmissionPolicy, Submission};
use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::{Event, EventKind, Resume, TaskId, TaskReport};
use taskhost_core::units::format_duration;
use taskhost_runtime::Digest;
use taskhost_runtime::plugin_task::PluginTask;

use crate::backend::daemon::{Daemon, RecordingGuard};
use crate::backend::shares::ClaimShares;
use crate::backend::{record, submit, time};
use crate::cluster::{Cluster, Shipping, event_loop, record_end, ship_loop};
use crate::service::intake;
use crate::service::tasks::{Outcome, TaskLog, TaskRecord};
use crate::store::postgres::outage::pause;
use crate::store::postgres::{self, Claimed};
use crate::store::{Finished, now_ms};

/// Most tasks claimed in one statement.
const CLAIM_BATCH: usize = 64;
/// How often retention runs on each node.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How often a node also applies the count and byte bounds of retention,
/// which read every finished task (age alone reads only the old ones).
const BOUNDS_EVERY: Duration = Duration::from_secs(600);
/// Orphaned tasks taken over per lease round.
const TAKEOVER_BATCH: i64 = 1_000;

/// Starts the node's loops: claims, lease and takeover, notifications, and
/// the polling fallback. They hold the daemon weakly and end with it.
pub(crate) fn start(daemon: &Arc<Daemon>) {
    let Some(cluster) = daemon.cluster() else {
        return;
    };
    tokio::spawn(claim_loop(Arc::downgrade(daemon)));
    tokio::spawn(namespaces_loop(Arc::downgrade(daemon)));
    tokio::spawn(lease_loop(Arc::downgrade(daemon)));
    tokio::spawn(fence_loop(Arc::downgrade(daemon)));
    tokio::spawn(poll_loop(Arc::downgrade(daemon)));
    tokio::spawn(time::time_loop(Arc::downgrade(daemon)));
    tokio::spawn(event_loop(
        Arc::downgrade(cluster),
        daemon.controller.supervisor().subscribe(),
    ));
    if let Some(lines) = cluster
        .shipped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        tokio::spawn(ship_loop(Arc::downgrade(cluster), lines));
    }
    if let Some(tasks) = cluster
        .directed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        tokio::spawn(direct_loop(Arc::downgrade(daemon), tasks));
    }
    if cluster.settings.notify {
        let (warm, uploaded) = tokio::sync::mpsc::channel(WARM_QUEUE);
        tokio::spawn(listen_loop(Arc::downgrade(daemon), warm));
        tokio::spawn(warm_loop(Arc::downgrade(daemon), uploaded));
    }
    tracing::info!(node = cluster.node(), name = %cluster.name, "joined the cluster");
}

/// At a graceful stop, once this node's tasks have ended: it leaves the
/// cluster, and its unfinished work is taken over now (by this node's own
/// last transaction), not after its lease.
pub(crate) async fn leave(daemon: &Arc<Daemon>) {
    let Some(cluster) = daemon.cluster() else {
        return;
    };
    let node = cluster.node();
    cluster.left.store(true, Ordering::SeqCst);
    if let Err(err) = cluster.pg.retire_node(node).await {
        tracing::error!("cannot leave the cluster ({err}); other nodes take over after the lease");
        return;
    }
    take_over(daemon, cluster).await;
    tracing::info!(node, "left the cluster");
}

/// A node that joins (or joins again) starts no rate-limited attempt for
/// a period of the rate after the other nodes have learnt of it (two
/// renewals): until then their shares count one node fewer, and what
/// they started in the period before is not known here.
fn hold_rates(daemon: &Weak<Daemon>) {
    if let Some(d) = daemon.upgrade()
        && let Some(cluster) = d.cluster()
    {
        let learnt = tokio::time::Instant::now() + cluster.settings.renew * 2;
        d.controller.hold_rates(learnt);
    }
}

/// How often a node reads the cluster's namespaces again.
const NAMESPACES_EVERY: Duration = Duration::from_secs(1);

/// Follows the cluster's namespaces (another node's `host ns` reaches this
/// one within a second; a name it does not know is read at once).
async fn namespaces_loop(daemon: Weak<Daemon>) {
    loop {
        {
            let Some(d) = daemon.upgrade() else { return };
            if d.cluster().is_none_or(|c| c.closing.load(Ordering::SeqCst)) {
                return;
            }
            if let Err(err) = crate::backend::Backend::daemon_wide(&d)
                .refresh_namespaces()
                .await
            {
                tracing::debug!("the cluster's namespaces could not be read: {err}");
            }
        }
        tokio::time::sleep(NAMESPACES_EVERY).await;
    }
}

async fn claim_loop(daemon: Weak<Daemon>) {
    // Set when a claim could not reach the database: its commit may have
    // landed with the answer lost, so the node's claims are read back
    // before it claims again.
    let mut unsure = false;
    hold_rates(&daemon);
    // The version of the cluster's slot rules the local controller has:
    // it runs a slot's claimed tasks side by side up to their capacity.
    let mut rules_seen = (0, (1, 0));
    let mut shares = ClaimShares::default();
    loop {
        let Some(d) = daemon.upgrade() else { return };
        let Some(cluster) = d.cluster().cloned() else {
            return;
        };
        if cluster.closing.load(Ordering::SeqCst) {
            return;
        }
        unsure |= cluster.recheck.swap(false, Ordering::SeqCst);
        if unsure && !cluster.rejoining.load(Ordering::SeqCst) {
            let held: Vec<TaskId> = cluster.claims().keys().copied().collect();
            match cluster.pg.claimed_by(cluster.node(), &held).await {
                Ok(lost) => {
                    unsure = false;
                    for task in lost {
                        tracing::info!(
                            task = %task.id,
                            "running a task this node claimed as the database went away"
                        );
                        cluster.claims().insert(task.id, task.token);
                        tokio::spawn(run_claimed(Arc::clone(&d), Arc::clone(&cluster), task));
                    }
                }
                Err(err) => cluster
                    .pg
                    .outage()
                    .failed("reading this node's claims", &err),
            }
        }
        // The room is held while the claim runs: an admission that
        // claims what it inserts takes only what is left.
        let held = if unsure {
            0
        } else {
            cluster.reserve(CLAIM_BATCH)
        };
        let mut again = false;
        if held > 0 {
            let batch = held;
            // Not the tasks of a slot whose share of a rate this node has
            // a period's worth of starts waiting for: other nodes start them.
            let crowded = d.controller.crowded_slots();
            let order = shares.order(&d);
            match cluster
                .pg
                .claim(cluster.node(), batch as i64, &crowded, &order)
                .await
            {
                Ok(claimed) => {
                    cluster.pg.outage().reached();
                    shares.took(&order, &claimed);
                    if let Some(rules) = cluster.pg.rules_since(&mut rules_seen) {
                        tracing::debug!(
                            version = rules_seen.0,
                            nodes = rules_seen.1.0,
                            rank = rules_seen.1.1,
                            "this node follows the cluster's slot rules"
                        );
                        d.controller.set_slot_rules(rules);
                    }
                    again = claimed.len() == batch;
                    for task in &claimed {
                        // Counted at once; a compile of its plugin does not
                        // hold up the next claims.
                        cluster.claims().insert(task.id, task.token);
                    }
                    cluster.unreserve(held);
                    for task in claimed {
                        tokio::spawn(run_claimed(Arc::clone(&d), Arc::clone(&cluster), task));
                    }
                }
                Err(err) => {
                    cluster.unreserve(held);
                    unsure |= err.is_unreachable();
                    cluster.pg.outage().failed("claiming work", &err);
                }
            }
        }
        drop(d);
        if again {
            continue;
        }
        let woken = cluster.wake.notified();
        tokio::select! {
            () = woken => {}
            () = tokio::time::sleep(cluster.settings.poll) => {}
        }
    }
}

/// Runs the tasks this node's admissions claimed at their insert (only
/// while the cluster has no slot rules: the controller's copy follows
/// the rules the admission read first).
async fn direct_loop(
    daemon: Weak<Daemon>,
    mut tasks: tokio::sync::mpsc::UnboundedReceiver<crate::store::postgres::Claimed>,
) {
    let mut rules_seen = (0, (1, 0));
    while let Some(task) = tasks.recv().await {
        let Some(d) = daemon.upgrade() else { return };
        let Some(cluster) = d.cluster().cloned() else {
            return;
        };
        if let Some(rules) = cluster.pg.rules_since(&mut rules_seen) {
            d.controller.set_slot_rules(rules);
        }
        tokio::spawn(run_claimed(Arc::clone(&d), cluster, task));
    }
}

async fn poll_loop(daemon: Weak<Daemon>) {
    let mut last_prune = Instant::now();
    let mut last_bounds: Option<Instant> = None;
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster().cloned()) else {
            return;
        };
        tokio::time::sleep(cluster.settings.poll).await;
        let Some(d) = daemon.upgrade() else { return };
        cluster.wake.notify_one();
        let waited = cluster.waited();
        if !waited.is_empty() {
            match cluster.pg.finished_among(&waited).await {
                Ok(ids) => {
                    for id in ids {
                        let _ = cluster.finished.send(id);
                    }
                }
                Err(err) => cluster
                    .pg
                    .outage()
                    .failed("looking up the tasks clients wait on", &err),
            }
        }
        match cluster.pg.stopping_on(cluster.node()).await {
            Ok(ids) => {
                for id in ids {
                    cluster.stop_local(&d.controller, id);
                }
            }
            Err(err) => cluster.pg.outage().failed("reading stop requests", &err),
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            last_prune = Instant::now();
            let config = &d.config;
            let (finished, bytes) = config.retention();
            let retention = (finished, config.retain_for, bytes);
            let bounds = last_bounds.is_none_or(|at| at.elapsed() >= BOUNDS_EVERY);
            if bounds {
                last_bounds = Some(Instant::now());
            }
            if let Err(err) = cluster.pg.prune(retention, bounds).await {
                cluster.pg.outage().failed("applying retention", &err);
            }
            match cluster
                .pg
                .collect_plugins(d.config.keep_unused_plugins)
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!("collected {n} plugins no task of the cluster uses"),
                Err(err) => cluster.pg.outage().failed("collecting plugins", &err),
            }
        }
    }
}

async fn lease_loop(daemon: Weak<Daemon>) {
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster().cloned()) else {
            return;
        };
        tokio::time::sleep(cluster.settings.renew).await;
        let Some(d) = daemon.upgrade() else { return };
        // A stopping node keeps its lease (its attempts are still within
        // their grace) until it has left.
        if cluster.left.load(Ordering::SeqCst) {
            return;
        }
        // A node that gave up its lease renews nothing until it has joined
        // again under a new id (`lost_lease`).
        if cluster.rejoining.load(Ordering::SeqCst) {
            continue;
        }
        let node = cluster.node();
        let started = Instant::now();
        // A renewal that hangs (a cut-off database) is given up after
        // the time left before this node would fence itself, and tried
        // again on a new connection; `fence_loop` stops this node's
        // attempts in time whatever the database does.
        let deadline = cluster.settings.fence_after().max(cluster.settings.renew);
        let renewal = cluster
            .pg
            .renew(node, cluster.settings.lease, deadline)
            .await;
        match renewal {
            Ok(true) => {
                cluster.pg.outage().reached();
                let mut renewed = cluster
                    .renewed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                *renewed = (*renewed).max(started);
            }
            Ok(false) => {
                lost_lease(
                    &d,
                    &cluster,
                    node,
                    "another node took this node's work over",
                )
                .await;
            }
            Err(err) => cluster.pg.outage().failed("renewing the lease", &err),
        }
        // Off this loop: a takeover waiting on a slot's lock must not hold
        // up the next renewal.
        if !cluster.taking_over.swap(true, Ordering::SeqCst) {
            let cluster = Arc::clone(&cluster);
            tokio::spawn(async move {
                take_over(&d, &cluster).await;
                cluster.taking_over.store(false, Ordering::SeqCst);
            });
        }
    }
}

/// Fences this node by its own clock: when no renewal has succeeded for
/// `fence_after` since the last successful one started, it stops its
/// attempts (as at a lost lease) before any other node may take them over,
/// whether or not the database answers.
async fn fence_loop(daemon: Weak<Daemon>) {
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster().cloned()) else {
            return;
        };
        let renewed = *cluster
            .renewed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let node = cluster.node();
        tokio::time::sleep_until((renewed + cluster.settings.fence_after()).into()).await;
        if cluster.left.load(Ordering::SeqCst) {
            return;
        }
        let still = *cluster
            .renewed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            == renewed;
        if still && cluster.node() == node {
            let Some(d) = daemon.upgrade() else { return };
            let why = format!(
                "it fenced itself: no renewal succeeded for {} (the lease less its margin)",
                format_duration(cluster.settings.fence_after())
            );
            lost_lease(&d, &cluster, node, &why).await;
            // Not joined again: the node stopped meanwhile, and has nothing
            // left to fence.
            if cluster.rejoining.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// Marks nodes whose lease ran out dead and settles their tasks.
async fn take_over(daemon: &Arc<Daemon>, cluster: &Cluster) {
    match cluster.pg.expire_nodes().await {
        Ok(dead) => {
            for name in dead {
                tracing::warn!(node = %name, "a node's lease ran out; taking its work over");
            }
        }
        Err(err) => {
            cluster
                .pg
                .outage()
                .failed("looking for expired leases", &err);
            return;
        }
    }
    let orphans = match cluster.pg.orphans(TAKEOVER_BATCH).await {
        Ok(orphans) => orphans,
        Err(err) => {
            cluster
                .pg
                .outage()
                .failed("looking for orphaned tasks", &err);
            return;
        }
    };
    for id in orphans {
        match cluster.pg.settle(id, cluster.settings.renew).await {
            Ok(Some(settled)) => {
                let name: Arc<str> = Arc::from(settled.name.as_str());
                let slot: Arc<str> = Arc::from(settled.slot.as_str());
                daemon.controller.supervisor().publish(
                    Event::new(EventKind::Recovered)
                        .task(settled.id, &name, &slot)
                        .reason(format!("taken over from a stopped node: {}", settled.why)),
                );
                let _ = cluster.finished.send(settled.id);
                cluster.wake.notify_one();
            }
            Ok(None) => {}
            Err(err) => cluster
                .pg
                .outage()
                .failed(&format!("taking task {id} over"), &err),
        }
    }
}

/// This node's lease (as node id `lost`) is gone, or it fenced itself: its
/// claims were (or may be) taken over. Its attempts stop at once and record
/// nothing; it joins again as a new node, trying until the database lets it
/// (with a jittered pause of at most a second between tries, reported to
/// the outage, which logs). Nothing, if it has joined again under another
/// id meanwhile.
async fn lost_lease(daemon: &Arc<Daemon>, cluster: &Cluster, lost: i64, why: &str) {
    let _rejoin = cluster.rejoin.lock().await;
    if cluster.node() != lost {
        return;
    }
    // Nothing is renewed or claimed under the old id from now on.
    cluster.rejoining.store(true, Ordering::SeqCst);
    let orphaned: Vec<TaskId> = cluster.claims().drain().map(|(id, _)| id).collect();
    // Before the aborts, so that none of their events is shipped.
    cluster
        .fenced
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend(orphaned.iter().copied());
    tracing::error!(
        node = lost,
        orphaned = orphaned.len(),
        "this node lost its lease ({why}); stopping its attempts, which now belong to other nodes"
    );
    for id in &orphaned {
        daemon.controller.supervisor().abort_now(*id);
    }
    let mut tries = 0;
    loop {
        if cluster.left.load(Ordering::SeqCst) || cluster.closing.load(Ordering::SeqCst) {
            return;
        }
        let registering = Instant::now();
        match cluster
            .pg
            .register_node(&cluster.name, cluster.capacity, cluster.settings.lease)
            .await
        {
            Ok(node) => {
                cluster.pg.outage().reached();
                cluster.node.store(node, Ordering::SeqCst);
                *cluster
                    .renewed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = registering;
                cluster.rejoining.store(false, Ordering::SeqCst);
                hold_rates(&Arc::downgrade(daemon));
                tracing::info!(node, "joined the cluster again");
                cluster.wake.notify_one();
                return;
            }
            Err(err) => {
                cluster
                    .pg
                    .outage()
                    .failed("joining the cluster again", &err);
                tokio::time::sleep(pause(tries)).await;
                tries += 1;
            }
        }
    }
}

/// Plugins uploaded through any node that wait to be fetched and compiled
/// here before a task of theirs is claimed (more are fetched at their
/// first claim, as without notifications).
const WARM_QUEUE: usize = 64;

/// Fetches and compiles each plugin uploaded to the cluster, one at a
/// time, so that this node's first claim of its tasks starts at once.
async fn warm_loop(daemon: Weak<Daemon>, mut uploaded: tokio::sync::mpsc::Receiver<Digest>) {
    while let Some(digest) = uploaded.recv().await {
        let Some(d) = daemon.upgrade() else { return };
        let Some(cluster) = d.cluster().cloned() else {
            return;
        };
        if let Err(err) = cluster.ensure_plugin_for(&d.plugins, &digest, None).await {
            tracing::debug!(%digest, "an uploaded plugin was not fetched ahead: {err}");
        }
    }
}

async fn listen_loop(daemon: Weak<Daemon>, warm: tokio::sync::mpsc::Sender<Digest>) {
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster().cloned()) else {
            return;
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        match cluster.pg.link().connect(Some(tx)).await {
            Ok(session) => {
                let listen = format!(
                    "LISTEN {}; LISTEN {}; LISTEN {}; LISTEN {}; LISTEN {}; LISTEN {}",
                    postgres::READY,
                    postgres::STOP,
                    postgres::FINISHED,
                    postgres::EVENTS,
                    postgres::PLUGINS,
                    crate::store::postgres::time::TIME
                );
                if let Err(err) = session.client.batch_execute(&listen).await {
                    cluster
                        .pg
                        .outage()
                        .failed("listening for notifications", &err);
                } else {
                    // Whatever happened while not listening, the poll finds.
                    cluster.wake.notify_one();
                    drop(cluster);
                    while let Some((channel, payload)) = rx.recv().await {
                        let Some(d) = daemon.upgrade() else { return };
                        let Some(cluster) = d.cluster() else {
                            return;
                        };
                        // A payload names one task, or several (a batch).
                        let ids = payload
                            .split(',')
                            .filter_map(|id| id.parse::<u64>().ok().map(TaskId::from_u64));
                        match channel.as_str() {
                            postgres::READY => cluster.wake.notify_one(),
                            postgres::EVENTS => cluster.events.notify_one(),
                            crate::store::postgres::time::TIME => cluster.time.notify_one(),
                            postgres::PLUGINS => {
                                if let Ok(digest) = payload.parse::<Digest>() {
                                    // Full: fetched at its first claim.
                                    let _ = warm.try_send(digest);
                                }
                            }
                            postgres::STOP => {
                                for id in ids {
                                    cluster.stop_local(&d.controller, id);
                                }
                            }
                            postgres::FINISHED => {
                                for id in ids {
                                    let _ = cluster.finished.send(id);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            Err(err) => cluster
                .pg
                .outage()
                .failed("opening the notification connection", &err),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs a claimed task in this node's supervisor, and records its end.
async fn run_claimed(daemon: Arc<Daemon>, cluster: Arc<Cluster>, task: Claimed) {
    let (daemon, cluster) = (&daemon, &cluster);
    let Claimed {
        id,
        token,
        mut request,
        plugin: plugin_name,
        attempts,
        failures,
        resume_at_ms,
        submitted_ms,
    } = task;
    // Claimed again after this node lost it: the old attempt is physically
    // gone before the new one starts here.
    daemon.controller.supervisor().gone(id).await;
    let name = request
        .name
        .clone()
        .unwrap_or_else(|| format!("{plugin_name}-{id}"));
    let slot = request.slot.clone().unwrap_or_else(|| name.clone());
    let checked = match cluster
        .ensure_plugin_for(&daemon.plugins, &request.plugin, Some((id, token)))
        .await
    {
        Ok(_) => submit::check(daemon, &request).await,
        Err(e) => Err(e),
    };
    let (plugin, sandbox) = match checked {
        Ok(found) => found,
        // Taken over while its plugin was fetched: the new owner runs it.
        Err(_) if !cluster.holds(id, token) => return,
        Err(_) if cluster.closing.load(Ordering::SeqCst) => {
            // Claimed as this node began to stop: no attempt started, so
            // leaving the cluster admits it again for the others.
            cluster.release(id, token);
            return;
        }
        Err(message) => {
            // It cannot run here (its plugin or a granted directory is
            // missing on this node): it ends, as it would at submission.
            let report = TaskReport::never_ran(
                id,
                Arc::from(name.as_str()),
                Arc::from(slot.as_str()),
                TaskOutcome::Failed {
                    reason: format!("cannot run on node {}: {message}", cluster.name),
                    exit_code: None,
                },
            );
            let finished = Finished::now(
                TaskReport { attempts, ..report },
                plugin_name,
                Vec::new(),
                submitted_ms,
            );
            record_end(cluster, token, &finished).await;
            cluster.release(id, token);
            return;
        }
    };
    let log = TaskLog::new();
    let no_record = PluginTask::new(daemon.plugins.runtime(), &plugin);
    let task = super::submit::recorded(daemon, &request, no_record, &log)
        .input(std::mem::take(&mut request.input))
        .params(std::mem::take(&mut request.params))
        .args(std::mem::take(&mut request.args))
        .sandbox(sandbox)
        .sink(Arc::new(Shipping {
            log: Arc::clone(&log),
            id,
            token,
            ship: cluster.ship.clone(),
        }) as _);
    let body = Arc::new(record::Recorded::claimed(
        id,
        task,
        Arc::clone(cluster),
        token,
    ));
    let resume = Resume {
        attempts,
        failures,
        delay: Duration::from_millis(resume_at_ms.map_or(0, |at| at.saturating_sub(now_ms()))),
    };
    let spec = intake::spec_for(&request, name.clone(), slot.clone(), body, resume)
        .with_declared_capacity(plugin.info().capacity);
    let reservation = daemon.controller.supervisor().adopt(id);
    // The database made this node the slot's owner; the local controller
    // only keeps a task stopped here until it is physically gone.
    let (waiter, _) = daemon.controller.submit_placed(
        reservation,
        Submission::new(spec).policy(AdmissionPolicy::Queue),
    );
    // A stop that came while the plugin was fetched or compiled found
    // nothing registered to stop (the claim showed the task running
    // already): it is carried out now. A later one finds the task.
    if cluster
        .stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&id)
    {
        daemon.controller.remove(id);
    }
    let outcome = Outcome::new();
    daemon.tasks.insert(TaskRecord {
        id,
        name,
        slot,
        plugin: plugin_name.clone(),
        digest: request.plugin,
        outcome: outcome.clone(),
        log: Arc::clone(&log),
        submitted: Instant::now()
            .checked_sub(Duration::from_millis(now_ms().saturating_sub(submitted_ms)))
            .unwrap_or_else(Instant::now),
        placed: true,
        // Without its input and params (the body holds those): what its
        // children need of it (their tree) is read here, not from the
        // database.
        request: Some(Arc::new(request)),
    });
    let recording = RecordingGuard::new(daemon);
    let daemon = Arc::clone(daemon);
    let cluster = Arc::clone(cluster);
    tokio::spawn(async move {
        let _recording = recording;
        let report = waiter.report().await;
        // The slot is released only at the task's physical end.
        daemon.controller.supervisor().gone(id).await;
        log.close();
        let held = cluster.holds(id, token);
        let left = daemon.keep_unfinished.load(Ordering::SeqCst)
            && intake::left_for_next_start(&report.outcome);
        if held && !left {
            let finished = Finished::now((*report).clone(), plugin_name, log.lines(), submitted_ms)
                .with_records(log.records());
            if record_end(&cluster, token, &finished).await {
                outcome.set(report);
            }
        }
        daemon.tasks.finished(id);
        cluster.release(id, token);
        cluster.wake.notify_one();
    });
}
