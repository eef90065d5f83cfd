//! Owns the daemon's settings: their defaults, the one [`Settings`] type
//! that both `host serve`'s flags and the optional TOML file fill, which
//! wins (a flag over the file over the default), and the checks of the
//! result ([`DaemonConfig`]).
//!
//! A new setting is a field of [`Settings`] (its flag, its key, its help),
//! a field of [`DaemonConfig`] with its default, and the line of
//! [`Settings::apply`] that carries it over.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | `DaemonConfig`: the settings in effect, their defaults and the checks between them |
//! | `settings` | `Settings`: each setting's flag, key and help; flags over the file; each value's own bounds |
//! | `file` | reading the TOML file: its strings into durations, sizes and grants, its errors |
//! | `grants` | the ceilings on a submission's directories and environment |
//! | `cluster` | a cluster node's settings: name, lease, polling |
//! | `authority` | a host name with an optional port: the `Host` header and `http_allow_hosts` |

use std::path::{Path, PathBuf};
use std::time::Duration;
use taskhost_core::slot_settings::{SlotRules, SlotSettings};

use taskhost_core::units::format_size;
use taskhost_runtime::{DEFAULT_EPOCH_TICK, DEFAULT_MAX_MEMORY, GuestLimits, HttpAllow};

mod authority;
mod cluster;
mod file;
mod grants;
mod settings;

pub(crate) use authority::Authority;
pub use authority::check_allow_host;
pub use cluster::ClusterSettings;
pub use file::{MAX_NAMESPACE_NAME, NamespaceEntry, check_namespace_name};
pub use grants::{DirAllow, check_env_pattern};
pub use settings::{
    Secrets, Settings, Source, parse_allow_http, parse_config_var, parse_count, parse_header_bytes,
};

/// The daemon's default grace for running tasks at shutdown (shorter than
/// the supervisor's 60 s default: an interactive daemon should stop fast).
pub const DEFAULT_DAEMON_GRACE: Duration = Duration::from_secs(10);

/// The default of [`DaemonConfig::retain_bytes`] with a durable store
/// (SQLite or PostgreSQL), where history costs disk: 4 GiB, a bound for a
/// week of work (finished tasks are kept [`DaemonConfig::retain_for`]).
pub const DEFAULT_RETAIN_BYTES: u64 = 4 << 30;
/// The default of [`DaemonConfig::retain_finished`] with a durable store:
/// a week at about 8 tasks a second.
pub const DEFAULT_RETAIN_FINISHED: usize = 5_000_000;
/// The defaults with the memory store, where history is the process's
/// memory: the newest 10,000 finished tasks, 256 MiB.
pub const MEMORY_RETAIN_FINISHED: usize = 10_000;
/// See [`MEMORY_RETAIN_FINISHED`].
pub const MEMORY_RETAIN_BYTES: u64 = 256 << 20;

/// How long an idempotency key gives back its task by default: a day.
pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The default most HTTP connections open at once (`http_max_connections`).
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 64;

/// The default most `/api/events` streams open at once (`http_max_streams`).
pub const DEFAULT_HTTP_MAX_STREAMS: usize = 16;

/// The default time an HTTP client has to send a request's header
/// (`http_header_timeout`).
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of [`DaemonConfig::max_parked`].
pub const DEFAULT_MAX_PARKED: usize = 256;

/// The default of [`DaemonConfig::max_descendants`].
pub const DEFAULT_MAX_DESCENDANTS: usize = 10_000;

/// The default of [`DaemonConfig::max_depth`].
pub const DEFAULT_MAX_DEPTH: u32 = 16;

/// The default of [`DaemonConfig::memory_ceiling`].
pub const DEFAULT_MEMORY_CEILING: u64 = 4 << 30;

/// Settings of `host serve`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DaemonConfig {
    /// Where plugins and the compilation cache live.
    pub state_dir: PathBuf,
    /// Grace for running tasks on shutdown and on cancel.
    pub grace: Duration,
    /// Most attempts running at once.
    pub max_concurrent: usize,
    /// Pending submissions per slot.
    pub max_slot_queue: usize,
    /// Pending submissions over all slots.
    pub max_total_pending: usize,
    /// Delayed submissions waiting for their time (`--delay`, `--at`).
    pub max_delayed: usize,
    /// Schedules one daemon (or cluster) holds.
    pub max_schedules: usize,
    /// Parent tasks with children at once (each may wait parked: its
    /// instance alive, its permit given back).
    pub max_parked: usize,
    /// Unfinished descendants of one root task at once.
    pub max_descendants: usize,
    /// How deep a tree of child tasks may go (a root's children are at 1).
    pub max_depth: u32,
    /// Default memory limit of a guest (all its linear memories together).
    pub max_memory: u64,
    /// Bytes of host calls each attempt's record keeps (the flight
    /// recorder); 0 records nothing.
    pub record_budget: u64,
    /// The most memory a submission's `--max-memory` may ask for; one
    /// asking for more is refused (and `max_memory` must not be above it).
    pub memory_ceiling: u64,
    /// WASI resource handles each attempt's guest may hold at once.
    pub max_handles: usize,
    /// Open files and directories each attempt's guest may hold at once.
    pub max_open_files: usize,
    /// Outbound HTTP requests each attempt may have in flight.
    pub max_http_requests: usize,
    /// Bytes of one set of HTTP header fields of a guest.
    pub max_header_bytes: usize,
    /// Epoch tick of the runtime.
    pub epoch_tick: Duration,
    /// Most client connections at once.
    pub max_connections: usize,
    /// Instance slots of the pooling allocator (below 16: on-demand);
    /// `None`: enough for `max_concurrent` attempts (at least
    /// [`taskhost_runtime::DEFAULT_POOL_INSTANCES`]), as far as the address space allows.
    pub pool_instances: Option<u32>,
    /// Undelivered events each event reader (`host events --follow`) may
    /// fall behind before it loses the oldest.
    pub event_lane_capacity: usize,
    /// Where accepted work is kept: `sqlite` (a file under the state
    /// directory), `sqlite:PATH` or `memory`.
    pub store: String,
    /// Most finished tasks whose reports and logs are kept (`None`: the
    /// store's default, see [`DaemonConfig::retention`]).
    pub retain_finished: Option<usize>,
    /// How long finished tasks' reports and logs are kept.
    pub retain_for: Duration,
    /// Most bytes of finished tasks' outputs and logs kept, in memory and
    /// in the store each (the oldest go first; `None`: the store's
    /// default).
    pub retain_bytes: Option<u64>,
    /// How long a stored plugin no task uses is kept before it is collected.
    pub keep_unused_plugins: Duration,
    /// Most bytes of compiled plugins kept in memory (by compiled image size).
    pub plugin_cache: u64,
    /// Threads of the daemon's async runtime (at least 1). `host serve`
    /// builds its runtime with them; a caller of [`serve`](super::serve)
    /// runs it on a runtime of its own.
    pub worker_threads: usize,
    /// The most outbound HTTP any submission may be granted: each of its
    /// `--allow-http` grants must be covered by one of these. Empty (the
    /// default): no submission may reach anything.
    pub allow_http: Vec<HttpAllow>,
    /// The directories a submission's `--dir` grants must lie within (a
    /// read-only one admits only read-only grants). `None` (the default):
    /// any directory on one daemon, none on a cluster node, which also
    /// runs what other nodes (or anyone who can write the database)
    /// recorded.
    pub allow_dirs: Option<Vec<DirAllow>>,
    /// The environment variables a submission's `--env` may set: names,
    /// or prefixes ending in `*`. `None` (the default): any.
    pub allow_env: Option<Vec<String>>,
    /// Cluster mode (a `postgres://` store): this node's name, lease and
    /// polling.
    pub cluster: ClusterSettings,
    /// Where the HTTP listener (metrics, JSON API, dashboard) binds; `None`:
    /// no listener. Anything but a loopback address needs
    /// [`http_token_file`](Self::http_token_file).
    pub http: Option<std::net::SocketAddr>,
    /// A file holding the bearer token every HTTP endpoint but the
    /// dashboard page requires. Without it a loopback listener makes its
    /// own, kept in `<state dir>/http-token`.
    pub http_token_file: Option<PathBuf>,
    /// The HTTP listener's TLS certificate chain (PEM); with
    /// [`tls_key`](Self::tls_key) the listener speaks only HTTPS, and
    /// reloads both on SIGHUP or when the files change.
    pub tls_cert: Option<PathBuf>,
    /// The private key of [`tls_cert`](Self::tls_cert) (PEM).
    pub tls_key: Option<PathBuf>,
    /// How long an idempotency key gives back the task it first made
    /// (`--idempotency-retention`).
    pub idempotency_retention: Duration,
    /// Serve plain HTTP on a non-loopback address (behind a TLS proxy, say);
    /// without it such an address needs TLS.
    pub http_allow_plain: bool,
    /// Host names, besides the loopback names (loopback binds) or IP
    /// literals and this machine's hostname (other binds), that the HTTP
    /// listener answers to (`NAME` or `NAME:PORT`); requests naming any
    /// other `Host` get 421.
    pub http_allow_hosts: Vec<String>,
    /// Most HTTP connections open at once; a connection over it is closed
    /// as soon as it is accepted.
    pub http_max_connections: usize,
    /// Most `/api/events` streams open at once; one more is answered 503.
    pub http_max_streams: usize,
    /// How long an HTTP client has to send a request's header, counted
    /// from the connection's start or the previous answer (so it is also
    /// how long an idle keep-alive connection stays open).
    pub http_header_timeout: Duration,
    /// An OTLP/HTTP collector's base URL for trace spans (the `host`
    /// binary installs the exporter before the daemon starts; the daemon
    /// itself only emits `tracing` spans).
    pub otlp: Option<String>,
    /// A private directory (the daemon's user's, mode 0700) with one file
    /// per secret, named by the secret; read when an attempt that names
    /// the secret starts.
    pub secrets_dir: Option<PathBuf>,
    /// Variables of the daemon's own environment that are secrets of the
    /// same name (each must be set when the daemon starts).
    pub secret_env: Vec<String>,
    /// What `wasi:config/store` answers every guest, unless its submission
    /// sets the key (`--config-var`).
    pub config_vars: Vec<(String, String)>,
    /// Bytes (keys and values) one `wasi:keyvalue` bucket may hold.
    pub kv_max_bucket: u64,
    /// Bytes all buckets together may hold (and the daemon keeps in
    /// memory).
    pub kv_max_total: u64,
    /// The shared buckets a submission's `--kv` may grant (none by default).
    pub allow_kv: Vec<String>,
    /// The slot rules of the file (`[slots."PATTERN"]`), laid over the
    /// stored ones at each start.
    pub slot_rules: Vec<(String, SlotSettings)>,
    /// The config file's namespaces (`[namespaces.NAME]`), over the
    /// stored ones at every start.
    pub namespaces: Vec<(String, NamespaceEntry)>,
}

/// The default number of the daemon's async worker threads: one per
/// available core.
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl DaemonConfig {
    /// The most finished tasks kept and their bytes: as set, else the
    /// defaults of the store (a week's bounds with a durable store, the
    /// newest 10,000 with the memory store).
    pub fn retention(&self) -> (usize, u64) {
        let memory = self.store == "memory";
        let finished = self.retain_finished.unwrap_or(if memory {
            MEMORY_RETAIN_FINISHED
        } else {
            DEFAULT_RETAIN_FINISHED
        });
        let bytes = self.retain_bytes.unwrap_or(if memory {
            MEMORY_RETAIN_BYTES
        } else {
            DEFAULT_RETAIN_BYTES
        });
        (finished, bytes)
    }

    /// Defaults with this state directory.
    pub fn with_state_dir(state_dir: PathBuf) -> Self {
        Self {
            state_dir,
            grace: DEFAULT_DAEMON_GRACE,
            max_concurrent: 256,
            max_slot_queue: 100,
            max_total_pending: 10_000,
            max_delayed: taskhost_core::controller::DEFAULT_MAX_DELAYED,
            max_schedules: 100_000,
            max_parked: DEFAULT_MAX_PARKED,
            max_descendants: DEFAULT_MAX_DESCENDANTS,
            max_depth: DEFAULT_MAX_DEPTH,
            max_memory: DEFAULT_MAX_MEMORY,
            record_budget: taskhost_runtime::record::DEFAULT_RECORD_BUDGET as u64,
            memory_ceiling: DEFAULT_MEMORY_CEILING,
            max_handles: taskhost_runtime::DEFAULT_MAX_HANDLES,
            max_open_files: taskhost_runtime::DEFAULT_MAX_OPEN_FILES,
            max_http_requests: taskhost_runtime::DEFAULT_MAX_HTTP_REQUESTS,
            max_header_bytes: taskhost_runtime::DEFAULT_MAX_HEADER_BYTES,
            epoch_tick: DEFAULT_EPOCH_TICK,
            max_connections: 256,
            pool_instances: None,
            event_lane_capacity: 4096,
            store: "sqlite".into(),
            retain_finished: None,
            retain_for: Duration::from_secs(7 * 24 * 3600),
            retain_bytes: None,
            keep_unused_plugins: Duration::from_secs(3600),
            worker_threads: default_worker_threads(),
            plugin_cache: 256 << 20,
            allow_http: Vec::new(),
            allow_dirs: None,
            allow_env: None,
            cluster: ClusterSettings::default(),
            http: None,
            http_token_file: None,
            tls_cert: None,
            tls_key: None,
            http_allow_plain: false,
            idempotency_retention: DEFAULT_IDEMPOTENCY_RETENTION,
            http_allow_hosts: Vec::new(),
            http_max_connections: DEFAULT_HTTP_MAX_CONNECTIONS,
            http_max_streams: DEFAULT_HTTP_MAX_STREAMS,
            http_header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            otlp: None,
            secrets_dir: None,
            secret_env: Vec::new(),
            config_vars: Vec::new(),
            kv_max_bucket: taskhost_runtime::kv::DEFAULT_KV_MAX_BUCKET,
            kv_max_total: taskhost_runtime::kv::DEFAULT_KV_MAX_TOTAL,
            allow_kv: Vec::new(),
            slot_rules: Vec::new(),
            namespaces: Vec::new(),
        }
    }

    /// The caps every attempt's guest runs under.
    pub fn guest_limits(&self) -> GuestLimits {
        let mut limits = GuestLimits::default();
        limits.max_handles = self.max_handles;
        limits.max_open_files = self.max_open_files;
        limits.max_http_requests = self.max_http_requests;
        limits.max_header_bytes = self.max_header_bytes;
        limits
    }

    /// Checks the guest settings against each other: the caps are at
    /// least 1 and `max_memory` is within `memory_ceiling`.
    fn check_guest(&self) -> Result<(), String> {
        self.guest_limits().check().map_err(|e| e.to_string())?;
        if self.max_memory > self.memory_ceiling {
            return Err(format!(
                "max_memory ({}) is above memory_ceiling ({}): lower --max-memory or raise \
                 --memory-ceiling",
                format_size(self.max_memory),
                format_size(self.memory_ceiling)
            ));
        }
        Ok(())
    }

    /// Applies a TOML file's settings over these, then checks the whole
    /// (as [`Settings::over`] and [`check`](Self::check) do for `host
    /// serve`, with no flags).
    pub fn apply_file(&mut self, path: &Path) -> Result<(), String> {
        let file = Settings::from_file(path)?;
        *self = Settings::default().over(file, self.clone())?;
        self.check()
    }

    /// Checks the settings that have a lower bound, and the guest settings
    /// against each other (the CLI calls it after applying its flags too).
    pub fn check(&self) -> Result<(), String> {
        self.check_guest()?;
        if self.max_connections == 0 {
            return Err("max_connections: must be at least 1".into());
        }
        if self.http_max_connections == 0 {
            return Err("http_max_connections (--http-max-connections): must be at least 1".into());
        }
        if self.http_max_streams == 0 {
            return Err("http_max_streams (--http-max-streams): must be at least 1".into());
        }
        if self.http_header_timeout < Duration::from_millis(100) {
            return Err(
                "http_header_timeout (--http-header-timeout): must be at least 100ms".into(),
            );
        }
        let mut rules = SlotRules::default();
        for (pattern, settings) in &self.slot_rules {
            rules
                .set(pattern, *settings)
                .map_err(|e| format!("slots.\"{pattern}\": {e}"))?;
        }
        for (name, entry) in &self.namespaces {
            entry
                .check(name)
                .map_err(|e| format!("namespaces.{name}: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_rejects_unknown_keys() {
        let dir = std::env::temp_dir().join(format!("taskhost-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("host.toml");
        std::fs::write(
            &path,
            "grace = \"2s\"\nmax_concurrent = 8\nmax_memory = \"64MiB\"\npool_instances = 64\nevent_lane_capacity = 100000\nhttp = \"127.0.0.1:9100\"\nhttp_token_file = \"/etc/taskhost/token\"\n",
        )
        .unwrap();
        let mut config = DaemonConfig::with_state_dir(dir.clone());
        config.apply_file(&path).unwrap();
        assert_eq!(config.grace, Duration::from_secs(2));
        assert_eq!(config.max_concurrent, 8);
        assert_eq!(config.max_memory, 64 << 20);
        assert_eq!(config.pool_instances, Some(64));
        assert_eq!(config.event_lane_capacity, 100_000);
        std::fs::write(
            &path,
            "allow_http = [\"*.example.com\", \"http://127.0.0.1:8080\"]\n",
        )
        .unwrap();
        config.apply_file(&path).unwrap();
        let shown: Vec<String> = config.allow_http.iter().map(|a| a.to_string()).collect();
        assert_eq!(shown, ["*.example.com", "http://127.0.0.1:8080"]);
        std::fs::write(&path, "allow_http = [\"ftp://x\"]\n").unwrap();
        let err = config.apply_file(&path).unwrap_err();
        assert!(
            err.starts_with("allow_http: invalid --allow-http `ftp://x`"),
            "{err}"
        );
        assert_eq!(config.http, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(
            config.http_token_file.as_deref(),
            Some(Path::new("/etc/taskhost/token"))
        );
        std::fs::write(&path, "http = \"localhost\"\n").unwrap();
        let err = config.apply_file(&path).unwrap_err();
        assert!(
            err.contains("is not an address like 127.0.0.1:9100"),
            "{err}"
        );
        assert_eq!(config.http_max_connections, DEFAULT_HTTP_MAX_CONNECTIONS);
        assert_eq!(config.http_max_streams, DEFAULT_HTTP_MAX_STREAMS);
        assert_eq!(config.http_header_timeout, DEFAULT_HTTP_HEADER_TIMEOUT);
        std::fs::write(
            &path,
            "http_allow_hosts = [\"dash.example.com\", \"[::1]:9100\"]\nhttp_max_connections = 8\nhttp_max_streams = 2\nhttp_header_timeout = \"1s\"\n",
        )
        .unwrap();
        config.apply_file(&path).unwrap();
        assert_eq!(config.http_allow_hosts, ["dash.example.com", "[::1]:9100"]);
        assert_eq!(config.http_max_connections, 8);
        assert_eq!(config.http_max_streams, 2);
        assert_eq!(config.http_header_timeout, Duration::from_secs(1));
        std::fs::write(&path, "http_allow_hosts = [\"evil/x\"]\n").unwrap();
        let err = config.apply_file(&path).unwrap_err();
        assert!(
            err.starts_with("http_allow_hosts: `evil/x` is not a host name"),
            "{err}"
        );
        std::fs::write(&path, "http_max_streams = 0\n").unwrap();
        let err = config.apply_file(&path).unwrap_err();
        assert!(err.contains("http_max_streams"), "{err}");
        std::fs::write(
            &path,
            "http_max_streams = 1\nhttp_header_timeout = \"10ms\"\n",
        )
        .unwrap();
        let err = config.apply_file(&path).unwrap_err();
        assert!(err.contains("at least 100ms"), "{err}");
        std::fs::write(&path, "graec = \"2s\"\n").unwrap();
        let err = config.apply_file(&path).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn guest_limits_and_the_memory_ceiling_come_from_the_file() {
        let dir = tempfile_dir("limits");
        let path = dir.join("host.toml");
        std::fs::write(
            &path,
            "max_handles = 500\nmax_open_files = 20\nmax_http_requests = 3\n\
             max_header_bytes = \"8KiB\"\nmemory_ceiling = \"1GiB\"\n",
        )
        .unwrap();
        let mut config = DaemonConfig::with_state_dir(dir.clone());
        assert_eq!(config.memory_ceiling, 4 << 30);
        config.apply_file(&path).unwrap();
        let limits = config.guest_limits();
        assert_eq!(
            (
                limits.max_handles,
                limits.max_open_files,
                limits.max_http_requests,
                limits.max_header_bytes
            ),
            (500, 20, 3, 8 << 10)
        );
        assert_eq!(config.memory_ceiling, 1 << 30);
        assert_eq!(config.check(), Ok(()));
        config.max_memory = 2 << 30;
        assert_eq!(
            config.check().unwrap_err(),
            "max_memory (2GiB) is above memory_ceiling (1GiB): lower --max-memory or raise \
             --memory-ceiling"
        );
        config.max_memory = 64 << 20;
        config.max_open_files = 0;
        assert_eq!(
            config.check().unwrap_err(),
            "max_open_files must be at least 1"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir(what: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("taskhost-config-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
