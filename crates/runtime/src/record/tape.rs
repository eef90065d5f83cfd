//! Owns one attempt's tape: while recording, every answer the host gives
//! that could differ between two runs is appended to the record, within
//! its byte budget; while replaying, those answers come from the record,
//! and the first question the record does not hold stops the guest
//! ([`Stop`]). Off, it costs a branch. The clocks, the random numbers
//! (from a recorded seed) and the key-value backend are wrapped here;
//! the host calls of our own package call [`Tape::call`]. A call answered
//! later than asked (an outbound request) keeps its place: recording, it
//! is reserved when asked ([`Recording::reserve`]) and the calls made
//! meanwhile wait behind it; replaying, it is claimed when asked and its
//! whole question compared once known ([`Replaying::settle`]).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

use super::encode::{self, KvAsk};
use super::format::{Answer, Ask, Call, WriteAsk, fingerprint};
use crate::kv::{Bucket, KvBackend, KvError, KvWrite};

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
    /// Calls asked but not all answered yet, in the order asked: the
    /// first is call `first_waiting` (counted from 0). A reserved call
    /// holds its question until its answer fills it; the calls after it
    /// wait to be encoded.
    waiting: std::collections::VecDeque<Waiting>,
    first_waiting: u64,
    /// A call whose question is encoded at the end of `calls` from this
    /// offset, its answer still to come ([`Asked::Open`]): the calls made
    /// meanwhile wait behind it.
    open: Option<usize>,
}

/// A call that waits to be encoded.
enum Waiting {
    /// Asked; its answer is still to come.
    Reserved(Ask),
    /// Complete.
    Call(Call),
    /// Complete, encoded.
    Encoded(Vec<u8>),
    /// The record ends here: its answer did not fit the budget.
    Truncate,
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
                waiting: std::collections::VecDeque::new(),
                first_waiting: 0,
                open: None,
            }),
        })
    }

    fn push(&self, call: &Call) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.behind() {
            state.waiting.push_back(Waiting::Call(call.clone()));
            return;
        }
        state.encode(call);
    }

    /// Records a call that `encode` appends, whole, to the record (to a
    /// buffer of its own while calls wait).
    pub(crate) fn push_with(&self, encode: impl FnOnce(&mut Vec<u8>)) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.behind() {
            let mut call = Vec::new();
            encode(&mut call);
            state.waiting.push_back(Waiting::Encoded(call));
            return;
        }
        state.append_with(encode);
    }

    /// Reserves the next call for a question whose answer comes later
    /// ([`Recording::fill`]): the calls made meanwhile are kept after it.
    pub(crate) fn reserve(&self, ask: Ask) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.waiting.push_back(Waiting::Reserved(ask));
        state.first_waiting + state.waiting.len() as u64 - 1
    }

    /// Fills reserved call `at` with its call, or (none) ends the record
    /// there, marked truncated. Filling a call twice keeps the first.
    pub(crate) fn fill(&self, at: u64, call: Option<Call>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(index) = at
            .checked_sub(state.first_waiting)
            .and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        if let Some(slot @ Waiting::Reserved(_)) = state.waiting.get_mut(index) {
            *slot = call.map_or(Waiting::Truncate, Waiting::Call);
        }
        state.flush();
    }

    /// How many bytes the budget still leaves.
    pub(crate) fn room(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.truncated {
            return 0;
        }
        state.budget.saturating_sub(state.calls.len())
    }

    /// The encoded calls, their count, and whether the budget ran out. A
    /// call still unanswered (the attempt ended while it waited) is kept
    /// with an error for its answer, which the guest never saw.
    pub(crate) fn take(&self) -> (Vec<u8>, u32, bool) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = state.open.take() {
            // Its answer never came: the guest did not see one either.
            state.calls.truncate(at);
        }
        for slot in &mut state.waiting {
            if let Waiting::Reserved(ask) = slot {
                *slot = Waiting::Call(Call {
                    ask: ask.clone(),
                    answer: Answer::Response(Err(
                        "internal error: the attempt ended before this request's answer".into(),
                    )),
                });
            }
        }
        state.flush();
        (
            std::mem::take(&mut state.calls),
            state.count,
            state.truncated,
        )
    }
}

impl RecordingState {
    /// Whether a new call waits behind others: a reserved call or an
    /// open one.
    fn behind(&self) -> bool {
        !self.waiting.is_empty() || self.open.is_some()
    }

    /// Encodes the calls at the front of `waiting` that are complete.
    fn flush(&mut self) {
        if self.open.is_some() {
            return;
        }
        while let Some(front) = self.waiting.front() {
            if matches!(front, Waiting::Reserved(_)) {
                break;
            }
            self.first_waiting += 1;
            match self.waiting.pop_front() {
                Some(Waiting::Call(call)) => self.encode(&call),
                Some(Waiting::Encoded(call)) => self.append_bytes(&call),
                Some(Waiting::Truncate) => self.truncated = true,
                _ => {}
            }
        }
    }

    fn encode(&mut self, call: &Call) {
        self.append(&[], call);
    }

    /// Appends a whole call, encoded.
    fn append_bytes(&mut self, call: &[u8]) {
        self.append_with(|out| out.extend_from_slice(call));
    }

    /// Appends the call `encode` appends, or ends the record before it
    /// when it does not fit the budget.
    fn append_with(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        if self.truncated {
            return;
        }
        let at = self.calls.len();
        self.calls.reserve(CALL_ROOM);
        encode(&mut self.calls);
        if self.calls.len() > self.budget {
            self.calls.truncate(at);
            self.truncated = true;
        } else {
            self.count += 1;
        }
    }

    /// Appends a call: `encoded`, its start as bytes, then `rest`.
    fn append(&mut self, encoded: &[u8], rest: &impl serde::Serialize) {
        if self.truncated {
            return;
        }
        let at = self.calls.len();
        // Encoding plain data into a Vec cannot fail. Room for the call
        // first: encoding grows the buffer as it writes, and from empty
        // that was a reallocation per doubling (8, 16, 32, ... bytes).
        let mut calls = std::mem::take(&mut self.calls);
        calls.reserve(CALL_ROOM + encoded.len());
        calls.extend_from_slice(encoded);
        let mut calls = postcard::to_extend(rest, calls).unwrap_or_default();
        if calls.len() > self.budget {
            calls.truncate(at);
            self.truncated = true;
        } else {
            self.count += 1;
        }
        self.calls = calls;
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
        let asked = ask.clone();
        self.claim(&ask, |recorded| *recorded == asked)
            .map(|(_, call)| call.answer)
    }

    /// Takes the next recorded call for `ask` if `same` finds its question
    /// the same (a question known whole only later is compared again by
    /// [`Replaying::settle`]): its number and the call.
    pub(crate) fn claim(
        &self,
        ask: &Ask,
        same: impl Fn(&Ask) -> bool,
    ) -> Result<(u32, Call), Stop> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(stop) = &state.stop {
            return Err(stop.clone());
        }
        let number = u32::try_from(state.next + 1).unwrap_or(u32::MAX);
        let found = state.calls.get(state.next).cloned();
        let stop = match found {
            Some(call) if same(&call.ask) => {
                state.next += 1;
                return Ok((number, call));
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

    /// Compares the whole question `asked` of claimed call `number` with
    /// the recorded one: another is a divergence there.
    pub(crate) fn settle(&self, number: u32, recorded: &Ask, asked: &Ask) -> Result<(), Stop> {
        if recorded == asked {
            return Ok(());
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.divergence.is_none() {
            state.divergence = Some(Divergence {
                call: number,
                asked: asked.to_string(),
                recorded: Some(recorded.to_string()),
            });
        }
        let stop = Stop::Diverged { call: number };
        state.stop.get_or_insert(stop.clone());
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

/// A question asked of a tape before its answer is known, kept as the
/// tape needs it.
pub(crate) enum Asked<'a> {
    /// Recording, the question encoded at the end of the record: its
    /// answer follows it there.
    Open(OpenCall<'a>),
    /// Recording behind calls still waiting: the question, encoded.
    Record(&'a Recording, Vec<u8>),
    /// Replaying: the question.
    Replay(&'a Replaying, Ask),
    /// Off.
    Off,
}

impl Asked<'_> {
    /// Recording, records `real` as the answer and gives it; replaying,
    /// gives the recorded answer (`real` is not used).
    pub(crate) fn answer(self, real: Answer) -> Result<Answer, Stop> {
        match self {
            Self::Off => Ok(real),
            Self::Open(call) => {
                // Closed here, not again when dropped.
                let call = std::mem::ManuallyDrop::new(call);
                call.recording.close(call.at, Some(&real));
                Ok(real)
            }
            Self::Record(recording, ask) => {
                recording.push_with(|out| {
                    out.extend_from_slice(&ask);
                    encode::answer(out, &real);
                });
                Ok(real)
            }
            Self::Replay(replaying, ask) => replaying.answer(ask),
        }
    }
}

/// A call opened at the end of a record, at offset `at`.
pub(crate) struct OpenCall<'a> {
    recording: &'a Recording,
    at: usize,
}

impl Drop for OpenCall<'_> {
    /// A question left unanswered (its call was dropped) leaves no call.
    fn drop(&mut self) {
        self.recording.close(self.at, None);
    }
}

impl Recording {
    /// Opens a call at the end of the record with `ask`'s question, if no
    /// call waits (else none).
    fn open(&self, ask: &KvAsk<'_>) -> Option<usize> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.behind() || state.truncated {
            return None;
        }
        let at = state.calls.len();
        state.calls.reserve(CALL_ROOM);
        ask.encode(&mut state.calls);
        state.open = Some(at);
        Some(at)
    }

    /// Ends the call opened at `at` with `answer`, or (none) takes its
    /// question back; the calls that waited behind it follow.
    fn close(&self, at: usize, answer: Option<&Answer>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.open != Some(at) {
            return;
        }
        state.open = None;
        match answer {
            Some(answer) => {
                encode::answer(&mut state.calls, answer);
                if state.calls.len() > state.budget {
                    state.calls.truncate(at);
                    state.truncated = true;
                } else {
                    state.count += 1;
                }
            }
            None => state.calls.truncate(at),
        }
        state.flush();
    }
}

impl Tape {
    /// Takes a key-value question now, from what its call borrows.
    pub(crate) fn ask_kv(&self, ask: &KvAsk<'_>) -> Asked<'_> {
        match self {
            Self::Off => Asked::Off,
            Self::Record(recording) => match recording.open(ask) {
                Some(at) => Asked::Open(OpenCall { recording, at }),
                None => {
                    let mut encoded = Vec::with_capacity(64);
                    ask.encode(&mut encoded);
                    Asked::Record(recording, encoded)
                }
            },
            Self::Replay(replaying) => Asked::Replay(replaying, ask.to_ask()),
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
        if let Tape::Record(recording) = &self.0 {
            let d = wasmtime_wasi::clocks::WallClock::new().now();
            recording.push_with(|out| encode::wall_now(out, d.as_secs(), d.subsec_nanos()));
            return d;
        }
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

/// `wasi:clocks/monotonic-clock` through a tape: the nanoseconds since
/// `zero`, as wasmtime-wasi's own clock counts them from its creation.
pub(crate) struct TapedMonotonicClock {
    pub(crate) tape: Tape,
    pub(crate) zero: Instant,
}

impl TapedMonotonicClock {
    fn real(&self) -> u64 {
        u64::try_from(self.zero.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl HostMonotonicClock for TapedMonotonicClock {
    fn resolution(&self) -> u64 {
        let real = || Answer::Nanos(wasmtime_wasi::clocks::MonotonicClock::new().resolution());
        match self.tape.call(|| Ask::MonotonicResolution, real) {
            Ok(Answer::Nanos(n)) => n,
            _ => 1,
        }
    }

    fn now(&self) -> u64 {
        if let Tape::Record(recording) = &self.tape {
            let nanos = self.real();
            recording.push_with(|out| encode::monotonic_now(out, nanos));
            return nanos;
        }
        match self
            .tape
            .call(|| Ask::MonotonicNow, || Answer::Nanos(self.real()))
        {
            Ok(Answer::Nanos(n)) => n,
            _ => 0,
        }
    }
}

/// Key-value calls through a tape: off, the backend's answers; recording,
/// the backend's answers, kept; replaying, the recorded answers, and no
/// backend is reached.
pub(crate) struct TapedKv<'a> {
    pub(crate) tape: &'a Tape,
    /// The real backend (none when replaying).
    pub(crate) backend: Option<&'a dyn KvBackend>,
    pub(crate) task: u64,
}

fn stopped<T>(stop: &Stop) -> Result<T, KvError> {
    Err(KvError(stop.to_string()))
}

impl TapedKv<'_> {
    /// Recording, records the call `ask` answered `answer`, whole, once
    /// its answer is known: the guest asks nothing else meanwhile. Gives
    /// the answer.
    fn record(&self, ask: &KvAsk<'_>, answer: Answer) -> Answer {
        if let Tape::Record(recording) = self.tape {
            recording.push_with(|out| {
                ask.encode(out);
                encode::answer(out, &answer);
            });
        }
        answer
    }

    fn backend(&self) -> Result<&dyn KvBackend, KvError> {
        self.backend
            .ok_or_else(|| KvError("a replay reaches no key-value store".into()))
    }

    pub(crate) async fn get(&self, bucket: &Bucket, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        if let Tape::Off = self.tape {
            return self.backend()?.get(self.task, bucket, key).await;
        }
        let ask = KvAsk::Get { bucket, key };
        let answer = match self.tape {
            Tape::Replay(replaying) => replaying.answer(ask.to_ask()),
            _ => {
                let real = self.backend()?.get(self.task, bucket, key).await;
                Ok(self.record(&ask, Answer::Value(real.map_err(|e| e.0))))
            }
        };
        match answer {
            Ok(Answer::Value(value)) => value.map_err(KvError),
            Ok(other) => Err(KvError(wrong_answer(&other).to_string())),
            Err(stop) => stopped(&stop),
        }
    }

    pub(crate) async fn write(
        &self,
        bucket: &Bucket,
        write: KvWrite,
    ) -> Result<Option<u64>, KvError> {
        if let Tape::Off = self.tape {
            return self.backend()?.write(self.task, bucket, write).await;
        }
        let (key, asked) = match &write {
            KvWrite::Set(key, value) => (key, WriteAsk::Set(fingerprint(value))),
            KvWrite::Delete(key) => (key, WriteAsk::Delete),
            KvWrite::Increment(key, by) => (key, WriteAsk::Increment(*by)),
        };
        let asked = self.tape.ask_kv(&KvAsk::Write {
            bucket,
            key,
            write: asked,
        });
        let real = match self.backend() {
            Ok(backend) => backend
                .write(self.task, bucket, write)
                .await
                .map_err(|e| e.0),
            Err(e) => Err(e.0),
        };
        match asked.answer(Answer::Written(real)) {
            Ok(Answer::Written(written)) => written.map_err(KvError),
            Ok(other) => Err(KvError(wrong_answer(&other).to_string())),
            Err(stop) => stopped(&stop),
        }
    }

    pub(crate) async fn keys(
        &self,
        bucket: &Bucket,
        cursor: u64,
    ) -> Result<(Vec<String>, Option<u64>), KvError> {
        if let Tape::Off = self.tape {
            return self.backend()?.keys(self.task, bucket, cursor).await;
        }
        let ask = KvAsk::Keys { bucket, cursor };
        let answer = match self.tape {
            Tape::Replay(replaying) => replaying.answer(ask.to_ask()),
            _ => {
                let real = self.backend()?.keys(self.task, bucket, cursor).await;
                Ok(self.record(&ask, Answer::Keys(real.map_err(|e| e.0))))
            }
        };
        match answer {
            Ok(Answer::Keys(keys)) => keys.map_err(KvError),
            Ok(other) => Err(KvError(wrong_answer(&other).to_string())),
            Err(stop) => stopped(&stop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(recording: &Recording) -> (Vec<Ask>, bool) {
        let (calls, count, truncated) = recording.take();
        let mut asks = Vec::new();
        let mut rest = &calls[..];
        while !rest.is_empty() {
            let (call, tail) = postcard::take_from_bytes::<Call>(rest).unwrap();
            asks.push(call.ask);
            rest = tail;
        }
        assert_eq!(asks.len(), count as usize);
        (asks, truncated)
    }

    #[test]
    fn a_reserved_call_keeps_its_place_before_the_calls_made_meanwhile() {
        let recording = Recording::new(1 << 20);
        let tape = Tape::Record(Arc::clone(&recording));
        let at = recording.reserve(Ask::Sleep { ms: 1 });
        tape.call(|| Ask::WallNow, || Answer::Time(1, 2)).unwrap();
        // The attempt ends before this one's answer: it is kept with an
        // error, in its place.
        recording.reserve(Ask::Sleep { ms: 2 });
        recording.fill(
            at,
            Some(Call {
                ask: Ask::Sleep { ms: 1 },
                answer: Answer::Slept { cancelled: false },
            }),
        );
        tape.call(|| Ask::MonotonicNow, || Answer::Nanos(3))
            .unwrap();
        let (asks, truncated) = decoded(&recording);
        assert_eq!(
            asks,
            [
                Ask::Sleep { ms: 1 },
                Ask::WallNow,
                Ask::Sleep { ms: 2 },
                Ask::MonotonicNow
            ]
        );
        assert!(!truncated);
    }

    #[test]
    fn a_reserved_call_past_the_budget_ends_the_record_there() {
        let recording = Recording::new(1 << 20);
        let tape = Tape::Record(Arc::clone(&recording));
        tape.call(|| Ask::WallNow, || Answer::Time(1, 2)).unwrap();
        let at = recording.reserve(Ask::Sleep { ms: 1 });
        tape.call(|| Ask::MonotonicNow, || Answer::Nanos(3))
            .unwrap();
        recording.fill(at, None);
        tape.call(|| Ask::MonotonicNow, || Answer::Nanos(4))
            .unwrap();
        assert_eq!(decoded(&recording), (vec![Ask::WallNow], true));
    }
    #[test]
    fn a_key_value_call_waits_behind_a_reserved_one_and_an_unanswered_one_leaves_none() {
        let recording = Recording::new(1 << 20);
        let tape = Tape::Record(Arc::clone(&recording));
        let bucket = Bucket::Slot("s".into());
        let get = KvAsk::Get {
            bucket: &bucket,
            key: "k",
        };
        let at = recording.reserve(Ask::Sleep { ms: 1 });
        tape.ask_kv(&get).answer(Answer::Value(Ok(None))).unwrap();
        // Asked, never answered (its call was dropped): no call.
        drop(tape.ask_kv(&get));
        recording.fill(
            at,
            Some(Call {
                ask: Ask::Sleep { ms: 1 },
                answer: Answer::Slept { cancelled: false },
            }),
        );
        tape.ask_kv(&get)
            .answer(Answer::Value(Ok(Some(vec![7; 64]))))
            .unwrap();
        let (asks, truncated) = decoded(&recording);
        assert_eq!(asks, [Ask::Sleep { ms: 1 }, get.to_ask(), get.to_ask()]);
        assert!(!truncated);
    }

    #[test]
    fn an_open_call_keeps_its_place_and_an_unanswered_one_leaves_none() {
        let recording = Recording::new(1 << 20);
        let tape = Tape::Record(Arc::clone(&recording));
        let bucket = Bucket::Slot("s".into());
        let get = KvAsk::Get {
            bucket: &bucket,
            key: "k",
        };
        let asked = tape.ask_kv(&get);
        assert!(matches!(asked, Asked::Open(_)));
        // A call made while it is open (none is, from one guest) waits.
        tape.call(|| Ask::WallNow, || Answer::Time(1, 2)).unwrap();
        asked.answer(Answer::Value(Ok(None))).unwrap();
        drop(tape.ask_kv(&get));
        tape.call(|| Ask::MonotonicNow, || Answer::Nanos(3))
            .unwrap();
        // Open when the attempt ends: its question is not kept.
        let left = tape.ask_kv(&get);
        let (asks, truncated) = decoded(&recording);
        drop(left);
        assert_eq!(asks, [get.to_ask(), Ask::WallNow, Ask::MonotonicNow]);
        assert!(!truncated);
    }

    #[test]
    fn a_key_value_answer_past_the_budget_ends_the_record_there() {
        let recording = Recording::new(40);
        let tape = Tape::Record(Arc::clone(&recording));
        let bucket = Bucket::Slot("s".into());
        let asked = tape.ask_kv(&KvAsk::Get {
            bucket: &bucket,
            key: "k",
        });
        asked.answer(Answer::Value(Ok(Some(vec![7; 64])))).unwrap();
        tape.call(|| Ask::WallNow, || Answer::Time(1, 2)).unwrap();
        assert_eq!(decoded(&recording), (vec![], true));
    }
}
