//! Owns rebuilding the daemon from a durable store at start: every
//! unfinished task is placed again under its old id, in id order (the order
//! the controller first decided them in), or ended, as the store's state of
//! it says:
//!
//! - queued (no attempt started): placed again, in its slot, in order;
//! - pausing (its last attempt ended, the next was due at a recorded
//!   deadline: a retry's backoff or a periodic interval): placed again with
//!   its attempt count and failure streak, its next attempt at that same
//!   deadline (at once if it has passed);
//! - running (an attempt started and never reported): that attempt was
//!   interrupted; a run-once task ends Failed (it must not run twice), a
//!   restartable one is placed again with its attempt count and failure
//!   streak carried over, after the backoff its policy gives from now;
//! - stopping (a cancel, remove or replace was under way): ends Canceled.
//!
//! Each gets a `Recovered` event saying which. Ended ones are recorded
//! before the daemon listens, so `host wait ID` finds them at once.

use std::sync::Arc;

use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::{
    Event, EventKind, RestartPolicy, Resume, TaskDefaults, TaskReport,
};
use taskhost_core::units::format_duration;

use crate::service::submissions::{Origin, place};
use crate::state::Daemon;
use crate::store::{Finished, Ticket, Unfinished, now_ms};
use taskhost_core::lifecycle::TaskState;

/// What recovery did, for the start-up log.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Recovered {
    pub requeued: usize,
    pub retried: usize,
    pub ended: usize,
}

/// The reason of an attempt the host's stop interrupted.
pub const INTERRUPTED: &str = "interrupted: the host stopped";

/// What becomes of one unfinished task.
pub(crate) enum Fate {
    /// Placed again, resuming here; the text says why.
    Place(Resume, String),
    /// Ended with this outcome; the text says why.
    End(TaskOutcome, String),
}

pub(crate) fn fate(task: &Unfinished) -> Fate {
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
        TaskState::Running if let Some(pause) = task.pause => {
            let delay = std::time::Duration::from_millis(pause.until_ms.saturating_sub(now_ms()));
            let resume = Resume {
                attempts,
                failures: pause.failures,
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
            let request = &task.request;
            let restart = request.restart.unwrap_or(RestartPolicy::Never);
            // Every attempt of an unfinished on-failure task failed (a
            // success would have ended it); of a periodic one only the
            // interrupted attempt is known to have.
            let failures = match restart {
                RestartPolicy::OnFailure => attempts.max(1),
                _ => 1,
            };
            let over_budget = request.max_retries.is_some_and(|max| failures > max);
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
            let backoff = request
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

pub(crate) async fn recover(daemon: &Arc<Daemon>, unfinished: Vec<Unfinished>) -> Recovered {
    let mut done = Recovered::default();
    let mut tickets: Vec<Ticket> = Vec::new();
    let supervisor = daemon.controller.supervisor();
    for task in unfinished {
        let id = task.id;
        let name: Arc<str> = task.request.name.clone().unwrap_or_default().into();
        let slot: Arc<str> = task.request.slot.clone().unwrap_or_default().into();
        let publish = |why: String| {
            supervisor.publish(
                Event::new(EventKind::Recovered)
                    .task(id, &name, &slot)
                    .reason(why),
            );
        };
        let end = |outcome: TaskOutcome| {
            daemon.store.finished(Finished {
                report: TaskReport {
                    id,
                    name: Arc::clone(&name),
                    slot: Arc::clone(&slot),
                    outcome,
                    attempts: task.attempts,
                    history: Vec::new(),
                    duration: std::time::Duration::ZERO,
                },
                plugin: task.plugin.clone(),
                log: Vec::new(),
                submitted_ms: task.submitted_ms,
                finished_ms: now_ms(),
            })
        };
        let Some(reservation) = supervisor.restore(id) else {
            tracing::error!(task = %id, "the store holds task {id} twice or above the next id; skipping it");
            continue;
        };
        match fate(&task) {
            Fate::End(outcome, why) => {
                drop(reservation);
                publish(why);
                tickets.push(end(outcome));
                done.ended += 1;
            }
            Fate::Place(resume, why) => {
                publish(why);
                let queued = task.state == TaskState::Queued;
                let origin = Origin::Recovered {
                    reservation,
                    submitted_ms: task.submitted_ms,
                    resume,
                };
                match place(daemon, task.request.clone(), origin).await {
                    Ok(_) if queued => done.requeued += 1,
                    Ok(_) => done.retried += 1,
                    Err((_, message)) => {
                        tracing::error!(task = %id, "cannot recover task {id}: {message}");
                        publish(format!("failed: cannot place it again: {message}"));
                        tickets.push(end(TaskOutcome::Failed {
                            reason: format!("not recovered after the host restarted: {message}"),
                            exit_code: None,
                        }));
                        done.ended += 1;
                    }
                }
            }
        }
    }
    for ticket in tickets {
        if let Err(err) = ticket.committed().await {
            tracing::error!("cannot record a recovered outcome: {err}");
        }
    }
    done
}
