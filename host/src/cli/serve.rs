//! `host serve`: the daemon's flags and settings (a flag wins over the TOML
//! file, which wins over the default), and running it in the foreground.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use taskhost::daemon::config::Settings;
use taskhost::daemon::{
    Client, DaemonConfig, default_state_dir, default_worker_threads, serve, socket,
};

use super::args::SocketArg;
use super::exit::{ExitError, usage};

// `host serve`'s flags: the daemon's settings (declared once, with their
// keys in the TOML file, in `taskhost::daemon::config::Settings`), and
// this verb's own. (No doc comment: it would replace the verb's.)
#[derive(Debug, Args)]
#[command(mut_args(manual_order()))]
pub struct ServeArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    #[command(flatten)]
    settings: Settings,
    /// A TOML file with settings (keys: state_dir, store, node_name, lease, lease_renew, cluster_poll, cluster_notify, retain_finished, retain_for, retain_bytes, keep_unused_plugins, plugin_cache, worker_threads, http, http_token_file, tls_cert, tls_key, http_allow_plain, idempotency_retention, http_allow_hosts, http_max_connections, http_max_streams, http_header_timeout, otlp, grace, max_concurrent, max_slot_queue, max_total_pending, max_delayed, max_schedules, max_parked, max_descendants, max_depth, max_memory, memory_ceiling, max_handles, max_open_files, max_http_requests, max_header_bytes, epoch_tick, max_connections, pool_instances, event_lane_capacity, allow_http, allow_dirs, allow_env, kv_max_bucket, kv_max_total, allow_kv, and the tables secrets (dir, env), config_vars, slots, such as [slots."db/*"] capacity = 4, and namespaces, such as [namespaces.alpha] weight = 2); flags win over it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format on stderr (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Start the daemon in the background and return once its socket
    /// accepts connections; its logs go to <state dir>/daemon.log.
    #[arg(long)]
    detach: bool,
}

/// Puts `serve`'s own flags where its manual has them among the settings'
/// (clap numbers the flags in the order they are declared, and the
/// settings are declared as one block): `--config` after `--state-dir`,
/// `--log-format` after `--epoch-tick`. Every other flag keeps its place.
fn manual_order() -> impl FnMut(clap::Arg) -> clap::Arg {
    const AFTER: [(&str, &str); 2] = [("state_dir", "config"), ("epoch_tick", "log_format")];
    let mut shift = 0;
    let mut anchors = Vec::new();
    move |arg| {
        let id = arg.get_id().as_str().to_owned();
        if let Some((anchor, _)) = AFTER.iter().find(|(_, own)| *own == id) {
            let place = anchors
                .iter()
                .find(|(name, _)| name == anchor)
                .map(|(_, order)| order + 1);
            return arg.display_order(place);
        }
        let order = arg.get_display_order() + shift;
        if AFTER.iter().any(|(anchor, _)| *anchor == id) {
            anchors.push((id, order));
            shift += 1;
        }
        arg.display_order(order)
    }
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
        self.settings
            .otlp
            .clone()
            .or_else(|| self.config().ok().and_then(|c| c.otlp))
    }

    fn config(&self) -> anyhow::Result<DaemonConfig> {
        // Without a default (no HOME), --state-dir or the file must say.
        let default = default_state_dir();
        let beneath = DaemonConfig::with_state_dir(default.clone().unwrap_or_default());
        let file = match &self.config {
            Some(path) => Settings::from_file(path).map_err(usage)?,
            None => Settings::default(),
        };
        let mut config = self.settings.clone().over(file, beneath).map_err(usage)?;
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    fn verb(name: &str) -> clap::Command {
        let mut cli = crate::cli::Cli::command();
        cli.build();
        cli.find_subcommand(name).expect("the verb").clone()
    }

    /// `run` declares these flags in `cli/args.rs`, `serve` in the daemon's
    /// `Settings`: they must read the same.
    #[test]
    fn serve_and_run_say_the_same_of_the_flags_they_share() {
        let (serve, run) = (verb("serve"), verb("run"));
        for long in [
            "max-handles",
            "max-open-files",
            "max-http-requests",
            "max-header-bytes",
            "otlp",
        ] {
            let help = |verb: &clap::Command| {
                let arg = verb
                    .get_arguments()
                    .find(|a| a.get_long() == Some(long))
                    .unwrap_or_else(|| panic!("--{long}"));
                (
                    arg.get_help().map(|h| h.to_string()),
                    arg.get_value_names().map(|v| v.to_vec()),
                )
            };
            assert_eq!(help(&serve), help(&run), "--{long}");
        }
    }

    #[test]
    fn serve_help_puts_its_own_flags_among_the_settings() {
        let help = verb("serve").render_long_help().to_string();
        // Each flag where its entry starts (the text above names some).
        let at = |flag: &str| {
            help.find(&format!("\n      {flag}"))
                .unwrap_or_else(|| panic!("{flag}"))
        };
        assert!(at("--state-dir <DIR>") < at("--config <FILE>"));
        assert!(at("--config <FILE>") < at("--grace <DUR>"));
        assert!(at("--epoch-tick <DUR>") < at("--log-format <LOG_FORMAT>"));
        assert!(at("--log-format <LOG_FORMAT>") < at("--store <STORE>"));
        assert!(at("--otlp <URL>") < at("--detach"));
    }
}
