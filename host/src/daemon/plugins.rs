//! Owns the daemon's plugins: content-addressed files under
//! `<state dir>/plugins/<sha256>.wasm`, written atomically (a temporary file
//! of a unique name, then a rename), read back and compiled on first use, and
//! the runtime's in-memory cache in front of them. A plugin file changed after
//! a submission does not change the queued work: the work refers to the
//! digest.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::runtime::{Digest, LoadError, Plugin, Runtime};

/// Where the daemon keeps uploaded plugins: `<state dir>/plugins/<hex>.wasm`.
pub fn plugin_path(state_dir: &Path, digest: &Digest) -> PathBuf {
    let hex: String = digest.0.iter().map(|b| format!("{b:02x}")).collect();
    state_dir.join("plugins").join(format!("{hex}.wasm"))
}

/// Makes every temporary file name of this process unique.
static TEMP_FILES: AtomicU64 = AtomicU64::new(0);

/// The plugin store of one daemon.
#[derive(Debug)]
pub(crate) struct Plugins {
    runtime: Arc<Runtime>,
    state_dir: PathBuf,
}

impl Plugins {
    pub(crate) fn new(runtime: Arc<Runtime>, state_dir: PathBuf) -> Self {
        Self { runtime, state_dir }
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Whether the daemon has this plugin (compiled, or stored on disk).
    /// Cheap: compiles nothing.
    pub(crate) fn known(&self, digest: &Digest) -> bool {
        self.runtime.plugin(digest).is_some() || plugin_path(&self.state_dir, digest).is_file()
    }

    /// A plugin by digest: from the runtime's cache, else from the state
    /// directory (compiled on first use).
    pub(crate) async fn get(&self, digest: &Digest) -> Option<Arc<Plugin>> {
        if let Some(plugin) = self.runtime.plugin(digest) {
            return Some(plugin);
        }
        let path = plugin_path(&self.state_dir, digest);
        let bytes = tokio::fs::read(&path).await.ok()?;
        if Digest::of(&bytes) != *digest {
            tracing::warn!(path = %path.display(), "a stored plugin does not match its digest; ignoring it");
            return None;
        }
        match self
            .runtime
            .load_bytes(bytes.into(), &digest.to_string())
            .await
        {
            Ok(plugin) => Some(plugin),
            Err(err) => {
                tracing::warn!(path = %path.display(), "a stored plugin no longer loads: {err}");
                None
            }
        }
    }

    /// Validates an uploaded plugin and stores it under its digest.
    pub(crate) async fn store(&self, bytes: Vec<u8>) -> Result<Arc<Plugin>, LoadError> {
        let digest = Digest::of(&bytes);
        let bytes: Arc<[u8]> = bytes.into();
        let plugin = self
            .runtime
            .load_bytes(Arc::clone(&bytes), &digest.to_string())
            .await?;
        let path = plugin_path(&self.state_dir, &digest);
        if !path.exists() {
            // Two uploads of the same digest at once each write a file of
            // their own and rename it into place: the same bytes either way.
            let n = TEMP_FILES.fetch_add(1, Ordering::Relaxed);
            let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
            let written = tokio::fs::write(&tmp, &bytes)
                .await
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(err) = written {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(path = %path.display(), "cannot store the plugin on disk: {err}");
            }
        }
        Ok(plugin)
    }
}
