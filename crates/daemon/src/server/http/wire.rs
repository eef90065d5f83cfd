//! Owns `GET /api/wire`: a connection that upgrades from HTTP to the
//! daemon's own protocol (the one the Unix socket speaks), so that a remote
//! `host --remote URL` and the library's `Client` get every verb with the
//! socket's semantics, pipelining and streams. The token's scope is checked
//! for every request the connection sends. Upgraded connections count
//! against `http_max_connections` of their own.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;

use super::{Http, api};
use crate::server::connection;
use crate::server::scope::{Credential, Reach, Scope};
use crate::service::namespace::Ns;

/// The `Upgrade` protocol a client asks for.
pub const UPGRADE: &str = "taskhost-wire";

/// Answers `101 Switching Protocols` and serves the protocol on the
/// connection from then on.
pub(super) async fn upgrade(State(http): State<Http>, mut request: Request) -> Response {
    let asked = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(UPGRADE));
    if !asked {
        return api::error(
            StatusCode::UPGRADE_REQUIRED,
            format!(
                "this endpoint speaks the daemon's protocol: send `Connection: upgrade` and \
                 `Upgrade: {UPGRADE}` (host --remote does)"
            ),
        );
    }
    let credential = request
        .extensions()
        .get::<Credential>()
        .cloned()
        .unwrap_or(Credential {
            scope: Scope::Read,
            reach: Reach::One(Ns::default()),
        });
    let Ok(permit) = Arc::clone(&http.wires).try_acquire_owned() else {
        return api::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many remote clients are connected (--http-max-connections): try again later"
                .into(),
        );
    };
    let upgrading = hyper::upgrade::on(&mut request);
    let daemon = Arc::clone(&http.daemon);
    http.tracker.spawn(async move {
        let _permit = permit;
        match upgrading.await {
            Ok(upgraded) => {
                let (reader, writer) = tokio::io::split(TokioIo::new(upgraded));
                if let Err(err) = connection::serve_io(daemon, reader, writer, credential).await {
                    tracing::debug!("remote connection ended: {err}");
                }
            }
            Err(err) => tracing::debug!("a remote client's upgrade failed: {err}"),
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, HeaderValue::from_static("upgrade")),
            (header::UPGRADE, HeaderValue::from_static(UPGRADE)),
        ],
    )
        .into_response()
}
