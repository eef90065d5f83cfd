//! `host serve`: the daemon's flags and settings (a flag wins over the TOML
//! file, which wins over the default), and running it in the foreground.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use taskhost::daemon::{DaemonConfig, default_state_dir, serve, socket};
use taskhost::units::{parse_duration, parse_size};

use super::args::SocketArg;
use super::exit::{ExitError, usage};

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Where uploaded plugins and the compilation cache live [default: $XDG_STATE_HOME/taskhost, else ~/.local/state/taskhost].
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A TOML file with settings (keys: state_dir, grace, max_concurrent, max_slot_queue, max_total_pending, max_memory, epoch_tick, max_connections, pool_instances, event_lane_capacity); flags win over it.
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
    /// Default memory limit of a guest [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// Instance slots of the pooling allocator; attempts running at once never exceed it (below 16: the on-demand allocator) [default: 1000].
    #[arg(long, value_name = "N")]
    pool_instances: Option<u32>,
    /// Epoch tick: the granularity of interruption [default: 10ms].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    epoch_tick: Option<Duration>,
    /// Log format on stderr (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
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
    fn config(&self) -> anyhow::Result<DaemonConfig> {
        let mut config = DaemonConfig::with_state_dir(default_state_dir());
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
        if let Some(v) = self.max_memory {
            if v < 64 << 10 {
                return Err(usage(
                    "--max-memory must be at least 64KiB (one WebAssembly page)",
                ));
            }
            config.max_memory = v;
        }
        if let Some(v) = self.pool_instances {
            config.pool_instances = v;
        }
        if let Some(v) = self.epoch_tick {
            if v < Duration::from_millis(1) {
                return Err(usage("--epoch-tick must be at least 1ms"));
            }
            config.epoch_tick = v;
        }
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
    let config = args.config()?;
    let socket_path = socket::resolve(args.socket.socket.as_deref().or(socket_flag.as_deref()));
    let announce = socket_path.clone();
    serve(socket_path, config, move || {
        eprintln!("taskhost daemon listening on {}", announce.display());
    })
    .await
    .map_err(|e| ExitError::error(1, e.to_string()))?;
    Ok(0)
}
