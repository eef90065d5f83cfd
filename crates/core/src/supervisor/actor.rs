//! Owns the life of one registered task: the attempt loop (permit, set-up,
//! timeout, result), the restart and retry decisions, backoff, stop requests
//! with their grace and force-abort, and the final report. Every attempt's
//! future is owned here, so dropping it is physical completion.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::outcome::TaskOutcome;
use crate::units::format_duration;

use super::Shared;
use super::body::{AfterTeardown, AttemptContext, TaskBody, Teardown};
use super::events::{BackoffSource, Event, EventKind};
use super::permits::{Permit, Permits};
use super::registry::TaskEntry;
use super::spec::{ResolvedPolicies, RestartPolicy, Resume, TaskError};
use super::waiter::{AttemptRecord, MAX_HISTORY, TaskReport};
use crate::lifecycle::TaskState;

/// What an attempt's body handed over to finish it physically
/// ([`AttemptContext::finish_after_outcome`]).
type Leftovers = Option<Teardown>;

/// How one attempt ended, from the actor's point of view.
enum AttemptEnd {
    /// The body returned (or timed out) without a stop request; the permit
    /// it holds (none if it ran without a limit, or ended parked).
    Done(Result<Vec<u8>, TaskError>, Leftovers, Option<Permit>),
    /// A stop was requested and the body ended within its grace.
    Stopped(Leftovers, Option<Permit>),
    /// The grace expired: ForceAborted is already delivered and the attempt
    /// has been dropped.
    Forced,
}

/// What the actor remembers across attempts for the final report.
struct Story {
    attempts: u32,
    history: VecDeque<AttemptRecord>,
    first_start: Option<Instant>,
    /// The current attempt's span (disabled unless traces are exported).
    span: tracing::Span,
}

impl Default for Story {
    fn default() -> Self {
        Self {
            attempts: 0,
            history: VecDeque::new(),
            first_start: None,
            span: tracing::Span::none(),
        }
    }
}

impl Story {
    fn record(&mut self, attempt: u32, result: String, duration: Duration) {
        if !self.span.is_disabled() {
            self.span.record("result", result.as_str());
            if !matches!(
                result.as_str(),
                "succeeded" | "canceled" | "canceled by the body"
            ) {
                self.span.record("otel.status_code", "ERROR");
            }
        }
        if self.history.len() == MAX_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(AttemptRecord {
            attempt,
            result,
            duration,
        });
    }
}

/// What the attempt that decided the outcome still holds: the teardown its
/// body handed over and, until that has run, its permit. Boxed, and only
/// when there is a teardown, so that a task's future stays small.
struct Remains {
    teardown: Teardown,
    permit: Option<Permit>,
}

/// Keeps `permit` with the leftovers in `remains`, or releases it now if
/// there are none: then the task is shown finishing first, so that no
/// listing sees more attempts running than there are permits.
fn keep(
    entry: &TaskEntry,
    remains: &mut Option<Box<Remains>>,
    leftovers: Leftovers,
    permit: Option<Permit>,
) {
    match leftovers {
        Some(teardown) => *remains = Some(Box::new(Remains { teardown, permit })),
        None => release(entry, TaskState::Finishing, permit),
    }
}

/// Shows the task in `phase`, then gives its permit back: in that order,
/// so that no listing sees more attempts running than there are permits.
fn release(entry: &TaskEntry, phase: TaskState, permit: Option<Permit>) {
    entry.set_phase(phase);
    drop(permit);
}

/// Calls `teardown` with `then`. A panic in it is a host bug that must not
/// stop the task's physical completion: `then` runs as it unwinds, and the
/// panic is logged.
fn tear_down(teardown: Teardown, then: AfterTeardown) {
    if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| teardown(then))) {
        tracing::error!("an attempt's teardown panicked: {}", panic_message(&*panic));
    }
}

/// Runs what an attempt handed over and waits until it is done (before a
/// retry or the next periodic attempt).
async fn finish_physically(leftovers: Leftovers) {
    let Some(teardown) = leftovers else { return };
    let (done, finished) = tokio::sync::oneshot::channel();
    tear_down(
        teardown,
        AfterTeardown::new(move || {
            let _ = done.send(());
        }),
    );
    let _ = finished.await;
}

pub(crate) struct Actor {
    pub shared: Arc<Shared>,
    pub entry: Arc<TaskEntry>,
    pub body: Arc<dyn TaskBody>,
    pub policies: ResolvedPolicies,
    /// Runs after physical completion (the controller frees the slot).
    pub on_gone: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Actor {
    /// Runs the task to its end and releases everything it held. A panic in
    /// here is a host bug: it is caught and reported as Panicked.
    pub(crate) async fn run(mut self) {
        let on_gone = self.on_gone.take();
        let shared = Arc::clone(&self.shared);
        let entry = Arc::clone(&self.entry);
        let mut story = Story::default();
        let mut remains = None;
        // The attempt loop lives in a box of its own, so the spawned
        // future stays small: Tokio aligns its task cells to 128 bytes, and
        // glibc serves a large aligned allocation from its large bins,
        // consolidating its fast bins first, which costs more per task
        // than a small cell plus a small box. Embedders on glibc feel it;
        // the `host` binary runs on jemalloc.
        let result = AssertUnwindSafe(Box::pin(self.life(&mut story, &mut remains)))
            .catch_unwind()
            .await;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(panic) => TaskOutcome::Panicked {
                reason: format!("the task's actor panicked: {}", panic_message(&*panic)),
            },
        };
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record("outcome", outcome.kind().as_str());
            if !matches!(
                outcome,
                TaskOutcome::Completed { .. } | TaskOutcome::Canceled
            ) {
                span.record("otel.status_code", "ERROR");
                if let Some(reason) = outcome.reason() {
                    span.record("otel.status_description", reason);
                }
            }
        }
        finish_logically(&shared, &entry, outcome, &story);
        // Physical completion: the attempt futures are dropped by now. What
        // the last one handed over goes after its outcome, and the rest
        // (its permit, the name, the slot) after that, wherever the
        // teardown finishes: waking this task for it would cost a round
        // trip per task when a crowd stops.
        match remains {
            None => complete_physically(shared, entry, on_gone),
            Some(remains) => {
                let Remains { teardown, permit } = *remains;
                let runtime = tokio::runtime::Handle::try_current().ok();
                let then = AfterTeardown::new(move || {
                    // The controller may admit the slot's next task here.
                    let _inside = runtime.as_ref().map(tokio::runtime::Handle::enter);
                    release(&entry, TaskState::Finishing, permit);
                    complete_physically(shared, entry, on_gone);
                });
                tear_down(teardown, then);
            }
        }
    }

    async fn life(&self, story: &mut Story, remains: &mut Option<Box<Remains>>) -> TaskOutcome {
        let entry = &self.entry;
        let mut stop = entry.stop_signal();
        let resume = self.policies.resume;
        story.attempts = resume.attempts;
        let mut streak = resume.failures;
        if !resume.delay.is_zero()
            && !self
                .backoff(
                    resume.attempts,
                    resume.failures,
                    resume.delay,
                    BackoffSource::Failure,
                    &mut stop,
                )
                .await
        {
            return TaskOutcome::Canceled;
        }
        // The turn at a rate-limited slot's budget, held from the first
        // refusal until a start.
        let (mut turn, mut in_line) = (None, None);
        loop {
            // A stop while waiting for a permit or in backoff holds nothing.
            entry.set_phase(TaskState::Waiting);
            let permit = match &self.shared.permits {
                None => None,
                Some(permits) => tokio::select! {
                    biased;
                    () = stop_requested(&mut stop) => return TaskOutcome::Canceled,
                    permit = self.acquire(permits) => Some(permit),
                },
            };
            if stop.borrow().is_some() {
                return TaskOutcome::Canceled;
            }
            // A rate-limited slot's budget: without a start left (or with
            // other tasks waiting for one), the permit goes back and the
            // task waits in line for its turn, then for the next start.
            if let Some(budget) = &self.policies.start_budget {
                if turn.is_none() {
                    turn = budget.try_turn();
                }
                let refused = match &turn {
                    Some(_) => budget.try_start(Instant::now()).err(),
                    None => Some(budget.next_start(Instant::now())),
                };
                if let Some(next) = refused {
                    entry.set_throttled(next);
                    drop(permit);
                    if in_line.is_none() {
                        in_line = Some(budget.join_line());
                        let mut event =
                            self.base_event(EventKind::AttemptThrottled, story.attempts);
                        event.delay_ms =
                            Some(next.saturating_duration_since(Instant::now()).as_millis() as u64);
                        self.shared.publish(event);
                    }
                    if turn.is_none() {
                        turn = tokio::select! {
                            biased;
                            () = stop_requested(&mut stop) => return TaskOutcome::Canceled,
                            turn = budget.turn() => Some(turn),
                        };
                        continue;
                    }
                    tokio::select! {
                        biased;
                        () = stop_requested(&mut stop) => return TaskOutcome::Canceled,
                        () = tokio::time::sleep_until(next) => continue,
                    }
                }
                // Started: the next in line takes the turn.
                (turn, in_line) = (None, None);
            }
            let attempt = entry.count_attempt();
            story.attempts = attempt;
            {
                let _starting = self.shared.permits.as_ref().map(|p| p.starting());
                entry.set_phase(TaskState::Running);
            }
            let mut starting = self.base_event(EventKind::AttemptStarting, attempt);
            if let Some(due) = self.policies.due.filter(|_| story.first_start.is_none()) {
                let late = Instant::now().saturating_duration_since(due);
                crate::stats::DUE_TO_START.observe(late);
                starting.delay_ms = Some(late.as_millis() as u64);
            }
            self.shared.publish(starting);
            let started = Instant::now();
            story.first_start.get_or_insert(started);
            let span = tracing::debug_span!(
                "attempt",
                attempt = attempt,
                result = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            );
            story.span = span.clone();
            let end = tracing::Instrument::instrument(
                self.attempt(attempt, permit, &mut stop, story),
                span,
            )
            .await;
            // The permit is held until the attempt's end event is out, so
            // that no observer counting starts and ends ever sees more than
            // `max_concurrent` attempts; it is released before any backoff.
            let took = started.elapsed();

            let (error, leftovers, permit) = match end {
                AttemptEnd::Forced => {
                    story.span.record("result", "force-aborted");
                    story.span.record("otel.status_code", "ERROR");
                    return TaskOutcome::ForceAborted;
                }
                AttemptEnd::Stopped(leftovers, permit) => {
                    story.record(attempt, "canceled".into(), took);
                    self.event(EventKind::AttemptCanceled, attempt);
                    keep(entry, remains, leftovers, permit);
                    return TaskOutcome::Canceled;
                }
                AttemptEnd::Done(Ok(output), leftovers, permit) => {
                    story.record(attempt, "succeeded".into(), took);
                    self.attempt_event(EventKind::AttemptSucceeded, attempt, took, None);
                    match self.policies.restart {
                        RestartPolicy::Always { interval } => {
                            finish_physically(leftovers).await;
                            release(entry, TaskState::BackingOff, permit);
                            streak = 0;
                            let delay = interval.max(Duration::from_millis(1));
                            if !self
                                .backoff(attempt, 0, delay, BackoffSource::Success, &mut stop)
                                .await
                            {
                                return TaskOutcome::Canceled;
                            }
                            continue;
                        }
                        RestartPolicy::Never | RestartPolicy::OnFailure => {
                            keep(entry, remains, leftovers, permit);
                            return TaskOutcome::Completed { output };
                        }
                    }
                }
                AttemptEnd::Done(Err(error), leftovers, permit) => (error, leftovers, permit),
            };

            let (reason, exit_code) = match self.failed(story, attempt, &error, took) {
                Ok(failure) => failure,
                Err(outcome) => {
                    keep(entry, remains, leftovers, permit);
                    return outcome;
                }
            };
            if self.policies.restart == RestartPolicy::Never {
                keep(entry, remains, leftovers, permit);
                return TaskOutcome::Failed { reason, exit_code };
            }
            finish_physically(leftovers).await;
            streak += 1;
            let spent = self.policies.max_retries.filter(|max| streak > *max);
            let next = match spent {
                Some(_) => TaskState::Finishing,
                None => TaskState::BackingOff,
            };
            release(entry, next, permit);
            if let Some(max) = spent {
                let reason = format!(
                    "retry limit reached: {streak} consecutive failed attempts (max retries {max}); last error: {reason}"
                );
                return TaskOutcome::Failed { reason, exit_code };
            }
            let delay = self.policies.backoff.delay(streak - 1);
            if !self
                .backoff(attempt, streak, delay, BackoffSource::Failure, &mut stop)
                .await
            {
                return TaskOutcome::Canceled;
            }
        }
    }

    /// Records how attempt `attempt` failed (its story line and its event)
    /// and says what follows: the task's outcome now when retrying cannot
    /// help (the body canceled itself, or failed fatally), else the reason
    /// and exit code of a failure the restart policy decides about.
    fn failed(
        &self,
        story: &mut Story,
        attempt: u32,
        error: &TaskError,
        took: Duration,
    ) -> Result<(String, Option<i32>), TaskOutcome> {
        match error {
            TaskError::Canceled => {
                story.record(attempt, "canceled by the body".into(), took);
                self.event(EventKind::AttemptCanceled, attempt);
                Err(TaskOutcome::Canceled)
            }
            TaskError::Fatal { reason, exit_code } => {
                story.record(attempt, format!("fatal: {reason}"), took);
                self.attempt_event(EventKind::AttemptFailed, attempt, took, Some(error));
                Err(TaskOutcome::Fatal {
                    reason: reason.clone(),
                    exit_code: *exit_code,
                })
            }
            TaskError::Timeout(limit) => {
                let reason = format!(
                    "attempt {attempt} timed out after {}",
                    format_duration(*limit)
                );
                story.record(
                    attempt,
                    format!("timed out after {}", format_duration(*limit)),
                    took,
                );
                self.attempt_event(EventKind::AttemptTimedOut, attempt, took, Some(error));
                Ok((reason, None))
            }
            TaskError::Fail { reason, exit_code } => {
                story.record(attempt, format!("failed: {reason}"), took);
                self.attempt_event(EventKind::AttemptFailed, attempt, took, Some(error));
                Ok((reason.clone(), *exit_code))
            }
        }
    }

    /// Pauses before the next attempt (`attempt` have started, the last
    /// `failures` of them failed); false if a stop arrived meanwhile.
    async fn backoff(
        &self,
        attempt: u32,
        failures: u32,
        delay: Duration,
        source: BackoffSource,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        self.entry.set_phase(TaskState::BackingOff);
        self.body.pausing(Resume {
            attempts: attempt,
            failures,
            delay,
        });
        let mut event = self.base_event(EventKind::BackoffScheduled, attempt);
        event.delay_ms = Some(delay.as_millis() as u64);
        event.source = Some(source);
        self.shared.publish(event);
        tokio::select! {
            biased;
            () = stop_requested(stop) => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    /// Runs one attempt against stop requests: a stop cancels the body; if
    /// it has not ended by the stop's deadline, ForceAborted is delivered at
    /// once and the attempt is dropped (a plugin's instance with it).
    async fn attempt(
        &self,
        attempt: u32,
        permit: Option<Permit>,
        stop: &mut watch::Receiver<Option<Instant>>,
        story: &mut Story,
    ) -> AttemptEnd {
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let abort = Arc::new(AtomicBool::new(false));
        let body = self.body_future(attempt, &cancel, &abort);
        tokio::pin!(body);
        // A stop from now on reaches the body at once (see request_stop);
        // one that came before is handled below.
        self.entry.attempt_began(&abort, permit);
        let _ended = AttemptEnded(&self.entry);
        // Held while a force-abort deadline is pending: a body that cannot
        // be preempted (a spinning guest) makes sure it yields by then.
        let mut hurry = None;
        let mut deadline = None;
        let mut stop_seen = stop.borrow_and_update().is_some();
        if stop_seen {
            deadline = *stop.borrow();
        }
        loop {
            if stop_seen {
                cancel.cancel();
                self.entry.set_phase(TaskState::Stopping);
                if let Some(at) = deadline {
                    hurry = self.body.hurry(at.into_std(), &abort);
                }
                stop_seen = false;
            }
            // Biased: once the deadline has passed, abort without giving the
            // body another slice; a stop that arrives with a result makes
            // the attempt Stopped (an Ok after a stop is Canceled).
            let forced = tokio::select! {
                biased;
                () = deadline_passed(deadline) => true,
                changed = stop.changed() => {
                    if changed.is_err() {
                        // The entry (and its sender) lives as long as we do.
                        continue;
                    }
                    deadline = *stop.borrow_and_update();
                    stop_seen = deadline.is_some();
                    false
                }
                result = &mut body => {
                    // The stop as it stands now: it may have come (and been
                    // carried out by the body's own means, the epoch ticker)
                    // during this very poll of the body. A body that ended
                    // once its stop's deadline had come was force-aborted.
                    let stop_deadline = *stop.borrow();
                    match stop_deadline {
                        Some(at) if Instant::now() >= at => true,
                        Some(_) => {
                            let (teardown, permit) = self.entry.take_leftovers();
                            return AttemptEnd::Stopped(teardown, permit);
                        }
                        None => {
                            let (teardown, permit) = self.entry.take_leftovers();
                            return AttemptEnd::Done(result, teardown, permit);
                        }
                    }
                }
            };
            if forced {
                story.record(attempt, "force-aborted".into(), started.elapsed());
                finish_logically(&self.shared, &self.entry, TaskOutcome::ForceAborted, story);
                // Stop the body: a guest traps at its next epoch tick if
                // it is polled again; dropping the future drops it now.
                abort.store(true, Ordering::SeqCst);
                drop(hurry);
                return AttemptEnd::Forced;
            }
        }
    }

    /// Waits for a permit in the task's share group, by its priority.
    async fn acquire(&self, permits: &Arc<Permits>) -> Permit {
        let share = self.policies.share.as_ref();
        permits.acquire(self.policies.priority, share).await
    }

    /// The future of one attempt: the body's set-up, then its running part
    /// under the timeout (which starts only once the set-up is done). A
    /// panic in the body is a retryable failure of the attempt.
    fn body_future(
        &self,
        attempt: u32,
        cancel: &CancellationToken,
        abort: &Arc<AtomicBool>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TaskError>> {
        let ctx = AttemptContext {
            entry: Arc::clone(&self.entry),
            attempt,
            cancel: cancel.clone(),
            abort: Arc::clone(abort),
            bus: Arc::clone(&self.shared.bus),
            permits: self.shared.permits.clone(),
            priority: self.policies.priority,
            share: self.policies.share.clone(),
        };
        let setup = AssertUnwindSafe(self.body.attempt(ctx)).catch_unwind();
        let timeout = self.policies.timeout;
        let body = Arc::clone(&self.body);
        let abort = Arc::clone(abort);
        Box::pin(async move {
            let run = setup.await.unwrap_or_else(|panic| Err(panicked(&*panic)))?;
            let run = AssertUnwindSafe(run)
                .catch_unwind()
                .map(|r| r.unwrap_or_else(|panic| Err(panicked(&*panic))));
            with_timeout(run, timeout, &*body, &abort).await
        })
    }

    fn base_event(&self, kind: EventKind, attempt: u32) -> Event {
        let mut event = Event::new(kind)
            .task(self.entry.id, &self.entry.name, &self.entry.slot)
            .schedule(self.entry.schedule.as_ref())
            .parent(self.entry.parent);
        event.attempt = Some(attempt);
        event
    }

    fn event(&self, kind: EventKind, attempt: u32) {
        self.shared.publish(self.base_event(kind, attempt));
    }

    fn attempt_event(
        &self,
        kind: EventKind,
        attempt: u32,
        took: Duration,
        error: Option<&TaskError>,
    ) {
        let mut event = self.base_event(kind, attempt);
        event.duration_ms = Some(took.as_millis() as u64);
        match error {
            Some(
                TaskError::Fail { reason, exit_code } | TaskError::Fatal { reason, exit_code },
            ) => {
                event.reason = Some(reason.clone());
                event.exit_code = *exit_code;
            }
            Some(TaskError::Timeout(limit)) => {
                event.timeout_ms = Some(limit.as_millis() as u64);
                event.reason = Some(format!("timed out after {}", format_duration(*limit)));
            }
            Some(TaskError::Canceled) | None => {}
        }
        self.shared.publish(event);
    }
}

fn panicked(panic: &(dyn std::any::Any + Send)) -> TaskError {
    TaskError::fail(format!("the task body panicked: {}", panic_message(panic)))
}

/// Tells the entry its attempt is gone when the attempt's future ends.
struct AttemptEnded<'a>(&'a TaskEntry);

impl Drop for AttemptEnded<'_> {
    fn drop(&mut self) {
        self.0.attempt_ended();
    }
}

/// Applies the per-attempt timeout: on expiry the body is dropped (for a
/// plugin, its instance with it) and the attempt is a retryable Timeout. The
/// body hears of the deadline (`TaskBody::hurry`), so a guest that holds the
/// thread is aborted right at it; an error it ends with from then on is the
/// timeout.
async fn with_timeout(
    run: impl Future<Output = Result<Vec<u8>, TaskError>>,
    timeout: Option<Duration>,
    body: &dyn TaskBody,
    abort: &Arc<AtomicBool>,
) -> Result<Vec<u8>, TaskError> {
    let Some(limit) = timeout else {
        return run.await;
    };
    let deadline = Instant::now() + limit;
    let _hurry = body.hurry(deadline.into_std(), abort);
    match tokio::time::timeout_at(deadline, run).await {
        Ok(Err(_)) if Instant::now() >= deadline => Err(TaskError::Timeout(limit)),
        Ok(result) => result,
        Err(_) => Err(TaskError::Timeout(limit)),
    }
}

async fn stop_requested(stop: &mut watch::Receiver<Option<Instant>>) {
    if stop.wait_for(Option::is_some).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Ready once `deadline` has passed. The clock is read at every poll, not
/// only when the timer fires: a Tokio timer fires when the scheduler gets to
/// its driver, which spinning guests on the same thread can delay by whole
/// ticks.
fn deadline_passed(deadline: Option<Instant>) -> impl Future<Output = ()> {
    let mut sleep = deadline.map(|at| Box::pin(tokio::time::sleep_until(at)));
    std::future::poll_fn(move |cx| match (deadline, sleep.as_mut()) {
        (Some(at), Some(sleep)) => {
            if Instant::now() >= at {
                std::task::Poll::Ready(())
            } else {
                sleep.as_mut().poll(cx)
            }
        }
        _ => std::task::Poll::Pending,
    })
}

/// The end of a task once its last attempt is physically gone: the name
/// released, `TaskRemoved`, `gone` fired, then the slot (`on_gone`).
/// `TaskRemoved` goes out before `gone` fires: a shutdown waits for `gone`
/// and then closes the bus, so an event published after it (on a reaper
/// thread, while the shutdown runs on a worker) could be lost.
fn complete_physically(
    shared: Arc<Shared>,
    entry: Arc<TaskEntry>,
    on_gone: Option<Box<dyn FnOnce() + Send + Sync>>,
) {
    entry.set_phase(TaskState::Finishing);
    shared.registry.unregister(&entry);
    shared.publish(
        Event::new(EventKind::TaskRemoved)
            .task(entry.id, &entry.name, &entry.slot)
            .schedule(entry.schedule.as_ref())
            .parent(entry.parent),
    );
    entry.gone.cancel();
    if let Some(on_gone) = on_gone {
        on_gone();
    }
}

/// Decides the outcome: TaskFinished, then delivery to every waiter. Does
/// nothing if the outcome was already delivered (force-abort delivers first).
fn finish_logically(shared: &Shared, entry: &TaskEntry, outcome: TaskOutcome, story: &Story) {
    if entry.outcome.is_set() {
        return;
    }
    let mut event = Event::new(EventKind::TaskFinished)
        .task(entry.id, &entry.name, &entry.slot)
        .schedule(entry.schedule.as_ref())
        .parent(entry.parent)
        .outcome(&outcome);
    event.attempt = (story.attempts > 0).then_some(story.attempts);
    shared.publish(event);
    entry.outcome.set(TaskReport {
        id: entry.id,
        name: Arc::clone(&entry.name),
        slot: Arc::clone(&entry.slot),
        outcome,
        attempts: story.attempts,
        history: story.history.iter().cloned().collect(),
        duration: story.first_start.map_or(Duration::ZERO, |t| t.elapsed()),
    });
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_owned())
}
