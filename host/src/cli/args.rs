//! Owns the flags shared by several verbs and their conversion into typed
//! library values (durations, sizes, grants, params, input bytes).

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use taskhost::runtime::{
    DirGrant, GuestLimits, HttpAllow, RuntimeConfig, Sandbox, SecretRef, parse_env,
};
use taskhost::supervisor::{BackoffPolicy, RestartPolicy, TaskSpec};
use taskhost::units::{format_size, parse_duration, parse_size};

use taskhost::daemon::config::{
    parse_allow_http, parse_config_var, parse_count, parse_header_bytes,
};

use super::exit::usage;

// The trace export flag of the verbs that run tasks (`run`, `serve`).
#[derive(Debug, Args)]
pub struct OtlpArg {
    /// Export a trace per task (a span per task and per attempt, with the task's id, name and slot, the plugin's digest, the attempt's number, result and outcome) over OTLP/HTTP with protobuf to this collector, such as http://127.0.0.1:4318 (spans go to its /v1/traces). The standard OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT do the same; without any of them nothing is exported [TOML: otlp].
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

// The compiled-plugin cache flags of the verbs that compile (`run`,
// `inspect`).
#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Directory of the compiled-plugin cache [default: $XDG_CACHE_HOME/taskhost/wasmtime, else ~/.cache/taskhost/wasmtime].
    #[arg(long, env = "TASKHOST_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile plugins without the on-disk cache.
    #[arg(long)]
    pub no_cache: bool,
}

impl CacheArgs {
    /// Where compiled plugins are cached on disk (absolute), if anywhere.
    pub fn dir(&self) -> anyhow::Result<Option<PathBuf>> {
        if self.no_cache {
            return Ok(None);
        }
        match &self.cache_dir {
            Some(dir) => Ok(Some(std::path::absolute(dir).map_err(|e| {
                usage(format!("cannot use --cache-dir `{}`: {e}", dir.display()))
            })?)),
            None => Ok(taskhost::runtime::default_cache_dir()),
        }
    }

    /// The runtime settings of a verb that compiles: this cache, and a line
    /// on stderr when a compile takes long enough to be noticed. These
    /// verbs run one instance at a time: no instance pool (its slots, each
    /// with guard pages, cost a thousand `mprotect`s at start), and no
    /// blocking thread just to map one plugin's artifact.
    pub fn runtime_config(&self) -> anyhow::Result<RuntimeConfig> {
        Ok(RuntimeConfig::default()
            .allocator(taskhost::runtime::AllocatorChoice::OnDemand)
            .inline_loads(true)
            .cache_dir(self.dir()?)
            .on_slow_compile(|note| {
                let size = format_size(note.bytes);
                if note.cached {
                    eprintln!("compiling {} ({size}), cached afterwards", note.origin);
                } else {
                    eprintln!(
                        "compiling {} ({size}); without the cache (--no-cache) every run compiles it again",
                        note.origin
                    );
                }
            }))
    }
}

// The caps on what each attempt's guest holds in the host (`run`, `serve`).
#[derive(Debug, Args)]
pub struct GuestLimitArgs {
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
    pub max_header_bytes: Option<usize>,
}

impl GuestLimitArgs {
    /// These flags over `limits`.
    pub fn apply(&self, mut limits: GuestLimits) -> GuestLimits {
        if let Some(v) = self.max_handles {
            limits.max_handles = v;
        }
        if let Some(v) = self.max_open_files {
            limits.max_open_files = v;
        }
        if let Some(v) = self.max_http_requests {
            limits.max_http_requests = v;
        }
        if let Some(v) = self.max_header_bytes {
            limits.max_header_bytes = v;
        }
        limits
    }
}

fn parse_bucket(text: &str) -> Result<String, String> {
    taskhost::runtime::kv::check_bucket_name(text).map(|()| text.to_owned())
}

fn parse_secret(text: &str) -> Result<SecretRef, String> {
    SecretRef::parse_named(text).map_err(|e| e.to_string())
}

fn parse_env_secret(text: &str) -> Result<SecretRef, String> {
    SecretRef::parse_env(text).map_err(|e| e.to_string())
}

// `--socket` of the verbs that talk to the daemon (also accepted before
// the verb).
#[derive(Debug, Args)]
pub struct SocketArg {
    /// The daemon's socket [default: $TASKHOST_SOCKET, else $XDG_RUNTIME_DIR/taskhost/host.sock, else /tmp/taskhost-<uid>/host.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

// The flags that describe one task, shared by `run` (and `submit`).
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// The plugin: a WebAssembly component file (.wasm).
    #[arg(value_name = "PLUGIN")]
    pub plugin: PathBuf,
    /// Task name [default: <plugin name>-<task id>].
    #[arg(long)]
    pub name: Option<String>,
    /// Admission slot [default: the plugin's resource filled from --param, else the task name].
    #[arg(long)]
    pub slot: Option<String>,
    /// A parameter for the plugin, and for its resource template (repeatable).
    #[arg(long = "param", value_name = "K=V")]
    pub params: Vec<String>,
    /// An argument for a WASI command component (repeatable, in order), after its name; the arguments after `--` follow. A task plugin takes --param instead.
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Arguments for a WASI command component, after the --arg ones: `host submit fmt.wasm -- --indent 2`.
    #[arg(last = true, value_name = "ARGS")]
    pub trailing: Vec<String>,
    /// Input bytes for the plugin, as text.
    #[arg(long, value_name = "TEXT", conflicts_with = "input_file")]
    pub input: Option<String>,
    /// Read the input bytes from a file, or from stdin with `-`.
    #[arg(long, value_name = "PATH|-")]
    pub input_file: Option<PathBuf>,
    /// Per-attempt timeout, such as 30s or 250ms; 0 means none [default: none].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Memory limit of the guest: all its linear memories together, such as 64MiB [default: 256MiB; for submit, the daemon's --max-memory, at most its --memory-ceiling].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_memory: Option<u64>,
    /// Grant a host directory at a guest path: HOST::GUEST, or HOST::GUEST:ro for read-only (repeatable).
    #[arg(long = "dir", value_name = "HOST::GUEST[:ro]", value_parser = parse_dir)]
    pub dirs: Vec<DirGrant>,
    /// Grant an environment variable to the guest (repeatable); nothing is inherited.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Give the guest a secret as the environment variable of its name (repeatable), such as --secret API_KEY. The value is looked up when each attempt starts and never stored or shown: for submit, among the daemon's secrets (host serve --secrets-dir, --secret-env); for run, in this process's environment.
    #[arg(long = "secret", value_name = "NAME", value_parser = parse_secret)]
    pub secrets: Vec<SecretRef>,
    /// Give the guest secret NAME as the environment variable VAR (repeatable), such as --env-secret TOKEN=api-token; looked up like --secret.
    #[arg(long = "env-secret", value_name = "VAR=NAME", value_parser = parse_env_secret)]
    pub env_secrets: Vec<SecretRef>,
    /// A configuration value the guest reads through wasi:config/store (repeatable), such as --config-var region=eu; for submit, over the daemon's own config_vars.
    #[arg(long = "config-var", value_name = "K=V", value_parser = parse_config_var)]
    pub config_vars: Vec<(String, String)>,
    /// Let the guest open this shared key-value bucket through wasi:keyvalue besides its slot's own (repeatable); for submit, one of the daemon's allow_kv.
    #[arg(long = "kv", value_name = "BUCKET", value_parser = parse_bucket)]
    pub kv: Vec<String>,
    /// Let the guest send HTTP requests to this host (repeatable): HOST or HOST:PORT for https, http://HOST[:PORT] for plain http, *.DOMAIN for every name under DOMAIN; without a port, the scheme's default (443, 80). Nothing else is reachable; each request (and each redirect hop) is checked. For submit, the daemon's own allow_http must include it.
    #[arg(long = "allow-http", value_name = "[http://]HOST[:PORT]", value_parser = parse_allow_http)]
    pub allow_http: Vec<HttpAllow>,
    /// Print one JSON object with the result on stdout instead of raw output.
    #[arg(long)]
    pub json: bool,
}

impl TaskArgs {
    /// A command's arguments: each `--arg`, then those after `--`.
    pub fn command_args(&self) -> Vec<String> {
        self.args.iter().chain(&self.trailing).cloned().collect()
    }

    /// The `--param` pairs, in order.
    pub fn params(&self) -> anyhow::Result<Vec<(String, String)>> {
        self.params
            .iter()
            .map(|p| match p.split_once('=') {
                Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
                _ => Err(usage(format!(
                    "invalid --param `{p}`: use KEY=VALUE, such as --param env=prod"
                ))),
            })
            .collect()
    }

    /// The sandbox grants, with host directories checked.
    pub fn sandbox(&self) -> anyhow::Result<Sandbox> {
        let mut sandbox = Sandbox {
            dirs: self.dirs.clone(),
            env: self.env.clone(),
            secrets: self
                .secrets
                .iter()
                .chain(&self.env_secrets)
                .cloned()
                .collect(),
            config: self.config_vars.clone(),
            kv: self.kv.clone(),
            http: self.allow_http.clone(),
            ..Sandbox::default()
        };
        sandbox.check_secrets().map_err(usage)?;
        if let Some(max) = self.max_memory {
            if max < 64 << 10 {
                return Err(usage(
                    "--max-memory must be at least 64KiB (one WebAssembly page)",
                ));
            }
            sandbox.max_memory = max;
        }
        sandbox.check_dirs().map_err(usage)?;
        Ok(sandbox)
    }

    /// The input bytes from --input or --input-file (empty if neither).
    pub fn input(&self) -> anyhow::Result<Vec<u8>> {
        if let Some(text) = &self.input {
            return Ok(text.clone().into_bytes());
        }
        match &self.input_file {
            None => Ok(Vec::new()),
            Some(path) if path.as_os_str() == "-" => {
                let mut buf = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut buf)
                    .map_err(|e| usage(format!("cannot read the input from stdin: {e}")))?;
                Ok(buf)
            }
            Some(path) => std::fs::read(path).map_err(|e| {
                usage(format!(
                    "cannot read --input-file `{}`: {e}",
                    path.display()
                ))
            }),
        }
    }
}

// Restart, retry and backoff flags (`run`, `submit`).
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// When to run the task again: never, on-failure (retry retryable failures) or always (rerun after success too).
    #[arg(long, value_enum, value_name = "WHEN")]
    pub restart: Option<Restart>,
    /// Rerun every DUR after a success (implies --restart always).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub every: Option<Duration>,
    /// Give up after N+1 consecutive failed attempts. Without --restart it implies --restart on-failure (as --every implies always); with --restart never it is refused [default: unlimited].
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    /// Delay between failed attempts: FIRST,MAX,FACTOR,JITTER or key=value pairs (first=, max=, factor=, jitter=none|full|equal|decorrelated) [default: 200ms,30s,2,equal].
    #[arg(long, value_name = "SPEC", value_parser = parse_backoff)]
    pub backoff: Option<BackoffPolicy>,
}

/// The `--restart` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// Stop after any result.
    Never,
    /// Retry retryable failures.
    OnFailure,
    /// Rerun after success too (see --every).
    Always,
}

/// Policies resolved from the flags.
#[derive(Debug, Clone)]
pub struct Policies {
    pub restart: RestartPolicy,
    pub max_retries: Option<u32>,
    pub backoff: Option<BackoffPolicy>,
    pub timeout: Option<Duration>,
}

impl Policies {
    /// Applies the policies to a spec.
    pub fn apply(&self, spec: TaskSpec) -> TaskSpec {
        let mut spec = spec
            .with_restart(self.restart)
            .with_max_retries(self.max_retries)
            .with_timeout(self.timeout.unwrap_or_default());
        if let Some(backoff) = &self.backoff {
            spec = spec.with_backoff(backoff.clone());
        }
        spec
    }
}

impl PolicyArgs {
    /// Checks the flags against each other and resolves them.
    pub fn resolve(&self, timeout: Option<Duration>) -> anyhow::Result<Policies> {
        let restart = match (self.restart, self.every, self.max_retries) {
            (Some(Restart::Never | Restart::OnFailure), Some(_), _) => {
                return Err(usage(
                    "--every reruns after success; it needs --restart always (or no --restart)",
                ));
            }
            (Some(Restart::Never), None, Some(_)) => {
                return Err(usage(
                    "--max-retries N retries failed attempts, which --restart never forbids: \
                     drop --restart never (--max-retries implies --restart on-failure) or give \
                     --restart on-failure or always",
                ));
            }
            (Some(Restart::Always) | None, Some(every), _) => {
                RestartPolicy::Always { interval: every }
            }
            (Some(Restart::Always), None, _) => RestartPolicy::Always {
                interval: Duration::ZERO,
            },
            // --max-retries says failures are retried: on-failure, as
            // --every says always.
            (Some(Restart::OnFailure), None, _) | (None, None, Some(_)) => RestartPolicy::OnFailure,
            (Some(Restart::Never), None, None) | (None, None, None) => RestartPolicy::Never,
        };
        Ok(Policies {
            restart,
            max_retries: self.max_retries,
            backoff: self.backoff.clone(),
            timeout,
        })
    }
}

// `--raw` of the verbs that print a task's output (`run`, `submit`,
// `wait`, `rerun`, `schedule run`) or a stored value (`kv get`).
#[derive(Debug, Args)]
pub struct RawArg {
    /// Write the output's bytes (for kv get, the value's) as they are on a terminal too. By default, when stdout is a terminal, the output is shown as text: newlines and tabs stay, every other control character (escape sequences, bells, carriage returns, bidirectional overrides) is written as an escape such as \x1b, so that a task cannot drive your terminal (set the clipboard, retitle the window, forge a line). Into a pipe or a file the bytes are always exact. Guest lines, reasons and names on stderr are shown as text either way.
    #[arg(long)]
    pub raw: bool,
}

fn parse_backoff(text: &str) -> Result<BackoffPolicy, String> {
    text.parse()
        .map_err(|e: taskhost::supervisor::BackoffError| e.to_string())
}

/// `--dir`, with a hint for the Docker-style `HOST:GUEST` form.
fn parse_dir(text: &str) -> Result<DirGrant, String> {
    DirGrant::parse(text).map_err(|e| match text.split_once(':') {
        Some((host, guest))
            if !host.is_empty() && guest.starts_with('/') && !text.contains("::") =>
        {
            format!("{e}; did you mean --dir {host}::{guest}?")
        }
        _ => e.to_string(),
    })
}
