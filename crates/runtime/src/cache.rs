//! Owns the runtime's in-memory cache of compiled plugins: one entry per
//! digest (concurrent loads of the same bytes compile once), bounded by the
//! sizes of the plugins' compiled images with the least recently used
//! evicted first. An evicted
//! plugin stays alive for the attempts that hold it; the next load compiles
//! it again (from wasmtime's on-disk cache when that is on).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::OnceCell;

use super::digest::Digest;
use super::plugin::Plugin;

/// A cache entry: the plugin once loaded, and when it was last used.
struct Entry {
    cell: Arc<OnceCell<Arc<Plugin>>>,
    used: u64,
    /// The plugin's size once loaded and counted, else 0.
    bytes: u64,
}

/// The plugins compiled in this process.
#[derive(Default)]
pub(crate) struct PluginCache {
    entries: HashMap<Digest, Entry>,
    /// Sum of the counted entries' sizes.
    bytes: u64,
    clock: u64,
    /// Most bytes of plugins kept (counted by compiled image size); `None`:
    /// all.
    limit: Option<u64>,
}

impl PluginCache {
    pub(crate) fn new(limit: Option<u64>) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The cell a load of `digest` fills (the existing one if any).
    pub(crate) fn cell(&mut self, digest: Digest) -> Arc<OnceCell<Arc<Plugin>>> {
        let now = self.tick();
        let entry = self.entries.entry(digest).or_insert_with(|| Entry {
            cell: Arc::default(),
            used: now,
            bytes: 0,
        });
        entry.used = now;
        Arc::clone(&entry.cell)
    }

    /// Counts a loaded plugin and evicts the least recently used others
    /// while the cache is over its limit.
    pub(crate) fn loaded(&mut self, digest: Digest, plugin: &Plugin) {
        let Some(entry) = self.entries.get_mut(&digest) else {
            return; // forgotten meanwhile
        };
        if entry.bytes == 0 {
            entry.bytes = (plugin.compiled_size() as u64).max(1);
            self.bytes += entry.bytes;
        }
        let Some(limit) = self.limit else { return };
        while self.bytes > limit {
            let oldest = self
                .entries
                .iter()
                .filter(|(d, e)| **d != digest && e.bytes > 0)
                .min_by_key(|(_, e)| e.used)
                .map(|(d, _)| *d);
            match oldest {
                Some(old) => {
                    self.forget(&old);
                }
                None => break, // this one alone is over the limit: kept
            }
        }
    }

    /// Drops a failed load's empty cell.
    pub(crate) fn failed(&mut self, digest: &Digest) {
        if self
            .entries
            .get(digest)
            .is_some_and(|e| e.cell.get().is_none())
        {
            self.entries.remove(digest);
        }
    }

    /// The loaded plugin, marked as used.
    pub(crate) fn get(&mut self, digest: &Digest) -> Option<Arc<Plugin>> {
        let now = self.tick();
        let entry = self.entries.get_mut(digest)?;
        let plugin = entry.cell.get().cloned()?;
        entry.used = now;
        Some(plugin)
    }

    /// Whether the plugin is loaded, without marking it used.
    pub(crate) fn contains(&self, digest: &Digest) -> bool {
        self.entries
            .get(digest)
            .is_some_and(|e| e.cell.get().is_some())
    }

    /// Drops an entry; true if there was one.
    pub(crate) fn forget(&mut self, digest: &Digest) -> bool {
        match self.entries.remove(digest) {
            Some(entry) => {
                self.bytes -= entry.bytes;
                true
            }
            None => false,
        }
    }

    /// Bytes of plugins kept (by compiled image size).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}
