//! Owns the daemon's plugins: content-addressed files under
//! `<state dir>/plugins/<sha256>.wasm`, written atomically (a temporary file
//! of a unique name, then a rename), read back and compiled on first use, and
//! the runtime's in-memory cache in front of them. A plugin file changed after
//! a submission does not change the queued work: the work refers to the
//! digest.
//!
//! It also collects them: a plugin no task uses (no unfinished task, no
//! finished one the store still retains) is deleted once it has been stored
//! for the daemon's `keep_unused_plugins`, at start and every
//! [`COLLECT_EVERY`]; `host plugins rm|prune` remove at once. Removal happens
//! under the admission lock, and a submission checks its plugin file under
//! the same lock, so no accepted task refers to a plugin that is gone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use taskhost_runtime::{Digest, Plugin, Runtime};

use crate::service::error::ServiceError;
use crate::service::namespace::Ns;
use crate::service::tasks::Tasks;
use crate::store::{PluginRefs, Store, now_ms};
use crate::wire::protocol::PluginRow;

/// How often the daemon collects unused plugins.
pub const COLLECT_EVERY: Duration = Duration::from_secs(60);

/// Where the daemon keeps uploaded plugins: `<state dir>/plugins/<hex>.wasm`.
pub fn plugin_path(state_dir: &Path, digest: &Digest) -> PathBuf {
    state_dir
        .join("plugins")
        .join(format!("{}.wasm", digest.hex()))
}

/// Makes every temporary file name of this process unique.
static TEMP_FILES: AtomicU64 = AtomicU64::new(0);

/// The plugin store of one daemon.
#[derive(Debug)]
pub(crate) struct Plugins {
    runtime: Arc<Runtime>,
    state_dir: PathBuf,
    /// Digests whose file was seen and not removed since: a submission's
    /// check under the admission lock needs no `stat` for them.
    seen: std::sync::Mutex<std::collections::HashSet<Digest>>,
}

impl Plugins {
    pub(crate) fn new(runtime: Arc<Runtime>, state_dir: PathBuf) -> Self {
        Self {
            runtime,
            state_dir,
            seen: Default::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<Digest>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Whether the daemon stores this plugin (so a submission may refer to
    /// it). Cheap: compiles nothing.
    pub(crate) fn known(&self, digest: &Digest) -> bool {
        self.is_stored(digest)
    }

    /// A plugin by digest: from the runtime's cache, else from the state
    /// directory (compiled on first use).
    pub(crate) async fn get(&self, digest: &Digest) -> Option<Arc<Plugin>> {
        if let Some(plugin) = self.runtime.plugin(digest) {
            return Some(plugin);
        }
        let path = plugin_path(&self.state_dir, digest);
        let bytes: Arc<[u8]> = tokio::fs::read(&path).await.ok()?.into();
        let found = taskhost_runtime::digest_of(&bytes).await;
        if found != *digest {
            tracing::warn!(path = %path.display(), "a stored plugin does not match its digest; ignoring it");
            return None;
        }
        match self
            .runtime
            .load_digested(bytes, *digest, &digest.to_string())
            .await
        {
            Ok(plugin) => Some(plugin),
            Err(err) => {
                tracing::warn!(path = %path.display(), "a stored plugin no longer loads: {err}");
                None
            }
        }
    }

    /// Whether the plugin's file is stored: one `stat` the first time, then
    /// remembered until [`Plugins::remove`] deletes it.
    pub(crate) fn is_stored(&self, digest: &Digest) -> bool {
        if self.seen().contains(digest) {
            return true;
        }
        let stored = plugin_path(&self.state_dir, digest).is_file();
        if stored {
            self.seen().insert(*digest);
        }
        stored
    }

    /// The stored plugins with who uses them, by digest.
    pub(crate) fn list(&self, refs: &HashMap<Digest, PluginRefs>) -> Vec<PluginRow> {
        let dir = self.state_dir.join("plugins");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(digest) = file
                .to_str()
                .and_then(|f| f.strip_suffix(".wasm"))
                .and_then(|hex| hex.parse::<Digest>().ok())
            else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let used = refs.get(&digest).cloned().unwrap_or_default();
            let name = used.name.or_else(|| {
                self.runtime
                    .is_cached(&digest)
                    .then(|| self.runtime.plugin(&digest))
                    .flatten()
                    .map(|p| p.info().name.clone())
            });
            rows.push(PluginRow {
                digest,
                name,
                bytes: meta.len(),
                stored_ms: meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_millis() as u64),
                unfinished: used.unfinished,
                finished: used.finished,
                loaded: self.runtime.is_cached(&digest),
            });
        }
        rows.sort_by_key(|r| (r.stored_ms, r.digest.0));
        rows
    }

    /// Deletes a stored plugin and drops it from the in-memory cache
    /// (attempts that hold it go on). Call under the admission lock.
    pub(crate) fn remove(&self, digest: &Digest) -> std::io::Result<()> {
        self.runtime.forget(digest);
        self.seen().remove(digest);
        std::fs::remove_file(plugin_path(&self.state_dir, digest))
    }

    /// Validates an uploaded plugin and stores it under its digest (refused
    /// if that is not `expected`). A plugin that cannot be stored is refused:
    /// accepted work must find it after a restart. Hashing, compiling,
    /// describing and writing all happen off the async workers.
    pub(crate) async fn store(
        &self,
        bytes: Vec<u8>,
        expected: Option<Digest>,
    ) -> Result<Arc<Plugin>, ServiceError> {
        let bytes: Arc<[u8]> = bytes.into();
        let digest = taskhost_runtime::digest_of(&bytes).await;
        if expected.is_some_and(|e| e != digest) {
            return Err(ServiceError::Invalid(
                "the uploaded bytes do not match their digest".into(),
            ));
        }
        let plugin = self
            .runtime
            .load_digested(Arc::clone(&bytes), digest, &digest.to_string())
            .await
            .map_err(|e| ServiceError::Invalid(e.to_string()))?;
        let path = plugin_path(&self.state_dir, &digest);
        if !path.exists() {
            // Two uploads of the same digest at once each write a file of
            // their own and rename it into place: the same bytes either way.
            let n = TEMP_FILES.fetch_add(1, Ordering::Relaxed);
            let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
            let write = {
                let tmp = tmp.clone();
                let path = path.clone();
                tokio::task::spawn_blocking(move || write_durably(&tmp, &path, &bytes))
            };
            let written = write
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            if let Err(err) = written {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(path = %path.display(), "cannot store the plugin on disk: {err}");
                return Err(ServiceError::Internal(format!(
                    "the daemon cannot store the plugin in `{}`: {err}",
                    path.parent().unwrap_or(&path).display()
                )));
            }
        }
        Ok(plugin)
    }
}

/// Writes `bytes` to `tmp`, flushes it to disk, renames it to `path` and
/// flushes the directory, so that once this returns the plugin is there
/// after a power loss too (the submission that needs it is acknowledged
/// only afterwards).
fn write_durably(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(tmp, path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}

/// Who uses each plugin: the store's tasks, and the daemon's tasks in
/// memory (a submission is there before its store write commits; with the
/// memory store, or on a cluster node, they are the only record here).
pub(crate) fn refs(
    store: Option<&Store>,
    tasks: &Tasks,
    schedules: Option<&dyn Holders>,
    only: Option<&Ns>,
) -> HashMap<Digest, PluginRefs> {
    let name = only.map(|ns| ns.share().unwrap_or_default());
    let mut refs = (store.map(|s| s.plugin_refs(name.as_deref()))).unwrap_or_default();
    // A schedule holds its plugin as an unfinished task does: its next
    // firing needs it.
    for (digest, n) in schedules.map(|s| s.plugins(only)).unwrap_or_default() {
        let entry = refs.entry(digest).or_default();
        entry.unfinished += n;
    }
    let durable = store.is_some_and(Store::is_durable);
    for (digest, memory) in tasks.plugin_refs(only) {
        let entry = refs.entry(digest).or_default();
        entry.name = entry.name.take().or(memory.name);
        entry.unfinished = entry.unfinished.max(memory.unfinished);
        if !durable {
            entry.finished = memory.finished;
        }
    }
    refs
}

/// Who else holds plugins than tasks (one host's schedules): how many of
/// them hold each.
pub(crate) trait Holders {
    /// `only` those of that namespace.
    fn plugins(&self, only: Option<&Ns>) -> HashMap<Digest, u64>;
}

/// What removing plugins reads and holds: the plugins, who uses them, and
/// the admission lock (no submission is placed meanwhile).
#[derive(Clone, Copy)]
pub(crate) struct Users<'a> {
    pub plugins: &'a Plugins,
    /// None on a cluster node.
    pub store: Option<&'a Store>,
    pub tasks: &'a Tasks,
    /// One host's schedules (each holds its plugin); None on a cluster
    /// node.
    pub schedules: Option<&'a dyn Holders>,
    pub admission: &'a std::sync::Mutex<()>,
}

/// Removes stored plugins: the one whose digest starts with `prefix`
/// (refused while an unfinished task uses it), or, without a prefix, every
/// plugin no task uses that was stored at least `min_age` ago. Returns what
/// it removed.
pub(crate) fn remove(
    users: Users<'_>,
    prefix: Option<&str>,
    min_age: Duration,
) -> Result<Vec<PluginRow>, ServiceError> {
    // No submission is placed meanwhile (see the module docs).
    let _admission = users
        .admission
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let refs = refs(users.store, users.tasks, users.schedules, None);
    let rows = users.plugins.list(&refs);
    let chosen: Vec<PluginRow> = match prefix {
        Some(prefix) => {
            let hex = prefix
                .strip_prefix("sha256:")
                .unwrap_or(prefix)
                .to_ascii_lowercase();
            if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(ServiceError::Invalid(format!(
                    "`{prefix}` is not a digest or the start of one (hex digits, as `host plugins ls` shows)"
                )));
            }
            let mut matching: Vec<PluginRow> = rows
                .into_iter()
                .filter(|r| r.digest.hex().starts_with(&hex))
                .collect();
            match matching.len() {
                0 => {
                    return Err(ServiceError::NotFound(format!(
                        "no stored plugin's digest starts with `{hex}`; `host plugins ls` lists them"
                    )));
                }
                1 => {}
                n => {
                    return Err(ServiceError::Invalid(format!(
                        "`{hex}` starts {n} plugins' digests; give more digits"
                    )));
                }
            }
            let row = matching.remove(0);
            if row.unfinished > 0 {
                return Err(ServiceError::Invalid(format!(
                    "plugin {} ({}) is used by {} unfinished task(s) or schedule(s); cancel \
                         them or let them finish, and remove the schedules, first",
                    row.digest,
                    row.name.as_deref().unwrap_or("unnamed"),
                    row.unfinished
                )));
            }
            vec![row]
        }
        None => {
            let now = now_ms();
            rows.into_iter()
                .filter(|r| {
                    r.unfinished == 0
                        && r.finished == 0
                        && now.saturating_sub(r.stored_ms) >= min_age.as_millis() as u64
                })
                .collect()
        }
    };
    let mut removed = Vec::with_capacity(chosen.len());
    for row in chosen {
        match users.plugins.remove(&row.digest) {
            Ok(()) => removed.push(row),
            Err(err) => {
                tracing::warn!(plugin = %row.digest, "cannot remove a stored plugin: {err}");
            }
        }
    }
    Ok(removed)
}

/// Collects unused plugins (see the module docs), logging what it removed.
pub(crate) fn collect(users: Users<'_>, keep_unused: Duration) {
    match remove(users, None, keep_unused) {
        Ok(removed) if !removed.is_empty() => {
            let bytes: u64 = removed.iter().map(|r| r.bytes).sum();
            tracing::info!(
                plugins = removed.len(),
                bytes,
                "collected plugins no task uses"
            );
        }
        Ok(_) => {}
        Err(message) => tracing::warn!("plugin collection failed: {message}"),
    }
}
