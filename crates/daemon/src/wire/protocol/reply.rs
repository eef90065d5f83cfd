//! What the daemon answers ([`Reply`]): the kinds of failure, the rows of
//! its lists, and the reassembly of an output sent in parts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use taskhost_core::admission::SlotView;
use taskhost_core::lifecycle::TaskState;
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{OutcomeKind, TaskOutcome};
use taskhost_core::supervisor::{Event, ShutdownReport, TaskId, TaskReport};
use taskhost_runtime::Digest;

use super::{KvRow, NamespaceRow, ScheduleRow, SlotRuleRow, Submitted};

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
    /// The answer to a [`Request::SubmitBatch`](super::Request::SubmitBatch): one item per
    /// submission, in order.
    SubmittedBatch(Vec<BatchItem>),
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
    /// The answer to [`Request::CancelMatching`](super::Request::CancelMatching) and
    /// [`Request::RerunMatching`](super::Request::RerunMatching).
    Matched {
        /// How many live tasks passed the filter.
        count: u64,
        /// The first [`LIST_PAGE`](super::LIST_PAGE) of them, newest first.
        ids: Vec<TaskId>,
        /// How many of them this call stopped or submitted again (0 for
        /// a dry run; one already stopping is counted by whoever stopped
        /// it).
        acted: u64,
    },
    /// A page of `host slots`.
    Slots(Vec<SlotView>),
    /// A page of `host plugins ls`.
    Plugins(Vec<PluginRow>),
    /// The plugins a [`Request::RemovePlugins`](super::Request::RemovePlugins) removed.
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
    /// A page of `host slot ls`.
    SlotRules(Vec<SlotRuleRow>),
    /// One slot rule, as a verb left it (or removed it).
    SlotRule(SlotRuleRow),
    /// A page of `host ns ls`.
    Namespaces(Vec<NamespaceRow>),
    /// One namespace, as a verb left it (or removed it).
    Namespace(NamespaceRow),
    /// Deployments: each name's current version (`host deployments ls`),
    /// one name's events (`history`), or what a verb made current.
    Deployments(Vec<super::DeploymentRow>),
    /// Bytes of a plugin from the offset a
    /// [`Request::Download`](super::Request::Download) asked, with the
    /// plugin's whole length (no bytes: the offset is its end).
    PluginChunk {
        /// The plugin's length in bytes.
        total: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Done (a request with nothing more to say: [`Request::Enter`](super::Request::Enter)).
    Done,
    /// Part of the record file a [`Request::Record`](super::Request::Record)
    /// asked for; the parts, in order, are the whole file.
    RecordPart(#[serde(with = "serde_bytes")] Vec<u8>),
}

/// One submission's answer in a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BatchItem {
    /// Taken in and durable (or, with `existing`, the task its idempotency
    /// key made before).
    Submitted(Submitted),
    /// Refused, as the same submission alone would have been.
    Refused {
        /// What kind of refusal (a single submission's exit code).
        kind: ErrorKind,
        /// One line for people.
        message: String,
    },
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
    /// Over a namespace's quota (`host ns ls` shows them).
    OverQuota,
}
