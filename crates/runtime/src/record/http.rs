//! Owns outbound HTTP on a tape. Recording, each request the guest sends
//! is a call ([`Ask::Http`]: method, URL, digests of its headers and body)
//! reserved when it is sent, so that it keeps its place among the calls
//! whatever comes meanwhile; its answer is the whole response (status,
//! headers, the body read to its end, trailers) or the error, with the
//! line the host logged if it denied or refused the request. The guest
//! gets the response as it was recorded, from memory. A body larger than
//! the record's budget leaves ends the record there (truncated) and goes
//! to the guest unchanged. Replaying, a request is answered from its
//! record and reaches neither a grant nor the network: another request
//! there is a divergence.

#![forbid(unsafe_code)]

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use sha2::{Digest as _, Sha256};
use tokio_util::task::AbortOnDropHandle;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::format::{Answer, Ask, Call, RecordedResponse, sha256};
use super::tape::{Recording, Replaying, wrong_answer};

/// What `send_request` answers with: the response and the connection's
/// future, or the error.
pub(crate) type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;
/// A sent request's response and connection, or its error.
pub(crate) type Sent = Result<(http::Response<WasiBody>, IoFuture), HttpError>;
/// The future `send_request` returns.
pub(crate) type SendFuture = Box<dyn Future<Output = Sent> + Send>;

/// The question a request asks, its body's digest `body`.
fn ask_of(request: &http::Request<WasiBody>, body: [u8; 32]) -> Ask {
    let uri = request.uri();
    let authority = uri.authority().map_or("", |a| a.as_str());
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (Some(user), host),
        None => (None, authority),
    };
    let mut headers = Sha256::new();
    let mut part = |bytes: &[u8]| {
        headers.update((bytes.len() as u64).to_le_bytes());
        headers.update(bytes);
    };
    if let Some(user) = userinfo {
        part(b"userinfo");
        part(user.as_bytes());
    }
    for (name, value) in request.headers() {
        part(name.as_str().as_bytes());
        part(value.as_bytes());
    }
    Ask::Http {
        method: request.method().to_string(),
        uri: format!(
            "{}://{host}{}",
            uri.scheme_str().unwrap_or_default(),
            uri.path_and_query().map_or("", |p| p.as_str())
        ),
        headers: headers.finalize().into(),
        body,
    }
}

/// Whether two requests are the same but for their bodies.
fn same_but_body(a: &Ask, b: &Ask) -> bool {
    match (a, b) {
        (
            Ask::Http {
                method,
                uri,
                headers,
                ..
            },
            Ask::Http {
                method: m,
                uri: u,
                headers: h,
                ..
            },
        ) => method == m && uri == u && headers == h,
        _ => false,
    }
}

/// A request body that digests what is read of it.
struct Digesting {
    body: WasiBody,
    digest: Arc<Mutex<Sha256>>,
}

impl Body for Digesting {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.digest
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .update(data);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request being recorded: its call was reserved when it was sent.
pub(crate) struct RecordedRequest {
    recording: Arc<Recording>,
    at: u64,
    ask: Ask,
    body: Arc<Mutex<Sha256>>,
    done: bool,
}

impl RecordedRequest {
    /// Reserves the call of `request`, whose body is digested as it is
    /// read (the request comes back with that body).
    pub(crate) fn new(
        recording: &Arc<Recording>,
        request: http::Request<WasiBody>,
    ) -> (Self, http::Request<WasiBody>) {
        let ask = ask_of(&request, sha256(&[]));
        let at = recording.reserve(ask.clone());
        let digest = Arc::new(Mutex::new(Sha256::new()));
        let request = request.map(|body| {
            Digesting {
                body,
                digest: Arc::clone(&digest),
            }
            .boxed_unsync()
        });
        let recorded = Self {
            recording: Arc::clone(recording),
            at,
            ask,
            body: digest,
            done: false,
        };
        (recorded, request)
    }

    fn fill(&mut self, answer: Option<Answer>) {
        self.done = true;
        let call = answer.map(|answer| Call {
            ask: self.ask.clone(),
            answer,
        });
        self.recording.fill(self.at, call);
    }

    /// The request failed with `error` (`line`: what the host logged when
    /// it denied or refused it). Its body is not digested: a replay does
    /// not read it.
    pub(crate) fn failed(mut self, error: &HttpError, line: Option<&str>) {
        self.fill(Some(Answer::Response(Err(error_text(error, line)))));
    }

    /// Records how the request went, `line` the host's if it denied it,
    /// and gives the guest what it recorded: the response's body read
    /// whole, or, past the budget, the response unchanged.
    pub(crate) async fn finish(mut self, sent: Sent, line: Option<String>) -> Sent {
        let (response, io) = match sent {
            Ok(sent) => sent,
            Err(error) => {
                self.failed(&error, line.as_deref());
                return Err(error);
            }
        };
        // The connection must go on while the body is read here.
        let connection = AbortOnDropHandle::new(tokio::spawn(Pin::from(io)));
        let io: IoFuture = Box::new(async move {
            connection
                .await
                .unwrap_or_else(|e| Err(HttpError::InternalError(Some(e.to_string()))))
        });
        let room = self.recording.room();
        let (parts, mut body) = response.into_parts();
        let headers = pairs(&parts.headers);
        let mut size: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        let mut data = Vec::new();
        let mut trailers = None;
        let mut error = None;
        while let Some(frame) = body.frame().await {
            match frame.map(Frame::into_data) {
                Ok(Ok(bytes)) => {
                    size = size.saturating_add(bytes.len());
                    data.extend_from_slice(&bytes);
                    if size > room {
                        // Past the budget: the record ends here, and the
                        // guest gets the response as it comes.
                        self.fill(None);
                        let body = Prefixed {
                            first: Some(Bytes::from(data)),
                            rest: body,
                        };
                        return Ok((http::Response::from_parts(parts, body.boxed_unsync()), io));
                    }
                }
                Ok(Err(frame)) => {
                    if let Ok(map) = frame.into_trailers() {
                        trailers = Some(pairs(&map));
                    }
                }
                Err(e) => {
                    error = Some(error_text(&e, None));
                    break;
                }
            }
        }
        let recorded = RecordedResponse {
            status: parts.status.as_u16(),
            headers,
            body: data,
            trailers,
            error,
        };
        let response = response_of(&recorded);
        if let Ask::Http { body, .. } = &mut self.ask {
            let digest = self.body.lock().unwrap_or_else(PoisonError::into_inner);
            *body = digest.clone().finalize().into();
        }
        self.fill(Some(Answer::Response(Ok(recorded))));
        Ok((response, io))
    }
}

impl Drop for RecordedRequest {
    fn drop(&mut self) {
        // Dropped before its answer (the guest dropped the request): the
        // guest never sees one, so any will do.
        if !self.done {
            self.fill(Some(Answer::Response(Err(
                "internal error: the request was dropped before its answer".into(),
            ))));
        }
    }
}

/// A header map's pairs, in order.
fn pairs(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    map.iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}

/// A header map of recorded pairs.
fn map_of(pairs: &[(String, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// The response the guest gets from a recorded one.
fn response_of(recorded: &RecordedResponse) -> http::Response<WasiBody> {
    let mut response = http::Response::new(
        Replayed {
            data: (!recorded.body.is_empty()).then(|| Bytes::from(recorded.body.clone())),
            trailers: recorded.trailers.as_deref().map(map_of),
            error: recorded.error.clone(),
        }
        .boxed_unsync(),
    );
    *response.status_mut() =
        http::StatusCode::from_u16(recorded.status).unwrap_or(http::StatusCode::OK);
    *response.headers_mut() = map_of(&recorded.headers);
    response
}

/// A body read already, its first bytes, then the rest as it comes.
struct Prefixed {
    first: Option<Bytes>,
    rest: WasiBody,
}

impl Body for Prefixed {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut this.rest).poll_frame(cx)
    }
}

/// A recorded body: its bytes, its trailers, then its error.
struct Replayed {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    error: Option<String>,
}

impl Body for Replayed {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        let frame = if let Some(data) = this.data.take() {
            Some(Ok(Frame::data(data)))
        } else if let Some(trailers) = this.trailers.take() {
            Some(Ok(Frame::trailers(trailers)))
        } else {
            this.error.take().map(|text| Err(error_of(&text).0))
        };
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none() && self.error.is_none()
    }
}

/// What a replay answers a request with, from its record: the future
/// `send_request` returns, and the line to log if the recorded request was
/// denied or refused (with whether the in-flight cap refused it).
pub(crate) fn replay_send(
    replaying: &Arc<Replaying>,
    request: http::Request<WasiBody>,
) -> (SendFuture, Option<String>, bool) {
    let asked = ask_of(&request, sha256(&[]));
    let stopped = |stop: super::tape::Stop| HttpError::InternalError(Some(stop.to_string()));
    let (
        number,
        Call {
            ask: recorded_ask,
            answer,
        },
    ) = match replaying.claim(&asked, |r| same_but_body(r, &asked)) {
        Ok(claimed) => claimed,
        Err(stop) => {
            let error = stopped(stop);
            return (Box::new(async { Err(error) }), None, false);
        }
    };
    let recorded = match answer {
        Answer::Response(Ok(recorded)) => recorded,
        Answer::Response(Err(text)) => {
            let (error, line) = error_of(&text);
            let refused = line.is_some() && matches!(error, HttpError::ConnectionLimitReached);
            return (Box::new(async { Err(error) }), line, refused);
        }
        other => {
            let error = HttpError::InternalError(Some(wrong_answer(&other).to_string()));
            return (Box::new(async { Err(error) }), None, false);
        }
    };
    let replaying = Arc::clone(replaying);
    let future = async move {
        // The guest's body is read whole, as the recorded request's was.
        let mut digest = Sha256::new();
        let mut body = request.into_body();
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                digest.update(data);
            }
        }
        let mut asked = asked;
        if let Ask::Http { body, .. } = &mut asked {
            *body = digest.finalize().into();
        }
        replaying
            .settle(number, &recorded_ask, &asked)
            .map_err(stopped)?;
        let io: IoFuture = Box::new(async { Ok(()) });
        Ok((response_of(&recorded), io))
    };
    (Box::new(future), None, false)
}

/// An error's text as a record keeps it: that of the `wasi:http` error
/// code the guest gets (as the default hooks map the errors of a
/// connection), then the host's `line`, if any, after a line break.
pub(crate) fn error_text(error: &HttpError, line: Option<&str>) -> String {
    use std::error::Error as _;
    let code = match error {
        HttpError::Hyper(err) => match err.source().and_then(|c| c.downcast_ref::<ErrorCode>()) {
            Some(code) => HttpError::from(code.clone()).to_string(),
            None => HttpError::HttpProtocolError.to_string(),
        },
        HttpError::Connect(err)
            if err.kind() == std::io::ErrorKind::AddrNotAvailable
                || err
                    .to_string()
                    .starts_with("failed to lookup address information") =>
        {
            dns_error("address not available").to_string()
        }
        HttpError::Connect(_) => HttpError::ConnectionRefused.to_string(),
        HttpError::Tls(_) => HttpError::TlsProtocolError.to_string(),
        HttpError::InvalidDnsNameError(_) => dns_error("invalid dns name").to_string(),
        other => other.to_string(),
    };
    match line {
        Some(line) => format!("{code}\n{line}"),
        None => code,
    }
}

fn dns_error(rcode: &str) -> HttpError {
    HttpError::DnsError {
        rcode: Some(rcode.to_owned()),
        info_code: None,
    }
}

/// The error a recorded text stands for, and the host's line, if any.
/// The codes that carry details other than a DNS error's, a size or an
/// internal error's message come back as internal errors with that text.
pub(crate) fn error_of(text: &str) -> (HttpError, Option<String>) {
    let (code, line) = match text.split_once('\n') {
        Some((code, line)) => (code, Some(line.to_owned())),
        None => (text, None),
    };
    (code_of(code), line)
}

fn code_of(code: &str) -> HttpError {
    use HttpError as E;
    let plain = || {
        [
            E::DnsTimeout,
            E::DestinationNotFound,
            E::DestinationUnavailable,
            E::DestinationIpProhibited,
            E::DestinationIpUnroutable,
            E::ConnectionRefused,
            E::ConnectionTerminated,
            E::ConnectionTimeout,
            E::ConnectionReadTimeout,
            E::ConnectionWriteTimeout,
            E::ConnectionLimitReached,
            E::TlsProtocolError,
            E::TlsCertificateError,
            E::HttpRequestDenied,
            E::HttpRequestLengthRequired,
            E::HttpRequestMethodInvalid,
            E::HttpRequestUriInvalid,
            E::HttpRequestUriTooLong,
            E::HttpResponseIncomplete,
            E::HttpResponseTimeout,
            E::HttpUpgradeFailed,
            E::HttpProtocolError,
            E::LoopDetected,
            E::ConfigurationError,
            E::InternalError(None),
            E::HttpRequestBodySize(None),
            E::HttpResponseBodySize(None),
            E::HttpRequestHeaderSectionSize(None),
            E::HttpResponseHeaderSectionSize(None),
            E::HttpRequestTrailerSectionSize(None),
            E::HttpResponseTrailerSectionSize(None),
            E::DnsError {
                rcode: None,
                info_code: None,
            },
        ]
    };
    if let Some(error) = plain().into_iter().find(|e| e.to_string() == code) {
        return error;
    }
    if let Some(message) = code.strip_prefix("internal error: ") {
        return E::InternalError(Some(message.to_owned()));
    }
    if let Some(rest) = code.strip_prefix("DNS error: rcode ") {
        let (rcode, info_code) = match rest.rsplit_once(" (info code ") {
            Some((rcode, info)) => match info.strip_suffix(')').and_then(|i| i.parse().ok()) {
                Some(info) => (rcode, Some(info)),
                None => (rest, None),
            },
            None => (rest, None),
        };
        return E::DnsError {
            rcode: Some(rcode.to_owned()),
            info_code,
        };
    }
    let size = |prefix: &str| -> Option<u64> {
        code.strip_prefix(prefix)?
            .strip_suffix(" bytes")?
            .parse()
            .ok()
    };
    if let Some(n) = size("HTTP request body size exceeds limit: ") {
        return E::HttpRequestBodySize(Some(n));
    }
    if let Some(n) = size("HTTP response body size exceeds limit: ") {
        return E::HttpResponseBodySize(Some(n));
    }
    E::InternalError(Some(code.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::super::tape::Stop;
    use super::*;

    fn get(url: &str) -> http::Request<WasiBody> {
        let body = http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        http::Request::get(url).body(body).unwrap()
    }

    fn recorded(url: &str, body: &[u8]) -> Call {
        Call {
            ask: ask_of(&get(url), sha256(&[])),
            answer: Answer::Response(Ok(RecordedResponse {
                status: 201,
                headers: vec![("x-n".into(), b"7".to_vec())],
                body: body.to_vec(),
                trailers: None,
                error: None,
            })),
        }
    }

    #[tokio::test]
    async fn a_replay_answers_the_recorded_request_from_the_record() {
        let replaying = Replaying::new(vec![recorded("http://127.0.0.1:9/a?b=1", b"hi")], None);
        let (future, line, refused) = replay_send(&replaying, get("http://127.0.0.1:9/a?b=1"));
        assert_eq!((line, refused), (None, false));
        let (response, _io) = Box::into_pin(future).await.unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["x-n"], "7");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hi");
        assert_eq!(replaying.result(), (None, None, 1, 1));
    }

    #[tokio::test]
    async fn another_url_than_recorded_is_a_divergence_at_that_call() {
        let replaying = Replaying::new(vec![recorded("http://127.0.0.1:9/a", b"hi")], None);
        let (future, _, _) = replay_send(&replaying, get("http://127.0.0.1:9/other"));
        let Err(error) = Box::into_pin(future).await else {
            panic!("another request than recorded was answered");
        };
        assert!(error.to_string().contains("diverged"), "{error}");
        let (stop, divergence, _, _) = replaying.result();
        assert_eq!(stop, Some(Stop::Diverged { call: 1 }));
        let divergence = divergence.unwrap();
        assert!(divergence.asked.contains("GET http://127.0.0.1:9/other"));
        assert!(
            divergence
                .recorded
                .is_some_and(|r| r.contains("GET http://127.0.0.1:9/a,"))
        );
    }

    #[test]
    fn error_texts_come_back_as_their_codes() {
        for error in [
            HttpError::HttpRequestDenied,
            HttpError::ConnectionRefused,
            HttpError::InternalError(Some("gone".into())),
            HttpError::DnsError {
                rcode: Some("address not available".into()),
                info_code: Some(3),
            },
            HttpError::HttpResponseBodySize(Some(12)),
        ] {
            let text = error_text(&error, Some("the host's line"));
            let (back, line) = error_of(&text);
            assert_eq!(back.to_string(), error.to_string());
            assert_eq!(line.as_deref(), Some("the host's line"));
        }
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "no");
        assert_eq!(
            error_text(&HttpError::Connect(refused), None),
            "connection refused"
        );
    }
}
