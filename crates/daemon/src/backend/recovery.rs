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

use taskhost_core::lifecycle::TaskState;
use taskhost_core::outcome::TaskOutcome;
use taskhost_core::recovery::{Fate, fate};
use taskhost_core::supervisor::{Event, EventKind, TaskId, TaskReport};

use crate::backend::OneHost;
use crate::backend::daemon::Daemon;
use crate::backend::submit::{Origin, place};
use crate::store::{Finished, Ticket, Unfinished, now_ms};

/// What recovery did, for the start-up log.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Recovered {
    pub requeued: usize,
    pub retried: usize,
    pub ended: usize,
}

pub(crate) async fn recover(
    daemon: &Arc<Daemon>,
    host: &OneHost,
    unfinished: Vec<Unfinished>,
) -> Recovered {
    let store = &host.store;
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
                    .parent(task.request.parent.map(TaskId::from_u64))
                    .reason(why),
            );
        };
        let end = |outcome: TaskOutcome| {
            store.finished(Finished {
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
                parent: task.request.parent,
                records: Vec::new(),
            })
        };
        let Some(reservation) = supervisor.restore(id) else {
            tracing::error!(task = %id, "the store holds task {id} twice or above the next id; skipping it");
            continue;
        };
        match fate(&task.lost()) {
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
                match place(daemon, host, task.request.clone(), origin).await {
                    Ok(_) if queued => done.requeued += 1,
                    Ok(_) => done.retried += 1,
                    Err(message) => {
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
