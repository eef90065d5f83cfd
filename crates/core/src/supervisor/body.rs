//! Owns what the supervisor knows of a task body: the [`TaskBody`] trait (set
//! up one attempt, then run it), the [`AttemptContext`] each attempt gets
//! (identity, cancellation, a way to report lines and progress), and
//! [`native`] bodies built from async closures. Plugins are one
//! implementation of the trait (`crate::plugin_task`); the supervisor never
//! looks inside a body.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::logline::Stream;

use super::TaskId;
use super::events::{Bus, Event, EventKind};
use super::permits::Permits;
use super::registry::TaskEntry;
use super::spec::{Resume, TaskError};

/// The running part of one attempt: resolves to the output bytes or an
/// error. The per-attempt timeout applies to this future only.
pub type RunFuture = BoxFuture<'static, Result<Vec<u8>, TaskError>>;

/// What one attempt of a task runs.
///
/// An attempt has two steps: [`TaskBody::attempt`] sets it up (for a plugin:
/// a fresh instance) and returns the [`RunFuture`] that does the work. The
/// per-attempt timeout starts when the set-up is done, so instantiation never
/// counts against it. Dropping either future stops the attempt at once: that
/// is how the supervisor force-aborts a body that ignored its cancellation.
pub trait TaskBody: Send + Sync + 'static {
    /// Sets up one attempt and returns its running part.
    fn attempt(&self, ctx: AttemptContext) -> BoxFuture<'static, Result<RunFuture, TaskError>>;

    /// Called when an attempt gets a deadline: a stop's force-abort
    /// deadline, or the end of its timeout. A body whose work cannot be
    /// preempted at any await point (a WebAssembly guest in a loop) can make
    /// sure it ends at the deadline: `abort` is the attempt's abort flag
    /// ([`AttemptContext::abort_flag`]), and setting it at the deadline from
    /// a thread of the body's own (a plugin's epoch ticker does) ends the
    /// work even when the executor thread is busy with it. The returned
    /// guard is dropped when the attempt is gone.
    fn hurry(
        &self,
        deadline: std::time::Instant,
        abort: &Arc<AtomicBool>,
    ) -> Option<Box<dyn Send>> {
        let _ = (deadline, abort);
        None
    }

    /// Called when the supervisor pauses before the next attempt (a retry's
    /// backoff, a periodic task's interval, or the pause a resumed task
    /// starts with): `next` says where the task stands and how long the
    /// pause is, so that a body that records its task elsewhere (the
    /// daemon's durable store) can resume it at the same deadline after a
    /// restart. It must not block.
    fn pausing(&self, next: Resume) {
        let _ = next;
    }

    /// A short description for debug output, such as the plugin's name.
    fn describe(&self) -> String {
        "task body".to_owned()
    }

    /// The digest of the code the body runs (a plugin's `sha256:…`), if it
    /// has one: the task's trace span carries it as `plugin.digest`.
    fn code_digest(&self) -> Option<String> {
        None
    }
}

/// What one attempt of a task gets: who it is, a cancellation token to
/// watch, and a way to report lines and progress (published as events).
#[derive(Clone)]
pub struct AttemptContext {
    pub(crate) entry: Arc<TaskEntry>,
    pub(crate) attempt: u32,
    pub(crate) cancel: CancellationToken,
    pub(crate) abort: Arc<AtomicBool>,
    pub(crate) bus: Arc<Bus>,
    /// The concurrency limit (none: no limit), and the task's place there.
    pub(crate) permits: Option<Arc<Permits>>,
    pub(crate) priority: i32,
    pub(crate) share: Option<Arc<str>>,
}

impl std::fmt::Debug for AttemptContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptContext")
            .field("id", &self.entry.id)
            .field("name", &self.entry.name)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl AttemptContext {
    /// The task's id.
    pub fn task_id(&self) -> TaskId {
        self.entry.id
    }

    /// The task's name.
    pub fn name(&self) -> &Arc<str> {
        &self.entry.name
    }

    /// The task's slot.
    pub fn slot(&self) -> &Arc<str> {
        &self.entry.slot
    }

    /// 1 for the first attempt, 2 for the first retry, and so on.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Fires when a stop is requested; a cooperative body returns soon after
    /// (with [`TaskError::Canceled`] or its result).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether a stop was requested.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Set once the attempt is being force-aborted (its grace expired).
    /// Shared so that code which cannot await (a WebAssembly epoch callback)
    /// can check it.
    pub fn abort_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.abort)
    }

    /// Whether the attempt is being force-aborted.
    pub fn is_aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// Hands the supervisor what is left of this attempt once its running
    /// part has its result (a plugin's instance, whose drop resets a pool
    /// slot). The supervisor calls `teardown` after the task's outcome is
    /// delivered, if this attempt decided it, and before a retry or the
    /// next periodic attempt otherwise, with the rest of the attempt's
    /// physical completion ([`AfterTeardown`]); the attempt's concurrency
    /// permit, the task's name and its slot are held until that runs. An
    /// attempt that is dropped (force-abort, timeout) drops it uncalled; so
    /// does a call after the attempt ended.
    pub fn finish_after_outcome(&self, teardown: Teardown) {
        self.entry.hand_over(teardown);
    }

    /// Parks the attempt while its body waits for work that needs a
    /// permit of its own (a parent waiting for its children): its
    /// concurrency permit goes back to the next waiting attempt, so that a
    /// parent and its children make progress under any `max_concurrent`,
    /// even 1. The attempt is shown `Waiting` meanwhile. True if a permit
    /// was given back; then call [`AttemptContext::unpark`] before the body
    /// runs on. A parked attempt still holds what its body holds (for a
    /// plugin, its instance): whoever lets bodies park bounds how many may
    /// (the daemon's `--max-parked`).
    pub fn park(&self) -> bool {
        let Some(permits) = &self.permits else {
            return false;
        };
        if self.cancel.is_cancelled() {
            return false;
        }
        self.entry.park(permits)
    }

    /// Ends [`AttemptContext::park`]: waits for a permit again, in the
    /// task's share group and by its priority like any attempt. Once a
    /// stop is requested it returns at once without one, so that a
    /// stopping body ends within its grace instead of spending it in line.
    /// Cancel-safe; does nothing if the attempt is not parked.
    pub async fn unpark(&self) {
        let Some(permits) = &self.permits else {
            return;
        };
        if !self.entry.is_parked() {
            return;
        }
        let mut stop = self.entry.stop_signal();
        let permit = tokio::select! {
            biased;
            _ = stop.wait_for(Option::is_some) => None,
            permit = permits.acquire(self.priority, self.share.as_ref()) => Some(permit),
        };
        let back = permit.is_some();
        self.entry.unparked(permit);
        if back && !self.cancel.is_cancelled() {
            let _starting = permits.starting();
            self.entry.set_phase(crate::lifecycle::TaskState::Running);
        }
    }

    /// Reports one line the body wrote (a `GuestLog` event).
    pub fn line(&self, stream: Stream, text: &str) {
        let entry = &self.entry;
        let mut event = Event::new(EventKind::GuestLog)
            .task(entry.id, &entry.name, &entry.slot)
            .schedule(entry.schedule.as_ref())
            .parent(entry.parent)
            .reason(text);
        event.attempt = Some(self.attempt);
        event.stream = Some(stream);
        self.bus.publish(event);
    }

    /// Reports progress: `done` units of `total` (0 if unknown).
    pub fn progress(&self, done: u64, total: u64) {
        let entry = &self.entry;
        entry.set_progress(done, total);
        let mut event = Event::new(EventKind::Progress)
            .task(entry.id, &entry.name, &entry.slot)
            .schedule(entry.schedule.as_ref())
            .parent(entry.parent);
        event.attempt = Some(self.attempt);
        event.done = Some(done);
        event.total = Some(total);
        self.bus.publish(event);
    }
}

/// What finishes an attempt physically, handed over with
/// [`AttemptContext::finish_after_outcome`]: it does its part, on any
/// thread, then calls [`AfterTeardown::done`].
pub type Teardown = Box<dyn FnOnce(AfterTeardown) + Send>;

/// The rest of an attempt's physical completion (its permit; for the
/// task's last attempt its name, its slot and `TaskRemoved`), given to a
/// [`Teardown`]. Dropped without [`AfterTeardown::done`] (a teardown that
/// panicked, or was itself dropped), it runs then: nothing stays held.
pub struct AfterTeardown(Option<Box<dyn FnOnce() + Send>>);

impl std::fmt::Debug for AfterTeardown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfterTeardown").finish_non_exhaustive()
    }
}

impl AfterTeardown {
    pub(crate) fn new(rest: impl FnOnce() + Send + 'static) -> Self {
        Self(Some(Box::new(rest)))
    }

    /// The teardown's part is done: runs the rest, on this thread.
    pub fn done(mut self) {
        if let Some(rest) = self.0.take() {
            rest();
        }
    }
}

impl Drop for AfterTeardown {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take() {
            rest();
        }
    }
}

/// A task body made of an async closure, called once per attempt.
pub struct NativeBody<F> {
    f: F,
}

/// Builds a [`TaskBody`] from an async closure: `native(|ctx| async move {
/// Ok(b"done".to_vec()) })`. The closure is called once per attempt; a panic
/// in it is a retryable failure of that attempt.
pub fn native<F, Fut>(f: F) -> NativeBody<F>
where
    F: Fn(AttemptContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, TaskError>> + Send + 'static,
{
    NativeBody { f }
}

impl<F, Fut> TaskBody for NativeBody<F>
where
    F: Fn(AttemptContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, TaskError>> + Send + 'static,
{
    fn attempt(&self, ctx: AttemptContext) -> BoxFuture<'static, Result<RunFuture, TaskError>> {
        let run: RunFuture = Box::pin((self.f)(ctx));
        Box::pin(std::future::ready(Ok(run)))
    }

    fn describe(&self) -> String {
        "native".to_owned()
    }
}
