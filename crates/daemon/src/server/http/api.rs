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
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use taskhost_core::supervisor::{Event, TaskId, TaskRef};

use super::Http;
use super::answers::{ErrorJson, TaskDetailJson};
use crate::backend::{Backend, Item, Items, SlotRuled};
use crate::service::json::{self, JsonResult};
use crate::service::namespace::View;
use crate::wire::protocol::{ErrorKind, EventFilter, SlotRuleVerb, TaskFilter, TaskPage};

/// Reads a JSON body as `T`. A number with a zero fraction (`2.0`) is
/// taken where a whole number is (JSON Schema counts it as an integer).
pub(super) fn read_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> serde_json::Result<T> {
    let mut value: serde_json::Value = serde_json::from_slice(body)?;
    whole_numbers(&mut value);
    serde_json::from_value(value)
}

fn whole_numbers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && (-9.0e15..=9.0e15).contains(&f) {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

/// An error answer: `{"error": message}`.
pub(super) fn error(status: StatusCode, message: String) -> Response {
    (status, Json(ErrorJson { error: message })).into_response()
}

/// The query of `GET /api/tasks`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(super) struct TasksQuery {
    /// With finished tasks (as `host ps --all`; implied by `outcome`).
    #[serde(default)]
    all: bool,
    /// Only tasks in this state: `queued`, `waiting`, `running`, `stopping` or `finished`.
    #[schemars(extend("enum" = ["queued", "running", "waiting", "backing-off", "throttled", "stopping", "finishing", "finished"]))]
    state: Option<String>,
    /// Only tasks whose slot matches this glob (`*`, `?`).
    slot: Option<String>,
    /// Only tasks whose name matches this glob.
    name: Option<String>,
    /// Only tasks of this plugin (its name, or the start of its SHA-256).
    plugin: Option<String>,
    /// Only finished tasks that ended so.
    #[schemars(extend("enum" = crate::service::json::OUTCOMES))]
    outcome: Option<String>,
    /// Only tasks submitted at or after this time: RFC 3339, or a
    /// duration ago (`2h`).
    #[schemars(regex(pattern = crate::server::http::bulk::TIME))]
    since: Option<String>,
    /// Only tasks submitted before this time, written as `since`.
    #[schemars(regex(pattern = crate::server::http::bulk::TIME))]
    until: Option<String>,
    /// At most this many, newest first.
    limit: Option<u32>,
    /// Only tasks with a smaller id: the last id of the page before.
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
            || self.since.is_some()
            || self.until.is_some()
            || self.limit.is_some()
            || self.before.is_some();
        if !paged {
            return Ok(None);
        }
        let filter = TaskFilter::of([
            ("state", self.state),
            ("slot", self.slot),
            ("name", self.name),
            ("plugin", self.plugin),
            ("outcome", self.outcome),
            ("since", self.since),
            ("until", self.until),
        ])?;
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
        Ok(rows) => Json(rows.iter().map(json::task_row).collect::<Vec<_>>()).into_response(),
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
            Json(slots.collect::<Vec<_>>()).into_response()
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
        Ok(d) => Json(TaskDetailJson {
            id: d.id.get(),
            name: d.name.to_string(),
            slot: d.slot.to_string(),
            plugin: d.plugin.to_string(),
            row: d.row.as_ref().map(json::task_row),
            outcome: d.report.as_deref().map(JsonResult::new),
            attempts: TaskDetailJson::attempts(d.report.as_deref()),
            log: &d.log,
        })
        .into_response(),
        Err(answer) => failed(answer),
    }
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

/// The query of `GET /api/events`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
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
