//! Owns the host functions of our own package as one attempt's guest calls
//! them: `taskhost:plugin/host` (the attempt's facts, whether it is asked
//! to stop, a sleep that a stop cuts short, log lines and progress) and
//! `taskhost:plugin/children` (a spawn, and a wait that a stop cuts short
//! and that parks the attempt while the child has not ended), and
//! `taskhost:plugin/slots` (a capacity declared from `describe`). A call that
//! really waited says so, and the attempt's epoch callback then skips one
//! yield (`attempt::new_store`). What a child is and who runs it is the
//! business of `children`.

#![forbid(unsafe_code)]

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::bindings::taskhost::plugin::{children, host, slots, types};
use super::children::ChildAccess;
use super::facts::AttemptFacts;
use super::output::Capture;
use super::record::format::{Answer, Ask, ChildEnd, WaitFailure, fingerprint};
use super::record::tape::{Tape, wrong_answer};
use taskhost_core::logline::LogLevel;

/// What the host functions of one attempt need.
pub(crate) struct HostCtx {
    facts: Arc<AttemptFacts>,
    cancel: CancellationToken,
    capture: Arc<Capture>,
    /// Set when a host call that waited returns: the guest has just been
    /// scheduled again, so an epoch deadline that passed meanwhile needs no
    /// yield of its own.
    woke: bool,
    /// What the guest may do with child tasks (none: spawns fail).
    children: Option<ChildAccess>,
    /// The capacity the guest declared (`slots.declare-capacity`; read
    /// after `describe`, ignored after `run`).
    declared_capacity: Option<u32>,
    /// Records or replays the answers that could differ between runs.
    tape: Tape,
}

impl HostCtx {
    /// The host functions' side of an attempt with these facts, stop
    /// token, capture and children (none: spawns fail).
    pub(crate) fn new(
        facts: Arc<AttemptFacts>,
        cancel: CancellationToken,
        capture: Arc<Capture>,
        children: Option<ChildAccess>,
        tape: Tape,
    ) -> Self {
        Self {
            facts,
            cancel,
            capture,
            woke: false,
            children,
            declared_capacity: None,
            tape,
        }
    }

    /// The capacity the guest declared, if it did.
    pub(crate) fn declared_capacity(&self) -> Option<u32> {
        self.declared_capacity
    }

    /// Whether a host call that waited has returned since the last time
    /// this was asked (see `woke`).
    pub(crate) fn take_woke(&mut self) -> bool {
        std::mem::take(&mut self.woke)
    }

    /// A line in the task's log, as if the guest had logged it.
    pub(crate) fn log(&self, level: LogLevel, message: &str) {
        self.capture.log(level, message);
    }
}

/// Runs `wait` and says whether it really waited (was pending once): only
/// a host call that waited counts as a wake-up, while one that returns at
/// once leaves the guest's next epoch check to yield as usual.
async fn noting_wait<T>(wait: impl Future<Output = T>) -> (T, bool) {
    let mut waited = false;
    let mut wait = std::pin::pin!(wait);
    let out = std::future::poll_fn(|cx| {
        let poll = wait.as_mut().poll(cx);
        waited |= poll.is_pending();
        poll
    })
    .await;
    (out, waited)
}

impl types::Host for HostCtx {}

impl slots::Host for HostCtx {
    fn declare_capacity(&mut self, capacity: u32) -> wasmtime::Result<()> {
        self.declared_capacity = Some(capacity);
        Ok(())
    }
}

impl children::Host for HostCtx {
    async fn spawn(&mut self, spec: children::ChildSpec) -> wasmtime::Result<Result<u64, String>> {
        let ask = spawn_ask(&spec);
        let key = spec.key.clone();
        let tape = self.tape.clone();
        match tape
            .call_async(|| ask, async {
                Answer::Spawned(self.spawn_now(spec).await)
            })
            .await?
        {
            Answer::Spawned(spawned) => {
                // The task's log tells each child, in a replay too.
                if let Ok(id) = &spawned {
                    let parent = self.facts.task_id;
                    let line = format!("child task {id} (key `{key}`) of task {parent}");
                    self.capture.log(LogLevel::Info, &line);
                }
                Ok(spawned)
            }
            other => Err(wrong_answer(&other)),
        }
    }

    async fn wait(
        &mut self,
        id: u64,
    ) -> wasmtime::Result<Result<children::ChildOutcome, children::WaitError>> {
        let tape = self.tape.clone();
        let real = async {
            Answer::Waited(match self.wait_now(id).await {
                Ok(outcome) => Ok(ChildEnd {
                    status: outcome.status as u8,
                    output: outcome.output,
                    reason: outcome.reason,
                }),
                Err(children::WaitError::Cancelled) => Err(WaitFailure::Cancelled),
                Err(children::WaitError::UnknownChild) => Err(WaitFailure::UnknownChild),
            })
        };
        match tape.call_async(|| Ask::Wait { child: id }, real).await? {
            Answer::Waited(Ok(end)) => Ok(Ok(children::ChildOutcome {
                status: child_status(end.status)?,
                output: end.output,
                reason: end.reason,
            })),
            Answer::Waited(Err(WaitFailure::Cancelled)) => Ok(Err(children::WaitError::Cancelled)),
            Answer::Waited(Err(WaitFailure::UnknownChild)) => {
                Ok(Err(children::WaitError::UnknownChild))
            }
            other => Err(wrong_answer(&other)),
        }
    }
}

/// What a replay compares of a spawn: the key, and a digest of the spec.
fn spawn_ask(spec: &children::ChildSpec) -> Ask {
    let mut text = Vec::new();
    let mut field = |bytes: &[u8]| {
        text.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        text.extend_from_slice(bytes);
    };
    field(spec.key.as_bytes());
    for part in [&spec.plugin, &spec.name, &spec.slot] {
        field(part.as_deref().unwrap_or("\0").as_bytes());
    }
    for (k, v) in &spec.params {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    field(&spec.input);
    Ask::Spawn {
        key: spec.key.clone(),
        spec: fingerprint(&text),
    }
}

/// A `child-status` from its recorded position in the WIT enum.
fn child_status(status: u8) -> wasmtime::Result<children::ChildStatus> {
    use children::ChildStatus as S;
    [
        S::Completed,
        S::Failed,
        S::Fatal,
        S::Canceled,
        S::ForceAborted,
        S::Rejected,
        S::Panicked,
    ]
    .get(usize::from(status))
    .copied()
    .ok_or_else(|| wasmtime::Error::msg("the record is damaged: a child status out of range"))
}

impl HostCtx {
    /// Sleeps `ms` unless the attempt is asked to stop first; whether it
    /// was.
    async fn sleep_now(&mut self, ms: u64) -> bool {
        let duration = std::time::Duration::from_millis(ms);
        let (cancelled, waited) = noting_wait(async {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => true,
                () = tokio::time::sleep(duration) => false,
            }
        })
        .await;
        self.woke = waited;
        cancelled
    }

    /// [`Self::sleep_now`] through the tape: recorded, or answered from
    /// the record; boxed, and never inlined into [`host::Host::sleep`].
    #[inline(never)]
    fn sleep_taped(&mut self, ms: u64) -> futures::future::BoxFuture<'_, wasmtime::Result<bool>> {
        Box::pin(self.sleep_through_tape(ms))
    }

    async fn sleep_through_tape(&mut self, ms: u64) -> wasmtime::Result<bool> {
        let tape = self.tape.clone();
        let real = async {
            Answer::Slept {
                cancelled: self.sleep_now(ms).await,
            }
        };
        match tape.call_async(|| Ask::Sleep { ms }, real).await? {
            Answer::Slept { cancelled } => Ok(cancelled),
            other => Err(wrong_answer(&other)),
        }
    }

    async fn spawn_now(&mut self, spec: children::ChildSpec) -> Result<u64, String> {
        let Some(access) = &self.children else {
            return Err(
                "this runtime starts no child tasks (`host run` has no controller): \
                        submit the parent to a daemon"
                    .into(),
            );
        };
        let spec = super::children::spec(spec)?;
        let parent = access.parent();
        access.backend.spawn(&parent, spec).await
    }

    async fn wait_now(&mut self, id: u64) -> Result<children::ChildOutcome, children::WaitError> {
        let Some(access) = &self.children else {
            return Err(children::WaitError::UnknownChild);
        };
        let backend = Arc::clone(&access.backend);
        let parent = access.facts.task_id;
        let wait = async {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => Err(children::WaitError::Cancelled),
                found = backend.wait(parent, id) => match found {
                    Ok(outcome) => Ok(super::children::outcome(outcome)),
                    Err(super::children::WaitError::UnknownChild) => {
                        Err(children::WaitError::UnknownChild)
                    }
                },
            }
        };
        let mut wait = std::pin::pin!(wait);
        // A child that has ended answers at once; one that has not may need
        // this attempt's permit to run, so the attempt is parked meanwhile.
        if let Some(result) = futures::FutureExt::now_or_never(wait.as_mut()) {
            self.woke = false;
            return result;
        }
        let parking = access.parking.clone().filter(|p| p.park());
        let result = wait.await;
        if let Some(parking) = parking {
            parking.unpark().await;
        }
        self.woke = true;
        result
    }
}

impl host::Host for HostCtx {
    fn is_cancelled(&mut self) -> wasmtime::Result<bool> {
        let cancel = &self.cancel;
        match self
            .tape
            .call(|| Ask::IsCancelled, || Answer::Flag(cancel.is_cancelled()))?
        {
            Answer::Flag(flag) => Ok(flag),
            other => Err(wrong_answer(&other)),
        }
    }

    async fn sleep(&mut self, ms: u64) -> wasmtime::Result<types::SleepStatus> {
        // A parked guest keeps this future, and the frames that poll it on
        // its stack, for the whole sleep: the tape's part lies out of line
        // so that an attempt not recorded touches none of it.
        let cancelled = if self.tape.is_on() {
            self.sleep_taped(ms).await?
        } else {
            self.sleep_now(ms).await
        };
        Ok(if cancelled {
            types::SleepStatus::Cancelled
        } else {
            types::SleepStatus::Elapsed
        })
    }
    fn log(&mut self, level: types::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            types::Level::Trace => LogLevel::Trace,
            types::Level::Debug => LogLevel::Debug,
            types::Level::Info => LogLevel::Info,
            types::Level::Warn => LogLevel::Warn,
            types::Level::Error => LogLevel::Error,
        };
        self.capture.log(level, &message);
        Ok(())
    }

    fn progress(&mut self, done: u64, total: u64) -> wasmtime::Result<()> {
        self.capture.progress(done, total);
        Ok(())
    }

    fn attempt(&mut self) -> wasmtime::Result<types::AttemptInfo> {
        let facts = &self.facts;
        Ok(types::AttemptInfo {
            task_id: facts.task_id,
            name: facts.name.clone(),
            slot: facts.slot.clone(),
            attempt: facts.attempt,
            params: facts.params.clone(),
        })
    }
}
