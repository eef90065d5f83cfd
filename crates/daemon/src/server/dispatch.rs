//! Owns what each request does. A handler runs in the order its request was
//! sent and does the part that decides (take a chunk, place a submission,
//! resolve a name, claim a stop, subscribe to a stream) before the next
//! request is read; only the part that waits (for an outcome, a stream, the
//! shutdown) goes on in a task of its own. A cluster's submissions are
//! decided by the database in batches: each is queued in order and its
//! reply follows the decision, and the next request that is not a
//! submission waits for the decisions before it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use taskhost_core::supervisor::TaskRef;
use taskhost_runtime::Digest;

use crate::backend::daemon::Daemon;
use crate::backend::submit::Accepted;
use crate::backend::{Backend, Item, Items, Namespaced, Scheduled, SlotRuled};
use crate::server::bulk;
use crate::server::connection::{Later, Replier};
use crate::server::scope::{Credential, Reach};
use crate::service::error::ServiceError;
use crate::service::kv::KvAnswer;
use crate::service::namespace::{self, Ns, View};
use crate::service::plugins;
use crate::service::uploads::Uploads;
use crate::wire::protocol::{ErrorKind, LIST_PAGE, Reply, Request, SubmitRequest};

/// What one connection's requests share: its credential and the
/// namespace it acts in, its uploads in progress, its acknowledgements
/// waiting for a commit, and its submissions the cluster is still
/// deciding.
pub(crate) struct Session {
    pub(crate) credential: Credential,
    view: View,
    /// `view` for the replies, unless it is the default namespace's alone
    /// (which shows names as they are).
    shown: Option<Arc<View>>,
    pub(crate) uploads: Uploads,
    later: Later,
    deciding: Vec<tokio::task::JoinHandle<()>>,
}

impl Session {
    pub(crate) fn new(later: Later, credential: Credential) -> Session {
        let mut session = Session {
            view: View::default(),
            shown: None,
            credential,
            uploads: Uploads::default(),
            later,
            deciding: Vec::new(),
        };
        session.set_view(View::of(session.credential.home()));
        session
    }

    fn set_view(&mut self, view: View) {
        self.shown = (view != View::default()).then(|| Arc::new(view.clone()));
        self.view = view;
    }

    /// How replies are shown to this connection now.
    pub(crate) fn shown(&self) -> Option<Arc<View>> {
        self.shown.clone()
    }
}

/// Handles one request (see the module docs for what happens in order).
pub(crate) async fn handle(
    daemon: &Arc<Daemon>,
    request: Request,
    reply: Replier,
    session: &mut Session,
) {
    if let Err(message) = request.check() {
        reply.error(ErrorKind::Invalid, message).await;
        return;
    }
    if matches!(request, Request::Submit(_) | Request::Rerun(_)) {
        session.deciding.retain(|d| !d.is_finished());
    } else {
        for decided in session.deciding.drain(..) {
            let _ = decided.await;
        }
    }
    let backend = Backend::within(daemon, session.view.clone());
    match request {
        Request::Enter(enter) => {
            let ns = Ns::named(enter.namespace.as_deref());
            let reached = session.credential.reaches(&ns) && backend.knows(&ns).await;
            if !reached {
                return reply.failed(namespace::unknown(ns.name())).await;
            }
            if enter.all && session.credential.reach != Reach::Every {
                return reply
                    .error(
                        ErrorKind::Forbidden,
                        "--all-namespaces needs a token of every namespace (a `read TOKEN *` \
                         line in the daemon's --http-token-file) or the daemon's socket",
                    )
                    .await;
            }
            session.set_view(View {
                acting: ns,
                all: enter.all,
            });
            reply.send(Reply::Done).await;
        }
        Request::Namespace(verb) => {
            match backend.namespace(verb, &session.credential.reach).await {
                Ok(Namespaced::Rows(rows)) => send_pages(&reply, rows, Reply::Namespaces).await,
                Ok(Namespaced::Row(row)) => {
                    reply.send(Reply::Namespace(row)).await;
                }
                Err(e) => reply.failed(e).await,
            }
        }
        Request::Deployment(verb) => match backend.deployment(verb).await {
            Ok(rows) => {
                reply.send(Reply::Deployments(rows)).await;
            }
            Err(e) => reply.failed(e).await,
        },
        Request::Record { target, attempt } => {
            let found = match backend.find(&target).await {
                Ok(found) => backend.record(found, attempt).await,
                Err(e) => Err(e),
            };
            match found {
                Ok(file) => {
                    for part in file.chunks(1 << 20) {
                        if !reply.send(Reply::RecordPart(part.to_vec())).await {
                            return;
                        }
                    }
                    reply.send(Reply::End).await;
                }
                Err(e) => reply.failed(e).await,
            }
        }
        Request::Download { digest, offset } => match backend.plugin_chunk(&digest, offset).await {
            Ok((total, data)) => {
                reply.send(Reply::PluginChunk { total, data }).await;
            }
            Err(e) => reply.failed(e).await,
        },
        Request::HasPlugin(digest) => {
            reply
                .send(Reply::HasPlugin(backend.has_plugin(&digest).await))
                .await;
        }
        Request::Upload {
            digest,
            offset,
            data,
            last,
        } => {
            upload(
                &backend,
                &mut session.uploads,
                digest,
                offset,
                data,
                last,
                reply,
            )
            .await
        }
        Request::Submit(request) => submit(&backend, *request, reply, session).await,
        Request::SubmitBatch(requests) => {
            let items = bulk::submit_batch(&backend, requests).await;
            reply.send(Reply::SubmittedBatch(items)).await;
        }
        Request::Rerun(target) => rerun(&backend, target, reply, session).await,
        Request::RerunMatching { filter, dry_run } => {
            match bulk::rerun_matching(&backend, &filter, dry_run).await {
                Ok(matched) => {
                    reply.send(matched).await;
                }
                Err(e) => reply.failed(e).await,
            }
        }
        Request::Schedule(verb) => match backend.schedule(verb).await {
            Ok(Scheduled::Rows(rows)) => send_pages(&reply, rows, Reply::Schedules).await,
            Ok(Scheduled::Row(row)) => {
                reply.send(Reply::Schedule(row)).await;
            }
            Ok(Scheduled::Fired(accepted)) => answer(accepted, reply, session).await,
            Err(e) => reply.failed(e).await,
        },
        Request::SlotRule(verb) => match backend.slot_rule(verb).await {
            Ok(SlotRuled::Rows(rows)) => send_pages(&reply, rows, Reply::SlotRules).await,
            Ok(SlotRuled::Row(row)) => {
                reply.send(Reply::SlotRule(row)).await;
            }
            Err(e) => reply.failed(e).await,
        },
        Request::Kv(verb) => match backend.kv(verb).await {
            Ok(KvAnswer::Rows(rows)) => send_pages(&reply, rows, Reply::KvRows).await,
            Ok(KvAnswer::Value(value)) => {
                reply.send(Reply::KvValue(value)).await;
            }
            Err(e) => reply.failed(e).await,
        },
        Request::Wait(target) => match backend.find(&target).await {
            Ok(found) => {
                let outcome = backend.outcome(&found);
                tokio::spawn(async move {
                    match reply.until_gone(outcome).await {
                        Some(Ok(report)) => {
                            reply.report(&report, Reply::Report).await;
                        }
                        Some(Err(e)) => reply.failed(e).await,
                        None => {}
                    }
                });
            }
            Err(e) => reply.failed(e).await,
        },
        Request::Cancel { target, wait } => cancel(&backend, target, wait, reply).await,
        Request::CancelMatching { filter, dry_run } => {
            match bulk::cancel_matching(&backend, &filter, dry_run).await {
                Ok(matched) => {
                    reply.send(matched).await;
                }
                Err(e) => reply.failed(e).await,
            }
        }
        Request::Page(page) => match bulk::page(&backend, &page).await {
            Ok(rows) => send_pages(&reply, rows, Reply::Tasks).await,
            Err(e) => reply.failed(e).await,
        },
        Request::List { all } => match backend.rows(all).await {
            Ok(rows) => send_pages(&reply, rows, Reply::Tasks).await,
            Err(e) => reply.failed(e).await,
        },
        Request::Plugins => match backend.plugin_rows().await {
            Ok(rows) => send_pages(&reply, rows, Reply::Plugins).await,
            Err(e) => reply.failed(e).await,
        },
        Request::RemovePlugins { prefix } => remove_plugins(daemon, &backend, prefix, reply).await,
        Request::Slots => match backend.slots().await {
            Ok(slots) => send_pages(&reply, slots, Reply::Slots).await,
            Err(e) => reply.failed(e).await,
        },
        Request::Events { follow, filter } => {
            let items = backend.events(follow, filter);
            tokio::spawn(stream_out(reply, items));
        }
        Request::Logs { target, follow } => match backend.find(&target).await {
            Ok(found) => {
                let items = backend.log(found, follow).await;
                tokio::spawn(stream_out(reply, items));
            }
            Err(e) => reply.failed(e).await,
        },
        Request::Shutdown { grace, cancel_all } => {
            let daemon = Arc::clone(daemon);
            tokio::spawn(async move {
                let report = shutdown(&daemon, grace, cancel_all).await;
                reply.send(Reply::ShutdownDone(report)).await;
            });
        }
    }
}

/// Takes one chunk of an upload; the last one stores the plugin, in order:
/// a Submit of this plugin sent right after the last chunk finds it.
async fn upload(
    backend: &Backend<'_>,
    uploads: &mut Uploads,
    digest: Digest,
    offset: u64,
    data: Vec<u8>,
    last: bool,
    reply: Replier,
) {
    match uploads.take(digest, offset, data, last) {
        Err(message) => reply.error(ErrorKind::Invalid, message).await,
        Ok(None) => {
            reply.send(Reply::Uploaded { plugin: None }).await;
        }
        Ok(Some(bytes)) => match backend.upload(digest, bytes).await {
            Ok(name) => {
                reply.send(Reply::Uploaded { plugin: Some(name) }).await;
            }
            Err(e) => reply.failed(e).await,
        },
    }
}

/// Submits a task's request again, as the user's task (not a parent's
/// child); answered as a submission.
async fn rerun(backend: &Backend<'_>, target: TaskRef, reply: Replier, session: &mut Session) {
    let found = match backend.find(&target).await {
        Ok(found) => found,
        Err(e) => return reply.failed(e).await,
    };
    match backend.request_of(&found).await {
        Ok(mut request) => {
            request.parent = None;
            request.root = None;
            request.depth = 0;
            submit(backend, request, reply, session).await
        }
        Err(e) => reply.failed(e).await,
    }
}

/// Claims a task's stop in order; with `wait`, the wait for its end goes
/// on in the background.
async fn cancel(backend: &Backend<'_>, target: TaskRef, wait: bool, reply: Replier) {
    let found = match backend.find(&target).await {
        Ok(found) => found,
        Err(e) => return reply.failed(e).await,
    };
    let claimed = match backend.stop(&found).await {
        Ok(claimed) => claimed,
        Err(e) => return reply.failed(e).await,
    };
    if !wait {
        reply
            .send(Reply::Canceled {
                claimed,
                report: None,
            })
            .await;
        return;
    }
    let outcome = backend.outcome(&found);
    tokio::spawn(async move {
        match reply.until_gone(outcome).await {
            Some(Ok(report)) => {
                reply
                    .report(&report, |report| Reply::Canceled {
                        claimed,
                        report: Some(report),
                    })
                    .await;
            }
            Some(Err(e)) => reply.failed(e).await,
            None => {}
        }
    });
}

/// Removes stored plugins: one by its digest's prefix, or (no prefix)
/// every unused one, a cluster's shared ones too (blocking file work, off
/// the async workers).
async fn remove_plugins(
    daemon: &Arc<Daemon>,
    backend: &Backend<'_>,
    prefix: Option<String>,
    reply: Replier,
) {
    if prefix.is_none()
        && let Err(e) = backend.prune_shared_plugins().await
    {
        return reply.failed(e).await;
    }
    let daemon = Arc::clone(daemon);
    let removed = tokio::task::spawn_blocking(move || {
        plugins::remove(
            daemon.plugin_users(),
            prefix.as_deref(),
            std::time::Duration::ZERO,
        )
    })
    .await
    .unwrap_or_else(|e| Err(ServiceError::Internal(e.to_string())));
    match removed {
        Ok(rows) => {
            reply.send(Reply::PluginsRemoved(rows)).await;
        }
        Err(e) => reply.failed(e).await,
    }
}

/// Places a submission (a Submit's, a Rerun's) in order; its reply follows
/// the acknowledgement.
async fn submit(
    backend: &Backend<'_>,
    request: SubmitRequest,
    reply: Replier,
    session: &mut Session,
) {
    match backend.submit(request).await {
        Ok(accepted) => answer(accepted, reply, session).await,
        Err(e) => reply.failed(e).await,
    }
}

/// Sends a submission's acknowledgement once it is durable (or decided).
async fn answer(accepted: Accepted, reply: Replier, session: &mut Session) {
    match accepted {
        Accepted::Now(submitted) => {
            reply.send(Reply::Submitted(submitted)).await;
        }
        Accepted::Later(durable) => {
            session.later.push(async move {
                match durable.await {
                    Ok(submitted) => {
                        reply.send(Reply::Submitted(submitted)).await;
                    }
                    Err(e) => reply.failed(e).await,
                }
            });
        }
        Accepted::Deciding(decided) => {
            session.deciding.push(tokio::spawn(async move {
                match decided.await {
                    Ok(submitted) => {
                        reply.send(Reply::Submitted(submitted)).await;
                    }
                    Err(e) => reply.failed(e).await,
                }
            }));
        }
    }
}

/// Shuts the daemon down (the socket's `Shutdown`, the HTTP API's): stops
/// taking work, gives running tasks the grace, and answers once the store
/// is closed and the state directory free, so a `host serve` right after
/// `host shutdown` finds it free.
pub(crate) async fn shutdown(
    daemon: &Arc<Daemon>,
    grace: Option<std::time::Duration>,
    cancel_all: bool,
) -> taskhost_core::supervisor::ShutdownReport {
    let backend = Backend::of(daemon);
    daemon.shutdown_requested.store(true, Ordering::SeqCst);
    daemon
        .keep_unfinished
        .store(backend.is_durable() && !cancel_all, Ordering::SeqCst);
    backend.stop_taking();
    let grace = grace.unwrap_or(daemon.config.grace);
    let report = daemon.controller.shutdown(grace).await;
    // The accept loop finishes the stop (it reuses the same report).
    let mut closed = daemon.closed.subscribe();
    let _ = daemon.stop.send(Some(grace));
    let _ = closed.wait_for(|closed| *closed).await;
    report
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

/// Sends a streaming answer's items, then [`Reply::End`] (or the error
/// that ended it); stops when the client goes away.
async fn stream_out(reply: Replier, mut items: Items) {
    loop {
        let Some(next) = reply.until_gone(items.recv()).await else {
            return;
        };
        let sent = match next {
            None => break,
            Some(Item::Log(line)) => reply.send(Reply::Log(line)).await,
            Some(Item::Event(event)) => reply.send(Reply::Event(*event)).await,
            Some(Item::Dropped(n)) => reply.send(Reply::Dropped(n)).await,
            Some(Item::Failed(message)) => {
                reply.error(ErrorKind::Internal, message).await;
                return;
            }
        };
        if !sent {
            return;
        }
    }
    reply.send(Reply::End).await;
}
