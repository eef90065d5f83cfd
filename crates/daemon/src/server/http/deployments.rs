//! Owns the HTTP API's named deployments: `GET /api/deployments` and
//! `GET /api/deployments/{deployment}` (its history), `POST
//! /api/deployments` (a deploy of a stored plugin), `POST
//! /api/deployments/{deployment}/rollback` and `DELETE
//! /api/deployments/{deployment}?version=V`, as `host deployments
//! ls|history`, `host deploy`, `host rollback` and `host deployments rm`,
//! in the caller's namespace, answered in the CLI's `--json` shapes.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Http;
use super::api::{error, failed};
use crate::backend::Backend;
use crate::service::json;
use crate::service::namespace::View;
use crate::wire::protocol::{DeploymentVerb, Request};
use taskhost_runtime::Digest;

/// A deployment's name (`check_name`).
pub(super) const DEPLOYMENT_NAME: &str = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$";
/// A version (`check_version`): printable ASCII without spaces or `@`.
const VERSION: &str = r"^[!-?A-~]{1,128}$";

/// The body of `POST /api/deployments`: as `host deploy`, of a plugin the
/// daemon stores (`PUT /api/plugins/{digest}` uploads one).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DeployBody {
    /// The plugin's SHA-256, hex (`sha256:` optional).
    #[schemars(regex(pattern = r"^(sha256:)?[0-9a-f]{64}$"))]
    plugin: String,
    /// The name [default: the plugin's declared name].
    #[schemars(regex(pattern = DEPLOYMENT_NAME))]
    name: Option<String>,
    /// The version [default: the plugin's declared version].
    #[schemars(regex(pattern = VERSION))]
    version: Option<String>,
}

/// The body of `POST /api/deployments/{deployment}/rollback`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RollbackBody {
    /// The version to make current [default: the one current before the
    /// current one].
    #[schemars(regex(pattern = VERSION))]
    to: Option<String>,
}

/// The version of `DELETE /api/deployments/{deployment}?version=V`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct VersionQuery {
    /// The version to remove.
    #[schemars(regex(pattern = VERSION))]
    version: String,
}

/// `GET /api/deployments`: each deployment's current version.
pub(super) async fn deployments(
    State(http): State<Http>,
    Extension(view): Extension<View>,
) -> Response {
    verb_answer(&http, &view, DeploymentVerb::List).await
}

/// `GET /api/deployments/{deployment}`: its events, newest first.
pub(super) async fn history(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
) -> Response {
    verb_answer(&http, &view, DeploymentVerb::History(name)).await
}

/// `POST /api/deployments`: deploys a stored plugin.
pub(super) async fn deploy(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    body: Bytes,
) -> Response {
    let body: DeployBody = match super::api::read_json(&body) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the deploy's JSON: {e}")),
    };
    let digest = match body.plugin.parse::<Digest>() {
        Ok(digest) => digest,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("plugin: {e}")),
    };
    let verb = DeploymentVerb::Deploy {
        digest,
        name: body.name,
        version: body.version,
    };
    verb_answer(&http, &view, verb).await
}

/// `POST /api/deployments/{deployment}/rollback`.
pub(super) async fn rollback(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let body: RollbackBody = if body.is_empty() {
        RollbackBody::default()
    } else {
        match super::api::read_json(&body) {
            Ok(b) => b,
            Err(e) => {
                return error(StatusCode::BAD_REQUEST, format!("the rollback's JSON: {e}"));
            }
        }
    };
    verb_answer(&http, &view, DeploymentVerb::Rollback { name, to: body.to }).await
}

/// `DELETE /api/deployments/{deployment}?version=V`.
pub(super) async fn remove(
    State(http): State<Http>,
    Extension(view): Extension<View>,
    Path(name): Path<String>,
    Query(query): Query<VersionQuery>,
) -> Response {
    let verb = DeploymentVerb::Remove {
        name,
        version: query.version,
    };
    verb_answer(&http, &view, verb).await
}

async fn verb_answer(http: &Http, view: &View, verb: DeploymentVerb) -> Response {
    let request = Request::Deployment(verb);
    if let Err(message) = request.check() {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let Request::Deployment(verb) = request else {
        unreachable!("made as a deployment verb above")
    };
    match Backend::within(&http.daemon, view.clone())
        .deployment(verb)
        .await
    {
        Ok(rows) => Json(rows.iter().map(json::deployment).collect::<Vec<_>>()).into_response(),
        Err(answer) => failed(answer),
    }
}
