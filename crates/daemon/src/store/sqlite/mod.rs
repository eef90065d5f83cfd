//! The SQLite backend: opening (with migrations and checks) and what
//! recovery reads at start; the writer thread's group commit and the reads
//! are its files.
//!
//! | file | owns |
//! |---|---|
//! | `writer` | the writer thread: one transaction per batch of writes, retention |
//! | `reader` | the reads of finished tasks, idempotency keys and plugins' users |
//! | `counts` | the counts the writer keeps as rows change: finished tasks and their bytes, plugins' users |

mod counts;
mod reader;
mod writer;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, params};

use crate::protocol::{DeploymentEvent, EventWhat, NamespaceSettings, ScheduleSpec, SubmitRequest};
use taskhost_core::lifecycle::TaskState;
use taskhost_core::slot_settings::{Rate, SlotSettings};
use taskhost_core::supervisor::TaskId;

use super::{Pause, Retention, StoreError, StoredSchedule, Unfinished};
pub(super) use reader::Reader;
pub(super) use writer::Writer;

/// The migrations, in order; `PRAGMA user_version` counts those applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/0001_tasks.sql"),
    include_str!("../../../migrations/0002_pauses.sql"),
    include_str!("../../../migrations/0003_idempotency.sql"),
    include_str!("../../../migrations/0004_schedules.sql"),
    include_str!("../../../migrations/0005_kv.sql"),
    include_str!("../../../migrations/0006_lineage.sql"),
    include_str!("../../../migrations/0007_slot_rules.sql"),
    include_str!("../../../migrations/0008_slot_debounce.sql"),
    include_str!("../../../migrations/0009_slot_rate.sql"),
    include_str!("../../../migrations/0010_last_start.sql"),
    include_str!("../../../migrations/0011_namespaces.sql"),
    include_str!("../../../migrations/0012_deployments.sql"),
    include_str!("../../../migrations/0013_counts.sql"),
    include_str!("../../../migrations/0014_records.sql"),
];

/// The migration that added `parent` and `root`, filled from each row's
/// request when it runs.
const LINEAGE_MIGRATION: usize = 6;

fn err(path: &Path, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Failed(format!("the store `{}`: {what}: {e}", path.display()))
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
    if stored_bytes(path) <= CHECK_AT_START {
        if let Some(check) = quick_check(&conn).map_err(damaged)? {
            return Err(StoreError::Failed(format!(
                "the store `{}` is damaged ({check}). Move it away to start with an empty store \
                 (its tasks are then lost), or restore it from a backup.",
                path.display()
            )));
        }
    } else {
        check_in_background(path);
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
    let slot_rules = read_slot_rules(&conn).map_err(|e| err(path, "cannot read it", e))?;
    let namespaces = read_namespaces(&conn).map_err(|e| err(path, "cannot read it", e))?;
    let deployments = read_deployments(&conn).map_err(|e| err(path, "cannot read it", e))?;
    let reader = Reader::new(connect(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?);
    let mut writer = Writer::new(conn, path.to_path_buf(), retention, next_id)
        .map_err(|e| err(path, "cannot read it", e))?;
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
        slot_rules,
        namespaces,
        deployments,
    })
}

/// The deployments' events, oldest first; one a newer version wrote that
/// this one cannot read is left out, said in the log.
fn read_deployments(conn: &Connection) -> rusqlite::Result<Vec<DeploymentEvent>> {
    let mut stmt =
        conn.prepare("SELECT name, version, digest, at_ms, what FROM deployments ORDER BY seq")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Vec<u8>>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (name, version, digest, at_ms, what) = row?;
        let what = match what.as_str() {
            "deploy" => EventWhat::Deploy,
            "rollback" => EventWhat::Rollback,
            "remove" => EventWhat::Remove,
            other => {
                tracing::warn!("a deployment event of `{name}` is left out: `{other}` is unknown");
                continue;
            }
        };
        let Ok(digest) = <[u8; 32]>::try_from(digest.as_slice()) else {
            tracing::warn!("a deployment event of `{name}` is left out: its digest is damaged");
            continue;
        };
        out.push(DeploymentEvent {
            name,
            version,
            digest: taskhost_runtime::Digest(digest),
            at_ms: at_ms as u64,
            what,
        });
    }
    Ok(out)
}

/// The namespaces; one a newer version wrote that this one cannot read is
/// left out, said in the log.
fn read_namespaces(conn: &Connection) -> rusqlite::Result<Vec<(String, NamespaceSettings)>> {
    let mut stmt = conn.prepare("SELECT name, settings FROM namespaces ORDER BY name")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (name, json) = row?;
        match serde_json::from_str(&json) {
            Ok(settings) => out.push((name, settings)),
            Err(e) => {
                tracing::warn!("namespace `{name}` is left out: its settings do not read: {e}")
            }
        }
    }
    Ok(out)
}

/// The operator's slot rules; one a newer version wrote that this one
/// cannot hold is left out, said in the log.
fn read_slot_rules(conn: &Connection) -> rusqlite::Result<Vec<(String, SlotSettings)>> {
    let mut stmt = conn.prepare(
        "SELECT pattern, capacity, max_queue, debounce_ms, max_wait_ms, rate_starts, \
         rate_per_ms, burst FROM slot_rules",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<i64>>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, Option<i64>>(3)?,
            r.get::<_, Option<i64>>(4)?,
            (
                r.get::<_, Option<i64>>(5)?,
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
            ),
        ))
    })?;
    let millis = |v: Option<i64>| v.map(|ms| Duration::from_millis(ms.max(0) as u64));
    let mut out = Vec::new();
    for row in rows {
        let (pattern, capacity, max_queue, debounce, max_wait, (starts, per, burst)) = row?;
        let rate = starts.zip(millis(per)).map(|(starts, per)| Rate {
            starts: u32::try_from(starts).unwrap_or(0),
            per,
        });
        let settings = SlotSettings {
            capacity: capacity.and_then(|c| u32::try_from(c).ok()),
            max_queue: max_queue.and_then(|q| usize::try_from(q).ok()),
            debounce: millis(debounce),
            max_wait: millis(max_wait),
            rate,
            burst: burst.and_then(|b| u32::try_from(b).ok()),
        };
        match settings.check() {
            Ok(()) => out.push((pattern, settings)),
            Err(e) => {
                tracing::error!(
                    "slot rule `{pattern}` in the store cannot be used ({e}); skipping it"
                )
            }
        }
    }
    Ok(out)
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
    /// The operator's slot rules.
    pub slot_rules: Vec<(String, SlotSettings)>,
    /// The namespaces.
    pub namespaces: Vec<(String, NamespaceSettings)>,
    /// The deployments' events, oldest first.
    pub deployments: Vec<DeploymentEvent>,
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

/// The largest store (database and write-ahead log) checked in full
/// before the daemon starts: the check reads every page (about 1.5 s for
/// 360 MiB here), so a larger store, a long history, is checked after the
/// start instead, beside the work.
const CHECK_AT_START: u64 = 64 << 20;

/// The bytes of the database at `path` and its write-ahead log.
fn stored_bytes(path: &Path) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    len(path) + len(Path::new(&wal))
}

/// SQLite's check of every page and index: `None` when it is sound, else
/// what it found first.
fn quick_check(conn: &Connection) -> rusqlite::Result<Option<String>> {
    let check: String = conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
    Ok((check != "ok").then_some(check))
}

/// Runs [`quick_check`] on a connection of its own in a thread of its own,
/// and says what it found as an error in the daemon's log: the store is
/// in use by then, so the daemon goes on (a read or write of a damaged
/// page fails, naming the store).
fn check_in_background(path: &Path) {
    let path = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("taskhost-store-check".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            let found = connect(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| e.to_string())
                .and_then(|conn| quick_check(&conn).map_err(|e| e.to_string()));
            match found {
                Ok(None) => tracing::debug!(
                    path = %path.display(),
                    took_ms = started.elapsed().as_millis() as u64,
                    "the store's pages are sound"
                ),
                Ok(Some(why)) | Err(why) => tracing::error!(
                    "the store `{}` is damaged ({why}). Stop the daemon, then move the store away \
                     to start with an empty one (its tasks are then lost), or restore it from a \
                     backup.",
                    path.display()
                ),
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot check the store's pages: {e}");
    }
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
