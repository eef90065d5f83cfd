//! Owns the life of one registered task: the attempt loop (permit, attempt,
//! timeout, result), the restart and retry decisions, backoff, stop requests
//! with their grace and force-abort, and the final report. Every attempt's
//! future is owned here, so dropping it is physical completion.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::outcome::TaskOutcome;
use crate::runtime::{AttemptError, AttemptFacts, AttemptRequest, GuestSink, StopSignals, Stream};
use crate::units::format_duration;

use super::Shared;
use super::events::{BackoffSource, Event, EventKind};
use super::registry::{TaskEntry, TaskPhase};
use super::spec::{
    NativeContext, PluginBody, ResolvedPolicies, RestartPolicy, TaskBody, TaskError,
};
use super::waiter::{AttemptRecord, MAX_HISTORY, TaskReport};

/// How one attempt ended, from the actor's point of view.
enum AttemptEnd {
    /// The body returned (or timed out) without a stop request.
    Done(Result<Vec<u8>, TaskError>),
    /// A stop was requested and the body ended within its grace.
    Stopped,
    /// The grace expired: ForceAborted is already delivered and the attempt
    /// has been dropped.
    Forced,
}

pub(crate) struct Actor {
    pub shared: Arc<Shared>,
    pub entry: Arc<TaskEntry>,
    pub body: TaskBody,
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
        let mut history = VecDeque::new();
        let result = AssertUnwindSafe(self.life(&mut history))
            .catch_unwind()
            .await;
        let (outcome, attempts) = match result {
            Ok(done) => done,
            Err(panic) => (
                TaskOutcome::Panicked {
                    reason: format!("the task's actor panicked: {}", panic_message(&*panic)),
                },
                0,
            ),
        };
        finish_logically(&shared, &entry, outcome, attempts, &history);
        // Physical completion: the attempt futures are dropped by now.
        entry.set_phase(TaskPhase::Finishing);
        shared.registry.unregister(&entry);
        entry.gone.cancel();
        shared.publish(Event::new(EventKind::TaskRemoved).task(entry.id, &entry.name, &entry.slot));
        if let Some(on_gone) = on_gone {
            on_gone();
        }
    }

    async fn life(&self, history: &mut VecDeque<AttemptRecord>) -> (TaskOutcome, u32) {
        let entry = &self.entry;
        let mut stop = entry.stop_signal();
        let mut attempts = 0u32;
        let mut streak = 0u32;
        loop {
            // A stop while waiting for a permit or in backoff holds nothing.
            entry.set_phase(TaskPhase::Waiting);
            let permit = match &self.shared.permits {
                None => None,
                Some(semaphore) => tokio::select! {
                    biased;
                    () = stop_requested(&mut stop) => return (TaskOutcome::Canceled, attempts),
                    permit = Arc::clone(semaphore).acquire_owned() => permit.ok(),
                },
            };
            if stop.borrow().is_some() {
                return (TaskOutcome::Canceled, attempts);
            }
            attempts = entry.count_attempt();
            entry.set_phase(TaskPhase::Running);
            self.event(EventKind::AttemptStarting, attempts);
            let started = Instant::now();
            let end = tracing::Instrument::instrument(
                self.attempt(attempts, &mut stop, history),
                tracing::debug_span!("attempt", n = attempts),
            )
            .await;
            // The permit is held until the attempt's end event is out, so
            // that no observer counting starts and ends ever sees more than
            // `max_concurrent` attempts; it is released before any backoff.
            let took = started.elapsed();
            let mut record = |result: String| {
                if history.len() == MAX_HISTORY {
                    history.pop_front();
                }
                history.push_back(AttemptRecord {
                    attempt: attempts,
                    result,
                    duration: took,
                });
            };

            let error = match end {
                AttemptEnd::Forced => return (TaskOutcome::ForceAborted, attempts),
                AttemptEnd::Stopped => {
                    record("canceled".into());
                    self.event(EventKind::AttemptCanceled, attempts);
                    return (TaskOutcome::Canceled, attempts);
                }
                AttemptEnd::Done(Ok(output)) => {
                    record("succeeded".into());
                    self.attempt_event(EventKind::AttemptSucceeded, attempts, took, None);
                    match self.policies.restart {
                        RestartPolicy::Always { interval } => {
                            drop(permit);
                            streak = 0;
                            let delay = interval.max(Duration::from_millis(1));
                            if !self
                                .backoff(attempts, delay, BackoffSource::Success, &mut stop)
                                .await
                            {
                                return (TaskOutcome::Canceled, attempts);
                            }
                            continue;
                        }
                        RestartPolicy::Never | RestartPolicy::OnFailure => {
                            return (TaskOutcome::Completed { output }, attempts);
                        }
                    }
                }
                AttemptEnd::Done(Err(error)) => error,
            };

            let (reason, exit_code) = match &error {
                TaskError::Canceled => {
                    record("canceled by the body".into());
                    self.event(EventKind::AttemptCanceled, attempts);
                    return (TaskOutcome::Canceled, attempts);
                }
                TaskError::Fatal { reason, exit_code } => {
                    record(format!("fatal: {reason}"));
                    self.attempt_event(EventKind::AttemptFailed, attempts, took, Some(&error));
                    return (
                        TaskOutcome::Fatal {
                            reason: reason.clone(),
                            exit_code: *exit_code,
                        },
                        attempts,
                    );
                }
                TaskError::Timeout(limit) => {
                    let reason = format!(
                        "attempt {attempts} timed out after {}",
                        format_duration(*limit)
                    );
                    record(format!("timed out after {}", format_duration(*limit)));
                    self.attempt_event(EventKind::AttemptTimedOut, attempts, took, Some(&error));
                    (reason, None)
                }
                TaskError::Fail { reason, exit_code } => {
                    record(format!("failed: {reason}"));
                    self.attempt_event(EventKind::AttemptFailed, attempts, took, Some(&error));
                    (reason.clone(), *exit_code)
                }
            };
            drop(permit);
            if self.policies.restart == RestartPolicy::Never {
                return (TaskOutcome::Failed { reason, exit_code }, attempts);
            }
            streak += 1;
            if let Some(max) = self.policies.max_retries
                && streak > max
            {
                let reason = format!(
                    "retry limit reached: {streak} consecutive failed attempts (max retries {max}); last error: {reason}"
                );
                return (TaskOutcome::Failed { reason, exit_code }, attempts);
            }
            let delay = self.policies.backoff.delay(streak - 1);
            if !self
                .backoff(attempts, delay, BackoffSource::Failure, &mut stop)
                .await
            {
                return (TaskOutcome::Canceled, attempts);
            }
        }
    }

    /// Pauses before the next attempt; false if a stop arrived meanwhile.
    async fn backoff(
        &self,
        attempt: u32,
        delay: Duration,
        source: BackoffSource,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        self.entry.set_phase(TaskPhase::BackingOff);
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
    /// once and the attempt is dropped (the instance with it).
    async fn attempt(
        &self,
        attempt: u32,
        stop: &mut watch::Receiver<Option<Instant>>,
        history: &mut VecDeque<AttemptRecord>,
    ) -> AttemptEnd {
        let started = Instant::now();
        let signals = StopSignals::default();
        let body = self.body_future(attempt, &signals);
        tokio::pin!(body);
        // Held while a force-abort deadline of a plugin attempt is pending:
        // the runtime ticks faster once it has passed (see `Runtime::hurry_at`).
        let mut hurry = None;
        let mut deadline = None;
        let mut stop_seen = stop.borrow_and_update().is_some();
        if stop_seen {
            deadline = *stop.borrow();
        }
        loop {
            if stop_seen {
                signals.cancel();
                self.entry.set_phase(TaskPhase::Stopping);
                if let (TaskBody::Plugin(p), Some(at)) = (&self.body, deadline) {
                    hurry = Some(p.runtime.hurry_at(at.into_std()));
                }
                stop_seen = false;
            }
            // Biased: once the deadline has passed, abort without giving the
            // guest another slice; a stop that arrives with a result makes
            // the attempt Stopped (SEMANTICS §4: an Ok after a stop is
            // Canceled).
            tokio::select! {
                biased;
                () = deadline_passed(deadline) => {
                    if history.len() == MAX_HISTORY {
                        history.pop_front();
                    }
                    history.push_back(AttemptRecord {
                        attempt,
                        result: "force-aborted".into(),
                        duration: started.elapsed(),
                    });
                    finish_logically(&self.shared, &self.entry, TaskOutcome::ForceAborted, attempt, history);
                    // Stop the instance: it traps at its next epoch tick if
                    // it is polled again; dropping the future drops it now.
                    signals.abort();
                    drop(hurry);
                    return AttemptEnd::Forced;
                }
                changed = stop.changed() => {
                    if changed.is_err() {
                        // The entry (and its sender) lives as long as we do.
                        continue;
                    }
                    deadline = *stop.borrow_and_update();
                    stop_seen = deadline.is_some();
                }
                result = &mut body => {
                    return if deadline.is_some() { AttemptEnd::Stopped } else { AttemptEnd::Done(result) };
                }
            }
        }
    }

    /// The future of one attempt: instance creation, then the body under its
    /// timeout (which starts only once the instance exists).
    fn body_future(
        &self,
        attempt: u32,
        signals: &StopSignals,
    ) -> futures::future::BoxFuture<'static, Result<Vec<u8>, TaskError>> {
        let timeout = self.policies.timeout;
        let entry = &self.entry;
        match &self.body {
            TaskBody::Native(f) => {
                let ctx = NativeContext {
                    task_id: entry.id,
                    name: Arc::clone(&entry.name),
                    attempt,
                    cancel: signals.cancel.clone(),
                };
                let fut = AssertUnwindSafe(f(ctx)).catch_unwind().map(|r| {
                    r.unwrap_or_else(|panic| {
                        Err(TaskError::fail(format!(
                            "the task body panicked: {}",
                            panic_message(&*panic)
                        )))
                    })
                });
                Box::pin(with_timeout(fut, timeout))
            }
            TaskBody::Plugin(body) => {
                let body = body.clone();
                let signals = signals.clone();
                let sink = Arc::new(TaskSink {
                    shared: Arc::clone(&self.shared),
                    entry: Arc::clone(entry),
                    attempt,
                    forward: body.sink.clone(),
                });
                let request = AttemptRequest {
                    facts: Arc::new(AttemptFacts {
                        task_id: entry.id,
                        name: entry.name.to_string(),
                        slot: entry.slot.to_string(),
                        attempt,
                        params: body.params.clone(),
                    }),
                    input: Arc::clone(&body.input),
                    sandbox: Arc::clone(&body.sandbox),
                    sink,
                };
                Box::pin(async move { run_plugin(body, request, signals, timeout).await })
            }
        }
    }

    fn base_event(&self, kind: EventKind, attempt: u32) -> Event {
        let mut event = Event::new(kind).task(self.entry.id, &self.entry.name, &self.entry.slot);
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

async fn run_plugin(
    body: PluginBody,
    request: AttemptRequest,
    signals: StopSignals,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, TaskError> {
    let prepared = body
        .runtime
        .prepare_attempt(&body.plugin, &request, &signals)
        .await
        .map_err(task_error)?;
    with_timeout(
        prepared.run(&request.input).map(|r| r.map_err(task_error)),
        timeout,
    )
    .await
}

fn task_error(err: AttemptError) -> TaskError {
    match err {
        AttemptError::Fail { reason, exit_code } => TaskError::Fail { reason, exit_code },
        AttemptError::Fatal { reason, exit_code } => TaskError::Fatal { reason, exit_code },
        AttemptError::Canceled | AttemptError::Aborted => TaskError::Canceled,
    }
}

/// Applies the per-attempt timeout: on expiry the body is dropped (for a
/// plugin, its instance with it) and the attempt is a retryable Timeout.
async fn with_timeout(
    body: impl Future<Output = Result<Vec<u8>, TaskError>>,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, TaskError> {
    match timeout {
        None => body.await,
        Some(limit) => tokio::time::timeout(limit, body)
            .await
            .unwrap_or(Err(TaskError::Timeout(limit))),
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

/// Decides the outcome: TaskFinished, then delivery to every waiter. Does
/// nothing if the outcome was already delivered (force-abort delivers first).
fn finish_logically(
    shared: &Shared,
    entry: &TaskEntry,
    outcome: TaskOutcome,
    attempts: u32,
    history: &VecDeque<AttemptRecord>,
) {
    if entry.outcome.is_set() {
        return;
    }
    let mut event = Event::new(EventKind::TaskFinished)
        .task(entry.id, &entry.name, &entry.slot)
        .outcome(&outcome);
    event.attempt = (attempts > 0).then_some(attempts);
    shared.publish(event);
    entry.outcome.set(TaskReport {
        id: entry.id,
        name: Arc::clone(&entry.name),
        slot: Arc::clone(&entry.slot),
        outcome,
        attempts,
        history: history.iter().cloned().collect(),
    });
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_owned())
}

/// Turns a guest's lines into events and forwards them to the body's own
/// sink (the CLI's stderr, the daemon's task log).
struct TaskSink {
    shared: Arc<Shared>,
    entry: Arc<TaskEntry>,
    attempt: u32,
    forward: Option<Arc<dyn GuestSink>>,
}

impl GuestSink for TaskSink {
    fn line(&self, stream: Stream, text: &str) {
        let mut event = Event::new(EventKind::GuestLog)
            .task(self.entry.id, &self.entry.name, &self.entry.slot)
            .reason(text);
        event.attempt = Some(self.attempt);
        event.stream = Some(stream);
        self.shared.publish(event);
        if let Some(forward) = &self.forward {
            forward.line(stream, text);
        }
    }

    fn progress(&self, done: u64, total: u64) {
        let mut event =
            Event::new(EventKind::Progress).task(self.entry.id, &self.entry.name, &self.entry.slot);
        event.attempt = Some(self.attempt);
        event.done = Some(done);
        event.total = Some(total);
        self.shared.publish(event);
        if let Some(forward) = &self.forward {
            forward.progress(done, total);
        }
    }
}
