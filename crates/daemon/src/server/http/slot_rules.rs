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
use serde_json::Value;

use taskhost_core::slot_settings::SlotSettings;
use taskhost_core::units::parse_duration;

use super::Http;
use super::api::{error, failed};
use crate::backend::{Backend, SlotRuled};
use crate::service::json;
use crate::service::namespace::View;
use crate::wire::protocol::{Request, SlotRuleRow, SlotRuleVerb};

/// The body of `PUT /api/slot-rules`: as `host slot set`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SlotRuleBody {
    pattern: String,
    capacity: Option<u32>,
    max_queue: Option<usize>,
    /// A duration, as `--debounce` takes it.
    debounce: Option<String>,
    max_wait: Option<String>,
    /// STARTS/PERIOD, as `--rate` takes it.
    rate: Option<String>,
    burst: Option<u32>,
}

/// The pattern of `DELETE /api/slot-rules?pattern=P`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PatternQuery {
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
    let body: SlotRuleBody = match serde_json::from_slice(&body) {
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
            Json(Value::Array(rows.iter().map(json::slot_rule).collect())).into_response()
        }
        Ok(SlotRuled::Row(row)) => Json(json::slot_rule(&row)).into_response(),
        Err(answer) => failed(answer),
    }
}
