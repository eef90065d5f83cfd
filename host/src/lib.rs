//! # taskhost
//!
//! The library behind the `host` binary: a task [`supervisor`] (retries with
//! backoff, per-attempt timeouts, a concurrency limit, graceful stop with
//! force-abort, exactly one outcome per task, lifecycle events), a keyed
//! admission [`controller`] in front of it (one owner per slot; a busy slot
//! queues, replaces or rejects), a sandboxed WebAssembly [`runtime`] for task
//! plugins, and the [`daemon`] that serves all of it on a Unix socket.
//!
//! The supervisor runs any [`TaskBody`](supervisor::TaskBody): an async
//! closure ([`native`](supervisor::native)) or a plugin
//! ([`PluginTask`](plugin_task::PluginTask)). Start with the [`prelude`]:
//!
//! ```
//! use std::time::Duration;
//! use taskhost::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let supervisor = Supervisor::builder().grace(Duration::from_secs(5)).build();
//! let flaky = native(|ctx| async move {
//!     if ctx.attempt() < 3 { Err(TaskError::fail("not yet")) } else { Ok(b"ok".to_vec()) }
//! });
//! let spec = TaskSpec::restartable("flaky", flaky)
//!     .with_backoff(BackoffPolicy::constant(Duration::from_millis(1)));
//! let report = supervisor.add(spec).report().await;
//! assert_eq!(report.attempts, 3);
//! assert_eq!(report.outcome, TaskOutcome::Completed { output: b"ok".to_vec() });
//! # }
//! ```
//!
//! Reading order: [`supervisor`], [`controller`], [`runtime`],
//! [`plugin_task`], [`daemon`]. `ARCHITECTURE.md` at the repository root has
//! the code map and the path of one submission; `examples/` has a runnable
//! program per way of using the library.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod controller;
pub mod daemon;
pub mod lifecycle;
pub mod logline;
pub mod outcome;
pub mod plugin_task;
pub mod runtime;
pub mod stats;
pub mod supervisor;
pub mod units;

/// The types most embedders need, in one `use`.
pub mod prelude {
    pub use crate::controller::{AdmissionPolicy, Controller, Submission};
    pub use crate::outcome::{OutcomeKind, RejectionKind, TaskOutcome};
    pub use crate::plugin_task::PluginTask;
    pub use crate::runtime::{Runtime, RuntimeConfig, Sandbox};
    pub use crate::supervisor::{
        AttemptContext, BackoffPolicy, Jitter, RestartPolicy, ShutdownReport, Supervisor, TaskBody,
        TaskError, TaskId, TaskReport, TaskSpec, TaskWaiter, native,
    };
}
