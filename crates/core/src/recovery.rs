//! Owns what becomes of a task whose host lost it (the daemon stopped or
//! crashed, or a cluster node died) before it ended: the restart policy
//! decides, as docs/semantics.md and the durability contract say. A pure
//! function of where the task stood, used by a daemon's recovery at start
//! and by a cluster's takeover of a dead node's work alike.

use std::time::Duration;

use crate::lifecycle::TaskState;
use crate::outcome::TaskOutcome;
use crate::supervisor::{BackoffPolicy, RestartPolicy, Resume, TaskDefaults};
use crate::units::format_duration;

/// The reason of an attempt the host's stop interrupted.
pub const INTERRUPTED: &str = "interrupted: the host stopped";

/// Where a lost task stood when its host last heard of it.
#[derive(Debug, Clone)]
pub struct Lost {
    /// `Queued` (no attempt started), `Running` (an attempt started) or
    /// `Stopping` (a stop was requested).
    pub state: TaskState,
    /// Attempts started.
    pub attempts: u32,
    /// The pause before its next attempt, when its last attempt had ended:
    /// how long from now, and the failure streak so far.
    pub pause: Option<(Duration, u32)>,
    /// Its restart policy [default: never].
    pub restart: Option<RestartPolicy>,
    /// Its retry budget.
    pub max_retries: Option<u32>,
    /// Its backoff [default: the supervisor's].
    pub backoff: Option<BackoffPolicy>,
}

/// What becomes of a lost task.
#[derive(Debug, Clone, PartialEq)]
pub enum Fate {
    /// Placed again, resuming here; the text says why.
    Place(Resume, String),
    /// Ended with this outcome; the text says why.
    End(TaskOutcome, String),
}

/// The rule: queued work is placed again; a pause resumes at its deadline;
/// an interrupted attempt is a failed one (a run-once task, or one out of
/// retries, ends Failed: it must not run twice), after which the backoff
/// applies; a task being stopped ends Canceled.
pub fn fate(task: &Lost) -> Fate {
    let attempts = task.attempts;
    let resume = Resume {
        attempts,
        ..Resume::default()
    };
    match task.state {
        TaskState::Stopping => Fate::End(
            TaskOutcome::Canceled,
            "canceled: it was being stopped when the host stopped".into(),
        ),
        TaskState::Running if let Some((delay, failures)) = task.pause => {
            let resume = Resume {
                attempts,
                failures,
                delay,
            };
            let why = format!(
                "waiting: attempt {} is due in {}, as it was before the restart",
                attempts + 1,
                format_duration(delay)
            );
            Fate::Place(resume, why)
        }
        TaskState::Running => {
            let restart = task.restart.unwrap_or(RestartPolicy::Never);
            // Every attempt of an unfinished on-failure task failed (a
            // success would have ended it); of a periodic one only the
            // interrupted attempt is known to have.
            let failures = match restart {
                RestartPolicy::OnFailure => attempts.max(1),
                _ => 1,
            };
            let over_budget = task.max_retries.is_some_and(|max| failures > max);
            if restart == RestartPolicy::Never || over_budget {
                let reason = if restart == RestartPolicy::Never {
                    format!("attempt {attempts} {INTERRUPTED}")
                } else {
                    format!("attempt {attempts} {INTERRUPTED}, and no retry is left")
                };
                let why = format!("failed: {reason}");
                return Fate::End(
                    TaskOutcome::Failed {
                        reason,
                        exit_code: None,
                    },
                    why,
                );
            }
            let backoff = task
                .backoff
                .clone()
                .unwrap_or_else(|| TaskDefaults::default().backoff);
            let resume = Resume {
                attempts,
                failures,
                delay: backoff.delay(failures - 1),
            };
            let why = format!(
                "retrying: attempt {attempts} was {INTERRUPTED}; next attempt in {}",
                format_duration(resume.delay)
            );
            Fate::Place(resume, why)
        }
        // Queued, or admitted and waiting (no attempt had started).
        _ => Fate::Place(resume, "queued again after the host restarted".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(state: TaskState, restart: Option<RestartPolicy>) -> Lost {
        Lost {
            state,
            attempts: 1,
            pause: None,
            restart,
            max_retries: None,
            backoff: None,
        }
    }

    #[test]
    fn a_run_once_task_interrupted_fails_and_a_restartable_one_retries() {
        let Fate::End(TaskOutcome::Failed { reason, .. }, _) =
            fate(&lost(TaskState::Running, None))
        else {
            panic!("a run-once task must not run twice")
        };
        assert_eq!(reason, format!("attempt 1 {INTERRUPTED}"));
        let Fate::Place(resume, why) =
            fate(&lost(TaskState::Running, Some(RestartPolicy::OnFailure)))
        else {
            panic!("retried")
        };
        assert_eq!((resume.attempts, resume.failures), (1, 1));
        assert!(why.starts_with("retrying"), "{why}");
        assert!(matches!(
            fate(&lost(TaskState::Stopping, None)),
            Fate::End(TaskOutcome::Canceled, _)
        ));
        assert!(matches!(
            fate(&lost(TaskState::Queued, None)),
            Fate::Place(_, _)
        ));
    }
}
