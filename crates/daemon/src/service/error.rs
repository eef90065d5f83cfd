//! Owns why a verb failed, as the services and the backend say it. The
//! server turns it into the wire's kind in one place
//! (`server/errors.rs`); nothing below the server knows the wire's kinds.

use crate::store::StoreError;

/// Why a verb failed; each carries the message a user reads (what went
/// wrong and what to do).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    /// The request is wrong: bad input, a grant past a ceiling, a bound.
    #[error("{0}")]
    Invalid(String),
    /// No such task, plugin or schedule.
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts one made before (an idempotency key given
    /// with another request, a schedule that exists).
    #[error("{0}")]
    Conflict(String),
    /// The daemon is not taking work: it is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// Over a namespace's quota: refused until its use falls or its
    /// operator raises it.
    #[error("{0}")]
    OverQuota(String),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}
