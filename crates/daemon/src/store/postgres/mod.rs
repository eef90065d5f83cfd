//! The PostgreSQL backend of cluster mode: the shared state of every node
//! (`crates/daemon/migrations/postgres/`), and each decision that two nodes could
//! race on as one transaction. Decisions in a slot (admission, release,
//! cancel, takeover) lock that slot's row first, then the task rows, so
//! they serialise per slot and never deadlock each other; a claim locks
//! only `ready` rows (`FOR UPDATE SKIP LOCKED`) and takes a fencing token,
//! which every later write of its attempts names. The owner invariant (at
//! most the slot's capacity, read off its row) holds because every
//! decision that makes an owner holds that row's lock.
//!
//! It decides nothing of its own: admission applies the controller's rules
//! (Queue, Replace, DropIfRunning, the bounds), takeover applies recovery's
//! `fate`; the node (`daemon::cluster`) runs what it claimed.
//!
//! | file | owns |
//! |---|---|
//! | `sql` | statements, errors told apart (a lost race, an unreachable database), retries, encodings |
//! | `schema` | the migrations, under an advisory lock |
//! | `lease` | nodes' leases, renewals, retirement, takeover |
//! | `admit` | admission in a transaction: the plugin kept, the slot locked and read, a batch of one |
//! | `place` | a decision applied to rows, for single and batched admission alike |
//! | `rules` | slot rules for every node, each slot's settings on its row, slots filled to capacity |
//! | `claim` | claims with fencing tokens, a claimed attempt's writes, cancels, a task's end |
//! | `reads` | the verbs' reads: finished tasks, references, `ps`, `slots` |
//! | `ship` | lines and events shipped for every node, retention |
//! | `blobs` | plugins by digest |
//! | `batch/` | batched writes: attempt starts, ends and admissions, one transaction per batch |
//! | `link` | how a node reaches the database: TLS, session timeouts, keepalives, connections of its own |
//! | `outage` | what a node says and how long it pauses while the database is away |
//! | `time` | delayed submissions admitted when due, schedules fired once |
//! | `debounce` | a debounced slot's one held submission, superseded by each newer one |
//! | `kv` | guests' key-value state: writes fenced by the attempt's token, limits, the `host kv` reads |
//! | `deployments` | named deployments for every node: their events, each appended after the newest its verb read |
//! | `namespaces` | namespaces for every node, what each uses, counted from the rows, and its submissions' rate |

/// SQL for how many attempts a task (aliased `t`) has started: a first
/// attempt's start is recorded in `taskhost_attempts` alone (the task's row
/// is not written again for it), so an unfinished task's count is the
/// greater of its row's and its newest attempt's.
macro_rules! attempts_started {
    () => {
        "CASE WHEN t.state IN ('running', 'stopping') THEN greatest(t.attempts, \
         (SELECT coalesce(max(a.attempt), 0) FROM taskhost_attempts a WHERE a.task_id = t.id)) \
         ELSE t.attempts END"
    };
}

mod admit;
pub(crate) mod batch;
mod blobs;
mod claim;
mod debounce;
pub(crate) mod deployments;
pub(crate) mod kv;
mod lease;
pub(crate) mod link;
pub(crate) mod namespaces;
pub(crate) mod outage;
mod place;
mod reads;
mod rules;
mod schema;
mod ship;
mod sql;
pub(crate) mod time;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::TaskId;

use crate::store::StoreError;
use crate::wire::protocol::SubmitRequest;
use batch::Writer;
use link::{Link, Session, Timeouts};

use crate::store::{Retryable, retry};
use admit::lock_slot_of;
pub(crate) use claim::ClaimShare;
use claim::{end_task, promote};
use sql::{
    all, db, decode, decode_request, encode, exec, id_of, ms, next_id, one, opt, pool_err, sql_id,
};

/// Notification channels.
pub(crate) const READY: &str = "taskhost_ready";

pub(crate) const STOP: &str = "taskhost_stop";

pub(crate) const FINISHED: &str = "taskhost_finished";

/// New events were shipped: the nodes' feeds read them now.
pub(crate) const EVENTS: &str = "taskhost_events";

/// A plugin was uploaded (its digest): every node fetches and compiles it
/// ahead of its tasks.
pub(crate) const PLUGINS: &str = "taskhost_plugins";

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
    /// This node's copy of the slot rules.
    rules: rules::Rules,
    /// The live nodes and this node's place among them (by id), as the
    /// last claim or lease renewal counted them: a rate's share.
    nodes: Arc<std::sync::atomic::AtomicU64>,
}

/// How the batched writes ask the node about new ready work.
pub(crate) struct NodeHooks {
    /// How many more tasks the node would claim now: new ready work
    /// beyond it is announced to the other nodes, the rest is this
    /// node's to claim.
    pub room: Box<dyn Fn() -> usize + Send + Sync>,
    /// Wakes the node's claims (after a commit that made work ready).
    pub wake: Box<dyn Fn() + Send + Sync>,
    /// The node's id in the database.
    pub id: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Holds up to this many of the node's room for tasks an admission
    /// claims at their insert; how many it holds.
    pub reserve: Box<dyn Fn(usize) -> usize + Send + Sync>,
    /// Hands the tasks an admission claimed to the node (their claims
    /// counted first), then frees the room held (the second argument).
    pub claimed: Box<dyn Fn(Vec<Claimed>, usize) + Send + Sync>,
    /// A commit that claimed tasks went unanswered: the node reads its
    /// claims back before it claims again.
    pub unsure: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.link.describe)
    }
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
    /// The capacity its plugin declares for its slot (`Some(None)`: none,
    /// so 1); None: not known here (a delayed one, a schedule's firing), and
    /// the slot keeps what its latest submission declared.
    pub declared: Option<Option<u32>>,
    /// Unfinished descendants of the submission's root at most (a spawned
    /// task's tree: `request.root`).
    pub max_descendants: usize,
    /// Held until this time (ms since the Unix epoch), within this bound of
    /// delayed submissions: it is recorded as delayed, not admitted.
    pub due: Option<(u64, usize)>,
    /// Whether the node that admits it may claim it in the same
    /// transaction (its namespace has no bound on running tasks).
    pub claim_here: bool,
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

impl Retryable for AdmitError {
    fn retryable(&self) -> bool {
        matches!(self, Self::Store(e) if e.retryable())
    }
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
    /// Its state (None: a word this build does not know).
    pub state: Option<TaskState>,
    /// Its name (its namespace's key).
    pub name: String,
}

/// What became of a task taken over from a dead node.
pub(crate) struct Settled {
    pub id: TaskId,
    pub name: String,
    pub slot: String,
    /// Recovery's words for it.
    pub why: String,
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
        .map_err(|e| StoreError::Failed(format!("PostgreSQL: cannot build the pool: {e}")))?;
    let pg = Pg {
        pool,
        link,
        lease: Arc::default(),
        notify,
        writer: Arc::default(),
        node: Arc::default(),
        rules: Arc::default(),
        nodes: Arc::new(std::sync::atomic::AtomicU64::new(1 << 32)),
    };
    let _ = pg.writer.set(Writer::start(&pg));
    pg.migrate().await.map_err(|e| {
        StoreError::Failed(format!(
            "{e} (is PostgreSQL running at `{url}`, and may this user create tables?)"
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

    /// Notes how many nodes are alive and how many of them have a smaller
    /// id than this one.
    pub(super) fn count_nodes(&self, live: i64, before: i64) {
        let live = live.clamp(1, i64::from(u32::MAX)) as u64;
        let before = before.clamp(0, live as i64 - 1) as u64;
        self.nodes
            .store(live << 32 | before, std::sync::atomic::Ordering::Relaxed);
    }

    /// The live nodes and this node's place among them (from 0).
    pub(super) fn nodes(&self) -> (u32, u32) {
        let both = self.nodes.load(std::sync::atomic::Ordering::Relaxed);
        ((both >> 32) as u32, both as u32)
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
    pub(crate) fn outage(&self) -> &outage::Outage {
        &self.link.outage
    }

    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_err)
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
}
