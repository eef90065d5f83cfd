//! Owns the HTTP API's slot rules: `GET`, `PUT` and `DELETE
//! /api/slot-rules`, as `host slot ls|set|unset`, in the caller's
//! namespace, answered in the CLI's `--json` shapes.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use taskhost_core::slot_settings::SlotSettings;
use taskhost_core::units::parse_duration;

use super::Http;
use super::api::{error, failed};
use crate::backend::{Backend, SlotRuled};
use crate::service::json;
use crate::service::namespace::View;
use crate::wire::protocol::{Request, SlotRuleRow, SlotRuleVerb};

/// A duration a slot rule takes: more than zero, at most a day.
const SHORT_DURATION: &str = r"^[1-9][0-9]{0,3}(ms|s|m)$";

/// The body of `PUT /api/slot-rules`: as `host slot set`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("dependentSchemas" = {
    "burst": { "required": ["rate"], "properties": { "rate": { "type": "string" } } },
    "max_wait": { "required": ["debounce"], "properties": { "debounce": { "type": "string" } } },
}))]
pub(super) struct SlotRuleBody {
    /// The slots it covers: a key, or a glob (`db/*`).
    #[schemars(
        length(min = 1, max = 512),
        regex(pattern = r"^[^\x00-\x1f\x7f-\x9f]*$")
    )]
    pattern: String,
    /// Owners at once.
    #[schemars(range(min = 1, max = 100_000))]
    capacity: Option<u32>,
    /// Submissions waiting at most.
    max_queue: Option<usize>,
    /// A duration, as `--debounce` takes it (more than zero, at most a day).
    #[schemars(regex(pattern = SHORT_DURATION))]
    debounce: Option<String>,
    /// The longest a debounced submission waits (a duration, with
    /// `debounce` and at least it).
    #[schemars(regex(pattern = SHORT_DURATION))]
    max_wait: Option<String>,
    /// STARTS/PERIOD, as `--rate` takes it (such as `100/s`, `5/10s`).
    #[schemars(regex(pattern = r"^[1-9][0-9]{0,5}/([1-9][0-9]{0,3}(ms|s|m)|s|m)$"))]
    rate: Option<String>,
    /// Starts allowed at once above the rate (with `rate`).
    #[schemars(range(max = 100_000))]
    burst: Option<u32>,
}

/// The pattern of `DELETE /api/slot-rules?pattern=P`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PatternQuery {
    /// The rule's pattern.
    #[schemars(
        length(min = 1, max = 512),
        regex(pattern = r"^[^\x00-\x1f\x7f-\x9f]*$")
    )]
    pattern: String,
}

/// `GET /api/slot-rules`: the rows of `host slot ls --json`.
pub(super) async fn slot_rules(
    State(http): State<Http>,
    Extension(view): Extension<View>,
) -> Response {
    slot_rule_verb(&http, &view, SlotRuleVerb::List).await
}

/// `PUT /api/slot-rules`: sets the rule of a pattern; answers with it as
/// `host slot set --json` prints it.
pub(super) async fn set_slot_rule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    body: Bytes,
) -> Response {
    let body: SlotRuleBody = match super::api::read_json(&body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the slot rule's JSON: {e}"),
            );
        }
    };
    let duration = |field: &str, text: Option<&str>| {
        text.map(parse_duration)
            .transpose()
            .map_err(|e| format!("{field}: {e}"))
    };
    let durations = duration("debounce", body.debounce.as_deref())
        .and_then(|d| Ok((d, duration("max_wait", body.max_wait.as_deref())?)));
    let (debounce, max_wait) = match durations {
        Ok(both) => both,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let rate = match body.rate.as_deref().map(str::parse).transpose() {
        Ok(rate) => rate,
        Err(message) => return error(StatusCode::BAD_REQUEST, format!("rate: {message}")),
    };
    let settings = SlotSettings {
        capacity: body.capacity,
        max_queue: body.max_queue,
        debounce,
        max_wait,
        rate,
        burst: body.burst,
    };
    let pattern = body.pattern;
    slot_rule_verb(
        &http,
        &view,
        SlotRuleVerb::Set(SlotRuleRow { pattern, settings }),
    )
    .await
}

/// `DELETE /api/slot-rules?pattern=P`: removes it; answers with the rule
/// removed.
pub(super) async fn unset_slot_rule(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Query(query): Query<PatternQuery>,
) -> Response {
    slot_rule_verb(&http, &view, SlotRuleVerb::Unset(query.pattern)).await
}

async fn slot_rule_verb(http: &Http, view: &View, verb: SlotRuleVerb) -> Response {
    if let Err(message) = Request::SlotRule(verb.clone()).check() {
        return error(StatusCode::BAD_REQUEST, message);
    }
    match Backend::within(&http.daemon, view.clone())
        .slot_rule(verb)
        .await
    {
        Ok(SlotRuled::Rows(rows)) => {
            Json(rows.iter().map(json::slot_rule).collect::<Vec<_>>()).into_response()
        }
        Ok(SlotRuled::Row(row)) => Json(json::slot_rule(&row)).into_response(),
        Err(answer) => failed(answer),
    }
}
