//! Owns one attempt's tape: while recording, every answer the host gives
//! that could differ between two runs is appended to the record, within
//! its byte budget; while replaying, those answers come from the record,
//! and the first question the record does not hold stops the guest
//! ([`Stop`]). Off, it costs a branch. The clocks, the random numbers
//! (from a recorded seed) and the key-value backend are wrapped here;
//! the host calls of our own package call [`Tape::call`].

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

use super::format::{Answer, Ask, Call, WriteAsk, sha256};
use crate::kv::{Bucket, KvBackend, KvError, KvFuture, KvWrite};

/// One attempt's tape.
#[derive(Clone, Default)]
pub(crate) enum Tape {
    /// Neither recording nor replaying.
    #[default]
    Off,
    /// Recording.
    Record(Arc<Recording>),
    /// Replaying.
    Replay(Arc<Replaying>),
}

/// Why a replayed guest was stopped at a host call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// It asked what the record does not hold there.
    #[error("the replay diverged from the record at call {call}")]
    Diverged {
        /// The call's number, from 1.
        call: u32,
    },
    /// It reached the point where the recorded attempt was aborted.
    #[error("the replay reached the recorded force-abort")]
    RecordedAbort,
    /// It reached the end of a truncated record.
    #[error("the replay reached the end of a truncated record")]
    Truncated,
}

/// Bytes made free in the record's buffer before each call is encoded:
/// most calls take fewer.
const CALL_ROOM: usize = 256;

/// The recording side: the calls encoded so far, within a budget.
pub(crate) struct Recording {
    state: Mutex<RecordingState>,
}

struct RecordingState {
    calls: Vec<u8>,
    count: u32,
    budget: usize,
    truncated: bool,
}

impl Recording {
    /// A recording that keeps up to `budget` bytes of calls.
    pub(crate) fn new(budget: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(RecordingState {
                calls: Vec::new(),
                count: 0,
                budget,
                truncated: false,
            }),
        })
    }

    fn push(&self, call: &Call) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.truncated {
            return;
        }
        let at = state.calls.len();
        // Encoding plain data into a Vec cannot fail. Room for the call
        // first: encoding grows the buffer as it writes, and from empty
        // that was a reallocation per doubling (8, 16, 32, ... bytes).
        let mut calls = std::mem::take(&mut state.calls);
        calls.reserve(CALL_ROOM);
        let mut calls = postcard::to_extend(call, calls).unwrap_or_default();
        if calls.len() > state.budget {
            calls.truncate(at);
            state.truncated = true;
        } else {
            state.count += 1;
        }
        state.calls = calls;
    }

    /// The encoded calls, their count, and whether the budget ran out.
    pub(crate) fn take(&self) -> (Vec<u8>, u32, bool) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (
            std::mem::take(&mut state.calls),
            state.count,
            state.truncated,
        )
    }
}

/// What a replay found at a host call the record does not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The call's number, from 1.
    pub call: u32,
    /// What the guest asked.
    pub asked: String,
    /// What the record holds there (none: the record ends before it).
    pub recorded: Option<String>,
}

/// The replaying side: the recorded calls and how far the guest got.
pub(crate) struct Replaying {
    state: Mutex<ReplayingState>,
    stopped: AtomicBool,
}

struct ReplayingState {
    calls: Vec<Call>,
    next: usize,
    /// What ends the record: an abort, a truncation, or nothing.
    end: Option<Stop>,
    stop: Option<Stop>,
    divergence: Option<Divergence>,
}

impl Replaying {
    /// Replays these calls; `end` is what the guest meets past the last
    /// one (a recorded abort, a truncation), if anything.
    pub(crate) fn new(calls: Vec<Call>, end: Option<Stop>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(ReplayingState {
                calls,
                next: 0,
                end,
                stop: None,
                divergence: None,
            }),
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether the guest was stopped at a call (its next epoch check traps).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Why the guest was stopped, where it diverged, and how many recorded
    /// calls it used.
    pub(crate) fn result(&self) -> (Option<Stop>, Option<Divergence>, usize, usize) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (
            state.stop.clone(),
            state.divergence.clone(),
            state.next,
            state.calls.len(),
        )
    }

    fn answer(&self, ask: Ask) -> Result<Answer, Stop> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(stop) = &state.stop {
            return Err(stop.clone());
        }
        let number = u32::try_from(state.next + 1).unwrap_or(u32::MAX);
        let found = state.calls.get(state.next).cloned();
        let stop = match found {
            Some(call) if call.ask == ask => {
                state.next += 1;
                return Ok(call.answer);
            }
            Some(call) => {
                state.divergence = Some(Divergence {
                    call: number,
                    asked: ask.to_string(),
                    recorded: Some(call.ask.to_string()),
                });
                Stop::Diverged { call: number }
            }
            None => match state.end.clone() {
                Some(end) => end,
                None => {
                    state.divergence = Some(Divergence {
                        call: number,
                        asked: ask.to_string(),
                        recorded: None,
                    });
                    Stop::Diverged { call: number }
                }
            },
        };
        state.stop = Some(stop.clone());
        self.stopped.store(true, Ordering::Relaxed);
        Err(stop)
    }
}

impl Tape {
    /// Whether the tape records or replays.
    pub(crate) fn is_on(&self) -> bool {
        !matches!(self, Self::Off)
    }

    /// Answers a call that does not wait: off, `real`'s answer; recording,
    /// `real`'s answer, recorded; replaying, the recorded answer to `ask`.
    pub(crate) fn call(
        &self,
        ask: impl FnOnce() -> Ask,
        real: impl FnOnce() -> Answer,
    ) -> Result<Answer, Stop> {
        match self {
            Self::Off => Ok(real()),
            Self::Record(recording) => {
                let ask = ask();
                let answer = real();
                let call = Call { ask, answer };
                recording.push(&call);
                Ok(call.answer)
            }
            Self::Replay(replaying) => replaying.answer(ask()),
        }
    }

    /// [`Tape::call`] of a call that may wait.
    pub(crate) async fn call_async(
        &self,
        ask: impl FnOnce() -> Ask,
        real: impl Future<Output = Answer>,
    ) -> Result<Answer, Stop> {
        match self {
            Self::Off => Ok(real.await),
            Self::Record(recording) => {
                let ask = ask();
                let answer = real.await;
                let call = Call { ask, answer };
                recording.push(&call);
                Ok(call.answer)
            }
            Self::Replay(replaying) => replaying.answer(ask()),
        }
    }
}

/// A tape's answer that is not of the kind its question takes: the
/// record is damaged.
pub(crate) fn wrong_answer(answer: &Answer) -> wasmtime::Error {
    wasmtime::Error::msg(format!(
        "the record is damaged: a host call was answered with {answer:?}"
    ))
}

/// `wasi:clocks/wall-clock` through a tape.
pub(crate) struct TapedWallClock(pub(crate) Tape);

impl HostWallClock for TapedWallClock {
    fn resolution(&self) -> Duration {
        let real = || {
            let d = wasmtime_wasi::clocks::WallClock::new().resolution();
            Answer::Time(d.as_secs(), d.subsec_nanos())
        };
        match self.0.call(|| Ask::WallResolution, real) {
            Ok(Answer::Time(s, n)) => Duration::new(s, n),
            _ => Duration::from_nanos(1),
        }
    }

    fn now(&self) -> Duration {
        let real = || {
            let d = wasmtime_wasi::clocks::WallClock::new().now();
            Answer::Time(d.as_secs(), d.subsec_nanos())
        };
        match self.0.call(|| Ask::WallNow, real) {
            Ok(Answer::Time(s, n)) => Duration::new(s, n),
            _ => Duration::ZERO,
        }
    }
}

/// `wasi:clocks/monotonic-clock` through a tape.
pub(crate) struct TapedMonotonicClock {
    pub(crate) tape: Tape,
    pub(crate) real: wasmtime_wasi::clocks::MonotonicClock,
}

impl HostMonotonicClock for TapedMonotonicClock {
    fn resolution(&self) -> u64 {
        match self.tape.call(
            || Ask::MonotonicResolution,
            || Answer::Nanos(self.real.resolution()),
        ) {
            Ok(Answer::Nanos(n)) => n,
            _ => 1,
        }
    }

    fn now(&self) -> u64 {
        match self
            .tape
            .call(|| Ask::MonotonicNow, || Answer::Nanos(self.real.now()))
        {
            Ok(Answer::Nanos(n)) => n,
            _ => 0,
        }
    }
}

/// A key-value backend through a tape: recording, the real backend's
/// answers are kept; replaying, they come from the record and no backend
/// is reached.
pub(crate) struct TapedKv {
    pub(crate) tape: Tape,
    /// The real backend (none when replaying).
    pub(crate) inner: Option<Arc<dyn KvBackend>>,
}

fn stopped<T>(stop: &Stop) -> Result<T, KvError> {
    Err(KvError(stop.to_string()))
}

impl TapedKv {
    fn inner(&self) -> Result<&Arc<dyn KvBackend>, KvError> {
        self.inner
            .as_ref()
            .ok_or_else(|| KvError("a replay reaches no key-value store".into()))
    }
}

impl KvBackend for TapedKv {
    fn get(&self, task: u64, bucket: &Bucket, key: &str) -> KvFuture<Option<Vec<u8>>> {
        let tape = self.tape.clone();
        let ask = Ask::KvGet {
            bucket: bucket.scope(),
            key: key.to_owned(),
        };
        let real = self.inner().map(|b| b.get(task, bucket, key));
        Box::pin(async move {
            let real = async {
                match real {
                    Ok(get) => Answer::Value(get.await.map_err(|e| e.0)),
                    Err(e) => Answer::Value(Err(e.0)),
                }
            };
            match tape.call_async(|| ask, real).await {
                Ok(Answer::Value(value)) => value.map_err(KvError),
                Ok(other) => Err(KvError(wrong_answer(&other).to_string())),
                Err(stop) => stopped(&stop),
            }
        })
    }

    fn write(&self, task: u64, bucket: &Bucket, write: KvWrite) -> KvFuture<Option<u64>> {
        let tape = self.tape.clone();
        let (key, asked) = match &write {
            KvWrite::Set(key, value) => (key.clone(), WriteAsk::Set(sha256(value))),
            KvWrite::Delete(key) => (key.clone(), WriteAsk::Delete),
            KvWrite::Increment(key, by) => (key.clone(), WriteAsk::Increment(*by)),
        };
        let ask = Ask::KvWrite {
            bucket: bucket.scope(),
            key,
            write: asked,
        };
        let real = self.inner().map(|b| b.write(task, bucket, write));
        Box::pin(async move {
            let real = async {
                match real {
                    Ok(write) => Answer::Written(write.await.map_err(|e| e.0)),
                    Err(e) => Answer::Written(Err(e.0)),
                }
            };
            match tape.call_async(|| ask, real).await {
                Ok(Answer::Written(written)) => written.map_err(KvError),
                Ok(other) => Err(KvError(wrong_answer(&other).to_string())),
                Err(stop) => stopped(&stop),
            }
        })
    }

    fn keys(
        &self,
        task: u64,
        bucket: &Bucket,
        cursor: u64,
    ) -> KvFuture<(Vec<String>, Option<u64>)> {
        let tape = self.tape.clone();
        let ask = Ask::KvKeys {
            bucket: bucket.scope(),
            cursor,
        };
        let real = self.inner().map(|b| b.keys(task, bucket, cursor));
        Box::pin(async move {
            let real = async {
                match real {
                    Ok(keys) => Answer::Keys(keys.await.map_err(|e| e.0)),
                    Err(e) => Answer::Keys(Err(e.0)),
                }
            };
            match tape.call_async(|| ask, real).await {
                Ok(Answer::Keys(keys)) => keys.map_err(KvError),
                Ok(other) => Err(KvError(wrong_answer(&other).to_string())),
                Err(stop) => stopped(&stop),
            }
        })
    }
}
