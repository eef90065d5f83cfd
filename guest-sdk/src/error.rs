//! How a task attempt ends when it does not succeed: [`TaskError`].

use std::fmt;

/// Why an attempt did not succeed; the error half of
/// [`Task::run`](crate::Task::run)'s result.
///
/// Build one with [`TaskError::fail`], [`TaskError::fatal`] or
/// [`TaskError::canceled`] (or the free functions [`fail`](crate::fail) and
/// [`fatal`](crate::fatal)), optionally followed by
/// [`with_exit_code`](TaskError::with_exit_code).
///
/// Any [`std::error::Error`] converts into a [`TaskError::Fail`] whose reason
/// is the error's message followed by its sources, so `?` works on
/// `std::io::Error`, `ParseIntError` and friends:
///
/// ```
/// use taskhost_guest::TaskError;
///
/// fn parse(text: &str) -> Result<u32, TaskError> {
///     Ok(text.trim().parse::<u32>()?)
/// }
///
/// let err = parse("x").unwrap_err();
/// assert!(err.is_fail());
/// assert_eq!(err.reason(), Some("invalid digit found in string"));
/// ```
///
/// `TaskError` deliberately does not implement [`std::error::Error`] (that
/// would conflict with the blanket conversion above); it implements
/// [`Display`](fmt::Display).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskError {
    /// A failure that may go away on retry (network blip, busy resource).
    /// Retried under the `on-failure` and `always` restart policies.
    Fail {
        /// A human-readable explanation.
        reason: String,
        /// An optional exit code, shown to the user and usable by scripts.
        exit_code: Option<i32>,
    },
    /// A failure that retrying cannot fix (bad input, missing config). Never
    /// retried.
    Fatal {
        /// A human-readable explanation.
        reason: String,
        /// An optional exit code, shown to the user and usable by scripts.
        exit_code: Option<i32>,
    },
    /// The plugin stopped because the host asked it to (see
    /// [`Context::is_cancelled`](crate::Context::is_cancelled)). Ends the task
    /// as canceled, not failed.
    Canceled,
}

impl TaskError {
    /// A retryable failure with this reason.
    pub fn fail(reason: impl Into<String>) -> Self {
        TaskError::Fail {
            reason: reason.into(),
            exit_code: None,
        }
    }

    /// A failure that retrying cannot fix, with this reason.
    pub fn fatal(reason: impl Into<String>) -> Self {
        TaskError::Fatal {
            reason: reason.into(),
            exit_code: None,
        }
    }

    /// The attempt stopped because the host asked it to.
    pub fn canceled() -> Self {
        TaskError::Canceled
    }

    /// Attaches an exit code to a [`Fail`](TaskError::Fail) or
    /// [`Fatal`](TaskError::Fatal) error. A [`Canceled`](TaskError::Canceled)
    /// error carries no exit code and is returned unchanged.
    #[must_use]
    pub fn with_exit_code(mut self, code: i32) -> Self {
        match &mut self {
            TaskError::Fail { exit_code, .. } | TaskError::Fatal { exit_code, .. } => {
                *exit_code = Some(code);
            }
            TaskError::Canceled => {}
        }
        self
    }

    /// The reason, or `None` for [`Canceled`](TaskError::Canceled).
    pub fn reason(&self) -> Option<&str> {
        match self {
            TaskError::Fail { reason, .. } | TaskError::Fatal { reason, .. } => Some(reason),
            TaskError::Canceled => None,
        }
    }

    /// The exit code, if one was attached.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            TaskError::Fail { exit_code, .. } | TaskError::Fatal { exit_code, .. } => *exit_code,
            TaskError::Canceled => None,
        }
    }

    /// True for [`Fail`](TaskError::Fail).
    pub fn is_fail(&self) -> bool {
        matches!(self, TaskError::Fail { .. })
    }

    /// True for [`Fatal`](TaskError::Fatal).
    pub fn is_fatal(&self) -> bool {
        matches!(self, TaskError::Fatal { .. })
    }

    /// True for [`Canceled`](TaskError::Canceled).
    pub fn is_canceled(&self) -> bool {
        matches!(self, TaskError::Canceled)
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, reason, exit_code) = match self {
            TaskError::Fail { reason, exit_code } => ("failed", reason, exit_code),
            TaskError::Fatal { reason, exit_code } => ("fatal", reason, exit_code),
            TaskError::Canceled => return f.write_str("canceled"),
        };
        write!(f, "{kind}: {reason}")?;
        if let Some(code) = exit_code {
            write!(f, " (exit code {code})")?;
        }
        Ok(())
    }
}

/// Converts any error into a retryable [`TaskError::Fail`]. The reason is the
/// error's message followed by the messages of its
/// [`source`](std::error::Error::source) chain, separated by `": "`.
impl<E: std::error::Error> From<E> for TaskError {
    fn from(error: E) -> Self {
        let mut reason = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            // Many errors repeat their source's message; do not say it twice.
            if !reason.ends_with(&text) {
                reason.push_str(": ");
                reason.push_str(&text);
            }
            source = cause.source();
        }
        TaskError::fail(reason)
    }
}

/// A retryable failure with this reason; shorthand for [`TaskError::fail`].
///
/// ```
/// # use taskhost_guest::TaskError;
/// fn check(n: u32) -> Result<(), TaskError> {
///     if n == 0 {
///         return Err(taskhost_guest::fail("n must not be 0").with_exit_code(2));
///     }
///     Ok(())
/// }
/// assert_eq!(check(0).unwrap_err().exit_code(), Some(2));
/// ```
pub fn fail(reason: impl Into<String>) -> TaskError {
    TaskError::fail(reason)
}

/// A failure that retrying cannot fix; shorthand for [`TaskError::fatal`].
pub fn fatal(reason: impl Into<String>) -> TaskError {
    TaskError::fatal(reason)
}

/// The attempt stopped because the host asked it to; shorthand for
/// [`TaskError::canceled`].
pub fn canceled() -> TaskError {
    TaskError::Canceled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("reading config")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn constructors_and_accessors() {
        let e = fail("boom").with_exit_code(3);
        assert!(e.is_fail());
        assert_eq!(e.reason(), Some("boom"));
        assert_eq!(e.exit_code(), Some(3));
        assert_eq!(e.to_string(), "failed: boom (exit code 3)");

        let e = fatal("bad input");
        assert!(e.is_fatal());
        assert_eq!(e.exit_code(), None);
        assert_eq!(e.to_string(), "fatal: bad input");

        let e = canceled().with_exit_code(1);
        assert!(e.is_canceled());
        assert_eq!(e.reason(), None);
        assert_eq!(e.exit_code(), None);
        assert_eq!(e.to_string(), "canceled");
    }

    #[test]
    fn from_error_includes_sources() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = TaskError::from(Outer(io));
        assert_eq!(e, fail("reading config: no such file"));
    }

    #[test]
    fn question_mark_converts() {
        fn parse(s: &str) -> Result<i32, TaskError> {
            Ok(s.parse::<i32>()?)
        }
        assert!(parse("12").is_ok());
        assert!(parse("x").unwrap_err().is_fail());
    }
}
