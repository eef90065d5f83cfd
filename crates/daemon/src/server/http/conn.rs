//! Owns the HTTP listener's connections: the accept loop, the cap on the
//! connections open at once, hyper's HTTP/1 server with its header read
//! timeout (which also closes a keep-alive connection idle for that long,
//! since the wait for its next request is a header read), and the graceful
//! stop: once `stop` is cancelled no connection is accepted and the open
//! ones finish their current request.
//!
//! At the cap, a new connection takes the place of the one idle the
//! longest (`registry.rs`: one that has not sent a request's whole head,
//! a keep-alive one between requests, or one whose request carries no
//! valid token), which is closed at once; only when every open connection
//! is serving a request with a valid token is the new one closed instead.
//! Either is logged at most once a second.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::middleware::Next;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::registry::{Place, Registry, Serving};

/// How often at most a refused connection, one closed to make room, or a
/// failed accept is logged.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// How long the loop pauses after a failed accept (out of descriptors and
/// the like), so that it does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// How many connections the kernel may hold for the accept loop (capped
/// by `net.core.somaxconn`): a burst of this many is accepted in turn,
/// each taking an idle one's place, rather than having its connection
/// attempts dropped (a client then retries only after a second). The
/// standard library's 128 overflowed under a burst of a few hundred.
const ACCEPT_BACKLOG: u32 = 1024;

/// Binds the listening socket.
pub(super) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As the standard library does: a restarted daemon binds its port
    // again while the old connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// The connections' bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Most connections open at once.
    pub(super) max_connections: usize,
    /// Time to send a request's header, from the connection's start or the
    /// previous answer.
    pub(super) header_timeout: Duration,
}

/// Accepts and serves connections until `stop` is cancelled.
pub(super) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let registry = Arc::new(Registry::default());
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut refused = Throttle::default();
    let mut evicted = Throttle::default();
    let mut failed = Throttle::default();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                if let Some(more) = failed.note() {
                    tracing::warn!("HTTP accept failed: {err}{}", since(more));
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_PAUSE) => continue,
                }
            }
        };
        // Small answers and event lines go out at once.
        let _ = stream.set_nodelay(true);
        let permit = match Arc::clone(&open).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) if registry.close_longest_idle() => {
                if let Some(more) = evicted.note() {
                    tracing::warn!(
                        "HTTP connection closed to make room: {} are open, the most \
                         --http-max-connections (http_max_connections) allows, so the one \
                         idle the longest (no request under way) was closed for a new one{}",
                        limits.max_connections,
                        since(more)
                    );
                }
                // Its task ends as soon as it sees that, giving its place
                // back (a permit freed by another ending is as good).
                let waited = tokio::select! {
                    () = stop.cancelled() => break,
                    permit = Arc::clone(&open).acquire_owned() => permit,
                };
                let Ok(permit) = waited else { break };
                permit
            }
            Err(_) => {
                if let Some(more) = refused.note() {
                    tracing::warn!(
                        "HTTP connection refused: {} are open and each is serving a request, \
                         the most --http-max-connections (http_max_connections) allows{}",
                        limits.max_connections,
                        since(more)
                    );
                }
                drop(stream);
                continue;
            }
        };
        let place = registry.admit();
        let (builder, app, stop) = (builder.clone(), app.clone(), stop.clone());
        match &tls {
            None => {
                tracker.spawn(serve(stream, peer, place, permit, builder, app, stop));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tracker.spawn(async move {
                    // The handshake is part of the header's time, and the
                    // connection is idle (may be closed for another) during it.
                    let shaken = tokio::select! {
                        biased;
                        () = place.closed() => return,
                        shaken = tokio::time::timeout(
                            limits.header_timeout,
                            acceptor.accept(stream),
                        ) => shaken,
                    };
                    match shaken {
                        Ok(Ok(stream)) => {
                            serve(stream, peer, place, permit, builder, app, stop).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!("TLS handshake with {peer} failed: {err}");
                        }
                        Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
                    }
                });
            }
        }
    }
}

/// Serves one connection; its permit is given back, and its place in the
/// registry removed, when it ends (or is closed to make room).
async fn serve<S>(
    stream: S,
    peer: SocketAddr,
    place: Place,
    permit: OwnedSemaphorePermit,
    builder: http1::Builder,
    app: Router,
    stop: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _permit = permit;
    let service = Tracked {
        inner: TowerToHyperService::new(app),
        place: place.clone(),
    };
    let conn = builder
        .serve_connection(TokioIo::new(place.watch(stream)), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let served = tokio::select! {
        biased;
        () = place.closed() => return,
        served = conn.as_mut() => served,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                biased;
                () = place.closed() => return,
                served = conn.as_mut() => served,
            }
        }
    };
    if let Err(err) = served {
        tracing::debug!("HTTP connection from {peer} ended: {err}");
    }
}

/// The router, as one connection's service: each request carries the
/// connection's place to [`serving`].
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    place: Place,
}

impl Service<Request<Incoming>> for Tracked {
    type Response = <TowerToHyperService<Router> as Service<Request<Incoming>>>::Response;
    type Error = <TowerToHyperService<Router> as Service<Request<Incoming>>>::Error;
    type Future = <TowerToHyperService<Router> as Service<Request<Incoming>>>::Future;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.place.clone());
        self.inner.call(request)
    }
}

/// Runs a request that carries a valid token with its connection serving
/// (never closed to make room) until its answer's body has ended and been
/// written out; an upgraded connection serves for good. A request without
/// one (answered at once: 401, the dashboard page) leaves its connection
/// idle, so that requests pipelined by a client that never reads its
/// answers (hyper stops at a full buffer, the answer never ends) cannot
/// hold a place either.
pub(super) async fn serving(request: axum::extract::Request, next: Next) -> Response<Body> {
    let Some(place) = request.extensions().get::<Place>().cloned() else {
        return next.run(request).await;
    };
    let Some(serving) = place.serve() else {
        // Closed to make room just as its head came in: not served (the
        // connection ends without this answer, most likely).
        return closing();
    };
    let response = next.run(request).await;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        serving.upgraded();
        return response;
    }
    response.map(|body| {
        Body::new(Guarded {
            body,
            _serving: serving,
        })
    })
}

/// The answer to a request on a connection being closed to make room.
fn closing() -> Response<Body> {
    let mut response = Response::new(Body::from(
        "{\"error\":\"this idle connection was closed to make room for another \
         (--http-max-connections): connect again\"}",
    ));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An answer's body, holding its connection serving until it is dropped
/// (hyper drops it once it has taken its last frame).
struct Guarded {
    body: Body,
    _serving: Serving,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Lets one warning through per `WARN_EVERY`, counting the ones held back.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    held_back: u64,
}

impl Throttle {
    /// `Some(n)` when this occurrence is to be logged, `n` being how many
    /// were not since the last one that was.
    fn note(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < WARN_EVERY)
        {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }
}

/// The tail of a throttled warning.
fn since(held_back: u64) -> String {
    if held_back == 0 {
        String::new()
    } else {
        format!(" ({held_back} more since the last such warning)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_lets_one_through_per_second_and_counts_the_rest() {
        let mut throttle = Throttle::default();
        assert_eq!(throttle.note(), Some(0));
        assert_eq!(throttle.note(), None);
        assert_eq!(throttle.note(), None);
        throttle.last = throttle.last.and_then(|t| t.checked_sub(WARN_EVERY));
        assert_eq!(throttle.note(), Some(2));
        assert_eq!(throttle.note(), None);
    }
}
