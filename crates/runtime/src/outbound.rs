//! Owns the send path of one outbound HTTP request that `http` allowed: the
//! name lookup ([`resolve`]), then TCP to the very addresses `http` checked
//! (the name is never resolved again, so DNS rebinding between the check
//! and the connection cannot happen), TLS for https (rustls with the
//! Mozilla roots of webpki-roots), a hyper HTTP/1 handshake, and the
//! connect, first-byte and between-bytes timeouts. The steps and the error
//! codes the guest sees are those of wasmtime-wasi-http's
//! `default_send_request` (`DNS-error`, `connection-refused`,
//! `connection-timeout`, `TLS-protocol-error`, `connection-read-timeout`),
//! which resolves the name itself and so cannot sit behind the address
//! check.

#![forbid(unsafe_code)]

use std::future::{Future, poll_fn};
use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

/// What the connection's I/O future resolves to, as wasmtime-wasi-http
/// wants it.
type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// The error `default_send_request` gives for a name that does not resolve.
fn dns_error() -> HttpError {
    HttpError::DnsError {
        rcode: Some("address not available".to_owned()),
        info_code: None,
    }
}

/// The addresses of `host` (normalized: no brackets) on `port`: an IP
/// address is its own, a name is looked up.
pub(crate) async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, HttpError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| dns_error())?
        .collect();
    if addrs.is_empty() {
        return Err(dns_error());
    }
    Ok(addrs)
}

/// The name TLS verifies the server's certificate against, for https
/// (`None` for plain http): an IP address, or a DNS name.
pub(crate) fn server_name(host: &str, tls: bool) -> Result<Option<ServerName<'static>>, HttpError> {
    if !tls {
        return Ok(None);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(Some(ServerName::from(ip)));
    }
    ServerName::try_from(host.to_owned())
        .map(Some)
        .map_err(HttpError::InvalidDnsNameError)
}

/// The TLS client settings every https request shares: the Mozilla roots,
/// ring, TLS 1.2 and 1.3, no client certificate.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, HttpError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.into(),
            };
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|builder| Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|why| HttpError::InternalError(Some(format!("TLS is unavailable: {why}"))))
}

/// A connection, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

/// TCP to the first of `addrs` that accepts, in order (as `TcpStream`
/// tries a name's addresses).
async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, HttpError> {
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = Some(err),
        }
    }
    Err(HttpError::Connect(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no address to connect to")
    })))
}

/// Sends `request` over a new connection to `addrs` (TLS with `tls` as the
/// server's name), the connection made by `deadline`; then waits for the
/// answer's head at most the first-byte timeout, and for each chunk of its
/// body at most the between-bytes timeout. `permit` (the attempt's count of
/// requests in flight) is held until the response body and the connection
/// are both gone.
pub(crate) async fn send(
    mut request: http::Request<WasiBody>,
    addrs: &[SocketAddr],
    tls: Option<ServerName<'static>>,
    deadline: Instant,
    options: &RequestOptions,
    permit: OwnedSemaphorePermit,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    let first_byte_timeout = options
        .first_byte_timeout
        .unwrap_or(Duration::from_secs(600));
    let between_bytes_timeout = options
        .between_bytes_timeout
        .unwrap_or(Duration::from_secs(600));
    let handshake = async {
        let tcp = connect(addrs).await?;
        let stream: Box<dyn Stream> = match tls {
            Some(name) => {
                let connector = tokio_rustls::TlsConnector::from(tls_config()?);
                Box::new(connector.connect(name, tcp).await.map_err(HttpError::Tls)?)
            }
            None => Box::new(tcp),
        };
        hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(HttpError::from)
    };
    let (mut sender, conn) = tokio::time::timeout_at(deadline, handshake)
        .await
        .map_err(|_| HttpError::ConnectionTimeout)??;

    // The request holds the scheme and authority, but on the wire only a
    // proxy gets them: the path and query only.
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(path)
        .build()
        .map_err(|_| HttpError::HttpRequestUriInvalid)?;

    let permit = Arc::new(permit);
    let body_permit = Arc::clone(&permit);
    let send = async move {
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)?
            .map_err(HttpError::from)?;
        // Tokio panics on an interval of zero: a nanosecond is as good.
        let between = between_bytes_timeout.max(Duration::from_nanos(1));
        let mut timeout = tokio::time::interval(between);
        timeout.reset();
        Ok::<_, HttpError>(response.map(|incoming| {
            Incoming {
                incoming,
                timeout,
                _permit: body_permit,
            }
            .boxed_unsync()
        }))
    };
    let mut send = pin!(send);
    let mut conn = Some(conn);
    // Wait for the response while driving the connection's I/O.
    let response = poll_fn(|cx| match send.as_mut().poll(cx) {
        Poll::Ready(done) => Poll::Ready(done),
        Poll::Pending => {
            let Some(fut) = conn.as_mut() else {
                return Poll::Pending;
            };
            let done = ready!(Pin::new(fut).poll(cx));
            conn = None;
            match done {
                // The connection ended first: the response may be there.
                Ok(()) => send.as_mut().poll(cx),
                Err(err) => Poll::Ready(Err(HttpError::from(err))),
            }
        }
    })
    .await?;
    let io = async move {
        let _permit = permit;
        let Some(conn) = conn else {
            return Ok(());
        };
        conn.await.map_err(|err| {
            if err.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::from(err)
            }
        })
    };
    Ok((response, Box::new(io) as IoFuture))
}

/// A response body that fails with `connection-read-timeout` when no chunk
/// comes within the between-bytes timeout, and holds the attempt's permit
/// of this request.
struct Incoming {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
    _permit: Arc<OwnedSemaphorePermit>,
}

impl Body for Incoming {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(if err.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::from(err)
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_are_addresses_or_dns_names() {
        assert_eq!(server_name("example.com", false).unwrap(), None);
        assert_eq!(
            server_name("example.com", true).unwrap(),
            Some(ServerName::try_from("example.com").unwrap())
        );
        assert_eq!(
            server_name("::1", true).unwrap(),
            Some(ServerName::from(IpAddr::from(
                std::net::Ipv6Addr::LOCALHOST
            )))
        );
        assert!(server_name("exa mple.com", true).is_err());
    }

    #[test]
    fn the_tls_settings_build() {
        assert!(tls_config().is_ok());
    }

    #[tokio::test]
    async fn addresses_resolve_without_a_lookup_and_localhost_to_loopback() {
        assert_eq!(
            resolve("127.0.0.1", 80).await.unwrap(),
            ["127.0.0.1:80".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            resolve("::1", 443).await.unwrap(),
            ["[::1]:443".parse::<SocketAddr>().unwrap()]
        );
        let local = resolve("localhost", 8080).await.unwrap();
        assert!(
            local
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 8080)
        );
    }
}
