//! What a request over many tasks does: a batch of submissions, each
//! placed as it would be alone, and the verbs by filter (cancel, rerun),
//! each task acted on as a verb of its id would.

use taskhost_core::supervisor::{TaskId, TaskRef};

use crate::backend::Backend;
use crate::backend::submit::Accepted;
use crate::service::error::ServiceError;
use crate::wire::protocol::{
    BatchItem, LIST_PAGE, Reply, SubmitRequest, TaskFilter, TaskPage, TaskRow, TaskState,
    check_submission,
};

/// Stops every live task `filter` admits, each as one Cancel would (its
/// stop claimed once, whoever asks), without waiting for their ends; with
/// `dry_run`, only counts them.
pub(crate) async fn cancel_matching(
    backend: &Backend<'_>,
    filter: &TaskFilter,
    dry_run: bool,
) -> Result<Reply, ServiceError> {
    let mut rows: Vec<TaskRow> = backend.rows(false).await?;
    rows.retain(|row| filter.admits(row));
    let stopped = if dry_run {
        0
    } else {
        backend.stop_all(&rows).await?
    };
    let mut ids: Vec<TaskId> = rows.iter().map(|row| row.id).collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    Ok(Reply::Matched {
        count: ids.len() as u64,
        ids: ids.into_iter().take(LIST_PAGE).collect(),
        acted: stopped,
    })
}

/// Places a batch's submissions in order, each as a Submit alone (its
/// checks, its key, the admission rules), then answers each once the
/// accepted ones are durable: the store's writer commits what was queued
/// together, so a batch takes one commit or few.
pub(crate) async fn submit_batch(
    backend: &Backend<'_>,
    requests: Vec<SubmitRequest>,
) -> Vec<BatchItem> {
    let mut placed = Vec::with_capacity(requests.len());
    for request in requests {
        let answer = match check_submission(&request) {
            Err(message) => Err(ServiceError::Invalid(message)),
            Ok(()) => backend.submit(request).await,
        };
        placed.push(answer);
    }
    let mut items = Vec::with_capacity(placed.len());
    for answer in placed {
        let submitted = match answer {
            Ok(Accepted::Now(submitted)) => Ok(submitted),
            Ok(Accepted::Later(durable) | Accepted::Deciding(durable)) => durable.await,
            Err(e) => Err(e),
        };
        items.push(match submitted {
            Ok(submitted) => BatchItem::Submitted(submitted),
            Err(e) => {
                let (kind, message) = e.into();
                BatchItem::Refused { kind, message }
            }
        });
    }
    items
}

/// One page of the tasks `page` asks for: the ones its filter admits,
/// newest first, older than its cursor, at most its limit.
pub(crate) async fn page(
    backend: &Backend<'_>,
    page: &TaskPage,
) -> Result<Vec<TaskRow>, ServiceError> {
    backend.page(page).await
}

/// Submits again the request of every finished task `filter` admits
/// (among those the daemon remembers, as `host ps --all` lists them), each
/// as a rerun of its id would, oldest first, as one batch; with `dry_run`,
/// only counts them.
pub(crate) async fn rerun_matching(
    backend: &Backend<'_>,
    filter: &TaskFilter,
    dry_run: bool,
) -> Result<Reply, ServiceError> {
    let mut ids: Vec<TaskId> = backend
        .rows(true)
        .await?
        .iter()
        .filter(|row| row.state == TaskState::Finished && filter.admits(row))
        .map(|row| row.id)
        .collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    let mut acted = 0;
    if !dry_run {
        let mut requests = Vec::with_capacity(ids.len());
        for id in ids.iter().rev() {
            let Ok(found) = backend.find(&TaskRef::Id(*id)).await else {
                continue;
            };
            if let Ok(mut request) = backend.request_of(&found).await {
                request.parent = None;
                request.root = None;
                request.depth = 0;
                requests.push(request);
            }
        }
        for chunk in requests.chunks(crate::wire::protocol::MAX_BATCH) {
            acted += submit_batch(backend, chunk.to_vec())
                .await
                .iter()
                .filter(|item| matches!(item, BatchItem::Submitted(_)))
                .count() as u64;
        }
    }
    Ok(Reply::Matched {
        count: ids.len() as u64,
        ids: ids.into_iter().take(LIST_PAGE).collect(),
        acted,
    })
}
