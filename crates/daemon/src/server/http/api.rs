//! Owns the JSON endpoints and the event stream of the HTTP listener. Each
//! reads what `dispatch` reads for the same socket request (`ps`, `slots`,
//! a task's report and log, `events --follow`) and answers in the CLI's
//! `--json` shapes; cancel and remove make the same stop claim.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use taskhost_core::controller::SlotView;
use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, EventStream, Received, TaskRef, TaskReport};

use super::Http;
use crate::server::connection::{LocalReplies, Replier};
use crate::server::dispatch::{self, Found};
use crate::service::json::{self, JsonResult};
use crate::service::uploads::Uploads;
use crate::wire::protocol::{EventFilter, Reply, Request, TaskRow};

/// An error answer: `{"error": message}`.
pub(super) fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

fn not_found(target: &TaskRef) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no task with {target} (see `host ps --all`)"),
    )
}

#[derive(Debug, Deserialize)]
pub(super) struct TasksQuery {
    #[serde(default)]
    all: bool,
}

/// `GET /api/tasks[?all=true]`: the rows of `host ps --json` (`--all`).
pub(super) async fn tasks(State(http): State<Http>, Query(q): Query<TasksQuery>) -> Response {
    if http.daemon.cluster.is_some() {
        let rows = pages(&http, Request::List { all: q.all }, |r| match r {
            Reply::Tasks(page) => Ok(page),
            other => Err(Box::new(other)),
        });
        return match rows.await {
            Ok(rows) => {
                Json(Value::Array(rows.iter().map(json::task_row).collect())).into_response()
            }
            Err(answer) => answer,
        };
    }
    let daemon = Arc::clone(&http.daemon);
    // With `all`, the store is read: off the async workers.
    let rows = tokio::task::spawn_blocking(move || dispatch::task_rows(&daemon, q.all))
        .await
        .unwrap_or_default();
    Json(Value::Array(rows.iter().map(json::task_row).collect())).into_response()
}

/// `GET /api/slots`: the slots of `host slots --json`.
pub(super) async fn slots(State(http): State<Http>) -> Response {
    if http.daemon.cluster.is_some() {
        let slots = pages(&http, Request::Slots, |r| match r {
            Reply::Slots(page) => Ok(page),
            other => Err(Box::new(other)),
        });
        return match slots.await {
            Ok(slots) => {
                let slots: Vec<SlotView> = slots;
                Json(Value::Array(slots.iter().map(json::slot).collect())).into_response()
            }
            Err(answer) => answer,
        };
    }
    let slots = http.daemon.controller.snapshot();
    Json(Value::Array(slots.iter().map(json::slot).collect())).into_response()
}

/// `GET /api/tasks/{id|name}`: the task's `ps` row while it is live, its
/// attempts, its log lines and (once recorded) its result as `host wait
/// --json` prints it.
pub(super) async fn task(State(http): State<Http>, Path(task): Path<String>) -> Response {
    let target = TaskRef::parse(&task);
    if http.daemon.cluster.is_some() {
        return cluster_task(&http, &target).await;
    }
    let found = find(&http, &target).await;
    let body = match found {
        None => return not_found(&target),
        Some(Found::Live(record)) => {
            let row = dispatch::task_rows(&http.daemon, false)
                .into_iter()
                .find(|r| r.id == record.id);
            detail(
                json!({ "id": record.id, "name": record.name, "slot": record.slot, "plugin": record.plugin }),
                row.as_ref().map(json::task_row),
                record.outcome.get().as_deref(),
                &record.log.lines(),
            )
        }
        Some(Found::Stored(finished)) => detail(
            json!({ "id": finished.report.id, "name": finished.report.name,
                    "slot": finished.report.slot, "plugin": finished.plugin }),
            None,
            Some(&finished.report),
            &finished.log,
        ),
    };
    Json(body).into_response()
}

fn detail(
    mut head: Value,
    row: Option<Value>,
    report: Option<&TaskReport>,
    log: &[LogLine],
) -> Value {
    let attempts: Vec<Value> = report
        .map(|r| {
            r.history
                .iter()
                .map(|a| json!({ "attempt": a.attempt, "result": a.result, "duration_ms": a.duration.as_millis() as u64 }))
                .collect()
        })
        .unwrap_or_default();
    if let Value::Object(fields) = &mut head {
        fields.insert("row".into(), row.unwrap_or(Value::Null));
        fields.insert(
            "outcome".into(),
            report.map_or(Value::Null, |r| JsonResult::new(r).to_value()),
        );
        fields.insert("attempts".into(), Value::Array(attempts));
        fields.insert(
            "log".into(),
            serde_json::to_value(log).unwrap_or(Value::Array(Vec::new())),
        );
    }
    head
}

/// `POST /api/tasks/{id|name}/cancel`: stops the task (queued work is
/// removed) and answers once it has ended, as `host cancel --json`.
pub(super) async fn cancel(State(http): State<Http>, Path(task): Path<String>) -> Response {
    stop(&http, &task, true).await
}

/// `POST /api/tasks/{id|name}/remove`: asks the task to stop and answers
/// at once, as `host remove --json`.
pub(super) async fn remove(State(http): State<Http>, Path(task): Path<String>) -> Response {
    stop(&http, &task, false).await
}

/// The task a target names (the store is read off the async workers).
async fn find(http: &Http, target: &TaskRef) -> Option<Found> {
    let daemon = Arc::clone(&http.daemon);
    let target = target.clone();
    tokio::task::spawn_blocking(move || dispatch::find(&daemon, &target))
        .await
        .ok()
        .flatten()
}

async fn stop(http: &Http, task: &str, wait: bool) -> Response {
    let target = TaskRef::parse(task);
    if http.daemon.cluster.is_some() {
        let mut replies = ask(http, Request::Cancel { target, wait }).await;
        return match replies.next().await {
            Some(Reply::Canceled { claimed, report }) => {
                Json(json::canceled(claimed, report.as_ref())).into_response()
            }
            other => failed(other),
        };
    }
    let found = find(http, &target).await;
    let record = match found {
        None => return not_found(&target),
        Some(Found::Stored(finished)) => {
            let report = wait.then_some(&finished.report);
            return Json(json::canceled(false, report)).into_response();
        }
        Some(Found::Live(record)) => record,
    };
    let claimed = dispatch::claim_stop(&http.daemon, &record);
    if !wait {
        return Json(json::canceled(claimed, None)).into_response();
    }
    let report = record.outcome.report().await;
    Json(json::canceled(claimed, Some(&report))).into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    /// Only this task's events (id or name).
    task: Option<String>,
}

/// `GET /api/events[?task=ID|NAME]`: server-sent events: the recent
/// history, then live events, with nothing between the two lost (as `host
/// events --follow`); each event's data is the JSON of `host events
/// --json`, its id the event's seq. A reader that falls behind gets a
/// `dropped` event saying how many it missed. At most `http_max_streams`
/// are open at once; one more is answered 503.
pub(super) async fn events(State(http): State<Http>, Query(q): Query<EventsQuery>) -> Response {
    // Held by the stream: given back when the response body is dropped.
    let Ok(permit) = Arc::clone(&http.streams).try_acquire_owned() else {
        let mut answer = error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} event streams are open, the most this daemon serves at once \
                 (--http-max-streams, http_max_streams): close one, or ask its operator \
                 to raise the limit",
                http.max_streams
            ),
        );
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return answer;
    };
    let filter = EventFilter {
        task: q.task.as_deref().map(TaskRef::parse),
        kinds: Vec::new(),
    };
    if http.daemon.cluster.is_some() {
        // The cluster's events, as `host events --follow` gets them (read
        // from the database as they are shipped).
        let replies = ask(
            &http,
            Request::Events {
                follow: true,
                filter,
            },
        )
        .await;
        let stream =
            futures::stream::unfold((replies, permit), |(mut replies, permit)| async move {
                match replies.next().await? {
                    Reply::Event(event) => {
                        Some((Ok::<_, Infallible>(sse(&event)), (replies, permit)))
                    }
                    _ => None,
                }
            });
        return Sse::new(stream.boxed())
            .keep_alive(KeepAlive::default())
            .into_response();
    }
    // Subscribed before the history is copied, as `dispatch` does.
    let (live, before) = http.daemon.controller.supervisor().subscribe_after();
    let recorded = http.daemon.history.up_to(before).await;
    let replay: std::collections::VecDeque<Arc<Event>> =
        recorded.into_iter().filter(|e| filter.admits(e)).collect();
    let state = Feed {
        replay,
        live,
        before,
        filter,
        metrics: Arc::clone(&http.metrics),
        _permit: permit,
    };
    let stream = futures::stream::unfold(state, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok::<_, Infallible>(event), feed))
    });
    Sse::new(stream.boxed())
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// One SSE reader's position: the replay left, then the live lane.
struct Feed {
    replay: std::collections::VecDeque<Arc<Event>>,
    live: EventStream,
    before: u64,
    filter: EventFilter,
    metrics: Arc<super::metrics::Metrics>,
    /// This stream's place among `http_max_streams`.
    _permit: OwnedSemaphorePermit,
}

impl Feed {
    async fn next(&mut self) -> Option<SseEvent> {
        if let Some(event) = self.replay.pop_front() {
            return Some(sse(&event));
        }
        loop {
            match self.live.recv().await? {
                Received::Event(e) if e.seq <= self.before || !self.filter.admits(&e) => {}
                Received::Event(e) => return Some(sse(&e)),
                Received::Dropped(n) => {
                    self.metrics.lane_dropped(n);
                    return Some(
                        SseEvent::default()
                            .event("dropped")
                            .data(json!({ "dropped": n }).to_string()),
                    );
                }
            }
        }
    }
}

fn sse(event: &Event) -> SseEvent {
    SseEvent::default()
        .id(event.seq.to_string())
        .data(event.to_json().to_string())
}

// ---------------------------------------------------------------------------
// Cluster mode: the answers are the cluster's, as a socket client gets
// them (the node's memory only knows what runs here).

/// Asks `request` as a socket client would and returns its replies.
async fn ask(http: &Http, request: Request) -> LocalReplies {
    let (reply, replies) = Replier::local();
    dispatch::handle(&http.daemon, request, reply, &mut Uploads::default()).await;
    replies
}

/// The rows of a paged answer (`page` takes a page apart).
async fn pages<T>(
    http: &Http,
    request: Request,
    page: impl Fn(Reply) -> Result<Vec<T>, Box<Reply>>,
) -> Result<Vec<T>, Response> {
    let mut replies = ask(http, request).await;
    let mut rows = Vec::new();
    loop {
        match replies.next().await {
            Some(Reply::End) => return Ok(rows),
            Some(reply) => match page(reply) {
                Ok(more) => rows.extend(more),
                Err(other) => return Err(failed(Some(*other))),
            },
            None => return Err(failed(None)),
        }
    }
}

/// An error reply (or none) as an HTTP answer.
fn failed(reply: Option<Reply>) -> Response {
    use crate::wire::protocol::ErrorKind;
    match reply {
        Some(Reply::Error {
            kind: ErrorKind::NotFound,
            message,
        }) => error(StatusCode::NOT_FOUND, message),
        Some(Reply::Error { message, .. }) => error(StatusCode::INTERNAL_SERVER_ERROR, message),
        Some(other) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected answer: {other:?}"),
        ),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is shutting down".into(),
        ),
    }
}

/// `GET /api/tasks/{id|name}` in cluster mode: the cluster's row while the
/// task is unfinished, its log lines as shipped, and its recorded result.
async fn cluster_task(http: &Http, target: &TaskRef) -> Response {
    let Some(cluster) = &http.daemon.cluster else {
        return not_found(target);
    };
    let found = match cluster.pg.resolve(target).await {
        Ok(Some(found)) => found,
        Ok(None) => return not_found(target),
        Err(err) => return error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    };
    if found.state == "finished" {
        return match cluster.pg.finished(found.id).await {
            Ok(Some(finished)) => Json(detail(
                json!({ "id": finished.report.id, "name": finished.report.name,
                        "slot": finished.report.slot, "plugin": finished.plugin }),
                None,
                Some(&finished.report),
                &finished.log,
            ))
            .into_response(),
            Ok(None) => not_found(target),
            Err(err) => error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
        };
    }
    let rows = pages(http, Request::List { all: false }, |r| match r {
        Reply::Tasks(page) => Ok(page),
        other => Err(Box::new(other)),
    });
    let rows: Vec<TaskRow> = match rows.await {
        Ok(rows) => rows,
        Err(answer) => return answer,
    };
    let Some(row) = rows.into_iter().find(|r| r.id == found.id) else {
        // Finished between the two reads: answer from the record.
        return Box::pin(cluster_task(http, &TaskRef::Id(found.id))).await;
    };
    let mut log = Vec::new();
    let mut replies = ask(
        http,
        Request::Logs {
            target: TaskRef::Id(found.id),
            follow: false,
        },
    )
    .await;
    while let Some(Reply::Log(line)) = replies.next().await {
        log.push(line);
    }
    Json(detail(
        json!({ "id": row.id, "name": row.name, "slot": row.slot, "plugin": row.plugin }),
        Some(json::task_row(&row)),
        None,
        &log,
    ))
    .into_response()
}
