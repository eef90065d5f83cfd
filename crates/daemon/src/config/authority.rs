//! Owns what a host name with an optional port is: the `Host` header the
//! HTTP listener answers, and the `http_allow_hosts` entries it is checked
//! against.

use std::net::{IpAddr, Ipv6Addr};

/// Checks one `http_allow_hosts` entry (`--http-allow-host`): a host name
/// or IP literal (IPv6 in brackets), optionally with `:PORT`.
pub fn check_allow_host(entry: &str) -> Result<(), String> {
    match Authority::parse(entry) {
        Some(_) => Ok(()),
        None => Err(format!(
            "`{entry}` is not a host name like taskhost.example.com or taskhost.example.com:9100 \
             (letters, digits, `-`, `.` and `_`; an IPv6 address in brackets)"
        )),
    }
}

/// A `Host` value (or an allow-list entry) split into its name and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Authority<'a> {
    /// The name or IP literal (an IPv6 one with its brackets).
    pub(crate) name: &'a str,
    /// The port, when one is written.
    pub(crate) port: Option<u16>,
}

impl<'a> Authority<'a> {
    /// Splits `NAME`, `NAME:PORT`, `[IPv6]` or `[IPv6]:PORT`; `None` when
    /// it is none of those (an empty name, characters no host name has, a
    /// port that is not a number).
    pub(crate) fn parse(text: &'a str) -> Option<Self> {
        let (name, port) = if text.starts_with('[') {
            let end = text.find(']')?;
            let (name, after) = text.split_at(end + 1);
            name[1..name.len() - 1].parse::<Ipv6Addr>().ok()?;
            let port = match after {
                "" => None,
                rest => Some(rest.strip_prefix(':')?),
            };
            (name, port)
        } else {
            let (name, port) = match text.rsplit_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (text, None),
            };
            let fits = !name.is_empty()
                && name.len() <= 253
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
            if !fits {
                return None;
            }
            (name, port)
        };
        let port = match port {
            None => None,
            Some(digits) if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) => {
                Some(digits.parse().ok()?)
            }
            Some(_) => return None,
        };
        Some(Self { name, port })
    }

    /// The IP address this name writes, if it is an IP literal.
    pub(crate) fn ip(&self) -> Option<IpAddr> {
        match self.name.strip_prefix('[') {
            Some(v6) => v6
                .strip_suffix(']')?
                .parse::<Ipv6Addr>()
                .ok()
                .map(IpAddr::V6),
            None => self.name.parse().ok(),
        }
    }
}
