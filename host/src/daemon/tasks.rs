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

/// One task's guest output: a bounded ring plus live followers.
#[derive(Debug)]
pub struct TaskLog {
    lines: Mutex<VecDeque<WireLogLine>>,
    live: broadcast::Sender<Option<WireLogLine>>,
}

impl TaskLog {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            lines: Mutex::new(VecDeque::new()),
            live: broadcast::channel(256).0,
        })
    }

    /// The lines so far and a receiver for later ones (`None` = the task
    /// ended).
    pub fn follow(&self) -> (Vec<WireLogLine>, broadcast::Receiver<Option<WireLogLine>>) {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        (lines.iter().cloned().collect(), self.live.subscribe())
    }

    /// Marks the end of the log for followers.
    pub fn close(&self) {
        let _held = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self.live.send(None);
    }

    fn push(&self, line: WireLogLine) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == MAX_LOG_LINES {
            lines.pop_front();
        }
        lines.push_back(line.clone());
        let _ = self.live.send(Some(line));
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
