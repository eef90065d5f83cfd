//! Owns the JSON endpoints and the event stream of the HTTP listener. Each
//! reads what `dispatch` reads for the same socket request (`ps`, `slots`,
//! a task's report and log, `events --follow`) and answers in the CLI's
//! `--json` shapes; cancel and remove make the same stop claim.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, TaskId, TaskRef, TaskReport};

use super::Http;
use crate::backend::{Backend, Item, Items, SlotRuled};
use crate::service::json::{self, JsonResult};
use crate::service::namespace::View;
use crate::wire::protocol::{ErrorKind, EventFilter, SlotRuleVerb, TaskFilter, TaskPage};

/// An error answer: `{"error": message}`.
pub(super) fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct TasksQuery {
    #[serde(default)]
    all: bool,
    state: Option<String>,
    slot: Option<String>,
    name: Option<String>,
    plugin: Option<String>,
    outcome: Option<String>,
    limit: Option<u32>,
    before: Option<u64>,
}

impl TasksQuery {
    /// The page it asks for, when it asks for one (a filter, a limit or a
    /// cursor); the words checked.
    fn page(self) -> Result<Option<TaskPage>, String> {
        let paged = self.state.is_some()
            || self.slot.is_some()
            || self.name.is_some()
            || self.plugin.is_some()
            || self.outcome.is_some()
            || self.limit.is_some()
            || self.before.is_some();
        if !paged {
            return Ok(None);
        }
        let mut filter = TaskFilter::default();
        for (key, value) in [
            ("state", self.state),
            ("slot", self.slot),
            ("name", self.name),
            ("plugin", self.plugin),
            ("outcome", self.outcome),
        ] {
            if let Some(value) = value {
                filter.set(key, &value)?;
            }
        }
        Ok(Some(TaskPage {
            all: self.all,
            filter,
            before: self.before.map(TaskId::from_u64),
            limit: self.limit,
        }))
    }
}

/// `GET /api/tasks[?all=true]`: the rows of `host ps --json` (`--all`);
/// with a filter (`state`, `slot`, `name`, `plugin`, `outcome`), `limit` or
/// `before` (an id: the cursor), one page of them, newest first.
pub(super) async fn tasks(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Query(q): Query<TasksQuery>,
) -> Response {
    let all = q.all;
    let page = match q.page() {
        Ok(page) => page,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let backend = Backend::within(&http.daemon, view.clone());
    let rows = match &page {
        Some(page) => crate::server::bulk::page(&backend, page).await,
        None => backend.rows(all).await,
    };
    match rows {
        Ok(rows) => Json(Value::Array(rows.iter().map(json::task_row).collect())).into_response(),
        Err(answer) => failed(answer),
    }
}

/// `GET /api/slots`: the slots of `host slots --json`, each with the rate
/// its rule sets (`rate`, `burst`; null without one).
pub(super) async fn slots(State(http): State<Http>, Extension(view): Extension<View>) -> Response {
    match Backend::within(&http.daemon, view.clone()).slots().await {
        Ok(slots) => {
            // The rules as `host slot ls` lists them (a cluster's, from its
            // database), as `host slots --json` reads them too.
            let rules = match Backend::within(&http.daemon, view.clone())
                .slot_rule(SlotRuleVerb::List)
                .await
            {
                Ok(SlotRuled::Rows(rows)) => json::rules_of(rows),
                _ => Default::default(),
            };
            let slots = slots.iter().map(|s| json::slot_with_rule(s, &rules));
            Json(Value::Array(slots.collect())).into_response()
        }
        Err(answer) => failed(answer),
    }
}

/// `GET /api/tasks/{id|name}`: the task's `ps` row while it is live, its
/// attempts, its log lines and (once recorded) its result as `host wait
/// --json` prints it.
pub(super) async fn task(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
) -> Response {
    let target = TaskRef::parse(&task);
    let backend = Backend::within(&http.daemon, view.clone());
    let found = match backend.find(&target).await {
        Ok(found) => found,
        Err(answer) => return failed(answer),
    };
    match backend.detail(found).await {
        Ok(d) => Json(detail(
            json!({ "id": d.id, "name": d.name, "slot": d.slot, "plugin": d.plugin }),
            d.row.as_ref().map(json::task_row),
            d.report.as_deref(),
            &d.log,
        ))
        .into_response(),
        Err(answer) => failed(answer),
    }
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
pub(super) async fn cancel(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
) -> Response {
    stop(&http, &view, &task, true).await
}

/// `POST /api/tasks/{id|name}/remove`: asks the task to stop and answers
/// at once, as `host remove --json`.
pub(super) async fn remove(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
) -> Response {
    stop(&http, &view, &task, false).await
}

async fn stop(http: &Http, view: &View, task: &str, wait: bool) -> Response {
    let target = TaskRef::parse(task);
    let backend = Backend::within(&http.daemon, view.clone());
    let found = match backend.find(&target).await {
        Ok(found) => found,
        Err(answer) => return failed(answer),
    };
    let claimed = match backend.stop(&found).await {
        Ok(claimed) => claimed,
        Err(answer) => return failed(answer),
    };
    if !wait {
        return Json(json::canceled(claimed, None)).into_response();
    }
    match backend.outcome(&found).await {
        Ok(report) => Json(json::canceled(claimed, Some(&report))).into_response(),
        Err(answer) => failed(answer),
    }
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
pub(super) async fn events(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Query(q): Query<EventsQuery>,
) -> Response {
    // Held by the stream: given back when the response body is dropped.
    let Ok(permit) = Arc::clone(&http.streams).try_acquire_owned() else {
        return too_many_streams(&http);
    };
    let filter = EventFilter {
        task: q.task.as_deref().map(TaskRef::parse),
        kinds: Vec::new(),
    };
    let feed = Feed {
        items: Backend::within(&http.daemon, view.clone()).events(true, filter),
        view,
        metrics: Arc::clone(&http.metrics),
        _permit: permit,
    };
    let stream = futures::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok::<_, Infallible>(event), feed))
    });
    Sse::new(
        stream
            .take_until(http.stop.clone().cancelled_owned())
            .boxed(),
    )
    .keep_alive(KeepAlive::default())
    .into_response()
}

/// One SSE reader's stream of `host events --follow`.
struct Feed {
    items: Items,
    /// How its events are shown.
    view: View,
    metrics: Arc<super::metrics::Metrics>,
    /// This stream's place among `http_max_streams`.
    _permit: OwnedSemaphorePermit,
}

impl Feed {
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            match self.items.recv().await? {
                Item::Event(e) if self.view == View::default() => return Some(sse(&e)),
                Item::Event(e) => return Some(sse(&crate::server::view::event(&self.view, *e))),
                Item::Dropped(n) => {
                    self.metrics.lane_dropped(n);
                    return Some(
                        SseEvent::default()
                            .event("dropped")
                            .data(json!({ "dropped": n }).to_string()),
                    );
                }
                Item::Log(_) => {}
                Item::Failed(_) => return None,
            }
        }
    }
}

fn sse(event: &Event) -> SseEvent {
    SseEvent::default()
        .id(event.seq.to_string())
        .data(event.to_json().to_string())
}

/// The answer to one stream more than `http_max_streams`.
pub(super) fn too_many_streams(http: &Http) -> Response {
    let mut answer = error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "{} streams are open, the most this daemon serves at once \
             (--http-max-streams, http_max_streams): close one, or ask its operator \
             to raise the limit",
            http.max_streams
        ),
    );
    answer
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    answer
}

/// An error of the seam as an HTTP answer.
pub(super) fn failed(failure: impl Into<(ErrorKind, String)>) -> Response {
    let (kind, message) = failure.into();
    let status = match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::OverQuota => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, message)
}
