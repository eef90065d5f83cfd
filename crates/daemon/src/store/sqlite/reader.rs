//! Owns the SQLite store's reads (a connection of their own, beside the
//! writer's: WAL lets them run at once): finished tasks, a task's request,
//! idempotency keys and which plugins the tasks use.

use std::collections::HashMap;

use rusqlite::{Connection, params};

use taskhost_core::supervisor::TaskId;
use taskhost_runtime::Digest;

use crate::store::{Finished, PluginRefs};

/// The read side: finished tasks.
pub(in crate::store) struct Reader {
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

impl Reader {
    pub(super) fn new(conn: Connection) -> Self {
        Self { conn }
    }

    /// The finished tasks `sql` selects (its columns as [`FinishedRow`]).
    fn finished(&self, sql: &str, params: &[&dyn rusqlite::ToSql]) -> Vec<Finished> {
        let rows = self.conn.prepare_cached(sql).and_then(|mut stmt| {
            stmt.query_map(params, finished_row)?
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
    pub(in crate::store) fn request_of(&self, id: TaskId) -> Option<Vec<u8>> {
        self.conn
            .prepare_cached("SELECT request FROM tasks WHERE id = ?1")
            .and_then(|mut stmt| stmt.query_row(params![id.get() as i64], |r| r.get(0)))
            .ok()
    }

    /// What an idempotency key made, if stored since `since_ms`.
    pub(in crate::store) fn key(
        &self,
        key: &str,
        since_ms: u64,
    ) -> Option<(TaskId, [u8; 32], u64)> {
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

    pub(in crate::store) fn finished_by_id(&self, id: TaskId) -> Option<Finished> {
        self.finished(
            "SELECT plugin, report, log, submitted_ms, finished_ms, parent FROM tasks \
             WHERE id = ?1 AND state = 'finished'",
            &[&(id.get() as i64)],
        )
        .pop()
    }

    pub(in crate::store) fn records(&self, id: TaskId) -> Option<Vec<u8>> {
        let found = self
            .conn
            .prepare_cached("SELECT records FROM tasks WHERE id = ?1 AND state = 'finished'")
            .and_then(|mut s| s.query_row([id.get() as i64], |r| r.get::<_, Option<Vec<u8>>>(0)));
        match found {
            Ok(records) => records.filter(|r| !r.is_empty()),
            Err(rusqlite::Error::QueryReturnedNoRows) => None,
            Err(e) => {
                tracing::warn!("cannot read a task's records: {e}");
                None
            }
        }
    }

    pub(in crate::store) fn finished_by_name(&self, name: &str) -> Option<Finished> {
        self.finished(
            "SELECT plugin, report, log, submitted_ms, finished_ms, parent FROM tasks \
             WHERE name = ?1 AND state = 'finished' ORDER BY id DESC LIMIT 1",
            &[&name],
        )
        .pop()
    }

    /// Each slot's latest attempt start (ms since the epoch) at or after
    /// `since_ms`: from the unfinished tasks and those finished since, each
    /// read by its index (a task started then finished then too).
    pub(in crate::store) fn last_starts(&self, since_ms: u64) -> Vec<(String, u64)> {
        let read = || -> rusqlite::Result<Vec<(String, u64)>> {
            let mut stmt = self.conn.prepare_cached(
                "SELECT slot, max(s) FROM ( \
                 SELECT slot, started_ms AS s FROM tasks \
                 WHERE state <> 'finished' AND started_ms >= ?1 \
                 UNION ALL SELECT slot, started_ms FROM tasks \
                 WHERE state = 'finished' AND finished_ms >= ?1 AND started_ms >= ?1) \
                 GROUP BY slot",
            )?;
            let rows = stmt.query_map([since_ms as i64], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
            })?;
            rows.collect()
        };
        read().unwrap_or_else(|e| {
            tracing::warn!("cannot read the slots' latest starts: {e}");
            Vec::new()
        })
    }

    /// For each plugin the stored tasks use (`only` those of that
    /// namespace), how many are unfinished and how many finished.
    pub(in crate::store) fn plugin_refs(&self, only: Option<&str>) -> HashMap<Digest, PluginRefs> {
        let read = || -> rusqlite::Result<HashMap<Digest, PluginRefs>> {
            // The counts the writer keeps per plugin and namespace (a
            // task's namespace is its name's part before the separator,
            // '' for the default one's).
            let mut stmt = self.conn.prepare_cached(
                "SELECT digest, max(nullif(plugin, '')), sum(unfinished), sum(finished) \
                 FROM plugin_uses WHERE ?1 IS NULL OR ns = ?1 GROUP BY digest",
            )?;
            let rows = stmt.query_map([only], |r| {
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

    /// Up to `limit` finished tasks with an id below `before`, newest
    /// (highest id) first: one page, read by the key's order.
    pub(in crate::store) fn finished_before(&self, before: u64, limit: usize) -> Vec<Finished> {
        self.finished(
            "SELECT plugin, report, NULL, submitted_ms, finished_ms, parent FROM tasks \
             WHERE id < ?1 AND state = 'finished' ORDER BY id DESC LIMIT ?2",
            &[&(before.min(i64::MAX as u64) as i64), &(limit as i64)],
        )
    }

    /// The newest finished tasks (without their logs), oldest first.
    pub(in crate::store) fn finished_recent(&self, limit: usize) -> Vec<Finished> {
        let mut out = self.finished(
            "SELECT plugin, report, NULL, submitted_ms, finished_ms, parent FROM tasks \
             WHERE state = 'finished' ORDER BY finished_ms DESC, id DESC LIMIT ?1",
            &[&(limit as i64)],
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
        records: Vec::new(),
    })
}
