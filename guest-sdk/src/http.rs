//! Outbound HTTP from a plugin: [`get`], [`post`] and [`Request`] for the
//! rest, over `wasi:http/outgoing-handler` (behind the `http` feature; the
//! `json` feature adds [`Request::json`] and [`Response::json`]).
//!
//! The host denies every request unless the submission grants its host with
//! `--allow-http HOST[:PORT]` (https by default, `http://HOST[:PORT]` for
//! plain http). Declare [`Capability::Network`](crate::Capability::Network)
//! in [`describe`](crate::Task::describe) so that a submission without any
//! grant is refused before it runs, with the flag to add.
//!
//! ```no_run
//! use taskhost_guest::{Capability, Context, PluginInfo, Task, TaskError, http};
//!
//! struct Status;
//!
//! impl Task for Status {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("status", "0.1.0").capability(Capability::Network)
//!     }
//!
//!     fn run(ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, TaskError> {
//!         let url = ctx.param_required("url")?;
//!         // `?` turns an HTTP error into the right TaskError: a denied host
//!         // is fatal, a cancelled task canceled, anything else retryable.
//!         let response = http::get(url)?.error_for_status()?;
//!         taskhost_guest::info!(ctx, "{url}: HTTP {}", response.status());
//!         Ok(response.into_body())
//!     }
//! }
//!
//! taskhost_guest::export_task!(Status);
//! ```
//!
//! Run it with `host run status.wasm --param url=https://api.example.com/health
//! --allow-http api.example.com`.
//!
//! Redirects (301, 302, 303, 307, 308) are followed hop by hop, up to
//! [`DEFAULT_MAX_REDIRECTS`] ([`Request::max_redirects`]); the host checks
//! every hop against the grant. A 303, and a 301 or 302 answering anything
//! but GET or HEAD, continue as a GET without a body; `authorization` and
//! `cookie` headers are not sent to another origin. The whole response body
//! is read into memory.
//!
//! Cancellation: when the task is cancelled, the host ends an in-flight
//! request at once and this module returns [`Error::Cancelled`], which `?`
//! turns into [`TaskError::canceled`].

use std::fmt;
use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingResponse, Method as WasiMethod, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::StreamError;

use crate::TaskError;

/// How many redirects a request follows by default.
pub const DEFAULT_MAX_REDIRECTS: u32 = 5;
/// Bytes written to the request body per host call.
const WRITE_CHUNK: usize = 4096;
/// Bytes asked for per read of the response body.
const READ_CHUNK: u64 = 64 * 1024;

/// An HTTP method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// DELETE
    Delete,
    /// PATCH
    Patch,
    /// OPTIONS
    Options,
    /// Any other method, such as `PROPFIND`.
    Other(String),
}

impl Method {
    fn to_wasi(&self) -> WasiMethod {
        match self {
            Self::Get => WasiMethod::Get,
            Self::Head => WasiMethod::Head,
            Self::Post => WasiMethod::Post,
            Self::Put => WasiMethod::Put,
            Self::Delete => WasiMethod::Delete,
            Self::Patch => WasiMethod::Patch,
            Self::Options => WasiMethod::Options,
            Self::Other(m) => WasiMethod::Other(m.clone()),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
            Self::Patch => "PATCH",
            Self::Options => "OPTIONS",
            Self::Other(m) => m,
        })
    }
}

/// Why a request did not produce a response (or, with
/// [`Response::error_for_status`], not a successful one).
///
/// It converts into a [`TaskError`] with `?`: [`Error::Denied`] and
/// [`Error::InvalidUrl`] are fatal (retrying cannot help),
/// [`Error::Cancelled`] is [`TaskError::canceled`], the rest are retryable
/// failures. Like `TaskError`, it does not implement
/// [`std::error::Error`], so that this conversion can exist next to
/// `TaskError`'s blanket one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not `http://` or `https://` followed by a host.
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The host refused the request: the task is not granted this host (the
    /// task's log names the `--allow-http` flag to add).
    Denied {
        /// The URL of the denied request (after redirects, the denied hop).
        url: String,
    },
    /// The task was cancelled while the request was in flight.
    Cancelled,
    /// The connection, the first byte or the next chunk took too long.
    Timeout {
        /// The URL.
        url: String,
    },
    /// More than the allowed number of redirects.
    TooManyRedirects {
        /// The first URL.
        url: String,
        /// How many were allowed.
        max: u32,
    },
    /// The answer's status is not 2xx (from [`Response::error_for_status`]).
    Status {
        /// The URL that answered.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the answer's body, as text.
        body: String,
    },
    /// Anything else the transport reported (DNS, refused connection, TLS,
    /// protocol errors), or a body that is not what was asked (JSON).
    Other {
        /// The URL.
        url: String,
        /// What happened.
        why: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl { url, why } => write!(f, "invalid URL `{url}`: {why}"),
            Self::Denied { url } => write!(
                f,
                "the host denied the request to {url}: the task is not granted it \
                 (its log names the --allow-http flag to add)"
            ),
            Self::Cancelled => f.write_str("the task was cancelled during an HTTP request"),
            Self::Timeout { url } => write!(f, "the request to {url} timed out"),
            Self::TooManyRedirects { url, max } => {
                write!(f, "{url} redirected more than {max} times")
            }
            Self::Status { url, status, body } if body.is_empty() => {
                write!(f, "{url} answered HTTP {status}")
            }
            Self::Status { url, status, body } => {
                write!(f, "{url} answered HTTP {status}: {body}")
            }
            Self::Other { url, why } => write!(f, "the request to {url} failed: {why}"),
        }
    }
}

impl From<Error> for TaskError {
    fn from(err: Error) -> Self {
        match err {
            Error::Cancelled => TaskError::canceled(),
            Error::Denied { .. } | Error::InvalidUrl { .. } => TaskError::fatal(err.to_string()),
            other => TaskError::fail(other.to_string()),
        }
    }
}

/// An HTTP request to build and [`send`](Request::send).
///
/// ```no_run
/// use std::time::Duration;
/// use taskhost_guest::http::{Method, Request};
///
/// # fn demo() -> Result<(), taskhost_guest::http::Error> {
/// let response = Request::new(Method::Put, "https://api.example.com/items/7")
///     .header("authorization", "Bearer secret")
///     .header("content-type", "text/plain")
///     .body("seven")
///     .first_byte_timeout(Duration::from_secs(5))
///     .max_redirects(0)
///     .send()?;
/// assert!(response.is_success());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    connect_timeout: Option<Duration>,
    first_byte_timeout: Option<Duration>,
    max_redirects: u32,
}

impl Request {
    /// A request with this method to this URL (`http://` or `https://`),
    /// without headers or body.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            connect_timeout: None,
            first_byte_timeout: None,
            max_redirects: DEFAULT_MAX_REDIRECTS,
        }
    }

    /// A GET request.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::Get, url)
    }

    /// A POST request with this body.
    pub fn post(url: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self::new(Method::Post, url).body(body)
    }

    /// Adds a header (names are case-insensitive; a name may repeat).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers
            .push((name.into().to_ascii_lowercase(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets the body to `value` as JSON, with `content-type:
    /// application/json` (feature `json`).
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(self, value: &T) -> Result<Self, Error> {
        let body = serde_json::to_vec(value).map_err(|e| Error::Other {
            url: self.url.clone(),
            why: format!("cannot encode the JSON body: {e}"),
        })?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// The longest wait for the connection (the host caps it at its own
    /// default, 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The longest wait for the first byte of the answer, and between its
    /// chunks (the host caps it at its own default, 30 s).
    pub fn first_byte_timeout(mut self, timeout: Duration) -> Self {
        self.first_byte_timeout = Some(timeout);
        self
    }

    /// How many redirects to follow; 0 returns the 3xx answer itself
    /// [default: [`DEFAULT_MAX_REDIRECTS`]].
    pub fn max_redirects(mut self, max: u32) -> Self {
        self.max_redirects = max;
        self
    }

    /// Sends the request (following redirects) and reads the whole answer.
    pub fn send(&self) -> Result<Response, Error> {
        let mut method = self.method.clone();
        let mut url = Url::parse(&self.url)?;
        let mut body = self.body.clone();
        let mut headers = self.headers.clone();
        let mut hops = 0;
        loop {
            let response = send_once(self, &method, &url, &headers, &body)?;
            let location = match response.status {
                301 | 302 | 303 | 307 | 308 => response.header("location"),
                _ => None,
            };
            let Some(location) = location else {
                return Ok(response);
            };
            if self.max_redirects == 0 {
                return Ok(response);
            }
            if hops == self.max_redirects {
                return Err(Error::TooManyRedirects {
                    url: self.url.clone(),
                    max: self.max_redirects,
                });
            }
            hops += 1;
            let next = url.join(location)?;
            let keeps_method = matches!(response.status, 307 | 308)
                || (matches!(response.status, 301 | 302)
                    && matches!(method, Method::Get | Method::Head));
            if !keeps_method {
                method = Method::Get;
                body.clear();
                headers.retain(|(n, _)| n != "content-type" && n != "content-length");
            }
            if next.origin() != url.origin() {
                headers.retain(|(n, _)| n != "authorization" && n != "cookie");
            }
            url = next;
        }
    }
}

/// A GET of `url`, following redirects.
pub fn get(url: &str) -> Result<Response, Error> {
    Request::get(url).send()
}

/// A POST of `body` to `url`, following redirects.
pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Result<Response, Error> {
    Request::post(url, body).send()
}

/// A POST of `value` as JSON to `url` (feature `json`).
#[cfg(feature = "json")]
pub fn post_json<T: serde::Serialize + ?Sized>(url: &str, value: &T) -> Result<Response, Error> {
    Request::new(Method::Post, url).json(value)?.send()
}

/// An answer, read whole.
#[derive(Clone, Debug)]
pub struct Response {
    url: String,
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

impl Response {
    /// The status code, such as 200.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The URL that answered (after redirects).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The first value of a header, as text (names are case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Every header, names in lower case, in the order received.
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body, taken.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON (feature `json`).
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| Error::Other {
            url: self.url.clone(),
            why: format!("the body is not the JSON expected: {e}"),
        })
    }

    /// The response itself if its status is 2xx, else [`Error::Status`]
    /// with the start of the body.
    pub fn error_for_status(self) -> Result<Self, Error> {
        if self.is_success() {
            return Ok(self);
        }
        let mut body: String = self.text().chars().take(200).collect();
        body = body.split_whitespace().collect::<Vec<_>>().join(" ");
        Err(Error::Status {
            url: self.url,
            status: self.status,
            body,
        })
    }
}

/// An `http://` or `https://` URL, split.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Url {
    https: bool,
    authority: String,
    path: String,
}

impl Url {
    fn parse(text: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::InvalidUrl {
            url: text.to_owned(),
            why: why.to_owned(),
        };
        let (https, rest) = if let Some(rest) = strip_ci(text, "https://") {
            (true, rest)
        } else if let Some(rest) = strip_ci(text, "http://") {
            (false, rest)
        } else {
            return Err(bad("it must start with http:// or https://"));
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.is_empty() || authority.contains(char::is_whitespace) {
            return Err(bad("it names no host"));
        }
        let mut path = rest[end..].split('#').next().unwrap_or_default().to_owned();
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        Ok(Self {
            https,
            authority: authority.to_owned(),
            path,
        })
    }

    /// Where a `location` header points, from this URL.
    fn join(&self, location: &str) -> Result<Self, Error> {
        let location = location.trim();
        if strip_ci(location, "http://").is_some() || strip_ci(location, "https://").is_some() {
            return Self::parse(location);
        }
        let scheme = if self.https { "https:" } else { "http:" };
        if location.starts_with("//") {
            return Self::parse(&format!("{scheme}{location}"));
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let dir = self
                .path
                .split('?')
                .next()
                .and_then(|p| p.rsplit_once('/'))
                .map_or("", |(dir, _)| dir);
            format!("{dir}/{location}")
        };
        Self::parse(&format!("{scheme}//{}{path}", self.authority))
    }

    fn origin(&self) -> (bool, String) {
        (self.https, self.authority.to_ascii_lowercase())
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

fn strip_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// One request, no redirects.
fn send_once(
    request: &Request,
    method: &Method,
    url: &Url,
    headers: &[(String, Vec<u8>)],
    body: &[u8],
) -> Result<Response, Error> {
    let shown = url.to_string();
    let other = |why: String| Error::Other {
        url: shown.clone(),
        why,
    };
    // A known length, so the body is not sent chunked (some servers refuse
    // chunked requests).
    let mut headers = headers.to_vec();
    let sends_body =
        !body.is_empty() || matches!(method, Method::Post | Method::Put | Method::Patch);
    if sends_body && !headers.iter().any(|(n, _)| n == "content-length") {
        headers.push((
            "content-length".to_owned(),
            body.len().to_string().into_bytes(),
        ));
    }
    let fields = Fields::from_list(&headers).map_err(|e| other(format!("bad header: {e:?}")))?;
    let outgoing = OutgoingRequest::new(fields);
    let refused = |what: &str| other(format!("the host refused the {what}"));
    outgoing
        .set_method(&method.to_wasi())
        .map_err(|()| refused("method"))?;
    outgoing
        .set_scheme(Some(&if url.https {
            Scheme::Https
        } else {
            Scheme::Http
        }))
        .map_err(|()| refused("scheme"))?;
    outgoing
        .set_authority(Some(&url.authority))
        .map_err(|()| Error::InvalidUrl {
            url: shown.clone(),
            why: "the host part is not valid".to_owned(),
        })?;
    outgoing
        .set_path_with_query(Some(&url.path))
        .map_err(|()| Error::InvalidUrl {
            url: shown.clone(),
            why: "the path is not valid".to_owned(),
        })?;
    let outgoing_body = outgoing.body().map_err(|()| refused("body"))?;
    let options = RequestOptions::new();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if let Some(t) = request.connect_timeout {
        // The host may not support the option; its default applies then.
        let _ = options.set_connect_timeout(Some(nanos(t)));
    }
    if let Some(t) = request.first_byte_timeout {
        let _ = options.set_first_byte_timeout(Some(nanos(t)));
        let _ = options.set_between_bytes_timeout(Some(nanos(t)));
    }
    let future =
        outgoing_handler::handle(outgoing, Some(options)).map_err(|e| error_code(&shown, e))?;
    // The body goes out after `handle`, so the host is already reading it.
    // A denied request has no reader; the future says why.
    let written = write_body(outgoing_body, body);
    let incoming = loop {
        match future.get() {
            Some(result) => break result,
            None => future.subscribe().block(),
        }
    };
    let incoming = match incoming {
        Ok(Ok(incoming)) => incoming,
        Ok(Err(code)) => return Err(error_code(&shown, code)),
        Err(()) => return Err(other("the response was already taken".to_owned())),
    };
    written.map_err(|why| cancelled_or(other(why)))?;
    read_response(shown.clone(), incoming)
}

fn write_body(outgoing_body: OutgoingBody, body: &[u8]) -> Result<(), String> {
    if !body.is_empty() {
        let stream = outgoing_body
            .write()
            .map_err(|()| "cannot write the request body".to_owned())?;
        for chunk in body.chunks(WRITE_CHUNK) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("cannot send the request body: {}", stream_error(e)))?;
        }
    }
    OutgoingBody::finish(outgoing_body, None)
        .map_err(|e| format!("cannot finish the request body: {e:?}"))
}

fn read_response(url: String, incoming: IncomingResponse) -> Result<Response, Error> {
    let status = incoming.status();
    let headers = incoming.headers().entries();
    let other = |why: String| Error::Other {
        url: url.clone(),
        why,
    };
    let body = incoming
        .consume()
        .map_err(|()| other("the response body was already taken".to_owned()))?;
    let mut bytes = Vec::new();
    {
        let stream = body
            .stream()
            .map_err(|()| other("the response body was already taken".to_owned()))?;
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(e) => {
                    let why = format!("cannot read the response body: {}", stream_error(e));
                    return Err(cancelled_or(other(why)));
                }
            }
        }
    }
    let _trailers = IncomingBody::finish(body);
    Ok(Response {
        url,
        status,
        headers,
        body: bytes,
    })
}

fn stream_error(err: StreamError) -> String {
    match err {
        StreamError::Closed => "the stream was closed".to_owned(),
        StreamError::LastOperationFailed(e) => e.to_debug_string(),
    }
}

/// [`Error::Cancelled`] if the task was cancelled (the host ends in-flight
/// requests then), else `err`.
fn cancelled_or(err: Error) -> Error {
    if crate::__bindings::taskhost::plugin::host::is_cancelled() {
        Error::Cancelled
    } else {
        err
    }
}

fn error_code(url: &str, code: ErrorCode) -> Error {
    let url = url.to_owned();
    match code {
        ErrorCode::HttpRequestDenied => Error::Denied { url },
        ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::HttpResponseTimeout
        | ErrorCode::DnsTimeout => cancelled_or(Error::Timeout { url }),
        ErrorCode::HttpRequestUriInvalid => Error::InvalidUrl {
            url,
            why: "the host could not use it".to_owned(),
        },
        other => cancelled_or(Error::Other {
            url,
            why: format!("{other}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_and_join() {
        let url = Url::parse("https://api.example.com:8443/a/b?x=1#frag").unwrap();
        assert_eq!(url.authority, "api.example.com:8443");
        assert_eq!(url.path, "/a/b?x=1");
        assert_eq!(Url::parse("http://h").unwrap().path, "/");
        assert_eq!(Url::parse("HTTP://h?q").unwrap().to_string(), "http://h/?q");
        assert!(Url::parse("ftp://h/").is_err());
        assert!(Url::parse("https:///path").is_err());
        assert!(Url::parse("example.com").is_err());
        let join = |l: &str| url.join(l).unwrap().to_string();
        assert_eq!(join("/c"), "https://api.example.com:8443/c");
        assert_eq!(join("c?y"), "https://api.example.com:8443/a/c?y");
        assert_eq!(join("//other.example.com/d"), "https://other.example.com/d");
        assert_eq!(join("http://127.0.0.1:9/e"), "http://127.0.0.1:9/e");
    }

    #[test]
    fn errors_become_the_right_task_errors() {
        let denied = Error::Denied {
            url: "https://x/".into(),
        };
        assert!(TaskError::from(denied).is_fatal());
        assert!(TaskError::from(Error::Cancelled).is_canceled());
        let status = Response {
            url: "http://h/".into(),
            status: 503,
            headers: Vec::new(),
            body: b"busy\n  now".to_vec(),
        }
        .error_for_status()
        .unwrap_err();
        assert_eq!(status.to_string(), "http://h/ answered HTTP 503: busy now");
        assert!(TaskError::from(status).is_fail());
    }
}
