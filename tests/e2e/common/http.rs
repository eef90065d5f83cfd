//! A plain HTTP/1.1 client for the tests of the daemon's HTTP listener
//! (`--http`): one request per connection, the answer read whole; [`Api`]
//! sends the daemon's token with each; [`open_stream`] reads only an
//! answer's head (for event streams, which do not end).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use serde_json::Value;

use super::daemon::{Daemon, LIMIT};

/// The port of a daemon started with `--http 127.0.0.1:0`, from its log.
pub fn http_port(daemon: &Daemon) -> u16 {
    let seen = &daemon.process.as_ref().expect("running").stderr_seen;
    let line = seen
        .iter()
        .find(|l| l.contains("taskhost HTTP listening on http://"))
        .unwrap_or_else(|| panic!("no HTTP listening line in {seen:?}"));
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("an address");
    addr.rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("a port")
}

/// The dashboard URL with the daemon's own token (`http://ADDR/#token=…`)
/// that a daemon started with `--http` and no `--http-token-file` logs.
pub fn dashboard_url(daemon: &Daemon) -> String {
    let seen = &daemon.process.as_ref().expect("running").stderr_seen;
    let line = seen
        .iter()
        .find(|l| l.contains("taskhost HTTP dashboard: http://"))
        .unwrap_or_else(|| panic!("no HTTP dashboard line in {seen:?}"));
    line.split("taskhost HTTP dashboard: ")
        .nth(1)
        .expect("a URL")
        .trim()
        .to_owned()
}

/// The daemon's own token: `<state dir>/http-token` (a [`Daemon`]'s state
/// directory is `state` in its temporary directory).
pub fn own_token(daemon: &Daemon) -> String {
    let path = daemon.dir.path().join("state").join("http-token");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// A daemon's HTTP API with its token: every request carries
/// `Authorization: Bearer <token>`.
#[derive(Debug, Clone)]
pub struct Api {
    pub port: u16,
    pub token: String,
}

impl Api {
    /// The API of a daemon started with `--http 127.0.0.1:0` and no token
    /// file: its port from the log, its own token from its state directory.
    pub fn of(daemon: &Daemon) -> Self {
        Self {
            port: http_port(daemon),
            token: own_token(daemon),
        }
    }

    /// `Authorization: Bearer <token>`, owned.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    pub fn get(&self, path: &str) -> Answer {
        self.request("GET", path, &[], "")
    }

    /// A request with the token (and these headers).
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let bearer = self.bearer();
        let mut all = vec![("Authorization", bearer.as_str())];
        all.extend_from_slice(headers);
        request(self.port, method, path, &all, body)
    }

    /// A JSON `POST` with the token.
    pub fn post(&self, path: &str) -> Answer {
        self.request("POST", path, &[("Content-Type", "application/json")], "{}")
    }
}

/// One HTTP/1.1 answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// A plain HTTP/1.1 request on a fresh connection (`Connection: close`).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    request_bytes(port, method, path, headers, body.as_bytes())
}

/// [`request`] with a body of any bytes.
pub fn request_bytes(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the HTTP listener");
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    // Read the header block, then the body by its length (some servers
    // keep the connection open despite `Connection: close`).
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read the answer");
        if n == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    });
    let rest = match length {
        Some(n) => {
            let mut body = vec![0; n];
            reader.read_exact(&mut body).expect("read the body");
            String::from_utf8(body).expect("a UTF-8 body")
        }
        None => {
            let mut body = String::new();
            reader.read_to_string(&mut body).expect("read the body");
            body
        }
    };
    let rest = rest.as_str();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = if headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

pub fn get(port: u16, path: &str) -> Answer {
    request(port, "GET", path, &[], "")
}

/// An answer whose body is still arriving (an event stream): its status,
/// its head's headers, and the reader positioned at the body.
pub struct Stream {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub reader: BufReader<TcpStream>,
}

impl Stream {
    /// The next line of the body (chunk sizes included; fine for finding
    /// an event's text). Panics if the stream ended.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).expect("read the stream");
        assert!(n > 0, "the stream ended");
        line
    }
}

/// Sends a `GET` and reads only the answer's head.
pub fn open_stream(port: u16, path: &str, headers: &[(&str, &str)]) -> Stream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the HTTP listener");
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read the answer's head");
        if n == 0 || line == "\r\n" {
            break;
        }
        lines.push(line);
    }
    let status = lines
        .first()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {lines:?}"));
    let headers = lines[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Stream {
        status,
        headers,
        reader,
    }
}
