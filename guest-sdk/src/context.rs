//! The handle a running task uses to talk to the host: [`Context`].

use std::cell::OnceCell;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::__bindings::taskhost::plugin::{host, types};
use crate::TaskError;

/// Severity of a log line sent with [`Context::log`] or the log macros
/// ([`info!`](crate::info) and friends).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging details.
    Debug,
    /// Normal progress messages.
    Info,
    /// Something unexpected that the task survived.
    Warn,
    /// Something went wrong.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        })
    }
}

/// How a [`Context::sleep`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a sleep can end early because the task was cancelled"]
pub enum SleepStatus {
    /// The full duration elapsed.
    Elapsed,
    /// Cancellation arrived first; the sleep returned early.
    Cancelled,
}

impl SleepStatus {
    /// True if the full duration elapsed.
    pub fn is_elapsed(self) -> bool {
        self == SleepStatus::Elapsed
    }

    /// True if the sleep ended early because the task was cancelled.
    pub fn is_cancelled(self) -> bool {
        self == SleepStatus::Cancelled
    }
}

/// The facts of the current attempt, fetched from the host on first use.
#[derive(Debug)]
struct Facts {
    task_id: u64,
    name: String,
    slot: String,
    attempt: u32,
    params: Vec<(String, String)>,
}

/// The running task's handle to the host, passed to [`Task::run`](crate::Task::run).
///
/// It offers cooperative cancellation ([`is_cancelled`](Context::is_cancelled),
/// [`sleep`](Context::sleep)), structured logging ([`log`](Context::log) and
/// the [`info!`](crate::info)-style macros), progress reports and the facts
/// of the attempt: task id, name, slot, attempt number and the submission's
/// `--param K=V` pairs.
///
/// ```no_run
/// use std::time::Duration;
/// use taskhost_guest::{Context, TaskError};
///
/// fn work(ctx: &Context) -> Result<Vec<u8>, TaskError> {
///     let steps: u64 = ctx.param_parse_or("steps", 10)?;
///     for step in 1..=steps {
///         if ctx.sleep(Duration::from_millis(100)).is_cancelled() {
///             return Err(TaskError::canceled());
///         }
///         ctx.progress(step, steps);
///     }
///     taskhost_guest::info!(ctx, "attempt {} finished {steps} steps", ctx.attempt());
///     Ok(b"done".to_vec())
/// }
/// ```
///
/// Outside a WebAssembly host (for example in a native `cargo test`) the host
/// calls are not available and panic.
#[derive(Debug)]
pub struct Context {
    facts: OnceCell<Facts>,
}

impl Context {
    /// A context whose attempt facts are fetched from the host on first use.
    pub(crate) fn new() -> Self {
        Context {
            facts: OnceCell::new(),
        }
    }

    /// A context with fixed facts, for unit tests of the parameter helpers.
    #[cfg(test)]
    pub(crate) fn with_params(params: &[(&str, &str)]) -> Self {
        let facts = Facts {
            task_id: 7,
            name: "test-7".into(),
            slot: "test-7".into(),
            attempt: 1,
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        Context {
            facts: OnceCell::from(facts),
        }
    }

    fn facts(&self) -> &Facts {
        self.facts.get_or_init(|| {
            let info = host::attempt();
            Facts {
                task_id: info.task_id,
                name: info.name,
                slot: info.slot,
                attempt: info.attempt,
                params: info.params,
            }
        })
    }

    /// True once the host has asked this attempt to stop (cancel, remove,
    /// replace, shutdown). The task should then return
    /// [`TaskError::canceled()`] soon; if it does not within the host's grace
    /// period, the instance is stopped by force.
    pub fn is_cancelled(&self) -> bool {
        host::is_cancelled()
    }

    /// Returns `Err(TaskError::Canceled)` if the host has asked this attempt to
    /// stop, so a loop can say `ctx.check_cancelled()?;`.
    pub fn check_cancelled(&self) -> Result<(), TaskError> {
        if self.is_cancelled() {
            Err(TaskError::Canceled)
        } else {
            Ok(())
        }
    }

    /// Sleeps for `duration` (rounded up to whole milliseconds), or less if
    /// cancellation arrives first; the result says which.
    ///
    /// Prefer this over [`std::thread::sleep`]: it wakes immediately on
    /// cancel.
    pub fn sleep(&self, duration: Duration) -> SleepStatus {
        let ms = u64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        self.sleep_ms(ms)
    }

    /// Sleeps for `ms` milliseconds, or less if cancellation arrives first;
    /// the result says which.
    pub fn sleep_ms(&self, ms: u64) -> SleepStatus {
        match host::sleep(ms) {
            types::SleepStatus::Elapsed => SleepStatus::Elapsed,
            types::SleepStatus::Cancelled => SleepStatus::Cancelled,
        }
    }

    /// Writes one structured line to the task's log. The macros
    /// [`info!`](crate::info), [`warn!`](crate::warn) and friends format
    /// and call this.
    pub fn log(&self, level: Level, message: &str) {
        log_to_host(level, message);
    }

    /// Reports progress: `done` units out of `total` (0 if the total is
    /// unknown).
    pub fn progress(&self, done: u64, total: u64) {
        host::progress(done, total);
    }

    /// The task's id, unique within one host process.
    pub fn task_id(&self) -> u64 {
        self.facts().task_id
    }

    /// The task's name (`--name`, or `<plugin name>-<task id>`).
    pub fn name(&self) -> &str {
        &self.facts().name
    }

    /// The admission slot the task owns while it runs.
    pub fn slot(&self) -> &str {
        &self.facts().slot
    }

    /// The attempt number: 1 for the first attempt, 2 for the first retry, and
    /// so on.
    pub fn attempt(&self) -> u32 {
        self.facts().attempt
    }

    /// The submission's `--param K=V` pairs, in the order given.
    pub fn params(&self) -> &[(String, String)] {
        &self.facts().params
    }

    /// The value of param `key`, or `None` if it was not given. If the key
    /// was given more than once, the last value wins.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params()
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of param `key`, or `default` if it was not given.
    pub fn param_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.param(key).unwrap_or(default)
    }

    /// The value of param `key`, or a [fatal](TaskError::Fatal) error saying
    /// how to pass it.
    pub fn param_required(&self, key: &str) -> Result<&str, TaskError> {
        self.param(key).ok_or_else(|| {
            TaskError::fatal(format!(
                "missing param `{key}` (pass it with --param {key}=VALUE)"
            ))
        })
    }

    /// Param `key` parsed with [`FromStr`]: `Ok(None)` if it was not given,
    /// and a [fatal](TaskError::Fatal) error naming the param and the value
    /// if it does not parse (retrying cannot fix bad input).
    pub fn param_parse<T>(&self, key: &str) -> Result<Option<T>, TaskError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        let Some(value) = self.param(key) else {
            return Ok(None);
        };
        value.parse::<T>().map(Some).map_err(|err| {
            TaskError::fatal(format!(
                "param `{key}`: invalid value `{value}` for {}: {err}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// Like [`param_parse`](Context::param_parse), with `default` when the
    /// param was not given.
    ///
    /// ```no_run
    /// # fn f(ctx: &taskhost_guest::Context) -> Result<(), taskhost_guest::TaskError> {
    /// let retries: u32 = ctx.param_parse_or("retries", 3)?;
    /// # Ok(()) }
    /// ```
    pub fn param_parse_or<T>(&self, key: &str, default: T) -> Result<T, TaskError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        Ok(self.param_parse(key)?.unwrap_or(default))
    }
}

/// Sends one log line to the host.
pub(crate) fn log_to_host(level: Level, message: &str) {
    let level = match level {
        Level::Trace => types::Level::Trace,
        Level::Debug => types::Level::Debug,
        Level::Info => types::Level::Info,
        Level::Warn => types::Level::Warn,
        Level::Error => types::Level::Error,
    };
    host::log(level, message);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params() {
        let ctx = Context::with_params(&[("env", "prod"), ("n", "5"), ("n", "6"), ("bad", "x")]);
        assert_eq!(ctx.param("env"), Some("prod"));
        assert_eq!(ctx.param("n"), Some("6"), "last value wins");
        assert_eq!(ctx.param("nope"), None);
        assert_eq!(ctx.param_or("nope", "dflt"), "dflt");
        assert_eq!(ctx.param_or("env", "dflt"), "prod");
        assert_eq!(ctx.param_required("env"), Ok("prod"));
        let missing = ctx.param_required("region").unwrap_err();
        assert!(missing.is_fatal());
        assert!(missing.reason().unwrap().contains("--param region=VALUE"));

        assert_eq!(ctx.param_parse::<u32>("n"), Ok(Some(6)));
        assert_eq!(ctx.param_parse::<u32>("nope"), Ok(None));
        assert_eq!(ctx.param_parse_or::<u32>("nope", 9), Ok(9));
        let bad = ctx.param_parse::<u32>("bad").unwrap_err();
        assert!(bad.is_fatal());
        assert_eq!(
            bad.reason(),
            Some("param `bad`: invalid value `x` for u32: invalid digit found in string")
        );
        assert_eq!(ctx.params().len(), 4);
        assert_eq!(ctx.attempt(), 1);
        assert_eq!(ctx.task_id(), 7);
        assert_eq!(ctx.name(), "test-7");
        assert_eq!(ctx.slot(), "test-7");
    }

    #[test]
    fn sleep_status() {
        assert!(SleepStatus::Elapsed.is_elapsed());
        assert!(SleepStatus::Cancelled.is_cancelled());
        assert_eq!(Level::Warn.to_string(), "warn");
    }
}
