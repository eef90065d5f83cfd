//! Owns what a task *is*: its name, its body (anything that implements
//! [`TaskBody`]), and the policies that say how often and how long it runs
//! (restart, backoff, timeout, retry budget). Validation of those policies
//! happens here; applying them is the actor's business.

use crate::slot_settings::StartBudget;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backoff::BackoffPolicy;
use super::body::TaskBody;

/// When a task runs again after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Stop after any result.
    Never,
    /// Retry retryable errors (Fail, Timeout); stop on success.
    OnFailure,
    /// Run again after success too, `interval` after it ended (at least 1 ms);
    /// failures use the backoff; a success resets the failure streak.
    Always {
        /// Pause between a success and the next start.
        interval: Duration,
    },
}

/// An error produced by one attempt of a task body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// Retryable failure.
    #[error("{reason}")]
    Fail {
        /// What happened.
        reason: String,
        /// An exit code, if the body gave one.
        exit_code: Option<i32>,
    },
    /// The attempt timed out (retryable).
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Non-retryable failure.
    #[error("{reason}")]
    Fatal {
        /// What happened.
        reason: String,
        /// An exit code, if the body gave one.
        exit_code: Option<i32>,
    },
    /// The body stopped on request (or on its own accord as canceled).
    #[error("canceled")]
    Canceled,
}

impl TaskError {
    /// A retryable failure.
    pub fn fail(reason: impl Into<String>) -> Self {
        Self::Fail {
            reason: reason.into(),
            exit_code: None,
        }
    }

    /// A non-retryable failure.
    pub fn fatal(reason: impl Into<String>) -> Self {
        Self::Fatal {
            reason: reason.into(),
            exit_code: None,
        }
    }
}

/// A task to register: name, body and policies. Unset policies come from
/// the supervisor's [`TaskDefaults`].
///
/// ```
/// use std::time::Duration;
/// use taskhost_core::supervisor::{BackoffPolicy, TaskSpec, native};
///
/// let spec = TaskSpec::restartable("fetch", native(|_ctx| async { Ok(b"done".to_vec()) }))
///     .with_max_retries(Some(3))
///     .with_backoff(BackoffPolicy::constant(Duration::from_millis(100)))
///     .with_timeout(Duration::from_secs(5));
/// assert_eq!(spec.name(), "fetch");
/// ```
#[derive(Clone)]
pub struct TaskSpec {
    pub(crate) name: String,
    pub(crate) slot: Option<String>,
    pub(crate) body: Arc<dyn TaskBody>,
    pub(crate) restart: Option<RestartPolicy>,
    pub(crate) backoff: Option<BackoffPolicy>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_retries: Option<Option<u32>>,
    pub(crate) resume: Resume,
    pub(crate) priority: i32,
    pub(crate) share: Option<Arc<str>>,
    pub(crate) due: Option<tokio::time::Instant>,
    pub(crate) schedule: Option<Arc<str>>,
    pub(crate) parent: Option<super::TaskId>,
    pub(crate) start_budget: Option<Arc<StartBudget>>,
    pub(crate) declared_capacity: Option<u32>,
}

/// Where a task picks up when a host that keeps tasks across restarts
/// registers it again: its attempt numbers continue, its failure streak
/// (which the retry budget counts) carries over, and its first attempt waits
/// out a backoff first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resume {
    /// Attempts that already started (the next is `attempts + 1`).
    pub attempts: u32,
    /// Consecutive failed attempts so far.
    pub failures: u32,
    /// The pause before the first attempt of this run.
    pub delay: Duration,
}

impl TaskSpec {
    /// A task with every policy from the supervisor's defaults.
    pub fn from_defaults(name: impl Into<String>, body: impl TaskBody) -> Self {
        Self::with_body(name, Arc::new(body))
    }

    /// Like [`TaskSpec::from_defaults`] with a shared body.
    pub fn with_body(name: impl Into<String>, body: Arc<dyn TaskBody>) -> Self {
        Self {
            name: name.into(),
            slot: None,
            body,
            restart: None,
            backoff: None,
            timeout: None,
            max_retries: None,
            resume: Resume::default(),
            priority: 0,
            share: None,
            due: None,
            schedule: None,
            parent: None,
            start_budget: None,
            declared_capacity: None,
        }
    }

    /// The capacity its plugin declares for its slot (`None`: 1): the
    /// controller gives the slot this capacity unless the operator's rule
    /// sets one (the slot keeps its latest submission's).
    pub fn with_declared_capacity(mut self, capacity: Option<u32>) -> Self {
        self.declared_capacity = capacity;
        self
    }

    /// The capacity its plugin declares for its slot, if any.
    pub fn declared_capacity(&self) -> Option<u32> {
        self.declared_capacity
    }

    /// Every attempt (the first, a restart, a retry) starts only when
    /// `budget` allows; until then the task is `Throttled`, holding no
    /// permit. The controller gives the tasks of a rate-limited slot their
    /// slot's budget.
    pub fn with_start_budget(mut self, budget: Arc<StartBudget>) -> Self {
        self.start_budget = Some(budget);
        self
    }

    /// A task that resumes where an earlier run of the host left it (see
    /// [`Resume`]).
    pub fn resuming(mut self, resume: Resume) -> Self {
        self.resume = resume;
        self
    }

    /// A task that runs once (restart Never).
    pub fn once(name: impl Into<String>, body: impl TaskBody) -> Self {
        Self::from_defaults(name, body).with_restart(RestartPolicy::Never)
    }

    /// A task that retries failures (restart OnFailure).
    pub fn restartable(name: impl Into<String>, body: impl TaskBody) -> Self {
        Self::from_defaults(name, body).with_restart(RestartPolicy::OnFailure)
    }

    /// A task that runs every `interval` (restart Always).
    pub fn periodic(name: impl Into<String>, body: impl TaskBody, interval: Duration) -> Self {
        Self::from_defaults(name, body).with_restart(RestartPolicy::Always { interval })
    }

    /// Sets the restart policy.
    pub fn with_restart(mut self, restart: RestartPolicy) -> Self {
        self.restart = Some(restart);
        self
    }

    /// Sets the backoff policy.
    pub fn with_backoff(mut self, backoff: BackoffPolicy) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Sets the per-attempt timeout; zero means none.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the retry budget: at most `n + 1` consecutive failed attempts;
    /// `None` is unlimited.
    pub fn with_max_retries(mut self, n: Option<u32>) -> Self {
        self.max_retries = Some(n);
        self
    }

    /// Sets the priority of its attempts among those waiting for a
    /// concurrency permit: higher goes first; equal ones in the order they
    /// began to wait [default: 0]. It orders nothing else (a slot's queue
    /// keeps its order).
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The priority of its attempts.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Puts its attempts in share group `group` (a namespace, a tenant)
    /// when they wait for a concurrency permit [default: the default
    /// group]. When the limit is reached, the groups with waiting attempts
    /// get permits in turn, in proportion to their weights
    /// ([`Supervisor::set_share_weight`](super::Supervisor::set_share_weight)),
    /// so a group with a long line does not hold up the others; within a
    /// group, attempts go by priority, then by arrival. A group may be
    /// capped to a number of attempts running at once
    /// ([`Supervisor::set_share_limit`](super::Supervisor::set_share_limit)).
    pub fn with_share(mut self, group: impl Into<Arc<str>>) -> Self {
        self.share = Some(group.into());
        self
    }

    /// The share group of its attempts (`None`: the default group).
    pub fn share(&self) -> Option<&str> {
        self.share.as_deref()
    }

    /// Says when the task became due (a delayed submission's time, a
    /// schedule's firing): its first attempt's start is measured from it
    /// (the `delay_ms` of that `AttemptStarting`, and
    /// [`stats::DUE_TO_START`](crate::stats::DUE_TO_START)).
    pub fn due(mut self, due: tokio::time::Instant) -> Self {
        self.due = Some(due);
        self
    }

    /// When the task became due, if it was held until a time.
    pub fn due_at(&self) -> Option<tokio::time::Instant> {
        self.due
    }

    /// Names the schedule that fired the task: its events carry it.
    pub fn with_schedule(mut self, schedule: impl Into<Arc<str>>) -> Self {
        self.schedule = Some(schedule.into());
        self
    }

    /// The schedule that fired the task, if any.
    pub fn schedule_name(&self) -> Option<&Arc<str>> {
        self.schedule.as_ref()
    }

    /// Names the task that spawned this one (a child task): its events
    /// carry it.
    pub fn with_parent(mut self, parent: super::TaskId) -> Self {
        self.parent = Some(parent);
        self
    }

    /// The task that spawned this one, if any.
    pub fn parent_id(&self) -> Option<super::TaskId> {
        self.parent
    }

    /// Sets the slot the task reports in its facts and events (the
    /// controller's admission key); without it the slot is the name.
    pub fn with_slot(mut self, slot: impl Into<String>) -> Self {
        self.slot = Some(slot.into());
        self
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The task's explicit slot, if set.
    pub fn slot(&self) -> Option<&str> {
        self.slot.as_deref()
    }

    /// The task's body.
    pub fn body(&self) -> &Arc<dyn TaskBody> {
        &self.body
    }
}

impl std::fmt::Debug for TaskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSpec")
            .field("name", &self.name)
            .field("slot", &self.slot)
            .field("body", &self.body.describe())
            .field("restart", &self.restart)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Supervisor-wide defaults for specs that leave a policy unset.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskDefaults {
    /// Default restart policy: Never.
    pub restart: RestartPolicy,
    /// Default backoff: 200 ms first, factor 2, 30 s max, Equal jitter.
    pub backoff: BackoffPolicy,
    /// Default per-attempt timeout: none.
    pub timeout: Option<Duration>,
    /// Default retry budget: unlimited.
    pub max_retries: Option<u32>,
}

impl Default for TaskDefaults {
    fn default() -> Self {
        Self {
            restart: RestartPolicy::Never,
            backoff: BackoffPolicy::default(),
            timeout: None,
            max_retries: None,
        }
    }
}

/// A spec with every policy resolved.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedPolicies {
    pub restart: RestartPolicy,
    pub backoff: BackoffPolicy,
    pub timeout: Option<Duration>,
    pub max_retries: Option<u32>,
    pub resume: Resume,
    pub priority: i32,
    pub share: Option<Arc<str>>,
    pub due: Option<tokio::time::Instant>,
    pub start_budget: Option<Arc<StartBudget>>,
}

impl TaskSpec {
    pub(crate) fn resolve(&self, defaults: &TaskDefaults) -> ResolvedPolicies {
        ResolvedPolicies {
            restart: self.restart.unwrap_or(defaults.restart),
            backoff: self
                .backoff
                .clone()
                .unwrap_or_else(|| defaults.backoff.clone()),
            timeout: self.timeout.or(defaults.timeout).filter(|t| !t.is_zero()),
            max_retries: self.max_retries.unwrap_or(defaults.max_retries),
            resume: self.resume,
            priority: self.priority,
            share: self.share.clone(),
            due: self.due,
            start_budget: self.start_budget.clone(),
        }
    }
}
