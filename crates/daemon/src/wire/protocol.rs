//! Owns the wire: the messages exchanged over the daemon's socket, the
//! version handshake, and the framing (a 4-byte big-endian length, then a
//! postcard body of at most [`MAX_FRAME`] bytes). Every message carries the
//! library's own types in their serde form (policies, reports, events, slot
//! views), so nothing is parsed twice. Decoding never trusts a length prefix
//! for allocation: a frame's buffer grows only as its bytes arrive, and a
//! prefix over the maximum ends the connection. Replies that could outgrow a
//! frame are sent in parts: a task's output as [`Reply::OutputPart`]s before
//! its [`Reply::Report`], task and slot lists as pages ended by [`Reply::End`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use taskhost_core::admission::{AdmissionPolicy, SlotView};
pub use taskhost_core::lifecycle::{Placement, TaskState};
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{OutcomeKind, TaskOutcome};
use taskhost_core::supervisor::{
    BackoffPolicy, Event, EventKind, RestartPolicy, ShutdownReport, TaskId, TaskRef, TaskReport,
};
use taskhost_runtime::{Digest, DirGrant, HttpAllow, SecretRef};

/// The protocol version; both sides must agree.
pub const PROTOCOL_VERSION: u32 = 13;
/// The largest frame accepted in either direction.
pub const MAX_FRAME: usize = 4 << 20;
/// Plugin bytes per upload chunk (well under [`MAX_FRAME`]).
pub const UPLOAD_CHUNK: usize = 1 << 20;
/// Output bytes per [`Reply::OutputPart`].
pub const OUTPUT_CHUNK: usize = 1 << 20;
/// Rows per page of [`Reply::Tasks`] and [`Reply::Slots`].
pub const LIST_PAGE: usize = 1_000;
/// The largest input one submission carries (the frame less room for the
/// rest of the request).
pub const MAX_SUBMIT_INPUT: usize = MAX_FRAME - (64 << 10);
/// The magic that opens a client's hello, so a stray client fails fast.
pub const MAGIC: [u8; 8] = *b"TASKHOST";

/// The first message of a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`MAGIC`].
    pub magic: [u8; 8],
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
}

/// The daemon's answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The daemon's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The daemon's build version, for `host version` and error messages.
    pub daemon: String,
}

/// A message with its request id (unique per connection; replies carry the
/// id of their request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// The request id.
    pub id: u32,
    /// The payload.
    pub body: T,
}

/// A submission as sent by `host submit`. Unset fields take the plugin's or
/// the daemon's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The plugin's digest (uploaded before, or already known).
    pub plugin: Digest,
    /// Task name [default: `<plugin>-<id>`].
    pub name: Option<String>,
    /// Explicit slot [default: the plugin's resource filled from the params,
    /// else the task name].
    pub slot: Option<String>,
    /// Policy for a busy slot [default: the plugin's].
    pub policy: Option<AdmissionPolicy>,
    /// Params, in order.
    pub params: Vec<(String, String)>,
    /// Input bytes (at most [`MAX_SUBMIT_INPUT`]).
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// Restart policy [default: never].
    pub restart: Option<RestartPolicy>,
    /// Retry budget [default: unlimited].
    pub max_retries: Option<u32>,
    /// Backoff between failed attempts [default: the supervisor's].
    pub backoff: Option<BackoffPolicy>,
    /// Per-attempt timeout; zero is none [default: none].
    pub timeout: Option<Duration>,
    /// Memory limit per linear memory, bytes [default: the daemon's].
    pub max_memory: Option<u64>,
    /// Directory grants, host paths absolute.
    pub dirs: Vec<DirGrant>,
    /// Environment grants.
    pub env: Vec<(String, String)>,
    /// Where the task's outbound HTTP requests may go (`--allow-http`);
    /// each must be within the daemon's own `allow_http`.
    pub allow_http: Vec<HttpAllow>,
    /// The client's idempotency key (`--idempotency-key`): the same key
    /// with the same request gives the task it first made, for the
    /// daemon's `idempotency_retention`.
    pub idempotency_key: Option<String>,
    /// Hold the task until then (`--delay`, `--at`): accepted at once,
    /// placed in its slot no earlier. The daemon keeps it as
    /// [`NotBefore::At`].
    pub not_before: Option<NotBefore>,
    /// Among attempts waiting for the concurrency limit, higher goes
    /// first (`--priority`) [default: 0].
    pub priority: i32,
    /// The schedule that fired it: set by the daemon, never by a client.
    /// New fields go last, each one a single zero byte when unset, so that
    /// requests stored before them still decode
    /// ([`SubmitRequest::decode_stored`]).
    pub schedule: Option<String>,
    /// Environment variables whose values are the daemon's secrets, by
    /// name (`--secret`, `--env-secret`): only the names are sent and
    /// kept; each attempt looks the values up when it starts.
    pub secrets: Vec<SecretRef>,
    /// What `wasi:config/store` answers the guest (`--config-var`), over
    /// the daemon's own `config_vars`.
    pub config: Vec<(String, String)>,
    /// Shared `wasi:keyvalue` buckets the guest may open besides its
    /// slot's (`--kv`); each must be in the daemon's `allow_kv`.
    pub kv: Vec<String>,
    /// The task that spawned this one (`taskhost:plugin/children`): set
    /// by the daemon, never by a client.
    pub parent: Option<u64>,
    /// The root of the tree of a spawned task (its parent's root, or its
    /// parent if that one has none): set by the daemon, never by a client.
    pub root: Option<u64>,
    /// How deep a spawned task is in its tree (a submitted task's children
    /// are at 1; 0 for a task nobody spawned): set by the daemon.
    pub depth: u32,
}

/// When a delayed submission may enter its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotBefore {
    /// This long after the daemon accepts it.
    After(Duration),
    /// At this time, ms since the Unix epoch.
    At(u64),
}

impl NotBefore {
    /// The time, ms since the Unix epoch, for a request accepted at
    /// `now_ms`.
    pub fn at(self, now_ms: u64) -> u64 {
        match self {
            Self::After(d) => now_ms.saturating_add(d.as_millis() as u64),
            Self::At(at) => at,
        }
    }
}

/// Fields added to [`SubmitRequest`] since protocol 4 (`allow_http`,
/// `idempotency_key`, `not_before`, `priority`, `schedule`, `secrets`,
/// `config`, `kv`, `parent`, `root`, `depth`).
const ADDED_FIELDS: usize = 11;

/// The longest idempotency key taken, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

impl SubmitRequest {
    /// Decodes a request a store kept (postcard). Fields were only ever
    /// added at the end, each of which encodes unset as one zero byte (an
    /// empty list, `None`, 0): a request stored before some of them decodes
    /// with those zero bytes added, which gives exactly the values an
    /// older daemon meant (no `allow_http` for protocols 4 and 5, no
    /// idempotency key before 7, no delay, priority or schedule before 8, no
    /// secrets before 9, no config values before 10, no shared buckets
    /// before 11, no parent before 12, no root or depth before 13).
    pub fn decode_stored(bytes: &[u8]) -> Result<Self, postcard::Error> {
        decode_padded(bytes)
    }

    /// A submission of this plugin with every default.
    pub fn new(plugin: Digest) -> Self {
        Self {
            plugin,
            name: None,
            slot: None,
            policy: None,
            params: Vec::new(),
            input: Vec::new(),
            restart: None,
            max_retries: None,
            backoff: None,
            timeout: None,
            max_memory: None,
            dirs: Vec::new(),
            env: Vec::new(),
            allow_http: Vec::new(),
            idempotency_key: None,
            not_before: None,
            priority: 0,
            schedule: None,
            secrets: Vec::new(),
            config: Vec::new(),
            kv: Vec::new(),
            parent: None,
            root: None,
            depth: 0,
        }
    }

    /// What an idempotency key is compared by: the SHA-256 of the request
    /// as the client sent it, the key left out.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest as _;
        let mut plain = self.clone();
        plain.idempotency_key = None;
        let bytes = postcard::to_allocvec(&plain).unwrap_or_default();
        sha2::Sha256::digest(&bytes).into()
    }
}

/// Which events `host events` wants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventFilter {
    /// Only events of this task (by id, or by name).
    pub task: Option<TaskRef>,
    /// Only these kinds (empty: every kind).
    pub kinds: Vec<EventKind>,
}

impl EventFilter {
    /// Whether `event` passes the filter.
    pub fn admits(&self, event: &Event) -> bool {
        let task = match &self.task {
            None => true,
            Some(TaskRef::Id(id)) => event.task_id == Some(*id),
            Some(TaskRef::Name(name)) => event.name.as_deref() == Some(name.as_str()),
        };
        task && (self.kinds.is_empty() || self.kinds.contains(&event.kind))
    }
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Is this plugin already known to the daemon?
    HasPlugin(Digest),
    /// One chunk of a plugin upload; `offset` continues this connection's
    /// upload of `digest`; `last` completes it.
    Upload {
        /// The digest of the whole plugin.
        digest: Digest,
        /// Where this chunk starts.
        offset: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Whether this is the final chunk.
        last: bool,
    },
    /// Submit a task.
    Submit(Box<SubmitRequest>),
    /// Wait for a task's final report.
    Wait(TaskRef),
    /// Submit a new task with the request of this one (as it was placed:
    /// its name, slot and policy); answered as a [`Request::Submit`].
    Rerun(TaskRef),
    /// Stop a task (or remove queued work); with `wait`, wait for its end.
    Cancel {
        /// Which task.
        target: TaskRef,
        /// Wait for the logical end.
        wait: bool,
    },
    /// Live tasks (queued ones included); with `all`, recently finished ones
    /// too. Answered with pages of [`Reply::Tasks`], then [`Reply::End`].
    List {
        /// Include recently finished tasks.
        all: bool,
    },
    /// The controller's slots: pages of [`Reply::Slots`], then
    /// [`Reply::End`].
    Slots,
    /// Recent events that pass the filter; with `follow`, then live ones
    /// until the client leaves.
    Events {
        /// Keep streaming.
        follow: bool,
        /// Which events.
        filter: EventFilter,
    },
    /// A task's log lines; with `follow`, then live ones until it ends.
    Logs {
        /// Which task.
        target: TaskRef,
        /// Keep streaming.
        follow: bool,
    },
    /// Shut the daemon down.
    Shutdown {
        /// Grace for running tasks; `None`: the daemon's own.
        grace: Option<Duration>,
        /// End every task and queued submission now (Canceled,
        /// ForceAborted, Rejected ShuttingDown) instead of keeping
        /// unfinished work in a durable store for the next start.
        cancel_all: bool,
    },
    /// The stored plugins: pages of [`Reply::Plugins`], then [`Reply::End`].
    Plugins,
    /// Remove stored plugins: the one whose digest starts with `prefix`
    /// (refused while an unfinished task uses it), or with `prefix` `None`
    /// every plugin no task uses. Answered with [`Reply::PluginsRemoved`].
    RemovePlugins {
        /// A digest or its unique prefix (hex); `None`: every unused one.
        prefix: Option<String>,
    },
    /// A verb on schedules (`host schedule …`).
    Schedule(ScheduleVerb),
    /// A verb on guests' key-value state (`host kv …`).
    Kv(KvVerb),
}

/// Which bucket `host kv` means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvTarget {
    /// A slot's own.
    Slot(String),
    /// A shared bucket (`--kv NAME`).
    Shared(String),
}

/// What `host kv` asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvVerb {
    /// With a bucket, its keys and their sizes; without, every bucket with
    /// its count of keys and bytes: pages of [`Reply::KvRows`], then
    /// [`Reply::End`].
    List(Option<KvTarget>),
    /// One value: [`Reply::KvValue`].
    Get(KvTarget, String),
    /// Removes one key: [`Reply::KvValue`] with what it held.
    Remove(KvTarget, String),
}

/// A line of `host kv ls`: a bucket (its keys, bytes) or a key (1, the
/// size of its value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvRow {
    /// `slot:NAME`, `shared:NAME`, or a key.
    pub name: String,
    /// Keys in the bucket (1 for a key).
    pub keys: u64,
    /// Bytes of keys and values (for a key, of its value).
    pub bytes: u64,
}

/// What `host schedule` asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ScheduleVerb {
    /// Store a new schedule; answered with its [`Reply::Schedule`].
    Add(Box<ScheduleSpec>),
    /// Every schedule: pages of [`Reply::Schedules`], then [`Reply::End`].
    List,
    /// Delete a schedule (its tasks go on); answered with its last row.
    Remove(String),
    /// Stop a schedule's firings until it is resumed.
    Pause(String),
    /// Let a paused schedule fire again (its missed firings as it says).
    Resume(String),
    /// Fire a schedule once now, whatever its time; answered as a submit.
    Run(String),
}

/// A schedule as `host schedule add` sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// Its name (unique; its firings are named `<name>-<id>`).
    pub name: String,
    /// The cron expression (5 fields, 6 with seconds, or `@hourly` and
    /// such).
    pub cron: String,
    /// The IANA zone its expression is read in [default: UTC].
    pub tz: Option<String>,
    /// What it does with firings missed while the host was down or it was
    /// paused.
    pub missed: crate::schedule::Missed,
    /// What each firing submits (no name: each firing gets its own).
    pub request: SubmitRequest,
}

impl ScheduleSpec {
    /// Decodes a schedule a store kept (its request as
    /// [`SubmitRequest::decode_stored`] reads one).
    pub fn decode_stored(bytes: &[u8]) -> Result<Self, postcard::Error> {
        decode_padded(bytes)
    }
}

/// Decodes a stored value whose last part is a [`SubmitRequest`] (see
/// [`SubmitRequest::decode_stored`]): as it is, else with the zero bytes of
/// the fields added since it was stored.
fn decode_padded<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, postcard::Error> {
    let current = postcard::from_bytes::<T>(bytes);
    if current.is_ok() {
        return current;
    }
    let mut padded = bytes.to_vec();
    for added in 1..=ADDED_FIELDS {
        padded.resize(bytes.len() + added, 0);
        if let Ok(old) = postcard::from_bytes::<T>(&padded) {
            return Ok(old);
        }
    }
    current
}

/// A schedule as `host schedule ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRow {
    /// Its name.
    pub name: String,
    /// Its cron expression.
    pub cron: String,
    /// Its zone.
    pub tz: String,
    /// What it does with missed firings.
    pub missed: crate::schedule::Missed,
    /// Whether it is paused.
    pub paused: bool,
    /// Its plugin's name.
    pub plugin: String,
    /// Its plugin's digest.
    pub digest: Digest,
    /// The slot its firings ask for, when given (else the plugin's
    /// resource, else the schedule's name).
    pub slot: Option<String>,
    /// The policy of its firings for a busy slot, when given (else the
    /// plugin's).
    pub policy: Option<AdmissionPolicy>,
    /// Its firings' priority.
    pub priority: i32,
    /// Its next firing, ms since the Unix epoch (none while paused, or if
    /// it never fires again).
    pub next_ms: Option<u64>,
    /// When it last fired (the due time that firing served).
    pub last_fire_ms: Option<u64>,
    /// The task its last firing submitted.
    pub last_task: Option<TaskId>,
    /// How that task ended, once it has.
    pub last_outcome: Option<OutcomeKind>,
    /// When it was added, ms since the Unix epoch.
    pub created_ms: u64,
}

/// The longest duration a request may carry (a timeout, an interval, a
/// backoff, a grace): ten years. Longer ones are refused when decoded, so
/// that no deadline computed from one can overflow a clock.
pub const MAX_WIRE_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl Request {
    /// Checks the durations and sizes a request carries, which serde only
    /// checked for their type: every one within [`MAX_WIRE_DURATION`], a
    /// memory limit of at least one WebAssembly page; and that a client
    /// sets nothing only the daemon sets.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Request::Submit(submit) => {
                if submit.schedule.is_some() {
                    return Err("a submission cannot name a schedule: schedules fire their \
                                own (`host schedule add`)"
                        .into());
                }
                if submit.parent.is_some() || submit.root.is_some() || submit.depth != 0 {
                    return Err("a submission cannot name a parent: a task's children are \
                                spawned by its plugin (taskhost:plugin/children)"
                        .into());
                }
                check_submit(submit)
            }
            Request::Schedule(ScheduleVerb::Add(spec)) => {
                if spec.request.parent.is_some()
                    || spec.request.root.is_some()
                    || spec.request.depth != 0
                {
                    return Err("a schedule's firings have no parent".into());
                }
                if spec.request.schedule.is_some() || spec.request.name.is_some() {
                    return Err(
                        "a schedule's firings are named `<schedule>-<id>`: it takes \
                                no task name"
                            .into(),
                    );
                }
                if spec.request.not_before.is_some() {
                    return Err("a schedule's firings take no --delay or --at".into());
                }
                if spec.request.idempotency_key.is_some() {
                    return Err("a schedule's firings take no idempotency key".into());
                }
                check_submit(&spec.request)
            }
            Request::Shutdown { grace, .. } => duration("the grace", *grace),
            _ => Ok(()),
        }
    }
}

/// A duration within [`MAX_WIRE_DURATION`].
fn duration(what: &str, d: Option<Duration>) -> Result<(), String> {
    match d {
        Some(d) if d > MAX_WIRE_DURATION => Err(format!(
            "{what} {d:?} is out of range: at most {} days",
            MAX_WIRE_DURATION.as_secs() / 86_400
        )),
        _ => Ok(()),
    }
}

/// Checks the durations and sizes of a submission (see [`Request::check`]).
fn check_submit(submit: &SubmitRequest) -> Result<(), String> {
    duration("the timeout", submit.timeout)?;
    match submit.not_before {
        Some(NotBefore::After(d)) => duration("the delay (--delay)", Some(d))?,
        Some(NotBefore::At(at)) => {
            let latest =
                crate::schedule::now_ms().saturating_add(MAX_WIRE_DURATION.as_millis() as u64);
            if at > latest {
                return Err(format!(
                    "--at {} is out of range: at most {} days from now",
                    crate::schedule::format_ms(at),
                    MAX_WIRE_DURATION.as_secs() / 86_400
                ));
            }
        }
        None => {}
    }
    if let Some(key) = &submit.idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY || key.chars().any(char::is_control))
    {
        return Err(format!(
            "the idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} bytes of printable text"
        ));
    }
    if let Some(RestartPolicy::Always { interval }) = submit.restart {
        duration("the interval (--every)", Some(interval))?;
    }
    duration(
        "the backoff",
        submit.backoff.as_ref().map(BackoffPolicy::max),
    )?;
    if let Some(bytes) = submit.max_memory
        && bytes < 64 << 10
    {
        return Err(format!(
            "the memory limit {bytes} bytes is out of range: at least 64KiB (one WebAssembly \
             page)"
        ));
    }
    Ok(())
}

/// A stored plugin, as `host plugins ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginRow {
    /// Its digest.
    pub digest: Digest,
    /// Its name, when the daemon knows it (compiled, or named by a task).
    pub name: Option<String>,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    /// Unfinished tasks that use it (queued, running, pausing).
    pub unfinished: u64,
    /// Finished tasks, still retained, that used it.
    pub finished: u64,
    /// Whether it is compiled and in the daemon's memory.
    pub loaded: bool,
}

/// The answer to a submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    /// Its id.
    pub id: TaskId,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// Where it went.
    pub placement: Placement,
    /// Made before: its idempotency key was given with the same request
    /// (`placement` is then what it was first).
    pub existing: bool,
}

/// A row of `host ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    /// Id.
    pub id: TaskId,
    /// Name.
    pub name: String,
    /// Slot.
    pub slot: String,
    /// State.
    pub state: TaskState,
    /// Attempts started.
    pub attempts: u32,
    /// Time since it was submitted.
    pub age: Duration,
    /// The last progress reported: `(done, total)`, total 0 if unknown.
    pub progress: Option<(u64, u64)>,
    /// The plugin's name.
    pub plugin: String,
    /// For a finished task, how it ended.
    pub outcome: Option<OutcomeKind>,
    /// In cluster mode, the node running it.
    pub node: Option<String>,
    /// For a delayed submission, when it is due (ms since the Unix epoch).
    pub due_ms: Option<u64>,
    /// The schedule that fired it.
    pub schedule: Option<String>,
    /// The task that spawned it.
    pub parent: Option<u64>,
}

/// Puts outputs sent in [`Reply::OutputPart`]s back into the report that
/// follows them, for a reader of one request's replies.
#[derive(Debug, Default)]
pub(crate) struct Reassembly {
    parts: Vec<u8>,
}

impl Reassembly {
    /// `None` for a part (kept for the report), else the reply, a report
    /// carrying the parts received before it as its output.
    pub(crate) fn take(&mut self, mut reply: Reply) -> Option<Reply> {
        match &mut reply {
            Reply::OutputPart(part) => {
                self.parts.append(part);
                return None;
            }
            Reply::Report(report)
            | Reply::Canceled {
                report: Some(report),
                ..
            } if !self.parts.is_empty() => {
                if let TaskOutcome::Completed { output } = &mut report.outcome {
                    *output = std::mem::take(&mut self.parts);
                }
            }
            _ => {}
        }
        Some(reply)
    }
}

/// What the daemon answers. Streams end with [`Reply::End`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Whether a digest is known.
    HasPlugin(bool),
    /// An upload chunk was taken; with the plugin's name once complete and
    /// valid.
    Uploaded {
        /// The plugin's name once the upload completed and validated.
        plugin: Option<String>,
    },
    /// A submission was taken in.
    Submitted(Submitted),
    /// Part of the output of the [`Reply::Report`] that follows (sent when
    /// the output would not fit in one frame; the report then carries an
    /// empty output, and the parts, in order, are the whole of it).
    OutputPart(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A final report.
    Report(TaskReport),
    /// The answer to Cancel: whether this call made the stop claim, and the
    /// report when asked to wait.
    Canceled {
        /// Claimed by this call.
        claimed: bool,
        /// The report, if waited for.
        report: Option<TaskReport>,
    },
    /// A page of `host ps`.
    Tasks(Vec<TaskRow>),
    /// A page of `host slots`.
    Slots(Vec<SlotView>),
    /// A page of `host plugins ls`.
    Plugins(Vec<PluginRow>),
    /// The plugins a [`Request::RemovePlugins`] removed.
    PluginsRemoved(Vec<PluginRow>),
    /// One event of a stream.
    Event(Event),
    /// Events were dropped from this stream.
    Dropped(u64),
    /// One log line of a stream.
    Log(LogLine),
    /// The end of a stream or of a list.
    End,
    /// The daemon shut down; how it went.
    ShutdownDone(ShutdownReport),
    /// The request failed.
    Error {
        /// What kind of failure (decides the client's exit code).
        kind: ErrorKind,
        /// One line for people.
        message: String,
    },
    /// A page of `host schedule ls`.
    Schedules(Vec<ScheduleRow>),
    /// One schedule, as a verb left it.
    Schedule(ScheduleRow),
    /// A page of `host kv ls`.
    KvRows(Vec<KvRow>),
    /// A value of `host kv get` or `rm` (`None`: no such key).
    KvValue(#[serde(with = "serde_bytes")] Option<Vec<u8>>),
}

/// The kind of a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Bad input from the client.
    Invalid,
    /// No such task or plugin.
    NotFound,
    /// The daemon is shutting down.
    ShuttingDown,
    /// Anything else.
    Internal,
    /// The credential does not allow the request (a token of too small a
    /// scope, on a connection upgraded from HTTP).
    Forbidden,
    /// An idempotency key given with a request other than the one it was
    /// first given with.
    Conflict,
}

/// A framing or decoding failure: the connection is finished.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("the connection closed")]
    Closed,
    /// A length prefix over the maximum.
    #[error("a frame of {0} bytes is over the limit of {MAX_FRAME} bytes")]
    TooLarge(u64),
    /// The body did not decode.
    #[error("a malformed frame: {0}")]
    Malformed(String),
    /// An I/O error (including a frame cut short).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame and decodes it.
pub async fn read_frame<T: for<'de> Deserialize<'de>>(
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as u64;
    if len > MAX_FRAME as u64 {
        return Err(FrameError::TooLarge(len));
    }
    // Grow with the bytes that actually arrive, never by the prefix alone.
    let mut body = Vec::with_capacity((len as usize).min(64 * 1024));
    let read = reader.take(len).read_to_end(&mut body).await?;
    if (read as u64) < len {
        return Err(FrameError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "a frame was cut short",
        )));
    }
    decode(&body)
}

/// Decodes one frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Encodes one frame (length prefix + body).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let body = postcard::to_allocvec(value).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len() as u64));
    }
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes one frame.
pub async fn write_frame<T: Serialize>(
    writer: &mut (impl AsyncWrite + Unpin),
    value: &T,
) -> Result<(), FrameError> {
    let frame = encode(value)?;
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_requests_of_older_protocols_still_decode() {
        let mut request = SubmitRequest::new(Digest::of(b"plugin"));
        request.name = Some("nap".into());
        request.env = vec![("K".into(), "V".into())];
        request.timeout = Some(Duration::from_secs(3));
        request.allow_http = vec!["http://127.0.0.1:8080".parse().unwrap()];
        request.idempotency_key = Some("k-1".into());
        // Protocol 7 ended with the idempotency key: no delay, priority or
        // schedule (three zero bytes now).
        let mut v7 = postcard::to_allocvec(&request).unwrap();
        for _ in 0..3 {
            assert_eq!(v7.pop(), Some(0));
        }
        assert_eq!(SubmitRequest::decode_stored(&v7).unwrap(), request);
        // Protocol 6 had no idempotency key; 4 and 5 no `allow_http`.
        request.idempotency_key = None;
        let mut v6 = postcard::to_allocvec(&request).unwrap();
        v6.truncate(v6.len() - 4);
        assert_eq!(SubmitRequest::decode_stored(&v6).unwrap(), request);
        request.allow_http.clear();
        let mut v5 = postcard::to_allocvec(&request).unwrap();
        v5.truncate(v5.len() - 5);
        assert_eq!(SubmitRequest::decode_stored(&v5).unwrap(), request);
        request.not_before = Some(NotBefore::At(1_800_000_000_000));
        request.priority = -3;
        request.schedule = Some("nightly".into());
        let new = postcard::to_allocvec(&request).unwrap();
        assert_eq!(SubmitRequest::decode_stored(&new).unwrap(), request);
        assert!(SubmitRequest::decode_stored(&new[..10]).is_err());
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let msg = Envelope {
            id: 7,
            body: Request::Wait(TaskRef::Name("x".into())),
        };
        let frame = encode(&msg).unwrap();
        let back: Envelope<Request> = read_frame(&mut frame.as_slice()).await.unwrap();
        assert_eq!(back, msg);
    }

    #[tokio::test]
    async fn hostile_frames_are_errors_not_allocations() {
        let huge = [0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<Request>(&mut huge.as_slice()).await,
            Err(FrameError::TooLarge(_))
        ));
        let cut = [0, 0, 0, 10, 1, 2];
        assert!(matches!(
            read_frame::<Request>(&mut cut.as_slice()).await,
            Err(FrameError::Io(_))
        ));
        let garbage = [0, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<Request>(&mut garbage.as_slice()).await,
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<Request>(&mut [].as_slice()).await,
            Err(FrameError::Closed)
        ));
    }
}
