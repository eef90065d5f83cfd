//! Owns [`Runtime`], the one WebAssembly runtime of a process: it starts
//! the engine, the linker, the epoch ticker and the reaper from a
//! [`RuntimeConfig`], loads plugins (a file's known digest, the cache in
//! memory, the artifact on disk, else a compile off the async workers, at a
//! lower priority if asked, with its `describe`), and makes each attempt's
//! fresh instance. How each of those steps is done is its module's
//! business; this one wires them and counts ([`RuntimeStats`]).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use wasmtime::Engine;
use wasmtime::component::Linker;

use super::artifacts;
use super::attempt::{self, AttemptEnv, AttemptRequest, AttemptState, PreparedAttempt};
use super::cache;
use super::config::{self, RuntimeConfig, SLOW_COMPILE, SlowCompile};
use super::digest::{Digest, digest_of};
use super::engine::{self, Allocator};
use super::facts::StopSignals;
use super::failure::{AttemptError, error_chain};
use super::file_digests;
use super::limits::{GuestLimits, LimitError};
use super::plugin::{self, LoadError, MAX_PLUGIN_BYTES, Plugin};
use super::reaper::{self, lower_priority};
use super::ticker::{self, HurryGuard};

/// The runtime could not start.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    /// The engine or its ticker could not be set up.
    #[error("cannot start the WebAssembly runtime: {0}")]
    Engine(String),
    /// A cap of [`RuntimeConfig::guest_limits`] cannot work.
    #[error(transparent)]
    Limits(#[from] LimitError),
}

/// The engine, linker, ticker and plugin cache of one process.
pub struct Runtime {
    engine: Engine,
    /// Shared with the blocking threads that compile and load plugins.
    linker: Arc<Linker<AttemptState>>,
    allocator: Allocator,
    plugins: Mutex<cache::PluginCache>,
    ticker: ticker::EpochTicker,
    /// Compiled plugins on disk, when a cache directory is set and usable.
    artifacts: Option<Arc<artifacts::Artifacts>>,
    on_slow_compile: Option<config::SlowCompileHook>,
    /// See [`RuntimeConfig::compile_nice`].
    compile_nice: Option<i32>,
    /// See [`RuntimeConfig::inline_loads`].
    inline_loads: bool,
    stats: RuntimeStats,
    /// Drops the stores of stopped attempts beside a current-thread runtime.
    reaper: Arc<reaper::Reaper>,
    /// What every attempt shares: its caps, the host's own addresses.
    env: AttemptEnv,
}

/// What a runtime counts about its plugin cache, for the daemon's metrics.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Loads and lookups served by an already compiled plugin.
    pub cache_hits: std::sync::atomic::AtomicU64,
    /// Loads that had to compile (first use, or after an eviction).
    pub cache_misses: std::sync::atomic::AtomicU64,
    /// How long each compile (with its `describe`) took.
    pub compile_time: taskhost_core::stats::DurationHistogram,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("allocator", &self.allocator)
            .finish_non_exhaustive()
    }
}

/// Runs `compile` on a new thread at `nice` (see
/// [`RuntimeConfig::compile_nice`]); a thread of the async runtime's
/// blocking pool would keep the lower priority for whatever it runs next.
fn spawn_compile<T: Send + 'static>(
    nice: i32,
    compile: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("taskhost-compile".into())
        .spawn(move || {
            lower_priority(nice);
            let _ = tx.send(compile());
        })?;
    Ok(rx)
}

impl Runtime {
    /// Builds the engine (pooling if possible), links WASI p2 and the host
    /// interface, and starts the epoch ticker.
    pub fn new(config: &RuntimeConfig) -> Result<Self, RuntimeError> {
        config.guest_limits.check()?;
        if let Some(nice) = config.compile_nice {
            // Only the first configuration of the global pool counts (an
            // error means it was already started, maybe by the embedder).
            let _ = rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("taskhost-compile-{i}"))
                .start_handler(move |_| lower_priority(nice))
                .build_global();
        }
        let (engine, allocator) = engine::build_engine(config.allocator, config.pool_instances)
            .map_err(RuntimeError::Engine)?;
        let mut linker = Linker::new(&engine);
        attempt::add_to_linker(&mut linker).map_err(|e| RuntimeError::Engine(error_chain(&e)))?;
        let ticker = ticker::EpochTicker::start(&engine, config.epoch_tick, config.realtime_ticker)
            .map_err(RuntimeError::Engine)?;
        let artifacts = config
            .cache_dir
            .as_deref()
            .and_then(|dir| artifacts::Artifacts::open(dir, &engine))
            .map(Arc::new);
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            allocator,
            plugins: Mutex::new(cache::PluginCache::new(config.plugin_cache_bytes)),
            ticker,
            artifacts,
            on_slow_compile: config.on_slow_compile.clone(),
            compile_nice: config.compile_nice,
            inline_loads: config.inline_loads,
            stats: RuntimeStats::default(),
            reaper: Arc::default(),
            env: AttemptEnv {
                limits: config.guest_limits,
                own: Arc::default(),
                secrets: Arc::new(config.secrets.clone()),
                config: Arc::new(config.config.clone()),
                kv: config.kv.clone(),
                children: config.children.clone(),
            },
        })
    }

    /// Adds an address the host itself listens on (the daemon's `--http`
    /// listener, once bound): from now on no guest's outbound HTTP reaches
    /// it unless its grant names that IP address itself (one on an
    /// unspecified address, such as `0.0.0.0:9100`, counts for every
    /// address on its port).
    pub fn add_own_address(&self, addr: std::net::SocketAddr) {
        self.env.own.add(addr);
    }

    /// The caps every attempt of this runtime runs under.
    pub fn guest_limits(&self) -> GuestLimits {
        self.env.limits
    }

    /// Registers a deadline of an attempt of this runtime (a force-abort or
    /// the end of its timeout): at the deadline the epoch ticker sets
    /// `abort` and ticks at once, so the guest traps at its next epoch check
    /// (within microseconds when it is running; other running guests pay one
    /// extra yield), and from then on, until the guard is dropped, the epoch
    /// ticks every millisecond.
    pub fn hurry_at(&self, at: std::time::Instant, abort: Arc<AtomicBool>) -> HurryGuard {
        self.ticker.hurry_at(at, abort)
    }

    /// Whether the epoch ticker's thread got the real-time priority
    /// [`RuntimeConfig::realtime_ticker`] asks for: when it did not, a
    /// force-abort or timeout of a spinning guest can be late by up to a
    /// kernel scheduler tick while guests hold every core.
    pub fn realtime_ticker(&self) -> bool {
        self.ticker.is_realtime()
    }

    /// The engine every plugin of this runtime is compiled for and
    /// instantiated in (epoch interruption, async support, the instance
    /// pool). Embedders and benchmarks may compile their own components
    /// with it, for instance to measure wasmtime's own cost of an instance
    /// on the same configuration.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Which instance allocator the engine uses.
    pub fn allocator(&self) -> Allocator {
        self.allocator
    }

    /// Reads, compiles and validates a plugin file. A file this runtime
    /// has read before, unchanged since (same inode, size and times), whose
    /// compiled artifact is on disk, is neither read nor hashed again.
    pub async fn load_file(&self, path: &Path) -> Result<Arc<Plugin>, LoadError> {
        let origin = path.display().to_string();
        let unreadable = |why: String| LoadError::Unreadable {
            origin: origin.clone(),
            why,
        };
        let meta = self
            .file_op(path, std::fs::metadata)
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        if meta.is_dir() {
            return Err(unreadable("it is a directory".into()));
        }
        if meta.len() > MAX_PLUGIN_BYTES as u64 {
            return Err(plugin::too_big(&origin, meta.len()));
        }
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let before = file_digests::FileStatus::new(&absolute, &meta);
        let dir = self.artifacts.as_ref().map(|a| a.dir().to_owned());
        if let Some(dir) = &dir
            && let Some(digest) = file_digests::known(dir, &before)
            && let Some(plugin) = self.load_known(digest, meta.len() as usize).await
        {
            return Ok(plugin);
        }
        let bytes = self
            .file_op(path, std::fs::read)
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        let bytes: Arc<[u8]> = bytes.into();
        plugin::check_header(&origin, &bytes)?;
        let digest = digest_of(&bytes).await;
        let plugin = self.load_digested(bytes, digest, &origin).await?;
        if let Some(dir) = &dir
            && let Ok(after) = self.file_op(path, std::fs::metadata).await
        {
            let after = file_digests::FileStatus::new(&absolute, &after);
            file_digests::remember(dir, &before, &after, digest);
        }
        Ok(plugin)
    }

    /// The plugin with this digest from memory or from its artifact, if
    /// either has it; never compiles.
    async fn load_known(&self, digest: Digest, size: usize) -> Option<Arc<Plugin>> {
        let cell = self.cache().cell(digest);
        let result = cell
            .get_or_try_init(|| async {
                self.load_artifact(digest, size)
                    .await
                    .map(Arc::new)
                    .ok_or(())
            })
            .await
            .cloned();
        match &result {
            Ok(plugin) => self.cache().loaded(digest, plugin),
            Err(()) => self.cache().failed(&digest),
        }
        result.ok().filter(|plugin| plugin.size() == size)
    }

    /// Compiles and validates a plugin from its bytes, once per digest: a
    /// second load of the same bytes returns the cached plugin, and
    /// concurrent loads of the same bytes compile once.
    pub async fn load_bytes(
        &self,
        bytes: Arc<[u8]>,
        origin: &str,
    ) -> Result<Arc<Plugin>, LoadError> {
        plugin::check_header(origin, &bytes)?;
        let digest = digest_of(&bytes).await;
        self.load_digested(bytes, digest, origin).await
    }

    /// [`Runtime::load_bytes`] with the digest of `bytes` already computed
    /// (the caller vouches for it).
    pub async fn load_digested(
        &self,
        bytes: Arc<[u8]>,
        digest: Digest,
        origin: &str,
    ) -> Result<Arc<Plugin>, LoadError> {
        plugin::check_header(origin, &bytes)?;
        let cell = self.cache().cell(digest);
        let counter = if cell.initialized() {
            &self.stats.cache_hits
        } else {
            &self.stats.cache_misses
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = cell
            .get_or_try_init(|| async {
                if let Some(plugin) = self.load_artifact(digest, bytes.len()).await {
                    return Ok(Arc::new(plugin));
                }
                let started = std::time::Instant::now();
                let engine = self.engine.clone();
                let linker = Arc::clone(&self.linker);
                let owned_origin = origin.to_owned();
                let input = Arc::clone(&bytes);
                // Compiling takes milliseconds to seconds: never on the async
                // runtime's worker threads.
                let job = move || plugin::compile(&engine, &linker, &owned_origin, &input);
                let mut compile: std::pin::Pin<Box<dyn Future<Output = Result<_, String>> + Send>> =
                    match self.compile_nice {
                        Some(nice) => {
                            let done =
                                spawn_compile(nice, job).map_err(|e| LoadError::Invalid {
                                    origin: origin.to_owned(),
                                    why: format!("cannot start a compile thread: {e}"),
                                })?;
                            Box::pin(async move {
                                done.await
                                    .map_err(|_| "its thread ended without a result".to_owned())
                            })
                        }
                        None => Box::pin(async move {
                            tokio::task::spawn_blocking(job)
                                .await
                                .map_err(|e| e.to_string())
                        }),
                    };
                let compiled = tokio::select! {
                    done = &mut compile => done,
                    () = tokio::time::sleep(SLOW_COMPILE) => {
                        self.slow_compile(origin, bytes.len());
                        compile.await
                    }
                };
                let pre = compiled.map_err(|e| LoadError::Invalid {
                    origin: origin.to_owned(),
                    why: format!("the compiler crashed: {e}"),
                })??;
                // Instantiating a large component and running its describe
                // takes milliseconds too (10 to 25 ms for Python): on a
                // blocking thread, driven by this runtime's timers.
                let runtime = tokio::runtime::Handle::current();
                let engine = self.engine.clone();
                let env = self.env.clone();
                let owned_origin = origin.to_owned();
                let size = bytes.len();
                let plugin = tokio::task::spawn_blocking(move || {
                    runtime.block_on(plugin::describe(
                        &engine,
                        &env,
                        &owned_origin,
                        digest,
                        size,
                        pre,
                    ))
                })
                .await
                .map_err(|e| LoadError::Invalid {
                    origin: origin.to_owned(),
                    why: format!("describe crashed: {e}"),
                })?
                .map(Arc::new);
                self.stats.compile_time.observe(started.elapsed());
                if let (Ok(plugin), Some(artifacts)) = (&plugin, &self.artifacts) {
                    let (artifacts, plugin) = (Arc::clone(artifacts), Arc::clone(plugin));
                    let _ = tokio::task::spawn_blocking(move || {
                        let component = plugin.pre().component();
                        artifacts.store(&digest, plugin.size(), component, plugin.info());
                    })
                    .await;
                }
                plugin
            })
            .await
            .cloned();
        match &result {
            Ok(plugin) => self.cache().loaded(digest, plugin),
            // Failed loads are not cached; drop the empty cell.
            Err(_) => self.cache().failed(&digest),
        }
        result
    }

    /// The plugin with this digest mapped from its artifact on disk, if
    /// this host stored one that checks out (see [`Self::blocking`]).
    async fn load_artifact(&self, digest: Digest, size: usize) -> Option<Plugin> {
        let artifacts = Arc::clone(self.artifacts.as_ref()?);
        let engine = self.engine.clone();
        let linker = Arc::clone(&self.linker);
        self.blocking(move || {
            let (component, info) = artifacts.load(&engine, &digest, size)?;
            // The artifact passed these checks when it was compiled; a
            // failure now is a bug, and the compile path reports it.
            let pre = plugin::prepare(&engine, &linker, &digest.to_string(), &component).ok()?;
            Some(Plugin::new(digest, size, info, pre))
        })
        .await
        .flatten()
    }

    /// `op` on the file at `path` (see [`Self::blocking`]).
    async fn file_op<T: Send + 'static>(
        &self,
        path: &Path,
        op: fn(PathBuf) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let path = path.to_owned();
        self.blocking(move || op(path)).await.unwrap_or_else(|| {
            Err(std::io::Error::other(
                "cancelled: the async runtime is shutting down",
            ))
        })
    }

    /// Runs `work` that blocks on the file system: on a blocking thread,
    /// or here with [`RuntimeConfig::inline_loads`]. `None` when its thread
    /// was cancelled (the async runtime is shutting down).
    async fn blocking<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        if self.inline_loads {
            Some(work())
        } else {
            tokio::task::spawn_blocking(work).await.ok()
        }
    }

    /// Says that a compile is taking a while (see [`SLOW_COMPILE`]).
    fn slow_compile(&self, origin: &str, size: usize) {
        let note = SlowCompile {
            origin: origin.to_owned(),
            bytes: size as u64,
            cached: self.artifacts.is_some(),
        };
        let size = taskhost_core::units::format_size(note.bytes);
        if note.cached {
            tracing::info!("compiling {origin} ({size}), cached afterwards");
        } else {
            tracing::info!("compiling {origin} ({size}), without a compilation cache");
        }
        if let Some(hook) = &self.on_slow_compile {
            (hook.0)(&note);
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, cache::PluginCache> {
        self.plugins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the cached plugin with this digest (attempts holding it go on;
    /// a later load compiles it again). True if it was cached.
    pub fn forget(&self, digest: &Digest) -> bool {
        self.cache().forget(digest)
    }

    /// The cached plugin with this digest, if loaded (marked as used).
    pub fn plugin(&self, digest: &Digest) -> Option<Arc<Plugin>> {
        let plugin = self.cache().get(digest);
        if plugin.is_some() {
            self.stats
                .cache_hits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        plugin
    }

    /// What this runtime has counted about its plugin cache.
    pub fn stats(&self) -> &RuntimeStats {
        &self.stats
    }

    /// Whether the plugin with this digest is in the cache.
    pub fn is_cached(&self, digest: &Digest) -> bool {
        self.cache().contains(digest)
    }

    /// Bytes of plugins in the cache, counted by compiled image size.
    pub fn cached_bytes(&self) -> u64 {
        self.cache().bytes()
    }

    /// Creates a fresh store and instance for one attempt (the step before
    /// an attempt's timeout starts). Stop signals apply from here on.
    pub async fn prepare_attempt(
        &self,
        plugin: &Plugin,
        request: &AttemptRequest,
        signals: &StopSignals,
    ) -> Result<PreparedAttempt, AttemptError> {
        let store = attempt::new_store(
            &self.engine,
            &self.env,
            request,
            Some(plugin.digest()),
            plugin.info().kind,
            signals,
            None,
        )?;
        attempt::instantiate(plugin.pre(), store, signals, &self.reaper).await
    }

    /// [`Runtime::prepare_attempt`] of a replay: its own world (`env`, no
    /// grants but the record's) and its tape.
    pub(crate) async fn prepare_replay(
        &self,
        plugin: &Plugin,
        request: &AttemptRequest,
        env: &attempt::AttemptEnv,
        signals: &StopSignals,
        setup: &attempt::ReplaySetup,
    ) -> Result<PreparedAttempt, AttemptError> {
        let store = attempt::new_store(
            &self.engine,
            env,
            request,
            Some(plugin.digest()),
            plugin.info().kind,
            signals,
            Some(setup),
        )?;
        attempt::instantiate(plugin.pre(), store, signals, &self.reaper).await
    }

    /// Runs one attempt in a fresh instance. Returns when the instance is
    /// gone. Stop it cooperatively with `signals.cancel()`, by force with
    /// `signals.abort()` (it traps at its next epoch tick), or by dropping
    /// the future (the instance is dropped with it).
    pub async fn run_attempt(
        &self,
        plugin: &Plugin,
        request: &AttemptRequest,
        signals: &StopSignals,
    ) -> Result<Vec<u8>, AttemptError> {
        let prepared = self.prepare_attempt(plugin, request, signals).await?;
        prepared.run(&request.input).await
    }
}
