//! Owns what each request does. A handler runs in the order its request was
//! sent and does the part that decides (take a chunk, place a submission,
//! resolve a name, claim a stop, subscribe to a stream) before the next
//! request is read; only the part that waits (for an outcome, a stream, the
//! shutdown) goes on in a task of its own.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, Received, TaskRef};

use crate::cluster;
use crate::server::connection::Replier;
use crate::service::plugins;
use crate::service::submissions;
use crate::service::tasks::{MAX_FINISHED, TaskRecord};
use crate::service::uploads::Uploads;
use crate::state::Daemon;
use crate::store::{self, Finished};
use crate::wire::protocol::{
    ErrorKind, EventFilter, LIST_PAGE, Reply, Request, TaskRow, TaskState,
};

/// Handles one request (see the module docs for what happens in order).
pub(crate) async fn handle(
    daemon: &Arc<Daemon>,
    request: Request,
    reply: Replier,
    uploads: &mut Uploads,
) {
    if let Err(message) = request.check() {
        reply.error(ErrorKind::Invalid, message).await;
        return;
    }
    let (request, reply) = match &daemon.cluster {
        Some(cluster) => match cluster::handle(daemon, cluster, request, reply).await {
            Some(rest) => rest,
            None => return,
        },
        None => (request, reply),
    };
    match request {
        Request::HasPlugin(digest) => {
            reply
                .send(Reply::HasPlugin(daemon.plugins.known(&digest)))
                .await;
        }
        Request::Upload {
            digest,
            offset,
            data,
            last,
        } => match uploads.take(digest, offset, data, last) {
            Err(message) => reply.error(ErrorKind::Invalid, message).await,
            Ok(None) => {
                reply.send(Reply::Uploaded { plugin: None }).await;
            }
            // The compile happens in order: a Submit of this plugin sent
            // right after the last chunk finds it.
            Ok(Some(bytes)) => {
                // A cluster node stores it for the whole cluster too.
                let shared = daemon.cluster.as_ref().map(|_| bytes.clone());
                match daemon.plugins.store(bytes, Some(digest)).await {
                    Ok(plugin) => {
                        let name = plugin.info().name.clone();
                        if let (Some(cluster), Some(bytes)) = (&daemon.cluster, shared)
                            && let Err(err) =
                                cluster.pg.put_plugin(&digest, Some(&name), &bytes).await
                        {
                            reply.error(ErrorKind::Internal, err.to_string()).await;
                            return;
                        }
                        reply.send(Reply::Uploaded { plugin: Some(name) }).await;
                    }
                    Err((kind, message)) => reply.error(kind, message).await,
                }
            }
        },
        Request::Submit(request) => submissions::submit(daemon, *request, reply).await,
        Request::Wait(target) => match resolve(daemon, &target, &reply).await {
            Some(Found::Live(record)) => {
                tokio::spawn(async move {
                    if let Some(report) = reply.until_gone(record.outcome.report()).await {
                        reply.report(&report, Reply::Report).await;
                    }
                });
            }
            Some(Found::Stored(finished)) => {
                reply.report(&finished.report, Reply::Report).await;
            }
            None => {}
        },
        Request::Cancel { target, wait } => cancel(daemon, target, wait, reply).await,
        Request::List { all } => list(daemon, all, &reply).await,
        Request::Plugins => {
            let daemon = Arc::clone(daemon);
            let rows =
                tokio::task::spawn_blocking(move || daemon.plugins.list(&plugins::refs(&daemon)))
                    .await
                    .unwrap_or_default();
            send_pages(&reply, rows, Reply::Plugins).await;
        }
        Request::RemovePlugins { prefix } => {
            let daemon = Arc::clone(daemon);
            let removed = tokio::task::spawn_blocking(move || {
                plugins::remove(&daemon, prefix.as_deref(), std::time::Duration::ZERO)
            })
            .await
            .unwrap_or_else(|e| Err((ErrorKind::Internal, e.to_string())));
            match removed {
                Ok(rows) => {
                    reply.send(Reply::PluginsRemoved(rows)).await;
                }
                Err((kind, message)) => reply.error(kind, message).await,
            }
        }
        Request::Slots => {
            let slots = daemon.controller.snapshot();
            send_pages(&reply, slots, Reply::Slots).await;
        }
        Request::Events { follow, filter } => events(daemon, follow, filter, reply).await,
        Request::Logs { target, follow } => {
            let record = match resolve(daemon, &target, &reply).await {
                Some(Found::Live(record)) => record,
                Some(Found::Stored(finished)) => {
                    for line in finished.log {
                        if !reply.send(Reply::Log(line)).await {
                            return;
                        }
                    }
                    reply.send(Reply::End).await;
                    return;
                }
                None => return,
            };
            // Subscribed in order: lines written after this request are seen.
            let (lines, live) = record.log.follow();
            let follow = follow && record.outcome.get().is_none();
            tokio::spawn(async move {
                for line in lines {
                    if !reply.send(Reply::Log(line)).await {
                        return;
                    }
                }
                if follow {
                    stream_log(&reply, live).await;
                }
                reply.send(Reply::End).await;
            });
        }
        Request::Shutdown { grace, cancel_all } => {
            let daemon = Arc::clone(daemon);
            daemon.shutdown_requested.store(true, Ordering::SeqCst);
            daemon.keep_unfinished.store(
                (daemon.store.is_durable() || daemon.cluster.is_some()) && !cancel_all,
                Ordering::SeqCst,
            );
            if let Some(cluster) = &daemon.cluster {
                cluster.stop_claiming();
            }
            tokio::spawn(async move {
                let grace = grace.unwrap_or(daemon.config.grace);
                let report = daemon.controller.shutdown(grace).await;
                // The accept loop finishes the stop (it reuses the same
                // report); the answer waits until the store is closed and
                // the state directory free, so a `host serve` right after
                // `host shutdown` finds it free.
                let mut closed = daemon.closed.subscribe();
                let _ = daemon.stop.send(Some(grace));
                let _ = closed.wait_for(|closed| *closed).await;
                reply.send(Reply::ShutdownDone(report)).await;
            });
        }
    }
}

/// What a target refers to.
pub(crate) enum Found {
    /// A task this run of the daemon knows.
    Live(TaskRecord),
    /// A task finished before, as the store kept it.
    Stored(Box<Finished>),
}

/// The task a target refers to (in memory, else finished in the store), or
/// a NotFound reply.
async fn resolve(daemon: &Daemon, target: &TaskRef, reply: &Replier) -> Option<Found> {
    if let Some(found) = find(daemon, target) {
        return Some(found);
    }
    reply
        .error(
            ErrorKind::NotFound,
            format!("no task with {target} (see `host ps --all`)"),
        )
        .await;
    None
}

/// The task a target refers to: in memory, else finished in the store.
pub(crate) fn find(daemon: &Daemon, target: &TaskRef) -> Option<Found> {
    if let Some(record) = daemon.tasks.resolve(target, &daemon.controller) {
        return Some(Found::Live(record));
    }
    let stored = match target {
        TaskRef::Id(id) => daemon.store.finished_task(*id),
        TaskRef::Name(name) => daemon.store.finished_named(name),
    };
    stored.map(|finished| Found::Stored(Box::new(finished)))
}

/// Makes the stop claim on a live task (or removes it from its queue) and
/// records that it is stopping; false if it was already stopping or gone.
pub(crate) fn claim_stop(daemon: &Daemon, record: &TaskRecord) -> bool {
    let claimed = daemon.controller.remove(record.id);
    if claimed {
        daemon.store.stopping(record.id);
    }
    claimed
}

/// Stops a task or removes queued work: the claim is made in order; with
/// `wait`, the wait for its end goes on in the background.
async fn cancel(daemon: &Arc<Daemon>, target: TaskRef, wait: bool, reply: Replier) {
    let record = match resolve(daemon, &target, &reply).await {
        Some(Found::Live(record)) => record,
        Some(Found::Stored(finished)) => {
            let report = wait.then_some(finished.report);
            reply
                .send(Reply::Canceled {
                    claimed: false,
                    report,
                })
                .await;
            return;
        }
        None => return,
    };
    let claimed = claim_stop(daemon, &record);
    if !wait {
        reply
            .send(Reply::Canceled {
                claimed,
                report: None,
            })
            .await;
        return;
    }
    tokio::spawn(async move {
        let Some(report) = reply.until_gone(record.outcome.report()).await else {
            return;
        };
        reply
            .report(&report, |report| Reply::Canceled {
                claimed,
                report: Some(report),
            })
            .await;
    });
}

/// `host ps`: registered tasks, queued ones, and with `all` the finished
/// ones the daemon still remembers.
async fn list(daemon: &Daemon, all: bool, reply: &Replier) {
    send_pages(reply, task_rows(daemon, all), Reply::Tasks).await;
}

/// The rows of `host ps` (with `all`, `host ps --all`), by id.
pub(crate) fn task_rows(daemon: &Daemon, all: bool) -> Vec<TaskRow> {
    let supervisor = daemon.controller.supervisor();
    let mut rows: Vec<TaskRow> = supervisor
        .list()
        .into_iter()
        .map(|t| TaskRow {
            id: t.id,
            state: t.phase,
            name: t.name,
            slot: t.slot,
            attempts: t.attempts,
            age: daemon
                .tasks
                .get(t.id)
                .map_or(t.age, |r| r.submitted.elapsed()),
            progress: t.progress,
            plugin: t.body,
            outcome: None,
            node: None,
        })
        .collect();
    rows.extend(daemon.controller.queued_all().into_iter().map(|q| TaskRow {
        id: q.id,
        name: q.name,
        slot: q.slot,
        state: TaskState::Queued,
        attempts: 0,
        age: q.age,
        progress: None,
        plugin: q.body,
        outcome: None,
        node: None,
    }));
    if all {
        let live: std::collections::HashSet<_> = rows.iter().map(|r| r.id).collect();
        rows.extend(
            daemon
                .tasks
                .finished_records()
                .into_iter()
                .filter(|r| !live.contains(&r.id))
                .filter_map(|r| {
                    let report = r.outcome.get()?;
                    Some(TaskRow {
                        id: r.id,
                        name: r.name,
                        slot: r.slot,
                        state: TaskState::Finished,
                        attempts: report.attempts,
                        age: r.submitted.elapsed(),
                        progress: None,
                        plugin: r.plugin,
                        outcome: Some(report.outcome.kind()),
                        node: None,
                    })
                }),
        );
        // Finished before this run of the daemon: from the store.
        let known: std::collections::HashSet<_> = rows.iter().map(|r| r.id).collect();
        let now = store::now_ms();
        rows.extend(
            daemon
                .store
                .finished_recent(MAX_FINISHED)
                .into_iter()
                .filter(|f| {
                    !known.contains(&f.report.id) && daemon.tasks.get(f.report.id).is_none()
                })
                .map(|f| TaskRow {
                    id: f.report.id,
                    name: f.report.name.to_string(),
                    slot: f.report.slot.to_string(),
                    state: TaskState::Finished,
                    attempts: f.report.attempts,
                    age: std::time::Duration::from_millis(now.saturating_sub(f.submitted_ms)),
                    progress: None,
                    plugin: f.plugin,
                    outcome: Some(f.report.outcome.kind()),
                    node: None,
                }),
        );
    }
    rows.sort_by_key(|r| r.id);
    rows
}

/// Sends rows in pages of at most [`LIST_PAGE`], then [`Reply::End`].
pub(crate) async fn send_pages<T>(reply: &Replier, rows: Vec<T>, page: impl Fn(Vec<T>) -> Reply) {
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let chunk: Vec<T> = rows.by_ref().take(LIST_PAGE).collect();
        if !reply.send(page(chunk)).await {
            return;
        }
    }
    reply.send(Reply::End).await;
}

/// `host events`: the recorded history, then (with `follow`) live events,
/// with nothing falling between the two.
async fn events(daemon: &Arc<Daemon>, follow: bool, filter: EventFilter, reply: Replier) {
    // Subscribe before copying the history (in order: events of requests
    // sent after this one are seen), and let the history catch up with the
    // events published before the subscription.
    let (mut live, before) = daemon.controller.supervisor().subscribe_after();
    let history = Arc::clone(&daemon.history);
    tokio::spawn(async move {
        let recorded = history.up_to(before).await;
        let last_seq = recorded.last().map_or(0, |e| e.seq);
        for event in recorded.iter().filter(|e| filter.admits(e)) {
            if !reply.send(Reply::Event(Event::clone(event))).await {
                return;
            }
        }
        if follow {
            if last_seq < before && last_seq > 0 {
                // The recorder lost these; say so rather than skip them.
                if !reply.send(Reply::Dropped(before - last_seq)).await {
                    return;
                }
            }
            while let Some(Some(received)) = reply.until_gone(live.recv()).await {
                let sent = match received {
                    Received::Event(e) if e.seq <= before || !filter.admits(&e) => true,
                    Received::Event(e) => reply.send(Reply::Event(Event::clone(&e))).await,
                    Received::Dropped(n) => reply.send(Reply::Dropped(n)).await,
                };
                if !sent {
                    return;
                }
            }
        }
        reply.send(Reply::End).await;
    });
}

/// Streams a task's live log lines until it ends (or the client leaves).
async fn stream_log(reply: &Replier, mut live: tokio::sync::broadcast::Receiver<Option<LogLine>>) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let Some(received) = reply.until_gone(live.recv()).await else {
            return;
        };
        let sent = match received {
            Ok(Some(line)) => reply.send(Reply::Log(line)).await,
            Ok(None) | Err(RecvError::Closed) => return,
            Err(RecvError::Lagged(n)) => reply.send(Reply::Dropped(n)).await,
        };
        if !sent {
            return;
        }
    }
}
