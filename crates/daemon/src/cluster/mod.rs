//! Owns a cluster node's handles on its database: the connection, the
//! node's id and claims, its wake-ups, the shipping of its attempts' lines
//! and events, the feed of everyone's events, and the writes of an
//! attempt's end under its claim. The loops that use them with the rest of
//! the daemon are `backend/node.rs`; the database decides (admission,
//! claims, releases, takeovers: `store::postgres`).
//!
//! | file | owns |
//! |---|---|
//! | `kv` | the node's key-value buckets in the database, under its attempts' fencing tokens; `host kv` there |
//! | `node` | what the loops and the backend share: the database, the node's id and claims, its wake-ups |

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::broadcast;

use taskhost_core::logline::{LineSink, LogLine, Stream};
use taskhost_core::supervisor::{Event, EventKind, Received, TaskId};

pub(crate) mod kv;
pub(crate) mod node;

use crate::config::ClusterSettings;
use crate::service::tasks::{MAX_LOG_LINES, TaskLog};
use crate::store::postgres::link::Timeouts;
use crate::store::postgres::outage::pause;
use crate::store::{Finished, StoreError};
pub(crate) use node::{Cluster, SHIP_BATCH};

/// The longest any one statement may run.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a running task's new lines wait before they are shipped.
const SHIP_DELAY: Duration = Duration::from_millis(50);
/// Most events the feed reads in one statement.
const FEED_BATCH: usize = 1_000;
/// The least time between two reads of the feed.
const FEED_GAP: Duration = Duration::from_millis(20);
/// How long this node's events wait for others to ship with them.
const EVENT_BATCH_WAIT: Duration = Duration::from_millis(25);

/// The session timeouts of a node's connections: a statement, a lock
/// wait and a transaction left idle (a frozen node's) each end within a
/// lease; quiet connections are probed after a quarter of one.
pub(crate) fn timeouts(settings: &ClusterSettings) -> Timeouts {
    Timeouts {
        statement: STATEMENT_TIMEOUT,
        lock: settings.lease,
        idle_in_transaction: settings.lease,
        keepalive_idle: (settings.lease / 4).max(Duration::from_secs(1)),
        tcp_user: settings.lease,
    }
}

/// Ships the lines of the tasks this node runs, in batches.
pub(crate) async fn ship_loop(
    cluster: Weak<Cluster>,
    mut lines: tokio::sync::mpsc::Receiver<(TaskId, i64, LogLine)>,
) {
    let mut batch = Vec::with_capacity(SHIP_BATCH);
    while lines.recv_many(&mut batch, SHIP_BATCH).await > 0 {
        // The lines wait a moment: those of a task that ends meanwhile go
        // to the database with its end (its whole log), not on their own.
        tokio::time::sleep(SHIP_DELAY).await;
        while batch.len() < SHIP_BATCH {
            match lines.try_recv() {
                Ok(line) => batch.push(line),
                Err(_) => break,
            }
        }
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        batch.retain(|(id, token, _)| cluster.holds(*id, *token));
        if batch.is_empty() {
            continue;
        }
        if let Err(err) = cluster.pg.ship_lines(&batch, MAX_LOG_LINES).await {
            let what = format!(
                "shipping {} log lines (they stay in this node's log)",
                batch.len()
            );
            cluster.pg.outage().failed(&what, &err);
        }
        batch.clear();
    }
}

/// Ships this node's events to the database in batches (best-effort, like
/// every event stream: a lane that fell behind is said so in the log).
pub(crate) async fn event_loop(
    cluster: Weak<Cluster>,
    mut lane: taskhost_core::supervisor::EventStream,
) {
    let mut batch: Vec<Event> = Vec::new();
    loop {
        let Some(first) = lane.recv().await else {
            return;
        };
        let deadline = tokio::time::Instant::now() + EVENT_BATCH_WAIT;
        let mut next = Some(first);
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        while let Some(received) = next.take() {
            match received {
                Received::Event(event) if !shipped(&cluster, &event) => {}
                Received::Event(event) => batch.push(Event::clone(&event)),
                Received::Dropped(n) => {
                    tracing::warn!(
                        "{n} events were not shipped to the cluster (the lane fell behind)"
                    );
                }
            }
            if batch.len() >= SHIP_BATCH {
                break;
            }
            if let Ok(Some(more)) = tokio::time::timeout_at(deadline, lane.recv()).await {
                next = Some(more);
            }
        }
        if batch.is_empty() {
            continue;
        }
        if let Err(err) = cluster.pg.ship_events(cluster.node(), &batch).await {
            let what = format!("shipping {} events (they are lost)", batch.len());
            cluster.pg.outage().failed(&what, &err);
        }
        batch.clear();
    }
}

/// Whether `event` goes to the cluster's database: not if it tells of a
/// task this node gave up with its lease (its abort here is not the task's
/// end; the node that took it over tells that).
fn shipped(cluster: &Cluster, event: &Event) -> bool {
    let Some(id) = event.task_id else {
        return true;
    };
    let mut fenced = cluster
        .fenced
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if !fenced.contains(&id) {
        return true;
    }
    if event.kind == EventKind::TaskRemoved {
        fenced.remove(&id);
    }
    false
}

/// A claimed task's lines: into the node's log, and shipped to the
/// database so that every node's `host logs` shows them.
pub(crate) struct Shipping {
    pub(crate) log: Arc<TaskLog>,
    pub(crate) id: TaskId,
    pub(crate) token: i64,
    pub(crate) ship: tokio::sync::mpsc::Sender<(TaskId, i64, LogLine)>,
}

impl LineSink for Shipping {
    fn push(&self, attempt: u32, stream: Stream, text: &str) {
        self.log.push(attempt, stream, text);
        let line = LogLine {
            attempt,
            stream,
            text: text.to_owned(),
        };
        // Full: the line stays in this node's log and in the outcome's.
        let _ = self.ship.try_send((self.id, self.token, line));
    }
}

/// A receiver of the cluster's new events (from now on), for a follower
/// on this node: one reader polls the database for all of them, started
/// by the first.
pub(crate) async fn follow_events(
    cluster: &Arc<Cluster>,
) -> Result<broadcast::Receiver<Arc<Event>>, StoreError> {
    let feed = cluster.feed.subscribe();
    if !cluster.feed_started.swap(true, Ordering::SeqCst) {
        tokio::spawn(feed_loop(Arc::downgrade(cluster)));
    }
    let mut ready = cluster.feed_ready.subscribe();
    match tokio::time::timeout(cluster.settings.lease, ready.wait_for(|r| *r)).await {
        Ok(Ok(_)) => Ok(feed),
        _ => Err(StoreError::Failed(
            "PostgreSQL: the cluster's events cannot be read (the database does not answer)".into(),
        )),
    }
}

/// Reads the cluster's new events every poll (at most 200 ms apart) and
/// hands them to this node's followers.
async fn feed_loop(cluster: Weak<Cluster>) {
    let mut after: Option<i64> = None;
    loop {
        let Some(c) = cluster.upgrade() else { return };
        match after {
            None => match c.pg.events(None, 1).await {
                Ok(newest) => {
                    after = Some(newest.last().map_or(0, |e| e.seq as i64));
                    c.feed_ready.send_replace(true);
                }
                Err(err) => c.pg.outage().failed("reading the cluster's events", &err),
            },
            Some(_) => match c.pg.events(after, FEED_BATCH as i64).await {
                Ok(events) => {
                    let full = events.len() == FEED_BATCH;
                    for event in events {
                        after = Some(event.seq as i64);
                        let _ = c.feed.send(Arc::new(event));
                    }
                    if full {
                        continue;
                    }
                }
                Err(err) => c.pg.outage().failed("reading the cluster's events", &err),
            },
        }
        // Woken by a node's notification that it shipped events, reading
        // at most every FEED_GAP; polled too, in case one was lost.
        let pause = c.settings.poll.min(Duration::from_millis(200));
        tokio::time::sleep(FEED_GAP).await;
        tokio::select! {
            () = c.events.notified() => {}
            () = tokio::time::sleep(pause.saturating_sub(FEED_GAP)) => {}
        }
    }
}

/// Records a claimed task's end, retrying while the database is away;
/// false if the claim had been taken away (nothing recorded).
pub(crate) async fn record_end(cluster: &Cluster, token: i64, finished: &Finished) -> bool {
    let id = finished.report.id;
    let mut tries = 0;
    loop {
        match cluster.pg.finish(token, finished).await {
            Ok(true) => {
                cluster.pg.outage().reached();
                let _ = cluster.finished.send(id);
                return true;
            }
            Ok(false) => {
                tracing::warn!(task = %id, "not recorded: this node's claim on it was taken over");
                return false;
            }
            Err(err) => {
                if !cluster.holds(id, token) {
                    return false;
                }
                let what = format!("recording the outcome of task {id} (retried)");
                cluster.pg.outage().failed(&what, &err);
                tokio::time::sleep(pause(tries)).await;
                tries += 1;
            }
        }
    }
}
