//! The SQLite backend: opening (with migrations and checks), the writer
//! thread's group commit, and the reads.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, params};

use crate::protocol::{ScheduleSpec, SubmitRequest};
use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::TaskId;
use taskhost_runtime::Digest;

use super::{
    Finished, Op, Pause, PluginRefs, Retention, StoreError, StoredSchedule, Unfinished, Write,
    digest_bytes, now_ms,
};

/// The migrations, in order; `PRAGMA user_version` counts those applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/0001_tasks.sql"),
    include_str!("../../migrations/0002_pauses.sql"),
    include_str!("../../migrations/0003_idempotency.sql"),
    include_str!("../../migrations/0004_schedules.sql"),
    include_str!("../../migrations/0005_kv.sql"),
    include_str!("../../migrations/0006_lineage.sql"),
];

/// The migration that added `parent` and `root`, filled from each row's
/// request when it runs.
const LINEAGE_MIGRATION: usize = 6;

/// Most writes in one transaction.
const MAX_BATCH: usize = 4096;

/// How often retention runs (at most).
const PRUNE_EVERY: Duration = Duration::from_secs(5);

fn err(path: &Path, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Failed(format!("the store `{}`: {what}: {e}", path.display()))
}

/// A write the database refused, with the fix when the disk is full.
fn write_failed(path: &Path, e: rusqlite::Error) -> StoreError {
    let full = e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull);
    let failed = err(path, "cannot write to it", e);
    if !full {
        return failed;
    }
    let dir = path.parent().unwrap_or(path);
    StoreError::Failed(format!(
        "{failed} (free space on the filesystem of `{}`: the daemon takes submissions again as \
         soon as there is room, and keeps retrying the outcomes it could not record)",
        dir.display()
    ))
}

fn connect(path: &Path, flags: OpenFlags) -> Result<Connection, StoreError> {
    let conn =
        Connection::open_with_flags(path, flags).map_err(|e| err(path, "cannot open it", e))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(|e| err(path, "cannot configure it", e))?;
    Ok(conn)
}

/// Opens the database: creates or migrates it, refuses one written by a
/// newer version or one that is damaged, and reads what recovery needs.
pub(super) fn open(path: &Path, retention: Retention) -> Result<Opened, StoreError> {
    check_size(path)?;
    let mut conn = connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let damaged = |e: rusqlite::Error| {
        StoreError::Failed(format!(
            "the store `{}` is not a usable SQLite database ({e}). Move it away to start with \
             an empty store (its tasks are then lost), or restore it from a backup.",
            path.display()
        ))
    };
    // Before anything is written: a file that is not a taskhost store is
    // refused as it is.
    let ours = check_ours(&conn, path).map_err(damaged)??;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(damaged)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(damaged)?;
    let check: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(damaged)?;
    if check != "ok" {
        return Err(StoreError::Failed(format!(
            "the store `{}` is damaged ({check}). Move it away to start with an empty store (its \
             tasks are then lost), or restore it from a backup.",
            path.display()
        )));
    }
    let version: usize = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(damaged)?;
    if version > MIGRATIONS.len() {
        return Err(StoreError::Failed(format!(
            "the store `{}` was written by a newer taskhost (schema {version}; this build knows \
             schema {}). Run the newer host, or point --state-dir elsewhere.",
            path.display(),
            MIGRATIONS.len()
        )));
    }
    if !ours {
        // A new store, or one an earlier taskhost made before it set an
        // application id.
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(|e| err(path, "cannot mark it as a taskhost store", e))?;
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn
            .transaction()
            .map_err(|e| err(path, "cannot migrate it", e))?;
        tx.execute_batch(sql)
            .map_err(|e| err(path, &format!("migration {} failed", i + 1), e))?;
        if i + 1 == LINEAGE_MIGRATION {
            fill_lineage(&tx).map_err(|e| err(path, "migration 6 failed", e))?;
        }
        tx.pragma_update(None, "user_version", i + 1)
            .map_err(|e| err(path, "cannot migrate it", e))?;
        tx.commit().map_err(|e| err(path, "cannot migrate it", e))?;
    }

    let next_id: u64 = conn
        .query_row(
            "SELECT max((SELECT value FROM meta WHERE key = 'next_id'), \
                        coalesce((SELECT max(id) + 1 FROM tasks), 1))",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| err(path, "cannot read it", e))? as u64;
    let unfinished = read_unfinished(&conn).map_err(|e| err(path, "cannot read it", e))?;
    let schedules = read_schedules(&conn).map_err(|e| err(path, "cannot read it", e))?;
    let kv = read_kv(&conn).map_err(|e| err(path, "cannot read it", e))?;
    let reader = Reader {
        conn: connect(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?,
    };
    let mut writer = Writer {
        conn,
        path: path.to_path_buf(),
        retention,
        next_id,
        last_prune: Some(Instant::now()),
        finished_since_prune: 0,
    };
    // Retention applies from the start (a lowered bound takes effect now).
    if let Err(e) = writer.prune() {
        tracing::warn!("store retention failed: {e}");
    }
    Ok(Opened {
        writer,
        reader,
        next_id,
        unfinished,
        schedules,
        kv,
    })
}

/// Every key-value entry, as `(scope, key, value)`.
fn read_kv(conn: &Connection) -> rusqlite::Result<Vec<(String, String, Vec<u8>)>> {
    let mut stmt = conn.prepare("SELECT scope, key, value FROM kv")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    rows.collect()
}

/// What opening the database gives: its writer and reader, the next task
/// id, and what recovery and the schedules need.
pub(super) struct Opened {
    pub writer: Writer,
    pub reader: Reader,
    pub next_id: u64,
    pub unfinished: Vec<Unfinished>,
    pub schedules: Vec<StoredSchedule>,
    /// Every key-value entry: `(scope, key, value)`.
    pub kv: Vec<(String, String, Vec<u8>)>,
}

fn read_schedules(conn: &Connection) -> rusqlite::Result<Vec<StoredSchedule>> {
    let mut stmt = conn.prepare(
        "SELECT name, spec, paused, next_ms, last_fire_ms, last_task, created_ms, plugin \
         FROM schedules ORDER BY name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Vec<u8>>(1)?,
            r.get::<_, bool>(2)?,
            r.get::<_, Option<i64>>(3)?,
            r.get::<_, Option<i64>>(4)?,
            r.get::<_, Option<i64>>(5)?,
            r.get::<_, i64>(6)?,
            r.get::<_, String>(7)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (name, spec, paused, next_ms, last_fire_ms, last_task, created_ms, plugin) = row?;
        let spec = match ScheduleSpec::decode_stored(&spec) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!("schedule `{name}` in the store cannot be read ({e}); skipping it");
                continue;
            }
        };
        out.push(StoredSchedule {
            spec,
            plugin,
            paused,
            next_ms: next_ms.map(|v| v.max(0) as u64),
            last_fire_ms: last_fire_ms.map(|v| v.max(0) as u64),
            last_task: last_task.map(|v| TaskId::from_u64(v.max(0) as u64)),
            created_ms: created_ms.max(0) as u64,
        });
    }
    Ok(out)
}

/// `PRAGMA application_id` of a taskhost store ("TSKH").
const APPLICATION_ID: i32 = 0x5453_4B48;

/// Whether the database is a taskhost store already marked as one (`true`),
/// or one to mark: empty, or made by an earlier taskhost (its tables and
/// schema version, no id yet). Anything else is another program's file:
/// an error that leaves it untouched.
fn check_ours(conn: &Connection, path: &Path) -> rusqlite::Result<Result<bool, StoreError>> {
    let id: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    if id == APPLICATION_ID {
        return Ok(Ok(true));
    }
    let version: usize = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let objects: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    let has = |table: &str| -> rusqlite::Result<bool> {
        conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
    };
    if id == 0 && (objects == 0 || (version >= 1 && has("tasks")? && has("meta")?)) {
        return Ok(Ok(false));
    }
    Ok(Err(StoreError::Failed(format!(
        "`{}` is not a taskhost store (SQLite application_id {id:#x}, user_version {version}, \
         {objects} schema objects), so it is left as it is. Give --state-dir (or --store \
         sqlite:PATH) a path of the daemon's own",
        path.display()
    ))))
}

/// Refuses a database file shorter than its header says it is (cut short by
/// a copy or a disk problem): SQLite would read the missing pages as an
/// empty database and the store's tasks would be lost without a word.
fn check_size(path: &Path) -> Result<(), StoreError> {
    let Ok(mut file) = std::fs::File::open(path) else {
        return Ok(()); // a new store, or one SQLite reports on
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Ok(());
    }
    let mut header = [0u8; 100];
    use std::io::Read;
    let damaged = |why: String| {
        StoreError::Failed(format!(
            "the store `{}` is damaged ({why}). Move it away to start with an empty store (its \
             tasks are then lost), or restore it from a backup.",
            path.display()
        ))
    };
    if file.read_exact(&mut header).is_err() {
        return Err(damaged(format!(
            "{len} bytes, shorter than a database header"
        )));
    }
    if &header[..16] != b"SQLite format 3\0" {
        return Ok(()); // not SQLite at all: opening it says so
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u64::from(n),
    };
    let pages = u64::from(u32::from_be_bytes([
        header[28], header[29], header[30], header[31],
    ]));
    // The page count is valid when the change counter matches the
    // "version valid for" number (every SQLite since 3.7.0 writes both).
    let valid = header[24..28] == header[92..96];
    if page_size >= 512 && (len % page_size != 0 || (valid && len < pages * page_size)) {
        return Err(damaged(format!(
            "the file has {len} bytes but its header counts {pages} pages of {page_size}"
        )));
    }
    Ok(())
}

fn read_unfinished(conn: &Connection) -> rusqlite::Result<Vec<Unfinished>> {
    let mut stmt = conn.prepare(
        "SELECT id, plugin, request, state, attempts, submitted_ms, resume_at_ms, failures \
         FROM tasks WHERE state <> 'finished' ORDER BY id",
    )?;
    let rows = stmt.query_map([], |r| {
        let request: Vec<u8> = r.get(2)?;
        let state: String = r.get(3)?;
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            request,
            state,
            r.get::<_, u32>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, Option<i64>>(6)?,
            r.get::<_, u32>(7)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, plugin, request, state, attempts, submitted_ms, resume_at_ms, failures) = row?;
        let id = TaskId::from_u64(id as u64);
        let request = match SubmitRequest::decode_stored(&request) {
            Ok(request) => request,
            Err(e) => {
                tracing::error!("task {id} in the store cannot be read ({e}); skipping it");
                continue;
            }
        };
        let state = match TaskState::parse(&state) {
            Some(state @ (TaskState::Running | TaskState::Stopping)) => state,
            _ => TaskState::Queued,
        };
        out.push(Unfinished {
            id,
            plugin,
            request,
            state,
            attempts,
            submitted_ms: submitted_ms as u64,
            pause: resume_at_ms.map(|at| Pause {
                until_ms: at as u64,
                failures,
            }),
        });
    }
    Ok(out)
}

/// How long the writer looks for the next write before it sleeps: a
/// commit's waiters usually answer with a write of their own (an attempt's
/// outcome after its submission) within this, and a thread woken from sleep
/// starts tens of microseconds late.
const LOOK_BEFORE_SLEEP: Duration = Duration::from_micros(200);

/// The next write: looked for (giving the processor away between looks)
/// for [`LOOK_BEFORE_SLEEP`], then waited for.
fn next_write(rx: &mpsc::Receiver<Write>) -> Result<Write, mpsc::RecvError> {
    let until = Instant::now() + LOOK_BEFORE_SLEEP;
    loop {
        match rx.try_recv() {
            Ok(write) => return Ok(write),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) if Instant::now() >= until => return rx.recv(),
            Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
}

/// The writer thread's side: one connection, one transaction per batch.
pub(super) struct Writer {
    conn: Connection,
    path: std::path::PathBuf,
    retention: Retention,
    /// Above every id written so far.
    next_id: u64,
    last_prune: Option<Instant>,
    /// Bytes of reports and logs written since the last prune: past an
    /// eighth of the byte bound, retention runs at once, so the store
    /// overshoots its bound by that much at most.
    finished_since_prune: u64,
}

impl Writer {
    /// Applies writes until every sender is gone: whatever is waiting when
    /// a transaction starts goes into it.
    pub(super) fn run(mut self, rx: mpsc::Receiver<Write>, pending: &AtomicUsize) {
        let mut checkpoint = false;
        while let Ok(first) = next_write(&rx) {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(write) => batch.push(write),
                    Err(_) => break,
                }
            }
            let applied = batch.len();
            if batch.iter().any(|w| matches!(w.op, Op::Checkpoint)) {
                // After this batch's commit (below, before anyone hears).
                checkpoint = true;
            }
            let started = Instant::now();
            let applied_batch = self.apply(&batch);
            taskhost_core::stats::STORE_COMMITS.observe(started.elapsed());
            match applied_batch {
                Ok(()) => {
                    if std::mem::take(&mut checkpoint) {
                        self.checkpoint();
                    }
                    for write in batch {
                        if let Some(done) = write.done {
                            let _ = done.send(Ok(()));
                        }
                    }
                }
                Err(e) => {
                    // Find the writes that fail on their own; the others
                    // still commit.
                    tracing::warn!(
                        "a store batch of {} failed ({e}); retrying one by one",
                        batch.len()
                    );
                    for write in batch {
                        let result = self
                            .apply(std::slice::from_ref(&write))
                            .map_err(|e| write_failed(&self.path, e));
                        if let Err(e) = &result {
                            tracing::error!("{e}");
                        }
                        if let Some(done) = write.done {
                            let _ = done.send(result);
                        }
                    }
                }
            }
            pending.fetch_sub(applied, Ordering::Relaxed);
            if self.last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY)
                || self.finished_since_prune > self.retention.max_bytes / 8
            {
                self.last_prune = Some(Instant::now());
                self.finished_since_prune = 0;
                if let Err(e) = self.prune() {
                    tracing::warn!("store retention failed: {e}");
                }
            }
        }
    }

    fn apply(&mut self, batch: &[Write]) -> rusqlite::Result<()> {
        let (started, folded) = fold_starts(batch);
        let tx = self.conn.transaction()?;
        let mut next_id = self.next_id;
        for (i, write) in batch.iter().enumerate() {
            if folded[i] {
                continue;
            }
            match &write.op {
                Op::Submit(task) => {
                    let attempts = started[i].max(u32::from(task.started));
                    let request = postcard::to_allocvec(&*task.request)
                        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                    tx.prepare_cached(
                        "INSERT INTO tasks (id, name, slot, plugin, digest, request, state, attempts, \
                         submitted_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )?
                    .execute(params![
                        task.id.get() as i64,
                        task.name,
                        task.slot,
                        task.plugin,
                        digest_bytes(&task.request.plugin),
                        request,
                        if attempts > 0 { "running" } else { "queued" },
                        attempts,
                        task.submitted_ms as i64
                    ])?;
                    // A child's place in its tree: its own statement, so
                    // that the rows nobody spawned cost what they did.
                    if let Some(parent) = task.request.parent {
                        tx.prepare_cached("UPDATE tasks SET parent = ?2, root = ?3 WHERE id = ?1")?
                            .execute(params![
                                task.id.get() as i64,
                                parent as i64,
                                task.request.root.map(|r| r as i64),
                            ])?;
                    }
                    if let Some((key, fingerprint)) = &task.key {
                        tx.prepare_cached(
                            "INSERT OR REPLACE INTO idempotency (key, task_id, fingerprint, \
                             created_ms) VALUES (?1, ?2, ?3, ?4)",
                        )?
                        .execute(params![
                            key,
                            task.id.get() as i64,
                            &fingerprint[..],
                            task.submitted_ms as i64
                        ])?;
                    }
                    if let Some(fired) = &task.fired {
                        tx.prepare_cached(
                            "UPDATE schedules SET last_fire_ms = ?2, last_task = ?3, \
                             next_ms = CASE WHEN ?4 THEN ?5 ELSE next_ms END WHERE name = ?1",
                        )?
                        .execute(params![
                            fired.schedule,
                            fired.due_ms as i64,
                            task.id.get() as i64,
                            fired.advances(),
                            fired.next_ms.map(|v| v as i64)
                        ])?;
                    }
                    next_id = next_id.max(task.id.get() + 1);
                }
                Op::Schedule(schedule) => {
                    let spec = postcard::to_allocvec(&schedule.spec)
                        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO schedules (name, spec, paused, next_ms, \
                         last_fire_ms, last_task, created_ms, plugin) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )?
                    .execute(params![
                        schedule.spec.name,
                        spec,
                        schedule.paused,
                        schedule.next_ms.map(|v| v as i64),
                        schedule.last_fire_ms.map(|v| v as i64),
                        schedule.last_task.map(|id| id.get() as i64),
                        schedule.created_ms as i64,
                        schedule.plugin
                    ])?;
                }
                Op::Kv { scope, key, value } => match value {
                    Some(value) => {
                        tx.prepare_cached(
                            "INSERT OR REPLACE INTO kv (scope, key, value) VALUES (?1, ?2, ?3)",
                        )?
                        .execute(params![scope, key, value])?;
                    }
                    None => {
                        tx.prepare_cached("DELETE FROM kv WHERE scope = ?1 AND key = ?2")?
                            .execute(params![scope, key])?;
                    }
                },
                Op::ScheduleRemoved(name) => {
                    tx.prepare_cached("DELETE FROM schedules WHERE name = ?1")?
                        .execute(params![name])?;
                }
                Op::AttemptStarted { id, attempt } => {
                    tx.prepare_cached(
                        "UPDATE tasks SET state = 'running', attempts = max(attempts, ?2), \
                         resume_at_ms = NULL WHERE id = ?1 AND state IN ('queued', 'running')",
                    )?
                    .execute(params![id.get() as i64, attempt])?;
                }
                Op::Pausing {
                    id,
                    attempts,
                    pause,
                } => {
                    tx.prepare_cached(
                        "UPDATE tasks SET resume_at_ms = ?3, failures = ?4 \
                         WHERE id = ?1 AND state = 'running' AND attempts = ?2",
                    )?
                    .execute(params![
                        id.get() as i64,
                        attempts,
                        pause.until_ms as i64,
                        pause.failures
                    ])?;
                }
                Op::Stopping { id } => {
                    tx.prepare_cached(
                        "UPDATE tasks SET state = 'stopping' WHERE id = ?1 AND state <> 'finished'",
                    )?
                    .execute(params![id.get() as i64])?;
                }
                Op::Flush | Op::Checkpoint => {}
                Op::Finished(finished) => {
                    let report = postcard::to_allocvec(&finished.report)
                        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                    let log = postcard::to_allocvec(&finished.log)
                        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
                    self.finished_since_prune += (report.len() + log.len()) as u64;
                    tx.prepare_cached(
                        "UPDATE tasks SET state = 'finished', attempts = ?2, finished_ms = ?3, \
                         report = ?4, log = ?5 WHERE id = ?1",
                    )?
                    .execute(params![
                        finished.report.id.get() as i64,
                        finished.report.attempts,
                        finished.finished_ms as i64,
                        report,
                        log
                    ])?;
                }
            }
        }
        if next_id != self.next_id {
            tx.prepare_cached("UPDATE meta SET value = max(value, ?1) WHERE key = 'next_id'")?
                .execute(params![next_id as i64])?;
        }
        tx.commit()?;
        self.next_id = next_id;
        Ok(())
    }

    /// Folds the write-ahead log into the database file and empties it.
    fn checkpoint(&mut self) {
        let result = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            });
        match result {
            Ok(0) => {}
            Ok(_) => tracing::debug!("the store's checkpoint was blocked by a reader"),
            Err(e) => tracing::warn!("the store's checkpoint failed: {e}"),
        }
    }

    /// Deletes finished tasks beyond the retention bounds.
    fn prune(&mut self) -> rusqlite::Result<()> {
        let cutoff = now_ms().saturating_sub(self.retention.max_age.as_millis() as u64);
        // Too old, beyond the newest `max_finished`, or beyond the newest
        // rows whose sizes add up to `max_bytes`.
        let deleted = self.conn.execute(
            "DELETE FROM tasks WHERE state = 'finished' AND (finished_ms < ?1 OR id IN \
             (SELECT id FROM (SELECT id, \
                row_number() OVER newest AS n, \
                sum(length(request) + coalesce(length(report), 0) + coalesce(length(log), 0)) \
                  OVER newest AS bytes \
              FROM tasks WHERE state = 'finished' \
              WINDOW newest AS (ORDER BY finished_ms DESC, id DESC)) \
              WHERE n > ?2 OR bytes > ?3))",
            params![
                cutoff as i64,
                self.retention.max_finished as i64,
                i64::try_from(self.retention.max_bytes).unwrap_or(i64::MAX)
            ],
        )?;
        if deleted > 0 {
            tracing::debug!(path = %self.path.display(), deleted, "store retention");
        }
        let key_cutoff = now_ms().saturating_sub(self.retention.key_age.as_millis() as u64);
        self.conn.execute(
            "DELETE FROM idempotency WHERE created_ms < ?1",
            params![key_cutoff as i64],
        )?;
        Ok(())
    }
}

/// Where a batch records a submission and, later in the same batch, the
/// start of its attempt with no other write for that task between them,
/// the row is inserted as started (one statement fewer per task under
/// a stream of submissions). Returns, per write, the attempt a submission's
/// row starts at (0: as the submission says) and whether a write is folded
/// into an earlier one.
fn fold_starts(batch: &[Write]) -> (Vec<u32>, Vec<bool>) {
    let mut started = vec![0u32; batch.len()];
    let mut folded = vec![false; batch.len()];
    // Submissions in this batch that later writes may still fold into.
    let mut open: HashMap<TaskId, usize, foldhash::fast::RandomState> = HashMap::default();
    for (i, write) in batch.iter().enumerate() {
        match &write.op {
            Op::Submit(task) => {
                open.insert(task.id, i);
            }
            Op::AttemptStarted { id, attempt } => {
                if let Some(&at) = open.get(id) {
                    started[at] = started[at].max(*attempt);
                    folded[i] = true;
                }
            }
            Op::Pausing { id, .. } | Op::Stopping { id } => {
                open.remove(id);
            }
            Op::Finished(finished) => {
                open.remove(&finished.report.id);
            }
            Op::Flush
            | Op::Checkpoint
            | Op::Schedule(_)
            | Op::ScheduleRemoved(_)
            | Op::Kv { .. } => {}
        }
    }
    (started, folded)
}

/// The read side: finished tasks.
pub(super) struct Reader {
    conn: Connection,
}

/// The columns every read of finished tasks selects, in this order.
type FinishedRow = (String, Vec<u8>, Option<Vec<u8>>, i64, i64, Option<i64>);

fn finished_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FinishedRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

/// Fills `parent` and `root` of the rows stored before the columns were
/// (from their requests; rows nobody spawned keep NULL).
fn fill_lineage(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let mut found = Vec::new();
    {
        let mut stmt = tx.prepare("SELECT id, request FROM tasks")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let id: i64 = row.get(0)?;
            let request: Vec<u8> = row.get(1)?;
            if let Ok(request) = SubmitRequest::decode_stored(&request)
                && let Some(parent) = request.parent
            {
                let root = request.root.unwrap_or(parent);
                found.push((id, parent as i64, root as i64));
            }
        }
    }
    let mut set = tx.prepare("UPDATE tasks SET parent = ?2, root = ?3 WHERE id = ?1")?;
    for (id, parent, root) in found {
        set.execute(params![id, parent, root])?;
    }
    Ok(())
}

impl Reader {
    /// The finished tasks `sql` selects (its columns as [`FinishedRow`]).
    fn finished(&self, sql: &str, param: &dyn rusqlite::ToSql) -> Vec<Finished> {
        let rows = self.conn.prepare_cached(sql).and_then(|mut stmt| {
            stmt.query_map([param], finished_row)?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
        match rows {
            Ok(rows) => rows.into_iter().filter_map(decode_finished).collect(),
            Err(e) => {
                tracing::warn!("cannot read the store: {e}");
                Vec::new()
            }
        }
    }

    /// The request a task was stored with.
    pub(super) fn request_of(&self, id: TaskId) -> Option<Vec<u8>> {
        self.conn
            .prepare_cached("SELECT request FROM tasks WHERE id = ?1")
            .and_then(|mut stmt| stmt.query_row(params![id.get() as i64], |r| r.get(0)))
            .ok()
    }

    /// What an idempotency key made, if stored since `since_ms`.
    pub(super) fn key(&self, key: &str, since_ms: u64) -> Option<(TaskId, [u8; 32], u64)> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT task_id, fingerprint, created_ms FROM idempotency \
             WHERE key = ?1 AND created_ms >= ?2",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![key, since_ms as i64], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
            });
        match row {
            Ok((id, fingerprint, created)) => Some((
                TaskId::from_u64(id as u64),
                fingerprint.try_into().ok()?,
                created as u64,
            )),
            Err(rusqlite::Error::QueryReturnedNoRows) => None,
            Err(e) => {
                tracing::warn!("cannot read the store's idempotency keys: {e}");
                None
            }
        }
    }

    pub(super) fn finished_by_id(&self, id: TaskId) -> Option<Finished> {
        self.finished(
            "SELECT plugin, report, log, submitted_ms, finished_ms, parent FROM tasks \
             WHERE id = ?1 AND state = 'finished'",
            &(id.get() as i64),
        )
        .pop()
    }

    pub(super) fn finished_by_name(&self, name: &str) -> Option<Finished> {
        self.finished(
            "SELECT plugin, report, log, submitted_ms, finished_ms, parent FROM tasks \
             WHERE name = ?1 AND state = 'finished' ORDER BY id DESC LIMIT 1",
            &name,
        )
        .pop()
    }

    /// The newest finished tasks (without their logs), oldest first.
    pub(super) fn plugin_refs(&self) -> HashMap<Digest, PluginRefs> {
        let read = || -> rusqlite::Result<HashMap<Digest, PluginRefs>> {
            let mut stmt = self.conn.prepare_cached(
                "SELECT digest, max(plugin), sum(state <> 'finished'), sum(state = 'finished') \
                 FROM tasks GROUP BY digest",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?;
            let mut refs = HashMap::new();
            for row in rows {
                let (digest, name, unfinished, finished) = row?;
                let Ok(digest) = <[u8; 32]>::try_from(digest.as_slice()) else {
                    continue;
                };
                refs.insert(
                    Digest(digest),
                    PluginRefs {
                        name,
                        unfinished: unfinished as u64,
                        finished: finished as u64,
                    },
                );
            }
            Ok(refs)
        };
        read().unwrap_or_else(|e| {
            tracing::warn!("cannot read which plugins the store's tasks use: {e}");
            HashMap::new()
        })
    }

    pub(super) fn finished_recent(&self, limit: usize) -> Vec<Finished> {
        let mut out = self.finished(
            "SELECT plugin, report, NULL, submitted_ms, finished_ms, parent FROM tasks \
             WHERE state = 'finished' ORDER BY finished_ms DESC, id DESC LIMIT ?1",
            &(limit as i64),
        );
        out.reverse();
        out
    }
}

fn decode_finished(
    (plugin, report, log, submitted_ms, finished_ms, parent): FinishedRow,
) -> Option<Finished> {
    let report = postcard::from_bytes(&report)
        .map_err(|e| tracing::warn!("a stored report cannot be read: {e}"))
        .ok()?;
    let log = log
        .and_then(|l| postcard::from_bytes(&l).ok())
        .unwrap_or_default();
    Some(Finished {
        report,
        plugin,
        log,
        submitted_ms: submitted_ms as u64,
        finished_ms: finished_ms as u64,
        parent: parent.map(|p| p as u64),
    })
}
