//! Outbound HTTP end to end: the real `host` binary (in process and through a
//! daemon), the real `http-get`, `http-burst` and `deploy` plugins, and small
//! HTTP servers the test starts on 127.0.0.1 only: grants by name, then by
//! the addresses a name resolves to (`localhost` is loopback: only a grant of
//! `127.0.0.1` reaches it), URLs with a user, wildcards against IP addresses,
//! and the per-attempt caps on requests in flight and header bytes. Each
//! server reports every request it receives and every connection a client
//! closes, so tests synchronise on what the server saw, never on sleeps, and
//! can assert that a denied request never reached it.

use crate::{common, daemon};

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use common::{Finished, run_host};
use daemon::{Daemon, LIMIT, p};
use serde_json::Value;

/// A bound that only a request the host failed to drop would exceed: the
/// per-request first-byte timeout is 30 s and the daemon's grace here 60 s.
const PROMPT: Duration = Duration::from_secs(10);

/// One request as the server read it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// What the server does with a request.
#[derive(Clone)]
enum Answer {
    /// Answer with this status, extra headers and body.
    With(u16, Vec<(&'static str, String)>, String),
    /// Never answer: hold the connection until the client closes it.
    Hold,
    /// Send the headers and half of the body, then hold.
    HoldBody,
}

/// What happened at the server, in order.
#[derive(Debug)]
enum ServerEvent {
    Request(Seen),
    /// A held connection was closed by the client.
    Closed(String),
}

type Route = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

/// A tiny HTTP/1.1 server on 127.0.0.1, one thread per connection.
struct Server {
    port: u16,
    events: Receiver<ServerEvent>,
    log: Vec<ServerEvent>,
}

impl Server {
    fn start(route: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local addr").port();
        let (tx, events) = channel();
        let route: Route = Arc::new(route);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (tx, route) = (tx.clone(), Arc::clone(&route));
                std::thread::spawn(move || serve(stream, &route, &tx));
            }
        });
        Self {
            port,
            events,
            log: Vec::new(),
        }
    }

    /// `http://127.0.0.1:PORT`
    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin())
    }

    /// Waits for the next request (at most `limit`).
    fn next_request(&mut self, limit: Duration) -> Seen {
        self.wait_for(limit, |e| match e {
            ServerEvent::Request(seen) => Some(seen.clone()),
            ServerEvent::Closed(_) => None,
        })
    }

    /// Waits until the client closed the held connection of `path`.
    fn closed(&mut self, path: &str, limit: Duration) {
        self.wait_for(limit, |e| match e {
            ServerEvent::Closed(p) if p == path => Some(()),
            _ => None,
        });
    }

    fn wait_for<T>(&mut self, limit: Duration, pick: impl Fn(&ServerEvent) -> Option<T>) -> T {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(event) => {
                    let picked = pick(&event);
                    self.log.push(event);
                    if let Some(picked) = picked {
                        return picked;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the server saw nothing more within {limit:?}; it saw {:?}",
                        self.log
                    )
                }
            }
        }
    }

    /// Every request received so far (the ones not yet waited for too).
    fn requests(&mut self) -> Vec<Seen> {
        while let Ok(event) = self.events.try_recv() {
            self.log.push(event);
        }
        self.log
            .iter()
            .filter_map(|e| match e {
                ServerEvent::Request(seen) => Some(seen.clone()),
                ServerEvent::Closed(_) => None,
            })
            .collect()
    }
}

fn serve(stream: TcpStream, route: &Route, events: &Sender<ServerEvent>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut writer = stream;
    loop {
        let Some(seen) = read_request(&mut reader) else {
            return;
        };
        let answer = route(&seen);
        let path = seen.path.clone();
        let _ = events.send(ServerEvent::Request(seen));
        match answer {
            Answer::With(status, headers, body) => {
                let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                head.push_str("\r\n");
                if writer.write_all(head.as_bytes()).is_err()
                    || writer.write_all(body.as_bytes()).is_err()
                {
                    return;
                }
            }
            Answer::Hold | Answer::HoldBody => {
                if matches!(answer, Answer::HoldBody) {
                    let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhalf");
                    let _ = writer.flush();
                }
                // Read until the client goes away.
                let mut sink = [0u8; 1024];
                while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
                let _ = events.send(ServerEvent::Closed(path));
                return;
            }
        }
    }
}

/// Reads one request: request line, headers, a content-length or chunked
/// body. `None` at the end of the connection.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Seen> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    let mut body = Vec::new();
    if let Some(len) = headers.get("content-length") {
        body.resize(len.parse().ok()?, 0);
        reader.read_exact(&mut body).ok()?;
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

/// A server that answers `/hello` with 200 `hi there` and 404 otherwise.
fn hello_server() -> Server {
    Server::start(|seen| match seen.path.as_str() {
        "/hello" => Answer::With(200, Vec::new(), "hi there".into()),
        _ => Answer::With(404, Vec::new(), "no such page".into()),
    })
}

fn http_get(url: &str, extra: &[&str]) -> Finished {
    let mut args = vec!["run", "--name", "get"];
    let plugin = p("http-get");
    let param = format!("url={url}");
    args.extend([plugin.as_str(), "--param", param.as_str()]);
    args.extend_from_slice(extra);
    run_host(&args)
}

fn json(out: &Finished) -> Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON object ({e}): {:?}; stderr {}",
            out.stdout, out.stderr
        )
    })
}

#[test]
fn an_allowed_host_is_reached() {
    let mut server = hello_server();
    let out = http_get(&server.url("/hello"), &["--allow-http", &server.origin()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "HTTP 200\nhi there");
    let seen = server.next_request(LIMIT);
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("GET", "/hello")
    );
    assert_eq!(seen.headers["host"], format!("127.0.0.1:{}", server.port));
    assert!(
        out.stderr.contains("[get info] http://127.0.0.1:"),
        "the guest's own lines are there: {}",
        out.stderr
    );
}

#[test]
fn other_hosts_ports_and_schemes_are_denied_before_any_connection() {
    let mut allowed = hello_server();
    let mut other = hello_server();
    let grant = allowed.origin();
    for (url, origin) in [
        // Another port on the same address.
        (other.url("/hello"), other.origin()),
        // Another name for the same address and port.
        (
            format!("http://localhost:{}/hello", allowed.port),
            format!("http://localhost:{}", allowed.port),
        ),
    ] {
        let out = http_get(&url, &["--allow-http", &grant, "--json"]);
        // The guest saw `HTTP-request-denied` (the SDK turns exactly that
        // code into a fatal "denied").
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        let v = json(&out);
        assert_eq!(v["outcome"], "fatal", "{v}");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.starts_with(&format!("the host denied the request to {url}")),
            "{reason}"
        );
        // The task's log names the host and the flag that grants it.
        let line = format!(
            "[get warn] outbound HTTP to {origin} denied: this task is not granted it; \
             add --allow-http {origin}"
        );
        assert!(out.stderr.contains(&line), "{line:?} in {}", out.stderr);
    }
    // https is the default: a grant without http:// does not allow http.
    let https_only = format!("127.0.0.1:{}", allowed.port);
    let out = http_get(&allowed.url("/hello"), &["--allow-http", &https_only]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("add --allow-http {}", allowed.origin())),
        "{}",
        out.stderr
    );
    assert!(allowed.requests().is_empty(), "{:?}", allowed.requests());
    assert!(other.requests().is_empty(), "{:?}", other.requests());
}

#[test]
fn redirects_are_checked_hop_by_hop() {
    let mut elsewhere = hello_server();
    let target = elsewhere.url("/hello");
    let mut server = Server::start(move |seen| match seen.path.as_str() {
        "/hello" => Answer::With(200, Vec::new(), "hi there".into()),
        "/home" => Answer::With(302, vec![("location", "/hello".into())], String::new()),
        "/away" => Answer::With(302, vec![("location", target.clone())], String::new()),
        _ => Answer::With(404, Vec::new(), String::new()),
    });
    let grant = server.origin();
    // A redirect within the grant is followed.
    let out = http_get(&server.url("/home"), &["--allow-http", &grant]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "HTTP 200\nhi there");
    assert_eq!(server.next_request(LIMIT).path, "/home");
    assert_eq!(server.next_request(LIMIT).path, "/hello");
    // A redirect to a host outside it is denied at that hop.
    let out = http_get(&server.url("/away"), &["--allow-http", &grant]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert_eq!(server.next_request(LIMIT).path, "/away");
    assert!(
        out.stderr.contains(&format!(
            "outbound HTTP to {0} denied: this task is not granted it; add --allow-http {0}",
            elsewhere.origin()
        )),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "the host denied the request to {}",
            elsewhere.url("/hello")
        )),
        "{}",
        out.stderr
    );
    assert!(
        elsewhere.requests().is_empty(),
        "{:?}",
        elsewhere.requests()
    );
    // With both granted, the same redirect goes through.
    let out = http_get(
        &server.url("/away"),
        &["--allow-http", &grant, "--allow-http", &elsewhere.origin()],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(elsewhere.next_request(LIMIT).path, "/hello");
}

#[test]
fn a_plugin_declaring_network_needs_a_grant() {
    let mut server = hello_server();
    let out = http_get(&server.url("/hello"), &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "the plugin needs outbound HTTP, but this submission does not grant it: \
             add --allow-http HOST[:PORT]"
        ),
        "{}",
        out.stderr
    );
    let d = Daemon::start(&["--allow-http", &server.origin()]);
    let url = format!("url={}", server.url("/hello"));
    let out = d.run(&["submit", &p("http-get"), "--param", &url, "--wait"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("add --allow-http HOST[:PORT]"),
        "{}",
        out.stderr
    );
    assert!(server.requests().is_empty(), "{:?}", server.requests());
}

#[test]
fn the_daemon_grants_only_within_its_ceiling() {
    let mut server = hello_server();
    let other = hello_server();
    let url = format!("url={}", server.url("/hello"));

    // No ceiling configured: the daemon allows no outbound HTTP at all.
    let d = Daemon::start(&[]);
    let origin = server.origin();
    let out = d.run(&[
        "submit",
        &p("http-get"),
        "--param",
        &url,
        "--allow-http",
        &origin,
        "--wait",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "--allow-http {origin}: this daemon allows no outbound HTTP; its operator can allow \
             it with `allow_http = [\"{origin}\"]` in the config file or `host serve --allow-http {origin}`"
        )),
        "{}",
        out.stderr
    );
    drop(d);

    // A ceiling from the config file.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, format!("allow_http = [\"{origin}\"]\n")).unwrap();
    let d = Daemon::start(&["--config", config.to_str().unwrap()]);
    let out = d.run(&[
        "submit",
        &p("http-get"),
        "--param",
        &url,
        "--allow-http",
        &other.origin(),
        "--wait",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "--allow-http {} is beyond what this daemon allows ({origin})",
            other.origin()
        )),
        "{}",
        out.stderr
    );
    // Within it, the request goes out, and the grant is stored with the task.
    let out = d.run(&[
        "submit",
        &p("http-get"),
        "--param",
        &url,
        "--allow-http",
        &origin,
        "--name",
        "fetch",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "HTTP 200\nhi there");
    assert_eq!(server.next_request(LIMIT).path, "/hello");

    // A denied request leaves its line in the task's log (`host logs`).
    let elsewhere = format!(
        "url={}",
        server.url("/hello").replace("127.0.0.1", "localhost")
    );
    let out = d.run(&[
        "submit",
        &p("http-get"),
        "--param",
        &elsewhere,
        "--allow-http",
        &origin,
        "--name",
        "astray",
        "--wait",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let logs = d.run(&["logs", "astray"]);
    assert_eq!(logs.code, Some(0), "{}", logs.stderr);
    let origin_elsewhere = origin.replace("127.0.0.1", "localhost");
    assert!(
        logs.stdout.contains(&format!(
            "outbound HTTP to {origin_elsewhere} denied: this task is not granted it; \
             add --allow-http {origin_elsewhere}"
        )),
        "{}",
        logs.stdout
    );
    assert_eq!(server.requests().len(), 1, "{:?}", server.requests());
}

#[test]
fn a_cancel_mid_request_ends_the_attempt_at_once() {
    let mut server = Server::start(|seen| match seen.path.as_str() {
        "/body" => Answer::HoldBody,
        _ => Answer::Hold,
    });
    // A long grace: only a request the host drops at the cancel ends the
    // task within PROMPT.
    let d = Daemon::start(&["--allow-http", &server.origin(), "--grace", "60s"]);
    for path in ["/headers", "/body"] {
        let name = format!("held{}", path.replace('/', "-"));
        let url = format!("url={}", server.url(path));
        d.submit(&[
            &p("http-get"),
            "--param",
            &url,
            "--allow-http",
            &server.origin(),
            "--name",
            &name,
        ]);
        // The request is in flight: the server holds it.
        assert_eq!(server.next_request(LIMIT).path, path);
        let started = Instant::now();
        let out = d.run(&["cancel", &name, "--json"]);
        let took = started.elapsed();
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let v = json(&out);
        assert_eq!(v["report"]["outcome"], "canceled", "{v}");
        assert!(took < PROMPT, "cancel took {took:?} ({path})");
        // The host dropped the connection.
        server.closed(path, PROMPT);
    }
}

#[test]
fn the_attempt_timeout_counts_the_request() {
    let mut server = Server::start(|_| Answer::Hold);
    let started = Instant::now();
    let out = http_get(
        &server.url("/slow"),
        &[
            "--allow-http",
            &server.origin(),
            "--timeout",
            "1s",
            "--json",
        ],
    );
    let took = started.elapsed();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(v["reason"], "attempt 1 timed out after 1.00s", "{v}");
    assert!(took < PROMPT, "took {took:?}");
    assert_eq!(server.next_request(LIMIT).path, "/slow");
    server.closed("/slow", PROMPT);
}

#[test]
fn a_guest_may_shorten_its_first_byte_timeout() {
    let mut server = Server::start(|_| Answer::Hold);
    let out = http_get(
        &server.url("/slow"),
        &[
            "--allow-http",
            &server.origin(),
            "--param",
            "timeout_ms=200",
            "--json",
        ],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(
        v["reason"],
        format!("the request to {} timed out", server.url("/slow")),
        "{v}"
    );
    server.closed("/slow", PROMPT);
}

#[test]
fn deploy_posts_its_payload_and_fails_on_an_error_status() {
    let mut server = Server::start(|seen| match seen.path.as_str() {
        "/deploy" => Answer::With(201, Vec::new(), "created".into()),
        _ => Answer::With(500, Vec::new(), "disk full".into()),
    });
    let endpoint = format!("endpoint={}", server.url("/deploy"));
    let out = run_host(&[
        "run",
        &p("deploy"),
        "--param",
        "env=staging",
        "--param",
        &endpoint,
        "--allow-http",
        &server.origin(),
        "--input",
        "v1.2.3",
        "--name",
        "ship",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "deployed to staging");
    let seen = server.next_request(LIMIT);
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/deploy")
    );
    assert_eq!(seen.headers["content-type"], "application/json");
    let payload: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(
        payload,
        serde_json::json!({"env": "staging", "task": "ship", "attempt": 1, "version": "v1.2.3"})
    );

    // Through the daemon too; a 500 fails the attempt, naming the answer.
    let d = Daemon::start(&["--allow-http", &server.origin()]);
    let broken = format!("endpoint={}", server.url("/broken"));
    let out = d.run(&[
        "submit",
        &p("deploy"),
        "--param",
        "env=prod",
        "--param",
        &broken,
        "--allow-http",
        &server.origin(),
        "--wait",
        "--json",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(
        v["reason"],
        format!("{} answered HTTP 500: disk full", server.url("/broken")),
        "{v}"
    );
    assert_eq!(server.next_request(LIMIT).method, "POST");

    // Without an endpoint, a dry run that sends nothing.
    let out = run_host(&["run", &p("deploy"), "--param", "env=dev"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "deployed to dev (dry run: no endpoint)");
    assert_eq!(server.requests().len(), 2);
}

/// A server whose first request of each path is held and later ones are
/// answered `again PATH`.
fn once_held_server() -> Server {
    let seen_paths = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    Server::start(move |seen| {
        let mut paths = seen_paths.lock().unwrap();
        let first = !paths.contains(&seen.path);
        paths.push(seen.path.clone());
        if first {
            Answer::Hold
        } else {
            Answer::With(200, Vec::new(), format!("again {}", seen.path))
        }
    })
}

#[test]
fn a_recovered_task_keeps_its_grant_within_the_new_ceiling() {
    let mut kept = once_held_server();
    let mut dropped = once_held_server();
    let mut d = Daemon::start(&[
        "--allow-http",
        &kept.origin(),
        "--allow-http",
        &dropped.origin(),
    ]);
    for (name, server) in [("kept", &mut kept), ("dropped", &mut dropped)] {
        let url = format!("url={}", server.url("/x"));
        d.submit(&[
            &p("http-get"),
            "--param",
            &url,
            "--allow-http",
            &server.origin(),
            "--name",
            name,
            "--restart",
            "on-failure",
        ]);
        assert_eq!(server.next_request(LIMIT).path, "/x");
    }
    // kill -9 while both requests are in flight.
    let mut process = d.process.take().expect("running");
    process.child.kill().expect("SIGKILL");
    let _ = process.child.wait();
    kept.closed("/x", PROMPT);
    dropped.closed("/x", PROMPT);

    // The new ceiling covers only `kept`'s grant: `kept` runs again with
    // the grant the store kept; `dropped` ends failed, naming its grant.
    d.restart(&["--allow-http", &kept.origin()]);
    let out = d.run(&["wait", "kept"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "HTTP 200\nagain /x");
    let out = d.run(&["wait", "dropped", "--json"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "--allow-http {} is beyond what this daemon allows ({})",
            dropped.origin(),
            kept.origin()
        )),
        "{reason}"
    );
    assert_eq!(kept.requests().len(), 2);
    assert_eq!(dropped.requests().len(), 1, "{:?}", dropped.requests());
}

#[test]
fn a_name_resolving_to_loopback_needs_a_grant_of_the_address_itself() {
    let mut server = hello_server();
    let port = server.port;
    // `localhost` is granted by name, but it resolves to a loopback
    // address, which only a grant of that IP address reaches.
    let url = format!("http://localhost:{port}/hello");
    let out = http_get(
        &url,
        &[
            "--allow-http",
            &format!("http://localhost:{port}"),
            "--json",
        ],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "fatal", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("the host denied the request to {url}")),
        "{reason}"
    );
    let line = out
        .stderr
        .lines()
        .find(|l| {
            l.contains(&format!(
                "outbound HTTP to http://localhost:{port} denied: "
            ))
        })
        .unwrap_or_else(|| panic!("a denial line in {}", out.stderr));
    let v4 = format!(
        "localhost resolves to 127.0.0.1, a loopback address, which only a grant of that IP \
         address reaches; add --allow-http http://127.0.0.1:{port} to allow it"
    );
    let v6 = format!(
        "localhost resolves to ::1, a loopback address, which only a grant of that IP \
         address reaches; add --allow-http http://[::1]:{port} to allow it"
    );
    assert!(line.ends_with(&v4) || line.ends_with(&v6), "{line}");
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    // The grant of the address itself reaches the same server.
    let out = http_get(&server.url("/hello"), &["--allow-http", &server.origin()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "HTTP 200\nhi there");
    assert_eq!(server.next_request(LIMIT).path, "/hello");
}

#[test]
fn a_url_with_a_user_is_denied() {
    let mut server = hello_server();
    let url = format!("http://x@127.0.0.1:{}/hello", server.port);
    let out = http_get(&url, &["--allow-http", &server.origin(), "--json"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "fatal", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .starts_with("the host denied the request to http://x@127.0.0.1:"),
        "{v}"
    );
    let line = format!(
        "[get warn] outbound HTTP to {} denied: the URL names a user or password before the \
         host (`…@`), which this host never sends; remove it from the URL",
        server.origin()
    );
    assert!(out.stderr.contains(&line), "{line:?} in {}", out.stderr);
    assert!(server.requests().is_empty(), "{:?}", server.requests());
}

#[test]
fn a_wildcard_matches_names_never_ip_addresses() {
    let mut server = hello_server();
    let wildcard = format!("http://*.0.0.1:{}", server.port);
    let out = http_get(&server.url("/hello"), &["--allow-http", &wildcard]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "outbound HTTP to {0} denied: this task is not granted it; add --allow-http {0}",
            server.origin()
        )),
        "{}",
        out.stderr
    );
    assert!(server.requests().is_empty(), "{:?}", server.requests());
}

#[test]
fn requests_past_the_in_flight_cap_fail_with_connection_limit_reached() {
    let mut server = hello_server();
    let url = format!("url={}", server.url("/hello"));
    let origin = server.origin();
    let burst = |cap: &str| {
        run_host(&[
            "run",
            &p("http-burst"),
            "--name",
            "burst",
            "--param",
            &url,
            "--param",
            "count=4",
            "--allow-http",
            &origin,
            "--max-http-requests",
            cap,
            "--json",
        ])
    };
    // Four started at once under a cap of two: the first two go out.
    let out = burst("2");
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed", "{v}");
    assert_eq!(
        v["reason"],
        "1: HTTP 200; 2: HTTP 200; 3: error connection-limit-reached; 4: error \
         connection-limit-reached (the guest hit its limit of 2 outbound HTTP requests in \
         flight per attempt (raise it with --max-http-requests))",
        "{v}"
    );
    assert!(
        out.stderr.contains(&format!(
            "[burst warn] outbound HTTP to {origin} refused: this attempt already has 2 \
             requests in flight, its limit (raise it with --max-http-requests)"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(server.requests().len(), 2, "{:?}", server.requests());
    // Under a cap of four, all four.
    let out = burst("4");
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(
        v["output"], "1: HTTP 200\n2: HTTP 200\n3: HTTP 200\n4: HTTP 200",
        "{v}"
    );
    assert_eq!(server.requests().len(), 6, "{:?}", server.requests());
}

#[test]
fn a_header_set_past_its_cap_traps_the_guest() {
    let mut server = hello_server();
    let url = format!("url={}", server.url("/hello"));
    let origin = server.origin();
    let plugin = p("http-burst");
    let padded = |extra: &[&str]| {
        let mut args = vec![
            "run",
            plugin.as_str(),
            "--param",
            url.as_str(),
            "--param",
            "count=1",
            "--param",
            "header=40000",
            "--allow-http",
            origin.as_str(),
            "--json",
        ];
        args.extend_from_slice(extra);
        run_host(&args)
    };
    // 40,000 bytes of one header, over the default 32KiB of a header set.
    let out = padded(&[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["outcome"], "failed", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "the guest hit its limit of 32KiB per set of HTTP header fields (raise it with \
             --max-header-bytes); "
        ),
        "{reason}"
    );
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    let out = padded(&["--max-header-bytes", "64KiB"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(json(&out)["output"], "1: HTTP 200");
    assert_eq!(server.next_request(LIMIT).headers["x-pad"].len(), 40_000);
}
