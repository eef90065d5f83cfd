//! Owns the HTTP listener's connections: the accept loop, the cap on the
//! connections open at once (one over it is closed as soon as it is
//! accepted, with a warning at most once a second), hyper's HTTP/1 server
//! with its header read timeout (which also closes a keep-alive connection
//! idle for that long, since the wait for its next request is a header
//! read), and the graceful stop: once `stop` is cancelled no connection is
//! accepted and the open ones finish their current request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often at most a refused connection or a failed accept is logged.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// How long the loop pauses after a failed accept (out of descriptors and
/// the like), so that it does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

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
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut refused = Throttle::default();
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
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            if let Some(more) = refused.note() {
                tracing::warn!(
                    "HTTP connection refused: {} are open, the most --http-max-connections \
                     (http_max_connections) allows{}",
                    limits.max_connections,
                    since(more)
                );
            }
            drop(stream);
            continue;
        };
        let (builder, app, stop) = (builder.clone(), app.clone(), stop.clone());
        match &tls {
            None => {
                tracker.spawn(serve(stream, peer, permit, builder, app, stop));
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tracker.spawn(async move {
                    // The handshake is part of the header's time.
                    let shaken =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await;
                    match shaken {
                        Ok(Ok(stream)) => serve(stream, peer, permit, builder, app, stop).await,
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

/// Serves one connection; its permit is given back when it ends.
async fn serve<S>(
    stream: S,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    builder: http1::Builder,
    app: Router,
    stop: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _permit = permit;
    let conn = builder
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let served = tokio::select! {
        served = conn.as_mut() => served,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(err) = served {
        tracing::debug!("HTTP connection from {peer} ended: {err}");
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
