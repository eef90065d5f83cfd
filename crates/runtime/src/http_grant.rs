//! Owns the grant of outbound HTTP: `--allow-http [http://]HOST[:PORT]`
//! (or `*.DOMAIN`) parsed into [`HttpAllow`] and printed back in the same
//! form, whether a grant permits a request's scheme, host and port (a
//! wildcard never matches an IP address; an IP address matches itself
//! however it is written), and whether one grant covers another (how the
//! daemon's ceiling bounds a submission). Checking each request against it
//! is `http`'s business.

#![forbid(unsafe_code)]

use std::net::IpAddr;

use super::grant_error::GrantError;

/// The scheme a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HttpScheme {
    /// Plain `http://`, only when the grant names it.
    Http,
    /// `https://`, the default.
    Https,
}

impl HttpScheme {
    /// The port a URL of this scheme uses when it names none.
    pub fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// One outbound HTTP grant: a scheme, a host (exact, or `*.example.com` for
/// every name under `example.com`, not `example.com` itself) and a port
/// (the scheme's default when none is named).
///
/// ```
/// use taskhost_runtime::HttpAllow;
///
/// let api: HttpAllow = "api.example.com".parse().unwrap();
/// assert!(api.permits("https", "API.example.com", 443));
/// assert!(!api.permits("http", "api.example.com", 80), "https only, unless named");
/// let local: HttpAllow = "http://127.0.0.1:8080".parse().unwrap();
/// assert!(local.permits("http", "127.0.0.1", 8080));
/// assert!(!local.permits("http", "127.0.0.1", 8081));
/// let all: HttpAllow = "*.example.com".parse().unwrap();
/// assert!(all.covers(&api));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct HttpAllow {
    scheme: HttpScheme,
    /// Lower case, without a trailing dot or IPv6 brackets; `*.` in front
    /// for a wildcard.
    host: String,
    port: u16,
}

impl HttpAllow {
    /// Parses `HOST`, `HOST:PORT`, `*.DOMAIN[:PORT]`, `[IPV6][:PORT]`, each
    /// optionally after `https://` (the default) or `http://`.
    pub fn parse(text: &str) -> Result<Self, GrantError> {
        let bad = |why: &str| GrantError::HttpSyntax {
            text: text.to_owned(),
            why: why.to_owned(),
        };
        let (scheme, rest) = if let Some(rest) = strip_prefix_ci(text, "http://") {
            (HttpScheme::Http, rest)
        } else if let Some(rest) = strip_prefix_ci(text, "https://") {
            (HttpScheme::Https, rest)
        } else if text.contains("://") {
            return Err(bad("only http:// and https:// can be granted"));
        } else {
            (HttpScheme::Https, text)
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(bad("name a host and port only, without a path or user"));
        }
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (addr, after) = inner
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address needs its closing `]`"))?;
            if addr.is_empty()
                || !addr
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
            {
                return Err(bad("not an IPv6 address"));
            }
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| bad("expected `:PORT` after the IPv6 address"))?,
                ),
            };
            (addr.to_ascii_lowercase(), port)
        } else {
            let (host, port) = match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            };
            (check_name(host).map_err(|why| bad(&why))?, port)
        };
        let port = match port {
            None => scheme.default_port(),
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(bad("the port must be a number from 1 to 65535")),
            },
        };
        Ok(Self { scheme, host, port })
    }

    /// The scheme.
    pub fn scheme(&self) -> HttpScheme {
        self.scheme
    }

    /// The host, lower case (`*.` in front for a wildcard).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether a request to `scheme://host:port` is allowed by this grant
    /// (`scheme` is `http` or `https`; the host is compared without case).
    pub fn permits(&self, scheme: &str, host: &str, port: u16) -> bool {
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => HttpScheme::Http,
            "https" => HttpScheme::Https,
            _ => return false,
        };
        let host = normalize_host(host);
        scheme == self.scheme && port == self.port && host_matches(&self.host, &host)
    }

    /// Whether everything `other` allows is allowed by this grant too (how
    /// the daemon's ceiling bounds a submission).
    pub fn covers(&self, other: &HttpAllow) -> bool {
        if self.scheme != other.scheme || self.port != other.port {
            return false;
        }
        match (self.host.strip_prefix("*."), other.host.strip_prefix("*.")) {
            (_, None) => host_matches(&self.host, &other.host),
            (Some(mine), Some(theirs)) => theirs == mine || theirs.ends_with(&format!(".{mine}")),
            (None, Some(_)) => false,
        }
    }

    /// The first grant in `wanted` that no grant of `ceiling` covers, if
    /// any.
    pub fn first_uncovered<'a>(
        ceiling: &[HttpAllow],
        wanted: &'a [HttpAllow],
    ) -> Option<&'a HttpAllow> {
        wanted.iter().find(|w| !ceiling.iter().any(|c| c.covers(w)))
    }

    /// The grant of exactly this origin, for the flag a denial suggests.
    pub(crate) fn of_origin(scheme: HttpScheme, host: &str, port: u16) -> Self {
        Self {
            scheme,
            host: normalize_host(host),
            port,
        }
    }
}

impl std::str::FromStr for HttpAllow {
    type Err = GrantError;

    fn from_str(s: &str) -> Result<Self, GrantError> {
        Self::parse(s)
    }
}

/// The form `--allow-http` takes: `http://` only for plain http, the port
/// only when it is not the scheme's default.
impl std::fmt::Display for HttpAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.scheme == HttpScheme::Http {
            f.write_str("http://")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if self.port != self.scheme.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// A host name or IPv4 address of a grant, lower case, or why it is not one.
fn check_name(host: &str) -> Result<String, String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let (wild, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host.as_str()),
    };
    if name.is_empty() {
        return Err(if wild || host == "*" {
            "a wildcard needs a domain, such as *.example.com".to_owned()
        } else {
            "the host is missing".to_owned()
        });
    }
    if host == "*" || name.contains('*') {
        return Err(
            "only a leading `*.` is allowed as a wildcard, such as *.example.com".to_owned(),
        );
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!("`{name}` is not a host name"));
    }
    Ok(host)
}

/// A request's host as grants spell it: lower case, no trailing dot, no
/// IPv6 brackets.
pub(crate) fn normalize_host(host: &str) -> String {
    let host = host.strip_prefix('[').unwrap_or(host);
    let host = host.strip_suffix(']').unwrap_or(host);
    let host = host.strip_suffix('.').unwrap_or(host);
    host.to_ascii_lowercase()
}

/// Whether a grant's host (maybe `*.domain`) matches a request's host (both
/// normalized): a wildcard matches DNS names under its domain, never an IP
/// address (`*.0.0.1` does not match `127.0.0.1`); an IP address matches
/// the same address only, however it is written.
fn host_matches(granted: &str, host: &str) -> bool {
    match granted.strip_prefix("*.") {
        Some(domain) => {
            host.parse::<IpAddr>().is_err()
                && host
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
        }
        None => match (granted.parse::<IpAddr>(), host.parse::<IpAddr>()) {
            (Ok(granted), Ok(host)) => granted.to_canonical() == host.to_canonical(),
            (Err(_), Err(_)) => granted == host,
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(text: &str) -> HttpAllow {
        HttpAllow::parse(text).unwrap()
    }

    #[test]
    fn parses_and_prints_grants() {
        for (text, shown) in [
            ("api.example.com", "api.example.com"),
            ("https://API.example.com:443", "api.example.com"),
            ("api.example.com:8443", "api.example.com:8443"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://localhost", "http://localhost"),
            ("*.example.com", "*.example.com"),
            ("http://[::1]:9000", "http://[::1]:9000"),
            ("example.com.", "example.com"),
            ("https://example.com/", "example.com"),
        ] {
            assert_eq!(allow(text).to_string(), shown, "{text}");
        }
        for bad in [
            "",
            "*",
            "*.",
            "a.*.com",
            "ftp://example.com",
            "example.com/path",
            "user@example.com",
            "example.com:0",
            "example.com:http",
            "[::1",
            "exa mple.com",
        ] {
            assert!(HttpAllow::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn grants_match_scheme_host_and_port() {
        let exact = allow("api.example.com");
        assert!(exact.permits("https", "api.example.com", 443));
        assert!(exact.permits("HTTPS", "Api.Example.Com.", 443));
        assert!(!exact.permits("http", "api.example.com", 80));
        assert!(!exact.permits("https", "api.example.com", 8443));
        assert!(!exact.permits("https", "x.api.example.com", 443));
        assert!(!exact.permits("https", "evilapi.example.com", 443));
        let wild = allow("*.example.com");
        assert!(wild.permits("https", "a.example.com", 443));
        assert!(wild.permits("https", "a.b.example.com", 443));
        assert!(!wild.permits("https", "example.com", 443));
        assert!(!wild.permits("https", "badexample.com", 443));
        let v6 = allow("http://[::1]:9000");
        assert!(v6.permits("http", "[::1]", 9000));
    }

    #[test]
    fn ceilings_cover_narrower_grants_only() {
        let ceiling = [allow("*.example.com"), allow("http://127.0.0.1:8080")];
        let ok = [allow("api.example.com"), allow("*.eu.example.com")];
        assert_eq!(HttpAllow::first_uncovered(&ceiling, &ok), None);
        for wider in [
            "example.com",
            "http://api.example.com",
            "api.example.com:8443",
            "http://127.0.0.1:8081",
            "*.com",
        ] {
            let wanted = [allow(wider)];
            assert_eq!(
                HttpAllow::first_uncovered(&ceiling, &wanted),
                Some(&wanted[0]),
                "{wider}"
            );
        }
        assert!(allow("*.example.com").covers(&allow("*.example.com")));
        assert!(!allow("api.example.com").covers(&allow("*.example.com")));
    }

    #[test]
    fn wildcards_match_names_and_addresses_match_exactly() {
        let wild = allow("http://*.0.0.1:80");
        assert!(
            !wild.permits("http", "127.0.0.1", 80),
            "never an IP address"
        );
        assert!(
            wild.permits("http", "a.0.0.1", 80),
            "a name, resolved and checked later"
        );
        assert!(!allow("*.168.1.1").permits("https", "192.168.1.1", 443));
        assert!(!allow("*.0.0.1").covers(&allow("127.0.0.1")));
        let v6 = allow("http://[::1]:80");
        assert!(
            v6.permits("http", "[0:0:0:0:0:0:0:1]", 80),
            "however it is written"
        );
        assert!(!v6.permits("http", "localhost", 80));
        assert!(!allow("http://localhost").permits("http", "127.0.0.1", 80));
    }
}
