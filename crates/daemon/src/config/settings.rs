//! Owns [`Settings`]: every setting of `host serve` once, with its flag
//! (clap fills it from the command line), its key in the TOML file (serde
//! fills it from there, see `file`), and its help. Each is optional: a
//! setting nobody gave keeps what is beneath it. [`Settings::over`] lays
//! the flags over the file over the defaults; each source's values are
//! checked on their own first (a message names the flag or the key), the
//! result as a whole once by [`DaemonConfig::check`].
//!
//! The fields are in the order of `host serve --help`; the file's keys are
//! the fields' names (`secrets` is a table).

// The fields' docs are `host serve --help`, written for a terminal.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;
use serde::Deserialize;

use taskhost_core::units::{parse_duration, parse_size};
use taskhost_runtime::HttpAllow;

use super::file;
use super::{DaemonConfig, DirAllow};

// Its rustdoc only under `cfg(doc)`: clap would take a doc comment for the
// about of the verb that flattens it (`host serve`).
#[cfg_attr(
    doc,
    doc = "The settings a `host serve` command line or its TOML file gives; unset ones are `None`."
)]
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Settings {
    /// Where the store (taskhost.db), uploaded plugins, the compilation cache and daemon.log live [default: $XDG_STATE_HOME/taskhost, else ~/.local/state/taskhost].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Grace for running tasks on shutdown and cancel [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub grace: Option<Duration>,
    /// Most attempts running at once [default: 256].
    #[arg(long, value_name = "N", value_parser = parse_concurrency)]
    pub max_concurrent: Option<usize>,
    /// Pending submissions per slot [default: 100].
    #[arg(long, value_name = "N")]
    pub max_slot_queue: Option<usize>,
    /// Pending submissions over all slots [default: 10000].
    #[arg(long, value_name = "N")]
    pub max_total_pending: Option<usize>,
    /// Delayed submissions (--delay, --at) waiting for their time at once; past it a delayed submission is rejected (ResourceLimit) [default: 100000].
    #[arg(long, value_name = "N")]
    pub max_delayed: Option<usize>,
    /// Schedules the daemon (in a cluster: the cluster) holds; past it `host schedule add` is refused [default: 100000].
    #[arg(long, value_name = "N")]
    pub max_schedules: Option<usize>,
    /// Parent tasks (tasks that started children) at once. A parent waiting for a child gives its --max-concurrent permit back (parked), so that a tree makes progress under any --max-concurrent; its instance stays, and counts against the pool. Past it a spawn of a new parent is refused [default: 256].
    #[arg(long, value_name = "N")]
    pub max_parked: Option<usize>,
    /// Unfinished descendants of one root task at once (children, their children, …); past it a spawn in that tree is refused [default: 10000].
    #[arg(long, value_name = "N")]
    pub max_descendants: Option<usize>,
    /// How deep a tree of child tasks may go (a submitted task's children are at depth 1); a spawn deeper is refused [default: 16].
    #[arg(long, value_name = "N")]
    pub max_depth: Option<u32>,
    /// Default memory limit of a guest, all its linear memories together [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub max_memory: Option<u64>,
    /// Bytes of host calls each attempt's record keeps (the flight recorder: the answers a guest got, for `host replay ID` and `host record export`); past it the record is marked truncated and the attempt goes on unaffected. 0 records nothing (a submission's --no-record records nothing of its own) [default: 1MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub record_budget: Option<u64>,
    /// The most memory a submission's --max-memory may ask for; a submission asking for more is refused (exit 2), and --max-memory must be within it too [default: 4GiB] [TOML: memory_ceiling].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub memory_ceiling: Option<u64>,
    /// Most WASI handles each attempt's guest may hold at once: open files and directories, streams, pollables, HTTP requests, responses and header sets. Past it the guest traps and the attempt fails, naming this flag [default: 4096; daemon TOML: max_handles].
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub max_handles: Option<usize>,
    /// Most open files and directories each attempt's guest may hold at once (each one a descriptor of this process; preopened directories count). Past it an open fails with the WASI error `quota` and the task's log says why; at most --max-handles in effect [default: 256; daemon TOML: max_open_files].
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub max_open_files: Option<usize>,
    /// Most outbound HTTP requests each attempt may have in flight (until its response, body and connection are gone). Past it a request fails with `connection-limit-reached` [default: 16; daemon TOML: max_http_requests].
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub max_http_requests: Option<usize>,
    /// Largest set of HTTP header fields a guest may build, as wasmtime counts it (names and values plus about 60 bytes each), such as 64KiB. Past it the guest traps [default: 32KiB; daemon TOML: max_header_bytes].
    #[arg(long, value_name = "SIZE", value_parser = parse_header_bytes)]
    #[serde(default, deserialize_with = "file::size_usize")]
    pub max_header_bytes: Option<usize>,
    /// Most client connections at once (the file only).
    #[arg(skip)]
    pub max_connections: Option<usize>,
    /// Instance slots of the pooling allocator; attempts running at once never exceed it (below 16: the on-demand allocator). Each slot reserves about 8 GiB of address space (not memory): the default fits up to about 12,000 within x86-64's 128 TiB, fewer under ulimit -v or a low vm.max_map_count (5 mappings a slot). --max-concurrent is cut to the slots less 8, or, on demand, to the instances the process can map; the log says so at start [default: --max-concurrent plus --max-parked plus 8, at least 1000].
    #[arg(long, value_name = "N")]
    pub pool_instances: Option<u32>,
    /// Undelivered events each event reader may fall behind before it
    /// loses the oldest (the file only).
    #[arg(skip)]
    pub event_lane_capacity: Option<usize>,
    /// Epoch tick: the granularity of interruption [default: 10ms].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub epoch_tick: Option<Duration>,
    /// Where accepted work is kept: `sqlite` (a file under the state directory; survives a crash), `sqlite:PATH`, `postgres://USER@HOST/DB` (cluster mode: every node with the same database shares the slots; see docs/cluster.md), or `memory` (lost when the daemon stops) [default: sqlite].
    #[arg(long, value_name = "STORE")]
    pub store: Option<String>,
    /// Most finished tasks whose reports and logs are kept; with a durable store the daemon's memory holds only the newest 1,000 and the store the rest [default: 5000000, with --store memory 10000].
    #[arg(long, value_name = "N")]
    pub retain_finished: Option<usize>,
    /// Most bytes of finished tasks' outputs and logs kept; past it the oldest finished tasks are forgotten first, as past --retain-finished [default: 4GiB, with --store memory 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub retain_bytes: Option<u64>,
    /// How long finished tasks' reports and logs are kept [default: 7d].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub retain_for: Option<Duration>,
    /// How long an uploaded plugin no task uses (none unfinished, none finished and retained) is kept before it is deleted; collection runs at start and every minute. `host plugins prune` deletes unused ones at once [default: 1h].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub keep_unused_plugins: Option<Duration>,
    /// Most compiled plugins kept in memory, counted by the size of their compiled images (about twice the component for Python and JavaScript), such as --plugin-cache 512MiB; the least recently used are dropped first and compiled again when needed [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub plugin_cache: Option<u64>,
    /// Threads of the daemon's async runtime: they run the connections, the supervisor and the guests [default: one per available core].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub worker_threads: Option<usize>,
    /// The most outbound HTTP a submission may be granted (repeatable; same forms as submit --allow-http): each --allow-http of a submission must lie within one of these, or the submission is refused. Replaces the config file's allow_http. Without any, no submission may reach anything [default: none].
    #[arg(long = "allow-http", value_name = "[http://]HOST[:PORT]", value_parser = parse_allow_http)]
    #[serde(default, deserialize_with = "file::allow_http")]
    pub allow_http: Option<Vec<HttpAllow>>,
    /// The directories a submission's --dir grants must lie within (repeatable; PATH, or PATH:ro to allow only read-only grants under it), compared once symbolic links and `..` are resolved. A cluster node checks the tasks it claims too, whoever recorded them: one that asks for more ends failed with the reason. Replaces the config file's allow_dirs [default: any directory on one daemon, none on a cluster node].
    #[arg(long = "allow-dir", value_name = "PATH[:ro]", value_parser = DirAllow::parse)]
    #[serde(default, deserialize_with = "file::allow_dirs")]
    pub allow_dirs: Option<Vec<DirAllow>>,
    /// The environment variables a submission's --env may set (repeatable): a name, a prefix ending in `*` such as APP_*, or `*` for any. Replaces the config file's allow_env [default: any].
    #[arg(long = "allow-env", value_name = "NAME", value_parser = parse_allow_env)]
    #[serde(default, deserialize_with = "file::allow_env")]
    pub allow_env: Option<Vec<String>>,
    /// The secrets: a directory of them, and variables of the daemon's
    /// environment (the file's `secrets` table).
    #[command(flatten)]
    #[serde(default)]
    pub secrets: Secrets,
    /// A configuration value every guest reads through wasi:config/store unless its submission sets the key with --config-var (repeatable), such as --config-var region=eu. Replaces the config file's config_vars table [default: none].
    #[arg(long = "config-var", value_name = "K=V", value_parser = parse_config_var)]
    #[serde(default, deserialize_with = "file::table")]
    pub config_vars: Option<Vec<(String, String)>>,
    /// The slot rules the daemon starts with (the file's `slots` table only, such as `[slots."db/*"]` with `capacity = 4`, `max_queue`, `debounce = "2s"`, `max_wait`); each replaces the stored rule of its pattern at every start.
    #[arg(skip)]
    #[serde(default)]
    pub slots: Option<BTreeMap<String, file::SlotRule>>,
    /// The namespaces the daemon starts with (the file's `namespaces` table only, such as `[namespaces.alpha]` with `weight = 2`, `max_running`, `max_waiting`, `max_schedules`, `max_submit_rate`, `max_descendants`, `memory_ceiling = "256MiB"`, `max_kv_bytes = "16MiB"`, `secrets = ["DEPLOY_KEY"]`); each replaces the stored namespace of its name at every start. One host's: a cluster's live in its database (`host ns`).
    #[arg(skip)]
    #[serde(default)]
    pub namespaces: Option<BTreeMap<String, file::NamespaceEntry>>,
    /// Bytes of keys and values one key-value bucket (a slot's, or a shared one) may hold; a guest's write past it fails with an error naming it [default: 16MiB].
    #[arg(long = "kv-max-bucket", value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub kv_max_bucket: Option<u64>,
    /// Bytes of keys and values all key-value buckets together may hold; the daemon keeps them in memory too [default: 256MiB].
    #[arg(long = "kv-max-total", value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "file::size")]
    pub kv_max_total: Option<u64>,
    /// A shared key-value bucket a submission's --kv may grant (repeatable). Replaces the config file's allow_kv [default: none].
    #[arg(long = "allow-kv", value_name = "BUCKET", value_parser = parse_bucket)]
    #[serde(default, deserialize_with = "file::buckets")]
    pub allow_kv: Option<Vec<String>>,
    /// Cluster mode (with `--store postgres://…`): this node's name in `host ps` [default: <hostname>-<pid>].
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Cluster mode: how long this node's lease lasts without renewal; a node silent for longer is taken over by the others [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub lease: Option<Duration>,
    /// Cluster mode: how often this node renews its lease and looks for expired ones; less than three quarters of --lease, after which a node with no successful renewal stops its attempts (fences itself) [default: 1s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub lease_renew: Option<Duration>,
    /// Cluster mode: how often this node polls for work, stops and outcomes in case a notification was missed [default: 1s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub cluster_poll: Option<Duration>,
    /// Cluster mode: send and hear no LISTEN/NOTIFY notifications, only poll (to test the fallback; slower).
    #[arg(long = "no-notify", num_args = 0, default_missing_value = "false")]
    pub cluster_notify: Option<bool>,
    /// Serve metrics (/metrics), a JSON API and a live dashboard (/) over HTTP on this address, e.g. 127.0.0.1:9100 (port 0: any free port; the log says which). Every request but the dashboard page needs a bearer token: --http-token-file's, or on a loopback address without it the daemon's own, kept in <state dir>/http-token (the log gives the dashboard's URL with it). Without --http there is no HTTP listener at all. Any address but a loopback one needs --http-token-file, and TLS (--tls-cert, --tls-key) or --http-allow-plain [TOML: http].
    #[arg(long, value_name = "ADDR")]
    #[serde(default, deserialize_with = "file::address")]
    pub http: Option<std::net::SocketAddr>,
    /// A file of the tokens HTTP requests carry (`Authorization: Bearer <token>`; the dashboard asks for it): one `SCOPE TOKEN` per line, SCOPE one of read (lists, logs, events, metrics), submit (also submit, wait, rerun) or admin (everything: cancel, remove, shutdown); a bare token line is admin. Only its owner may read it. Needed to bind a non-loopback --http address [default: the daemon's own admin token, in <state dir>/http-token] [TOML: http_token_file].
    #[arg(long, value_name = "FILE")]
    pub http_token_file: Option<PathBuf>,
    /// The HTTP listener's TLS certificate chain, PEM (with --tls-key: the listener speaks only HTTPS; both files are reloaded on SIGHUP or when they change) [TOML: tls_cert].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM [TOML: tls_key].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback --http address (when a TLS proxy in front terminates TLS); without it such an address needs --tls-cert and --tls-key [TOML: http_allow_plain].
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub http_allow_plain: Option<bool>,
    /// How long an idempotency key (`host submit --idempotency-key`) gives back the task it first made [default: 24h] [TOML: idempotency_retention].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub idempotency_retention: Option<Duration>,
    /// Also answer HTTP requests whose Host is NAME, with or without the port (NAME:PORT: that port only), e.g. the name a TLS proxy in front reaches the listener by (repeatable; replaces the config file's list). Answered always: on a loopback bind, localhost and loopback addresses with the port; on another, localhost and IP addresses with the port and this machine's hostname. Others get 421 [TOML: http_allow_hosts].
    #[arg(long = "http-allow-host", value_name = "NAME[:PORT]", value_parser = parse_allow_host)]
    #[serde(default, deserialize_with = "file::allow_hosts")]
    pub http_allow_hosts: Option<Vec<String>>,
    /// Most HTTP connections open at once; one more takes the place of the one idle the longest (no request with a valid token under way), which is closed, and is closed itself only when every one is serving such a request (each logged at most once a second) [default: 64] [TOML: http_max_connections].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub http_max_connections: Option<usize>,
    /// Most /api/events streams (dashboards, followers) open at once; one more is answered 503 [default: 16] [TOML: http_max_streams].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub http_max_streams: Option<usize>,
    /// How long an HTTP client has to send a request's header, from the connection's start or its previous answer (so also how long an idle keep-alive connection stays open); a slower one is disconnected (at least 100ms) [default: 10s] [TOML: http_header_timeout].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "file::duration")]
    pub http_header_timeout: Option<Duration>,
    /// Export a trace per task (a span per task and per attempt, with the task's id, name and slot, the plugin's digest, the attempt's number, result and outcome) over OTLP/HTTP with protobuf to this collector, such as http://127.0.0.1:4318 (spans go to its /v1/traces). The standard OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT do the same; without any of them nothing is exported [TOML: otlp].
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

// Its rustdoc only under `cfg(doc)`, as for `Settings`.
#[cfg_attr(
    doc,
    doc = "The secrets (the file's `secrets` table; `--secrets-dir`, `--secret-env`)."
)]
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Secrets {
    /// A private directory (yours, mode 0700) holding one file per secret, named by the secret, such as API_KEY; a submission's --secret API_KEY or --env-secret VAR=API_KEY gives its guest the file's text (one final newline removed) as an environment variable, read when each attempt starts, so a changed file counts from the next attempt. Values are never stored, logged or shown. Replaces the config file's secrets.dir [default: none].
    #[arg(long = "secrets-dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// A variable of this daemon's environment that is a secret of the same name (repeatable), such as --secret-env API_KEY; it must be set when the daemon starts. Replaces the config file's secrets.env [default: none].
    #[arg(long = "secret-env", value_name = "NAME", value_parser = parse_secret_name)]
    #[serde(default, deserialize_with = "file::secret_names")]
    pub env: Option<Vec<String>>,
}

/// Where a [`Settings`] came from, which its messages name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The command line: a message names the flag (`--max-memory`).
    Flags,
    /// The TOML file: a message names the key (`max_memory:`).
    File,
}

impl Settings {
    /// These settings (the flags) over `file`'s over `beneath` (the
    /// defaults): a setting given here wins, else the file's, else the
    /// one beneath. Each source's values are checked on their own first,
    /// the file's before the flags'; the result as a whole is left to
    /// [`DaemonConfig::check`].
    pub fn over(self, file: Settings, beneath: DaemonConfig) -> Result<DaemonConfig, String> {
        file.check(Source::File)?;
        self.check(Source::Flags)?;
        let mut config = beneath;
        file.apply(&mut config);
        self.apply(&mut config);
        Ok(config)
    }

    /// Checks the values that have bounds of their own (the bounds between
    /// settings are [`DaemonConfig::check`]'s).
    pub fn check(&self, source: Source) -> Result<(), String> {
        let refuse = |key: &str, why: &str| match source {
            Source::Flags => format!("--{} {why}", key.replace('_', "-")),
            Source::File => format!("{key}: {why}"),
        };
        if self.max_memory.is_some_and(|v| v < 64 << 10) {
            return Err(refuse(
                "max_memory",
                "must be at least 64KiB (one WebAssembly page)",
            ));
        }
        // A zero poll from the file has always been taken (the node then
        // polls without a pause); only the flag refuses it.
        if source == Source::Flags && self.cluster_poll.is_some_and(|v| v.is_zero()) {
            return Err(refuse("cluster_poll", "must be more than zero"));
        }
        if self
            .epoch_tick
            .is_some_and(|v| v < Duration::from_millis(1))
        {
            return Err(refuse("epoch_tick", "must be at least 1ms"));
        }
        if self
            .event_lane_capacity
            .is_some_and(|v| v == 0 || v > 1 << 22)
        {
            return Err(refuse(
                "event_lane_capacity",
                "must be between 1 and 4194304",
            ));
        }
        if self.worker_threads == Some(0) {
            return Err(refuse("worker_threads", "must be at least 1"));
        }
        Ok(())
    }

    /// Sets in `config` every setting given here.
    pub fn apply(self, config: &mut DaemonConfig) {
        fn set<T>(slot: &mut T, value: Option<T>) {
            if let Some(value) = value {
                *slot = value;
            }
        }
        fn set_some<T>(slot: &mut Option<T>, value: Option<T>) {
            if value.is_some() {
                *slot = value;
            }
        }
        let c = config;
        set(&mut c.state_dir, self.state_dir);
        set(&mut c.grace, self.grace);
        set(&mut c.max_concurrent, self.max_concurrent);
        set(&mut c.max_slot_queue, self.max_slot_queue);
        set(&mut c.max_total_pending, self.max_total_pending);
        set(&mut c.max_delayed, self.max_delayed);
        set(&mut c.max_schedules, self.max_schedules);
        set(&mut c.max_parked, self.max_parked);
        set(&mut c.max_descendants, self.max_descendants);
        set(&mut c.max_depth, self.max_depth);
        set(&mut c.max_memory, self.max_memory);
        set(&mut c.record_budget, self.record_budget);
        set(&mut c.memory_ceiling, self.memory_ceiling);
        set(&mut c.max_handles, self.max_handles);
        set(&mut c.max_open_files, self.max_open_files);
        set(&mut c.max_http_requests, self.max_http_requests);
        set(&mut c.max_header_bytes, self.max_header_bytes);
        set(&mut c.max_connections, self.max_connections);
        set_some(&mut c.pool_instances, self.pool_instances);
        set(&mut c.event_lane_capacity, self.event_lane_capacity);
        set(&mut c.epoch_tick, self.epoch_tick);
        set(&mut c.store, self.store);
        set_some(&mut c.retain_finished, self.retain_finished);
        set_some(&mut c.retain_bytes, self.retain_bytes);
        set(&mut c.retain_for, self.retain_for);
        set(&mut c.keep_unused_plugins, self.keep_unused_plugins);
        set(&mut c.plugin_cache, self.plugin_cache);
        set(&mut c.worker_threads, self.worker_threads);
        set(&mut c.allow_http, self.allow_http);
        set_some(&mut c.allow_dirs, self.allow_dirs);
        set_some(&mut c.allow_env, self.allow_env);
        set_some(&mut c.secrets_dir, self.secrets.dir);
        set(&mut c.secret_env, self.secrets.env);
        set(&mut c.config_vars, self.config_vars);
        set(&mut c.kv_max_bucket, self.kv_max_bucket);
        set(&mut c.kv_max_total, self.kv_max_total);
        set(&mut c.allow_kv, self.allow_kv);
        if let Some(slots) = self.slots {
            c.slot_rules = slots.into_iter().map(|(p, r)| (p, r.into())).collect();
        }
        if let Some(namespaces) = self.namespaces {
            c.namespaces = namespaces.into_iter().collect();
        }
        set_some(&mut c.cluster.node_name, self.node_name);
        set(&mut c.cluster.lease, self.lease);
        set(&mut c.cluster.renew, self.lease_renew);
        set(&mut c.cluster.poll, self.cluster_poll);
        set(&mut c.cluster.notify, self.cluster_notify);
        set_some(&mut c.http, self.http);
        set_some(&mut c.http_token_file, self.http_token_file);
        set_some(&mut c.tls_cert, self.tls_cert);
        set_some(&mut c.tls_key, self.tls_key);
        set(&mut c.http_allow_plain, self.http_allow_plain);
        set(&mut c.idempotency_retention, self.idempotency_retention);
        set(&mut c.http_allow_hosts, self.http_allow_hosts);
        set(&mut c.http_max_connections, self.http_max_connections);
        set(&mut c.http_max_streams, self.http_max_streams);
        set(&mut c.http_header_timeout, self.http_header_timeout);
        set_some(&mut c.otlp, self.otlp);
    }
}

/// `--max-concurrent`: a count, 0 taken as 1.
fn parse_concurrency(text: &str) -> Result<usize, std::num::ParseIntError> {
    text.parse::<usize>().map(|n| n.max(1))
}

/// A count of at least 1 (`--max-handles` and the like).
pub fn parse_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{text}` is not a whole number of at least 1")),
    }
}

/// `--max-header-bytes`: a size of at least one byte.
pub fn parse_header_bytes(text: &str) -> Result<usize, String> {
    match parse_size(text).map_err(|e| e.to_string())? {
        0 => Err("must be more than zero".to_owned()),
        n => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

/// `--allow-http [http://]HOST[:PORT]`.
pub fn parse_allow_http(text: &str) -> Result<HttpAllow, String> {
    HttpAllow::parse(text).map_err(|e| e.to_string())
}

/// `--config-var KEY=VALUE` (a key is not empty).
pub fn parse_config_var(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!(
            "invalid --config-var `{text}`: use KEY=VALUE, such as --config-var region=eu"
        )),
    }
}

/// `--allow-kv BUCKET`.
fn parse_bucket(text: &str) -> Result<String, String> {
    taskhost_runtime::kv::check_bucket_name(text).map(|()| text.to_owned())
}

/// `--secret-env NAME`.
fn parse_secret_name(text: &str) -> Result<String, String> {
    taskhost_runtime::check_secret_name(text)
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

/// `--allow-env NAME`.
fn parse_allow_env(text: &str) -> Result<String, String> {
    super::check_env_pattern(text).map(|()| text.to_owned())
}

/// `--http-allow-host`: a host name or IP literal, optionally with a port.
fn parse_allow_host(text: &str) -> Result<String, String> {
    super::check_allow_host(text).map(|()| text.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        settings: Settings,
    }

    fn flags(args: &[&str]) -> Settings {
        Flags::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .unwrap()
            .settings
    }

    #[test]
    fn a_flag_wins_over_the_file_which_wins_over_the_default() {
        let file: Settings = toml::from_str(
            "grace = \"2s\"\nmax_concurrent = 8\ncluster_notify = true\nallow_kv = [\"a\"]\n\
             [secrets]\nenv = [\"K\"]\n",
        )
        .unwrap();
        let beneath = DaemonConfig::with_state_dir("/state".into());
        let config = flags(&["--grace", "3s", "--no-notify", "--secret-env", "T"])
            .over(file.clone(), beneath.clone())
            .unwrap();
        assert_eq!(config.grace, Duration::from_secs(3));
        assert_eq!(config.max_concurrent, 8);
        assert!(!config.cluster.notify);
        assert_eq!(config.allow_kv, ["a"]);
        assert_eq!(config.secret_env, ["T"]);
        assert_eq!(config.retain_bytes, beneath.retain_bytes);
        // Flags not given leave the file's; no flags leave it all.
        assert_eq!(flags(&[]), Settings::default());
        let config = Settings::default().over(file, beneath).unwrap();
        assert_eq!(config.grace, Duration::from_secs(2));
        assert!(config.cluster.notify);
        assert_eq!(flags(&["--max-concurrent", "0"]).max_concurrent, Some(1));
    }

    #[test]
    fn each_source_is_refused_in_its_own_words() {
        let beneath = DaemonConfig::with_state_dir("/state".into());
        let small: Settings = toml::from_str("max_memory = \"1KiB\"\n").unwrap();
        assert_eq!(
            Settings::default().over(small, beneath.clone()),
            Err("max_memory: must be at least 64KiB (one WebAssembly page)".into())
        );
        assert_eq!(
            flags(&["--epoch-tick", "0ms"]).over(Settings::default(), beneath),
            Err("--epoch-tick must be at least 1ms".into())
        );
    }
}
