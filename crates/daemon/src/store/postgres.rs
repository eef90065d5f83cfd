//! The PostgreSQL backend of cluster mode: the shared state of every node
//! (`crates/daemon/migrations/postgres/`), and each decision that two nodes could
//! race on as one transaction. Decisions in a slot (admission, release,
//! cancel, takeover) lock that slot's row first, then the task rows, so
//! they serialise per slot and never deadlock each other; a claim locks
//! only `ready` rows (`FOR UPDATE SKIP LOCKED`) and takes a fencing token,
//! which every later write of its attempts names. The owner invariant is
//! the unique index `taskhost_one_owner`, not a count.
//!
//! It decides nothing of its own: admission applies the controller's rules
//! (Queue, Replace, DropIfRunning, the bounds), takeover applies recovery's
//! `fate`; the node (`daemon::cluster`) runs what it claimed.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use tokio_postgres::error::SqlState;

use taskhost_core::admission::{
    self, AdmissionPolicy, Decision, Limits, OwnerState, SlotState, SlotSummary, SlotView, Totals,
};
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{OutcomeKind, RejectionKind, TaskOutcome};
use taskhost_core::recovery::{Fate, fate};
use taskhost_core::supervisor::{Event, TaskId, TaskRef, TaskReport};
use taskhost_runtime::Digest;

use super::pg_batch::Writer;
use super::pg_link::{Link, Session, Timeouts};
use super::pg_outage::UNREACHABLE_MARK;
use super::{Finished, Pause, StoreError, Unfinished, now_ms};
use crate::wire::protocol::{Placement, SubmitRequest, Submitted, TaskRow, TaskState};

/// The migrations, in order; `taskhost_schema.version` counts those applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/postgres/0001_cluster.sql"),
    include_str!("../../migrations/postgres/0002_logs.sql"),
    include_str!("../../migrations/postgres/0003_events.sql"),
    include_str!("../../migrations/postgres/0004_fillfactor.sql"),
    include_str!("../../migrations/postgres/0005_idempotency.sql"),
    include_str!("../../migrations/postgres/0006_time.sql"),
    include_str!("../../migrations/postgres/0007_kv.sql"),
    include_str!("../../migrations/postgres/0008_lineage.sql"),
];

/// The migration that added `parent` and `root`, filled from each row's
/// request when it runs.
const LINEAGE_MIGRATION: usize = 8;

/// Events kept in the database (each node prunes beyond it).
pub(crate) const EVENTS_KEPT: i64 = 100_000;

/// The advisory lock that serialises migrations of nodes starting together.
const MIGRATION_LOCK: i64 = 0x7461_736b_686f_7374;

/// The first key of a tree's advisory lock (the second is its root's id);
/// two-key locks never meet the one-key `MIGRATION_LOCK`.
const TREE_LOCK: i32 = 1;

/// Attempts of a transaction that lost a deadlock or serialisation race.
const RETRIES: usize = 8;

/// Notification channels.
pub(crate) const READY: &str = "taskhost_ready";
pub(crate) const STOP: &str = "taskhost_stop";
pub(crate) const FINISHED: &str = "taskhost_finished";

/// The database of a cluster; cheap to clone.
#[derive(Clone)]
pub(crate) struct Pg {
    pool: Pool,
    link: Link,
    /// The connection lease renewals have to themselves (with its
    /// driver), so that nothing else queued on the pool delays them.
    lease: Arc<tokio::sync::Mutex<Option<Session>>>,
    /// Whether decisions send notifications (off only to test the polling
    /// fallback).
    notify: bool,
    /// The node's batched writes (set once the handle exists).
    writer: Arc<std::sync::OnceLock<Writer>>,
    /// What the node answers and does for its batches (none until the
    /// node says).
    node: Arc<std::sync::OnceLock<NodeHooks>>,
}

/// How the batched writes ask the node about new ready work.
pub(crate) struct NodeHooks {
    /// How many more tasks the node would claim now: new ready work
    /// beyond it is announced to the other nodes, the rest is this
    /// node's to claim.
    pub room: Box<dyn Fn() -> usize + Send + Sync>,
    /// Wakes the node's claims (after a commit that made work ready).
    pub wake: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.link.describe)
    }
}

pub(super) fn db(what: &str) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
    move |e| {
        // A lost deadlock or serialisation race is marked, so that
        // `retry` runs the transaction again; so is a database that could
        // not be reached, so that a claimed attempt's writes are tried
        // again while the node holds its lease.
        let marker = if is_retryable(&e) {
            RETRY_MARK
        } else if is_unreachable(&e) {
            UNREACHABLE_MARK
        } else {
            ""
        };
        StoreError(format!("PostgreSQL: {what}: {}{marker}", error_text(&e)))
    }
}

/// Whether `e` is the database being away rather than the statement
/// failing: no answer at all (a closed or refused connection, a timeout),
/// or the server's own word that it is shutting down, starting up, or out
/// of connections (SQLSTATE classes 08, 57 and 53).
fn is_unreachable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => {
            e.is_closed()
                || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
                || e.to_string().contains("timeout")
        }
        Some(code) => {
            let class = &code.code()[..2];
            matches!(class, "08" | "57" | "53")
        }
    }
}

/// The parameters of a statement.
pub(super) type Params<'a> = &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)];

/// Runs a statement (prepared once per connection), naming `what` failed.
pub(super) async fn exec(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.execute(&stmt, params).await.map_err(db(what))
}

/// The one row a query returns.
pub(super) async fn one(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<tokio_postgres::Row, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.query_one(&stmt, params).await.map_err(db(what))
}

/// The row a query returns, if any.
pub(super) async fn opt(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<tokio_postgres::Row>, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.query_opt(&stmt, params).await.map_err(db(what))
}

/// Every row a query returns.
pub(super) async fn all(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.query(&stmt, params).await.map_err(db(what))
}

/// Ends the message of an error whose transaction may simply run again.
const RETRY_MARK: &str = " (a concurrent transaction won; retried)";

fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => chain(e),
    }
}

/// An error with its causes, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    let text = match &e {
        deadpool_postgres::PoolError::Backend(e) => error_text(e),
        other => chain(other),
    };
    StoreError(format!(
        "PostgreSQL: no connection: {text}{UNREACHABLE_MARK}"
    ))
}

pub(super) fn retryable(e: &StoreError) -> bool {
    e.0.ends_with(RETRY_MARK)
}

/// Runs a transaction again while it loses deadlock or serialisation races.
pub(super) async fn retry<T, F, Fut>(mut work: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last = None;
    for _ in 0..RETRIES {
        match work().await {
            Err(e) if retryable(&e) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| StoreError("PostgreSQL: gave up after repeated conflicts".into())))
}

fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_DEADLOCK_DETECTED) | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    )
}

pub(super) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_allocvec(value).map_err(|e| StoreError(format!("cannot encode a row: {e}")))
}

pub(super) fn decode<T: for<'de> serde::Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes)
        .map_err(|e| StoreError(format!("a stored row does not decode: {e}")))
}

/// A stored submission, also one a protocol-5 node wrote (before
/// `allow_http`).
pub(super) fn decode_request(bytes: &[u8]) -> Result<SubmitRequest, StoreError> {
    SubmitRequest::decode_stored(bytes)
        .map_err(|e| StoreError(format!("a stored row does not decode: {e}")))
}

pub(super) fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn id_of(v: i64) -> TaskId {
    TaskId::from_u64(u64::try_from(v).unwrap_or(0))
}

pub(super) fn sql_id(id: TaskId) -> i64 {
    ms(id.get())
}

/// A submission to admit, with what the plugin declares.
pub(crate) struct Admission {
    pub request: SubmitRequest,
    /// The plugin's name.
    pub plugin: String,
    /// The submission's name, slot and policy once it has its id: the
    /// service's rule (the store only records what it is told).
    pub names: Names,
    pub max_slot_queue: usize,
    pub max_total_pending: usize,
    /// Unfinished descendants of the submission's root at most (a spawned
    /// task's tree: `request.root`).
    pub max_descendants: usize,
    /// Held until this time (ms since the Unix epoch), within this bound of
    /// delayed submissions: it is recorded as delayed, not admitted.
    pub due: Option<(u64, usize)>,
}

/// How a submission is named once the database has given it an id.
pub(crate) type Names =
    Box<dyn Fn(TaskId) -> Result<(String, String, AdmissionPolicy), String> + Send + Sync>;

/// Why an admission was not made.
pub(crate) enum AdmitError {
    /// The submission is invalid (a template parameter is missing).
    Invalid(String),
    /// The cluster no longer holds the plugin (collected): store it again.
    PluginGone,
    /// The database failed.
    Store(StoreError),
    /// The idempotency key made another request's task (the refusal).
    Conflict(String),
    /// The tree of task `root` has `max` unfinished descendants already.
    TreeFull { root: u64, max: usize },
}

impl From<StoreError> for AdmitError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// A task a node claimed.
pub(crate) struct Claimed {
    pub id: TaskId,
    pub token: i64,
    pub request: SubmitRequest,
    pub plugin: String,
    pub attempts: u32,
    pub failures: u32,
    /// When its next attempt is due (taken over while pausing).
    pub resume_at_ms: Option<u64>,
    pub submitted_ms: u64,
}

/// What a cancel did.
pub(crate) enum Canceled {
    /// This call made the stop claim; `node` runs the task (None: it ended
    /// in the same transaction, queued or not yet claimed).
    Claimed { node: Option<i64> },
    /// Someone else did, or it had ended.
    Already,
}

/// A task's place, as a target resolves.
pub(crate) struct Found {
    pub id: TaskId,
    pub state: String,
}

/// What became of a task taken over from a dead node.
pub(crate) struct Settled {
    pub id: TaskId,
    pub name: String,
    pub slot: String,
    /// Recovery's words for it.
    pub why: String,
}

/// A task row's state for recovery's `fate`.
fn unfinished_state(state: &str) -> TaskState {
    match TaskState::parse(state) {
        Some(TaskState::Stopping) => TaskState::Stopping,
        Some(TaskState::Queued | TaskState::Ready) => TaskState::Queued,
        _ => TaskState::Running,
    }
}

/// Opens the cluster's database and migrates it (nodes starting together
/// take turns on an advisory lock). Every session gets `timeouts`; the
/// pool gives up a wait for a connection after `timeouts.lock`.
pub(crate) async fn open(
    url: &str,
    timeouts: Timeouts,
    notify: bool,
    pool_size: usize,
) -> Result<Pg, StoreError> {
    let link = Link::parse(url, timeouts)?;
    let connect = link
        .config
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(5));
    let pool = Pool::builder(link.manager())
        .max_size(pool_size.max(2))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(timeouts.lock))
        .create_timeout(Some(connect))
        .recycle_timeout(Some(connect))
        .build()
        .map_err(|e| StoreError(format!("PostgreSQL: cannot build the pool: {e}")))?;
    let pg = Pg {
        pool,
        link,
        lease: Arc::default(),
        notify,
        writer: Arc::default(),
        node: Arc::default(),
    };
    let _ = pg.writer.set(Writer::start(&pg));
    pg.migrate().await.map_err(|e| {
        StoreError(format!(
            "{} (is PostgreSQL running at `{url}`, and may this user create tables?)",
            e.0
        ))
    })?;
    Ok(pg)
}

impl Pg {
    /// Tells the handle about its node (once).
    pub(crate) fn set_node(&self, hooks: NodeHooks) {
        let _ = self.node.set(hooks);
    }

    /// Announces `ready` new ready tasks to the other nodes unless this
    /// node has room for them all; true if this node is to claim them
    /// (`claim_here` once committed).
    pub(super) async fn announce_ready(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        ready: usize,
    ) -> Result<bool, StoreError> {
        if ready == 0 {
            return Ok(false);
        }
        let room = self.node.get().map_or(0, |node| (node.room)());
        if ready > room {
            self.notify(tx, READY, "").await?;
        }
        Ok(true)
    }

    /// Wakes this node's claims.
    pub(super) fn claim_here(&self) {
        if let Some(node) = self.node.get() {
            (node.wake)();
        }
    }

    fn writer(&self) -> &Writer {
        self.writer
            .get()
            .expect("the writer starts as the handle is opened")
    }

    /// The database's address and settings (for the node's listening
    /// connection).
    /// Whether the database answers, as this node sees it: every loop
    /// and retried write reports its failures and successes here.
    pub(crate) fn outage(&self) -> &super::pg_outage::Outage {
        &self.link.outage
    }

    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_err)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        exec(
            &tx,
            "cannot take the migration lock",
            "SELECT pg_advisory_xact_lock($1)",
            &[&MIGRATION_LOCK],
        )
        .await?;
        let exists: bool = one(
            &tx,
            "cannot read the schema",
            "SELECT to_regclass('taskhost_schema') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
        if !exists {
            tx.batch_execute("CREATE TABLE taskhost_schema (version INTEGER NOT NULL)")
                .await
                .map_err(db("cannot create the schema table"))?;
        }
        let version: i32 = opt(
            &tx,
            "cannot read the schema version",
            "SELECT version FROM taskhost_schema",
            &[],
        )
        .await?
        .map_or(0, |r| r.get(0));
        let known = MIGRATIONS.len() as i32;
        if version > known {
            return Err(StoreError(format!(
                "the database's schema is version {version}, newer than this host knows \
                 ({known}); upgrade this host to the version the other nodes run"
            )));
        }
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.batch_execute(migration)
                .await
                .map_err(db("cannot apply a migration"))?;
            if i + 1 == LINEAGE_MIGRATION && version > 0 {
                fill_lineage(&tx).await?;
            }
        }
        if version == 0 {
            exec(
                &tx,
                "cannot record the schema version",
                "INSERT INTO taskhost_schema (version) VALUES ($1)",
                &[&known],
            )
            .await?;
        } else if version < known {
            exec(
                &tx,
                "cannot record the schema version",
                "UPDATE taskhost_schema SET version = $1",
                &[&known],
            )
            .await?;
        }
        tx.commit()
            .await
            .map_err(db("cannot commit the migrations"))
    }

    pub(super) async fn notify(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        channel: &str,
        payload: &str,
    ) -> Result<(), StoreError> {
        if self.notify {
            exec(
                tx,
                "cannot notify",
                "SELECT pg_notify($1, $2)",
                &[&channel, &payload],
            )
            .await?;
        }
        Ok(())
    }

    /// Registers a node; returns its id.
    pub(crate) async fn register_node(
        &self,
        name: &str,
        capacity: usize,
        lease: Duration,
    ) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = one(
            &client,
            "cannot register this node",
            "INSERT INTO taskhost_nodes (name, started_ms, lease_until, capacity) \
                 VALUES ($1, $2, now() + ($3::float8 * interval '1 millisecond'), $4) RETURNING id",
            &[
                &name,
                &ms(now_ms()),
                &(lease.as_millis() as f64),
                &(i32::try_from(capacity).unwrap_or(i32::MAX)),
            ],
        )
        .await?;
        Ok(row.get(0))
    }

    /// Renews a node's lease on its own connection; false once it has lost
    /// it (another node took its work over). A renewal that gets no answer
    /// within `deadline` fails, and its connection is given up.
    pub(crate) async fn renew(
        &self,
        node: i64,
        lease: Duration,
        deadline: Duration,
    ) -> Result<bool, StoreError> {
        let mut held = self.lease.lock().await;
        let renewal = tokio::time::timeout(deadline, async {
            let session = match held.take() {
                Some(session) => session,
                None => self.link.connect(None).await?,
            };
            let rows = session
                .client
                .query(
                    "UPDATE taskhost_nodes SET lease_until = now() + ($2::float8 * interval '1 millisecond') \
                         WHERE id = $1 AND alive RETURNING id",
                    &[&node, &(lease.as_millis() as f64)],
                )
                .await
                .map_err(db("cannot renew the lease"))?;
            Ok((session, rows))
        })
        .await
        .unwrap_or_else(|_| {
            Err(StoreError(format!(
                "PostgreSQL: the lease renewal got no answer within {}{UNREACHABLE_MARK}",
                taskhost_core::units::format_duration(deadline)
            )))
        });
        // A failed renewal's session is dropped (a new one next time).
        let (session, rows) = renewal?;
        *held = Some(session);
        Ok(!rows.is_empty())
    }

    /// Marks this node dead (a graceful stop: its work is taken over now,
    /// not after its lease).
    pub(crate) async fn retire_node(&self, node: i64) -> Result<(), StoreError> {
        let client = self.client().await?;
        exec(
            &client,
            "cannot retire this node",
            "UPDATE taskhost_nodes SET alive = FALSE WHERE id = $1",
            &[&node],
        )
        .await?;
        Ok(())
    }

    /// Marks every node whose lease ran out dead; returns their names.
    pub(crate) async fn expire_nodes(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot expire leases",
            "UPDATE taskhost_nodes SET alive = FALSE WHERE id IN \
                 (SELECT id FROM taskhost_nodes WHERE alive AND lease_until < now() \
                  FOR UPDATE SKIP LOCKED) RETURNING name",
            &[],
        )
        .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Tasks claimed by nodes that are dead (at most `limit`).
    pub(crate) async fn orphans(&self, limit: i64) -> Result<Vec<TaskId>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot find orphaned tasks",
            "SELECT t.id FROM taskhost_tasks t JOIN taskhost_nodes n ON n.id = t.node \
                 WHERE t.state IN ('running', 'stopping') AND NOT n.alive ORDER BY t.id LIMIT $1",
            &[&limit],
        )
        .await?;
        Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
    }

    /// Takes over one task of a dead node, as recovery would after a crash:
    /// its interrupted attempt is closed and its restart policy decides
    /// (`fate`). None if another node settled it first. It waits at most
    /// `lock_wait` for a lock (a frozen node may hold the slot's).
    pub(crate) async fn settle(
        &self,
        id: TaskId,
        lock_wait: Duration,
    ) -> Result<Option<Settled>, StoreError> {
        retry(|| self.settle_once(id, lock_wait)).await
    }

    async fn settle_once(
        &self,
        id: TaskId,
        lock_wait: Duration,
    ) -> Result<Option<Settled>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let settled = {
            let tx = &tx;
            {
                let wait = format!("{}ms", lock_wait.as_millis().max(1));
                exec(
                    tx,
                    "cannot bound the takeover's lock waits",
                    "SELECT set_config('lock_timeout', $1, true)",
                    &[&wait],
                )
                .await?;
                let Some(slot) = lock_slot_of(tx, id).await? else {
                    return Ok(None);
                };
                let Some(row) = opt(
                    tx,
                    "cannot read an orphaned task",
                    "SELECT t.state, t.request, t.plugin, t.attempts, t.failures, t.resume_at_ms, \
                         t.submitted_ms, t.name FROM taskhost_tasks t JOIN taskhost_nodes n ON n.id = t.node \
                         WHERE t.id = $1 AND t.state IN ('running', 'stopping') AND NOT n.alive \
                         FOR UPDATE OF t",
                    &[&sql_id(id)],
                )
                .await?
                else {
                    return Ok(None);
                };
                let state: String = row.get(0);
                let request = decode_request(row.get::<_, &[u8]>(1))?;
                let plugin: String = row.get(2);
                let attempts = row.get::<_, i32>(3).max(0) as u32;
                let failures = row.get::<_, i32>(4).max(0) as u32;
                let resume_at: Option<i64> = row.get(5);
                let submitted_ms = row.get::<_, i64>(6).max(0) as u64;
                let name: String = row.get(7);
                let now = ms(now_ms());
                let interrupted = exec(
                    tx,
                    "cannot close an interrupted attempt",
                    "UPDATE taskhost_attempts SET ended_ms = $2, result = 'interrupted' \
                         WHERE task_id = $1 AND ended_ms IS NULL",
                    &[&sql_id(id), &now],
                )
                .await?;
                // Claimed, but no attempt had started since (and none was
                // pausing): nothing was interrupted; it is admitted again.
                let state = match unfinished_state(&state) {
                    TaskState::Running if interrupted == 0 && resume_at.is_none() => {
                        TaskState::Queued
                    }
                    other => other,
                };
                let unfinished = Unfinished {
                    id,
                    plugin: plugin.clone(),
                    request,
                    state,
                    attempts,
                    submitted_ms,
                    pause: resume_at.map(|until| Pause {
                        until_ms: until.max(0) as u64,
                        failures,
                    }),
                };
                let why = match fate(&unfinished.lost()) {
                    Fate::Place(resume, why) => {
                        let resume_at = now.saturating_add(resume.delay.as_millis() as i64);
                        exec(
                            tx,
                            "cannot requeue a task",
                            "UPDATE taskhost_tasks SET state = 'ready', node = NULL, token = NULL, \
                             attempts = $2, failures = $3, resume_at_ms = $4 WHERE id = $1",
                            &[
                                &sql_id(id),
                                &(resume.attempts as i32),
                                &(resume.failures as i32),
                                &resume_at,
                            ],
                        )
                        .await?;
                        self.notify(tx, READY, "").await?;
                        why
                    }
                    Fate::End(outcome, why) => {
                        let report = TaskReport {
                            id,
                            name: Arc::from(name.as_str()),
                            slot: Arc::from(slot.as_str()),
                            outcome,
                            attempts,
                            history: Vec::new(),
                            duration: Duration::ZERO,
                        };
                        end_task(self, tx, &report, &[]).await?;
                        promote(self, tx, &slot).await?;
                        why
                    }
                };
                Some(Settled {
                    id,
                    name,
                    slot: slot.clone(),
                    why,
                })
            }
        };
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(settled)
    }

    /// Admits a submission that carries an idempotency key, in a
    /// transaction of its own that inserts the key first: the node that
    /// inserts it admits the task; one that finds it (having waited for the
    /// transaction that inserted it) answers with that key's task, or
    /// refuses another request. Keys older than `since_ms` are replaced.
    pub(crate) async fn admit_keyed(
        &self,
        admission: &Admission,
        key: &str,
        fingerprint: [u8; 32],
        since_ms: i64,
    ) -> Result<Submitted, AdmitError> {
        let mut last = None;
        for _ in 0..8 {
            match self
                .admit_keyed_once(admission, key, fingerprint, since_ms)
                .await
            {
                Err(AdmitError::Store(e)) if retryable(&e) => last = Some(e),
                other => return other,
            }
        }
        Err(AdmitError::Store(last.unwrap_or_else(|| {
            StoreError("PostgreSQL: cannot admit: gave up".into())
        })))
    }

    async fn admit_keyed_once(
        &self,
        admission: &Admission,
        key: &str,
        fingerprint: [u8; 32],
        since_ms: i64,
    ) -> Result<Submitted, AdmitError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let now = crate::store::now_ms() as i64;
        // A spawned task's tree (`request.root`) is counted in the same
        // round trip: its unfinished descendants, under a lock of the tree
        // (an advisory one, in memory: two spawns in one tree take turns).
        let root = admission.request.root.map(ms);
        let won = opt(
            &tx,
            "cannot record the idempotency key",
            "WITH held AS (SELECT pg_advisory_xact_lock($6, ($5::int8 % 2147483647)::int4) \
                 WHERE $5::int8 IS NOT NULL), \
             tree AS (SELECT count(*) AS n FROM taskhost_tasks \
                 WHERE root = $5 AND root IS NOT NULL AND state <> 'finished') \
             INSERT INTO taskhost_idempotency (key, fingerprint, created_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO UPDATE SET task_id = NULL, fingerprint = excluded.fingerprint, \
             created_ms = excluded.created_ms WHERE taskhost_idempotency.created_ms < $4 \
             RETURNING key, (SELECT n FROM tree), (SELECT count(*) FROM held)",
            &[&key, &&fingerprint[..], &now, &since_ms, &root, &TREE_LOCK],
        )
        .await?;
        let tree: i64 = won.as_ref().map_or(0, |row| row.get(1));
        let won = won.is_some();
        if !won {
            let row = one(
                &tx,
                "cannot read the idempotency key",
                "SELECT k.task_id, k.fingerprint, t.name, t.slot FROM taskhost_idempotency k \
                 LEFT JOIN taskhost_tasks t ON t.id = k.task_id WHERE k.key = $1",
                &[&key],
            )
            .await?;
            let id: Option<i64> = row.get(0);
            let stored: Vec<u8> = row.get(1);
            let id = id_of(id.unwrap_or(0));
            if stored[..] != fingerprint[..] {
                return Err(AdmitError::Conflict(crate::service::keys::conflict(
                    key, id,
                )));
            }
            let name: Option<String> = row.get(2);
            let slot: Option<String> = row.get(3);
            return Ok(Submitted {
                id,
                name: name.unwrap_or_else(|| id.to_string()),
                slot: slot.unwrap_or_default(),
                placement: Placement::Running,
                existing: true,
            });
        }
        // A spawned task: its tree's unfinished descendants, counted under
        // the root's row lock so that two spawns in one tree take turns.
        if let Some(root) = root
            && tree as usize >= admission.max_descendants
        {
            return Err(AdmitError::TreeFull {
                root: root as u64,
                max: admission.max_descendants,
            });
        }
        let id: i64 = one(
            &tx,
            "cannot allocate an id",
            "SELECT nextval('taskhost_task_ids')",
            &[],
        )
        .await?
        .get(0);
        let names = (admission.names)(id_of(id)).map_err(AdmitError::Invalid)?;
        let submitted = match admission.due {
            Some((due_ms, max_delayed)) => {
                self.delay_in(&tx, admission, id, names, due_ms, max_delayed)
                    .await?
            }
            None => self.admit_in(&tx, admission, id, names).await?,
        };
        exec(
            &tx,
            "cannot record the idempotency key",
            "UPDATE taskhost_idempotency SET task_id = $2 WHERE key = $1",
            &[&key, &id],
        )
        .await?;
        tx.commit()
            .await
            .map_err(db("cannot commit the submission"))?;
        // Now and then, the expired keys go (an expired one is also
        // replaced when it is given again).
        if fastrand::u32(..256) == 0 {
            let _ = exec(
                &client,
                "cannot forget expired idempotency keys",
                "DELETE FROM taskhost_idempotency WHERE created_ms < $1",
                &[&since_ms],
            )
            .await;
        }
        Ok(submitted)
    }

    /// Queues a submission for the next batch of admissions now (its
    /// place among this node's submissions); the future resolves with its
    /// decision.
    pub(crate) fn admit_queued(
        &self,
        admission: Arc<Admission>,
    ) -> impl std::future::Future<Output = Result<Submitted, AdmitError>> + Send + 'static {
        self.writer().admit(admission)
    }

    /// Admits one submission in `tx` under id `id_value`, reading its
    /// slot afresh (a Replace in a batch of admissions; the caller holds
    /// nothing of the slot it has not written).
    pub(super) async fn admit_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id_value: i64,
        names: (String, String, AdmissionPolicy),
    ) -> Result<Submitted, AdmitError> {
        self.admit_row(tx, a, id_value, names, false).await
    }

    /// Like [`Pg::admit_in`]; with `existing`, the task's row is there
    /// already (a delayed submission come due) and is changed, not added.
    pub(super) async fn admit_row(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id_value: i64,
        (name, slot, policy): (String, String, AdmissionPolicy),
        existing: bool,
    ) -> Result<Submitted, AdmitError> {
        let id = id_of(id_value);
        let mut request = a.request.clone();
        request.name = Some(name.clone());
        request.slot = Some(slot.clone());
        request.policy = Some(policy);
        let encoded = encode(&request)?;

        // The plugin stays while this transaction runs (collection locks
        // it to delete it), and the task row then keeps it.
        let plugin_row = tx
            .prepare_cached("SELECT 1 FROM taskhost_plugins WHERE digest = $1 FOR KEY SHARE")
            .await
            .map_err(db("cannot check the plugin"))?;
        if tx
            .query_opt(&plugin_row, &[&&a.request.plugin.0[..]])
            .await
            .map_err(db("cannot check the plugin"))?
            .is_none()
        {
            return Err(AdmitError::PluginGone);
        }
        // The slot's row, created if new, locked either way: admissions
        // and releases in this slot wait for each other from here on.
        exec(
            tx,
            "cannot lock the slot",
            "INSERT INTO taskhost_slots (slot) VALUES ($1) \
                 ON CONFLICT (slot) DO UPDATE SET slot = excluded.slot",
            &[&slot],
        )
        .await?;
        // Everything the rules read, in one round trip: a live holder of the
        // name elsewhere, the owner and its state, the queue's length, head
        // and tail, and the pending work of the whole cluster.
        let row = one(
            tx,
            "cannot read the slot",
            "SELECT \
                 (SELECT id FROM taskhost_tasks WHERE name = $2 AND slot <> $1 \
                  AND state IN ('ready', 'running', 'stopping') LIMIT 1), \
                 o.id, o.state, \
                 (SELECT count(*) FROM taskhost_tasks WHERE slot = $1 AND state = 'queued'), \
                 (SELECT max(pos) FROM taskhost_tasks WHERE slot = $1 AND state = 'queued'), \
                 (SELECT id FROM taskhost_tasks WHERE slot = $1 AND state = 'queued' \
                  ORDER BY pos, id LIMIT 1), \
                 (SELECT min(pos) FROM taskhost_tasks WHERE slot = $1 AND state = 'queued'), \
                 (SELECT count(*) FROM taskhost_tasks WHERE state = 'queued') \
                 FROM (SELECT 1) one LEFT JOIN taskhost_tasks o ON o.slot = $1 \
                  AND o.state IN ('ready', 'running', 'stopping')",
            &[&slot, &name],
        )
        .await?;
        let holder: Option<i64> = row.get(0);
        let owner: Option<(TaskId, OwnerState)> =
            row.get::<_, Option<i64>>(1).map(id_of).map(|owner| {
                let state = match row.get::<_, Option<String>>(2).as_deref() {
                    Some("stopping") => OwnerState::Stopping,
                    _ => OwnerState::Running,
                };
                (owner, state)
            });
        let queued = row.get::<_, i64>(3).max(0) as usize;
        let last_pos: Option<i64> = row.get(4);
        let head: Option<(TaskId, i64)> = row
            .get::<_, Option<i64>>(5)
            .map(id_of)
            .zip(row.get::<_, Option<i64>>(6));
        let pending = row.get::<_, i64>(7).max(0) as usize;

        let limits = Limits {
            max_slot_queue: a.max_slot_queue,
            max_total_pending: a.max_total_pending,
            // Slot rows stay in the database: it bounds no slot count.
            max_slots: usize::MAX,
            holder: "the cluster",
        };
        let summary = SlotSummary {
            owner,
            queued,
            head: head.map(|h| h.0),
            tracked: true,
        };
        let totals = Totals { pending, slots: 0 };
        // The registry's rule first (a name is held by one live task), then
        // the slot's.
        let decision = match holder {
            Some(holder) => Decision::Reject {
                kind: RejectionKind::AlreadyExists,
                reason: format!(
                    "task name `{name}` is held by task {} in another slot",
                    id_of(holder)
                ),
            },
            None => admission::decide(&slot, &summary, policy, totals, &limits, false),
        };
        let queued_owner = owner.map(|o| o.0);
        // (state, position, placement)
        let (state, pos, placement) = match decision {
            Decision::Reject { kind, reason } => (
                "finished",
                0,
                Placement::Rejected(TaskOutcome::Rejected { kind, reason }),
            ),
            Decision::Admit => ("ready", 0, Placement::Running),
            Decision::Enqueue => (
                "queued",
                last_pos.unwrap_or(0) + 1,
                Placement::Queued {
                    owner: queued_owner,
                },
            ),
            Decision::Replace { displaced, stop } => {
                let head = head.map_or(0, |h| h.1);
                if let Some(old) = displaced {
                    let report = never_ran_row(
                        tx,
                        old,
                        RejectionKind::SupersededByReplace,
                        format!("a newer Replace submission ({id}) took its place"),
                    )
                    .await?;
                    end_task(self, tx, &report, &[]).await?;
                }
                match stop {
                    None => (
                        "queued",
                        head - 1,
                        Placement::Queued {
                            owner: queued_owner,
                        },
                    ),
                    Some(owner) => self.stop_for_replace(tx, owner, head).await?,
                }
            }
        };
        let now = ms(now_ms());
        let placed = !matches!(placement, Placement::Rejected(_));
        // A rejected one is inserted queued and ended at once (its report
        // and the notification of its end).
        let inserted = if state == "finished" { "queued" } else { state };
        // The time it was due (a schedule's firing), kept for the record.
        let due_ms = match a.request.not_before {
            Some(crate::wire::protocol::NotBefore::At(at)) => Some(ms(at)),
            _ => None,
        };
        if existing {
            exec(
                tx,
                "cannot admit the delayed submission",
                "UPDATE taskhost_tasks SET state = $2, pos = $3, placed = $4 WHERE id = $1",
                &[&id_value, &inserted, &pos, &placed],
            )
            .await?;
        } else {
            let insert = tx
                .prepare_cached(
                    "INSERT INTO taskhost_tasks (id, name, slot, plugin, digest, request, state, \
                     pos, placed, submitted_ms, priority, schedule, due_ms, parent, root) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
                )
                .await
                .map_err(db("cannot record the submission"))?;
            tx.execute(
                &insert,
                &[
                    &id_value,
                    &name,
                    &slot,
                    &a.plugin,
                    &&a.request.plugin.0[..],
                    &encoded,
                    &inserted,
                    &pos,
                    &placed,
                    &now,
                    &a.request.priority,
                    &a.request.schedule,
                    &due_ms,
                    &a.request.parent.map(ms),
                    &a.request.root.map(ms),
                ],
            )
            .await
            .map_err(db("cannot record the submission"))?;
        }
        match &placement {
            Placement::Rejected(outcome) => {
                let report = TaskReport::never_ran(
                    id,
                    Arc::from(name.as_str()),
                    Arc::from(slot.as_str()),
                    outcome.clone(),
                );
                end_task(self, tx, &report, &[]).await?;
            }
            _ if state == "ready" => self.notify(tx, READY, "").await?,
            _ => {}
        }
        Ok(Submitted {
            id,
            name,
            slot,
            placement,
            existing: false,
        })
    }

    /// Stops the owner a Replace displaces, as its row says it can be:
    /// a running one is asked to stop (the newcomer heads the queue), one
    /// admitted but not claimed yet ends Canceled at once (the newcomer
    /// owns the slot), one already stopping is left to end.
    async fn stop_for_replace(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        owner: TaskId,
        head: i64,
    ) -> Result<(&'static str, i64, Placement), AdmitError> {
        // Locked: a claim may be turning it from ready to running; this
        // waits for that to commit.
        let owner_row = one(
            tx,
            "cannot read the owner",
            "SELECT name, state FROM taskhost_tasks WHERE id = $1 FOR UPDATE",
            &[&sql_id(owner)],
        )
        .await?;
        let name: String = owner_row.get(0);
        let state: String = owner_row.get(1);
        Ok(match state.as_str() {
            "running" => {
                exec(
                    tx,
                    "cannot stop the owner",
                    "UPDATE taskhost_tasks SET state = 'stopping' WHERE id = $1",
                    &[&sql_id(owner)],
                )
                .await?;
                self.notify(tx, STOP, &owner.get().to_string()).await?;
                ("queued", head - 1, Placement::Replacing { owner, name })
            }
            "ready" => {
                let report = report_of(tx, owner, TaskOutcome::Canceled).await?;
                end_task(self, tx, &report, &[]).await?;
                ("ready", 0, Placement::Replacing { owner, name })
            }
            // Already being stopped: first in line.
            _ => ("queued", head - 1, Placement::Queued { owner: Some(owner) }),
        })
    }

    /// Claims up to `n` ready tasks for `node` (a dead node claims nothing),
    /// each under a new fencing token.
    pub(crate) async fn claim(&self, node: i64, n: i64) -> Result<Vec<Claimed>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot claim work",
            "WITH c AS (SELECT id FROM taskhost_tasks WHERE state = 'ready' \
                 ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE taskhost_tasks t SET state = 'running', node = $1, \
                 token = nextval('taskhost_fence') FROM c WHERE t.id = c.id \
                 AND EXISTS (SELECT 1 FROM taskhost_nodes WHERE id = $1 AND alive) \
                 RETURNING t.id, t.token, t.request, t.plugin, t.attempts, t.failures, \
                 t.resume_at_ms, t.submitted_ms",
            &[&node, &n],
        )
        .await?;
        let mut claimed: Vec<Claimed> = rows
            .iter()
            .map(|r| {
                Ok(Claimed {
                    id: id_of(r.get(0)),
                    token: r.get(1),
                    request: decode_request(r.get::<_, &[u8]>(2))?,
                    plugin: r.get(3),
                    attempts: r.get::<_, i32>(4).max(0) as u32,
                    failures: r.get::<_, i32>(5).max(0) as u32,
                    resume_at_ms: r.get::<_, Option<i64>>(6).map(|v| v.max(0) as u64),
                    submitted_ms: r.get::<_, i64>(7).max(0) as u64,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        claimed.sort_by_key(|c| (std::cmp::Reverse(c.request.priority), c.id));
        Ok(claimed)
    }

    /// The tasks claimed by `node` that it does not know it holds (not in
    /// `held`): a claim whose commit landed but whose answer was lost when
    /// the database went away.
    pub(crate) async fn claimed_by(
        &self,
        node: i64,
        held: &[TaskId],
    ) -> Result<Vec<Claimed>, StoreError> {
        let client = self.client().await?;
        let held: Vec<i64> = held.iter().map(|id| sql_id(*id)).collect();
        let rows = all(
            &client,
            "cannot read this node's claims",
            "SELECT id, token, request, plugin, attempts, failures, resume_at_ms, submitted_ms \
                 FROM taskhost_tasks WHERE node = $1 AND state IN ('running', 'stopping') \
                 AND id <> ALL($2) ORDER BY priority DESC, id",
            &[&node, &held],
        )
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Claimed {
                    id: id_of(r.get(0)),
                    token: r.get(1),
                    request: decode_request(r.get::<_, &[u8]>(2))?,
                    plugin: r.get(3),
                    attempts: r.get::<_, i32>(4).max(0) as u32,
                    failures: r.get::<_, i32>(5).max(0) as u32,
                    resume_at_ms: r.get::<_, Option<i64>>(6).map(|v| v.max(0) as u64),
                    submitted_ms: r.get::<_, i64>(7).max(0) as u64,
                })
            })
            .collect()
    }

    /// Records that attempt `attempt` starts under `token`; false if the
    /// claim was taken away (the attempt must not run).
    pub(crate) async fn attempt_started(
        &self,
        id: TaskId,
        token: i64,
        attempt: u32,
    ) -> Result<bool, StoreError> {
        self.writer().started(id, token, attempt).await
    }

    /// Records that attempt `attempts` ended and the next is due after a
    /// pause; false if the claim was taken away.
    pub(crate) async fn pausing(
        &self,
        id: TaskId,
        token: i64,
        attempts: u32,
        pause: Pause,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "WITH t AS (UPDATE taskhost_tasks SET resume_at_ms = $4, failures = $5, attempts = $3 \
                 WHERE id = $1 AND token = $2 AND state IN ('running', 'stopping') RETURNING id) \
                 UPDATE taskhost_attempts SET ended_ms = $6, result = 'ended' \
                 WHERE task_id = $1 AND token = $2 AND ended_ms IS NULL AND EXISTS (SELECT 1 FROM t)",
            )
            .await
            .map_err(db("cannot record a pause"))?;
        let n = client
            .execute(
                &stmt,
                &[
                    &sql_id(id),
                    &token,
                    &(attempts as i32),
                    &ms(pause.until_ms),
                    &(pause.failures as i32),
                    &ms(now_ms()),
                ],
            )
            .await
            .map_err(db("cannot record a pause"))?;
        Ok(n <= 1)
    }

    /// Records a claimed task's end and frees its slot for the next in
    /// line; false if the claim was taken away (nothing is recorded).
    pub(crate) async fn finish(&self, token: i64, finished: &Finished) -> Result<bool, StoreError> {
        self.writer().finished(token, finished.clone()).await
    }

    /// Stops a task wherever it is: queued work is removed, a task not yet
    /// claimed ends Canceled, a running one is marked stopping and its node
    /// told.
    pub(crate) async fn cancel(&self, id: TaskId) -> Result<Canceled, StoreError> {
        retry(|| self.cancel_once(id)).await
    }

    async fn cancel_once(&self, id: TaskId) -> Result<Canceled, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        // Waiting for its time: it holds no slot. (Locked: a node placing
        // it as it comes due is waited for, and then it is no longer
        // delayed.)
        let delayed = opt(
            &tx,
            "cannot read the task",
            "SELECT 1 FROM taskhost_tasks WHERE id = $1 AND state = 'delayed' FOR UPDATE",
            &[&sql_id(id)],
        )
        .await?;
        if delayed.is_some() {
            let report = never_ran_row(
                &tx,
                id,
                RejectionKind::RemovedFromQueue,
                "removed before it was due".into(),
            )
            .await?;
            end_task(self, &tx, &report, &[]).await?;
            tx.commit().await.map_err(db("cannot commit"))?;
            return Ok(Canceled::Claimed { node: None });
        }
        let Some(slot) = lock_slot_of(&tx, id).await? else {
            return Ok(Canceled::Already);
        };
        let row = one(
            &tx,
            "cannot read the task",
            "SELECT state, node FROM taskhost_tasks WHERE id = $1 FOR UPDATE",
            &[&sql_id(id)],
        )
        .await?;
        let state: String = row.get(0);
        let node: Option<i64> = row.get(1);
        let done = match state.as_str() {
            "queued" => {
                let report = never_ran_row(
                    &tx,
                    id,
                    RejectionKind::RemovedFromQueue,
                    "removed from the queue before it ran".into(),
                )
                .await?;
                end_task(self, &tx, &report, &[]).await?;
                Canceled::Claimed { node: None }
            }
            "ready" => {
                let report = report_of(&tx, id, TaskOutcome::Canceled).await?;
                end_task(self, &tx, &report, &[]).await?;
                promote(self, &tx, &slot).await?;
                Canceled::Claimed { node: None }
            }
            "running" => {
                exec(
                    &tx,
                    "cannot mark the task stopping",
                    "UPDATE taskhost_tasks SET state = 'stopping' WHERE id = $1",
                    &[&sql_id(id)],
                )
                .await?;
                self.notify(&tx, STOP, &id.get().to_string()).await?;
                Canceled::Claimed { node }
            }
            _ => Canceled::Already,
        };
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(done)
    }

    /// This node's tasks that were asked to stop (the polling fallback of
    /// the stop notification).
    pub(crate) async fn stopping_on(&self, node: i64) -> Result<Vec<TaskId>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot read stop requests",
            "SELECT id FROM taskhost_tasks WHERE node = $1 AND state = 'stopping'",
            &[&node],
        )
        .await?;
        Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
    }

    /// A finished task, if it has finished.
    pub(crate) async fn finished(&self, id: TaskId) -> Result<Option<Finished>, StoreError> {
        let client = self.client().await?;
        let Some(row) = opt(
            &client,
            "cannot read a task",
            "SELECT report, log, plugin, submitted_ms, finished_ms, parent FROM taskhost_tasks \
                 WHERE id = $1 AND state = 'finished'",
            &[&sql_id(id)],
        )
        .await?
        else {
            return Ok(None);
        };
        let report: TaskReport = decode(row.get::<_, &[u8]>(0))?;
        let log: Vec<LogLine> = row
            .get::<_, Option<&[u8]>>(1)
            .map(decode)
            .transpose()?
            .unwrap_or_default();
        Ok(Some(Finished {
            report,
            plugin: row.get(2),
            log,
            submitted_ms: row.get::<_, i64>(3).max(0) as u64,
            finished_ms: row.get::<_, Option<i64>>(4).unwrap_or(0).max(0) as u64,
            parent: row.get::<_, Option<i64>>(5).map(|p| p.max(0) as u64),
        }))
    }

    /// Which of these tasks have finished.
    pub(crate) async fn finished_among(&self, ids: &[TaskId]) -> Result<Vec<TaskId>, StoreError> {
        let client = self.client().await?;
        let ids: Vec<i64> = ids.iter().map(|id| sql_id(*id)).collect();
        let rows = all(
            &client,
            "cannot look up waited tasks",
            "SELECT id FROM taskhost_tasks WHERE id = ANY($1) AND state = 'finished'",
            &[&ids],
        )
        .await?;
        Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
    }

    /// The task a target refers to: an id is that task; a name is the live
    /// task holding it (its slot's owner, else the oldest queued), else the
    /// newest finished one that held it. A rejected submission never held
    /// its name.
    /// The request (resolved) a task was admitted with, while its row is
    /// kept.
    pub(crate) async fn request_of(&self, id: TaskId) -> Result<Option<SubmitRequest>, StoreError> {
        let client = self.client().await?;
        let row = opt(
            &client,
            "cannot read the task's request",
            "SELECT request FROM taskhost_tasks WHERE id = $1",
            &[&(id.get() as i64)],
        )
        .await?;
        Ok(row.and_then(|r| SubmitRequest::decode_stored(r.get::<_, &[u8]>(0)).ok()))
    }

    pub(crate) async fn resolve(&self, target: &TaskRef) -> Result<Option<Found>, StoreError> {
        let client = self.client().await?;
        let row = match target {
            TaskRef::Id(id) => opt(
     &client,
     "cannot find the task",
     "SELECT t.id, t.state, t.node, n.name FROM taskhost_tasks t \
                     LEFT JOIN taskhost_nodes n ON n.id = t.node WHERE t.id = $1",
     &[&sql_id(*id)],
 )
 .await?,
            TaskRef::Name(name) => opt(
     &client,
     "cannot find the task",
     "SELECT t.id, t.state, t.node, n.name FROM taskhost_tasks t \
                     LEFT JOIN taskhost_nodes n ON n.id = t.node WHERE t.name = $1 AND t.placed \
                     ORDER BY CASE WHEN t.state = 'finished' THEN 2 WHEN t.state IN ('queued', 'delayed') THEN 1 ELSE 0 END, \
                     CASE WHEN t.state = 'finished' THEN -t.id ELSE t.id END LIMIT 1",
     &[name],
 )
 .await?,
        };
        Ok(row.map(|r| Found {
            id: id_of(r.get(0)),
            state: r.get(1),
        }))
    }

    /// `host ps`: every unfinished task of the cluster, with its node; with
    /// `all`, the newest `recent` finished ones too.
    pub(crate) async fn list(
        &self,
        everything: bool,
        recent: i64,
    ) -> Result<Vec<TaskRow>, StoreError> {
        let client = self.client().await?;
        let now = now_ms();
        let mut rows: Vec<TaskRow> = all(
            &client,
            "cannot list tasks",
            "SELECT t.id, t.name, t.slot, t.state, t.attempts, t.submitted_ms, t.plugin, n.name, \
                 t.resume_at_ms, t.due_ms, t.schedule, t.parent FROM taskhost_tasks t \
                 LEFT JOIN taskhost_nodes n ON n.id = t.node \
                 WHERE t.state <> 'finished' ORDER BY t.id",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            let state: String = r.get(3);
            let pausing = r.get::<_, Option<i64>>(8).is_some();
            TaskRow {
                id: id_of(r.get(0)),
                name: r.get(1),
                slot: r.get(2),
                state: match state.as_str() {
                    "queued" => TaskState::Queued,
                    "ready" | "delayed" => TaskState::Waiting,
                    "stopping" => TaskState::Stopping,
                    _ if pausing => TaskState::BackingOff,
                    _ => TaskState::Running,
                },
                attempts: r.get::<_, i32>(4).max(0) as u32,
                age: Duration::from_millis(now.saturating_sub(r.get::<_, i64>(5).max(0) as u64)),
                progress: None,
                plugin: r.get(6),
                outcome: None,
                node: r.get(7),
                due_ms: (state == "delayed")
                    .then(|| r.get::<_, Option<i64>>(9).map(|v| v.max(0) as u64))
                    .flatten(),
                schedule: r.get(10),
                parent: r.get::<_, Option<i64>>(11).map(|p| p.max(0) as u64),
            }
        })
        .collect();
        if everything {
            let finished = all(
                &client,
                "cannot list finished tasks",
                "SELECT id, name, slot, attempts, submitted_ms, plugin, outcome, schedule, parent \
                     FROM taskhost_tasks WHERE state = 'finished' ORDER BY finished_ms DESC LIMIT $1",
                &[&recent],
            )
            .await?;
            rows.extend(finished.iter().map(|r| {
                TaskRow {
                    id: id_of(r.get(0)),
                    name: r.get(1),
                    slot: r.get(2),
                    state: TaskState::Finished,
                    attempts: r.get::<_, i32>(3).max(0) as u32,
                    age: Duration::from_millis(
                        now.saturating_sub(r.get::<_, i64>(4).max(0) as u64),
                    ),
                    progress: None,
                    plugin: r.get(5),
                    outcome: r
                        .get::<_, Option<String>>(6)
                        .as_deref()
                        .and_then(OutcomeKind::from_word),
                    node: None,
                    due_ms: None,
                    schedule: r.get(7),
                    parent: r.get::<_, Option<i64>>(8).map(|p| p.max(0) as u64),
                }
            }));
            rows.sort_by_key(|r| r.id);
        }
        Ok(rows)
    }

    /// `host slots`: each slot with an owner or a queue.
    pub(crate) async fn slots(&self) -> Result<Vec<SlotView>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot list slots",
            "SELECT slot, id, state FROM taskhost_tasks \
                 WHERE state IN ('queued', 'ready', 'running', 'stopping') \
                 ORDER BY slot, state = 'queued', pos, id",
            &[],
        )
        .await?;
        let mut slots: Vec<SlotView> = Vec::new();
        for r in &rows {
            let key: String = r.get(0);
            let id = id_of(r.get(1));
            let state: String = r.get(2);
            if slots.last().is_none_or(|s| s.key != key) {
                slots.push(SlotView {
                    key: key.clone(),
                    state: SlotState::Idle,
                    owner: None,
                    queue_depth: 0,
                    in_state_for: Duration::ZERO,
                    queued: Vec::new(),
                });
            }
            let Some(view) = slots.last_mut() else {
                continue;
            };
            match state.as_str() {
                "queued" => {
                    view.queued.push(id);
                    view.queue_depth += 1;
                }
                "ready" => {
                    view.owner = Some(id);
                    view.state = SlotState::Admitting;
                }
                "stopping" => {
                    view.owner = Some(id);
                    view.state = SlotState::Terminating;
                }
                _ => {
                    view.owner = Some(id);
                    view.state = SlotState::Running;
                }
            }
        }
        Ok(slots)
    }

    /// Ships lines of running tasks, each kept only while its claim (task,
    /// token) holds.
    pub(crate) async fn ship_lines(
        &self,
        lines: &[(TaskId, i64, LogLine)],
        keep_lines: usize,
    ) -> Result<(), StoreError> {
        let mut ids = Vec::with_capacity(lines.len());
        let mut tokens = Vec::with_capacity(lines.len());
        let mut encoded = Vec::with_capacity(lines.len());
        for (id, token, line) in lines {
            ids.push(sql_id(*id));
            tokens.push(*token);
            encoded.push(encode(line)?);
        }
        // One transaction: readers never see more than `keep_lines` of a
        // running task's lines (the newest are kept, as a node's memory
        // keeps them), so the table is bounded while tasks run, not only
        // after their end.
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot ship log lines"))?;
        exec(
            &tx,
            "cannot ship log lines",
            "INSERT INTO taskhost_logs (task_id, line) \
                 SELECT u.id, u.line FROM unnest($1::bigint[], $2::bigint[], $3::bytea[]) \
                 WITH ORDINALITY AS u(id, token, line, n) \
                 JOIN taskhost_tasks t ON t.id = u.id AND t.token = u.token \
                 AND t.state IN ('running', 'stopping') ORDER BY u.n",
            &[&ids, &tokens, &encoded],
        )
        .await?;
        ids.sort_unstable();
        ids.dedup();
        let trim = tx
            .prepare_cached(
                "DELETE FROM taskhost_logs l USING unnest($1::bigint[]) AS t(id) \
                 WHERE l.task_id = t.id AND l.seq <= (SELECT seq FROM taskhost_logs \
                 WHERE task_id = t.id ORDER BY seq DESC OFFSET $2 LIMIT 1)",
            )
            .await
            .map_err(db("cannot trim log lines"))?;
        let keep = i64::try_from(keep_lines).unwrap_or(i64::MAX);
        tx.execute(&trim, &[&ids, &keep])
            .await
            .map_err(db("cannot trim log lines"))?;
        tx.commit().await.map_err(db("cannot ship log lines"))?;
        Ok(())
    }

    /// A running task's shipped lines after `after` (a `seq`); returns them
    /// with the last seq.
    pub(crate) async fn shipped_lines(
        &self,
        id: TaskId,
        after: i64,
    ) -> Result<(Vec<LogLine>, i64), StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot read log lines",
            "SELECT seq, line FROM taskhost_logs WHERE task_id = $1 AND seq > $2 \
                 ORDER BY seq LIMIT 1000",
            &[&sql_id(id), &after],
        )
        .await?;
        let mut last = after;
        let mut lines = Vec::with_capacity(rows.len());
        for row in &rows {
            last = row.get(0);
            lines.push(decode(row.get::<_, &[u8]>(1))?);
        }
        Ok((lines, last))
    }

    /// Ships a node's events.
    pub(crate) async fn ship_events(&self, node: i64, events: &[Event]) -> Result<(), StoreError> {
        let encoded = events.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
        let client = self.client().await?;
        exec(
            &client,
            "cannot ship events",
            "INSERT INTO taskhost_events (node, event) \
                 SELECT $1, e FROM unnest($2::bytea[]) WITH ORDINALITY AS u(e, n) ORDER BY n",
            &[&node, &encoded],
        )
        .await?;
        Ok(())
    }

    /// The cluster's events after seq `after` (None: the newest `limit`),
    /// oldest first, each with the database's seq.
    pub(crate) async fn events(
        &self,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let client = self.client().await?;
        let rows = if let Some(after) = after {
            client
                .query(
                    "SELECT seq, event FROM taskhost_events WHERE seq > $1 ORDER BY seq LIMIT $2",
                    &[&after, &limit],
                )
                .await
        } else {
            client
                .query(
                    "SELECT seq, event FROM (SELECT seq, event FROM taskhost_events \
                     ORDER BY seq DESC LIMIT $1) e ORDER BY seq",
                    &[&limit],
                )
                .await
        }
        .map_err(db("cannot read events"))?;
        rows.iter()
            .map(|r| {
                let mut event = decode_event(r.get::<_, &[u8]>(1))?;
                event.seq = r.get::<_, i64>(0).max(0) as u64;
                Ok(event)
            })
            .collect()
    }

    /// Whether the cluster holds this plugin.
    pub(crate) async fn has_plugin(&self, digest: &Digest) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(opt(
            &client,
            "cannot look a plugin up",
            "SELECT 1 FROM taskhost_plugins WHERE digest = $1",
            &[&&digest.0[..]],
        )
        .await?
        .is_some())
    }

    /// Stores a plugin for the whole cluster (once per digest).
    pub(crate) async fn put_plugin(
        &self,
        digest: &Digest,
        name: Option<&str>,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        exec(
            &client,
            "cannot store a plugin",
            "INSERT INTO taskhost_plugins (digest, name, bytes, stored_ms) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (digest) DO UPDATE SET stored_ms = excluded.stored_ms",
            &[&&digest.0[..], &name, &bytes, &ms(now_ms())],
        )
        .await?;
        Ok(())
    }

    /// Deletes the stored plugins that no task (unfinished, or finished and
    /// retained) refers to and that were last stored before `keep` ago;
    /// returns how many. A plugin an admission is using is locked, so it
    /// is skipped.
    pub(crate) async fn collect_plugins(&self, keep: Duration) -> Result<u64, StoreError> {
        let cutoff = ms(now_ms().saturating_sub(keep.as_millis() as u64));
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let old = all(
            &tx,
            "cannot list plugins",
            "SELECT digest FROM taskhost_plugins WHERE stored_ms < $1 FOR UPDATE SKIP LOCKED",
            &[&cutoff],
        )
        .await?;
        let mut removed = 0;
        for row in &old {
            let digest: &[u8] = row.get(0);
            // A new statement, so a new snapshot: admissions that committed
            // while this waited are seen.
            removed += exec(
                &tx,
                "cannot collect a plugin",
                "DELETE FROM taskhost_plugins WHERE digest = $1 AND NOT EXISTS \
                     (SELECT 1 FROM taskhost_tasks WHERE digest = $1) AND NOT EXISTS \
                     (SELECT 1 FROM taskhost_schedules WHERE digest = $1)",
                &[&digest],
            )
            .await?;
        }
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(removed)
    }

    /// A plugin's bytes, if the cluster holds it.
    pub(crate) async fn plugin_bytes(
        &self,
        digest: &Digest,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        Ok(opt(
            &client,
            "cannot read a plugin",
            "SELECT bytes FROM taskhost_plugins WHERE digest = $1",
            &[&&digest.0[..]],
        )
        .await?
        .map(|r| r.get(0)))
    }

    /// Deletes finished tasks beyond the retention bounds (and their
    /// attempts).
    pub(crate) async fn prune(
        &self,
        (max_finished, max_age, max_bytes): (usize, Duration, u64),
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let cutoff = ms(now_ms().saturating_sub(max_age.as_millis() as u64));
        let keep = i64::try_from(max_finished).unwrap_or(i64::MAX);
        let bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        let n = exec(
            &client,
            "cannot apply retention",
            "WITH gone AS (DELETE FROM taskhost_tasks WHERE state = 'finished' AND \
                 (finished_ms < $1 OR id IN (SELECT id FROM (SELECT id, \
                 row_number() OVER newest AS n, \
                 sum(length(request) + coalesce(length(report), 0) + coalesce(length(log), 0)) \
                 OVER newest AS bytes FROM taskhost_tasks WHERE state = 'finished' \
                 WINDOW newest AS (ORDER BY finished_ms DESC, id DESC)) kept \
                 WHERE n > $2 OR bytes > $3)) RETURNING id), \
                 lines AS (DELETE FROM taskhost_logs WHERE task_id IN (SELECT id FROM gone)) \
                 DELETE FROM taskhost_attempts WHERE task_id IN (SELECT id FROM gone)",
            &[&cutoff, &keep, &bytes],
        )
        .await?;
        exec(
            &client,
            "cannot prune events",
            "DELETE FROM taskhost_events WHERE seq <= (SELECT max(seq) FROM taskhost_events) - $1",
            &[&EVENTS_KEPT],
        )
        .await?;
        Ok(n)
    }
}

/// Locks the slot of task `id` (the row lock every decision in a slot
/// takes first); returns the slot, None for an unknown task.
/// An event as a node shipped it: one shipped before `Event::parent`
/// existed lacks its last byte (`None`).
fn decode_event(bytes: &[u8]) -> Result<Event, StoreError> {
    decode(bytes).or_else(|e| {
        let mut padded = bytes.to_vec();
        padded.push(0);
        postcard::from_bytes(&padded).map_err(|_| e)
    })
}

/// Fills `parent` and `root` of the rows stored before the columns were
/// (from their requests; rows nobody spawned keep NULL).
async fn fill_lineage(tx: &deadpool_postgres::Transaction<'_>) -> Result<(), StoreError> {
    let rows = all(
        tx,
        "cannot read the tasks to migrate",
        "SELECT id, request FROM taskhost_tasks",
        &[],
    )
    .await?;
    for row in rows {
        let Ok(request) = SubmitRequest::decode_stored(row.get::<_, &[u8]>(1)) else {
            continue;
        };
        let Some(parent) = request.parent else {
            continue;
        };
        let root = request.root.unwrap_or(parent);
        exec(
            tx,
            "cannot migrate a task's parent",
            "UPDATE taskhost_tasks SET parent = $2, root = $3 WHERE id = $1",
            &[&row.get::<_, i64>(0), &ms(parent), &ms(root)],
        )
        .await?;
    }
    Ok(())
}

async fn lock_slot_of(
    tx: &deadpool_postgres::Transaction<'_>,
    id: TaskId,
) -> Result<Option<String>, StoreError> {
    let stmt = tx
        .prepare_cached(
            "SELECT s.slot FROM taskhost_slots s \
             WHERE s.slot = (SELECT slot FROM taskhost_tasks WHERE id = $1) FOR UPDATE",
        )
        .await
        .map_err(db("cannot lock the slot"))?;
    Ok(tx
        .query_opt(&stmt, &[&sql_id(id)])
        .await
        .map_err(db("cannot lock the slot"))?
        .map(|r| r.get(0)))
}

/// The report of a task that ends now with `outcome`, from its row.
async fn report_of(
    tx: &deadpool_postgres::Transaction<'_>,
    id: TaskId,
    outcome: TaskOutcome,
) -> Result<TaskReport, StoreError> {
    let row = one(
        tx,
        "cannot read a task",
        "SELECT name, slot, attempts FROM taskhost_tasks WHERE id = $1",
        &[&sql_id(id)],
    )
    .await?;
    Ok(TaskReport {
        id,
        name: Arc::from(row.get::<_, &str>(0)),
        slot: Arc::from(row.get::<_, &str>(1)),
        outcome,
        attempts: row.get::<_, i32>(2).max(0) as u32,
        history: Vec::new(),
        duration: Duration::ZERO,
    })
}

async fn never_ran_row(
    tx: &deadpool_postgres::Transaction<'_>,
    id: TaskId,
    kind: RejectionKind,
    reason: String,
) -> Result<TaskReport, StoreError> {
    report_of(tx, id, TaskOutcome::Rejected { kind, reason }).await
}

/// Records a task's final report (the caller holds its slot's lock), with
/// `log`, else the lines its node shipped (a task ended by a takeover);
/// the shipped lines go.
pub(super) async fn end_task(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    report: &TaskReport,
    log: &[LogLine],
) -> Result<(), StoreError> {
    let shipped = all(
        tx,
        "cannot take the shipped lines",
        "DELETE FROM taskhost_logs WHERE task_id = $1 RETURNING seq, line",
        &[&sql_id(report.id)],
    )
    .await?;
    let encoded = encode(report)?;
    let log = if log.is_empty() && !shipped.is_empty() {
        let mut lines: Vec<(i64, LogLine)> = shipped
            .iter()
            .map(|r| Ok((r.get(0), decode(r.get::<_, &[u8]>(1))?)))
            .collect::<Result<_, StoreError>>()?;
        lines.sort_by_key(|(seq, _)| *seq);
        let lines: Vec<LogLine> = lines.into_iter().map(|(_, l)| l).collect();
        encode(&lines)?
    } else {
        encode(&log)?
    };
    exec(
        tx,
        "cannot record an outcome",
        "UPDATE taskhost_tasks SET state = 'finished', finished_ms = $2, outcome = $3, \
         report = $4, log = $5, attempts = $6, resume_at_ms = NULL WHERE id = $1",
        &[
            &sql_id(report.id),
            &ms(now_ms()),
            &report.outcome.kind().as_str(),
            &encoded,
            &log,
            &(report.attempts as i32),
        ],
    )
    .await?;
    pg.notify(tx, FINISHED, &report.id.get().to_string()).await
}

/// Makes the head of a slot's queue its owner (the caller holds the slot's
/// lock and the slot has just lost its owner).
async fn promote(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    slot: &str,
) -> Result<(), StoreError> {
    let promoted = opt(
        tx,
        "cannot admit the next in the slot",
        "UPDATE taskhost_tasks SET state = 'ready' WHERE id = \
             (SELECT id FROM taskhost_tasks WHERE slot = $1 AND state = 'queued' \
              ORDER BY pos, id LIMIT 1) RETURNING id",
        &[&slot],
    )
    .await?;
    if promoted.is_some() {
        pg.notify(tx, READY, "").await?;
    }
    Ok(())
}
