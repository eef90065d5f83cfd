//! Owns what the daemon keeps across a crash: every accepted submission,
//! its state (queued, running attempt N, stopping, finished), its final
//! report and log, and the next task id. Two backends behind one handle:
//! embedded SQLite (the default, a file under the state directory) and
//! memory (nothing survives; for tests and benchmarks).
//!
//! Writes go to one writer thread that owns the database connection and
//! commits whatever is ready together in one transaction (group commit):
//! a submission is acknowledged once its [`Ticket`] resolves, that is once
//! its transaction is on disk (`synchronous=FULL`). Writes are applied in
//! the order they were made, so the store's order of submissions is the
//! order the controller decided them in. Reads (finished tasks for `wait`,
//! `logs` and `ps --all`) use a second connection; WAL lets them run
//! beside the writer.
//!
//! The store decides nothing: the supervisor and controller keep their
//! in-process semantics, the store records what they decided, and
//! recovery rebuilds them from it at start.
//!
//! | file | owns |
//! |---|---|
//! | `sqlite/` | the SQLite backend: open, migrations, the writer thread, the reader |
//! | `postgres/` | cluster mode's database: admission, claims, fenced writes, leases, reads, batches, time, key-value state, the link and the outage |

pub(crate) mod postgres;
mod sqlite;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::Shared;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use taskhost_core::lifecycle::TaskState;
use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{TaskId, TaskReport};
use taskhost_runtime::Digest;

use super::protocol::{DeploymentEvent, NamespaceSettings, ScheduleSpec, SubmitRequest};
use crate::schedule::FireKind;
use taskhost_core::slot_settings::SlotSettings;

/// Which backend the daemon keeps its state in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// Nothing survives the process (tests, benchmarks).
    Memory,
    /// SQLite at this path (default: `<state dir>/taskhost.db`).
    Sqlite(PathBuf),
    /// A PostgreSQL database shared by the nodes of a cluster (a
    /// `postgres://` or `postgresql://` address).
    Postgres(String),
}

impl StoreSpec {
    /// Parses `memory`, `sqlite` (the default file under `state_dir`),
    /// `sqlite:PATH`, or a `postgres://…` address (cluster mode).
    pub fn parse(text: &str, state_dir: &Path) -> Result<Self, String> {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres(text.to_owned()));
        }
        match text {
            "memory" => Ok(Self::Memory),
            "sqlite" => Ok(Self::Sqlite(state_dir.join("taskhost.db"))),
            other => match other.strip_prefix("sqlite:") {
                Some(path) if !path.is_empty() => Ok(Self::Sqlite(PathBuf::from(path))),
                _ => Err(format!(
                    "unknown store `{other}`: use `sqlite` (the default, a file under the state \
                     directory), `sqlite:PATH`, `postgres://USER@HOST/DB` (cluster mode), or \
                     `memory` (nothing survives a restart)"
                )),
            },
        }
    }
}

/// How long finished tasks (their reports and logs) are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// At most this many finished tasks.
    pub max_finished: usize,
    /// None older than this.
    pub max_age: Duration,
    /// At most this many bytes of finished tasks' rows (request, report and
    /// log), newest kept first.
    pub max_bytes: u64,
    /// Idempotency keys older than this are forgotten.
    pub key_age: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_finished: super::config::DEFAULT_RETAIN_FINISHED,
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: super::config::DEFAULT_RETAIN_BYTES,
            key_age: super::config::DEFAULT_IDEMPOTENCY_RETENTION,
        }
    }
}

/// Why the store failed. Each kind says what trying again may do, and
/// says it in its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No connection to the database could be had: nothing was sent, so
    /// any work may be sent again.
    #[error("{0} (the database could not be reached)")]
    NoConnection(String),
    /// The database could not be reached in the middle of the work (a
    /// connection closed or timed out, a server shutting down or starting
    /// up): it may succeed later, and may have been done already.
    #[error("{0} (the database could not be reached)")]
    Unreachable(String),
    /// A concurrent transaction won (a deadlock or a serialisation
    /// failure): the transaction may run again as it is.
    #[error("{0} (a concurrent transaction won; retried)")]
    Lost(String),
    /// The store failed the work itself: a statement, a file, a row it
    /// cannot read.
    #[error("{0}")]
    Failed(String),
}

impl StoreError {
    /// Whether the database was away (the work may succeed later).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::NoConnection(_) | Self::Unreachable(_))
    }

    /// Whether nothing of the work reached the database.
    pub fn sent_nothing(&self) -> bool {
        matches!(self, Self::NoConnection(_))
    }
}

/// Work whose failure may be run again as it is (a transaction that lost a
/// race): [`retry`] does.
pub(crate) trait Retryable {
    /// Whether running the same work again may succeed.
    fn retryable(&self) -> bool;
}

impl Retryable for StoreError {
    fn retryable(&self) -> bool {
        matches!(self, Self::Lost(_))
    }
}

/// How many times [`retry`] runs work whose failure is retryable.
const RETRIES: usize = 8;

/// Runs `work` again while it fails retryably (a transaction that lost a
/// deadlock or serialisation race), at most [`RETRIES`] times in all; the
/// last failure is the answer.
pub(crate) async fn retry<T, E, F, Fut>(mut work: F) -> Result<T, E>
where
    E: Retryable,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut tries = 1;
    loop {
        match work().await {
            Err(e) if e.retryable() && tries < RETRIES => tries += 1,
            other => return other,
        }
    }
}

/// A write's commit: resolves once the transaction holding it is durable.
/// Clones wait for the same commit.
#[must_use = "a ticket says when the write is durable"]
#[derive(Clone)]
pub struct Ticket(Option<Shared<oneshot::Receiver<Result<(), StoreError>>>>);

impl Ticket {
    /// A ticket for nothing to wait for (the memory store).
    pub fn done() -> Self {
        Self(None)
    }

    /// Whether there is nothing to wait for.
    pub fn is_immediate(&self) -> bool {
        self.0.is_none()
    }

    /// Waits for the commit.
    pub async fn committed(self) -> Result<(), StoreError> {
        match self.0 {
            None => Ok(()),
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| Err(StoreError::Failed("the store stopped".into()))),
        }
    }
}

/// A submission as recorded when it is accepted.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Its id.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// The plugin's name.
    pub plugin: String,
    /// The submission, with name, slot and policy resolved.
    pub request: Arc<SubmitRequest>,
    /// Milliseconds since the Unix epoch.
    pub submitted_ms: u64,
    /// Recorded with its first attempt already started (it was admitted at
    /// once with a concurrency permit free): that attempt waits for this
    /// write's commit instead of a commit of its own.
    pub started: bool,
    /// Its idempotency key and the request's fingerprint, stored in the
    /// same commit.
    pub key: Option<(String, [u8; 32])>,
    /// The schedule firing that made it, recorded in the same commit.
    pub fired: Option<Firing>,
}

/// A schedule's firing, recorded with the task it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    /// The schedule.
    pub schedule: String,
    /// The due time it served, ms since the Unix epoch.
    pub due_ms: u64,
    /// The schedule's next firing from then on.
    pub next_ms: Option<u64>,
    /// Why it fired (a `Run` leaves the next firing as it was).
    pub kind: FireKind,
}

impl Firing {
    /// Whether it moves the schedule's next firing on.
    pub fn advances(&self) -> bool {
        self.kind != FireKind::Run
    }
}

/// A schedule as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSchedule {
    /// The schedule as it was added.
    pub spec: ScheduleSpec,
    /// Its plugin's name.
    pub plugin: String,
    /// Whether it is paused.
    pub paused: bool,
    /// Its next firing.
    pub next_ms: Option<u64>,
    /// Its last firing's due time.
    pub last_fire_ms: Option<u64>,
    /// The task its last firing made.
    pub last_task: Option<TaskId>,
    /// When it was added.
    pub created_ms: u64,
}

/// An unfinished task, for recovery.
#[derive(Debug, Clone)]
pub struct Unfinished {
    /// Its id.
    pub id: TaskId,
    /// The plugin's name.
    pub plugin: String,
    /// The submission, with name, slot and policy resolved.
    pub request: SubmitRequest,
    /// Where it stood.
    /// Where it stood when the store last heard of it: `Queued` (accepted,
    /// no attempt started: queued, or admitted and waiting), `Running` (an
    /// attempt had started; it ended without a result) or `Stopping` (a
    /// stop had been requested).
    pub state: TaskState,
    /// Attempts started.
    pub attempts: u32,
    /// When it was accepted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// The pause before its next attempt, when its last attempt had ended
    /// (state `Running`): the attempt was not interrupted.
    pub pause: Option<Pause>,
}

impl Unfinished {
    /// Where it stood, as the recovery rule reads it.
    pub fn lost(&self) -> taskhost_core::recovery::Lost {
        taskhost_core::recovery::Lost {
            state: self.state,
            attempts: self.attempts,
            pause: self.pause.map(|pause| {
                let delay = Duration::from_millis(pause.until_ms.saturating_sub(now_ms()));
                (delay, pause.failures)
            }),
            restart: self.request.restart,
            max_retries: self.request.max_retries,
            backoff: self.request.backoff.clone(),
        }
    }
}

/// A task's pause before its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// When the next attempt is due, ms since the Unix epoch.
    pub until_ms: u64,
    /// Consecutive failed attempts so far.
    pub failures: u32,
}

/// The tasks that use one plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginRefs {
    /// The plugin's name, as the tasks recorded it.
    pub name: Option<String>,
    /// Unfinished tasks (they need the plugin to run).
    pub unfinished: u64,
    /// Finished tasks still retained.
    pub finished: u64,
}

/// A finished task, as kept for `wait`, `logs` and `ps --all`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finished {
    /// The final report.
    pub report: TaskReport,
    /// The plugin's name.
    pub plugin: String,
    /// The guest's lines (the newest the daemon kept).
    pub log: Vec<LogLine>,
    /// When it was accepted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// When it finished, ms since the Unix epoch.
    pub finished_ms: u64,
    /// The task that spawned it, if one did (read back from the store;
    /// what is written comes from its request).
    pub parent: Option<u64>,
    /// Its attempts' records, a record file (empty: none); written, not
    /// read back with it ([`Store::records`] reads them).
    #[serde(default)]
    pub records: Vec<u8>,
}

impl Finished {
    /// A task that finished now.
    pub fn now(report: TaskReport, plugin: String, log: Vec<LogLine>, submitted_ms: u64) -> Self {
        Self {
            report,
            plugin,
            log,
            submitted_ms,
            finished_ms: now_ms(),
            parent: None,
            records: Vec::new(),
        }
    }

    /// With its attempts' records (a record file, or empty).
    pub fn with_records(mut self, records: Vec<u8>) -> Self {
        self.records = records;
        self
    }
}

/// One write, with whom to tell when it is durable.
enum Op {
    Submit(Box<NewTask>),
    AttemptStarted {
        id: TaskId,
        attempt: u32,
    },
    /// The attempt `attempts` has ended and the next is due after a pause.
    Pausing {
        id: TaskId,
        attempts: u32,
        pause: Pause,
    },
    Stopping {
        id: TaskId,
    },
    Finished(Box<Finished>),
    /// A schedule, whole (added, paused, resumed, or its next firing
    /// moved without a firing).
    Schedule(Box<StoredSchedule>),
    /// A schedule deleted.
    ScheduleRemoved(String),
    /// An operator's slot rule set (`settings`) or removed (`None`).
    SlotRule {
        pattern: String,
        settings: Option<SlotSettings>,
    },
    /// A deployment's deploy, rollback or removal.
    Deployment(DeploymentEvent),
    /// A namespace set (`settings`) or removed (`None`).
    Namespace {
        name: String,
        settings: Option<NamespaceSettings>,
    },
    /// A key-value entry set (`value`) or removed (`None`).
    Kv {
        scope: String,
        key: String,
        value: Option<Vec<u8>>,
    },
    /// Nothing: its ticket resolves once every earlier write is committed.
    Flush,
    /// As `Flush`, then the write-ahead log is folded into the database
    /// file (a graceful stop leaves one file behind).
    Checkpoint,
}

struct Write {
    op: Op,
    done: Option<oneshot::Sender<Result<(), StoreError>>>,
}

/// The daemon's store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// None for the memory backend.
    writer: Option<Mutex<mpsc::Sender<Write>>>,
    /// Writes sent and not yet applied.
    pending: Arc<AtomicUsize>,
    reader: Option<Mutex<sqlite::Reader>>,
    first_id: u64,
    describe: String,
    /// The schedules read at open, taken once by the daemon's start.
    schedules: Mutex<Vec<StoredSchedule>>,
    /// The key-value entries read at open, taken once by the daemon's start.
    kv: Mutex<Vec<(String, String, Vec<u8>)>>,
    /// The slot rules read at open, taken once by the daemon's start.
    slot_rules: Mutex<Vec<(String, SlotSettings)>>,
    /// The namespaces read at open, taken once likewise.
    namespaces: Mutex<Vec<(String, NamespaceSettings)>>,
    /// The deployments' events read at open, oldest first, taken once
    /// likewise.
    deployments: Mutex<Vec<DeploymentEvent>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.inner.describe)
    }
}

impl Store {
    /// Opens (creating or migrating) the store; returns it with the
    /// unfinished tasks to recover, in id order.
    pub fn open(
        spec: &StoreSpec,
        retention: Retention,
    ) -> Result<(Self, Vec<Unfinished>), StoreError> {
        match spec {
            // A cluster node keeps nothing of its own: it joins the shared
            // database instead (`cluster::Cluster::join`).
            StoreSpec::Postgres(_) => Err(StoreError::Failed(
                "a PostgreSQL store is a cluster's: the daemon joins it as a node".into(),
            )),
            StoreSpec::Memory => Ok((
                Self {
                    inner: Arc::new(Inner {
                        writer: None,
                        pending: Arc::default(),
                        reader: None,
                        first_id: 1,
                        describe: "memory (nothing survives a restart)".into(),
                        schedules: Mutex::default(),
                        kv: Mutex::default(),
                        slot_rules: Mutex::default(),
                        namespaces: Mutex::default(),
                        deployments: Mutex::default(),
                    }),
                },
                Vec::new(),
            )),
            StoreSpec::Sqlite(path) => {
                let sqlite::Opened {
                    writer,
                    reader,
                    next_id: first_id,
                    unfinished,
                    schedules,
                    kv,
                    slot_rules,
                    namespaces,
                    deployments,
                } = sqlite::open(path, retention)?;
                let (tx, rx) = mpsc::channel();
                let pending = Arc::new(AtomicUsize::new(0));
                let applied = Arc::clone(&pending);
                std::thread::Builder::new()
                    .name("taskhost-store".into())
                    .spawn(move || writer.run(rx, &applied))
                    .map_err(|e| {
                        StoreError::Failed(format!("cannot start the store's writer thread: {e}"))
                    })?;
                Ok((
                    Self {
                        inner: Arc::new(Inner {
                            writer: Some(Mutex::new(tx)),
                            pending,
                            reader: Some(Mutex::new(reader)),
                            first_id,
                            describe: format!("sqlite {}", path.display()),
                            schedules: Mutex::new(schedules),
                            kv: Mutex::new(kv),
                            slot_rules: Mutex::new(slot_rules),
                            namespaces: Mutex::new(namespaces),
                            deployments: Mutex::new(deployments),
                        }),
                    },
                    unfinished,
                ))
            }
        }
    }

    /// Whether the writer has nothing queued: a write sent now is committed
    /// in a transaction of its own, at once.
    pub fn is_idle(&self) -> bool {
        self.inner.pending.load(Ordering::Relaxed) == 0
    }

    /// Whether anything survives a restart.
    pub fn is_durable(&self) -> bool {
        self.inner.writer.is_some()
    }

    /// The first id this run may hand out (above every id ever stored).
    pub fn first_id(&self) -> u64 {
        self.inner.first_id
    }

    fn write(&self, op: Op, wait: bool) -> Ticket {
        let Some(writer) = &self.inner.writer else {
            return Ticket::done();
        };
        let (done, rx) = if wait {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        self.inner.pending.fetch_add(1, Ordering::Relaxed);
        let sent = writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(Write { op, done });
        match sent {
            Ok(()) => Ticket(rx.map(FutureExt::shared)),
            Err(_) => {
                let (tx, rx) = oneshot::channel();
                let _ = tx.send(Err(StoreError::Failed("the store's writer stopped".into())));
                Ticket(Some(rx.shared()))
            }
        }
    }

    /// Records a key-value write (`None`: the key removed); the guest hears
    /// of it once the ticket resolves.
    pub fn kv(&self, scope: String, key: String, value: Option<Vec<u8>>) -> Ticket {
        self.write(Op::Kv { scope, key, value }, true)
    }

    /// The key-value entries read at open, `(scope, key, value)`; taken
    /// once, by the daemon's start.
    pub fn take_kv(&self) -> Vec<(String, String, Vec<u8>)> {
        std::mem::take(&mut *self.inner.kv.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records an accepted submission; acknowledge it once the ticket
    /// resolves.
    pub fn submit(&self, task: NewTask) -> Ticket {
        self.write(Op::Submit(Box::new(task)), true)
    }

    /// Records that attempt `attempt` is starting; the attempt may run once
    /// the ticket resolves (so a task that must not run twice is known to
    /// have started before it does anything).
    pub fn attempt_started(&self, id: TaskId, attempt: u32) -> Ticket {
        self.write(Op::AttemptStarted { id, attempt }, true)
    }

    /// Records that attempt `attempts` ended and the next is due after a
    /// pause (not waited for: at worst the task is recovered as
    /// interrupted, with a fresh backoff).
    pub fn pausing(&self, id: TaskId, attempts: u32, pause: Pause) {
        let _ = self.write(
            Op::Pausing {
                id,
                attempts,
                pause,
            },
            false,
        );
    }

    /// Records that a stop was requested (not waited for: at worst the
    /// task is recovered as interrupted rather than canceled).
    pub fn stopping(&self, id: TaskId) {
        let _ = self.write(Op::Stopping { id }, false);
    }

    /// Records a final report and log; show the outcome to anyone once the
    /// ticket resolves.
    pub fn finished(&self, finished: Finished) -> Ticket {
        self.write(Op::Finished(Box::new(finished)), true)
    }

    /// Records a schedule whole (added, paused, resumed, moved on).
    pub fn schedule(&self, schedule: StoredSchedule) -> Ticket {
        self.write(Op::Schedule(Box::new(schedule)), true)
    }

    /// Deletes a schedule.
    pub fn schedule_removed(&self, name: &str) -> Ticket {
        self.write(Op::ScheduleRemoved(name.to_owned()), true)
    }

    /// The schedules the store held when it was opened (once; later calls
    /// get none).
    pub fn take_schedules(&self) -> Vec<StoredSchedule> {
        std::mem::take(
            &mut *self
                .inner
                .schedules
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Records an operator's slot rule (`settings`), or its removal.
    pub fn slot_rule(&self, pattern: &str, settings: Option<SlotSettings>) -> Ticket {
        let pattern = pattern.to_owned();
        self.write(Op::SlotRule { pattern, settings }, true)
    }

    /// The slot rules the store held when it was opened (once; later calls
    /// get none).
    pub fn take_slot_rules(&self) -> Vec<(String, SlotSettings)> {
        let mut rules = self
            .inner
            .slot_rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *rules)
    }

    /// Records a namespace (`settings`), or its removal.
    pub fn namespace(&self, name: &str, settings: Option<NamespaceSettings>) -> Ticket {
        let name = name.to_owned();
        self.write(Op::Namespace { name, settings }, true)
    }

    /// Records a deployment's event.
    pub fn deployment(&self, event: DeploymentEvent) -> Ticket {
        self.write(Op::Deployment(event), true)
    }

    /// The deployments' events the store held when it was opened, oldest
    /// first (once; later calls get none).
    pub fn take_deployments(&self) -> Vec<DeploymentEvent> {
        let mut events = self
            .inner
            .deployments
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *events)
    }

    /// The namespaces the store held when it was opened (once; later
    /// calls get none).
    pub fn take_namespaces(&self) -> Vec<(String, NamespaceSettings)> {
        let mut namespaces = self
            .inner
            .namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *namespaces)
    }

    /// Each slot's latest attempt start (ms since the epoch) at or after
    /// `since_ms` (none with the memory backend).
    pub fn last_starts(&self, since_ms: u64) -> Vec<(String, u64)> {
        let Some(reader) = self.inner.reader.as_ref() else {
            return Vec::new();
        };
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_starts(since_ms)
    }

    /// Resolves once every write made before it is committed.
    pub fn flush(&self) -> Ticket {
        self.write(Op::Flush, true)
    }

    /// As [`Store::flush`], and folds the write-ahead log into the database
    /// file: for the daemon's last moments (later writes still work).
    pub fn close(&self) -> Ticket {
        self.write(Op::Checkpoint, true)
    }

    /// The request (resolved) a task was stored with, while its row is
    /// kept.
    pub fn request_of(&self, id: TaskId) -> Option<SubmitRequest> {
        let reader = self.inner.reader.as_ref()?;
        let bytes = reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .request_of(id)?;
        SubmitRequest::decode_stored(&bytes).ok()
    }

    /// What an idempotency key made, if it was stored since `since_ms`.
    pub fn key(&self, key: &str, since_ms: u64) -> Option<(TaskId, [u8; 32], u64)> {
        let reader = self.inner.reader.as_ref()?;
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .key(key, since_ms)
    }

    /// A finished task by id.
    pub fn finished_task(&self, id: TaskId) -> Option<Finished> {
        let reader = self.inner.reader.as_ref()?;
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finished_by_id(id)
    }

    /// How each of these finished tasks ended, for those the store keeps.
    pub fn outcome_kinds(
        &self,
        ids: &[TaskId],
    ) -> HashMap<TaskId, taskhost_core::outcome::OutcomeKind> {
        let Some(reader) = self.inner.reader.as_ref() else {
            return HashMap::new();
        };
        let reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
        ids.iter()
            .filter_map(|id| {
                let finished = reader.finished_by_id(*id)?;
                Some((*id, finished.report.outcome.kind()))
            })
            .collect()
    }

    /// The records of a finished task's attempts (a record file), if the
    /// store keeps any.
    pub fn records(&self, id: TaskId) -> Option<Vec<u8>> {
        let reader = self.inner.reader.as_ref()?;
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .records(id)
    }

    /// The newest finished task that held `name`.
    pub fn finished_named(&self, name: &str) -> Option<Finished> {
        let reader = self.inner.reader.as_ref()?;
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finished_by_name(name)
    }

    /// Up to `limit` finished tasks with an id below `before`, newest
    /// first (empty for the memory backend).
    pub fn finished_before(&self, before: u64, limit: usize) -> Vec<Finished> {
        let Some(reader) = self.inner.reader.as_ref() else {
            return Vec::new();
        };
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finished_before(before, limit)
    }

    /// The newest finished tasks (at most `limit`), oldest first.
    pub fn finished_recent(&self, limit: usize) -> Vec<Finished> {
        let Some(reader) = self.inner.reader.as_ref() else {
            return Vec::new();
        };
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finished_recent(limit)
    }
}

impl Store {
    /// For each plugin the stored tasks use (`only` those of that
    /// namespace: `""` the default one's), how many are unfinished and how
    /// many finished (empty for the memory backend).
    pub fn plugin_refs(&self, only: Option<&str>) -> HashMap<Digest, PluginRefs> {
        let Some(reader) = self.inner.reader.as_ref() else {
            return HashMap::new();
        };
        reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .plugin_refs(only)
    }
}

pub use crate::schedule::now_ms;

/// The digest of a request's plugin as stored.
fn digest_bytes(digest: &Digest) -> &[u8] {
    &digest.0
}

/// The refusal of a key given with another request than its first.
pub(crate) fn key_conflict(key: &str, id: TaskId) -> String {
    format!(
        "idempotency key `{}` was first given with another request, which made task id {id}: \
         send that same request to get it, or use a new key for this one",
        key.escape_debug()
    )
}

/// The refusal of a spawn past `--max-descendants`.
pub(crate) fn too_many_descendants(root: u64, max: usize) -> String {
    format!(
        "the tree of task {root} already has {max} unfinished descendants, the most this \
         daemon allows (--max-descendants, max_descendants): wait for some to finish, or raise it"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The states the stores keep in their `state` columns are exactly the
    /// words of these states: the migrations' CHECK constraints say so.
    #[test]
    fn the_stores_keep_state_words() {
        for (file, sql) in [
            (
                "0001_tasks.sql",
                include_str!("../../migrations/0001_tasks.sql"),
            ),
            (
                "postgres/0001_cluster.sql",
                include_str!("../../migrations/postgres/0001_cluster.sql"),
            ),
        ] {
            let check = sql
                .lines()
                .find(|l| l.contains("state") && l.contains("CHECK"))
                .unwrap_or_else(|| panic!("{file} has a CHECK of its states"));
            let inside = &check[check.find("IN (").expect("IN (") + 4..];
            let inside = &inside[..inside.find(')').expect(")")];
            for word in inside.split(',') {
                let word = word.trim().trim_matches('\'');
                assert!(
                    TaskState::parse(word).is_some(),
                    "{file} keeps state `{word}`, which is no TaskState"
                );
            }
        }
    }
}
