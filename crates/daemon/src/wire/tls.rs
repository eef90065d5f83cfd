//! Owns the remote client's TLS: which listener certificates `host --remote
//! https://…` accepts, and the fix named when one is refused.
//!
//! Without `--ca-file`, a certificate must chain to the Mozilla roots. With
//! it, each certificate of the file counts two ways: as a CA that signed
//! the listener's certificate (webpki's chain checks, as with the roots),
//! and as the listener's own certificate, pinned: a listener presenting
//! exactly that certificate, byte for byte, is accepted when it is valid
//! now and names the host connected to, and its handshake is signed by
//! that certificate's key (checked with the provider's algorithms). So a
//! self-signed certificate works as its own CA, although `openssl req
//! -x509` marks it `CA:TRUE`, which webpki refuses in a server (an end
//! entity).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use x509_cert::der::Decode;

/// TLS settings: the listener's certificate checked against `ca_file`'s
/// certificates (see the module docs), or the Mozilla roots without one;
/// the name checked too.
pub(super) fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS is unavailable: {e}"))?;
    let Some(path) = ca_file else {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(builder.with_root_certificates(roots).with_no_client_auth());
    };
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "--ca-file {}: cannot read its PEM certificates ({e})",
                path.display()
            )
        })?;
    let verifier = Pinning::new(certs, &provider, path)?;
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// `--ca-file`'s certificates as CAs and as pinned listener certificates.
#[derive(Debug)]
struct Pinning {
    /// Every certificate of the file.
    pinned: Vec<CertificateDer<'static>>,
    /// The same certificates as trust anchors.
    webpki: Arc<WebPkiServerVerifier>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl Pinning {
    /// Trusts `certs`, read from `path`.
    fn new(
        certs: Vec<CertificateDer<'static>>,
        provider: &Arc<CryptoProvider>,
        path: &Path,
    ) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(certs.iter().cloned());
        if added == 0 {
            return Err(format!(
                "--ca-file {} holds no usable certificate",
                path.display()
            ));
        }
        let webpki =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
                .build()
                .map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
        Ok(Pinning {
            pinned: certs,
            webpki,
            algorithms: provider.signature_verification_algorithms,
        })
    }
}

impl ServerCertVerifier for Pinning {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if !self
            .pinned
            .iter()
            .any(|pinned| pinned.as_ref() == end_entity.as_ref())
        {
            return self.webpki.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            );
        }
        check_dates(end_entity, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A pinned certificate is valid at `now`: not before its `notBefore`,
/// not after its `notAfter`.
fn check_dates(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    let parsed = x509_cert::Certificate::from_der(cert.as_ref())
        .map_err(|_| CertificateError::BadEncoding)?;
    let validity = &parsed.tbs_certificate.validity;
    let not_before = UnixTime::since_unix_epoch(validity.not_before.to_unix_duration());
    let not_after = UnixTime::since_unix_epoch(validity.not_after.to_unix_duration());
    if now.as_secs() < not_before.as_secs() {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before,
        }
        .into());
    }
    if now.as_secs() > not_after.as_secs() {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after,
        }
        .into());
    }
    Ok(())
}

/// The fix for a TLS handshake with `host` that failed with `error`.
pub(super) fn fix(error: &std::io::Error, ca_file: Option<&Path>, host: &str) -> String {
    let ca = ca_file.map(|path| format!("--ca-file {}", path.display()));
    let general = match &ca {
        Some(ca) => format!(
            "check that {ca} holds the CA that signed the listener's --tls-cert (or, for a \
             self-signed certificate, that very certificate), and that the certificate \
             names {host}"
        ),
        None => "the listener's certificate is not signed by a public CA: give the CA's \
                 certificate (or, for a self-signed certificate, that very certificate) \
                 with --ca-file PEM"
            .to_owned(),
    };
    let Some(error) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return general;
    };
    let certificate = match error {
        rustls::Error::InvalidCertificate(certificate) => certificate,
        rustls::Error::InvalidMessage(_) => {
            return "the listener did not answer in TLS: if it runs without --tls-cert, use \
                    an http:// URL"
                .to_owned();
        }
        _ => return general,
    };
    match certificate {
        CertificateError::UnknownIssuer => match &ca {
            Some(ca) => format!(
                "the listener's certificate is not signed by a CA of {ca}, nor is it one of \
                 its certificates: give the CA that signed the listener's --tls-cert (or, \
                 for a self-signed certificate, that very certificate) with --ca-file"
            ),
            None => general,
        },
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            let kind = if host.parse::<IpAddr>().is_ok() {
                "IP"
            } else {
                "DNS"
            };
            format!(
                "the listener's certificate does not name {host}, the host in the URL: its \
                 subjectAltName must hold it (made with e.g. `-addext \
                 subjectAltName={kind}:{host}`), or connect by a name it holds"
            )
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the listener's certificate has expired: renew its --tls-cert (the daemon \
             reloads it on SIGHUP or when the file changes), or check this machine's clock"
                .to_owned()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the listener's certificate is not valid yet: check this machine's clock and the \
             one that made the certificate"
                .to_owned()
        }
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "the listener's certificate is not for a TLS server: make it with \
             `extendedKeyUsage=serverAuth`, or without extendedKeyUsage"
                .to_owned()
        }
        CertificateError::Other(other)
            if matches!(
                other.0.downcast_ref::<webpki::Error>(),
                Some(webpki::Error::CaUsedAsEndEntity)
            ) =>
        {
            let (missing, signer) = match &ca {
                Some(ca) => (
                    format!(", and {ca} does not hold it"),
                    "the CA in --ca-file",
                ),
                None => (String::new(), "a CA you give with --ca-file"),
            };
            format!(
                "the listener's certificate is a CA certificate (basicConstraints CA:TRUE, \
                 as `openssl req -x509` makes a self-signed one){missing}: give that very \
                 certificate (the listener's --tls-cert) with --ca-file to pin it, or give \
                 the listener a certificate with basicConstraints=CA:FALSE signed by {signer}"
            )
        }
        _ => general,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made by the command of docs/remote.md (`openssl req -x509 -newkey ec
    /// -pkeyopt ec_paramgen_curve:P-256 -nodes … -days 30 -subj /CN=127.0.0.1
    /// -addext subjectAltName=IP:127.0.0.1`): CA:TRUE, valid from
    /// 1796499776 to 1799091776 (UNIX seconds).
    const SELF_SIGNED: &str = "-----BEGIN CERTIFICATE-----
MIIBjzCCATSgAwIBAgIUYi3hnyfIerG2IBjs6zjIEDF/23MwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMB4XDTI2MTIwNTE5NDI1NloXDTI3MDEwNDE5
NDI1NlowFDESMBAGA1UEAwwJMTI3LjAuMC4xMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAETa1gkjBCjAbKcRninAQDTDD5Qm+qLPDYspAcl+sB1nY4qdZeM2x/HSdz
0EVKywwXe0uAO10pXk9ICXUNzO2uPKNkMGIwHQYDVR0OBBYEFN5Ap8mbf3n9MqNk
8fybCTddjFt+MB8GA1UdIwQYMBaAFN5Ap8mbf3n9MqNk8fybCTddjFt+MA8GA1Ud
EwEB/wQFMAMBAf8wDwYDVR0RBAgwBocEfwAAATAKBggqhkjOPQQDAgNJADBGAiEA
uoB7roezkqp1sGAx0r4c+nd7Lukc78yA3yvix70hpTgCIQDoiFG5A4w9VHAr4O7B
cRwwh8rInBeHrFRT+tiL7zw2oQ==
-----END CERTIFICATE-----
";
    const NOT_BEFORE: u64 = 1_796_499_776;
    const NOT_AFTER: u64 = 1_799_091_776;

    /// Another one made alike.
    const OTHER: &str = "-----BEGIN CERTIFICATE-----
MIIBjTCCATSgAwIBAgIULecTZQtaoJ9d07MYmmyw4sLWQEAwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMB4XDTI2MTIwNTE5NDI1NloXDTI3MDEwNDE5
NDI1NlowFDESMBAGA1UEAwwJMTI3LjAuMC4xMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEAGrRdOaiF6t6IQhDA3fTejbzYhsfmWRj6cuO3VE5DTzxn18u4MmjRHPR
JM7ZpjwksssqNVxrgQzcjIyuVSQkMaNkMGIwHQYDVR0OBBYEFLthHSWFiFHrzfaa
mVV0t4+20pQQMB8GA1UdIwQYMBaAFLthHSWFiFHrzfaamVV0t4+20pQQMA8GA1Ud
EwEB/wQFMAMBAf8wDwYDVR0RBAgwBocEfwAAATAKBggqhkjOPQQDAgNHADBEAiBV
tf/+BBbYPF4YPIrKQoQ02VEGMtEFLQ4lnpb/MCF6swIgFRrPInJ05PElzxs7rZQ5
xQWs5wfGJDBncsNPQi9Z2bQ=
-----END CERTIFICATE-----
";

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
    }

    fn pinning(pem: &str) -> Pinning {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Pinning::new(vec![der(pem)], &provider, Path::new("ca.pem")).expect("usable")
    }

    fn at(secs: u64) -> UnixTime {
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs))
    }

    fn verify(verifier: &Pinning, host: &str, now: u64) -> Result<(), rustls::Error> {
        let name = ServerName::try_from(host.to_owned()).expect("a name");
        verifier
            .verify_server_cert(&der(SELF_SIGNED), &[], &name, &[], at(now))
            .map(|_| ())
    }

    /// The fix `host --remote` names for `error`, connecting to `host`.
    fn fix_for(error: rustls::Error, ca: Option<&str>, host: &str) -> String {
        let error = std::io::Error::new(std::io::ErrorKind::InvalidData, error);
        fix(&error, ca.map(Path::new), host)
    }

    #[test]
    fn a_pinned_self_signed_certificate_is_accepted_while_valid_for_its_name() {
        let pinned = pinning(SELF_SIGNED);
        let during = NOT_BEFORE + 3600;
        assert_eq!(verify(&pinned, "127.0.0.1", during), Ok(()));
        let wrong_name = verify(&pinned, "localhost", during).unwrap_err();
        assert!(
            matches!(
                wrong_name,
                rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })
            ),
            "{wrong_name:?}"
        );
        assert!(
            fix_for(wrong_name, Some("cert.pem"), "localhost")
                .contains("subjectAltName=DNS:localhost")
        );
        let early = verify(&pinned, "127.0.0.1", NOT_BEFORE - 1).unwrap_err();
        assert!(
            matches!(
                early,
                rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext { .. })
            ),
            "{early:?}"
        );
        assert!(fix_for(early, Some("cert.pem"), "127.0.0.1").contains("not valid yet"));
        let late = verify(&pinned, "127.0.0.1", NOT_AFTER + 1).unwrap_err();
        assert!(
            matches!(
                late,
                rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. })
            ),
            "{late:?}"
        );
        assert!(fix_for(late, Some("cert.pem"), "127.0.0.1").contains("has expired: renew"));
    }

    #[test]
    fn another_self_signed_certificate_is_refused_naming_the_pin() {
        let other = pinning(OTHER);
        let refused = verify(&other, "127.0.0.1", NOT_BEFORE + 3600).unwrap_err();
        let fix = fix_for(refused, Some("other.pem"), "127.0.0.1");
        assert!(
            fix.contains("--ca-file other.pem does not hold it")
                && fix.contains("give that very certificate")
                && fix.contains("basicConstraints=CA:FALSE"),
            "{fix}"
        );
    }

    #[test]
    fn each_cause_names_its_fix() {
        let unknown = || rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(
            fix_for(unknown(), Some("ca.pem"), "build-1")
                .contains("not signed by a CA of --ca-file ca.pem")
        );
        assert!(fix_for(unknown(), None, "build-1").contains("with --ca-file PEM"));
        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert!(fix_for(name, None, "10.0.0.7").contains("-addext subjectAltName=IP:10.0.0.7"));
        let message = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        assert!(fix_for(message, None, "build-1").contains("http:// URL"));
        let io = std::io::Error::other("connection reset");
        assert!(
            fix(&io, Some(Path::new("ca.pem")), "build-1").contains("check that --ca-file ca.pem")
        );
    }
}
