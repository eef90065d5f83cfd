//! Owns the daemon's memory of submissions: each one's waiter, name, slot,
//! plugin and log (a bounded ring of lines with live followers), for as long
//! as the task lives plus a bounded number of finished ones, so `host wait`,
//! `host logs` and `host ps --all` work after the end too. It also decides
//! what a name refers to: the live task that holds it (as `host ps` shows),
//! else the newest finished task that held it; a submission rejected at
//! intake never held its name.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::broadcast;

use tokio::sync::watch;

use taskhost_core::controller::Controller;
use taskhost_core::logline::{LineSink, LogLine, Stream};
use taskhost_core::supervisor::{TaskId, TaskRef, TaskReport};
use taskhost_runtime::Digest;
use taskhost_runtime::record::{AttemptRecord, RecordFile, RecordSink};

use crate::store::PluginRefs;

/// Lines kept per task log.
pub const MAX_LOG_LINES: usize = 2_000;
/// Bytes of line text kept per task log (the oldest lines go first), so a
/// running task's log is bounded by bytes as well as lines: 2,000 lines of
/// 8 KiB would otherwise be 16 MiB each.
pub const MAX_LOG_BYTES: usize = 1 << 20;
/// Finished tasks listed for `ps --all` at most.
pub const MAX_FINISHED: usize = 10_000;
/// Finished tasks a daemon with a durable store also keeps in memory, the
/// newest (its store keeps all it retains, and answers for the rest), so
/// history costs disk and not memory.
pub const RECENT_FINISHED: usize = 1_000;
/// The bytes of outputs, logs and inputs those recent ones hold at most.
pub const RECENT_BYTES: u64 = 64 << 20;

/// Lines buffered per live follower before it is told it fell behind.
const LIVE_BUFFER: usize = 256;

/// One task's lines: a bounded ring plus live followers.
#[derive(Debug, Default)]
pub(crate) struct TaskLog {
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    lines: VecDeque<LogLine>,
    /// The text bytes of `lines`.
    bytes: usize,
    /// Created by the first follower and dropped at the end, so the many
    /// tasks nobody follows (and every finished one) hold no channel buffer.
    live: Option<broadcast::Sender<Option<LogLine>>>,
    closed: bool,
    /// The newest attempts' records (the flight recorder's).
    records: VecDeque<AttemptRecord>,
    /// About the bytes of `records`.
    records_bytes: usize,
}

/// What a record costs a task's kept bytes: its calls and its input, and
/// the rest of its start, about.
fn record_bytes(record: &AttemptRecord) -> usize {
    record.calls.len() + record.start.input.len() + 256
}

/// The most attempts' records a task keeps: the newest.
pub(crate) const MAX_RECORDS_KEPT: usize = 16;

impl RecordSink for TaskLog {
    fn recorded(&self, record: AttemptRecord) {
        let mut state = self.lock();
        if state.records.len() == MAX_RECORDS_KEPT
            && let Some(old) = state.records.pop_front()
        {
            state.records_bytes -= record_bytes(&old);
        }
        state.records_bytes += record_bytes(&record);
        state.records.push_back(record);
    }
}

impl TaskLog {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its attempts' records as a record file (empty: none).
    pub(crate) fn records(&self) -> Vec<u8> {
        let state = self.lock();
        if state.records.is_empty() {
            return Vec::new();
        }
        RecordFile {
            attempts: state.records.iter().cloned().collect(),
        }
        .encode()
    }

    /// The lines so far and a receiver for later ones (`None`, or the
    /// channel closing, means the task ended).
    pub(crate) fn follow(&self) -> (Vec<LogLine>, broadcast::Receiver<Option<LogLine>>) {
        let mut state = self.lock();
        let lines = state.lines.iter().cloned().collect();
        let live = if state.closed {
            // Already over: a receiver whose channel is closed.
            broadcast::channel(1).1
        } else {
            state
                .live
                .get_or_insert_with(|| broadcast::channel(LIVE_BUFFER).0)
                .subscribe()
        };
        (lines, live)
    }

    /// The lines kept.
    pub(crate) fn lines(&self) -> Vec<LogLine> {
        self.lock().lines.iter().cloned().collect()
    }

    /// The bytes kept: the lines' text, and about the records'.
    pub(crate) fn bytes(&self) -> usize {
        let state = self.lock();
        state.bytes + state.records_bytes
    }

    /// Marks the end of the log for followers.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        if let Some(live) = state.live.take() {
            let _ = live.send(None);
        }
    }
}

impl LineSink for TaskLog {
    fn push(&self, attempt: u32, stream: Stream, text: &str) {
        let line = LogLine {
            attempt,
            stream,
            text: text.to_owned(),
        };
        let mut state = self.lock();
        while state.lines.len() >= MAX_LOG_LINES
            || (!state.lines.is_empty() && state.bytes + line.text.len() > MAX_LOG_BYTES)
        {
            let Some(old) = state.lines.pop_front() else {
                break;
            };
            state.bytes -= old.text.len();
        }
        state.bytes += line.text.len();
        if let Some(live) = &state.live {
            let _ = live.send(Some(line.clone()));
        }
        state.lines.push_back(line);
    }
}

/// A task's final report as the daemon shows it: set once the report is
/// recorded in the store (at once with the memory store), so no client sees
/// an outcome a crash could take back.
#[derive(Debug, Clone)]
pub(crate) struct Outcome(Arc<watch::Sender<Option<Arc<TaskReport>>>>);

impl Outcome {
    pub(crate) fn new() -> Self {
        Self(Arc::new(watch::channel(None).0))
    }

    /// Publishes the recorded report.
    pub(crate) fn set(&self, report: Arc<TaskReport>) {
        self.0.send_replace(Some(report));
    }

    /// The report, if recorded.
    pub(crate) fn get(&self) -> Option<Arc<TaskReport>> {
        self.0.borrow().clone()
    }

    /// Waits for the recorded report. Never resolves for a task whose end
    /// is left to the next start (a graceful stop with a durable store).
    pub(crate) async fn report(&self) -> Arc<TaskReport> {
        let mut rx = self.0.subscribe();
        loop {
            if let Some(report) = rx.borrow_and_update().clone() {
                return report;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// What the daemon remembers of one submission.
#[derive(Debug, Clone)]
pub(crate) struct TaskRecord {
    pub id: TaskId,
    pub name: String,
    pub slot: String,
    /// The plugin's name.
    pub plugin: String,
    /// The plugin's digest.
    pub digest: Digest,
    /// Its recorded final report.
    pub outcome: Outcome,
    pub log: Arc<TaskLog>,
    /// When it was submitted.
    pub submitted: Instant,
    /// Whether it ever held its name (was admitted or queued); a submission
    /// rejected at intake never did.
    pub placed: bool,
    /// Its request, resolved (name, slot and policy filled in), for `host
    /// rerun`. On a cluster node, without its input and params (the
    /// database keeps the whole request, which `rerun` reads there): only
    /// what its children need of it.
    pub request: Option<Arc<crate::wire::protocol::SubmitRequest>>,
}

impl TaskRecord {
    /// What its finished form holds: its output and its log's text.
    fn bytes(&self) -> u64 {
        let output = self
            .outcome
            .get()
            .map_or(0, |report| match &report.outcome {
                taskhost_core::outcome::TaskOutcome::Completed { output } => output.len(),
                _ => 0,
            });
        let request = self.request.as_ref().map_or(0, |r| {
            r.input.len()
                + r.params
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        });
        (output + self.log.bytes() + request) as u64
    }
}

/// Every live submission and the most recent finished ones: at most
/// `max_finished` of those, holding at most `max_bytes` of outputs and
/// logs together.
#[derive(Debug)]
pub(crate) struct Tasks {
    inner: Mutex<Inner>,
    max_finished: usize,
    max_bytes: u64,
}

impl Default for Tasks {
    fn default() -> Self {
        Self::new(MAX_FINISHED, crate::config::MEMORY_RETAIN_BYTES)
    }
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<TaskId, TaskRecord, foldhash::fast::RandomState>,
    /// Finished tasks, oldest first, with the bytes each holds.
    finished: VecDeque<(TaskId, u64)>,
    /// The same ids in their order, for pages newest first.
    finished_ids: std::collections::BTreeSet<TaskId>,
    /// The sum of `finished`'s bytes.
    finished_bytes: u64,
}

impl Tasks {
    /// An empty memory with these retention bounds.
    pub(crate) fn new(max_finished: usize, max_bytes: u64) -> Self {
        Self {
            inner: Mutex::default(),
            max_finished,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The memory of a daemon whose store retains `max_finished` finished
    /// tasks holding `max_bytes`: all of them with the memory store, the
    /// newest [`RECENT_FINISHED`] (of [`RECENT_BYTES`]) with a durable one.
    pub(crate) fn retaining(durable: bool, (max_finished, max_bytes): (usize, u64)) -> Self {
        if durable {
            Self::new(
                max_finished.min(RECENT_FINISHED),
                max_bytes.min(RECENT_BYTES),
            )
        } else {
            Self::new(max_finished, max_bytes)
        }
    }

    /// Remembers a submission.
    pub(crate) fn insert(&self, record: TaskRecord) {
        self.lock().by_id.insert(record.id, record);
    }

    /// Marks a submission finished; the oldest finished ones are forgotten
    /// beyond the count and byte bounds (the newest is always kept).
    pub(crate) fn finished(&self, id: TaskId) {
        let mut inner = self.lock();
        let bytes = inner.by_id.get(&id).map_or(0, TaskRecord::bytes);
        inner.finished.push_back((id, bytes));
        inner.finished_ids.insert(id);
        inner.finished_bytes += bytes;
        while inner.finished.len() > self.max_finished.max(1)
            || (inner.finished.len() > 1 && inner.finished_bytes > self.max_bytes)
        {
            let Some((old, bytes)) = inner.finished.pop_front() else {
                break;
            };
            inner.finished_bytes -= bytes;
            inner.finished_ids.remove(&old);
            inner.by_id.remove(&old);
        }
    }

    /// The record a target refers to. An id is that submission. A name is
    /// the live task holding it (registered or queued), else the newest
    /// finished task that held it.
    pub(crate) fn resolve(&self, target: &TaskRef, controller: &Controller) -> Option<TaskRecord> {
        let name = match target {
            TaskRef::Id(id) => return self.lock().by_id.get(id).cloned(),
            TaskRef::Name(name) => name,
        };
        let live = controller
            .supervisor()
            .info(target.clone())
            .map(|info| info.id)
            .or_else(|| controller.queued(target).map(|q| q.id));
        let inner = self.lock();
        if let Some(id) = live {
            return inner.by_id.get(&id).cloned();
        }
        inner
            .by_id
            .values()
            .filter(|r| r.placed && &r.name == name)
            .max_by_key(|r| r.id)
            .cloned()
    }

    /// The unfinished submissions of `ns` this daemon remembers.
    pub(crate) fn unfinished(&self, ns: &crate::service::namespace::Ns) -> u64 {
        self.lock()
            .by_id
            .values()
            .filter(|r| r.placed && r.outcome.get().is_none() && ns.owns(&r.name))
            .count() as u64
    }

    /// Up to `limit` of the finished records still remembered with an id
    /// below `before`, newest first, each made into what `keep` makes of
    /// it (`None`: not wanted).
    pub(crate) fn finished_page<T>(
        &self,
        before: TaskId,
        limit: usize,
        mut keep: impl FnMut(&TaskRecord) -> Option<T>,
    ) -> Vec<T> {
        let inner = self.lock();
        inner
            .finished_ids
            .range(..before)
            .rev()
            .filter_map(|id| inner.by_id.get(id))
            .filter_map(&mut keep)
            .take(limit)
            .collect()
    }

    /// The finished records still remembered, oldest first.
    pub(crate) fn finished_records(&self) -> Vec<TaskRecord> {
        let inner = self.lock();
        inner
            .finished
            .iter()
            .filter_map(|(id, _)| inner.by_id.get(id).cloned())
            .collect()
    }

    /// For each plugin the remembered tasks use: how many are live and how
    /// many finished.
    pub(crate) fn plugin_refs(
        &self,
        only: Option<&crate::service::namespace::Ns>,
    ) -> HashMap<Digest, PluginRefs> {
        let inner = self.lock();
        let mut refs: HashMap<Digest, PluginRefs> = HashMap::new();
        let records = inner.by_id.values();
        for record in records.filter(|r| only.is_none_or(|ns| ns.owns(&r.name))) {
            let entry = refs.entry(record.digest).or_default();
            entry.name.get_or_insert_with(|| record.plugin.clone());
            if record.outcome.get().is_some() {
                entry.finished += 1;
            } else {
                entry.unfinished += 1;
            }
        }
        refs
    }

    /// The record of a submission by id.
    pub(crate) fn get(&self, id: TaskId) -> Option<TaskRecord> {
        self.lock().by_id.get(&id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::broadcast::error::TryRecvError;

    use super::*;

    #[test]
    fn followers_get_the_backlog_then_live_lines_then_the_end() {
        let log = TaskLog::new();
        log.push(1, Stream::Stdout, "one");
        assert!(
            log.lock().live.is_none(),
            "no channel until someone follows"
        );

        let (backlog, mut live) = log.follow();
        assert_eq!(backlog.len(), 1);
        log.push(1, Stream::Stderr, "two");
        log.close();
        assert_eq!(live.try_recv().unwrap().unwrap().text, "two");
        assert_eq!(live.try_recv().unwrap(), None);
        assert!(log.lock().live.is_none(), "the channel goes with the end");

        let (backlog, mut late) = log.follow();
        assert_eq!(backlog.len(), 2);
        assert!(matches!(late.try_recv(), Err(TryRecvError::Closed)));
    }
}
