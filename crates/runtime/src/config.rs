//! Owns the settings of a runtime ([`RuntimeConfig`]): each with its
//! default and the builder method that documents it, the compile-slowness
//! hook ([`SlowCompile`]), and the default directory of the compilation
//! cache. Carrying them out is the business of `engine` (the allocator),
//! `ticker` (the tick), `artifacts` and `cache` (the caches), and of the
//! attempts (caps, secrets, config values, buckets, child tasks).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::children::{ChildHandle, ChildTasks};
use super::engine::{AllocatorChoice, DEFAULT_POOL_INSTANCES};
use super::kv::{KvBackend, KvHandle};
use super::limits::GuestLimits;
use super::secrets::Secrets;
use super::ticker::DEFAULT_EPOCH_TICK;

/// Settings of the wasm runtime: start from the default and change what you
/// need.
///
/// ```
/// use std::time::Duration;
/// use taskhost_runtime::{AllocatorChoice, RuntimeConfig};
///
/// let config = RuntimeConfig::default()
///     .cache_dir(None)
///     .epoch_tick(Duration::from_millis(5))
///     .allocator(AllocatorChoice::OnDemand);
/// ```
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub(crate) cache_dir: Option<PathBuf>,
    pub(crate) epoch_tick: Duration,
    pub(crate) allocator: AllocatorChoice,
    pub(crate) pool_instances: u32,
    pub(crate) plugin_cache_bytes: Option<u64>,
    pub(crate) on_slow_compile: Option<SlowCompileHook>,
    pub(crate) compile_nice: Option<i32>,
    pub(crate) guest_limits: GuestLimits,
    pub(crate) secrets: Secrets,
    pub(crate) config: Vec<(String, String)>,
    pub(crate) kv: Option<KvHandle>,
    pub(crate) children: Option<ChildHandle>,
    pub(crate) inline_loads: bool,
    pub(crate) realtime_ticker: bool,
}

/// A compile that has taken longer than [`SLOW_COMPILE`] so far, as told to
/// [`RuntimeConfig::on_slow_compile`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SlowCompile {
    /// Where the bytes came from (a path, or a digest in the daemon).
    pub origin: String,
    /// Size of the component in bytes.
    pub bytes: u64,
    /// Whether the result goes to the on-disk cache (so the next process
    /// loads it in milliseconds).
    pub cached: bool,
}

/// How long a compile runs before it is reported: a cache hit of even the
/// largest plugins takes a fraction of this, a compile of a Python or
/// JavaScript component several times it.
pub const SLOW_COMPILE: Duration = Duration::from_secs(1);

/// The callback of [`RuntimeConfig::on_slow_compile`].
#[derive(Clone)]
pub(crate) struct SlowCompileHook(pub(crate) Arc<dyn Fn(&SlowCompile) + Send + Sync>);

impl std::fmt::Debug for SlowCompileHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlowCompileHook")
    }
}

impl RuntimeConfig {
    /// Directory of compiled plugins on disk, so the next process maps
    /// them in instead of compiling; `None` disables it [default:
    /// [`default_cache_dir`]]. It is created owner-only when missing, and
    /// not used (with a warning) when another user owns it or may write to
    /// it. A relative path is made absolute against the current directory.
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir.map(|d| std::path::absolute(&d).unwrap_or(d));
        self
    }

    /// Most bytes of compiled plugins kept in memory, counted by the size of
    /// their compiled images ([`Plugin::compiled_size`](super::Plugin::compiled_size),
    /// about twice the component for Python and JavaScript); the least
    /// recently used go first, and a plugin bigger than the bound alone is
    /// still kept. `None` keeps every plugin [default: `None`].
    pub fn plugin_cache_bytes(mut self, bytes: Option<u64>) -> Self {
        self.plugin_cache_bytes = bytes;
        self
    }

    /// Called (once, from the async runtime) when compiling a plugin has
    /// taken [`SLOW_COMPILE`] and is still going, so that a front end can
    /// say why nothing happens; the runtime also logs it at `info`
    /// [default: none].
    pub fn on_slow_compile(mut self, hook: impl Fn(&SlowCompile) + Send + Sync + 'static) -> Self {
        self.on_slow_compile = Some(SlowCompileHook(Arc::new(hook)));
        self
    }

    /// Interval of the epoch ticker: the granularity of interruption,
    /// timeouts of spinning guests and force-abort (at least 1 ms)
    /// [default: 10 ms].
    pub fn epoch_tick(mut self, tick: Duration) -> Self {
        self.epoch_tick = tick.max(Duration::from_millis(1));
        self
    }

    /// Ask for real-time priority (`SCHED_FIFO`, the lowest) for the epoch
    /// ticker's thread, which sleeps but for microseconds per tick. At
    /// normal priority, when spinning guests hold every core, the woken
    /// ticker can wait for one until the kernel's next scheduler tick (4 ms
    /// at 250 Hz), and a force-abort or the timeout of a spinning guest is
    /// that late. It needs `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` of at least
    /// 1; without them the ticker runs at normal priority
    /// ([`Runtime::realtime_ticker`](super::Runtime::realtime_ticker) says
    /// which) [default: `true`].
    pub fn realtime_ticker(mut self, ask: bool) -> Self {
        self.realtime_ticker = ask;
        self
    }

    /// Instance allocation strategy [default: pooling when possible].
    pub fn allocator(mut self, choice: AllocatorChoice) -> Self {
        self.allocator = choice;
        self
    }

    /// Read plugin files and map their compiled artifacts on the calling
    /// thread instead of the async runtime's blocking pool. For a process
    /// that runs one task and has nothing else to do meanwhile (`host run`)
    /// it saves starting a thread; elsewhere it stalls the other tasks of
    /// that worker for the length of a load. Compiles still run off the
    /// async runtime [default: `false`].
    pub fn inline_loads(mut self, inline: bool) -> Self {
        self.inline_loads = inline;
        self
    }

    /// Compile plugins at a lower CPU priority: each compile runs on a thread
    /// of its own whose nice value is raised by `nice` (Linux: nice values
    /// are per thread), and so are the threads of rayon's global pool, on
    /// which wasmtime compiles functions in parallel, if this runtime is the
    /// first to start that pool. A compile then takes the cores only when
    /// running tasks leave them idle [default: `None`, the caller's
    /// priority, on a blocking thread of the async runtime].
    pub fn compile_nice(mut self, nice: Option<i32>) -> Self {
        self.compile_nice = nice;
        self
    }

    /// What each attempt's guest may hold in the host at once: WASI
    /// handles, open files, outbound HTTP requests in flight, header bytes
    /// [default: [`GuestLimits::default`](super::GuestLimits)]. Each must be
    /// at least 1 ([`Runtime::new`](super::Runtime::new) refuses a zero).
    pub fn guest_limits(mut self, limits: GuestLimits) -> Self {
        self.guest_limits = limits;
        self
    }

    /// Where the secrets tasks name (`Sandbox::secrets`) are looked up when
    /// each attempt starts [default: none, so an attempt naming one fails].
    pub fn secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// The values `wasi:config/store` answers every guest, unless its task
    /// sets the same key ([`Sandbox::config`](super::Sandbox::config))
    /// [default: none].
    pub fn config(mut self, values: Vec<(String, String)>) -> Self {
        self.config = values;
        self
    }

    /// Where the `wasi:keyvalue` buckets of guests live: `open("")` gives
    /// a task's slot's, a granted name (`Sandbox::kv`) a shared one
    /// [default: none, so `open` fails saying there is no state here].
    pub fn key_value(mut self, backend: Arc<dyn KvBackend>) -> Self {
        self.kv = Some(KvHandle(backend));
        self
    }

    /// Where guests' child tasks are submitted and waited for
    /// (`taskhost:plugin/children`) [default: none, so a spawn fails saying
    /// there is no controller here].
    pub fn child_tasks(mut self, backend: Arc<dyn ChildTasks>) -> Self {
        self.children = Some(ChildHandle(backend));
        self
    }

    /// Instance slots of the pooling allocator, an upper bound on instances
    /// alive at once when pooling [default: 1000].
    pub fn pool_instances(mut self, n: u32) -> Self {
        self.pool_instances = n;
        self
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            epoch_tick: DEFAULT_EPOCH_TICK,
            allocator: AllocatorChoice::Auto,
            pool_instances: DEFAULT_POOL_INSTANCES,
            plugin_cache_bytes: None,
            on_slow_compile: None,
            compile_nice: None,
            guest_limits: GuestLimits::default(),
            secrets: Secrets::none(
                "this runtime has no secrets; give it a source with RuntimeConfig::secrets",
            ),
            config: Vec::new(),
            kv: None,
            children: None,
            inline_loads: false,
            realtime_ticker: true,
        }
    }
}

/// The per-user default directory of the compilation cache:
/// `$XDG_CACHE_HOME/taskhost/wasmtime`, else `~/.cache/taskhost/wasmtime`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("taskhost").join("wasmtime"))
}
