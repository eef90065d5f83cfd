//! Owns the daemon's connections and what each request does: the accept loop
//! (bounded), the per-connection handshake, reader and writer (many
//! requests in flight, streaming replies), plugin uploads, submissions into
//! the controller, and graceful shutdown on a signal or a request.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::controller::{Controller, ControllerConfig, Submission, resolve_slot};
use crate::runtime::{
    AdmissionPolicy, Digest, DirGrant, LoadError, MAX_PLUGIN_BYTES, Plugin, Runtime, RuntimeConfig,
    Sandbox,
};
use crate::supervisor::{
    BackoffPolicy, Jitter, PluginBody, Received, RestartPolicy, ShutdownReport, Supervisor,
    SupervisorConfig, TaskBody, TaskPhase, TaskReport, TaskSpec, TracingBridge,
};
use crate::units::format_duration;

use super::config::DaemonConfig;
use super::protocol::{
    Envelope, ErrorKind, FrameError, Hello, MAGIC, PROTOCOL_VERSION, Reply, Request, SubmitRequest,
    Target, Welcome, WireEvent, WireReport, WireSlot, WireTask, encode, read_frame, write_frame,
};
use super::tasks::{TaskRecord, Tasks};
use super::{plugin_path, socket};

/// Requests one connection may have in flight before the daemon stops
/// reading from it.
const MAX_IN_FLIGHT: usize = 64;
/// Replies buffered per connection before request handlers wait.
const REPLY_BUFFER: usize = 256;
/// Plugin uploads one connection may have open at once.
const MAX_UPLOADS: usize = 2;
/// Recent events kept for `host events` without `--follow`.
const EVENT_HISTORY: usize = 1_000;
/// How long a client has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long, after the shutdown, open connections get to deliver their last
/// replies (the final reports of waiters, the shutdown answer) before the
/// process exits.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// Everything the request handlers share.
struct Daemon {
    config: DaemonConfig,
    runtime: Arc<Runtime>,
    controller: Controller,
    tasks: Tasks,
    events: Mutex<VecDeque<WireEvent>>,
    /// The seq of the newest event `record_events` has taken in.
    recorded: watch::Sender<u64>,
    stop: watch::Sender<Option<Duration>>,
}

/// Runs the daemon until SIGINT, SIGTERM or a shutdown request; removes
/// the socket on the way out. Logs go to stderr through `tracing`.
pub async fn serve(socket_path: PathBuf, config: DaemonConfig) -> Result<(), String> {
    socket::prepare_dir(&socket_path)?;
    if socket_path.exists() {
        if UnixStream::connect(&socket_path).await.is_ok() {
            return Err(format!(
                "a daemon is already listening on `{}`; stop it with `host shutdown` or choose another --socket",
                socket_path.display()
            ));
        }
        // Only a socket is a stale daemon's to replace; never delete a file.
        let is_socket = std::fs::symlink_metadata(&socket_path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        if !is_socket {
            return Err(format!(
                "`{}` exists and is not a socket; choose another --socket",
                socket_path.display()
            ));
        }
        std::fs::remove_file(&socket_path).map_err(|e| {
            format!(
                "cannot remove the stale socket `{}`: {e}",
                socket_path.display()
            )
        })?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(config.state_dir.join("plugins"))
        .map_err(|e| {
            format!(
                "cannot create the state directory `{}`: {e}",
                config.state_dir.display()
            )
        })?;

    let runtime = Runtime::new(&RuntimeConfig {
        cache_dir: Some(config.state_dir.join("wasmtime-cache")),
        epoch_tick: config.epoch_tick,
        pool_instances: config.pool_instances,
        ..RuntimeConfig::default()
    })
    .map_err(|e| e.to_string())?;
    // Attempts wait for a permit rather than find the instance pool full.
    let mut max_concurrent = config.max_concurrent;
    if let Some(capacity) = runtime.allocator().attempt_capacity()
        && capacity < max_concurrent
    {
        tracing::warn!(
            "max_concurrent {max_concurrent} is more than the instance pool holds; \
             running at most {capacity} attempts at once (raise --pool-instances)"
        );
        max_concurrent = capacity;
    }
    // No subscriber lane of its own for tracing: `record_events` reads the
    // bus anyway and bridges to tracing, saving a thread wake-up per event.
    let supervisor = Supervisor::new(SupervisorConfig {
        max_concurrent: Some(max_concurrent),
        grace: config.grace,
        bus_capacity: config.event_lane_capacity,
        ..SupervisorConfig::default()
    });
    let controller = Controller::new(
        supervisor,
        ControllerConfig {
            max_slot_queue: config.max_slot_queue,
            max_total_pending: config.max_total_pending,
            ..ControllerConfig::default()
        },
    );
    let listener = UnixListener::bind(&socket_path)
        .map_err(|e| format!("cannot listen on `{}`: {e}", socket_path.display()))?;
    socket::restrict(&socket_path)?;

    let (stop, mut stop_rx) = watch::channel(None);
    let daemon = Arc::new(Daemon {
        config: config.clone(),
        runtime: Arc::new(runtime),
        controller,
        tasks: Tasks::default(),
        events: Mutex::new(VecDeque::new()),
        recorded: watch::channel(0).0,
        stop,
    });
    tokio::spawn(record_events(Arc::clone(&daemon)));
    tracing::info!(
        socket = %socket_path.display(),
        state_dir = %config.state_dir.display(),
        allocator = ?daemon.runtime.allocator(),
        max_concurrent,
        "taskhost daemon listening"
    );
    eprintln!("taskhost daemon listening on {}", socket_path.display());

    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| e.to_string())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let grace = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of file descriptors and the like: do not spin.
                        tracing::warn!("accept failed: {err}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                    tracing::warn!("connection refused: {} connections are open", config.max_connections);
                    continue;
                };
                let daemon = Arc::clone(&daemon);
                tokio::spawn(async move {
                    if let Err(err) = connection(daemon, stream).await {
                        tracing::debug!("connection ended: {err}");
                    }
                    drop(permit);
                });
            }
            _ = interrupt.recv() => break config.grace,
            _ = terminate.recv() => break config.grace,
            changed = stop_rx.changed() => {
                if changed.is_ok() && let Some(grace) = *stop_rx.borrow() {
                    break grace;
                }
            }
        }
    };
    // Stop taking connections first, so nobody submits into a closing host.
    drop(listener);
    let _ = std::fs::remove_file(&socket_path);
    eprintln!(
        "taskhost daemon shutting down (grace {})",
        format_duration(grace)
    );
    // Single-flight: if a client asked for the shutdown, this is its report.
    let report = daemon.controller.shutdown(grace).await;
    match &report {
        ShutdownReport::AllStopped => eprintln!("all tasks stopped within the grace"),
        ShutdownReport::GraceExceeded { stuck } => {
            eprintln!("force-aborted after the grace: {}", stuck.join(", "));
        }
    }
    // Every task has ended, so every waiter's report is on its way: let the
    // connections put them on the wire before the process exits (a client
    // gets its report and leaves; one that lingers is not waited for long).
    let all = u32::try_from(config.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(FLUSH_GRACE, connections.acquire_many(all)).await;
    Ok(())
}

/// Keeps the most recent events for `host events` without `--follow`, and
/// bridges every event to the daemon's `tracing` log.
async fn record_events(daemon: Arc<Daemon>) {
    let mut stream = daemon.controller.supervisor().subscribe();
    while let Some(received) = stream.recv().await {
        if let Received::Event(event) = received {
            TracingBridge::trace(&event);
            let mut events = daemon.events.lock().unwrap_or_else(PoisonError::into_inner);
            if events.len() == EVENT_HISTORY {
                events.pop_front();
            }
            events.push_back(wire_event(&event));
            drop(events);
            daemon.recorded.send_replace(event.seq);
        }
    }
}

fn wire_event(event: &crate::supervisor::Event) -> WireEvent {
    WireEvent {
        seq: event.seq,
        kind: format!("{:?}", event.kind),
        task_id: event.task_id,
        name: event.name.as_deref().map(str::to_owned),
        json: serde_json::to_string(event).unwrap_or_default(),
    }
}

/// Serves one client: handshake, then requests until it leaves. Any
/// framing error ends this connection only.
async fn connection(daemon: Arc<Daemon>, stream: UnixStream) -> Result<(), FrameError> {
    let (mut reader, mut writer) = stream.into_split();
    let hello: Hello = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut reader))
        .await
        .map_err(|_| FrameError::Malformed("no hello within 5s".into()))??;
    if hello.magic != MAGIC {
        return Err(FrameError::Malformed("not a taskhost client".into()));
    }
    write_frame(
        &mut writer,
        &Welcome {
            version: PROTOCOL_VERSION,
            daemon: env!("CARGO_PKG_VERSION").to_owned(),
        },
    )
    .await?;
    if hello.version != PROTOCOL_VERSION {
        return Err(FrameError::Malformed(format!(
            "protocol version {} is not {PROTOCOL_VERSION}",
            hello.version
        )));
    }

    let (tx, mut rx) = mpsc::channel::<Envelope<Reply>>(REPLY_BUFFER);
    let writer_task = tokio::spawn(async move {
        // Replies that are ready together go out in one write: a pipelining
        // client gets many replies per system call.
        let mut batch = Vec::new();
        while let Some(reply) = rx.recv().await {
            batch.clear();
            let mut next = Some(reply);
            while let Some(reply) = next {
                match encode(&reply) {
                    Ok(frame) => batch.extend_from_slice(&frame),
                    Err(err) => tracing::warn!("a reply could not be encoded: {err}"),
                }
                next = if batch.len() < 256 * 1024 {
                    rx.try_recv().ok()
                } else {
                    None
                };
            }
            if writer.write_all(&batch).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
    });
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let uploads: Arc<Mutex<HashMap<[u8; 32], Vec<u8>>>> = Arc::default();
    let gone = CancellationToken::new();
    let result = loop {
        let request: Envelope<Request> = match read_frame(&mut reader).await {
            Ok(request) => request,
            Err(FrameError::Closed) => break Ok(()),
            Err(err) => break Err(err),
        };
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break Ok(());
        };
        let daemon = Arc::clone(&daemon);
        let tx = tx.clone();
        let uploads = Arc::clone(&uploads);
        let gone = gone.clone();
        tokio::spawn(async move {
            let id = request.id;
            let reply = Replier { id, tx, gone };
            handle(&daemon, request.body, &reply, &uploads).await;
            drop(permit);
        });
    };
    // The client is gone: end its waits and streams (they only served it),
    // so a vanished waiter does not hold this connection until its task ends.
    gone.cancel();
    drop(tx);
    let _ = writer_task.await;
    result
}

/// Sends replies for one request.
struct Replier {
    id: u32,
    tx: mpsc::Sender<Envelope<Reply>>,
    /// Cancelled when the client has closed the connection.
    gone: CancellationToken,
}

impl Replier {
    /// Awaits `work` unless the client leaves first (then `None`).
    async fn until_gone<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            out = work => Some(out),
            () = self.gone.cancelled() => None,
        }
    }

    /// False once the client is gone.
    async fn send(&self, body: Reply) -> bool {
        self.tx.send(Envelope { id: self.id, body }).await.is_ok()
    }

    async fn error(&self, kind: ErrorKind, message: impl Into<String>) {
        self.send(Reply::Error {
            kind,
            message: message.into(),
        })
        .await;
    }
}

async fn handle(
    daemon: &Arc<Daemon>,
    request: Request,
    reply: &Replier,
    uploads: &Mutex<HashMap<[u8; 32], Vec<u8>>>,
) {
    match request {
        Request::HasPlugin(digest) => {
            let known = daemon.plugin(&Digest(digest)).await.is_some();
            reply.send(Reply::HasPlugin(known)).await;
        }
        Request::Upload {
            digest,
            offset,
            data,
            last,
        } => upload(daemon, reply, uploads, digest, offset, data, last).await,
        Request::Submit(request) => submit(daemon, reply, *request).await,
        Request::Wait(target) => match daemon.tasks.get(&target) {
            Some(record) => {
                let Some(report) = reply.until_gone(record.waiter.report()).await else {
                    return;
                };
                reply.send(Reply::Report(wire_report(&report))).await;
            }
            None => reply.error(ErrorKind::NotFound, not_found(&target)).await,
        },
        Request::Cancel { target, wait } => {
            let Some(record) = daemon.tasks.get(&target) else {
                reply.error(ErrorKind::NotFound, not_found(&target)).await;
                return;
            };
            let claimed = daemon.controller.remove(record.id);
            let report = if wait {
                let Some(report) = reply.until_gone(record.waiter.report()).await else {
                    return;
                };
                Some(wire_report(&report))
            } else {
                None
            };
            reply.send(Reply::Canceled { claimed, report }).await;
        }
        Request::List => {
            let registered: HashMap<u64, crate::supervisor::TaskInfo> = daemon
                .controller
                .supervisor()
                .list()
                .into_iter()
                .map(|t| (t.id, t))
                .collect();
            let mut rows = Vec::new();
            for record in daemon.tasks.all() {
                if record.waiter.try_outcome().is_some() {
                    continue;
                }
                let (state, attempts) = match registered.get(&record.id) {
                    Some(info) => (phase_name(info.phase), info.attempts),
                    None if daemon.controller.queued_slot(record.id).is_some() => ("queued", 0),
                    None => ("admitting", 0),
                };
                rows.push(WireTask {
                    id: record.id,
                    name: record.name,
                    slot: record.slot,
                    state: state.to_owned(),
                    attempts,
                });
            }
            reply.send(Reply::Tasks(rows)).await;
        }
        Request::Slots => {
            let rows = daemon
                .controller
                .snapshot()
                .into_iter()
                .map(|s| WireSlot {
                    key: s.key,
                    state: format!("{:?}", s.state).to_lowercase(),
                    owner: s.owner,
                    queue_depth: s.queue_depth as u64,
                    in_state_ms: s.in_state_for.as_millis() as u64,
                })
                .collect();
            reply.send(Reply::Slots(rows)).await;
        }
        Request::Events { follow } => {
            // Subscribe before copying the history, and let the history
            // catch up with the events published before the subscription,
            // so nothing falls between (a gap left by a recorder that fell
            // behind is reported as dropped).
            let (mut live, before) = daemon.controller.supervisor().bus().subscribe_after();
            let mut recorded = daemon.recorded.subscribe();
            let _ = tokio::time::timeout(
                Duration::from_millis(500),
                recorded.wait_for(|seq| *seq >= before),
            )
            .await;
            let history: Vec<WireEvent> = daemon
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned()
                .collect();
            let history: Vec<WireEvent> = history.into_iter().filter(|e| e.seq <= before).collect();
            let last_seq = history.last().map_or(0, |e| e.seq);
            for event in history {
                if !reply.send(Reply::Event(event)).await {
                    return;
                }
            }
            if follow && last_seq < before && last_seq > 0 {
                // The recorder lost these; say so rather than skip them.
                if !reply.send(Reply::Dropped(before - last_seq)).await {
                    return;
                }
            }
            let last_seq = before;
            if follow {
                while let Some(Some(received)) = reply.until_gone(live.recv()).await {
                    let sent = match received {
                        Received::Event(e) if e.seq <= last_seq => true,
                        Received::Event(e) => reply.send(Reply::Event(wire_event(&e))).await,
                        Received::Dropped(n) => reply.send(Reply::Dropped(n)).await,
                    };
                    if !sent {
                        return;
                    }
                }
            }
            reply.send(Reply::End).await;
        }
        Request::Logs { target, follow } => {
            let Some(record) = daemon.tasks.get(&target) else {
                reply.error(ErrorKind::NotFound, not_found(&target)).await;
                return;
            };
            let (lines, mut live) = record.log.follow();
            for line in lines {
                if !reply.send(Reply::Log(line)).await {
                    return;
                }
            }
            if follow && record.waiter.try_outcome().is_none() {
                loop {
                    let Some(received) = reply.until_gone(live.recv()).await else {
                        return;
                    };
                    match received {
                        Ok(Some(line)) => {
                            if !reply.send(Reply::Log(line)).await {
                                return;
                            }
                        }
                        Ok(None) | Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            if !reply.send(Reply::Dropped(n)).await {
                                return;
                            }
                        }
                    }
                }
            }
            reply.send(Reply::End).await;
        }
        Request::Shutdown { grace_ms } => {
            let grace = grace_ms.map_or(daemon.config.grace, Duration::from_millis);
            let report = daemon.controller.shutdown(grace).await;
            let stuck = match report {
                ShutdownReport::AllStopped => Vec::new(),
                ShutdownReport::GraceExceeded { stuck } => stuck,
            };
            reply.send(Reply::ShutdownDone { stuck }).await;
            // Give the writer a moment to put the reply on the wire, then
            // let the accept loop finish (it reuses the same report).
            tokio::task::yield_now().await;
            let _ = daemon.stop.send(Some(grace));
        }
    }
}

fn phase_name(phase: TaskPhase) -> &'static str {
    match phase {
        TaskPhase::Waiting => "waiting",
        TaskPhase::Running => "running",
        TaskPhase::BackingOff => "backing-off",
        TaskPhase::Stopping => "stopping",
        TaskPhase::Finishing => "finishing",
    }
}

fn not_found(target: &Target) -> String {
    match target {
        Target::Id(id) => format!("no task with id {id} (see `host ps`)"),
        Target::Name(name) => format!("no task named `{name}` (see `host ps`)"),
    }
}

fn wire_report(report: &TaskReport) -> WireReport {
    WireReport {
        id: report.id,
        name: report.name.to_string(),
        slot: report.slot.to_string(),
        outcome: report.outcome.clone(),
        attempts: report.attempts,
        history: report
            .history
            .iter()
            .map(|r| {
                format!(
                    "attempt {}: {} ({})",
                    r.attempt,
                    r.result,
                    format_duration(r.duration)
                )
            })
            .collect(),
    }
}

/// Adds a chunk to this connection's upload of `digest`; the whole plugin
/// once `last` arrives.
fn take_chunk(
    uploads: &Mutex<HashMap<[u8; 32], Vec<u8>>>,
    digest: [u8; 32],
    offset: u64,
    data: Vec<u8>,
    last: bool,
) -> Result<Option<Vec<u8>>, String> {
    let mut uploads = uploads.lock().unwrap_or_else(PoisonError::into_inner);
    if !uploads.contains_key(&digest) && uploads.len() >= MAX_UPLOADS {
        return Err("too many uploads in flight on this connection".into());
    }
    let buf = uploads.entry(digest).or_default();
    if offset != buf.len() as u64 {
        uploads.remove(&digest);
        return Err("upload chunks out of order; start the upload again".into());
    }
    if buf.len() + data.len() > MAX_PLUGIN_BYTES {
        uploads.remove(&digest);
        return Err(format!(
            "the plugin is over the limit of {MAX_PLUGIN_BYTES} bytes"
        ));
    }
    buf.extend_from_slice(&data);
    Ok(if last { uploads.remove(&digest) } else { None })
}

#[allow(clippy::too_many_arguments)]
async fn upload(
    daemon: &Arc<Daemon>,
    reply: &Replier,
    uploads: &Mutex<HashMap<[u8; 32], Vec<u8>>>,
    digest: [u8; 32],
    offset: u64,
    data: Vec<u8>,
    last: bool,
) {
    let complete = match take_chunk(uploads, digest, offset, data, last) {
        Ok(complete) => complete,
        Err(message) => {
            reply.error(ErrorKind::Invalid, message).await;
            return;
        }
    };
    let Some(bytes) = complete else {
        reply.send(Reply::Uploaded { plugin: None }).await;
        return;
    };
    if Digest::of(&bytes) != Digest(digest) {
        reply
            .error(
                ErrorKind::Invalid,
                "the uploaded bytes do not match their digest",
            )
            .await;
        return;
    }
    match daemon.store_plugin(bytes).await {
        Ok(plugin) => {
            reply
                .send(Reply::Uploaded {
                    plugin: Some(plugin.info().name.clone()),
                })
                .await;
        }
        Err(err) => reply.error(ErrorKind::Invalid, err.to_string()).await,
    }
}

async fn submit(daemon: &Arc<Daemon>, reply: &Replier, request: SubmitRequest) {
    match build_submission(daemon, request).await {
        Ok((id, submission, log)) => {
            let name = submission.spec.name().to_owned();
            let slot = submission.spec.slot().unwrap_or(&name).to_owned();
            let waiter = daemon.controller.submit_with_id(id, submission);
            let queued = daemon.controller.queued_slot(id).is_some();
            let rejected = waiter
                .try_outcome()
                .filter(|o| matches!(o, crate::outcome::TaskOutcome::Rejected { .. }));
            daemon.tasks.insert(TaskRecord {
                id,
                name: name.clone(),
                slot: slot.clone(),
                waiter: waiter.clone(),
                log: Arc::clone(&log),
            });
            let watcher = Arc::clone(daemon);
            tokio::spawn(async move {
                waiter.report().await;
                log.close();
                watcher.tasks.finished(id);
            });
            reply
                .send(Reply::Submitted {
                    id,
                    name,
                    slot,
                    queued,
                    rejected,
                })
                .await;
        }
        Err((kind, message)) => reply.error(kind, message).await,
    }
}

type Built = (u64, Submission, Arc<super::tasks::TaskLog>);

async fn build_submission(
    daemon: &Arc<Daemon>,
    request: SubmitRequest,
) -> Result<Built, (ErrorKind, String)> {
    let invalid = |m: String| (ErrorKind::Invalid, m);
    if daemon.controller.supervisor().is_shutting_down() {
        return Err((
            ErrorKind::ShuttingDown,
            "the daemon is shutting down".into(),
        ));
    }
    let plugin = daemon
        .plugin(&Digest(request.digest))
        .await
        .ok_or_else(|| {
            invalid(format!(
                "the daemon does not know plugin {}; upload it first",
                Digest(request.digest)
            ))
        })?;
    let info = plugin.info();
    let id = daemon.controller.supervisor().next_id();
    let name = request
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{id}", info.name));
    let slot = resolve_slot(
        request.slot.as_deref(),
        info.resource.as_ref(),
        &request.params,
        &name,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let policy = match request.policy.as_deref() {
        None => info.default_policy,
        Some("queue") => AdmissionPolicy::Queue,
        Some("replace") => AdmissionPolicy::Replace,
        Some("drop-if-running") => AdmissionPolicy::DropIfRunning,
        Some(other) => {
            return Err(invalid(format!(
                "unknown policy `{other}`: use queue, replace or drop-if-running"
            )));
        }
    };
    let sandbox = Sandbox {
        dirs: request
            .dirs
            .iter()
            .map(|d| DirGrant {
                host: PathBuf::from(&d.host),
                guest: d.guest.clone(),
                read_only: d.read_only,
            })
            .collect(),
        env: request.env.clone(),
        max_memory: request.max_memory.unwrap_or(daemon.config.max_memory),
    };
    if sandbox.max_memory < 64 << 10 {
        return Err(invalid(
            "--max-memory must be at least 64KiB (one WebAssembly page)".into(),
        ));
    }
    sandbox.check_dirs().map_err(|e| invalid(e.to_string()))?;
    sandbox
        .check_capabilities(&info.capabilities)
        .map_err(|e| invalid(e.to_string()))?;
    let restart = match (request.restart.as_deref(), request.every_ms) {
        (Some("never") | Some("on-failure"), Some(_)) => {
            return Err(invalid(
                "--every needs --restart always (or no --restart)".into(),
            ));
        }
        (Some("always") | None, Some(ms)) => RestartPolicy::Always {
            interval: Duration::from_millis(ms),
        },
        (Some("always"), None) => RestartPolicy::Always {
            interval: Duration::ZERO,
        },
        (Some("on-failure"), None) => RestartPolicy::OnFailure,
        (Some("never") | None, None) => RestartPolicy::Never,
        (Some(other), _) => return Err(invalid(format!("unknown restart policy `{other}`"))),
    };
    let log = Tasks::new_log();
    let body = TaskBody::Plugin(PluginBody {
        runtime: Arc::clone(&daemon.runtime),
        plugin,
        input: request.input.into(),
        params: request.params,
        sandbox: Arc::new(sandbox),
        sink: Some(log.clone()),
    });
    let mut spec = TaskSpec::from_defaults(name, body)
        .with_slot(slot)
        .with_restart(restart)
        .with_max_retries(request.max_retries)
        .with_timeout(Duration::from_millis(request.timeout_ms.unwrap_or(0)));
    if let Some((first, max, factor, jitter)) = request.backoff {
        let jitter = match jitter.as_str() {
            "none" => Jitter::None,
            "full" => Jitter::Full,
            "equal" => Jitter::Equal,
            "decorrelated" => Jitter::Decorrelated,
            other => return Err(invalid(format!("unknown jitter `{other}`"))),
        };
        let backoff = BackoffPolicy::new(
            Duration::from_millis(first),
            Duration::from_millis(max),
            factor,
            jitter,
        )
        .map_err(|e| invalid(e.to_string()))?;
        spec = spec.with_backoff(backoff);
    }
    Ok((id, Submission::new(spec, policy), log))
}

impl Daemon {
    /// A plugin by digest: from the runtime's cache, else from the state
    /// directory (compiled on first use).
    async fn plugin(&self, digest: &Digest) -> Option<Arc<Plugin>> {
        if let Some(plugin) = self.runtime.plugin(digest) {
            return Some(plugin);
        }
        let path = plugin_path(&self.config.state_dir, digest);
        let bytes = tokio::fs::read(&path).await.ok()?;
        if Digest::of(&bytes) != *digest {
            tracing::warn!(path = %path.display(), "a stored plugin does not match its digest; ignoring it");
            return None;
        }
        self.runtime
            .load_bytes(bytes.into(), &digest.to_string())
            .await
            .ok()
    }

    /// Validates an uploaded plugin and stores it under its digest.
    async fn store_plugin(&self, bytes: Vec<u8>) -> Result<Arc<Plugin>, LoadError> {
        let digest = Digest::of(&bytes);
        let bytes: Arc<[u8]> = bytes.into();
        let plugin = self
            .runtime
            .load_bytes(Arc::clone(&bytes), &digest.to_string())
            .await?;
        let path = plugin_path(&self.config.state_dir, &digest);
        if !path.exists() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let written = tokio::fs::write(&tmp, &bytes)
                .await
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(err) = written {
                tracing::warn!(path = %path.display(), "cannot store the plugin on disk: {err}");
            }
        }
        Ok(plugin)
    }
}

/// The state directory default: `$XDG_STATE_HOME/taskhost`, else
/// `~/.local/state/taskhost`.
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("taskhost")
}
