//! Owns the daemon's settings: their defaults, the optional TOML file, and
//! which wins (a flag over the file over the default).

use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use taskhost_core::units::{format_size, parse_duration, parse_size};
use taskhost_runtime::{DEFAULT_EPOCH_TICK, DEFAULT_MAX_MEMORY, GuestLimits, HttpAllow};

/// The daemon's default grace for running tasks at shutdown (shorter than
/// the supervisor's 60 s default: an interactive daemon should stop fast).
pub const DEFAULT_DAEMON_GRACE: Duration = Duration::from_secs(10);

/// The default of [`DaemonConfig::retain_bytes`]: 256 MiB.
pub const DEFAULT_RETAIN_BYTES: u64 = 256 << 20;

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
    /// Most finished tasks whose reports and logs are kept.
    pub retain_finished: usize,
    /// How long finished tasks' reports and logs are kept.
    pub retain_for: Duration,
    /// Most bytes of finished tasks' outputs and logs kept, in memory and
    /// in the store each (the oldest go first).
    pub retain_bytes: u64,
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
}

/// The default number of the daemon's async worker threads: one per
/// available core.
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl DaemonConfig {
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
            retain_finished: 10_000,
            retain_for: Duration::from_secs(7 * 24 * 3600),
            retain_bytes: DEFAULT_RETAIN_BYTES,
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

    /// Applies a TOML file's settings over these.
    pub fn apply_file(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config `{}`: {e}", path.display()))?;
        let file: FileConfig = toml::from_str(&text)
            .map_err(|e| format!("invalid config `{}`: {e}", path.display()))?;
        let dur = |v: &str, key: &str| parse_duration(v).map_err(|e| format!("{key}: {e}"));
        if let Some(v) = file.state_dir {
            self.state_dir = v;
        }
        if let Some(v) = file.grace {
            self.grace = dur(&v, "grace")?;
        }
        if let Some(v) = file.max_concurrent {
            self.max_concurrent = v;
        }
        if let Some(v) = file.max_slot_queue {
            self.max_slot_queue = v;
        }
        if let Some(v) = file.max_total_pending {
            self.max_total_pending = v;
        }
        if let Some(v) = file.max_delayed {
            self.max_delayed = v;
        }
        if let Some(v) = file.max_schedules {
            self.max_schedules = v;
        }
        if let Some(v) = file.max_parked {
            self.max_parked = v;
        }
        if let Some(v) = file.max_descendants {
            self.max_descendants = v;
        }
        if let Some(v) = file.max_depth {
            self.max_depth = v;
        }
        if let Some(v) = file.max_memory {
            self.max_memory = parse_size(&v).map_err(|e| format!("max_memory: {e}"))?;
            if self.max_memory < 64 << 10 {
                return Err("max_memory: must be at least 64KiB (one WebAssembly page)".into());
            }
        }
        if let Some(v) = file.memory_ceiling {
            self.memory_ceiling = parse_size(&v).map_err(|e| format!("memory_ceiling: {e}"))?;
        }
        if let Some(v) = file.max_handles {
            self.max_handles = v;
        }
        if let Some(v) = file.max_open_files {
            self.max_open_files = v;
        }
        if let Some(v) = file.max_http_requests {
            self.max_http_requests = v;
        }
        if let Some(v) = file.max_header_bytes {
            let bytes = parse_size(&v).map_err(|e| format!("max_header_bytes: {e}"))?;
            self.max_header_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(v) = file.epoch_tick {
            self.epoch_tick = dur(&v, "epoch_tick")?;
            if self.epoch_tick < Duration::from_millis(1) {
                return Err("epoch_tick: must be at least 1ms".into());
            }
        }
        if let Some(v) = file.max_connections {
            self.max_connections = v;
        }
        if let Some(v) = file.pool_instances {
            self.pool_instances = Some(v);
        }
        if let Some(v) = file.event_lane_capacity {
            if v == 0 || v > 1 << 22 {
                return Err("event_lane_capacity: must be between 1 and 4194304".into());
            }
            self.event_lane_capacity = v;
        }
        if let Some(v) = file.store {
            self.store = v;
        }
        if let Some(v) = file.retain_finished {
            self.retain_finished = v;
        }
        if let Some(v) = file.retain_bytes {
            self.retain_bytes = parse_size(&v).map_err(|e| format!("retain_bytes: {e}"))?;
        }
        if let Some(v) = file.retain_for {
            self.retain_for = dur(&v, "retain_for")?;
        }
        if let Some(v) = file.plugin_cache {
            self.plugin_cache = parse_size(&v).map_err(|e| format!("plugin_cache: {e}"))?;
        }
        if let Some(v) = file.worker_threads {
            if v == 0 {
                return Err("worker_threads: must be at least 1".into());
            }
            self.worker_threads = v;
        }
        if let Some(v) = file.allow_http {
            self.allow_http = v
                .iter()
                .map(|text| HttpAllow::parse(text).map_err(|e| format!("allow_http: {e}")))
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = file.allow_dirs {
            self.allow_dirs = Some(
                v.iter()
                    .map(|text| DirAllow::parse(text).map_err(|e| format!("allow_dirs: {e}")))
                    .collect::<Result<_, _>>()?,
            );
        }
        if let Some(v) = file.allow_env {
            for name in &v {
                check_env_pattern(name).map_err(|e| format!("allow_env: {e}"))?;
            }
            self.allow_env = Some(v);
        }
        if let Some(v) = file.keep_unused_plugins {
            self.keep_unused_plugins = dur(&v, "keep_unused_plugins")?;
        }
        if let Some(v) = file.node_name {
            self.cluster.node_name = Some(v);
        }
        if let Some(v) = file.lease {
            self.cluster.lease = dur(&v, "lease")?;
        }
        if let Some(v) = file.lease_renew {
            self.cluster.renew = dur(&v, "lease_renew")?;
        }
        if let Some(v) = file.cluster_poll {
            self.cluster.poll = dur(&v, "cluster_poll")?;
        }
        if let Some(v) = file.cluster_notify {
            self.cluster.notify = v;
        }
        if let Some(v) = file.http {
            self.http =
                Some(v.parse().map_err(|e| {
                    format!("http: `{v}` is not an address like 127.0.0.1:9100: {e}")
                })?);
        }
        if let Some(v) = file.http_token_file {
            self.http_token_file = Some(v);
        }
        if let Some(v) = file.tls_cert {
            self.tls_cert = Some(v);
        }
        if let Some(v) = file.tls_key {
            self.tls_key = Some(v);
        }
        if let Some(v) = file.http_allow_plain {
            self.http_allow_plain = v;
        }
        if let Some(v) = file.idempotency_retention {
            self.idempotency_retention =
                parse_duration(&v).map_err(|e| format!("idempotency_retention: {e}"))?;
        }
        if let Some(v) = file.http_allow_hosts {
            self.http_allow_hosts = v
                .into_iter()
                .map(|name| check_allow_host(&name).map(|()| name))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("http_allow_hosts: {e}"))?;
        }
        if let Some(v) = file.http_max_connections {
            self.http_max_connections = v;
        }
        if let Some(v) = file.http_max_streams {
            self.http_max_streams = v;
        }
        if let Some(v) = file.http_header_timeout {
            self.http_header_timeout = dur(&v, "http_header_timeout")?;
        }
        if let Some(v) = file.secrets {
            if let Some(dir) = v.dir {
                self.secrets_dir = Some(dir);
            }
            if let Some(env) = v.env {
                for name in &env {
                    taskhost_runtime::check_secret_name(name)
                        .map_err(|e| format!("secrets.env: {e}"))?;
                }
                self.secret_env = env;
            }
        }
        if let Some(v) = file.kv_max_bucket {
            self.kv_max_bucket = parse_size(&v).map_err(|e| format!("kv_max_bucket: {e}"))?;
        }
        if let Some(v) = file.kv_max_total {
            self.kv_max_total = parse_size(&v).map_err(|e| format!("kv_max_total: {e}"))?;
        }
        if let Some(v) = file.allow_kv {
            for name in &v {
                taskhost_runtime::kv::check_bucket_name(name)
                    .map_err(|e| format!("allow_kv: {e}"))?;
            }
            self.allow_kv = v;
        }
        if let Some(v) = file.config_vars {
            self.config_vars = v.into_iter().collect();
        }
        if let Some(v) = file.otlp {
            self.otlp = Some(v);
        }
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
        Ok(())
    }
}

/// Checks one `http_allow_hosts` entry (`--http-allow-host`): a host name
/// or IP literal (IPv6 in brackets), optionally with `:PORT`.
pub fn check_allow_host(entry: &str) -> Result<(), String> {
    match Authority::parse(entry) {
        Some(_) => Ok(()),
        None => Err(format!(
            "`{entry}` is not a host name like taskhost.example.com or taskhost.example.com:9100 \
             (letters, digits, `-`, `.` and `_`; an IPv6 address in brackets)"
        )),
    }
}

/// The TOML file: every key optional; durations and sizes as strings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    state_dir: Option<PathBuf>,
    grace: Option<String>,
    max_concurrent: Option<usize>,
    max_slot_queue: Option<usize>,
    max_total_pending: Option<usize>,
    max_delayed: Option<usize>,
    max_schedules: Option<usize>,
    max_parked: Option<usize>,
    max_descendants: Option<usize>,
    max_depth: Option<u32>,
    max_memory: Option<String>,
    memory_ceiling: Option<String>,
    max_handles: Option<usize>,
    max_open_files: Option<usize>,
    max_http_requests: Option<usize>,
    max_header_bytes: Option<String>,
    epoch_tick: Option<String>,
    max_connections: Option<usize>,
    pool_instances: Option<u32>,
    event_lane_capacity: Option<usize>,
    store: Option<String>,
    retain_finished: Option<usize>,
    retain_for: Option<String>,
    retain_bytes: Option<String>,
    keep_unused_plugins: Option<String>,
    worker_threads: Option<usize>,
    plugin_cache: Option<String>,
    allow_http: Option<Vec<String>>,
    allow_dirs: Option<Vec<String>>,
    allow_env: Option<Vec<String>>,
    node_name: Option<String>,
    lease: Option<String>,
    lease_renew: Option<String>,
    cluster_poll: Option<String>,
    cluster_notify: Option<bool>,
    http: Option<String>,
    http_token_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    http_allow_plain: Option<bool>,
    idempotency_retention: Option<String>,
    http_allow_hosts: Option<Vec<String>>,
    http_max_connections: Option<usize>,
    http_max_streams: Option<usize>,
    http_header_timeout: Option<String>,
    otlp: Option<String>,
    secrets: Option<FileSecrets>,
    config_vars: Option<std::collections::BTreeMap<String, String>>,
    kv_max_bucket: Option<String>,
    kv_max_total: Option<String>,
    allow_kv: Option<Vec<String>>,
}

/// The TOML file's `secrets` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSecrets {
    dir: Option<PathBuf>,
    env: Option<Vec<String>>,
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

/// A directory under which submissions may be granted directories
/// (`host serve --allow-dir PATH[:ro]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirAllow {
    /// An absolute path on this host.
    pub path: std::path::PathBuf,
    /// Only read-only grants under it.
    pub read_only: bool,
}

impl DirAllow {
    /// Parses `PATH` or `PATH:ro`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (path, read_only) = match text.strip_suffix(":ro") {
            Some(path) => (path, true),
            None => (text, false),
        };
        let path = std::path::PathBuf::from(path);
        if !path.is_absolute() {
            return Err(format!(
                "invalid --allow-dir `{text}`: the directory must be an absolute path \
                 (PATH or PATH:ro)"
            ));
        }
        Ok(Self { path, read_only })
    }
}

impl std::fmt::Display for DirAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path.display())?;
        if self.read_only {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

/// Refuses an `--allow-env` entry that is not a name or a prefix with `*`.
pub fn check_env_pattern(text: &str) -> Result<(), String> {
    let name = text.strip_suffix('*').unwrap_or(text);
    if name.contains(['=', '*', '\0']) || (name.is_empty() && text != "*") {
        return Err(format!(
            "invalid --allow-env `{text}`: use a variable's name, a prefix ending in `*` \
             (APP_*), or `*` for any"
        ));
    }
    Ok(())
}

/// A node's cluster settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// This node's name in `host ps` [default: `<hostname>-<pid>`].
    pub node_name: Option<String>,
    /// How long a node's lease lasts without renewal.
    pub lease: Duration,
    /// How often a node renews it (and looks for expired ones).
    pub renew: Duration,
    /// How often a node polls for work, stops and outcomes, in case a
    /// notification was missed.
    pub poll: Duration,
    /// Whether nodes notify each other (LISTEN/NOTIFY); off only to test
    /// the polling fallback.
    pub notify: bool,
}

impl ClusterSettings {
    /// How long a node goes on without a successful renewal before it
    /// fences itself (stops its attempts, as if it had lost its lease): the
    /// lease less a quarter of it, counted by the node's own clock from the
    /// start of its last successful renewal. The quarter is the margin for
    /// the attempts to stop, and for the database's clock, before any other
    /// node may take the work over.
    pub fn fence_after(&self) -> Duration {
        self.lease - self.lease / 4
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            node_name: None,
            lease: Duration::from_secs(10),
            renew: Duration::from_secs(1),
            poll: Duration::from_secs(1),
            notify: true,
        }
    }
}

/// A `Host` value (or an allow-list entry) split into its name and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Authority<'a> {
    /// The name or IP literal (an IPv6 one with its brackets).
    pub(crate) name: &'a str,
    /// The port, when one is written.
    pub(crate) port: Option<u16>,
}

impl<'a> Authority<'a> {
    /// Splits `NAME`, `NAME:PORT`, `[IPv6]` or `[IPv6]:PORT`; `None` when
    /// it is none of those (an empty name, characters no host name has, a
    /// port that is not a number).
    pub(crate) fn parse(text: &'a str) -> Option<Self> {
        let (name, port) = if text.starts_with('[') {
            let end = text.find(']')?;
            let (name, after) = text.split_at(end + 1);
            name[1..name.len() - 1].parse::<Ipv6Addr>().ok()?;
            let port = match after {
                "" => None,
                rest => Some(rest.strip_prefix(':')?),
            };
            (name, port)
        } else {
            let (name, port) = match text.rsplit_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (text, None),
            };
            let fits = !name.is_empty()
                && name.len() <= 253
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
            if !fits {
                return None;
            }
            (name, port)
        };
        let port = match port {
            None => None,
            Some(digits) if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) => {
                Some(digits.parse().ok()?)
            }
            Some(_) => return None,
        };
        Some(Self { name, port })
    }

    /// The IP address this name writes, if it is an IP literal.
    pub(crate) fn ip(&self) -> Option<IpAddr> {
        match self.name.strip_prefix('[') {
            Some(v6) => v6
                .strip_suffix(']')?
                .parse::<Ipv6Addr>()
                .ok()
                .map(IpAddr::V6),
            None => self.name.parse().ok(),
        }
    }
}
