//! Child tasks (`taskhost:plugin/children`, since WIT 0.1.1): [`spawn`] a
//! task through the daemon's controller and [`wait`] for its outcome.
//!
//! A child gets exactly its parent's grants (directories, environment,
//! secrets, configuration, shared buckets, HTTP, memory), never more. Its
//! key, [`Spec::key`], names it among its parent's children; without one
//! the SDK derives `child-0`, `child-1`, … in the order of this attempt's
//! spawns, so a parent retried (after a failure, or after the daemon
//! crashed) that spawns the same children in the same order gets the ones
//! it started, not new ones. When the parent is canceled, its unfinished
//! children are canceled too; [`wait`] returns at once with
//! [`TaskError::canceled`] when the parent is asked to stop.
//!
//! ```no_run
//! use taskhost_guest::{Context, PluginInfo, Task, TaskError, children};
//!
//! struct Squares;
//!
//! impl Task for Squares {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("squares", "0.1.0")
//!     }
//!
//!     fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
//!         if let Some(i) = ctx.param("i") {
//!             let i: u64 = i.parse().map_err(|_| taskhost_guest::fatal("i: not a number"))?;
//!             return Ok((i * i).to_string().into_bytes());
//!         }
//!         let ids = (0..10)
//!             .map(|i| children::spawn(&children::Spec::new().param("i", i.to_string())))
//!             .collect::<Result<Vec<_>, _>>()?;
//!         let mut sum = 0u64;
//!         for id in ids {
//!             let done = children::wait(id)?.completed()?;
//!             sum += String::from_utf8_lossy(&done).parse::<u64>().unwrap_or(0);
//!         }
//!         Ok(sum.to_string().into_bytes())
//!     }
//! }
//!
//! taskhost_guest::export_task!(Squares);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use crate::__bindings::taskhost::plugin::children as wit;
use crate::TaskError;

/// Spawns of this attempt so far, for the keys the SDK derives (a fresh
/// instance per attempt starts it at 0 again).
static SPAWNED: AtomicU64 = AtomicU64::new(0);

/// A child to start: the parent's own plugin unless [`Spec::plugin`] says.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    key: Option<String>,
    plugin: Option<String>,
    name: Option<String>,
    slot: Option<String>,
    params: Vec<(String, String)>,
    input: Vec<u8>,
}

impl Spec {
    /// A child of the parent's plugin, no params, no input.
    pub fn new() -> Self {
        Self::default()
    }

    /// Its key among the parent's children (letters, digits, `-`, `_`,
    /// `.`) [default: `child-N`, N counting this attempt's spawns].
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Another plugin: one the daemon stores, by its digest (sha256, hex),
    /// or a deployment, `NAME`, `NAME@VERSION` or `NAME@sha256:HEX`
    /// (`host deploy`), whose version the daemon picks at the spawn.
    pub fn plugin(mut self, digest: impl Into<String>) -> Self {
        self.plugin = Some(digest.into());
        self
    }

    /// Its name [default: `<parent name>.<key>`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Its slot [default: its plugin's resource, else its name].
    pub fn slot(mut self, slot: impl Into<String>) -> Self {
        self.slot = Some(slot.into());
        self
    }

    /// Adds a param.
    pub fn param(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.push((key.into(), value.into()));
        self
    }

    /// Its input bytes.
    pub fn input(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.input = input.into();
        self
    }
}

/// Starts a child (or finds the one its key started) and returns its task
/// id. A refusal (a bad key, an unknown plugin, a key spawned before with
/// another spec) fails the attempt, as retrying will not change it.
pub fn spawn(spec: &Spec) -> Result<u64, TaskError> {
    let n = SPAWNED.fetch_add(1, Ordering::Relaxed);
    let key = spec.key.clone().unwrap_or_else(|| format!("child-{n}"));
    let wit_spec = wit::ChildSpec {
        key,
        plugin: spec.plugin.clone(),
        name: spec.name.clone(),
        slot: spec.slot.clone(),
        params: spec.params.clone(),
        input: spec.input.clone(),
    };
    wit::spawn(&wit_spec).map_err(|why| TaskError::fatal(format!("cannot start a child: {why}")))
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It completed.
    Completed,
    /// It failed (after its retries).
    Failed,
    /// It failed in a way retrying cannot fix.
    Fatal,
    /// It was canceled.
    Canceled,
    /// It was stopped by force.
    ForceAborted,
    /// It was never run.
    Rejected,
    /// The host lost it.
    Panicked,
}

/// A child's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Its output, when it completed.
    pub output: Vec<u8>,
    /// Why it did not complete.
    pub reason: String,
}

impl Outcome {
    /// Its output if it completed, else a retryable failure saying why.
    pub fn completed(self) -> Result<Vec<u8>, TaskError> {
        match self.status {
            Status::Completed => Ok(self.output),
            status => Err(TaskError::fail(format!(
                "a child ended {status:?}: {}",
                self.reason
            ))),
        }
    }
}

/// Waits for child `id`'s outcome. Returns [`TaskError::canceled`] at once
/// when this task is asked to stop (its children are then canceled too).
pub fn wait(id: u64) -> Result<Outcome, TaskError> {
    match wit::wait(id) {
        Ok(outcome) => Ok(Outcome {
            status: match outcome.status {
                wit::ChildStatus::Completed => Status::Completed,
                wit::ChildStatus::Failed => Status::Failed,
                wit::ChildStatus::Fatal => Status::Fatal,
                wit::ChildStatus::Canceled => Status::Canceled,
                wit::ChildStatus::ForceAborted => Status::ForceAborted,
                wit::ChildStatus::Rejected => Status::Rejected,
                wit::ChildStatus::Panicked => Status::Panicked,
            },
            output: outcome.output,
            reason: outcome.reason,
        }),
        Err(wit::WaitError::Cancelled) => Err(TaskError::canceled()),
        Err(wit::WaitError::UnknownChild) => Err(TaskError::fatal(format!(
            "task {id} is not a child this task started"
        ))),
    }
}
