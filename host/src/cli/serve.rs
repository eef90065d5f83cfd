//! `host serve`: the daemon's flags and settings (a flag wins over the TOML
//! file, which wins over the default), and running it in the foreground.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use taskhost::daemon::{
    Client, DaemonConfig, default_state_dir, default_worker_threads, serve, socket,
};
use taskhost::units::{parse_duration, parse_size};

use super::args::SocketArg;
use super::exit::{ExitError, usage};

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Where the store (taskhost.db), uploaded plugins, the compilation cache and daemon.log live [default: $XDG_STATE_HOME/taskhost, else ~/.local/state/taskhost].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A TOML file with settings (keys: state_dir, store, node_name, lease, lease_renew, cluster_poll, cluster_notify, retain_finished, retain_for, retain_bytes, keep_unused_plugins, plugin_cache, worker_threads, http, http_token_file, tls_cert, tls_key, http_allow_plain, idempotency_retention, http_allow_hosts, http_max_connections, http_max_streams, http_header_timeout, otlp, grace, max_concurrent, max_slot_queue, max_total_pending, max_delayed, max_schedules, max_parked, max_descendants, max_depth, max_memory, memory_ceiling, max_handles, max_open_files, max_http_requests, max_header_bytes, epoch_tick, max_connections, pool_instances, event_lane_capacity, allow_http, allow_dirs, allow_env, kv_max_bucket, kv_max_total, allow_kv, and the tables secrets (dir, env) and config_vars); flags win over it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Grace for running tasks on shutdown and cancel [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    grace: Option<Duration>,
    /// Most attempts running at once [default: 256].
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// Pending submissions per slot [default: 100].
    #[arg(long, value_name = "N")]
    max_slot_queue: Option<usize>,
    /// Pending submissions over all slots [default: 10000].
    #[arg(long, value_name = "N")]
    max_total_pending: Option<usize>,
    /// Delayed submissions (--delay, --at) waiting for their time at once; past it a delayed submission is rejected (ResourceLimit) [default: 100000].
    #[arg(long, value_name = "N")]
    max_delayed: Option<usize>,
    /// Schedules the daemon (in a cluster: the cluster) holds; past it `host schedule add` is refused [default: 100000].
    #[arg(long, value_name = "N")]
    max_schedules: Option<usize>,
    /// Parent tasks (tasks that started children) at once. A parent waiting for a child gives its --max-concurrent permit back (parked), so that a tree makes progress under any --max-concurrent; its instance stays, and counts against the pool. Past it a spawn of a new parent is refused [default: 256].
    #[arg(long, value_name = "N")]
    max_parked: Option<usize>,
    /// Unfinished descendants of one root task at once (children, their children, …); past it a spawn in that tree is refused [default: 10000].
    #[arg(long, value_name = "N")]
    max_descendants: Option<usize>,
    /// How deep a tree of child tasks may go (a submitted task's children are at depth 1); a spawn deeper is refused [default: 16].
    #[arg(long, value_name = "N")]
    max_depth: Option<u32>,
    /// Default memory limit of a guest, all its linear memories together [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// The most memory a submission's --max-memory may ask for; a submission asking for more is refused (exit 2), and --max-memory must be within it too [default: 4GiB] [TOML: memory_ceiling].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_ceiling: Option<u64>,
    #[command(flatten)]
    limits: super::args::GuestLimitArgs,
    /// Instance slots of the pooling allocator; attempts running at once never exceed it (below 16: the on-demand allocator). Each slot reserves about 8 GiB of address space (not memory): the default fits up to about 12,000 within x86-64's 128 TiB, fewer under ulimit -v or a low vm.max_map_count (5 mappings a slot). --max-concurrent is cut to the slots less 8, or, on demand, to the instances the process can map; the log says so at start [default: --max-concurrent plus --max-parked plus 8, at least 1000].
    #[arg(long, value_name = "N")]
    pool_instances: Option<u32>,
    /// Epoch tick: the granularity of interruption [default: 10ms].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    epoch_tick: Option<Duration>,
    /// Log format on stderr (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Where accepted work is kept: `sqlite` (a file under the state directory; survives a crash), `sqlite:PATH`, `postgres://USER@HOST/DB` (cluster mode: every node with the same database shares the slots; see docs/cluster.md), or `memory` (lost when the daemon stops) [default: sqlite].
    #[arg(long, value_name = "STORE")]
    store: Option<String>,
    /// Most finished tasks whose reports and logs are kept [default: 10000].
    #[arg(long, value_name = "N")]
    retain_finished: Option<usize>,
    /// Most bytes of finished tasks' outputs and logs kept, in memory and in the store each; past it the oldest finished tasks are forgotten first, as past --retain-finished [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    retain_bytes: Option<u64>,
    /// How long finished tasks' reports and logs are kept [default: 7d].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    retain_for: Option<Duration>,
    /// How long an uploaded plugin no task uses (none unfinished, none finished and retained) is kept before it is deleted; collection runs at start and every minute. `host plugins prune` deletes unused ones at once [default: 1h].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    keep_unused_plugins: Option<Duration>,
    /// Most compiled plugins kept in memory, counted by the size of their compiled images (about twice the component for Python and JavaScript), such as --plugin-cache 512MiB; the least recently used are dropped first and compiled again when needed [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    plugin_cache: Option<u64>,
    /// Threads of the daemon's async runtime: they run the connections, the supervisor and the guests [default: one per available core].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,
    /// The most outbound HTTP a submission may be granted (repeatable; same forms as submit --allow-http): each --allow-http of a submission must lie within one of these, or the submission is refused. Replaces the config file's allow_http. Without any, no submission may reach anything [default: none].
    #[arg(long = "allow-http", value_name = "[http://]HOST[:PORT]", value_parser = super::args::parse_allow_http)]
    allow_http: Vec<taskhost::runtime::HttpAllow>,
    /// The directories a submission's --dir grants must lie within (repeatable; PATH, or PATH:ro to allow only read-only grants under it), compared once symbolic links and `..` are resolved. A cluster node checks the tasks it claims too, whoever recorded them: one that asks for more ends failed with the reason. Replaces the config file's allow_dirs [default: any directory on one daemon, none on a cluster node].
    #[arg(long = "allow-dir", value_name = "PATH[:ro]", value_parser = taskhost::daemon::config::DirAllow::parse)]
    allow_dir: Vec<taskhost::daemon::config::DirAllow>,
    /// The environment variables a submission's --env may set (repeatable): a name, a prefix ending in `*` such as APP_*, or `*` for any. Replaces the config file's allow_env [default: any].
    #[arg(long = "allow-env", value_name = "NAME", value_parser = parse_allow_env)]
    allow_env: Vec<String>,
    /// A private directory (yours, mode 0700) holding one file per secret, named by the secret, such as API_KEY; a submission's --secret API_KEY or --env-secret VAR=API_KEY gives its guest the file's text (one final newline removed) as an environment variable, read when each attempt starts, so a changed file counts from the next attempt. Values are never stored, logged or shown. Replaces the config file's secrets.dir [default: none].
    #[arg(long = "secrets-dir", value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
    /// A variable of this daemon's environment that is a secret of the same name (repeatable), such as --secret-env API_KEY; it must be set when the daemon starts. Replaces the config file's secrets.env [default: none].
    #[arg(long = "secret-env", value_name = "NAME", value_parser = parse_secret_name)]
    secret_env: Vec<String>,
    /// A configuration value every guest reads through wasi:config/store unless its submission sets the key with --config-var (repeatable), such as --config-var region=eu. Replaces the config file's config_vars table [default: none].
    #[arg(long = "config-var", value_name = "K=V", value_parser = super::args::parse_config_var)]
    config_vars: Vec<(String, String)>,
    /// Bytes of keys and values one key-value bucket (a slot's, or a shared one) may hold; a guest's write past it fails with an error naming it [default: 16MiB].
    #[arg(long = "kv-max-bucket", value_name = "SIZE", value_parser = parse_size)]
    kv_max_bucket: Option<u64>,
    /// Bytes of keys and values all key-value buckets together may hold; the daemon keeps them in memory too [default: 256MiB].
    #[arg(long = "kv-max-total", value_name = "SIZE", value_parser = parse_size)]
    kv_max_total: Option<u64>,
    /// A shared key-value bucket a submission's --kv may grant (repeatable). Replaces the config file's allow_kv [default: none].
    #[arg(long = "allow-kv", value_name = "BUCKET", value_parser = parse_bucket)]
    allow_kv: Vec<String>,
    /// Cluster mode (with `--store postgres://…`): this node's name in `host ps` [default: <hostname>-<pid>].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Cluster mode: how long this node's lease lasts without renewal; a node silent for longer is taken over by the others [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    lease: Option<Duration>,
    /// Cluster mode: how often this node renews its lease and looks for expired ones; less than three quarters of --lease, after which a node with no successful renewal stops its attempts (fences itself) [default: 1s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    lease_renew: Option<Duration>,
    /// Cluster mode: how often this node polls for work, stops and outcomes in case a notification was missed [default: 1s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    cluster_poll: Option<Duration>,
    /// Cluster mode: send and hear no LISTEN/NOTIFY notifications, only poll (to test the fallback; slower).
    #[arg(long)]
    no_notify: bool,
    /// Serve metrics (/metrics), a JSON API and a live dashboard (/) over HTTP on this address, e.g. 127.0.0.1:9100 (port 0: any free port; the log says which). Every request but the dashboard page needs a bearer token: --http-token-file's, or on a loopback address without it the daemon's own, kept in <state dir>/http-token (the log gives the dashboard's URL with it). Without --http there is no HTTP listener at all. Any address but a loopback one needs --http-token-file, and TLS (--tls-cert, --tls-key) or --http-allow-plain [TOML: http].
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// A file of the tokens HTTP requests carry (`Authorization: Bearer <token>`; the dashboard asks for it): one `SCOPE TOKEN` per line, SCOPE one of read (lists, logs, events, metrics), submit (also submit, wait, rerun) or admin (everything: cancel, remove, shutdown); a bare token line is admin. Only its owner may read it. Needed to bind a non-loopback --http address [default: the daemon's own admin token, in <state dir>/http-token] [TOML: http_token_file].
    #[arg(long, value_name = "FILE")]
    http_token_file: Option<PathBuf>,
    /// The HTTP listener's TLS certificate chain, PEM (with --tls-key: the listener speaks only HTTPS; both files are reloaded on SIGHUP or when they change) [TOML: tls_cert].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM [TOML: tls_key].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback --http address (when a TLS proxy in front terminates TLS); without it such an address needs --tls-cert and --tls-key [TOML: http_allow_plain].
    #[arg(long)]
    http_allow_plain: bool,
    /// How long an idempotency key (`host submit --idempotency-key`) gives back the task it first made [default: 24h] [TOML: idempotency_retention].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    idempotency_retention: Option<Duration>,
    /// Also answer HTTP requests whose Host is NAME, with or without the port (NAME:PORT: that port only), e.g. the name a TLS proxy in front reaches the listener by (repeatable; replaces the config file's list). Answered always: on a loopback bind, localhost and loopback addresses with the port; on another, localhost and IP addresses with the port and this machine's hostname. Others get 421 [TOML: http_allow_hosts].
    #[arg(long = "http-allow-host", value_name = "NAME[:PORT]", value_parser = parse_allow_host)]
    http_allow_hosts: Vec<String>,
    /// Most HTTP connections open at once; one more takes the place of the one idle the longest (no request with a valid token under way), which is closed, and is closed itself only when every one is serving such a request (each logged at most once a second) [default: 64] [TOML: http_max_connections].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    http_max_connections: Option<u32>,
    /// Most /api/events streams (dashboards, followers) open at once; one more is answered 503 [default: 16] [TOML: http_max_streams].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    http_max_streams: Option<u32>,
    /// How long an HTTP client has to send a request's header, from the connection's start or its previous answer (so also how long an idle keep-alive connection stays open); a slower one is disconnected (at least 100ms) [default: 10s] [TOML: http_header_timeout].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    http_header_timeout: Option<Duration>,
    #[command(flatten)]
    otlp: super::args::OtlpArg,
    /// Start the daemon in the background and return once its socket
    /// accepts connections; its logs go to <state dir>/daemon.log.
    #[arg(long)]
    detach: bool,
}

/// How `host serve` writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl ServeArgs {
    /// The settings: defaults, then the file, then the flags.
    /// The async runtime's worker threads this daemon asks for (the flag,
    /// else the file, else one per core); a bad file is reported later by
    /// `serve_cmd`.
    pub fn worker_threads(&self) -> usize {
        self.config()
            .map_or_else(|_| default_worker_threads(), |c| c.worker_threads)
    }

    /// The OTLP collector this daemon exports traces to (the flag, else
    /// the file); a bad file is reported later by `serve_cmd`.
    pub fn otlp(&self) -> Option<String> {
        self.otlp
            .otlp
            .clone()
            .or_else(|| self.config().ok().and_then(|c| c.otlp))
    }

    fn config(&self) -> anyhow::Result<DaemonConfig> {
        // Without a default (no HOME), --state-dir or the file must say.
        let default = default_state_dir();
        let mut config = DaemonConfig::with_state_dir(default.clone().unwrap_or_default());
        if let Some(file) = &self.config {
            config.apply_file(file).map_err(usage)?;
        }
        if let Some(v) = &self.state_dir {
            config.state_dir = v.clone();
        }
        if let Some(v) = self.grace {
            config.grace = v;
        }
        if let Some(v) = self.max_concurrent {
            config.max_concurrent = v.max(1);
        }
        if let Some(v) = self.max_slot_queue {
            config.max_slot_queue = v;
        }
        if let Some(v) = self.max_total_pending {
            config.max_total_pending = v;
        }
        if let Some(v) = self.max_delayed {
            config.max_delayed = v;
        }
        if let Some(v) = self.max_parked {
            config.max_parked = v;
        }
        if let Some(v) = self.max_descendants {
            config.max_descendants = v;
        }
        if let Some(v) = self.max_depth {
            config.max_depth = v;
        }
        if let Some(v) = self.max_schedules {
            config.max_schedules = v;
        }
        if let Some(v) = self.max_memory {
            if v < 64 << 10 {
                return Err(usage(
                    "--max-memory must be at least 64KiB (one WebAssembly page)",
                ));
            }
            config.max_memory = v;
        }
        if let Some(v) = self.memory_ceiling {
            config.memory_ceiling = v;
        }
        let limits = self.limits.apply(config.guest_limits());
        config.max_handles = limits.max_handles;
        config.max_open_files = limits.max_open_files;
        config.max_http_requests = limits.max_http_requests;
        config.max_header_bytes = limits.max_header_bytes;
        if let Some(v) = self.pool_instances {
            config.pool_instances = Some(v);
        }
        if let Some(v) = &self.store {
            config.store = v.clone();
        }
        if let Some(v) = self.retain_finished {
            config.retain_finished = v;
        }
        if let Some(v) = self.retain_for {
            config.retain_for = v;
        }
        if let Some(v) = self.retain_bytes {
            config.retain_bytes = v;
        }
        if let Some(v) = self.keep_unused_plugins {
            config.keep_unused_plugins = v;
        }
        if let Some(v) = self.worker_threads {
            config.worker_threads = usize::from(v);
        }
        if !self.allow_http.is_empty() {
            config.allow_http = self.allow_http.clone();
        }
        if !self.allow_dir.is_empty() {
            config.allow_dirs = Some(self.allow_dir.clone());
        }
        if !self.allow_env.is_empty() {
            config.allow_env = Some(self.allow_env.clone());
        }
        if let Some(dir) = &self.secrets_dir {
            config.secrets_dir = Some(dir.clone());
        }
        if let Some(v) = self.kv_max_bucket {
            config.kv_max_bucket = v;
        }
        if let Some(v) = self.kv_max_total {
            config.kv_max_total = v;
        }
        if !self.allow_kv.is_empty() {
            config.allow_kv = self.allow_kv.clone();
        }
        if !self.config_vars.is_empty() {
            config.config_vars = self.config_vars.clone();
        }
        if !self.secret_env.is_empty() {
            config.secret_env = self.secret_env.clone();
        }
        if let Some(v) = &self.node_name {
            config.cluster.node_name = Some(v.clone());
        }
        if let Some(v) = self.lease {
            config.cluster.lease = v;
        }
        if let Some(v) = self.lease_renew {
            config.cluster.renew = v;
        }
        if let Some(v) = self.cluster_poll {
            if v.is_zero() {
                return Err(usage("--cluster-poll must be more than zero"));
            }
            config.cluster.poll = v;
        }
        if self.no_notify {
            config.cluster.notify = false;
        }
        if let Some(v) = self.plugin_cache {
            config.plugin_cache = v;
        }
        if let Some(v) = self.http {
            config.http = Some(v);
        }
        if let Some(v) = &self.http_token_file {
            config.http_token_file = Some(v.clone());
        }
        if let Some(v) = &self.tls_cert {
            config.tls_cert = Some(v.clone());
        }
        if let Some(v) = &self.tls_key {
            config.tls_key = Some(v.clone());
        }
        if self.http_allow_plain {
            config.http_allow_plain = true;
        }
        if let Some(v) = self.idempotency_retention {
            config.idempotency_retention = v;
        }
        if !self.http_allow_hosts.is_empty() {
            config.http_allow_hosts = self.http_allow_hosts.clone();
        }
        if let Some(v) = self.http_max_connections {
            config.http_max_connections = v as usize;
        }
        if let Some(v) = self.http_max_streams {
            config.http_max_streams = v as usize;
        }
        if let Some(v) = self.http_header_timeout {
            config.http_header_timeout = v;
        }
        if let Some(v) = self.epoch_tick {
            if v < Duration::from_millis(1) {
                return Err(usage("--epoch-tick must be at least 1ms"));
            }
            config.epoch_tick = v;
        }
        if config.state_dir.as_os_str().is_empty() {
            return Err(usage(default.err().unwrap_or_default()));
        }
        config.check().map_err(usage)?;
        // A bad --store is a usage error, found before anything starts.
        taskhost::daemon::store::StoreSpec::parse(&config.store, &config.state_dir)
            .map_err(usage)?;
        // A relative state directory would change meaning with the working
        // directory (and disables wasmtime's cache): fix it now.
        config.state_dir = std::path::absolute(&config.state_dir).map_err(|e| {
            usage(format!(
                "cannot use the state directory `{}`: {e}",
                config.state_dir.display()
            ))
        })?;
        Ok(config)
    }
}

pub async fn serve_cmd(args: ServeArgs, socket_flag: Option<PathBuf>) -> anyhow::Result<u8> {
    // Everything the daemon creates (state directory, store, log, plugins,
    // compiled code, socket) is its user's alone.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let config = args.config()?;
    let socket_path = socket::resolve(args.socket.socket.as_deref().or(socket_flag.as_deref()));
    if args.detach {
        return detach(&socket_path, &config.state_dir).await;
    }
    let announce = socket_path.clone();
    serve(socket_path, config, move || {
        eprintln!("taskhost daemon listening on {}", announce.display());
        notify_systemd("READY=1");
    })
    .await
    .map_err(|e| ExitError::error(1, e.to_string()))?;
    notify_systemd("STOPPING=1");
    Ok(0)
}

/// `--http-allow-host`: a host name or IP literal, optionally with a port.
fn parse_allow_host(text: &str) -> Result<String, String> {
    taskhost::daemon::config::check_allow_host(text).map(|()| text.to_owned())
}

/// How long `serve --detach` waits for the daemon to accept connections.
const DETACH_PATIENCE: Duration = Duration::from_secs(60);

/// The size past which `serve --detach` starts a new `daemon.log`.
const LOG_ROTATE_BYTES: u64 = 16 << 20;

/// `serve --detach`: runs this same command line without `--detach` as a
/// background process of its own process group (a Ctrl-C in this terminal
/// does not reach it), its output appended to `<state dir>/daemon.log`, and
/// returns once its socket accepts a connection, or with the log's tail if
/// it exits first.
async fn detach(socket_path: &Path, state_dir: &Path) -> anyhow::Result<u8> {
    use std::os::unix::process::CommandExt;

    taskhost::daemon::state_dir::prepare(state_dir).map_err(usage)?;
    let log_path = state_dir.join("daemon.log");
    // Bounded: a log past LOG_ROTATE_BYTES becomes daemon.log.1 (replacing
    // the one before) when the next daemon starts.
    if std::fs::metadata(&log_path).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
        let _ = std::fs::rename(&log_path, state_dir.join("daemon.log.1"));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| usage(format!("cannot open `{}`: {e}", log_path.display())))?;
    let log_len = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe()
        .map_err(|e| ExitError::error(1, format!("cannot find this program: {e}")))?;
    let args: Vec<_> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let mut child = std::process::Command::new(exe)
        .args(&args)
        // The child must not see a socket it should not notify.
        .env_remove("NOTIFY_SOCKET")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| ExitError::error(1, format!("cannot start the daemon: {e}")))?;
    let started = std::time::Instant::now();
    loop {
        // Only our child's answer counts: another daemon (or another
        // user's socket) answering there is not the one we started.
        if let Ok(client) = Client::connect(socket_path).await
            && client.daemon_pid() == Some(child.id())
        {
            drop(client);
            eprintln!(
                "taskhost daemon started (pid {}), listening on {}; logs in {}",
                child.id(),
                socket_path.display(),
                log_path.display()
            );
            return Ok(0);
        }
        if let Some(status) = child.try_wait()? {
            let tail = std::fs::read(&log_path)
                .map(|b| String::from_utf8_lossy(&b[log_len as usize..]).into_owned())
                .unwrap_or_default();
            return Err(ExitError::error(
                1,
                format!(
                    "the daemon exited ({status}) before it listened; its log ({}):\n{}",
                    log_path.display(),
                    tail.trim_end()
                ),
            ));
        }
        if started.elapsed() > DETACH_PATIENCE {
            return Err(ExitError::error(
                1,
                format!(
                    "the daemon (pid {}) did not accept connections on {} within {DETACH_PATIENCE:?}; see {}",
                    child.id(),
                    socket_path.display(),
                    log_path.display()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tells systemd (a `Type=notify` unit) about the daemon's state, when it
/// runs under one: a datagram to `$NOTIFY_SOCKET` (a path, or an abstract
/// name starting with `@`). Without the variable, nothing happens.
fn notify_systemd(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};

    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    let addr = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&target),
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let addr = addr?;
        socket.send_to_addr(
            format!("{state}\nMAINPID={}\n", std::process::id()).as_bytes(),
            &addr,
        )
    });
    if let Err(err) = sent {
        tracing::warn!("cannot notify systemd at {target}: {err}");
    }
}

fn parse_bucket(text: &str) -> Result<String, String> {
    taskhost::runtime::kv::check_bucket_name(text).map(|()| text.to_owned())
}

fn parse_secret_name(text: &str) -> Result<String, String> {
    taskhost::runtime::check_secret_name(text)
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

fn parse_allow_env(text: &str) -> Result<String, String> {
    taskhost::daemon::config::check_env_pattern(text).map(|()| text.to_owned())
}
