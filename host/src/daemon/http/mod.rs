//! Owns the daemon's optional HTTP listener (`host serve --http ADDR`):
//! Prometheus metrics, a JSON API with the same data as the CLI's `--json`,
//! server-sent events, and a small live dashboard. It only reads the
//! daemon's shared state and calls what the socket protocol's dispatch
//! calls; it decides nothing about tasks.
//!
//! Security: no listener unless asked for; a non-loopback address needs a
//! token; the read-only endpoints (`GET`) and the mutating ones (`POST`
//! cancel and remove) are separate, and the mutating ones need
//! `Authorization: Bearer <token>` whenever a token is configured, loopback
//! or not. On a loopback address every request must name a loopback host
//! (no DNS rebinding), and a `POST` must say `Content-Type:
//! application/json` (a cross-site form cannot, so no CSRF).
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | settings check, binding, routing, the guards |
//! | `api.rs` | the JSON endpoints and the event stream |
//! | `metrics.rs` | `/metrics`: counters from the event bus, gauges at scrape time |
//! | `dashboard.html` | the page at `/` (embedded, no build step) |

mod api;
mod metrics;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use super::config::DaemonConfig;
use super::state::Daemon;

/// The HTTP listener's settings, checked before the daemon starts.
#[derive(Debug)]
pub(crate) struct Plan {
    addr: SocketAddr,
    token: Option<String>,
}

/// Checks `--http` and `--http-token-file`; `None` when no listener is
/// asked for.
pub(crate) fn plan(config: &DaemonConfig) -> Result<Option<Plan>, String> {
    let Some(addr) = config.http else {
        if config.http_token_file.is_some() {
            return Err(
                "--http-token-file (http_token_file) is set but --http (http) is not: \
                 say where the HTTP listener binds, e.g. --http 127.0.0.1:9100"
                    .into(),
            );
        }
        return Ok(None);
    };
    let token = match &config.http_token_file {
        Some(path) => Some(read_token(path)?),
        None => None,
    };
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(format!(
            "--http {addr} is not a loopback address: anyone who can reach it could cancel \
             tasks; give --http-token-file FILE (a secret the cancel and remove endpoints \
             require), or bind 127.0.0.1:{}",
            addr.port()
        ));
    }
    Ok(Some(Plan { addr, token }))
}

fn read_token(path: &PathBuf) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the HTTP token file `{}`: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!(
            "the HTTP token file `{}` is empty: put a secret in it (e.g. `openssl rand -hex 32 > {}`)",
            path.display(),
            path.display()
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "the HTTP token file `{}` holds more than one word: the token is its one line",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// The running listener; dropping it stops accepting.
#[derive(Debug)]
pub(crate) struct Server {
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What every handler shares.
#[derive(Clone)]
struct Http {
    daemon: Arc<Daemon>,
    metrics: Arc<metrics::Metrics>,
    token: Option<Arc<str>>,
    /// The `Host` headers accepted (loopback binds only).
    hosts: Option<Arc<[String]>>,
}

/// A bound listener, not serving yet.
#[derive(Debug)]
pub(crate) struct Bound {
    listener: tokio::net::TcpListener,
    local: SocketAddr,
    token: Option<String>,
}

impl Bound {
    /// The address it listens on (the port chosen, for port 0).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// Binds the listener (before the daemon starts, so a taken port stops it
/// at once).
pub(crate) async fn bind(plan: Plan) -> Result<Bound, String> {
    let cannot = |e: std::io::Error| {
        format!(
            "cannot listen for HTTP on {}: {e} (choose another --http address)",
            plan.addr
        )
    };
    let listener = tokio::net::TcpListener::bind(plan.addr)
        .await
        .map_err(cannot)?;
    let local = listener.local_addr().map_err(cannot)?;
    Ok(Bound {
        listener,
        local,
        token: plan.token,
    })
}

/// Starts serving; the metrics' event lane starts here too, so it counts
/// everything from now on.
pub(crate) fn start(bound: Bound, daemon: &Arc<Daemon>) -> Server {
    let Bound {
        listener,
        local,
        token,
    } = bound;
    let hosts = local.ip().is_loopback().then(|| {
        let port = local.port();
        Arc::from(vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            local.to_string(),
        ])
    });
    let guarded = if token.is_some() {
        "cancel and remove need the token"
    } else {
        "no token: cancel and remove are open to local users"
    };
    let state = Http {
        daemon: Arc::clone(daemon),
        metrics: metrics::Metrics::start(daemon),
        token: token.map(Arc::from),
        hosts,
    };
    let mutating = Router::new()
        .route("/api/tasks/{task}/cancel", post(api::cancel))
        .route("/api/tasks/{task}/remove", post(api::remove))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    let app = Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics::scrape))
        .route("/api/tasks", get(api::tasks))
        .route("/api/tasks/{task}", get(api::task))
        .route("/api/slots", get(api::slots))
        .route("/api/events", get(api::events))
        .merge(mutating)
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .with_state(state);
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopped.cancelled().await })
            .await;
        if let Err(err) = served {
            tracing::warn!("the HTTP listener stopped: {err}");
        }
    });
    // Tests and scripts that asked for port 0 read the port from this line.
    tracing::info!("taskhost HTTP listening on http://{local}/ ({guarded})");
    Server { stop }
}

/// The dashboard page.
async fn dashboard() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        include_str!("dashboard.html"),
    )
}

/// On a loopback bind, refuses requests whose `Host` is not a loopback
/// name: a web page that rebinds its own domain to 127.0.0.1 cannot reach
/// the API.
async fn check_host(State(http): State<Http>, request: Request, next: Next) -> Response {
    if let Some(hosts) = &http.hosts {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return api::error(
                StatusCode::MISDIRECTED_REQUEST,
                format!("this listener answers only to {}", hosts.join(", ")),
            );
        }
    }
    next.run(request).await
}

/// The mutating endpoints: a JSON content type always, and the bearer
/// token whenever one is configured.
async fn authorize(State(http): State<Http>, request: Request, next: Next) -> Response {
    if request.method() != axum::http::Method::POST {
        // Not a mutation: the router answers 405.
        return next.run(request).await;
    }
    if !is_json(request.headers()) {
        return api::error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send `Content-Type: application/json` with a POST".into(),
        );
    }
    if let Some(token) = &http.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same(given.as_bytes(), token.as_bytes()) {
            let mut response = api::error(
                StatusCode::UNAUTHORIZED,
                "cancel and remove need `Authorization: Bearer <token>` (the token in the daemon's --http-token-file)".into(),
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"taskhost\""),
            );
            return response;
        }
    }
    next.run(request).await
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Compares in time independent of where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
