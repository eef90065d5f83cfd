//! Owns the daemon's memory of tasks: each submission's waiter, name and
//! slot, and its log (a bounded ring of guest lines with live followers), for
//! as long as the task lives plus a bounded number of finished ones, so
//! `host wait` and `host logs` work after the end too.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::broadcast;

use crate::runtime::{GuestSink, Stream};
use crate::supervisor::TaskWaiter;

use super::protocol::{Target, WireLogLine};

/// Lines kept per task log.
pub const MAX_LOG_LINES: usize = 2_000;
/// Finished tasks remembered for `wait` and `logs`.
pub const MAX_FINISHED: usize = 10_000;

/// Lines buffered per live follower before it is told it fell behind.
const LIVE_BUFFER: usize = 256;

/// One task's guest output: a bounded ring plus live followers.
#[derive(Debug, Default)]
pub struct TaskLog {
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    lines: VecDeque<WireLogLine>,
    /// Created by the first follower and dropped at the end, so the many
    /// tasks nobody follows (and every finished one) hold no channel buffer.
    live: Option<broadcast::Sender<Option<WireLogLine>>>,
    closed: bool,
}

impl TaskLog {
    fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lines so far and a receiver for later ones (`None`, or the
    /// channel closing, means the task ended).
    pub fn follow(&self) -> (Vec<WireLogLine>, broadcast::Receiver<Option<WireLogLine>>) {
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

    /// Marks the end of the log for followers.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        if let Some(live) = state.live.take() {
            let _ = live.send(None);
        }
    }

    fn push(&self, line: WireLogLine) {
        let mut state = self.lock();
        if state.lines.len() == MAX_LOG_LINES {
            state.lines.pop_front();
        }
        if let Some(live) = &state.live {
            let _ = live.send(Some(line.clone()));
        }
        state.lines.push_back(line);
    }
}

impl GuestSink for TaskLog {
    fn line(&self, stream: Stream, text: &str) {
        self.push(WireLogLine {
            stream: stream.to_string(),
            text: text.to_owned(),
        });
    }

    fn progress(&self, _done: u64, _total: u64) {}
}

/// What the daemon remembers of one submission.
#[derive(Debug, Clone)]
pub struct TaskRecord {
    /// The submission's id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// Its outcome.
    pub waiter: TaskWaiter,
    /// Its guest output.
    pub log: Arc<TaskLog>,
}

/// Every live submission and the most recent finished ones.
#[derive(Debug, Default)]
pub struct Tasks {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<u64, TaskRecord>,
    finished: VecDeque<u64>,
}

impl Tasks {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh log for a task about to be submitted.
    pub fn new_log() -> Arc<TaskLog> {
        TaskLog::new()
    }

    /// Remembers a submission.
    pub fn insert(&self, record: TaskRecord) {
        self.lock().by_id.insert(record.id, record);
    }

    /// Marks a submission finished; the oldest finished ones are forgotten
    /// beyond [`MAX_FINISHED`].
    pub fn finished(&self, id: u64) {
        let mut inner = self.lock();
        inner.finished.push_back(id);
        while inner.finished.len() > MAX_FINISHED {
            if let Some(old) = inner.finished.pop_front() {
                inner.by_id.remove(&old);
            }
        }
    }

    /// The record of a task by id, or the newest one with this name.
    pub fn get(&self, target: &Target) -> Option<TaskRecord> {
        let inner = self.lock();
        match target {
            Target::Id(id) => inner.by_id.get(id).cloned(),
            Target::Name(name) => inner
                .by_id
                .values()
                .filter(|r| &r.name == name)
                .max_by_key(|r| r.id)
                .cloned(),
        }
    }

    /// The records of queued submissions (not yet registered): those the
    /// controller still holds.
    pub fn all(&self) -> Vec<TaskRecord> {
        let mut all: Vec<TaskRecord> = self.lock().by_id.values().cloned().collect();
        all.sort_by_key(|r| r.id);
        all
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::broadcast::error::TryRecvError;

    use super::*;

    #[test]
    fn followers_get_the_backlog_then_live_lines_then_the_end() {
        let log = TaskLog::new();
        log.line(Stream::Stdout, "one");
        assert!(
            log.lock().live.is_none(),
            "no channel until someone follows"
        );

        let (backlog, mut live) = log.follow();
        assert_eq!(backlog.len(), 1);
        log.line(Stream::Stderr, "two");
        log.close();
        assert_eq!(live.try_recv().unwrap().unwrap().text, "two");
        assert_eq!(live.try_recv().unwrap(), None);
        assert!(log.lock().live.is_none(), "the channel goes with the end");

        let (backlog, mut late) = log.follow();
        assert_eq!(backlog.len(), 2);
        assert!(matches!(late.try_recv(), Err(TryRecvError::Closed)));
    }
}
