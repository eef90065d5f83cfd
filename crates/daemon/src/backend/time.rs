//! Owns a cluster node's part in time: the schedule verbs on the cluster's
//! database, and the loop that, at the soonest due time any node knows of
//! (told by notifications, else polled), places the delayed submissions
//! that came due and fires the schedules that are due. Every node runs the
//! loop; the database's row locks (`store::postgres::time`) make each due time
//! place or fire once, also when a node dies in the middle.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use taskhost_core::supervisor::{Event, EventKind};

use crate::backend::Scheduled;
use crate::backend::daemon::Daemon;
use crate::backend::schedules::{self as local, count_firing, row_of};
use crate::backend::submit::Accepted;
use crate::cluster::node::Cluster;
use crate::schedule::FireKind;
use crate::service::error::ServiceError;
use crate::store::postgres::time::{Bounds, Placed, ScheduleError};
use crate::store::{StoredSchedule, now_ms};
use crate::wire::protocol::ScheduleVerb;

type Failure = ServiceError;

fn bounds(daemon: &Daemon) -> Bounds {
    Bounds {
        max_slot_queue: daemon.config.max_slot_queue,
        max_total_pending: daemon.config.max_total_pending,
    }
}

fn failure(name: &str, err: ScheduleError) -> Failure {
    match err {
        ScheduleError::Unknown => ServiceError::NotFound(format!(
            "no schedule named `{name}` (see `host schedule ls`)"
        )),
        ScheduleError::Exists => local::exists(name),
        ScheduleError::Full(most) => local::full(most),
        ScheduleError::PluginGone => ServiceError::NotFound(
            "the cluster no longer holds the schedule's plugin; upload it again".into(),
        ),
        ScheduleError::Unresolved(why) => ServiceError::NotFound(why),
        ScheduleError::Store(e) => ServiceError::Store(e),
    }
}

fn tz_of(stored: &StoredSchedule) -> String {
    stored.spec.tz.clone().unwrap_or_else(|| "UTC".into())
}

/// A schedule verb on the cluster's database.
pub(crate) async fn verb(
    daemon: &Arc<Daemon>,
    cluster: &Arc<Cluster>,
    verb: ScheduleVerb,
) -> Result<Scheduled, Failure> {
    let now = now_ms();
    Ok(match verb {
        ScheduleVerb::Add(mut spec) => {
            // A deployment is checked in its version of now; each firing
            // takes the version of its time.
            if spec.request.deployment.is_some() {
                let mut now = spec.request.clone();
                crate::backend::deployments::resolve_on(cluster, &mut now).await?;
                spec.request.plugin = now.plugin;
            }
            cluster
                .ensure_plugin(&daemon.plugins, &spec.request.plugin)
                .await?;
            let (spec, plugin, zone) = local::prepare(daemon, *spec).await?;
            let name = spec.name.clone();
            let stored = StoredSchedule {
                next_ms: zone.next_after(now),
                spec,
                plugin,
                paused: false,
                last_fire_ms: None,
                last_task: None,
                created_ms: now,
            };
            cluster
                .pg
                .schedule_add(&stored, daemon.config.max_schedules)
                .await
                .map_err(|e| failure(&name, e))?;
            Scheduled::Row(row_of(&stored, zone.zone_name(), None))
        }
        ScheduleVerb::List => {
            let rows = cluster.pg.schedules().await.map_err(ServiceError::Store)?;
            Scheduled::Rows(
                rows.iter()
                    .map(|(s, outcome)| row_of(s, &tz_of(s), *outcome))
                    .collect(),
            )
        }
        ScheduleVerb::Remove(name) => {
            let stored = cluster
                .pg
                .schedule_remove(&name)
                .await
                .map_err(|e| failure(&name, e))?;
            Scheduled::Row(row_of(&stored, &tz_of(&stored), None))
        }
        ScheduleVerb::Pause(name) => Scheduled::Row(pause(daemon, cluster, &name, true).await?),
        ScheduleVerb::Resume(name) => Scheduled::Row(pause(daemon, cluster, &name, false).await?),
        ScheduleVerb::Run(name) => {
            let placed = cluster
                .pg
                .schedule_run(
                    &name,
                    now,
                    bounds(daemon),
                    &*crate::backend::deployments::resolver(cluster),
                )
                .await
                .map_err(|e| failure(&name, e))?;
            let submitted = placed.submitted.clone();
            told(daemon, cluster, &[placed]);
            Scheduled::Fired(Accepted::Now(submitted))
        }
    })
}

/// `pause` and `resume`; a resume's catch-up firing is told like any.
async fn pause(
    daemon: &Arc<Daemon>,
    cluster: &Arc<Cluster>,
    name: &str,
    paused: bool,
) -> Result<crate::wire::protocol::ScheduleRow, Failure> {
    let resolve = crate::backend::deployments::resolver(cluster);
    let (stored, placed) = cluster
        .pg
        .schedule_pause(name, paused, now_ms(), bounds(daemon), &*resolve)
        .await
        .map_err(|e| failure(name, e))?;
    if let Some(placed) = placed {
        told(daemon, cluster, &[placed]);
    }
    Ok(row_of(&stored, &tz_of(&stored), None))
}

/// Tells of what this node placed or fired: an event for each (shipped to
/// the cluster with this node's others), the metrics, and the claims (the
/// admitted work may be this node's to run).
fn told(daemon: &Daemon, cluster: &Cluster, placed: &[Placed]) {
    let now = now_ms();
    let supervisor = daemon.controller.supervisor();
    for p in placed {
        let late = Duration::from_millis(now.saturating_sub(p.due_ms));
        let name: Arc<str> = Arc::from(p.submitted.name.as_str());
        let slot: Arc<str> = Arc::from(p.submitted.slot.as_str());
        let mut event = match &p.fired {
            Some((schedule, kind)) => {
                count_firing(*kind);
                if *kind != FireKind::Run {
                    taskhost_core::stats::SCHEDULE_LATENESS.observe(late);
                }
                let schedule: Arc<str> = Arc::from(schedule.as_str());
                let mut event = Event::new(EventKind::ScheduleFired)
                    .task(p.submitted.id, &name, &slot)
                    .schedule(Some(&schedule));
                event.detail = Some(kind.as_str().to_owned());
                event
            }
            None => {
                taskhost_core::stats::DELAYS_DUE.observe(late);
                Event::new(EventKind::DelayDue).task(p.submitted.id, &name, &slot)
            }
        };
        event.delay_ms = Some(late.as_millis() as u64);
        supervisor.publish(event);
    }
    if !placed.is_empty() {
        cluster.wake.notify_one();
    }
}

/// The node's time loop: sleeps until the soonest due time (of a delayed
/// submission or a schedule), or a notification that it may have changed,
/// or the poll interval; then places and fires what is due. A due time
/// older than the lease is one the whole cluster missed (no node was up to
/// fire it): the schedule's `--missed` decides.
pub(crate) async fn time_loop(daemon: Weak<Daemon>) {
    loop {
        let Some(cluster) = daemon.upgrade().and_then(|d| d.cluster().cloned()) else {
            return;
        };
        if cluster.closing.load(Ordering::SeqCst) {
            return;
        }
        let woken = cluster.time.notified();
        let poll = cluster.settings.poll;
        let next = match cluster.pg.next_due().await {
            Ok(next) => next,
            Err(err) => {
                cluster
                    .pg
                    .outage()
                    .failed("reading the next due time", &err);
                None
            }
        };
        let now = now_ms();
        let sleep = match next {
            Some(at) => Duration::from_millis(at.saturating_sub(now)).min(poll),
            None => poll,
        };
        if !sleep.is_zero() {
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(sleep) => {}
            }
        } else {
            drop(woken);
        }
        let Some(d) = daemon.upgrade() else { return };
        let Some(cluster) = d.cluster().cloned() else {
            return;
        };
        if cluster.closing.load(Ordering::SeqCst) || d.controller.supervisor().is_shutting_down() {
            return;
        }
        let now = now_ms();
        if next.is_none_or(|at| at > now) {
            continue;
        }
        let mut did = 0;
        let resolve = crate::backend::deployments::resolver(&cluster);
        match cluster.pg.place_due(now, bounds(&d)).await {
            Ok(placed) => {
                did += placed.len();
                told(&d, &cluster, &placed);
            }
            Err(err) => cluster
                .pg
                .outage()
                .failed("placing the delayed submissions due", &err),
        }
        match cluster
            .pg
            .fire_due(now, cluster.settings.lease, bounds(&d), &*resolve)
            .await
        {
            Ok(done) => {
                did += done.fired.len() + done.skipped.len();
                local::PASSED.fetch_add(done.passed, Ordering::Relaxed);
                told(&d, &cluster, &done.fired);
                for (schedule, passed) in done.skipped {
                    let mut event = Event::new(EventKind::ScheduleMissed).reason(format!(
                        "skipped {passed} firing{} the cluster missed (--missed skip)",
                        if passed == 1 { "" } else { "s" }
                    ));
                    event.schedule = Some(Arc::from(schedule.as_str()));
                    d.controller.supervisor().publish(event);
                }
            }
            Err(err) => cluster.pg.outage().failed("firing the schedules due", &err),
        }
        if did == 0 {
            // What is due is another node's now (locked by its
            // transaction): look again shortly rather than at once.
            drop(cluster);
            drop(d);
            tokio::time::sleep(BUSY_PAUSE).await;
        }
    }
}

/// How long the time loop waits when what is due is being handled by
/// another node.
const BUSY_PAUSE: Duration = Duration::from_millis(20);
