//! Owns the JSON endpoints and the event stream of the HTTP listener. Each
//! reads what `dispatch` reads for the same socket request (`ps`, `slots`,
//! a task's report and log, `events --follow`) and answers in the CLI's
//! `--json` shapes; cancel and remove make the same stop claim.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::logline::LogLine;
use crate::supervisor::{Event, EventStream, Received, TaskRef, TaskReport};

use super::super::dispatch::{self, Found};
use super::super::json::{self, JsonResult};
use super::super::protocol::EventFilter;
use super::Http;

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
    let daemon = Arc::clone(&http.daemon);
    // With `all`, the store is read: off the async workers.
    let rows = tokio::task::spawn_blocking(move || dispatch::task_rows(&daemon, q.all))
        .await
        .unwrap_or_default();
    Json(Value::Array(rows.iter().map(json::task_row).collect())).into_response()
}

/// `GET /api/slots`: the slots of `host slots --json`.
pub(super) async fn slots(State(http): State<Http>) -> Response {
    let slots = http.daemon.controller.snapshot();
    Json(Value::Array(slots.iter().map(json::slot).collect())).into_response()
}

/// `GET /api/tasks/{id|name}`: the task's `ps` row while it is live, its
/// attempts, its log lines and (once recorded) its result as `host wait
/// --json` prints it.
pub(super) async fn task(State(http): State<Http>, Path(task): Path<String>) -> Response {
    let target = TaskRef::parse(&task);
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
/// `dropped` event saying how many it missed.
pub(super) async fn events(
    State(http): State<Http>,
    Query(q): Query<EventsQuery>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let filter = EventFilter {
        task: q.task.as_deref().map(TaskRef::parse),
        kinds: Vec::new(),
    };
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
    };
    let stream = futures::stream::unfold(state, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok(event), feed))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// One SSE reader's position: the replay left, then the live lane.
struct Feed {
    replay: std::collections::VecDeque<Arc<Event>>,
    live: EventStream,
    before: u64,
    filter: EventFilter,
    metrics: Arc<super::metrics::Metrics>,
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
