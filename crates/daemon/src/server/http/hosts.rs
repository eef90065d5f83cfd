//! Owns which `Host` and `Origin` headers the HTTP listener answers to: on a
//! loopback bind, a loopback name (`localhost`, a loopback IP literal) with
//! the bound port; on any other bind, `localhost` or an IP literal with the
//! bound port, or this machine's hostname (with or without the port); on
//! both, the names of `--http-allow-host` (`http_allow_hosts`). A web page on a name it
//! rebinds to our address sends that name as its `Host`, so it is refused
//! (421). An `Origin`, when a browser sends one, must be the origin of the
//! `Host` itself (403 otherwise): a page elsewhere cannot drive the API.

use std::net::SocketAddr;

use crate::config::Authority;

/// The `Host` values one listener accepts.
#[derive(Debug)]
pub(crate) struct Hosts {
    port: u16,
    loopback: bool,
    /// Names accepted besides the built-in ones: an entry without a port
    /// matches the name alone or with the bound port, one with a port
    /// matches exactly (names compared without regard to case).
    names: Vec<(String, Option<u16>)>,
}

impl Hosts {
    /// The hosts of a listener bound to `local`: `allowed` are the
    /// operator's `http_allow_hosts`, `hostname` this machine's name (used
    /// on non-loopback binds only). Entries that do not parse are skipped
    /// (they were refused when the settings were read).
    pub(crate) fn new(local: SocketAddr, allowed: &[String], hostname: Option<&str>) -> Self {
        let loopback = local.ip().is_loopback();
        let mut names = Vec::new();
        let machine = hostname.filter(|_| !loopback);
        for entry in allowed.iter().map(String::as_str).chain(machine) {
            if let Some(authority) = Authority::parse(entry) {
                names.push((authority.name.to_ascii_lowercase(), authority.port));
            }
        }
        Self {
            port: local.port(),
            loopback,
            names,
        }
    }

    /// Whether a request naming `host` is answered.
    pub(crate) fn accepts(&self, host: &str) -> bool {
        let Some(authority) = Authority::parse(host) else {
            return false;
        };
        // No port is the scheme's default: 80 for plain HTTP.
        let bound_port = authority.port.unwrap_or(80) == self.port;
        let built_in = match authority.ip() {
            Some(ip) => bound_port && (!self.loopback || ip.is_loopback()),
            None => bound_port && authority.name.eq_ignore_ascii_case("localhost"),
        };
        built_in
            || self.names.iter().any(|(name, port)| {
                name.eq_ignore_ascii_case(authority.name)
                    && match port {
                        Some(port) => authority.port == Some(*port),
                        None => authority.port.is_none() || authority.port == Some(self.port),
                    }
            })
    }

    /// What a refused request is told it may name instead (the names the
    /// operator added and the hostname are not told to strangers).
    pub(crate) fn describe(&self) -> String {
        if self.loopback {
            format!(
                "localhost:{0} or a loopback address with port {0}, or a name of \
                 --http-allow-host",
                self.port
            )
        } else {
            format!(
                "localhost:{0} or an IP address with port {0}, this machine's hostname, or a \
                 name of --http-allow-host",
                self.port
            )
        }
    }
}

/// Whether `origin` (an `Origin` header) is the origin of the page at
/// `host` itself: `http://` (or `https://`, through a TLS proxy) and the
/// same authority.
pub(crate) fn same_origin(origin: &str, host: &str) -> bool {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|authority| authority.eq_ignore_ascii_case(host))
}

/// This machine's hostname (`/proc/sys/kernel/hostname`), if it reads as one.
pub(crate) fn machine_hostname() -> Option<String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = text.trim();
    Authority::parse(name)
        .filter(|a| a.port.is_none())
        .map(|_| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(bind: &str, allowed: &[&str], hostname: Option<&str>) -> Hosts {
        let allowed: Vec<String> = allowed.iter().map(|s| (*s).to_owned()).collect();
        Hosts::new(bind.parse().unwrap(), &allowed, hostname)
    }

    #[test]
    fn authorities_split_into_name_and_port() {
        let a = |name, port| Some(Authority { name, port });
        assert_eq!(Authority::parse("example.com"), a("example.com", None));
        assert_eq!(
            Authority::parse("example.com:80"),
            a("example.com", Some(80))
        );
        assert_eq!(Authority::parse("[::1]:9100"), a("[::1]", Some(9100)));
        assert_eq!(Authority::parse("[::1]"), a("[::1]", None));
        for bad in [
            "", ":80", "a:", "a:x", "a:70000", "a b", "a/b", "[::1", "[zz]:1", "[::1]x", "a@b",
            "a:+1",
        ] {
            assert_eq!(Authority::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_loopback_bind_answers_loopback_names_and_allowed_ones() {
        let h = hosts("127.0.0.1:9100", &["dash.example"], Some("box"));
        for ok in [
            "127.0.0.1:9100",
            "localhost:9100",
            "LOCALHOST:9100",
            "[::1]:9100",
            "127.0.0.2:9100",
            "dash.example",
            "dash.example:9100",
        ] {
            assert!(h.accepts(ok), "{ok}");
        }
        for refused in [
            "127.0.0.1:9101",
            "localhost",
            "evil.example:9100",
            "192.168.1.5:9100",
            "box:9100",
            "box",
            "dash.example:1",
            "",
        ] {
            assert!(!h.accepts(refused), "{refused}");
        }
    }

    #[test]
    fn another_bind_answers_ip_literals_its_hostname_and_allowed_names() {
        let h = hosts("0.0.0.0:9100", &["dash.example:8443"], Some("box"));
        for ok in [
            "192.168.1.5:9100",
            "127.0.0.1:9100",
            "[fe80::1]:9100",
            "box",
            "box:9100",
            "BOX:9100",
            "dash.example:8443",
            "localhost:9100",
        ] {
            assert!(h.accepts(ok), "{ok}");
        }
        for refused in [
            "192.168.1.5:9101",
            "192.168.1.5",
            "box:1",
            "dash.example",
            "dash.example:9100",
            "evil.example:9100",
            "localhost",
        ] {
            assert!(!h.accepts(refused), "{refused}");
        }
    }

    #[test]
    fn an_origin_must_be_the_host_s_own() {
        assert!(same_origin("http://127.0.0.1:9100", "127.0.0.1:9100"));
        assert!(same_origin("https://Dash.example", "dash.example"));
        assert!(!same_origin("http://evil.example", "127.0.0.1:9100"));
        assert!(!same_origin("null", "127.0.0.1:9100"));
        assert!(!same_origin("http://127.0.0.1:9101", "127.0.0.1:9100"));
        assert!(!same_origin("ftp://127.0.0.1:9100", "127.0.0.1:9100"));
    }
}
