//! Owns the verbs by filter over HTTP: `POST /api/tasks/cancel` and `POST
//! /api/tasks/rerun`, as `host cancel --filter` and `host rerun --filter`,
//! calling what the socket's requests call.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Http;
use super::answers::MatchedJson;
use super::api::{error, failed};
use crate::backend::Backend;
use crate::server::bulk;
use crate::service::namespace::View;
use crate::wire::protocol::{Reply, TaskFilter};

/// A filter's time as the schema says it: a duration ago, or an RFC 3339
/// time until 2035 with a `Z` or an offset (other RFC 3339 times are taken
/// too).
pub(super) const TIME: &str = r"^([0-9]{1,4}(ms|s|m|h)|20([0-2][0-9]|3[0-5])-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,3})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9]))$";

/// The JSON of a verb by filter: each condition given must hold.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    { "required": ["state"], "properties": { "state": { "type": "string" } } },
    { "required": ["slot"], "properties": { "slot": { "type": "string" } } },
    { "required": ["name"], "properties": { "name": { "type": "string" } } },
    { "required": ["plugin"], "properties": { "plugin": { "type": "string" } } },
    { "required": ["outcome"], "properties": { "outcome": { "type": "string" } } },
    { "required": ["since"], "properties": { "since": { "type": "string" } } },
    { "required": ["until"], "properties": { "until": { "type": "string" } } },
]))]
pub(super) struct FilterBody {
    /// Tasks in this state (cancel: `queued`, `waiting`, `running`, `stopping`).
    #[schemars(extend("enum" = ["queued", "running", "waiting", "backing-off", "throttled", "stopping", "finishing", "finished", null]))]
    state: Option<String>,
    /// Tasks whose slot matches this glob (`*`, `?`).
    slot: Option<String>,
    /// Tasks whose name matches this glob.
    name: Option<String>,
    /// Tasks of this plugin (its name, or the start of its SHA-256).
    plugin: Option<String>,
    /// Finished tasks that ended so (rerun).
    #[schemars(extend("enum" = [ "completed", "failed", "fatal", "canceled", "force-aborted", "panicked", "rejected", null ]))]
    outcome: Option<String>,
    /// Tasks submitted at or after this time: RFC 3339, or a duration ago
    /// (`2h`).
    #[schemars(regex(pattern = TIME))]
    since: Option<String>,
    /// Tasks submitted before this time, written as `since`.
    #[schemars(regex(pattern = TIME))]
    until: Option<String>,
    /// Only count them and list the newest ids; act on none.
    #[serde(default)]
    dry_run: bool,
}

impl FilterBody {
    fn filter(self) -> Result<(TaskFilter, bool), String> {
        let filter = TaskFilter::of([
            ("state", self.state),
            ("slot", self.slot),
            ("name", self.name),
            ("plugin", self.plugin),
            ("outcome", self.outcome),
            ("since", self.since),
            ("until", self.until),
        ])?;
        if filter.is_empty() {
            return Err(
                "give at least one of state, slot, name, plugin, outcome, since, until: \
                        an empty filter would act on every task"
                    .into(),
            );
        }
        Ok((filter, self.dry_run))
    }
}

/// Which verb.
#[derive(Clone, Copy)]
enum Verb {
    Cancel,
    Rerun,
}

/// `POST /api/tasks/cancel`: stops every live task that matches, as `host
/// cancel --filter`; answers `{"matched", "ids", "acted"}`.
pub(super) async fn cancel(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    body: Bytes,
) -> Response {
    by_filter(&http, view, &body, Verb::Cancel).await
}

/// `POST /api/tasks/rerun`: submits again every finished task that
/// matches, as `host rerun --filter`; answers as `POST /api/tasks/cancel`.
pub(super) async fn rerun(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    body: Bytes,
) -> Response {
    by_filter(&http, view, &body, Verb::Rerun).await
}

async fn by_filter(http: &Http, view: View, body: &[u8], verb: Verb) -> Response {
    let parsed: Result<FilterBody, String> = if body.is_empty() {
        Ok(FilterBody::default())
    } else {
        super::api::read_json(body).map_err(|e| format!("the filter's JSON: {e}"))
    };
    let (filter, dry_run) = match parsed.and_then(FilterBody::filter) {
        Ok(f) => f,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let backend = Backend::within(&http.daemon, view);
    let answer = match verb {
        Verb::Cancel => bulk::cancel_matching(&backend, &filter, dry_run).await,
        Verb::Rerun => bulk::rerun_matching(&backend, &filter, dry_run).await,
    };
    match answer {
        Ok(Reply::Matched { count, ids, acted }) => Json(MatchedJson {
            matched: count,
            ids: ids.iter().map(|id| id.get()).collect(),
            acted,
        })
        .into_response(),
        Ok(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "a verb by filter answered something else".into(),
        ),
        Err(e) => failed(e),
    }
}
