//! # taskhost
//!
//! The library behind the `host` binary, one name over the crates that state
//! the layers: the task [`supervisor`] and the keyed admission
//! [`controller`] (`taskhost-core`: no WebAssembly, no I/O), the sandboxed
//! WebAssembly [`runtime`] and [`plugin_task`] (`taskhost-runtime`), and the
//! [`daemon`] that serves all of it (`taskhost-daemon`). An embedder that
//! needs only the supervisor depends on `taskhost-core` alone.
//!
//! ```
//! use std::time::Duration;
//! use taskhost::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let supervisor = Supervisor::builder().grace(Duration::from_secs(5)).build();
//! let job = native(|_ctx| async move { Ok(b"ok".to_vec()) });
//! let report = supervisor.add(TaskSpec::once("job", job)).report().await;
//! assert_eq!(report.outcome, TaskOutcome::Completed { output: b"ok".to_vec() });
//! # }
//! ```
//!
//! `ARCHITECTURE.md` at the repository root has the code map and the path
//! of one submission.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use taskhost_core::{
    admission, controller, lifecycle, logline, outcome, slot_settings, stats, supervisor, units,
};
pub use taskhost_daemon as daemon;
pub use taskhost_runtime as runtime;
pub use taskhost_runtime::plugin_task;

/// The types most embedders need, in one `use`.
pub mod prelude {
    pub use taskhost_runtime::prelude::*;
}
