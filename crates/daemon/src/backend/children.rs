//! Owns child tasks as the daemon serves them (`taskhost:plugin/children`):
//! a spawn is a submission through the backend like any other, with the
//! parent's grants (never more), named after it, and an idempotency key
//! made of the parent's id and the child's key, so that a parent retried
//! after a crash finds the children it started instead of starting them
//! again; a wait is the child's outcome, for its parent only; a parent that
//! ends canceled or force-aborted has its unfinished children stopped.
//!
//! It also bounds trees, so that no spawning plugin can wedge the daemon:
//! a parent waits parked (its permit given back, its instance kept), and
//! at most `max_parked` tasks of this run are parents at once; a child is
//! at most `max_depth` deep; one root has at most `max_descendants`
//! unfinished descendants (counted here for one host, checked in the
//! admission's transaction in a cluster). Each refusal is the guest's
//! error, naming the setting.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock, Weak};

use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::{TaskId, TaskRef};
use taskhost_runtime::children::{
    ChildFuture, ChildOutcome, ChildSpec, ChildStatus, ChildTasks, Parent, WaitError,
};

use crate::backend::Backend;
use crate::backend::daemon::Daemon;
use crate::backend::submit::Accepted;
use crate::service::namespace::{Ns, View, bare};
use crate::service::trees::Trees;
use crate::wire::protocol::SubmitRequest;

/// The runtime's way to the daemon for spawns and waits; cheap to clone.
#[derive(Default, Clone)]
pub(crate) struct Children {
    daemon: Arc<OnceLock<Weak<Daemon>>>,
    trees: Trees,
}

impl Children {
    /// Spawns and waits over these trees (the daemon's own).
    pub(crate) fn new(trees: Trees) -> Self {
        Self {
            daemon: Arc::default(),
            trees,
        }
    }

    /// The trees it counts in (the daemon's own).
    pub(crate) fn trees(&self) -> Trees {
        self.trees.clone()
    }

    /// Lets spawns reach the daemon (set once it exists; a spawn before
    /// that fails).
    pub(crate) fn attach(&self, daemon: &Arc<Daemon>) {
        let _ = self.daemon.set(Arc::downgrade(daemon));
    }

    fn links(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, HashSet<u64>>> {
        self.trees.links()
    }
}

/// The request of a child of `parent`: its grants, its key.
fn request(parent: &Parent, spec: ChildSpec) -> SubmitRequest {
    let grants = &parent.sandbox;
    let mut request = SubmitRequest::new(spec.plugin.unwrap_or(parent.plugin));
    // Resolved to its version's digest where every submission's is.
    request.deployment = spec.deployment;
    request.name = Some(
        spec.name
            .unwrap_or_else(|| format!("{}.{}", bare(&parent.name), spec.key)),
    );
    request.slot = spec.slot;
    request.params = spec.params;
    request.input = spec.input;
    request.max_memory = Some(grants.max_memory);
    request.dirs = grants.dirs.clone();
    request.env = grants.env.clone();
    request.secrets = grants.secrets.clone();
    request.config = grants.config.clone();
    request.kv = grants.kv.clone();
    request.allow_http = grants.http.clone();
    request.idempotency_key = Some(format!("child:{}:{}", parent.task, spec.key));
    request.parent = Some(parent.task);
    request
}

fn status(outcome: &TaskOutcome) -> ChildOutcome {
    let (status, output, reason) = match outcome {
        TaskOutcome::Completed { output } => {
            (ChildStatus::Completed, output.clone(), String::new())
        }
        TaskOutcome::Failed { reason, .. } => (ChildStatus::Failed, Vec::new(), reason.clone()),
        TaskOutcome::Fatal { reason, .. } => (ChildStatus::Fatal, Vec::new(), reason.clone()),
        TaskOutcome::Canceled => (ChildStatus::Canceled, Vec::new(), "canceled".into()),
        TaskOutcome::ForceAborted => (
            ChildStatus::ForceAborted,
            Vec::new(),
            "force-aborted".into(),
        ),
        TaskOutcome::Rejected { reason, .. } => (ChildStatus::Rejected, Vec::new(), reason.clone()),
        TaskOutcome::Panicked { reason } => (ChildStatus::Panicked, Vec::new(), reason.clone()),
    };
    ChildOutcome {
        status,
        output,
        reason,
    }
}

impl ChildTasks for Children {
    fn spawn(&self, parent: &Parent, spec: ChildSpec) -> ChildFuture<Result<u64, String>> {
        let this = self.clone();
        let parent_id = parent.task;
        let parent_name = parent.name.clone();
        let key = spec.key.clone();
        let mut request = request(parent, spec);
        Box::pin(async move {
            let daemon = this
                .daemon
                .get()
                .and_then(Weak::upgrade)
                .ok_or("the daemon is not taking work")?;
            let settings = &daemon.config;
            let (root, depth) = lineage(&daemon, parent_id).await?;
            let depth = depth.saturating_add(1);
            if depth > settings.max_depth {
                return Err(format!(
                    "child `{key}` would be at depth {depth} of the tree of task {root}, deeper \
                     than this daemon allows (--max-depth {}, max_depth)",
                    settings.max_depth
                ));
            }
            request.root = Some(root);
            request.depth = depth;
            // A new parent takes a parking place first (it may wait parked
            // for this child); one that already has children holds one.
            let new_parent = {
                let mut links = this.links();
                if links.contains_key(&parent_id) {
                    false
                } else if links.len() >= settings.max_parked {
                    return Err(format!(
                        "{} tasks are already parents that may wait parked for their \
                         children, the most this daemon allows (--max-parked {}, max_parked): \
                         wait for some to finish, or raise it",
                        links.len(),
                        settings.max_parked
                    ));
                } else {
                    links.insert(parent_id, HashSet::new());
                    true
                }
            };
            // A child is of its parent's namespace, within its quotas.
            let backend = Backend::within(&daemon, View::of(Ns::of(&parent_name)));
            let submitted = async {
                match backend.submit(request).await.map_err(|e| e.to_string())? {
                    Accepted::Now(s) => Ok(s),
                    Accepted::Later(durable) | Accepted::Deciding(durable) => {
                        durable.await.map_err(|e| e.to_string())
                    }
                }
            }
            .await;
            let submitted = match submitted {
                Ok(submitted) => submitted,
                Err(reason) => {
                    if new_parent {
                        let mut links = this.links();
                        if links.get(&parent_id).is_some_and(HashSet::is_empty) {
                            links.remove(&parent_id);
                        }
                    }
                    return Err(reason);
                }
            };
            let child = submitted.id.get();
            this.links().entry(parent_id).or_default().insert(child);
            if new_parent {
                tokio::spawn(cascade(
                    Arc::downgrade(&daemon),
                    this.trees.clone(),
                    parent_id,
                ));
            }
            Ok(child)
        })
    }

    fn wait(&self, parent: u64, child: u64) -> ChildFuture<Result<ChildOutcome, WaitError>> {
        let this = self.clone();
        Box::pin(async move {
            let known = this
                .links()
                .get(&parent)
                .is_some_and(|c| c.contains(&child));
            if !known {
                return Err(WaitError::UnknownChild);
            }
            let daemon = this
                .daemon
                .get()
                .and_then(Weak::upgrade)
                .ok_or(WaitError::UnknownChild)?;
            let backend = Backend::daemon_wide(&daemon);
            let found = backend
                .find(&TaskRef::Id(TaskId::from_u64(child)))
                .await
                .map_err(|_| WaitError::UnknownChild)?;
            let outcome = backend.outcome(&found);
            drop(daemon);
            match outcome.await {
                Ok(report) => Ok(status(&report.outcome)),
                Err(e) => Ok(ChildOutcome {
                    status: ChildStatus::Panicked,
                    output: Vec::new(),
                    reason: e.to_string(),
                }),
            }
        })
    }
}

/// The root of `parent`'s tree and its depth there: its own request's
/// (a task nobody spawned is its own root, at depth 0).
async fn lineage(daemon: &Arc<Daemon>, parent: u64) -> Result<(u64, u32), String> {
    let id = TaskId::from_u64(parent);
    let of = |request: &SubmitRequest| (request.root.unwrap_or(parent), request.depth);
    if let Some(request) = daemon.tasks.get(id).and_then(|r| r.request) {
        return Ok(of(&request));
    }
    let backend = Backend::daemon_wide(daemon);
    let found = backend
        .find(&TaskRef::Id(id))
        .await
        .map_err(|e| e.to_string())?;
    let request = backend
        .request_of(&found)
        .await
        .map_err(|m| format!("cannot read the spawning task's place in its tree: {m}"))?;
    Ok(of(&request))
}

/// Waits for `parent`'s outcome; if it was canceled or force-aborted,
/// stops each of its children that has not ended. Then forgets them.
async fn cascade(daemon: Weak<Daemon>, trees: Trees, parent: u64) {
    let outcome = {
        let Some(daemon) = daemon.upgrade() else {
            return;
        };
        let backend = Backend::daemon_wide(&daemon);
        match backend.find(&TaskRef::Id(TaskId::from_u64(parent))).await {
            Ok(found) => backend.outcome(&found),
            Err(_) => return,
        }
    };
    let ended = outcome.await;
    let kids = trees.links().remove(&parent).unwrap_or_default();
    let canceled = matches!(
        ended.as_deref().map(|r| &r.outcome),
        Ok(TaskOutcome::Canceled | TaskOutcome::ForceAborted)
    );
    if !canceled {
        return;
    }
    let Some(daemon) = daemon.upgrade() else {
        return;
    };
    let backend = Backend::daemon_wide(&daemon);
    for child in kids {
        if let Ok(found) = backend.find(&TaskRef::Id(TaskId::from_u64(child))).await {
            let _ = backend.stop(&found).await;
        }
    }
}
