//! Owns the command line: the clap definitions of every verb, the parsing of
//! units at the edge, and turning results into output and exit codes.
//!
//! | module | owns |
//! |---|---|
//! | `args` | flags shared by several verbs, parsed into library types |
//! | `exit` | exit codes and the errors that carry them |
//! | `report` | how results, summaries and guest lines look |
//! | `run`, `inspect`, `replay` | the verbs that need no daemon |
//! | `serve` | the daemon verb |
//! | `client` | the verbs that talk to a daemon |
//! | `tools` | `version`, `completions`, `man`, `new` |
//! | `telemetry` | the `tracing` subscriber and the OTLP exporter |

mod args;
mod client;
mod exit;
mod inspect;
mod replay;
mod report;
mod run;
mod serve;
mod telemetry;
mod tools;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use exit::ExitError;

/// Runs WebAssembly task plugins under a supervisor with keyed admission.
///
/// Every task body is a sandboxed WebAssembly component: it sees no files,
/// no environment and no network unless granted, it is limited in memory,
/// and a runaway guest is really stopped (epoch interruption).
#[derive(Debug, Parser)]
#[command(name = "host", version, about, long_about, propagate_version = true)]
pub struct Cli {
    /// The daemon's socket, for the verbs that talk to one (also accepted after the verb).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Talk to a daemon's HTTP listener instead of a local socket, e.g. https://build-1:9100 (the client verbs; same output and exit codes).
    #[arg(long, value_name = "URL", env = "TASKHOST_URL", global = true)]
    remote: Option<String>,
    /// With --remote: a file whose one line is the token to send (only its owner may read it); TASKHOST_TOKEN may give the token itself.
    #[arg(long, value_name = "FILE", global = true)]
    token_file: Option<PathBuf>,
    /// With --remote: PEM certificates of the CA that signed the listener's certificate (a private CA), or the listener's own self-signed certificate (pinned: accepted exactly, while valid, for the names it holds) [default: the Mozilla roots].
    #[arg(long, value_name = "PEM", global = true)]
    ca_file: Option<PathBuf>,
    /// Act in this namespace: its tasks, names, slots and schedules only (`host ns ls` lists them) [default: the token's, else `default`].
    #[arg(
        long,
        short = 'n',
        value_name = "NAME",
        env = "TASKHOST_NAMESPACE",
        global = true
    )]
    namespace: Option<String>,
    /// See every namespace's tasks, slots, schedules and events (another namespace's names shown as NAMESPACE/NAME); the operator's.
    #[arg(long, short = 'A', global = true)]
    all_namespaces: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
enum Command {
    /// Run one task in this process (no daemon), wait, print its outcome.
    ///
    /// The plugin's output bytes go to stdout as they are (on a terminal
    /// shown as text, its control characters as escapes, unless --raw); the
    /// guest's log, stdout and stderr lines and the summary go to stderr,
    /// tagged with the task name, always as text. Ctrl-C asks the task to
    /// stop; if it has not stopped after --grace, or on a second Ctrl-C, it
    /// is stopped by force.
    ///
    /// Exit codes: 0 completed, 1 failed or fatal, 2 invalid input,
    /// 4 canceled or force-aborted.
    #[command(
        after_long_help = "EXAMPLES:\n  host run target/plugins/hello.wasm --input hi\n  host run target/plugins/flaky.wasm --param fail_times=2 --restart on-failure --backoff 10ms,1s,2,full\n  host run target/plugins/flaky.wasm --param fail_times=2 --max-retries 3   # implies --restart on-failure\n  host run target/plugins/sleeper.wasm --param ms=5000 --timeout 1s\n  host run my.wasm --dir ./data::/data:ro --env LANG=C --max-memory 64MiB --json\n  host run target/plugins/http-get.wasm --param url=https://api.example.com/status --allow-http api.example.com\n  host run target/plugins/deploy.wasm --param env=dev --param endpoint=http://127.0.0.1:8080/deploy --allow-http http://127.0.0.1:8080"
    )]
    Run(Box<run::RunArgs>),
    /// Validate a plugin and show what it declares.
    ///
    /// Compiles the component, checks it targets the taskhost:plugin world,
    /// calls its describe() under a small time and memory limit, and prints
    /// its name, version, resource template, default policy and capabilities.
    #[command(
        after_long_help = "EXAMPLES:\n  host inspect target/plugins/deploy.wasm\n  host inspect my.wasm --json"
    )]
    Inspect(inspect::InspectArgs),
    /// Replay a recorded attempt: the same component, every host call answered from its record.
    ///
    /// Runs in this process with no grants, no network and no clock: the
    /// clocks, random numbers, cancellation, sleeps, key-value reads and
    /// responses to outbound HTTP requests (status, headers, body) and the
    /// files and directory listings it read through --dir grants the guest
    /// sees are the recorded ones; a request or an open that differs from the recorded
    /// one is a divergence. Each granted directory is a fresh read-only one
    /// holding what the guest opened and listed, as recorded: what it wrote
    /// there and metadata (times, sizes of files not opened) are not the
    /// recorded ones. Prints the replayed output and
    /// lines, then the verdict: identical (same output, lines and outcome),
    /// or the first host call where the guest asked for something the record
    /// does not hold (its number, interface and arguments), which is how a
    /// non-deterministic bug or a code change shows. Secrets are looked up
    /// again by name and must have the recorded digests.
    ///
    /// Exit codes: 0 identical, 1 not identical (diverged, different end, or
    /// a truncated record), 2 invalid input.
    #[command(
        after_long_help = "EXAMPLES:\n  host run flaky.wasm --record run.rec && host replay run.rec\n  host replay run.rec --attempt 2 --json\n  host replay run.rec --plugin target/plugins/fixed.wasm   # does the new build end the same?\n  host replay 42                # a daemon's task: its record and plugin fetched, replayed here"
    )]
    Replay(replay::ReplayArgs),
    /// The flight recorder's records of a daemon's tasks (export).
    #[command(after_long_help = "EXAMPLES:\n  host record export 42 > 42.rec")]
    Record(client::record::RecordArgs),
    /// Run the daemon: supervisor and controller behind a Unix socket only
    /// its owner can use, with accepted work kept in a store.
    ///
    /// Accepted work is committed to the store (SQLite under the state
    /// directory by default) before `host submit` prints its id, and a
    /// restart after a crash picks it up again. Logs go to stderr (RUST_LOG
    /// filters them), or to <state dir>/daemon.log with --detach. SIGINT,
    /// SIGTERM or `host shutdown` stop it gracefully: running tasks get the
    /// grace, then are force-aborted; unfinished work stays in the store for
    /// the next start (`host shutdown --cancel-all`, or `--store memory`,
    /// ends it all now); the socket is removed.
    #[command(
        after_long_help = "EXAMPLES:\n  host serve --detach                  # returns once the daemon accepts; logs in <state dir>/daemon.log\n  host serve --grace 30s --max-concurrent 8\n  host --socket /tmp/h.sock serve --state-dir /tmp/h-state\n  host serve --allow-http '*.example.com' --allow-http http://127.0.0.1:8080   # the most HTTP a submission may get\n  host serve --http 127.0.0.1:9100      # metrics at /metrics, dashboard at /\n  host serve --http 0.0.0.0:9100 --http-token-file ~/.config/taskhost/tokens --tls-cert cert.pem --tls-key key.pem\n  host --remote https://build-1:9100 --token-file ~/.config/taskhost/token ps   # any client verb, remotely\n  (systemd: Type=notify; the daemon reports READY=1 once it listens)"
    )]
    Serve(Box<serve::ServeArgs>),
    /// Send one task to the daemon; prints its id (or, with --wait, its result).
    ///
    /// The plugin is uploaded once per daemon (by content digest). The slot
    /// is --slot, else the plugin's resource filled from --param, else the
    /// task name. Exit codes with --wait: as `host run`; 3 when rejected.
    #[command(
        after_long_help = "EXAMPLES:\n  host submit target/plugins/hello.wasm --slot x --input hi --wait\n  host submit target/plugins/deploy.wasm --param env=prod --param endpoint=https://deploy.example.com/hook --allow-http deploy.example.com   # slot deploy/prod, policy replace\n  host submit target/plugins/sleeper.wasm --name nap --param ms=60000\n  host submit my.wasm --slot db --policy queue --restart on-failure --max-retries 3"
    )]
    Submit(Box<client::submit::SubmitArgs>),
    /// Submit a new task with a task's request (its plugin, input, params, slot, policy and grants); prints the new id (or, with --wait, its result).
    #[command(
        after_long_help = "EXAMPLES:\n  host rerun 42\n  host rerun nightly-report --wait --json"
    )]
    Rerun(client::tasks::RerunArgs),
    /// Wait for a task's final outcome and print it (exit code by outcome).
    #[command(
        after_long_help = "EXAMPLES:\n  host wait 42\n  host wait nap --json\n  host wait nap --raw   # on a terminal too, the output's bytes as they are"
    )]
    Wait(client::tasks::WaitArgs),
    /// Stop a task (queued work is removed) and wait until it has ended; with --filter, every live task that matches.
    #[command(
        after_long_help = "EXAMPLES:\n  host cancel nap\n  host cancel 42 --json\n  host cancel --filter state=queued,slot='deploy-*' --dry-run\n  host cancel --filter state=queued,slot='deploy-*'"
    )]
    Cancel(client::tasks::StopArgs),
    /// Ask a task to stop (queued work is removed) without waiting.
    #[command(after_long_help = "EXAMPLES:\n  host remove nap")]
    Remove(client::tasks::StopArgs),
    /// List the daemon's live tasks, queued ones included (--all: finished ones too).
    #[command(after_long_help = "EXAMPLES:\n  host ps\n  host ps --all --json")]
    Ps(client::tasks::PsArgs),
    /// Run tasks at times: cron schedules kept by the daemon (add, ls, rm, pause, resume, run).
    ///
    /// A schedule submits its plugin, with its task flags, at every time its
    /// cron expression names, in its time zone. Each firing is an ordinary
    /// task named <schedule>-<id>, in the schedule's slot (--slot, else the
    /// plugin's resource, else the schedule's name), so the slot's policy
    /// decides what happens when the last firing still runs. Schedules
    /// survive restarts; firings missed while the daemon was down or the
    /// schedule paused follow its --missed (once: one catch-up; skip: none).
    #[command(after_long_help = "EXAMPLES:
  host schedule add nightly --cron '0 3 * * *' --tz Europe/Berlin target/plugins/hello.wasm --input backup
  host schedule ls
  host schedule pause nightly
  host schedule resume nightly
  host schedule run nightly --wait
  host schedule rm nightly")]
    Schedule(client::schedule::ScheduleArgs),
    /// Show the controller's slots: state, owners of capacity, queue depth, time in state.
    #[command(after_long_help = "EXAMPLES:\n  host slots\n  host slots --json")]
    Slots(client::tasks::SlotsArgs),
    /// Set, remove or list the operator's slot rules: how many owners a slot (or a pattern of slots) may hold at once, and how many submissions may wait in it.
    #[command(subcommand_required = true)]
    Slot(client::slot::SlotArgs),
    /// Add, change, remove or list namespaces: several teams on one daemon, each with its own tasks, slots and schedules, its quotas and its share of the run permits.
    #[command(subcommand_required = true)]
    Ns(client::ns::NsArgs),
    /// Deploy a plugin by name and version: it becomes the name's current version, which `host submit NAME` runs.
    ///
    /// The name and version are the plugin's declared ones unless --name
    /// and --version say otherwise. Tasks keep the version they were
    /// submitted with through later deploys and rollbacks; a schedule of
    /// NAME follows its current version at each firing.
    #[command(
        disable_version_flag = true,
        after_long_help = "EXAMPLES:\n  host deploy resize.wasm\n  host deploy oci://registry.example:5000/tools/resize:1.4.0\n  host deploy build/resize.wasm --name resize --version 1.4.0\n  host submit resize --param w=200\n  host submit resize@1.3.2"
    )]
    Deploy(client::deploy::DeployArgs),
    /// Publish a deployment's version (or a .wasm file) to an OCI registry, in the layout `wkg`, wasmCloud and Spin use.
    #[command(
        after_long_help = "EXAMPLES:\n  host push resize oci://registry.example:5000/tools/resize:1.4.0\n  host push resize@1.3.2 oci://registry.example:5000/tools/resize:1.3.2\n  host push build/resize.wasm oci://localhost:5000/resize:dev --registry-ca-file ca.pem"
    )]
    Push(client::deploy::PushArgs),
    /// List deployments, show one's history, or remove a version.
    #[command(subcommand_required = true)]
    Deployments(client::deploy::DeploymentsArgs),
    /// Make an earlier version of a deployment current again (a deploy of that version: recorded, instant).
    #[command(
        after_long_help = "EXAMPLES:\n  host rollback resize\n  host rollback resize --to 1.3.2"
    )]
    Rollback(client::deploy::RollbackArgs),
    /// List the plugins the daemon stores, or remove the ones no task needs.
    #[command(
        after_long_help = "EXAMPLES:\n  host plugins ls\n  host plugins rm 3f9a1c\n  host plugins prune"
    )]
    Plugins(client::plugins::PluginsArgs),
    /// Show or remove the key-value state guests keep through wasi:keyvalue: each slot's own bucket, and shared ones.
    ///
    /// A guest opens its slot's bucket with open(""), and a shared bucket
    /// by name when its submission has --kv NAME (within the daemon's
    /// allow_kv). Each write is in the store before the guest's call
    /// returns, so state survives a crash and a restart.
    #[command(subcommand_required = true)]
    Kv(client::kv::KvArgs),
    /// Print the daemon's recent events; --follow keeps streaming.
    #[command(
        after_long_help = "EXAMPLES:\n  host events\n  host events --follow --task nap\n  host events --kind task-finished --json"
    )]
    Events(client::streams::EventsArgs),
    /// Print a task's guest output and log lines; --follow keeps streaming.
    #[command(after_long_help = "EXAMPLES:\n  host logs nap\n  host logs 42 --follow --json")]
    Logs(client::streams::LogsArgs),
    /// Shut the daemon down gracefully.
    #[command(after_long_help = "EXAMPLES:\n  host shutdown\n  host shutdown --grace 0s --json")]
    Shutdown(client::admin::ShutdownArgs),
    /// Print this host's version and the running daemon's.
    #[command(
        after_long_help = "EXAMPLES:\n  host version\n  host --socket /tmp/h.sock version --json"
    )]
    Version(tools::VersionArgs),
    /// Print a shell completion script.
    ///
    /// Load it in the current shell, or install it where your shell looks.
    #[command(
        after_long_help = "EXAMPLES:\n  source <(host completions bash)\n  host completions zsh > ~/.zfunc/_host\n  host completions fish > ~/.config/fish/completions/host.fish"
    )]
    Completions(tools::CompletionsArgs),
    /// Print the man page (or write one per verb into a directory).
    #[command(
        after_long_help = "EXAMPLES:\n  host man | man -l -\n  host man --out-dir /usr/local/share/man/man1"
    )]
    Man(tools::ManArgs),
    /// Create a plugin crate that builds and runs as it is.
    ///
    /// Writes Cargo.toml (a cdylib depending on the guest SDK), src/lib.rs
    /// (a plugin that greets its input), .cargo/config.toml (builds for
    /// wasm32-wasip2) and rust-toolchain.toml.
    #[command(
        after_long_help = "EXAMPLES:\n  host new greeter\n  (cd greeter && cargo build --release)\n  host run greeter/target/wasm32-wasip2/release/greeter.wasm --input world"
    )]
    New(tools::NewArgs),
}

/// Parses the command line, runs the verb, returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // reqwest's rustls (the OTLP exporter's client, the registry verbs'
    // through oci-client) takes the process's crypto provider: ring's, the
    // one the listener and the guests' outbound HTTP use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let json_logs =
        matches!(&cli.command, Command::Serve(a) if a.log_format == serve::LogFormat::Json);
    let default_level = if matches!(cli.command, Command::Serve(_)) {
        // The database's own clients say each lost connection; the node
        // says an outage once (and every 10 s), so theirs are left out.
        "info,deadpool.postgres=error,tokio_postgres=warn"
    } else {
        // The registry verbs' errors say what the TLS verifier found.
        "warn,rustls_platform_verifier=off"
    };
    // Only the verbs that run tasks export traces (a `host ps` with the
    // variables set in the environment starts no exporter).
    let otlp = match &cli.command {
        Command::Serve(args) => telemetry::otlp_target(args.otlp().as_deref()),
        Command::Run(args) => telemetry::otlp_target(args.otlp.otlp.as_deref()),
        _ => Ok(None),
    };
    let telemetry =
        match otlp.and_then(|target| telemetry::init(default_level, json_logs, target.as_ref())) {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
    // The daemon's runtime has one worker per core unless told otherwise;
    // the other verbs need little.
    let workers = match &cli.command {
        Command::Serve(args) => args.worker_threads(),
        _ => 2,
    };
    // A one-shot run has one task: its thread is enough, and starting
    // workers would cost more than the task.
    let mut builder = match &cli.command {
        Command::Run(_) | Command::Replay(_) => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(workers);
            builder
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let socket = cli.socket;
    client::set_namespace(cli.namespace, cli.all_namespaces);
    if let Err(err) = client::set_remote(cli.remote, cli.token_file, cli.ca_file) {
        eprintln!("error: {err:#}");
        return ExitCode::from(err.downcast_ref::<ExitError>().map_or(1, |e| e.code));
    }
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(*args).await,
            Command::Inspect(args) => inspect::inspect(args).await,
            Command::Replay(args) => replay::replay(args, socket).await,
            Command::Record(args) => client::record::record(args, socket).await,
            Command::Serve(args) => serve::serve_cmd(*args, socket).await,
            Command::Submit(args) => client::submit::submit(*args, socket).await,
            Command::Wait(args) => client::tasks::wait(args, socket).await,
            Command::Rerun(args) => client::tasks::rerun(args, socket).await,
            Command::Cancel(args) => client::tasks::cancel(args, true, socket).await,
            Command::Remove(args) => client::tasks::cancel(args, false, socket).await,
            Command::Ps(args) => client::tasks::ps(args, socket).await,
            Command::Slots(args) => client::tasks::slots(args, socket).await,
            Command::Schedule(args) => client::schedule::schedule(args, socket).await,
            Command::Plugins(args) => client::plugins::plugins(args, socket).await,
            Command::Deploy(args) => client::deploy::deploy(args, socket).await,
            Command::Push(args) => client::deploy::push(args, socket).await,
            Command::Deployments(args) => client::deploy::deployments(args, socket).await,
            Command::Rollback(args) => client::deploy::rollback(args, socket).await,
            Command::Kv(args) => client::kv::kv(args, socket).await,
            Command::Slot(args) => client::slot::slot(args, socket).await,
            Command::Ns(args) => client::ns::ns(args, socket).await,
            Command::Events(args) => client::streams::events(args, socket).await,
            Command::Logs(args) => client::streams::logs(args, socket).await,
            Command::Shutdown(args) => client::admin::shutdown(args, socket).await,
            Command::Version(args) => tools::version(args, socket).await,
            Command::Completions(args) => tools::completions(args),
            Command::Man(args) => tools::man(args),
            Command::New(args) => tools::new(args),
        }
    });
    // Do not wait for stray blocking work (a compile of a plugin we no longer
    // need) on the way out; but with spans to export, let the tasks be
    // dropped first (briefly), so that their spans are closed and in the
    // exporter's last batch rather than dropped after it.
    if telemetry.exports() {
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    } else {
        runtime.shutdown_background();
    }
    telemetry.shutdown();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // An error may quote a daemon's answer, or a name a guest chose.
            let message = format!("error: {err:#}");
            eprintln!("{}", report::visible_lines(&message));
            ExitCode::from(err.downcast_ref::<ExitError>().map_or(1, |e| e.code))
        }
    }
}
