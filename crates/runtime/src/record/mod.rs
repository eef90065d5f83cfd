//! The flight recorder: every attempt can be recorded and replayed
//! offline. A guest reaches the world only through host calls, so the
//! answers that could differ between two runs (the clocks, the random
//! numbers, cancellation, sleeps, key-value state, child outcomes, the
//! responses to outbound HTTP requests, the files opened and the
//! directories listed through directory grants), with the world the
//! attempt started in, are all a replay needs.
//!
//! | module | owns |
//! |---|---|
//! | `encode` | the calls a guest may make at every step (the clocks, key-value), encoded by hand as postcard encodes them |
//! | `format` | what a record holds ([`AttemptRecord`], [`Call`]) and its file ([`RecordFile`]) |
//! | `tape` | one attempt's tape: recording within a budget, replaying and stopping where the guest diverges; the taped clocks and key-value calls |
//! | `files` | reads through directory grants on a tape: each open to read a call, the file's content its answer, each listed entry a call; replaying, fresh read-only grants filled from the record |
//! | `http` | outbound HTTP on a tape: each request a call reserved in the order sent, its whole response (or error) the answer; replaying, answered from the record |
//! | `replay` | [`Runtime::replay`](crate::Runtime::replay): one recorded attempt run again against its record, and the verdict |
//!
//! **Must not** record a secret's value (only its digest), or reach a
//! grant, the network or a clock while replaying.

#![forbid(unsafe_code)]

pub(crate) mod encode;
pub(crate) mod files;
pub mod format;
pub(crate) mod http;
pub(crate) mod replay;
pub(crate) mod tape;

use std::sync::Arc;
use std::time::Instant;

pub use format::{
    AttemptRecord, Call, DEFAULT_RECORD_BUDGET, EndKind, FORMAT_VERSION, RecordEnd, RecordError,
    RecordFile, RecordStart, RecordedResponse, RecordedSecret,
};
pub use replay::{ReplayReport, ReplayRequest, Verdict};
pub use tape::{Divergence, Stop};

use crate::failure::AttemptError;
use crate::output::Capture;
use format::{fingerprint, sha256};
use tape::Recording;

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

/// The end of a record, from an attempt's result and what it said (the
/// digest of its lines and their count, from its [`Capture`]).
pub(crate) fn record_end(
    result: &Result<Vec<u8>, AttemptError>,
    (lines, line_count): (u64, u64),
    duration_ms: u64,
) -> RecordEnd {
    let (outcome, reason, output) = match result {
        Ok(output) => (EndKind::Completed, String::new(), fingerprint(output)),
        Err(AttemptError::Fail { reason, .. }) => {
            (EndKind::Failed, reason.clone(), fingerprint(&[]))
        }
        Err(AttemptError::Fatal { reason, .. }) => {
            (EndKind::Fatal, reason.clone(), fingerprint(&[]))
        }
        Err(AttemptError::Canceled) => (EndKind::Canceled, String::new(), fingerprint(&[])),
        Err(AttemptError::Aborted) => (EndKind::Aborted, String::new(), fingerprint(&[])),
    };
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
    /// What the attempt said, digested.
    pub(crate) lines: Arc<Capture>,
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
        let end = record_end(result, self.lines.lines(), duration_ms);
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
    // `fill`, not `random`: an array from `random` is drawn a byte at a
    // time, one generator call each.
    let mut seed = [0; 32];
    rand::fill(&mut seed);
    seed
}

/// What an attempt's clocks and random numbers go through.
#[derive(Clone, Copy)]
pub(crate) struct TapedWorld<'a> {
    pub(crate) tape: &'a tape::Tape,
    /// The seed of the random numbers.
    pub(crate) seed: [u8; 32],
    /// The zero of the monotonic clock.
    pub(crate) started: Instant,
}

/// Sets a WASI context's clocks and random numbers to go through a tape.
pub(crate) fn tape_world(builder: &mut wasmtime_wasi::WasiCtxBuilder, world: TapedWorld<'_>) {
    let TapedWorld {
        tape,
        seed,
        started,
    } = world;
    use rand::SeedableRng;
    // One one-way derivation gives the insecure seed and generator: the
    // guest may show them, and they must not tell the secure seed.
    let derived = sha256(&seed);
    let mut low = [0u8; 16];
    low.copy_from_slice(&derived[..16]);
    let mut fast = [0u8; 8];
    fast.copy_from_slice(&derived[16..24]);
    builder
        .secure_random(rand::rngs::StdRng::from_seed(seed))
        .insecure_random(rand::rngs::SmallRng::seed_from_u64(u64::from_le_bytes(
            fast,
        )))
        .insecure_random_seed(u128::from_le_bytes(low))
        .wall_clock(tape::TapedWallClock(tape.clone()))
        .monotonic_clock(tape::TapedMonotonicClock {
            tape: tape.clone(),
            zero: started,
        });
}
