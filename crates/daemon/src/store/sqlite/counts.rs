//! Owns the counts the writer keeps as task rows change, so that retention
//! and plugin collection read a few rows instead of every task kept: the
//! finished rows and their bytes (in `meta`) and each plugin's unfinished
//! and finished users per namespace (`plugin_uses`, migration 13). A
//! transaction's changes are gathered here and written once, before its
//! commit; the writer adds them to its own copy after the commit.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use taskhost_core::slot_settings::SCOPE_SEPARATOR;

/// The namespace part of a task's name ('' for the default one's), as
/// migration 13 computes it in SQL.
fn namespace_of(name: &str) -> &str {
    name.split_once(SCOPE_SEPARATOR).map_or("", |(ns, _)| ns)
}

/// The finished rows kept and their bytes (request, report and log), as
/// committed.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Kept {
    pub rows: u64,
    pub bytes: u64,
}

impl Kept {
    /// The counts as the store holds them.
    pub(super) fn read(conn: &Connection) -> rusqlite::Result<Self> {
        let value = |key: &str| -> rusqlite::Result<u64> {
            let v: Option<i64> = conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .optional()?;
            Ok(v.unwrap_or(0).max(0) as u64)
        };
        Ok(Self {
            rows: value("finished_rows")?,
            bytes: value("finished_bytes")?,
        })
    }
}

/// One plugin's change of users in one namespace.
#[derive(Debug, Default)]
struct Uses {
    /// Its name as the newest submission gave it ('' if none did here).
    plugin: String,
    unfinished: i64,
    finished: i64,
}

/// What one transaction changed.
#[derive(Debug, Default)]
pub(super) struct Changes {
    rows: i64,
    bytes: i64,
    uses: HashMap<(Vec<u8>, String), Uses>,
}

impl Changes {
    fn uses(&mut self, digest: &[u8], name: &str) -> &mut Uses {
        self.uses
            .entry((digest.to_vec(), namespace_of(name).to_owned()))
            .or_default()
    }

    /// A task was inserted unfinished.
    pub(super) fn submitted(&mut self, digest: &[u8], name: &str, plugin: &str) {
        let uses = self.uses(digest, name);
        uses.unfinished += 1;
        plugin.clone_into(&mut uses.plugin);
    }

    /// A task's row of `bytes` became finished.
    pub(super) fn finished(&mut self, digest: &[u8], name: &str, bytes: u64) {
        let uses = self.uses(digest, name);
        uses.unfinished -= 1;
        uses.finished += 1;
        self.rows += 1;
        self.bytes += bytes as i64;
    }

    /// A finished task's row of `bytes` was deleted.
    pub(super) fn deleted(&mut self, digest: &[u8], name: &str, bytes: u64) {
        self.uses(digest, name).finished -= 1;
        self.rows -= 1;
        self.bytes -= bytes as i64;
    }

    /// Writes the changes in `tx` (before its commit).
    pub(super) fn write(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        for (key, delta) in [("finished_rows", self.rows), ("finished_bytes", self.bytes)] {
            if delta != 0 {
                tx.prepare_cached(
                    "INSERT INTO meta (key, value) VALUES (?1, max(?2, 0)) \
                     ON CONFLICT (key) DO UPDATE SET value = max(value + ?2, 0)",
                )?
                .execute(params![key, delta])?;
            }
        }
        for ((digest, ns), uses) in &self.uses {
            tx.prepare_cached(
                "INSERT INTO plugin_uses (digest, ns, plugin, unfinished, finished) \
                 VALUES (?1, ?2, ?3, max(?4, 0), max(?5, 0)) \
                 ON CONFLICT (digest, ns) DO UPDATE SET \
                 plugin = CASE WHEN excluded.plugin = '' THEN plugin ELSE excluded.plugin END, \
                 unfinished = max(unfinished + ?4, 0), finished = max(finished + ?5, 0)",
            )?
            .execute(params![
                digest,
                ns,
                uses.plugin,
                uses.unfinished,
                uses.finished
            ])?;
            if uses.unfinished < 0 || uses.finished < 0 {
                tx.prepare_cached(
                    "DELETE FROM plugin_uses WHERE digest = ?1 AND ns = ?2 \
                     AND unfinished = 0 AND finished = 0",
                )?
                .execute(params![digest, ns])?;
            }
        }
        Ok(())
    }

    /// `kept` after these changes' commit.
    pub(super) fn apply_to(&self, kept: &mut Kept) {
        kept.rows = kept.rows.saturating_add_signed(self.rows);
        kept.bytes = kept.bytes.saturating_add_signed(self.bytes);
    }
}
