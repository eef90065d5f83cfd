//! Owns the SQLite writer thread: one connection, whatever writes wait
//! when a transaction starts go into it (group commit), a batch that fails
//! is applied again one write at a time, and retention runs between
//! batches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::TaskId;

use super::counts::{Changes, Kept};
use super::err;
use crate::store::{NewTask, Op, Retention, StoreError, Write, digest_bytes, now_ms};

/// Most writes in one transaction.
const MAX_BATCH: usize = 4096;

/// How often retention runs (at most).
const PRUNE_EVERY: Duration = Duration::from_secs(5);

/// Finished rows retention deletes in one transaction at most.
const PRUNE_CHUNK: usize = 1024;

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
pub(in crate::store) struct Writer {
    conn: Connection,
    path: PathBuf,
    retention: Retention,
    /// Above every id written so far.
    next_id: u64,
    last_prune: Option<Instant>,
    /// Bytes of reports and logs written since the last prune: past an
    /// eighth of the byte bound, retention runs at once, so the store
    /// overshoots its bound by that much at most.
    finished_since_prune: u64,
    /// The finished rows kept and their bytes, as committed.
    kept: Kept,
}

impl Writer {
    /// The writer of the database `conn` at `path`, whose next task id is
    /// above `next_id`.
    pub(super) fn new(
        conn: Connection,
        path: PathBuf,
        retention: Retention,
        next_id: u64,
    ) -> rusqlite::Result<Self> {
        let kept = Kept::read(&conn)?;
        Ok(Self {
            conn,
            path,
            retention,
            next_id,
            last_prune: Some(Instant::now()),
            finished_since_prune: 0,
            kept,
        })
    }

    /// Applies writes until every sender is gone: whatever is waiting when
    /// a transaction starts goes into it.
    pub(in crate::store) fn run(mut self, rx: mpsc::Receiver<Write>, pending: &AtomicUsize) {
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
        let mut changes = Changes::default();
        for (i, write) in batch.iter().enumerate() {
            if folded[i] {
                continue;
            }
            if let Op::Submit(task) = &write.op {
                next_id = next_id.max(task.id.get() + 1);
            }
            self.finished_since_prune += apply_op(&tx, &write.op, started[i], &mut changes)?;
        }
        if next_id != self.next_id {
            tx.prepare_cached("UPDATE meta SET value = max(value, ?1) WHERE key = 'next_id'")?
                .execute(params![next_id as i64])?;
        }
        changes.write(&tx)?;
        tx.commit()?;
        self.next_id = next_id;
        changes.apply_to(&mut self.kept);
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

    /// Deletes finished tasks beyond the retention bounds: the oldest
    /// first (by when they finished), while they are too old or the rows
    /// kept are more than `max_finished` or hold more than `max_bytes`.
    /// It reads the oldest rows by the finished index and the counts the
    /// writer keeps, never every row.
    pub(super) fn prune(&mut self) -> rusqlite::Result<()> {
        let cutoff = now_ms().saturating_sub(self.retention.max_age.as_millis() as u64);
        let mut deleted = 0;
        loop {
            let tx = self.conn.transaction()?;
            let mut changes = Changes::default();
            let (mut rows, mut bytes) = (self.kept.rows, self.kept.bytes);
            let mut victims = Vec::new();
            {
                let mut oldest = tx.prepare_cached(
                    "SELECT id, finished_ms, digest, name, \
                     length(request) + coalesce(length(report), 0) + coalesce(length(log), 0) \
                     + coalesce(length(records), 0) \
                     FROM tasks WHERE state = 'finished' ORDER BY finished_ms, id LIMIT ?1",
                )?;
                let mut found = oldest.query(params![PRUNE_CHUNK as i64])?;
                while let Some(row) = found.next()? {
                    let finished_ms = row.get::<_, Option<i64>>(1)?.unwrap_or(0).max(0) as u64;
                    let over = finished_ms < cutoff
                        || rows > self.retention.max_finished as u64
                        || bytes > self.retention.max_bytes;
                    if !over {
                        break;
                    }
                    let size = row.get::<_, i64>(4)?.max(0) as u64;
                    let digest: Vec<u8> = row.get(2)?;
                    let name: String = row.get(3)?;
                    changes.deleted(&digest, &name, size);
                    rows = rows.saturating_sub(1);
                    bytes = bytes.saturating_sub(size);
                    victims.push(row.get::<_, i64>(0)?);
                }
            }
            if victims.is_empty() {
                break;
            }
            for id in &victims {
                tx.prepare_cached("DELETE FROM tasks WHERE id = ?1")?
                    .execute(params![id])?;
            }
            changes.write(&tx)?;
            tx.commit()?;
            changes.apply_to(&mut self.kept);
            deleted += victims.len();
            if victims.len() < PRUNE_CHUNK {
                break;
            }
        }
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
            | Op::Kv { .. }
            | Op::SlotRule { .. }
            | Op::Namespace { .. }
            | Op::Deployment(_) => {}
        }
    }
    (started, folded)
}

/// Applies one write in `tx`; `started`: the attempt a submission's row
/// starts at, folded in from a later write (0: as the submission says).
/// Returns the bytes of reports and logs it wrote.
fn apply_op(
    tx: &rusqlite::Transaction<'_>,
    op: &Op,
    started: u32,
    changes: &mut Changes,
) -> rusqlite::Result<u64> {
    match op {
        Op::Submit(task) => insert_task(tx, task, started, changes)?,
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
        Op::SlotRule { pattern, settings } => match settings {
            Some(settings) => {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO slot_rules (pattern, capacity, max_queue, \
                     debounce_ms, max_wait_ms, rate_starts, rate_per_ms, burst) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?
                .execute(params![
                    pattern,
                    settings.capacity,
                    settings.max_queue.map(|q| q as i64),
                    settings.debounce.map(|d| d.as_millis() as i64),
                    settings.max_wait.map(|d| d.as_millis() as i64),
                    settings.rate.map(|r| r.starts),
                    settings.rate.map(|r| r.per.as_millis() as i64),
                    settings.burst,
                ])?;
            }
            None => {
                tx.prepare_cached("DELETE FROM slot_rules WHERE pattern = ?1")?
                    .execute(params![pattern])?;
            }
        },
        Op::Namespace { name, settings } => match settings {
            Some(settings) => {
                let json = serde_json::to_string(settings).unwrap_or_default();
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO namespaces (name, settings) VALUES (?1, ?2)",
                )?
                .execute(params![name, json])?;
            }
            None => {
                tx.prepare_cached("DELETE FROM namespaces WHERE name = ?1")?
                    .execute(params![name])?;
            }
        },
        Op::Deployment(event) => {
            tx.prepare_cached(
                "INSERT INTO deployments (name, version, digest, at_ms, what) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                event.name,
                event.version,
                &event.digest.0[..],
                event.at_ms as i64,
                event.what.word(),
            ])?;
        }
        Op::ScheduleRemoved(name) => {
            tx.prepare_cached("DELETE FROM schedules WHERE name = ?1")?
                .execute(params![name])?;
        }
        Op::AttemptStarted { id, attempt } => {
            tx.prepare_cached(
                "UPDATE tasks SET state = 'running', attempts = max(attempts, ?2), \
                 resume_at_ms = NULL, started_ms = ?3 \
                 WHERE id = ?1 AND state IN ('queued', 'running')",
            )?
            .execute(params![id.get() as i64, attempt, now_ms() as i64])?;
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
            // A task ends once: a second end of it changes nothing.
            let mut update = tx.prepare_cached(
                "UPDATE tasks SET state = 'finished', attempts = ?2, finished_ms = ?3, \
                 report = ?4, log = ?5, records = ?6 WHERE id = ?1 AND state <> 'finished' \
                 RETURNING digest, name, length(request)",
            )?;
            let mut ended = update.query(params![
                finished.report.id.get() as i64,
                finished.report.attempts,
                finished.finished_ms as i64,
                report,
                log,
                (!finished.records.is_empty()).then_some(&finished.records)
            ])?;
            if let Some(row) = ended.next()? {
                let digest: Vec<u8> = row.get(0)?;
                let name: String = row.get(1)?;
                let request = row.get::<_, i64>(2)?.max(0) as u64;
                let written = (report.len() + log.len() + finished.records.len()) as u64;
                changes.finished(&digest, &name, request + written);
                return Ok(written);
            }
            return Ok(0);
        }
    }
    Ok(0)
}

/// Inserts a submission's row (as started at attempt `started`, if a later
/// write of the batch was folded into it), with its place in its tree, its
/// idempotency key and its schedule's firing.
fn insert_task(
    tx: &rusqlite::Transaction<'_>,
    task: &NewTask,
    started: u32,
    changes: &mut Changes,
) -> rusqlite::Result<()> {
    let attempts = started.max(u32::from(task.started));
    let request = postcard::to_allocvec(&*task.request)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    let state = if attempts > 0 {
        TaskState::Running
    } else {
        TaskState::Queued
    };
    tx.prepare_cached(
        "INSERT INTO tasks (id, name, slot, plugin, digest, request, state, attempts, \
         submitted_ms, started_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        task.id.get() as i64,
        task.name,
        task.slot,
        task.plugin,
        digest_bytes(&task.request.plugin),
        request,
        state.as_str(),
        attempts,
        task.submitted_ms as i64,
        (attempts > 0).then(|| now_ms() as i64),
    ])?;
    changes.submitted(digest_bytes(&task.request.plugin), &task.name, &task.plugin);
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
    Ok(())
}
