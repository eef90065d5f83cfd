//! Owns the checks of outbound HTTP (`wasi:http/outgoing-handler`), every
//! request's: its URL against the task's grant (`http_grant`) before
//! anything else (no DNS lookup of a name that is not granted; a URL with
//! a user name or password is refused), then every address the name
//! resolves to ([`forbidden`]: loopback, link-local, private, unspecified,
//! multicast and broadcast addresses and the host's own listeners are
//! reached only through a grant of that very IP address), and the
//! attempt's cap on requests in flight. A denied request fails with the
//! WASI error code `HTTP-request-denied` and leaves a line in the task's log
//! naming what was refused and the flag that would allow it. Allowed
//! requests go out through `outbound` to the addresses checked (never
//! resolved again), with the per-request timeouts capped at
//! [`DEFAULT_HTTP_CONNECT_TIMEOUT`] and [`DEFAULT_HTTP_FIRST_BYTE_TIMEOUT`],
//! and end at once when the task is cancelled. Nothing is reachable by
//! default. Redirects are not followed here: each hop is a new request,
//! checked again. An attempt with a grant that is recorded keeps each
//! request and its answer (`record::http`); its replay answers every
//! request from the record, with no grant, no check and no network.

#![forbid(unsafe_code)]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::http_grant::{HttpAllow, HttpScheme, normalize_host};
use super::outbound;
use super::output::Capture;
use super::record::http::{self as record_http, IoFuture, RecordedRequest, SendFuture};
use super::record::tape::Tape;
use taskhost_core::logline::LogLevel;

/// Longest a request may wait for its connection (TCP and TLS handshake);
/// a guest may set a shorter one in its `request-options`, never a longer
/// one.
pub const DEFAULT_HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a request may wait for the first byte of its response, and then
/// between two chunks of the response body; a guest may set shorter ones.
pub const DEFAULT_HTTP_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why outbound HTTP may reach `addr` only through a grant of that very
/// address, if it is such an address: loopback, link-local (169.254.0.0/16,
/// fe80::/10), private (10/8, 172.16/12, 192.168/16, fc00::/7),
/// unspecified (0.0.0.0/8, ::), multicast, broadcast, or one of the host's
/// own listeners (`own`; one on an unspecified address counts for every
/// address on its port). An IPv4 address written as IPv6 (`::ffff:a.b.c.d`)
/// is judged as IPv4.
pub(crate) fn forbidden(addr: SocketAddr, own: &[SocketAddr]) -> Option<&'static str> {
    let ip = addr.ip().to_canonical();
    if own.iter().any(|o| {
        o.port() == addr.port() && (o.ip().is_unspecified() || o.ip().to_canonical() == ip)
    }) {
        return Some("an address of this daemon's own listener");
    }
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_loopback() {
                Some("a loopback address")
            } else if v4.is_link_local() {
                Some("a link-local address")
            } else if v4.is_private() {
                Some("a private address")
            } else if v4.octets()[0] == 0 {
                Some("an unspecified address")
            } else if v4.is_broadcast() {
                Some("the broadcast address")
            } else if v4.is_multicast() {
                Some("a multicast address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("an unspecified address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a private address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else {
                None
            }
        }
    }
}

/// The host's own listening addresses, which outbound HTTP of every attempt
/// of a runtime reaches only through a grant of that very address (the
/// daemon adds its `--http` listener once it is bound).
#[derive(Debug, Default)]
pub(crate) struct OwnAddresses(RwLock<Vec<SocketAddr>>);

impl OwnAddresses {
    /// Adds one.
    pub(crate) fn add(&self, addr: SocketAddr) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(addr);
    }

    fn get(&self) -> Vec<SocketAddr> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The `wasi:http` hooks of one attempt: every request is checked against
/// the grant before anything else happens, then against the attempt's cap
/// on requests in flight, then by address once its name is resolved.
pub(crate) struct HttpHooks {
    grant: Arc<[HttpAllow]>,
    capture: Arc<Capture>,
    cancel: CancellationToken,
    /// One permit per request in flight, held until its response, body and
    /// connection are gone.
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    own: Arc<OwnAddresses>,
    /// Set once the cap on requests in flight refused one.
    refused: bool,
    /// Recording, every request and its answer are kept; replaying, the
    /// answers come from the record (no grant, no network).
    tape: Tape,
}

/// Where one checked request goes.
struct Target {
    scheme: HttpScheme,
    /// Normalized: lower case, no brackets, no trailing dot.
    host: String,
    port: u16,
    /// `scheme://host:port` for the log, IPv6 in brackets.
    shown: String,
}

impl HttpHooks {
    pub(crate) fn new(
        grant: &[HttpAllow],
        capture: Arc<Capture>,
        cancel: CancellationToken,
        max_in_flight: usize,
        own: Arc<OwnAddresses>,
        tape: Tape,
    ) -> Self {
        Self {
            grant: grant.into(),
            capture,
            cancel,
            in_flight: Arc::new(Semaphore::new(max_in_flight.min(Semaphore::MAX_PERMITS))),
            max_in_flight,
            own,
            refused: false,
            tape,
        }
    }

    /// Whether the cap on requests in flight refused a request.
    pub(crate) fn refused(&self) -> bool {
        self.refused
    }

    /// Where the request goes, if its URL may go out: no user name or
    /// password in it, and a grant naming its scheme, host and port. If
    /// not, the line for the task's log saying why.
    fn check(&self, uri: &http::Uri) -> Result<Target, String> {
        let scheme = uri.scheme_str().unwrap_or("https");
        let host = uri.host().unwrap_or_default();
        let parsed = match scheme.to_ascii_lowercase().as_str() {
            "http" => HttpScheme::Http,
            _ => HttpScheme::Https,
        };
        let port = uri.port_u16().unwrap_or(parsed.default_port());
        let shown_host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let shown = format!("{scheme}://{shown_host}:{port}");
        // `user:password@host`: `host()` leaves the user out, but the
        // authority (and the `Host` header made from it) keeps it. Refused
        // whole, and never written to the log.
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(format!(
                "outbound HTTP to {shown} denied: the URL names a user or password before the \
                 host (`…@`), which this host never sends; remove it from the URL"
            ));
        }
        if !self.grant.iter().any(|g| g.permits(scheme, host, port)) {
            let origin = HttpAllow::of_origin(parsed, host, port);
            return Err(format!(
                "outbound HTTP to {shown} denied: this task is not granted it; add \
                 --allow-http {origin}"
            ));
        }
        Ok(Target {
            scheme: parsed,
            host: normalize_host(host),
            port,
            shown,
        })
    }
}

/// Refuses a request whose host resolved to `addrs` when one of them may be
/// reached only through a grant of that very IP address ([`forbidden`]) and
/// `grant` has none; the error is the task's log line, naming the address
/// and the grant that would allow it.
fn check_addresses(
    grant: &[HttpAllow],
    own: &[SocketAddr],
    target: &Target,
    addrs: &[SocketAddr],
) -> Result<(), String> {
    for addr in addrs {
        let Some(why) = forbidden(*addr, own) else {
            continue;
        };
        let ip = addr.ip().to_canonical();
        let named = grant.iter().any(|g| {
            g.scheme() == target.scheme
                && g.port() == target.port
                && g.host()
                    .parse::<IpAddr>()
                    .is_ok_and(|g| g.to_canonical() == ip)
        });
        if named {
            continue;
        }
        let origin = HttpAllow::of_origin(target.scheme, &ip.to_string(), target.port);
        let what = if target.host.parse::<IpAddr>().is_ok() {
            format!("{} is {why}", target.host)
        } else {
            format!("{} resolves to {ip}, {why}", target.host)
        };
        return Err(format!(
            "outbound HTTP to {} denied: {what}, which only a grant of that IP address \
             reaches; add --allow-http {origin} to allow it",
            target.shown
        ));
    }
    Ok(())
}

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        // A replay answers from the record: no grant, no network.
        if let Tape::Replay(replaying) = &self.tape {
            let (future, line, refused) = record_http::replay_send(replaying, request);
            if let Some(line) = line {
                self.capture.log(LogLevel::Warn, &line);
            }
            self.refused |= refused;
            return future;
        }
        let (taped, request) = match &self.tape {
            Tape::Record(recording) => {
                let (taped, request) = RecordedRequest::new(recording, request);
                (Some(taped), request)
            }
            _ => (None, request),
        };
        // Denied or refused before it went out: the line logged says why.
        let fail = |capture: &Capture,
                    taped: Option<RecordedRequest>,
                    line: String,
                    error: HttpError|
         -> SendFuture {
            capture.log(LogLevel::Warn, &line);
            if let Some(taped) = taped {
                taped.failed(&error, Some(&line));
            }
            Box::new(async { Err(error) })
        };
        let target = match self.check(request.uri()) {
            Ok(target) => target,
            Err(line) => return fail(&self.capture, taped, line, HttpError::HttpRequestDenied),
        };
        let Ok(permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
            self.refused = true;
            let line = format!(
                "outbound HTTP to {} refused: this attempt already has {} requests in flight, \
                 its limit (raise it with --max-http-requests)",
                target.shown, self.max_in_flight
            );
            return fail(
                &self.capture,
                taped,
                line,
                HttpError::ConnectionLimitReached,
            );
        };
        let options = capped(options);
        let cancel = self.cancel.clone();
        let grant = Arc::clone(&self.grant);
        let own = self.own.get();
        let capture = Arc::clone(&self.capture);
        Box::new(async move {
            let mut denied = None;
            let send = async {
                // Name lookup and connection share the connect timeout.
                let deadline = tokio::time::Instant::now()
                    + options
                        .connect_timeout
                        .unwrap_or(DEFAULT_HTTP_CONNECT_TIMEOUT);
                let addrs =
                    tokio::time::timeout_at(deadline, outbound::resolve(&target.host, target.port))
                        .await
                        .map_err(|_| HttpError::ConnectionTimeout)??;
                if let Err(line) = check_addresses(&grant, &own, &target, &addrs) {
                    capture.log(LogLevel::Warn, &line);
                    denied = Some(line);
                    return Err(HttpError::HttpRequestDenied);
                }
                let tls = outbound::server_name(&target.host, target.scheme == HttpScheme::Https)?;
                outbound::send(request, &addrs, tls, deadline, &options, permit).await
            };
            let sent = tokio::select! {
                biased;
                () = cancel.cancelled() => Err(cancelled()),
                sent = send => sent,
            };
            let sent = sent.map(|(response, io)| {
                let response = response.map(|body| {
                    Cancellable {
                        body,
                        cancelled: Box::pin(cancel.clone().cancelled_owned()),
                        token: cancel,
                    }
                    .boxed_unsync()
                });
                (response, io)
            });
            match taped {
                Some(taped) => taped.finish(sent, denied).await,
                None => sent,
            }
        })
    }
}

/// The guest's request options with every timeout at most the default.
fn capped(options: Option<RequestOptions>) -> RequestOptions {
    let options = options.unwrap_or_default();
    let cap = |asked: Option<Duration>, max: Duration| Some(asked.map_or(max, |t| t.min(max)));
    RequestOptions {
        connect_timeout: cap(options.connect_timeout, DEFAULT_HTTP_CONNECT_TIMEOUT),
        first_byte_timeout: cap(options.first_byte_timeout, DEFAULT_HTTP_FIRST_BYTE_TIMEOUT),
        between_bytes_timeout: cap(
            options.between_bytes_timeout,
            DEFAULT_HTTP_FIRST_BYTE_TIMEOUT,
        ),
    }
}

/// The error a request gets when its task is cancelled mid-request.
fn cancelled() -> HttpError {
    HttpError::InternalError(Some(
        "the task was cancelled, so its request was dropped".to_owned(),
    ))
}

/// A response body that ends with an error as soon as the task is
/// cancelled, so a guest reading a slow body sees the cancellation at once.
struct Cancellable {
    body: WasiBody,
    token: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Body for Cancellable {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        if this.token.is_cancelled() || this.cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(cancelled())));
        }
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(text: &str) -> HttpAllow {
        HttpAllow::parse(text).unwrap()
    }

    #[test]
    fn special_addresses_are_named() {
        let at = |text: &str| forbidden(text.parse().unwrap(), &[]);
        for (addr, why) in [
            ("127.0.0.1:80", "a loopback address"),
            ("127.8.9.10:80", "a loopback address"),
            ("[::1]:80", "a loopback address"),
            ("[::ffff:127.0.0.1]:80", "a loopback address"),
            ("169.254.169.254:80", "a link-local address"),
            ("[fe80::1]:80", "a link-local address"),
            ("10.1.2.3:80", "a private address"),
            ("172.16.0.1:80", "a private address"),
            ("172.31.255.255:80", "a private address"),
            ("192.168.1.1:80", "a private address"),
            ("[fd00::1]:80", "a private address"),
            ("0.0.0.0:80", "an unspecified address"),
            ("[::]:80", "an unspecified address"),
            ("255.255.255.255:80", "the broadcast address"),
            ("224.0.0.1:80", "a multicast address"),
            ("[ff02::1]:80", "a multicast address"),
        ] {
            assert_eq!(at(addr), Some(why), "{addr}");
        }
        for public in ["93.184.216.34:443", "172.32.0.1:80", "[2606:4700::1]:443"] {
            assert_eq!(at(public), None, "{public}");
        }
        let own = ["203.0.113.5:9100".parse().unwrap()];
        let on = |text: &str| forbidden(text.parse().unwrap(), &own);
        assert_eq!(
            on("203.0.113.5:9100"),
            Some("an address of this daemon's own listener")
        );
        assert_eq!(on("203.0.113.5:9101"), None);
        let any = ["0.0.0.0:9100".parse().unwrap()];
        assert!(forbidden("198.51.100.7:9100".parse().unwrap(), &any).is_some());
    }

    #[test]
    fn a_special_address_needs_a_grant_of_that_address() {
        let target = |host: &str| Target {
            scheme: HttpScheme::Http,
            host: host.to_owned(),
            port: 8080,
            shown: format!("http://{host}:8080"),
        };
        let loopback = ["127.0.0.1:8080".parse().unwrap()];
        let by_name = [allow("http://localhost:8080")];
        assert_eq!(
            check_addresses(&by_name, &[], &target("localhost"), &loopback).unwrap_err(),
            "outbound HTTP to http://localhost:8080 denied: localhost resolves to 127.0.0.1, a \
             loopback address, which only a grant of that IP address reaches; add \
             --allow-http http://127.0.0.1:8080 to allow it"
        );
        let by_address = [
            allow("http://localhost:8080"),
            allow("http://127.0.0.1:8080"),
        ];
        assert_eq!(
            check_addresses(&by_address, &[], &target("localhost"), &loopback),
            Ok(())
        );
        // Another port or scheme of the address is not a grant of it.
        let elsewhere = [allow("http://127.0.0.1:8081"), allow("127.0.0.1:8080")];
        assert!(check_addresses(&elsewhere, &[], &target("localhost"), &loopback).is_err());
        // A name resolving partly to a private address is refused whole.
        let mixed = [
            "93.184.216.34:8080".parse().unwrap(),
            "10.0.0.7:8080".parse().unwrap(),
        ];
        let wild = [allow("http://*.example.com:8080")];
        let err = check_addresses(&wild, &[], &target("a.example.com"), &mixed).unwrap_err();
        assert!(
            err.contains("a.example.com resolves to 10.0.0.7, a private address"),
            "{err}"
        );
        assert!(
            err.ends_with("add --allow-http http://10.0.0.7:8080 to allow it"),
            "{err}"
        );
        let public = ["93.184.216.34:8080".parse().unwrap()];
        assert_eq!(
            check_addresses(&wild, &[], &target("a.example.com"), &public),
            Ok(())
        );
        let v6 = ["[::1]:8080".parse().unwrap()];
        let err = check_addresses(&by_name, &[], &target("localhost"), &v6).unwrap_err();
        assert!(
            err.ends_with("add --allow-http http://[::1]:8080 to allow it"),
            "{err}"
        );
    }

    #[test]
    fn guest_timeouts_are_capped_at_the_defaults() {
        let got = capped(Some(RequestOptions {
            connect_timeout: Some(Duration::from_secs(3600)),
            first_byte_timeout: Some(Duration::from_millis(5)),
            between_bytes_timeout: None,
        }));
        assert_eq!(got.connect_timeout, Some(DEFAULT_HTTP_CONNECT_TIMEOUT));
        assert_eq!(got.first_byte_timeout, Some(Duration::from_millis(5)));
        assert_eq!(
            got.between_bytes_timeout,
            Some(DEFAULT_HTTP_FIRST_BYTE_TIMEOUT)
        );
    }
}
