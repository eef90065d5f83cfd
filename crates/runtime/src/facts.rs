//! Owns what the embedder tells one attempt from outside: its facts, which
//! the guest reads through `host.attempt` ([`AttemptFacts`]), and the
//! signals that stop it, cooperatively or by force ([`StopSignals`]). How
//! the guest sees them is the business of `attempt` (the epoch callback)
//! and `host_calls`.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

/// The facts of one attempt that the guest can read through `host.attempt`.
#[derive(Debug, Clone, Default)]
pub struct AttemptFacts {
    /// The task's id.
    pub task_id: u64,
    /// The task's name.
    pub name: String,
    /// The slot the task owns.
    pub slot: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The submission's params, in order.
    pub params: Vec<(String, String)>,
    /// A WASI command's arguments after its name (`--arg`), in order;
    /// a task plugin has none.
    pub args: Vec<String>,
}

/// How the outside world stops an attempt.
#[derive(Debug, Clone, Default)]
pub struct StopSignals {
    /// Cooperative stop: seen by `is-cancelled`, wakes the host sleep.
    pub cancel: CancellationToken,
    /// Force-abort: the guest traps at its next epoch tick.
    pub abort: Arc<AtomicBool>,
}

impl StopSignals {
    /// Asks the guest to stop cooperatively.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Stops the guest by force at its next epoch tick (and wakes it if it
    /// waits in a host call).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.cancel.cancel();
    }

    /// Whether [`StopSignals::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }
}
