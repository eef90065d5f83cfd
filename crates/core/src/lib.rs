//! # taskhost-core
//!
//! The task [`supervisor`] (retries with backoff, per-attempt timeouts, a
//! concurrency limit, graceful stop with force-abort, exactly one outcome
//! per task, lifecycle events) and the keyed admission [`controller`] in
//! front of it (one owner per slot; a busy slot queues, replaces or
//! rejects, by the rules of [`admission`]). No WebAssembly and no I/O: an
//! embedder of the supervisor compiles neither wasmtime nor a database.
//!
//! The supervisor runs any [`TaskBody`](supervisor::TaskBody): an async
//! closure ([`native`](supervisor::native)) here, or a plugin
//! (`taskhost_runtime::PluginTask`). Start with the [`prelude`]:
//!
//! ```
//! use std::time::Duration;
//! use taskhost_core::prelude::*;
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
//! | module | owns |
//! |---|---|
//! | `supervisor` | how often and how long a task runs, and its one outcome |
//! | `controller` | when a submission may enter the supervisor (slots) |
//! | `admission` | the words of a slot and its rules, as a pure function |
//! | `slot_settings` | what an operator sets on slots, by name or pattern: capacity, queue bound |
//! | `lifecycle` | the words of a task's life: its states, where it was placed |
//! | `outcome` | how a task ended |
//! | `recovery` | what becomes of a task its host lost (a stop, a crash, a dead node) |
//! | `logline` | a guest's lines and where they go |
//! | `units` | durations and sizes as people write them |
//! | `stats` | lock-free histograms read by `/metrics` |

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod controller;
pub mod lifecycle;
pub mod logline;
pub mod outcome;
pub mod recovery;
pub mod slot_settings;
pub mod stats;
pub mod supervisor;
pub mod units;

/// The types most embedders of the supervisor need, in one `use`.
pub mod prelude {
    pub use crate::controller::{AdmissionPolicy, Controller, Submission};
    pub use crate::outcome::{OutcomeKind, RejectionKind, TaskOutcome};
    pub use crate::supervisor::{
        AttemptContext, BackoffPolicy, Jitter, RestartPolicy, ShutdownReport, Supervisor, TaskBody,
        TaskError, TaskId, TaskReport, TaskSpec, TaskWaiter, native,
    };
}
