//! Owns the process exit codes of the CLI contract and the errors that carry
//! them: 0 completed, 1 failed or fatal (or a host bug), 2 usage or invalid
//! input, 3 rejected, 4 canceled or force-aborted, 5 daemon unreachable or
//! protocol error.

use taskhost::daemon::ClientError;
use taskhost::daemon::protocol::ErrorKind;
use taskhost::outcome::TaskOutcome;

/// Usage errors and invalid input.
pub const EXIT_USAGE: u8 = 2;
/// Rejected work.
pub const EXIT_REJECTED: u8 = 3;
/// The daemon cannot be reached or misbehaves.
pub const EXIT_DAEMON: u8 = 5;

/// The exit code of a final outcome.
pub fn outcome_code(outcome: &TaskOutcome) -> u8 {
    match outcome {
        TaskOutcome::Completed { .. } => 0,
        TaskOutcome::Failed { .. } | TaskOutcome::Fatal { .. } | TaskOutcome::Panicked { .. } => 1,
        TaskOutcome::Rejected { .. } => EXIT_REJECTED,
        TaskOutcome::Canceled | TaskOutcome::ForceAborted => 4,
    }
}

/// An error with the exit code it means.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExitError {
    pub code: u8,
    message: String,
}

impl ExitError {
    /// An error that exits with `code`.
    pub fn error(code: u8, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(Self {
            code,
            message: message.into(),
        })
    }
}

/// Wraps any displayable error as a usage error (exit code 2).
pub fn usage(err: impl std::fmt::Display) -> anyhow::Error {
    ExitError::error(EXIT_USAGE, err.to_string())
}

/// The exit code of a daemon's refusal of this kind.
pub fn kind_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Invalid | ErrorKind::NotFound => EXIT_USAGE,
        ErrorKind::ShuttingDown | ErrorKind::Conflict | ErrorKind::OverQuota => EXIT_REJECTED,
        ErrorKind::Internal | ErrorKind::Forbidden => EXIT_DAEMON,
    }
}

/// A client error as an exit code: the daemon's own verdicts (invalid input,
/// not found: 2; shutting down: 3), everything else about reaching it: 5.
pub fn client(err: ClientError) -> anyhow::Error {
    let code = match &err {
        ClientError::Daemon { kind, .. } => kind_code(*kind),
        _ => EXIT_DAEMON,
    };
    ExitError::error(code, err.to_string())
}
