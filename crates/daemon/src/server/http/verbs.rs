//! Owns the HTTP API's verbs beyond the reads of `api.rs`: plugin upload by
//! digest, submit, wait (a long poll), logs (and following them), plugins,
//! version and shutdown. Each calls what the socket's `dispatch` calls for
//! the same request, with the same checks and the same wording, and
//! answers in the CLI's `--json` shapes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use taskhost_core::supervisor::{TaskRef, TaskReport};
use taskhost_core::units::parse_duration;
use taskhost_runtime::Digest;

use super::Http;
use super::answers::{PendingJson, StoredJson, VersionJson};
use super::api::{error, failed};
use crate::backend::submit::Accepted;
use crate::backend::{Backend, Item, Scheduled};
use crate::server::{bulk, dispatch};
use crate::service::error::ServiceError;
use crate::service::json::{self, JsonResult};
use crate::service::namespace::View;
use crate::service::plugins;
use crate::wire::protocol::{
    MAX_BATCH, MAX_SUBMIT_INPUT, MAX_WIRE_DURATION, Placement, Request, ScheduleSpec, ScheduleVerb,
    SubmitJson, SubmitRequest,
};

/// The largest plugin a `PUT /api/plugins/{sha256}` takes.
pub(super) const MAX_PLUGIN_BYTES: usize = 256 << 20;
/// The largest `POST /api/tasks` body: an input of the most a submission
/// carries, in base64, with room for the rest.
pub(super) const MAX_SUBMIT_BODY: usize = MAX_SUBMIT_INPUT / 3 * 4 + (1 << 20);

/// `PUT /api/plugins/{sha256}`: stores the body as the plugin of that
/// digest (compiled, as an upload through the socket is); a no-op when the
/// daemon has it. Answers `{"digest", "name"}`.
pub(super) async fn put_plugin(
    State(http): State<Http>,
    Path(digest): Path<String>,
    body: Bytes,
) -> Response {
    let digest: Digest = match digest.parse() {
        Ok(d) => d,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "`{digest}` is not a plugin digest ({e}): the path names the SHA-256 of the bytes, in hex"
                ),
            );
        }
    };
    // The bytes first: only who holds a plugin learns that it is stored.
    let actual = Digest::of(&body);
    if actual != digest {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "the body's SHA-256 is {actual}, not {digest}: upload the plugin's own bytes to its digest"
            ),
        );
    }
    let backend = Backend::of(&http.daemon);
    if backend.has_plugin(&digest).await {
        return Json(StoredJson {
            digest: digest.to_string(),
            name: None,
            stored: false,
        })
        .into_response();
    }
    match backend.upload(digest, body.to_vec()).await {
        Ok(name) => Json(StoredJson {
            digest: digest.to_string(),
            name: Some(name),
            stored: true,
        })
        .into_response(),
        Err(answer) => failed(answer),
    }
}

/// The JSON of `POST /api/schedules`: the flags of `host schedule add`,
/// with what each firing submits as `task` (the body of `POST /api/tasks`,
/// without a name, delay or idempotency key).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ScheduleBody {
    /// Its name: letters, digits, `-`, `_`, `.` or `/`, not all digits.
    #[schemars(length(min = 1, max = crate::schedule::MAX_NAME), regex(pattern = SCHEDULE_NAME))]
    name: String,
    /// When it fires: 5 cron fields (minute hour day-of-month month
    /// day-of-week), 6 with seconds first, or a name such as `@hourly`.
    /// The pattern covers `*`, `*/STEP` and lists of numbers, with the
    /// days every month has; ranges, steps of ranges and names are taken
    /// too.
    #[schemars(regex(pattern = CRON))]
    cron: String,
    /// Its time zone, a name of the IANA database (default UTC).
    #[schemars(schema_with = "time_zone")]
    tz: Option<String>,
    /// What a firing missed while the daemon was down does: `skip` it, or
    /// fire `once` for all of them.
    #[schemars(extend("enum" = ["skip", "once", null]))]
    missed: Option<String>,
    /// What each firing submits: the body of POST /api/tasks without a
    /// name, delay, time or idempotency key.
    #[schemars(schema_with = "scheduled_task")]
    task: SubmitJson,
}

/// A schedule's name (`schedule::check_name`): not all digits.
pub(super) const SCHEDULE_NAME: &str = "^[A-Za-z0-9._/-]*[A-Za-z._/-][A-Za-z0-9._/-]*$";

/// A cron expression the daemon takes (see [`ScheduleBody::cron`]).
const CRON: &str = concat!(
    r"^(@(yearly|annually|monthly|weekly|daily|hourly)|(",
    r"(\*(/([1-9]|[1-5][0-9]))?|([1-5]?[0-9])(,([1-5]?[0-9]))*) )?",
    r"(\*(/([1-9]|[1-5][0-9]))?|([1-5]?[0-9])(,([1-5]?[0-9]))*) ",
    r"(\*(/([1-9]|1[0-9]|2[0-3]))?|(1?[0-9]|2[0-3])(,(1?[0-9]|2[0-3]))*) ",
    r"(\*(/([1-9]|1[0-9]|2[0-8]))?|([1-9]|1[0-9]|2[0-8])(,([1-9]|1[0-9]|2[0-8]))*) ",
    r"(\*(/([1-9]|1[0-2]))?|([1-9]|1[0-2])(,([1-9]|1[0-2]))*) ",
    r"(\*(/[1-6])?|[0-6](,[0-6])*))$",
);

/// `tz`: a zone of the database the daemon reads zones from.
fn time_zone(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut zones: Vec<String> = jiff::tz::db()
        .available()
        .map(|name| name.to_string())
        .collect();
    zones.sort();
    zones.dedup();
    schemars::json_schema!({ "type": ["string", "null"], "enum": zones.into_iter().map(serde_json::Value::from).chain([serde_json::Value::Null]).collect::<Vec<_>>() })
}

/// `task`: the body of POST /api/tasks without what a firing sets itself.
fn scheduled_task(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use schemars::JsonSchema as _;
    let mut schema = SubmitJson::json_schema(generator);
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for taken in ["name", "delay", "at", "idempotency_key"] {
            properties.remove(taken);
        }
    }
    schema
}

/// `GET /api/schedules`: the rows of `host schedule ls --json`.
pub(super) async fn schedules(
    State(http): State<Http>,
    Extension(view): Extension<View>,
) -> Response {
    match Backend::within(&http.daemon, view.clone())
        .schedule(ScheduleVerb::List)
        .await
    {
        Ok(Scheduled::Rows(rows)) => {
            Json(rows.iter().map(json::schedule).collect::<Vec<_>>()).into_response()
        }
        Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "not a list".into()),
        Err(answer) => failed(answer),
    }
}

/// `POST /api/schedules`: adds a schedule; answers `201` with its row as
/// `host schedule add --json` prints it.
pub(super) async fn add_schedule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    body: Bytes,
) -> Response {
    let body: ScheduleBody = match super::api::read_json(&body) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the schedule's JSON: {e}")),
    };
    let missed = match body.missed.as_deref().map(str::parse).transpose() {
        Ok(m) => m.unwrap_or_default(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("missed: {e}")),
    };
    let request = match body.task.request(None) {
        Ok(r) => r,
        Err(message) => return error(StatusCode::BAD_REQUEST, format!("task: {message}")),
    };
    let spec = ScheduleSpec {
        name: body.name,
        cron: body.cron,
        tz: body.tz,
        missed,
        request,
    };
    let verb = ScheduleVerb::Add(Box::new(spec));
    if let Err(message) = Request::Schedule(verb.clone()).check() {
        return error(StatusCode::BAD_REQUEST, message);
    }
    match Backend::within(&http.daemon, view.clone())
        .schedule(verb)
        .await
    {
        Ok(Scheduled::Row(row)) => {
            (StatusCode::CREATED, Json(json::schedule(&row))).into_response()
        }
        Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "not a row".into()),
        Err(answer) => failed(answer),
    }
}

/// `DELETE /api/schedules/{name}`, `POST /api/schedules/{name}/pause`
/// and `…/resume`: the schedule as the verb left it.
async fn schedule_verb(http: &Http, view: &View, verb: ScheduleVerb) -> Response {
    match Backend::within(&http.daemon, view.clone())
        .schedule(verb)
        .await
    {
        Ok(Scheduled::Row(row)) => Json(json::schedule(&row)).into_response(),
        Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "not a row".into()),
        Err(answer) => failed(answer),
    }
}

pub(super) async fn remove_schedule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
) -> Response {
    schedule_verb(&http, &view, ScheduleVerb::Remove(name)).await
}

pub(super) async fn pause_schedule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
) -> Response {
    schedule_verb(&http, &view, ScheduleVerb::Pause(name)).await
}

pub(super) async fn resume_schedule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
) -> Response {
    schedule_verb(&http, &view, ScheduleVerb::Resume(name)).await
}

/// `POST /api/schedules/{name}/run`: fires it once now; answers as
/// `POST /api/tasks`.
pub(super) async fn run_schedule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
) -> Response {
    match Backend::within(&http.daemon, view.clone())
        .schedule(ScheduleVerb::Run(name))
        .await
    {
        Ok(Scheduled::Fired(accepted)) => answer(accepted).await,
        Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "not a firing".into()),
        Err(answer) => failed(answer),
    }
}

/// `POST /api/tasks`: submits a task; answers `201` as `host submit
/// --json` once it is accepted (durably, with a durable store), with the
/// rejection as `host submit --wait --json` prints it; `200` with
/// `"existing": true` for the task an `Idempotency-Key` made before, `409`
/// for that key with another request.
pub(super) async fn submit(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: SubmitJson = match super::api::read_json(&body) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the task's JSON: {e}")),
    };
    let header_key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(key)) => Some(key.to_owned()),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "the Idempotency-Key header must be printable text".into(),
            );
        }
    };
    let mut request = match body.request(None) {
        Ok(r) => r,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    match (header_key, &request.idempotency_key) {
        (Some(h), Some(b)) if &h != b => {
            return error(
                StatusCode::BAD_REQUEST,
                "the Idempotency-Key header and the body's idempotency_key differ: give one".into(),
            );
        }
        (Some(h), _) => request.idempotency_key = Some(h),
        _ => {}
    }
    let request = Request::Submit(Box::new(request));
    if let Err(message) = request.check() {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let Request::Submit(request) = request else {
        unreachable!("made as a Submit above")
    };
    place(&http, &view, *request).await
}

/// The largest `POST /api/tasks/batch` body.
pub(super) const MAX_BATCH_BODY: usize = 16 << 20;

/// The JSON of `POST /api/tasks/batch`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchBody {
    /// Each a body of `POST /api/tasks`.
    #[schemars(with = "Vec<SubmitJson>", length(max = MAX_BATCH))]
    tasks: Vec<Value>,
}

/// `POST /api/tasks/batch`: up to [`MAX_BATCH`] tasks, each as `POST
/// /api/tasks` would take it alone; answers `{"items": [...]}`, one per
/// task in order: where it went, or `{"error", "kind"}`.
pub(super) async fn submit_batch(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    body: Bytes,
) -> Response {
    let body: BatchBody = match super::api::read_json(&body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the batch's JSON: {e} (it is {{\"tasks\": [task, ...]}})"),
            );
        }
    };
    if body.tasks.len() > MAX_BATCH {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "a batch of {} tasks is over the limit of {MAX_BATCH}: split it",
                body.tasks.len()
            ),
        );
    }
    // A task the document would refuse (its form: a type, a word, a
    // duration, a missing plugin) refuses the whole batch, naming it, and
    // nothing is created; the daemon's own refusals (an unknown plugin, a
    // quota, a key given with another request) are answered per task.
    let mut requests = Vec::with_capacity(body.tasks.len());
    for (i, task) in body.tasks.into_iter().enumerate() {
        let read = serde_json::from_value::<SubmitJson>(task)
            .map_err(|e| e.to_string())
            .and_then(|task| task.request(None))
            .and_then(|request| {
                crate::wire::protocol::check_submission(&request).map(|()| request)
            });
        match read {
            Ok(request) => requests.push(request),
            Err(message) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("task {i} of the batch: {message} (no task was submitted)"),
                );
            }
        }
    }
    let backend = Backend::within(&http.daemon, view.clone());
    let items = bulk::submit_batch(&backend, requests)
        .await
        .iter()
        .map(json::batch_item)
        .collect();
    Json(json::BatchJson { items }).into_response()
}

/// `POST /api/tasks/{id|name}/rerun`: submits a new task with that task's
/// request (as it was placed: its name, slot and policy); answers as
/// `POST /api/tasks`.
pub(super) async fn rerun(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
) -> Response {
    let backend = Backend::within(&http.daemon, view.clone());
    let found = match backend.find(&TaskRef::parse(&task)).await {
        Ok(found) => found,
        Err(answer) => return failed(answer),
    };
    match backend.request_of(&found).await {
        Ok(request) => place(&http, &view, request).await,
        Err(answer) => failed(answer),
    }
}

/// Places a submission and answers with where it went.
async fn place(http: &Http, view: &View, request: SubmitRequest) -> Response {
    match Backend::within(&http.daemon, view.clone())
        .submit(request)
        .await
    {
        Ok(accepted) => answer(accepted).await,
        Err(answer) => failed(answer),
    }
}

/// Answers an accepted submission (once durable) with where it went.
async fn answer(accepted: Accepted) -> Response {
    let submitted = match accepted {
        Accepted::Now(s) => Ok(s),
        Accepted::Later(durable) => durable.await,
        Accepted::Deciding(decided) => decided.await,
    };
    match submitted {
        Ok(s) => {
            let rejected = match &s.placement {
                Placement::Rejected(outcome) => Some(TaskReport {
                    id: s.id,
                    name: s.name.as_str().into(),
                    slot: s.slot.as_str().into(),
                    outcome: outcome.clone(),
                    attempts: 0,
                    history: Vec::new(),
                    duration: Duration::ZERO,
                }),
                _ => None,
            };
            let mut answer = json::submitted(&s);
            answer.outcome = rejected.as_ref().map(JsonResult::new);
            let status = if s.existing {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            (status, Json(answer)).into_response()
        }
        Err(answer) => failed(answer),
    }
}

/// The query of `GET /api/tasks/{task}/outcome`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(super) struct WaitQuery {
    /// How long to wait for the outcome, e.g. `30s`.
    #[schemars(regex(pattern = crate::wire::protocol::DURATION))]
    wait: Option<String>,
}

/// `GET /api/tasks/{id|name}/outcome?wait=DUR`: the task's result as `host
/// wait --json` prints it once it has one; with `wait`, waits up to that
/// long for it (a long poll), else answers at once. Without a result yet:
/// `202` and `{"id", "outcome": null}`.
pub(super) async fn outcome(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Response {
    let patience = match q.wait.as_deref().map(parse_duration).transpose() {
        Ok(d) => d.unwrap_or(Duration::ZERO).min(MAX_WIRE_DURATION),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("wait: {e}")),
    };
    let backend = Backend::within(&http.daemon, view.clone());
    let found = match backend.find(&TaskRef::parse(&task)).await {
        Ok(found) => found,
        Err(answer) => return failed(answer),
    };
    let id = found.id();
    let waited = tokio::time::timeout(patience, backend.outcome(&found)).await;
    match waited {
        Ok(Ok(report)) => Json(JsonResult::new(&report)).into_response(),
        Ok(Err(answer)) => failed(answer),
        Err(_) => (
            StatusCode::ACCEPTED,
            Json(PendingJson {
                id: id.get(),
                outcome: None,
            }),
        )
            .into_response(),
    }
}

/// The query of `GET /api/tasks/{task}/record`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(super) struct RecordQuery {
    /// Which attempt (default: the last one recorded).
    #[schemars(range(min = 1))]
    attempt: Option<u32>,
}

/// `GET /api/tasks/{id|name}/record[?attempt=N]`: the record file of one
/// of the task's attempts, as `host record export` writes it.
pub(super) async fn record(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
    Query(q): Query<RecordQuery>,
) -> Response {
    let backend = Backend::within(&http.daemon, view);
    let found = match backend.find(&TaskRef::parse(&task)).await {
        Ok(found) => backend.record(found, q.attempt).await,
        Err(e) => Err(e),
    };
    match found {
        Ok(bytes) => (
            [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => failed(e),
    }
}

/// The query of `GET /api/tasks/{task}/logs`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(super) struct LogsQuery {
    /// Stream the lines as server-sent events until the task ends.
    #[serde(default)]
    follow: bool,
}

/// `GET /api/tasks/{id|name}/logs[?follow=true]`: the task's log lines as
/// `host logs --json` prints them, in a JSON array; with `follow`, as
/// server-sent events (each line's JSON) until the task ends, then an
/// `end` event.
pub(super) async fn logs(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(task): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Response {
    let backend = Backend::within(&http.daemon, view.clone());
    let found = match backend.find(&TaskRef::parse(&task)).await {
        Ok(found) => found,
        Err(answer) => return failed(answer),
    };
    let mut items = backend.log(found, q.follow).await;
    if !q.follow {
        let mut lines = Vec::new();
        while let Some(item) = items.recv().await {
            match item {
                Item::Log(line) => lines.push(serde_json::to_value(&line).unwrap_or(Value::Null)),
                Item::Failed(message) => return error(StatusCode::INTERNAL_SERVER_ERROR, message),
                Item::Event(_) | Item::Dropped(_) => {}
            }
        }
        return Json(Value::Array(lines)).into_response();
    }
    let Ok(permit) = Arc::clone(&http.streams).try_acquire_owned() else {
        return super::api::too_many_streams(&http);
    };
    let stream = futures::stream::unfold(Some((items, permit)), |state| async move {
        let (mut items, permit) = state?;
        loop {
            match items.recv().await {
                Some(Item::Log(line)) => {
                    let data = serde_json::to_string(&line).unwrap_or_default();
                    return Some((
                        Ok::<_, Infallible>(SseEvent::default().data(data)),
                        Some((items, permit)),
                    ));
                }
                Some(Item::Dropped(n)) => {
                    let data = json!({ "dropped": n }).to_string();
                    return Some((
                        Ok(SseEvent::default().event("dropped").data(data)),
                        Some((items, permit)),
                    ));
                }
                Some(Item::Event(_)) => {}
                Some(Item::Failed(message)) => {
                    let data = json!({ "error": message }).to_string();
                    return Some((Ok(SseEvent::default().event("error").data(data)), None));
                }
                None => return Some((Ok(SseEvent::default().event("end").data("{}")), None)),
            }
        }
    });
    Sse::new(
        stream
            .take_until(http.stop.clone().cancelled_owned())
            .boxed(),
    )
    .keep_alive(KeepAlive::default())
    .into_response()
}

/// `GET /api/plugins`: the rows of `host plugins ls --json`.
pub(super) async fn plugins(
    State(http): State<Http>,
    Extension(view): Extension<View>,
) -> Response {
    match Backend::within(&http.daemon, view).plugin_rows().await {
        Ok(rows) => Json(rows.iter().map(json::plugin_row).collect::<Vec<_>>()).into_response(),
        Err(e) => failed(e),
    }
}

/// `DELETE /api/plugins/{digest prefix}`: as `host plugins rm` (refused
/// while an unfinished task uses it); answers the rows removed.
pub(super) async fn remove_plugin(
    State(http): State<Http>,
    Path(prefix): Path<String>,
) -> Response {
    let daemon = Arc::clone(&http.daemon);
    let removed = tokio::task::spawn_blocking(move || {
        plugins::remove(daemon.plugin_users(), Some(&prefix), Duration::ZERO)
    })
    .await
    .unwrap_or_else(|e| Err(ServiceError::Internal(e.to_string())));
    match removed {
        Ok(rows) => Json(rows.iter().map(json::plugin_row).collect::<Vec<_>>()).into_response(),
        Err(answer) => failed(answer),
    }
}

/// `GET /api/version`: the daemon's build and protocol versions.
pub(super) async fn version() -> Response {
    Json(VersionJson {
        daemon: env!("CARGO_PKG_VERSION"),
        protocol: crate::wire::protocol::PROTOCOL_VERSION,
    })
    .into_response()
}

/// The body of `POST /api/shutdown`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ShutdownBody {
    /// How long running tasks get to stop before they are force-aborted.
    #[schemars(regex(pattern = crate::wire::protocol::DURATION))]
    grace: Option<String>,
    /// End the unfinished work now instead of keeping it for the next start.
    #[serde(default)]
    cancel_all: bool,
}

/// `POST /api/shutdown` (`{"grace": "10s", "cancel_all": false}`, both
/// optional): as `host shutdown --json`, answered once the daemon has
/// stopped its tasks.
pub(super) async fn shutdown(State(http): State<Http>, body: Bytes) -> Response {
    let body: ShutdownBody = if body.is_empty() {
        ShutdownBody::default()
    } else {
        match super::api::read_json(&body) {
            Ok(b) => b,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("the shutdown's JSON: {e}")),
        }
    };
    let grace = match body.grace.as_deref().map(parse_duration).transpose() {
        Ok(g) => g,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("grace: {e}")),
    };
    let request = Request::Shutdown {
        grace,
        cancel_all: body.cancel_all,
    };
    if let Err(message) = request.check() {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let report = dispatch::shutdown(&http.daemon, grace, body.cancel_all).await;
    Json(json::shutdown(&report)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_submit_properties_are_exactly_the_ones_taken() {
        let document = super::super::openapi::document();
        let schema = &document["components"]["schemas"]["SubmitJson"];
        let properties = schema["properties"].as_object().expect("its properties");
        let documented: Vec<&str> = properties.keys().map(String::as_str).collect();
        let mut body = serde_json::Map::new();
        for (name, property) in properties {
            let kind = property["type"]
                .as_str()
                .or_else(|| property["type"][0].as_str())
                .unwrap_or("object");
            let value = match kind {
                "string" if name == "plugin" => json!("0".repeat(64)),
                "string" => json!("1s"),
                "integer" => json!(1),
                "boolean" => json!(false),
                "object" => json!({}),
                _ => json!([]),
            };
            body.insert(name.clone(), value);
        }
        // Every documented property is taken (unknown ones are refused)...
        let parsed: Result<SubmitJson, _> = serde_json::from_value(Value::Object(body.clone()));
        assert!(parsed.is_ok(), "{parsed:?}");
        // ...and every one taken is documented: serde lists the fields it
        // expects when it meets an unknown one.
        body.insert("undocumented".into(), json!(1));
        let err = serde_json::from_value::<SubmitJson>(Value::Object(body))
            .unwrap_err()
            .to_string();
        let expected = err.split("expected one of").nth(1).expect("the field list");
        let mut taken: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        taken.sort_unstable();
        let mut documented = documented;
        documented.sort_unstable();
        assert_eq!(taken, documented);
    }
}
