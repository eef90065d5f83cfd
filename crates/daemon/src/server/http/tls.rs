//! Owns the listener's TLS (`--tls-cert`, `--tls-key`): loading the PEM
//! chain and key, the rustls acceptor, and reloading both on SIGHUP or
//! when either file changes (checked every `WATCH_EVERY`), so a renewed
//! certificate is served without a restart. A reload that fails keeps the
//! certificate in use and says why in the log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

/// How often the files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// Where the certificate and key are.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl Files {
    /// Reads and checks both files.
    pub(crate) fn load(&self, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, String> {
        let chain = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                format!(
                    "--tls-cert {}: cannot read its PEM certificates ({e})",
                    self.cert.display()
                )
            })?;
        if chain.is_empty() {
            return Err(format!(
                "--tls-cert {} holds no certificate",
                self.cert.display()
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| {
            format!(
                "--tls-key {}: cannot read a PEM private key ({e})",
                self.key.display()
            )
        })?;
        let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
            format!(
                "--tls-key {} does not go with --tls-cert {}: {e}",
                self.key.display(),
                self.cert.display()
            )
        })?;
        Ok(Arc::new(certified))
    }

    fn stamps(&self) -> (Option<SystemTime>, Option<SystemTime>) {
        let stamp = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        (stamp(&self.cert), stamp(&self.key))
    }
}

/// The certificate in use, swapped by a reload.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.0.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

/// The acceptor and what reloads it.
pub(crate) struct Tls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    current: Arc<Current>,
    files: Files,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads the files and makes the acceptor (HTTP/1.1 over TLS 1.2 or
    /// 1.3).
    pub(crate) fn new(files: Files) -> Result<Tls, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certified = files.load(&provider)?;
        let current = Arc::new(Current(RwLock::new(certified)));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS is unavailable: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&current) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            current,
            files,
            provider,
        })
    }

    /// Reloads on SIGHUP and when the files change, until `stop`.
    pub(crate) fn watch(&self, stop: CancellationToken) {
        let current = Arc::clone(&self.current);
        let files = self.files.clone();
        let provider = Arc::clone(&self.provider);
        tokio::spawn(async move {
            let mut hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut seen = files.stamps();
            loop {
                let signalled = async {
                    match hangup.as_mut() {
                        Some(h) => {
                            h.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                let why = tokio::select! {
                    () = stop.cancelled() => return,
                    () = signalled => "SIGHUP",
                    () = tokio::time::sleep(WATCH_EVERY) => {
                        let now = files.stamps();
                        if now == seen {
                            continue;
                        }
                        seen = now;
                        "a changed file"
                    }
                };
                let (files2, provider2) = (files.clone(), Arc::clone(&provider));
                let loaded = tokio::task::spawn_blocking(move || files2.load(&provider2)).await;
                match loaded {
                    Ok(Ok(certified)) => {
                        *current.0.write().unwrap_or_else(PoisonError::into_inner) = certified;
                        tracing::info!(
                            "HTTP listener: reloaded its TLS certificate {} ({why})",
                            files.cert.display()
                        );
                    }
                    Ok(Err(err)) => tracing::warn!(
                        "HTTP listener: keeps its TLS certificate, the reload ({why}) failed: {err}"
                    ),
                    Err(err) => tracing::warn!("HTTP listener: the TLS reload failed: {err}"),
                }
            }
        });
    }
}
