//! Owns how a node reaches its database: the address (with libpq's
//! `sslmode` and `sslrootcert`, which the driver does not parse itself),
//! TLS through rustls, the session's timeouts and the TCP keepalives. It
//! must not read or write rows (`store::postgres` does).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::task::JoinHandle;
use tokio_postgres::config::SslMode;
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// How long a session's timeouts and keepalives let a statement, a lock
/// wait or a dead peer hold a node up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// Any one statement (`statement_timeout`).
    pub statement: Duration,
    /// A wait for a row lock (`lock_timeout`).
    pub lock: Duration,
    /// A transaction left open between statements: the server ends its
    /// session, so the locks of a frozen node do not outlive its lease
    /// (`idle_in_transaction_session_timeout`).
    pub idle_in_transaction: Duration,
    /// A quiet connection is probed after this (TCP keepalive), and
    /// unacknowledged data gives the connection up after `tcp_user`.
    pub keepalive_idle: Duration,
    pub tcp_user: Duration,
}

/// The TLS a node speaks to its database.
#[derive(Clone)]
enum Tls {
    Off,
    Rustls(MakeRustlsConnect),
}

/// A database address with its TLS and session settings; cheap to clone.
#[derive(Clone)]
pub(crate) struct Link {
    pub(crate) config: tokio_postgres::Config,
    tls: Tls,
    /// `host/db`, for messages.
    pub(crate) describe: Arc<str>,
    /// Whether the database answers, as this node sees it.
    pub(crate) outage: Arc<super::outage::Outage>,
}

/// The libpq TLS settings the driver does not take.
struct TlsWanted {
    mode: Mode,
    root: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Link {
    /// Parses `url` (a `postgres://` URL or libpq's `key=value` form).
    /// Unlike libpq, no `sslmode` means plain text (`disable`).
    pub(crate) fn parse(url: &str, timeouts: Timeouts) -> Result<Self, StoreError> {
        let (rest, wanted) = split_tls(url)?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
            StoreError::Failed(format!(
                "`{url}` is not a PostgreSQL address ({e}); use postgres://USER@HOST:PORT/DB \
                 or postgres:///DB?host=/run/postgresql"
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.application_name("taskhost");
        // Every statement is planned for its parameters and the tables as
        // they are now: a generic plan cached while the tables were small
        // (a sequential scan) stays until the next ANALYZE and costs more
        // with every row.
        let session = format!(
            "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={} \
             -c plan_cache_mode=force_custom_plan",
            timeouts.statement.as_millis().max(1),
            timeouts.lock.as_millis().max(1),
            timeouts.idle_in_transaction.as_millis().max(1),
        );
        let options = match config.get_options() {
            Some(theirs) if !theirs.is_empty() => format!("{theirs} {session}"),
            _ => session,
        };
        config.options(options);
        config
            .keepalives(true)
            .keepalives_idle(timeouts.keepalive_idle)
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            .tcp_user_timeout(timeouts.tcp_user);
        let tls = match wanted.mode {
            Mode::Disable => {
                config.ssl_mode(SslMode::Disable);
                Tls::Off
            }
            mode => {
                config.ssl_mode(if mode == Mode::Prefer {
                    SslMode::Prefer
                } else {
                    SslMode::Require
                });
                Tls::Rustls(MakeRustlsConnect::new(client_config(
                    mode,
                    wanted.root.as_deref(),
                )?))
            }
        };
        let describe: Arc<str> = Arc::from(format!(
            "postgres {}/{}",
            config
                .get_hosts()
                .first()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(h) => h.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .unwrap_or_default(),
            config.get_dbname().unwrap_or("")
        ));
        Ok(Self {
            config,
            tls,
            describe,
            outage: Arc::default(),
        })
    }

    /// A pool manager over this address.
    pub(crate) fn manager(&self) -> deadpool_postgres::Manager {
        let settings = deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        };
        match &self.tls {
            Tls::Off => {
                deadpool_postgres::Manager::from_config(self.config.clone(), NoTls, settings)
            }
            Tls::Rustls(tls) => {
                deadpool_postgres::Manager::from_config(self.config.clone(), tls.clone(), settings)
            }
        }
    }

    /// A connection of its own (outside the pool), its driver spawned:
    /// notifications it receives go to `notices`.
    pub(crate) async fn connect(
        &self,
        notices: Option<tokio::sync::mpsc::UnboundedSender<(String, String)>>,
    ) -> Result<Session, StoreError> {
        let failed = |e: tokio_postgres::Error| {
            StoreError::NoConnection(format!("PostgreSQL: cannot connect: {e}"))
        };
        match &self.tls {
            Tls::Off => {
                let (client, connection) = self.config.connect(NoTls).await.map_err(failed)?;
                Ok(Session {
                    client,
                    driver: tokio::spawn(drive(connection, notices, Arc::clone(&self.outage))),
                })
            }
            Tls::Rustls(tls) => {
                let (client, connection) =
                    self.config.connect(tls.clone()).await.map_err(failed)?;
                Ok(Session {
                    client,
                    driver: tokio::spawn(drive(connection, notices, Arc::clone(&self.outage))),
                })
            }
        }
    }
}

/// A connection outside the pool; dropping it closes the connection
/// (its driver too, even while a statement hangs on a dead peer).
pub(crate) struct Session {
    pub(crate) client: Client,
    driver: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Runs a connection, handing its notifications on.
async fn drive<S, T>(
    mut connection: Connection<S, T>,
    notices: Option<tokio::sync::mpsc::UnboundedSender<(String, String)>>,
    outage: Arc<super::outage::Outage>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(AsyncMessage::Notification(n)) => {
                if let Some(tx) = &notices
                    && tx
                        .send((n.channel().to_owned(), n.payload().to_owned()))
                        .is_err()
                {
                    return;
                }
            }
            Ok(_) => {}
            Err(err) => {
                outage.failed("a database connection failed", &err);
                return;
            }
        }
    }
}

/// Takes `sslmode` and `sslrootcert` out of the address.
fn split_tls(url: &str) -> Result<(String, TlsWanted), StoreError> {
    let mut mode = None;
    let mut root = None;
    let mut take = |key: &str, value: String| -> bool {
        match key {
            "sslmode" => {
                mode = Some(value);
                true
            }
            "sslrootcert" => {
                root = Some(value);
                true
            }
            _ => false,
        }
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        !take(k, percent_decode(v))
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        url.split_whitespace()
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                !take(k.trim(), v.trim_matches('\'').to_owned())
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mode = match mode.as_deref() {
        None | Some("disable") => Mode::Disable,
        Some("prefer") | Some("allow") => Mode::Prefer,
        Some("require") => Mode::Require,
        Some("verify-ca") => Mode::VerifyCa,
        Some("verify-full") => Mode::VerifyFull,
        Some(other) => {
            return Err(StoreError::Failed(format!(
                "sslmode={other} is not a TLS mode; use disable, prefer, require, verify-ca \
                 or verify-full"
            )));
        }
    };
    if matches!(mode, Mode::VerifyCa | Mode::VerifyFull) && root.is_none() {
        return Err(StoreError::Failed(
            "sslmode=verify-ca and verify-full need the authority to verify against: add \
             sslrootcert=/path/to/ca.pem (the CA that signed the server's certificate), or \
             sslrootcert=system for the Mozilla roots"
                .into(),
        ));
    }
    Ok((rest, TlsWanted { mode, root }))
}

fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = v
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The rustls settings of a mode: `prefer` and `require` encrypt without
/// checking the server (as libpq does), unless a root is named, when the
/// chain is checked as `verify-ca` does; `verify-full` also checks the
/// server's name.
fn client_config(mode: Mode, root: Option<&str>) -> Result<rustls::ClientConfig, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Failed(format!("TLS is unavailable: {e}")))?;
    let Some(root) = root else {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth());
    };
    let mut roots = rustls::RootCertStore::empty();
    if root == "system" {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    } else {
        let certs = CertificateDer::pem_file_iter(root)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                StoreError::Failed(format!(
                    "sslrootcert={root}: cannot read its PEM certificates ({e})"
                ))
            })?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(StoreError::Failed(format!(
                "sslrootcert={root} holds no usable CA certificate"
            )));
        }
    }
    let chain = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .map_err(|e| StoreError::Failed(format!("sslrootcert={root}: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = if mode == Mode::VerifyFull {
        chain
    } else {
        Arc::new(AnyName(chain))
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// `require` without a root: the session is encrypted, the server is not
/// authenticated (its handshake signatures are still checked).
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to the root; the name is not checked.
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeouts() -> Timeouts {
        Timeouts {
            statement: Duration::from_secs(30),
            lock: Duration::from_secs(10),
            idle_in_transaction: Duration::from_secs(5),
            keepalive_idle: Duration::from_secs(5),
            tcp_user: Duration::from_secs(10),
        }
    }

    #[test]
    fn the_tls_keys_are_taken_out_of_both_forms_of_address() {
        let (rest, wanted) =
            split_tls("postgres://u@h:5/db?sslmode=verify-full&sslrootcert=%2Fca.pem&host=x")
                .unwrap();
        assert_eq!(rest, "postgres://u@h:5/db?host=x");
        assert_eq!(wanted.mode, Mode::VerifyFull);
        assert_eq!(wanted.root.as_deref(), Some("/ca.pem"));
        let (rest, wanted) = split_tls("host=/tmp dbname=d sslmode=require").unwrap();
        assert_eq!(rest, "host=/tmp dbname=d");
        assert_eq!(wanted.mode, Mode::Require);
        let (_, wanted) = split_tls("postgres://u@h/db").unwrap();
        assert_eq!(wanted.mode, Mode::Disable);
    }

    #[test]
    fn a_verifying_mode_without_a_root_and_an_unknown_mode_are_refused() {
        let err = Link::parse("postgres://u@h/db?sslmode=verify-full", timeouts())
            .err()
            .unwrap();
        assert!(err.to_string().contains("sslrootcert="), "{err}");
        let err = Link::parse("postgres://u@h/db?sslmode=maybe", timeouts())
            .err()
            .unwrap();
        assert!(err.to_string().contains("sslmode=maybe"), "{err}");
        let err = Link::parse(
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
            timeouts(),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn the_session_timeouts_follow_any_options_of_the_address() {
        let link =
            Link::parse("postgres://u@h/db?options=-c%20search_path%3Dx", timeouts()).unwrap();
        let options = link.config.get_options().unwrap();
        assert!(
            options.starts_with("-c search_path=x -c statement_timeout=30000"),
            "{options}"
        );
        assert!(
            options.ends_with(
                "idle_in_transaction_session_timeout=5000 -c plan_cache_mode=force_custom_plan"
            ),
            "{options}"
        );
    }
}
