//! The flight recorder: every attempt can be recorded and replayed
//! offline. A guest reaches the world only through host calls, so the
//! answers that could differ between two runs (the clocks, the random
//! numbers, cancellation, sleeps, key-value state, child outcomes), with
//! the world the attempt started in, are all a replay needs.
//!
//! | module | owns |
//! |---|---|
//! | `format` | what a record holds ([`AttemptRecord`], [`Call`]) and its file ([`RecordFile`]) |
//! | `tape` | one attempt's tape: recording within a budget, replaying and stopping where the guest diverges; the taped clocks and key-value backend |
//! | `replay` | [`Runtime::replay`](crate::Runtime::replay): one recorded attempt run again against its record, and the verdict |
//!
//! **Must not** record a secret's value (only its digest), or reach a
//! grant, the network or a clock while replaying.

#![forbid(unsafe_code)]

pub mod format;
pub(crate) mod replay;
pub(crate) mod tape;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

pub use format::{
    AttemptRecord, Call, DEFAULT_RECORD_BUDGET, EndKind, FORMAT_VERSION, RecordEnd, RecordError,
    RecordFile, RecordStart, RecordedSecret,
};
pub use replay::{ReplayReport, ReplayRequest, Verdict};
pub use tape::{Divergence, Stop};

use crate::failure::AttemptError;
use crate::output::GuestSink;
use format::{LineDigest, sha256};
use tape::Recording;
use taskhost_core::logline::Stream;

/// Receives each recorded attempt's record as the attempt ends.
pub trait RecordSink: Send + Sync {
    /// One attempt's record.
    fn recorded(&self, record: AttemptRecord);
}

/// How a task's attempts are recorded.
#[derive(Clone)]
pub struct RecordSettings {
    /// Bytes of calls a record keeps; past them it is marked truncated.
    pub budget: usize,
    /// Where the component came from (a path or a name), kept in the
    /// record so a replay can find it.
    pub source: String,
    /// Where the records go.
    pub sink: Arc<dyn RecordSink>,
}

impl std::fmt::Debug for RecordSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSettings")
            .field("budget", &self.budget)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A guest sink that also digests every line, in order.
pub(crate) struct DigestingSink {
    inner: Arc<dyn GuestSink>,
    lines: Mutex<LineDigest>,
}

impl DigestingSink {
    pub(crate) fn new(inner: Arc<dyn GuestSink>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            lines: Mutex::default(),
        })
    }

    /// The digest of the lines so far, and their count.
    pub(crate) fn digest(&self) -> ([u8; 32], u64) {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finish()
    }
}

impl GuestSink for DigestingSink {
    fn line(&self, stream: Stream, text: &str) {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .line(&stream.to_string(), text);
        self.inner.line(stream, text);
    }

    fn progress(&self, done: u64, total: u64) {
        self.inner.progress(done, total);
    }
}

/// The end of a record, from an attempt's result and what it said.
pub(crate) fn record_end(
    result: &Result<Vec<u8>, AttemptError>,
    lines: &DigestingSink,
    duration_ms: u64,
) -> RecordEnd {
    let (outcome, reason, output) = match result {
        Ok(output) => (EndKind::Completed, String::new(), sha256(output)),
        Err(AttemptError::Fail { reason, .. }) => (EndKind::Failed, reason.clone(), sha256(&[])),
        Err(AttemptError::Fatal { reason, .. }) => (EndKind::Fatal, reason.clone(), sha256(&[])),
        Err(AttemptError::Canceled) => (EndKind::Canceled, String::new(), sha256(&[])),
        Err(AttemptError::Aborted) => (EndKind::Aborted, String::new(), sha256(&[])),
    };
    let (lines, line_count) = lines.digest();
    RecordEnd {
        outcome,
        reason,
        output,
        lines,
        line_count,
        duration_ms,
    }
}

/// One attempt being recorded: its start, its tape, its lines. An
/// attempt dropped before it ended (a timeout drops it) is recorded as
/// stopped by force.
pub(crate) struct AttemptRecorder {
    pub(crate) start: Option<RecordStart>,
    pub(crate) recording: Arc<Recording>,
    pub(crate) lines: Arc<DigestingSink>,
    pub(crate) started: Instant,
    pub(crate) sink: Arc<dyn RecordSink>,
}

impl AttemptRecorder {
    /// Hands the record of the attempt that ended with `result` to its sink.
    pub(crate) fn finish(&mut self, result: &Result<Vec<u8>, AttemptError>) {
        let Some(start) = self.start.take() else {
            return;
        };
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (calls, call_count, truncated) = self.recording.take();
        let end = record_end(result, &self.lines, duration_ms);
        self.sink.recorded(AttemptRecord {
            start,
            calls,
            call_count,
            truncated,
            end,
        });
    }
}

impl Drop for AttemptRecorder {
    fn drop(&mut self) {
        self.finish(&Err(AttemptError::Aborted));
    }
}

/// A fresh seed for an attempt's random numbers.
pub(crate) fn fresh_seed() -> [u8; 32] {
    rand::random()
}

/// Sets a WASI context's clocks and random numbers to go through `tape`,
/// the random numbers from `seed`.
pub(crate) fn tape_world(
    builder: &mut wasmtime_wasi::WasiCtxBuilder,
    tape: &tape::Tape,
    seed: [u8; 32],
) {
    use rand::SeedableRng;
    use sha2::Digest as _;
    // sha256 of the seed, then `what`, hashed as they come (no copy).
    let derived = |what: &[u8]| -> [u8; 32] {
        sha2::Sha256::new()
            .chain_update(seed)
            .chain_update(what)
            .finalize()
            .into()
    };
    let insecure_seed = derived(b"insecure-seed");
    let mut low = [0u8; 16];
    low.copy_from_slice(&insecure_seed[..16]);
    builder
        .secure_random(rand::rngs::StdRng::from_seed(seed))
        .insecure_random(rand::rngs::SmallRng::from_seed(derived(b"insecure")))
        .insecure_random_seed(u128::from_le_bytes(low))
        .wall_clock(tape::TapedWallClock(tape.clone()))
        .monotonic_clock(tape::TapedMonotonicClock {
            tape: tape.clone(),
            real: wasmtime_wasi::clocks::MonotonicClock::new(),
        });
}
