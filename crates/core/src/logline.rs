//! Owns the vocabulary of what a task body says while it runs: which stream a
//! line came from ([`Stream`]), the severity of a structured log call
//! ([`LogLevel`]) and one stored line ([`LogLine`]). The runtime produces
//! these, the supervisor publishes them as events, the daemon keeps them per
//! task; none of them decides anything about the lines.

use serde::{Deserialize, Serialize};

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stream {
    /// The guest's stdout.
    Stdout,
    /// The guest's stderr.
    Stderr,
    /// A structured log call (`host.log`) at this level.
    Log(LogLevel),
}

/// Severity of a structured log line.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

impl Stream {
    /// Its name, as [`Display`](std::fmt::Display) writes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Log(LogLevel::Trace) => "trace",
            Stream::Log(LogLevel::Debug) => "debug",
            Stream::Log(LogLevel::Info) => "info",
            Stream::Log(LogLevel::Warn) => "warn",
            Stream::Log(LogLevel::Error) => "error",
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line a task wrote, as kept in its log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LogLine {
    /// The attempt that wrote it (1-based).
    pub attempt: u32,
    /// Where it came from.
    pub stream: Stream,
    /// The text, without its newline.
    pub text: String,
}

/// Receives a task's lines (and progress reports) as they are written (a
/// daemon's task log, a terminal). Called from the body's own calls: must be
/// cheap, must not block.
pub trait LineSink: Send + Sync {
    /// One line of attempt `attempt`.
    fn push(&self, attempt: u32, stream: Stream, text: &str);

    /// A progress report of attempt `attempt` (`done` of `total`). The
    /// supervisor publishes progress as events anyway; a sink that wants it
    /// without subscribing overrides this. Ignored by default.
    fn progress(&self, attempt: u32, done: u64, total: u64) {
        let _ = (attempt, done, total);
    }
}
