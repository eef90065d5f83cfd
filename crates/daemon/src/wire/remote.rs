//! Owns the client's remote transport: the daemon's protocol over a
//! connection to its HTTP listener (`host --remote URL`), with TLS for an
//! `https://` URL and a bearer token. The connection asks for `GET
//! /api/wire` with `Upgrade: taskhost-wire`; once the daemon answers `101`,
//! the same frames flow as on the Unix socket, so every verb, pipelining
//! and stream works as it does locally. A refusal (token missing, wrong or
//! of too small a scope; a certificate that does not verify; plain HTTP to
//! a TLS port) is a [`ClientError::Remote`] that names the fix.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, Uri, header};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::wire::client::{Client, ClientError};
use crate::wire::tls::{client_config, fix};

/// The `Upgrade` protocol asked for (the server's `wire::UPGRADE`).
const UPGRADE: &str = "taskhost-wire";
/// How long connecting, TLS and the upgrade may take together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a refusal's body read.
const REFUSAL_BYTES: usize = 64 << 10;

/// Where a remote daemon is and how to prove who we are.
#[derive(Debug, Clone)]
pub struct Remote {
    /// `http://HOST:PORT` or `https://HOST:PORT` (a path is ignored).
    pub url: String,
    /// The bearer token, if any.
    pub token: Option<String>,
    /// PEM certificates of the CA that signed the listener's certificate,
    /// or the listener's own (self-signed) certificate, pinned; `None`: the
    /// Mozilla roots.
    pub ca_file: Option<PathBuf>,
}

impl Remote {
    /// Reads a token from a file: its one word, the file private to this
    /// user (as the daemon's own token files are).
    pub fn token_from_file(path: &Path) -> Result<String, String> {
        super::token_file::check_private(path)
            .and_then(|()| super::token_file::read_file(path))
            .map_err(|e| e.to_string())
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Client {
    /// Connects to a daemon's HTTP listener and speaks the protocol over
    /// it (see the module docs).
    pub async fn connect_remote(remote: &Remote) -> Result<Client, ClientError> {
        let fail = |why: String| ClientError::Remote {
            url: remote.url.clone(),
            why,
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect(remote))
            .await
            .map_err(|_| {
                fail(format!(
                    "no answer within {}s: is the daemon's --http listener reachable there?",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
    }
}

async fn connect(remote: &Remote) -> Result<Client, ClientError> {
    let fail = |why: String| ClientError::Remote {
        url: remote.url.clone(),
        why,
    };
    let uri: Uri = remote.url.parse().map_err(|e| {
        fail(format!(
            "not a URL ({e}): give http://HOST:PORT or https://HOST:PORT"
        ))
    })?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(fail(
                "the URL must start with http:// or https://".to_owned(),
            ));
        }
    };
    let Some(host) = uri.host() else {
        return Err(fail("the URL names no host".to_owned()));
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let authority = uri
        .authority()
        .map_or_else(|| host.clone(), |a| a.as_str().to_owned());
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| {
            fail(format!(
                "cannot connect ({e}): is a daemon serving --http there?"
            ))
        })?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = if tls {
        let config = client_config(remote.ca_file.as_deref()).map_err(fail)?;
        let name = ServerName::try_from(host.clone())
            .map_err(|e| fail(format!("`{host}` is not a server name for TLS: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let stream = connector.connect(name, tcp).await.map_err(|e| {
            let fix = fix(&e, remote.ca_file.as_deref(), &host);
            fail(format!("TLS failed ({e}): {fix}"))
        })?;
        Box::new(stream)
    } else {
        Box::new(tcp)
    };
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream))
            .await
            .map_err(|e| fail(format!("HTTP failed: {e}")))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let mut request = Request::get("/api/wire")
        .header(header::HOST, authority)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, UPGRADE);
    if let Some(token) = &remote.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| fail("the token holds characters a header cannot carry".to_owned()))?;
        request = request.header(header::AUTHORIZATION, value);
    }
    let request = request
        .body(Body::empty())
        .map_err(|e| fail(format!("cannot make the request: {e}")))?;
    let response = sender.send_request(request).await.map_err(|e| {
        let hint = if tls {
            ""
        } else {
            " (if the listener has --tls-cert, use an https:// URL)"
        };
        fail(format!("the listener did not answer HTTP: {e}{hint}"))
    })?;
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = axum::body::to_bytes(Body::new(response.into_body()), REFUSAL_BYTES)
            .await
            .unwrap_or_default();
        let said = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_owned());
        let fix = match status {
            StatusCode::UNAUTHORIZED if remote.token.is_none() => {
                "; give a token with --token-file FILE or TASKHOST_TOKEN"
            }
            StatusCode::UNAUTHORIZED => {
                "; the token given (--token-file or TASKHOST_TOKEN) is not one the daemon accepts"
            }
            _ => "",
        };
        return Err(fail(format!("refused ({status}): {said}{fix}")));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| fail(format!("the upgrade failed: {e}")))?;
    let (reader, writer) = tokio::io::split(TokioIo::new(upgraded));
    Client::establish(Path::new(&remote.url), reader, writer, None).await
}
