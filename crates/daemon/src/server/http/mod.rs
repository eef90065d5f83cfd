//! Owns the daemon's optional HTTP listener (`host serve --http ADDR`):
//! Prometheus metrics, a JSON API with the same data as the CLI's `--json`,
//! server-sent events, and a small live dashboard. It only reads the
//! daemon's shared state and calls what the socket protocol's dispatch
//! calls; it decides nothing about tasks.
//!
//! Security: no listener unless asked for. Every request must name a `Host`
//! the listener answers to (`hosts.rs`: no DNS rebinding) and, when it
//! carries an `Origin`, come from that host's own origin (no cross-site
//! page). Every endpoint but the dashboard page (static HTML, no data)
//! needs `Authorization: Bearer <token>`: the operator's
//! (`--http-token-file`, required for a non-loopback address) or, on a
//! loopback address without one, the daemon's own in `<state
//! dir>/http-token` (`token.rs`), whose dashboard URL the log gives. A
//! `POST` with a body must say `Content-Type: application/json` (one with
//! neither a body nor a type is taken). Connections and event
//! streams are capped (at the connection cap, the connection idle the
//! longest is closed for a new one), and a client has
//! `http_header_timeout` to send a request's header (`conn.rs`).
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | settings check, binding, routing, the guards |
//! | `conn.rs` | the accept loop, the connection cap, hyper's timeouts, the graceful stop |
//! | `registry.rs` | the open connections, idle or serving, and the one closed to make room at the cap |
//! | `hosts.rs` | the `Host` and `Origin` rules |
//! | `openapi.rs` | the table of routes and scopes, and the OpenAPI document built from it |
//! | `tls.rs` | `--tls-cert`/`--tls-key`: the acceptor, reloads on SIGHUP or a changed file |
//! | `token.rs` | the bearer tokens and their scopes: the operator's file, or the daemon's own |
//! | `wire.rs` | `/api/wire`: the daemon's own protocol over an upgraded connection |
//! | `answers.rs` | the answers only the API gives, as types |
//! | `api.rs` | the reads (tasks, a task, slots), cancel, remove, the event stream |
//! | `verbs.rs` | upload, submit, the outcome's long poll, logs, plugins, version, shutdown |
//! | `bulk.rs` | cancel and rerun by filter |
//! | `slot_rules.rs` | the slot rules' routes, in the caller's namespace |
//! | `deployments.rs` | named deployments' routes (list, history, deploy, rollback, removal), in the caller's namespace |
//! | `namespaces.rs` | the namespaces a token reaches; the operator's changes of them |
//! | `metrics.rs` | `/metrics`: counters from the event bus, gauges at scrape time |
//! | `slot_metrics.rs` | `/metrics` of flow control per slot: throttled, superseded, rate budgets |
//! | `dashboard.html` | the page at `/` (embedded, no build step) |

mod answers;
mod api;
mod bulk;
mod conn;
mod deployments;
mod hosts;
mod metrics;
mod namespaces;
mod openapi;
mod registry;
mod slot_metrics;
mod slot_rules;
mod tls;
pub(crate) mod token;
mod verbs;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::daemon::Daemon;
use crate::config::DaemonConfig;
use crate::server::scope::{Credential, Reach, Scope};
use crate::service::namespace::{Ns, View};

/// The HTTP listener's settings, checked before the daemon starts.
#[derive(Debug)]
pub(crate) struct Plan {
    addr: SocketAddr,
    /// The operator's tokens (`--http-token-file`); `None`: the daemon's
    /// own, read or made in the state directory when binding.
    token: Option<token::Tokens>,
    state_dir: PathBuf,
    allow_hosts: Vec<String>,
    limits: conn::Limits,
    max_streams: usize,
    tls: Option<tls::Files>,
}

/// Checks `--http` and its settings; `None` when no listener is asked for.
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
    config.check()?;
    for entry in &config.http_allow_hosts {
        crate::config::check_allow_host(entry).map_err(|e| format!("--http-allow-host: {e}"))?;
    }
    let token = match &config.http_token_file {
        Some(path) => Some(token::read_tokens(path).map_err(|e| e.to_string())?),
        None => None,
    };
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::Files {
            cert: cert.clone(),
            key: key.clone(),
        }),
        (None, None) => None,
        (Some(_), None) => {
            return Err(
                "--tls-cert (tls_cert) needs --tls-key (tls_key): the certificate's \
                        private key, PEM"
                    .into(),
            );
        }
        (None, Some(_)) => {
            return Err(
                "--tls-key (tls_key) needs --tls-cert (tls_cert): the certificate \
                        chain, PEM"
                    .into(),
            );
        }
    };
    if let Some(files) = &tls {
        // Checked now, so a bad file stops the start with its name.
        files.load(&rustls::crypto::ring::default_provider())?;
    }
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(format!(
            "--http {addr} is not a loopback address: anyone who can reach it could read \
             every task's output and cancel tasks; give --http-token-file FILE (a secret \
             every request must carry), or bind 127.0.0.1:{}",
            addr.port()
        ));
    }
    if !addr.ip().is_loopback() && tls.is_none() && !config.http_allow_plain {
        return Err(format!(
            "--http {addr} is not a loopback address and the listener has no TLS: tokens \
             and outputs would cross the network in clear; give --tls-cert FILE --tls-key \
             FILE, or --http-allow-plain when a TLS proxy in front terminates it"
        ));
    }
    Ok(Some(Plan {
        addr,
        token,
        state_dir: config.state_dir.clone(),
        allow_hosts: config.http_allow_hosts.clone(),
        limits: conn::Limits {
            max_connections: config.http_max_connections,
            header_timeout: config.http_header_timeout,
        },
        max_streams: config.http_max_streams,
        tls,
    }))
}

/// The running listener; dropping it stops accepting, and the open
/// connections end after their current request.
#[derive(Debug)]
pub(crate) struct Server {
    stop: CancellationToken,
    /// Its connections' tasks (upgraded ones too).
    tracker: TaskTracker,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
        self.tracker.close();
    }
}

impl Server {
    /// Stops accepting; the open connections finish their current request
    /// and the streams end. The answer waits for them.
    pub(crate) fn stop(self) -> Draining {
        Draining(self.tracker.clone())
    }
}

/// A stopped listener's connections, finishing.
pub(crate) struct Draining(TaskTracker);

impl Draining {
    /// Waits up to `bound` for every connection to end, so an answer
    /// being written (a shutdown's, through the API) reaches its client
    /// before the process exits.
    pub(crate) async fn drained(self, bound: std::time::Duration) {
        let _ = tokio::time::timeout(bound, self.0.wait()).await;
    }
}

/// Whose token the listener asks for (what a 401 tells the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whose {
    /// `--http-token-file`'s.
    Operator,
    /// The daemon's own, in `<state dir>/http-token`.
    Own,
}

/// What every handler shares.
#[derive(Clone)]
struct Http {
    daemon: Arc<Daemon>,
    metrics: Arc<metrics::Metrics>,
    tokens: Arc<token::Tokens>,
    whose: Whose,
    /// The `Host` headers answered.
    hosts: Arc<hosts::Hosts>,
    /// One permit per open `/api/events` stream.
    streams: Arc<Semaphore>,
    /// One permit per connection upgraded at `/api/wire`.
    wires: Arc<Semaphore>,
    /// Cancelled when the listener stops: the streams end.
    stop: CancellationToken,
    /// The connections' tasks.
    tracker: TaskTracker,
    max_streams: usize,
}

/// A bound listener, not serving yet.
#[derive(Debug)]
pub(crate) struct Bound {
    listener: tokio::net::TcpListener,
    local: SocketAddr,
    tokens: token::Tokens,
    /// The daemon's own token, for the dashboard URL the log gives.
    own_token: Option<String>,
    /// The daemon's own token file, when the token is the daemon's.
    own: Option<PathBuf>,
    allow_hosts: Vec<String>,
    limits: conn::Limits,
    max_streams: usize,
    tls: Option<tls::Tls>,
}

impl Bound {
    /// The address it listens on (the port chosen, for port 0).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// Reads or makes the daemon's own token (when there is no operator's) and
/// binds the listener (before the daemon starts, so a taken port stops it
/// at once).
pub(crate) async fn bind(plan: Plan) -> Result<Bound, String> {
    let (tokens, own_token, own) = match plan.token {
        Some(tokens) => (tokens, None, None),
        None => {
            let state_dir = plan.state_dir.clone();
            let made = tokio::task::spawn_blocking(move || token::own(&state_dir))
                .await
                .map_err(|e| format!("cannot make the HTTP token: {e}"))?;
            let (token, path) = made.map_err(|e| e.to_string())?;
            (token::Tokens::admin(&token), Some(token), Some(path))
        }
    };
    let cannot = |e: std::io::Error| {
        format!(
            "cannot listen for HTTP on {}: {e} (choose another --http address)",
            plan.addr
        )
    };
    let tls = match plan.tls {
        Some(files) => Some(tls::Tls::new(files)?),
        None => None,
    };
    let listener = conn::listen(plan.addr).map_err(cannot)?;
    let local = listener.local_addr().map_err(cannot)?;
    Ok(Bound {
        listener,
        local,
        tokens,
        own_token,
        own,
        allow_hosts: plan.allow_hosts,
        limits: plan.limits,
        max_streams: plan.max_streams,
        tls,
    })
}

/// Starts serving; the metrics' event lane starts here too, so it counts
/// everything from now on.
pub(crate) fn start(bound: Bound, daemon: &Arc<Daemon>) -> Server {
    let Bound {
        listener,
        local,
        tokens,
        own_token,
        own,
        allow_hosts,
        limits,
        max_streams,
        tls,
    } = bound;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let hostname = hosts::machine_hostname();
    let hosts = hosts::Hosts::new(local, &allow_hosts, hostname.as_deref());
    let guarded = match &own {
        Some(path) => format!(
            "every request but the dashboard page needs the token in {}",
            path.display()
        ),
        None => {
            "every request but the dashboard page needs the token of --http-token-file".to_owned()
        }
    };
    let dashboard_url = own_token.map(|token| format!("{scheme}://{local}/#token={token}"));
    let state = Http {
        daemon: Arc::clone(daemon),
        metrics: metrics::Metrics::start(daemon),
        tokens: Arc::new(tokens),
        whose: if own.is_some() {
            Whose::Own
        } else {
            Whose::Operator
        },
        hosts: Arc::new(hosts),
        streams: Arc::new(Semaphore::new(max_streams)),
        wires: Arc::new(Semaphore::new(limits.max_connections)),
        stop: stop.clone(),
        tracker: tracker.clone(),
        max_streams,
    };
    // Each route's scope is the one `openapi::ROUTES` documents.
    let mut api = Router::new();
    for (method, path, handler) in [
        ("get", "/metrics", get(metrics::scrape)),
        ("get", "/api/openapi.json", get(openapi_document)),
        ("get", "/api/tasks", get(api::tasks)),
        ("get", "/api/tasks/{task}", get(api::task)),
        ("get", "/api/tasks/{task}/logs", get(verbs::logs)),
        ("get", "/api/tasks/{task}/record", get(verbs::record)),
        ("get", "/api/slots", get(api::slots)),
        ("get", "/api/namespaces", get(namespaces::namespaces)),
        (
            "put",
            "/api/namespaces/{name}",
            put(namespaces::put_namespace),
        ),
        (
            "delete",
            "/api/namespaces/{name}",
            delete(namespaces::delete_namespace),
        ),
        ("get", "/api/slot-rules", get(slot_rules::slot_rules)),
        ("put", "/api/slot-rules", put(slot_rules::set_slot_rule)),
        (
            "delete",
            "/api/slot-rules",
            delete(slot_rules::unset_slot_rule),
        ),
        ("get", "/api/events", get(api::events)),
        ("get", "/api/plugins", get(verbs::plugins)),
        ("get", "/api/version", get(verbs::version)),
        ("get", "/api/wire", get(wire::upgrade)),
        (
            "put",
            "/api/plugins/{digest}",
            put(verbs::put_plugin).layer(DefaultBodyLimit::max(verbs::MAX_PLUGIN_BYTES)),
        ),
        (
            "post",
            "/api/tasks",
            post(verbs::submit).layer(DefaultBodyLimit::max(verbs::MAX_SUBMIT_BODY)),
        ),
        (
            "post",
            "/api/tasks/batch",
            post(verbs::submit_batch).layer(DefaultBodyLimit::max(verbs::MAX_BATCH_BODY)),
        ),
        ("get", "/api/tasks/{task}/outcome", get(verbs::outcome)),
        ("post", "/api/tasks/cancel", post(bulk::cancel)),
        ("post", "/api/tasks/rerun", post(bulk::rerun)),
        ("post", "/api/tasks/{task}/rerun", post(verbs::rerun)),
        ("post", "/api/tasks/{task}/cancel", post(api::cancel)),
        ("post", "/api/tasks/{task}/remove", post(api::remove)),
        (
            "delete",
            "/api/plugins/{digest}",
            delete(verbs::remove_plugin),
        ),
        ("post", "/api/shutdown", post(verbs::shutdown)),
        ("get", "/api/schedules", get(verbs::schedules)),
        (
            "post",
            "/api/schedules",
            post(verbs::add_schedule).layer(DefaultBodyLimit::max(verbs::MAX_SUBMIT_BODY)),
        ),
        (
            "delete",
            "/api/schedules/{schedule}",
            delete(verbs::remove_schedule),
        ),
        (
            "post",
            "/api/schedules/{schedule}/pause",
            post(verbs::pause_schedule),
        ),
        (
            "post",
            "/api/schedules/{schedule}/resume",
            post(verbs::resume_schedule),
        ),
        (
            "post",
            "/api/schedules/{schedule}/run",
            post(verbs::run_schedule),
        ),
        ("get", "/api/deployments", get(deployments::deployments)),
        ("post", "/api/deployments", post(deployments::deploy)),
        (
            "get",
            "/api/deployments/{deployment}",
            get(deployments::history),
        ),
        (
            "delete",
            "/api/deployments/{deployment}",
            delete(deployments::remove),
        ),
        (
            "post",
            "/api/deployments/{deployment}/rollback",
            post(deployments::rollback),
        ),
    ] {
        let scope = openapi::scope(method, path);
        let handler: MethodRouter<Http> = handler.route_layer(middleware::from_fn_with_state(
            (state.clone(), scope),
            authorize,
        ));
        api = api.route(path, handler);
    }
    let app = Router::new()
        .route("/", get(dashboard))
        .merge(api)
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .with_state(state);
    if let Some(tls) = &tls {
        tls.watch(stop.clone());
    }
    let acceptor = tls.map(|t| t.acceptor);
    tokio::spawn(conn::accept_loop(
        listener,
        app,
        limits,
        acceptor,
        tracker.clone(),
        stop.clone(),
    ));
    // Tests and scripts that asked for port 0 read the port from this line.
    tracing::info!("taskhost HTTP listening on {scheme}://{local}/ ({guarded})");
    if let Some(url) = dashboard_url {
        // The token in the fragment: a browser sends it to no server and
        // puts it in no Referer; the page takes it out of the address bar.
        tracing::info!("taskhost HTTP dashboard: {url}");
    }
    Server { stop, tracker }
}

/// `GET /api/openapi.json`.
async fn openapi_document() -> impl IntoResponse {
    axum::Json(openapi::document())
}

/// The dashboard page (static: every datum it shows needs the token).
async fn dashboard() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        include_str!("dashboard.html"),
    )
}

/// Refuses a request whose `Host` the listener does not answer to (a web
/// page that rebinds its own name to this address cannot reach the API),
/// and one whose `Origin` is not that host's own (a page elsewhere cannot
/// drive it).
async fn check_host(State(http): State<Http>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !http.hosts.accepts(host) {
        return api::error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this listener does not answer to Host `{}`: name {}",
                host.escape_debug(),
                http.hosts.describe()
            ),
        );
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !hosts::same_origin(origin, host) {
            return api::error(
                StatusCode::FORBIDDEN,
                format!(
                    "requests from pages of another origin are refused (Origin `{}`)",
                    origin.escape_debug()
                ),
            );
        }
    }
    next.run(request).await
}

/// Every endpoint but the page: a bearer token with at least the route's
/// scope (the token's scope goes on to the handler); a `POST` also needs a
/// JSON content type (which a cross-site form cannot send).
async fn authorize(
    State((http, needed)): State<(Http, Scope)>,
    mut request: Request,
    next: Next,
) -> Response {
    let given = token::bearer(request.headers()).unwrap_or("");
    let Some(credential) = http.tokens.credential_of(given) else {
        let whose = match http.whose {
            Whose::Operator => "the token in the daemon's --http-token-file",
            Whose::Own => {
                "the token the daemon keeps in http-token in its state directory; \
                 the dashboard URL in its log carries it"
            }
        };
        let mut response = api::error(
            StatusCode::UNAUTHORIZED,
            format!("send `Authorization: Bearer <token>` ({whose})"),
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"taskhost\""),
        );
        return response;
    };
    if credential.scope < needed {
        return api::error(StatusCode::FORBIDDEN, credential.scope.refusal(needed));
    }
    let named = request
        .headers()
        .get("x-taskhost-namespace")
        .and_then(|v| v.to_str().ok())
        .map(|v| crate::service::namespace::Ns::named(Some(v.trim())));
    if let Some(ns) = named.filter(|_| credential.reach == Reach::Every) {
        // A cluster's other nodes may have added it this second.
        crate::backend::Backend::daemon_wide(&http.daemon)
            .knows(&ns)
            .await;
    }
    let view = match view_of(&http, &credential, &request) {
        Ok(view) => view,
        Err(refused) => return *refused,
    };
    request.extensions_mut().insert(credential.scope);
    request.extensions_mut().insert(view.clone());
    request.extensions_mut().insert(credential);
    if request.method() == axum::http::Method::POST
        && !is_json(request.headers())
        && !is_bare(request.headers())
    {
        return api::error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send `Content-Type: application/json` with a POST that has a body".into(),
        );
    }
    let answer = as_json_error(conn::serving(request, next).await).await;
    if view == View::default() {
        return answer;
    }
    shown(&view, answer).await
}

/// An error of axum's own extractors (a query, a path, a body over its
/// limit) is plain text: it goes out as `{"error": text}`, as every other
/// error does.
async fn as_json_error(answer: Response) -> Response {
    let plain = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h.starts_with("text/plain"));
    if !answer.status().is_client_error() || !plain {
        return answer;
    }
    let status = answer.status();
    // Bounded: axum's rejections are one short sentence.
    let text = axum::body::to_bytes(answer.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    api::error(status, text)
}

/// The namespace a request acts in: its token's, or for a token of every
/// namespace the one the `X-Taskhost-Namespace` header names (`*`: every
/// one, as `--all-namespaces`). Another namespace, or one that does not
/// exist, is not found; the operator's routes (shutdown, plugin removal)
/// need a token of every namespace.
fn view_of(http: &Http, credential: &Credential, request: &Request) -> Result<View, Box<Response>> {
    // Not trimmed: ` alpha` names no namespace. Empty is absent.
    let asked = request
        .headers()
        .get("x-taskhost-namespace")
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        .filter(|v| !v.is_empty());
    let path = request.uri().path();
    // The metrics count every namespace's work: the operator's.
    let operators = path == "/metrics"
        || path == "/api/shutdown"
        || (request.method() == axum::http::Method::DELETE && path.starts_with("/api/plugins"))
        || (request.method() != axum::http::Method::GET && path.starts_with("/api/namespaces/"));
    if operators && credential.reach != Reach::Every {
        return Err(Box::new(api::error(
            StatusCode::FORBIDDEN,
            "this is the operator's: it needs a token of every namespace (a `admin TOKEN *` \
             line in the daemon's --http-token-file)"
                .into(),
        )));
    }
    let unknown = |name: &str| {
        Box::new(api::error(
            StatusCode::NOT_FOUND,
            format!("no namespace `{name}` (see `host ns ls`)"),
        ))
    };
    match (&credential.reach, asked) {
        (Reach::One(ns), None) => Ok(View::of(ns.clone())),
        (Reach::One(ns), Some(name)) if Ns::named(Some(name)) == *ns => Ok(View::of(ns.clone())),
        (Reach::One(_), Some(name)) => Err(unknown(name)),
        (Reach::Every, None) => Ok(View::default()),
        (Reach::Every, Some("*")) => Ok(View {
            acting: Ns::default(),
            all: true,
        }),
        (Reach::Every, Some(name)) => {
            let ns = Ns::named(Some(name));
            if crate::wire::protocol::check_namespace_name(name).is_err()
                || !http.daemon.namespaces.exists(&ns)
            {
                return Err(unknown(name));
            }
            Ok(View::of(ns))
        }
    }
}

/// A JSON answer as `view` shows it: every key it names turned back into
/// its name (see `server/view.rs`); streams are shown event by event.
async fn shown(view: &View, answer: Response) -> Response {
    if !is_json(answer.headers()) {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    // Bounded: these are the daemon's own answers, built whole in memory.
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return api::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the answer could not be read".into(),
        );
    };
    let text = String::from_utf8_lossy(&bytes);
    let text = view.text_with(&text, "\\u001f");
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(text))
}

/// A request with no body and no `Content-Type` (a form always sends one).
fn is_bare(headers: &HeaderMap) -> bool {
    let empty = headers
        .get(header::CONTENT_LENGTH)
        .is_none_or(|len| len.as_bytes() == b"0");
    empty
        && !headers.contains_key(header::CONTENT_TYPE)
        && !headers.contains_key(header::TRANSFER_ENCODING)
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}
