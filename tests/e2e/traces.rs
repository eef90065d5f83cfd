//! OpenTelemetry traces over OTLP/HTTP: a collector in the test (a plain
//! HTTP/1.1 server on 127.0.0.1 that decodes each export with the OTLP
//! project's own protobuf types) receives a trace per task from
//! `host serve --otlp` and from `host run` with the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`: a task span with the task's identity, its
//! plugin's digest and its outcome, one child span per attempt with its
//! number and result. A collector that is down is said once on the log and
//! costs no task anything; a setting the host cannot honour is one error.

use crate::{common, daemon};

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use daemon::{Daemon, LIMIT, p};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;

/// A span as received, with its resource's attributes.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
    attributes: BTreeMap<String, String>,
    resource: BTreeMap<String, String>,
    status: i32,
    status_message: String,
}

impl Received {
    fn attr(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .unwrap_or_else(|| panic!("span `{}` has no attribute {key}: {self:?}", self.name))
    }
}

fn flatten(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// An OTLP/HTTP collector on 127.0.0.1: every POST to /v1/traces is
/// decoded and its spans sent on the channel before the 200 goes back, so
/// a host that has exited after a successful export has delivered them.
struct Collector {
    port: u16,
    spans: Receiver<Received>,
    seen: Vec<Received>,
}

impl Collector {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        let port = listener.local_addr().unwrap().port();
        let (tx, spans) = channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let tx = tx.clone();
                std::thread::spawn(move || serve_connection(stream, &tx));
            }
        });
        Self {
            port,
            spans,
            seen: Vec::new(),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Receives spans until `done` holds for those seen so far.
    fn until(&mut self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + LIMIT;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.spans.recv_timeout(left) {
                Ok(span) => self.seen.push(span),
                Err(_) => panic!("no {what} within {LIMIT:?}; spans so far: {:#?}", self.seen),
            }
        }
        self.seen.clone()
    }
}

fn serve_connection(stream: TcpStream, tx: &Sender<Received>) {
    let mut writer = stream.try_clone().expect("clone the connection");
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            let (name, value) = line.split_once(':').expect("a header line");
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = Some(value.parse::<usize>().expect("a length")),
                "transfer-encoding" => panic!("the exporter sent a chunked body"),
                "content-type" => assert_eq!(value, "application/x-protobuf"),
                _ => {}
            }
        }
        assert!(
            request_line.starts_with("POST /v1/traces "),
            "the exporter asked for {request_line:?}"
        );
        let mut body = vec![0; length.expect("a Content-Length")];
        reader.read_exact(&mut body).expect("the body");
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP export");
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| flatten(&r.attributes))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    let status = span.status.clone().unwrap_or_default();
                    let _ = tx.send(Received {
                        name: span.name.clone(),
                        trace_id: span.trace_id.clone(),
                        span_id: span.span_id.clone(),
                        parent: span.parent_span_id.clone(),
                        attributes: flatten(&span.attributes),
                        resource: resource.clone(),
                        status: status.code,
                        status_message: status.message,
                    });
                }
            }
        }
        let reply =
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn task_span<'a>(spans: &'a [Received], name: &str) -> Option<&'a Received> {
    spans.iter().find(|s| {
        s.name == "task" && s.attributes.get("task.name").map(String::as_str) == Some(name)
    })
}

fn attempts_of<'a>(spans: &'a [Received], task: &Received) -> Vec<&'a Received> {
    let mut attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "attempt" && s.parent == task.span_id)
        .collect();
    attempts.sort_by_key(|s| s.attr("attempt").parse::<u32>().expect("a number"));
    attempts
}

#[test]
fn serve_exports_a_trace_per_task_with_its_attempts() {
    let mut collector = Collector::start();
    let url = collector.url();
    let mut daemon = Daemon::start_with_env(
        &["--store", "memory", "--otlp", &url],
        // Batches every 100 ms instead of every 5 s, so that spans arrive
        // while the daemon runs.
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let process = daemon.process.as_ref().unwrap();
    assert!(
        process
            .stderr_seen
            .iter()
            .any(|l| l.contains("exporting task and attempt spans over OTLP")
                && l.contains(&format!("{url}/v1/traces"))),
        "the log names the endpoint: {:?}",
        process.stderr_seen
    );

    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--name",
        "greet",
        "--slot",
        "s1",
        "--input",
        "hi",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = daemon.run(&[
        "submit",
        &p("flaky"),
        "--name",
        "wobbly",
        "--param",
        "fail_times=5",
        "--restart",
        "on-failure",
        "--max-retries",
        "1",
        "--backoff",
        "1ms,1ms,1,none",
        "--wait",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);

    // Spans are exported as they end: the two tasks' spans arrive while the
    // daemon runs.
    let spans = collector.until("span of both tasks", |spans| {
        task_span(spans, "greet").is_some() && task_span(spans, "wobbly").is_some()
    });
    let digests: BTreeMap<String, String> = daemon
        .plugins()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["digest"].as_str().unwrap().to_owned(),
            )
        })
        .collect();

    let greet = task_span(&spans, "greet").unwrap();
    assert!(
        greet.parent.is_empty(),
        "a task is its trace's root: {greet:?}"
    );
    assert_eq!(greet.attr("task.slot"), "s1");
    assert!(greet.attr("task.id").parse::<u64>().unwrap() >= 1);
    assert_eq!(greet.attr("plugin.digest"), digests["hello"]);
    assert_eq!(greet.attr("outcome"), "completed");
    assert_ne!(greet.status, StatusCode::Error as i32);
    assert_eq!(greet.resource["service.name"], "taskhost");
    let attempts = attempts_of(&spans, greet);
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    assert_eq!(attempts[0].attr("attempt"), "1");
    assert_eq!(attempts[0].attr("result"), "succeeded");
    assert_eq!(attempts[0].trace_id, greet.trace_id);

    let wobbly = task_span(&spans, "wobbly").unwrap();
    assert_ne!(wobbly.trace_id, greet.trace_id, "one trace per task");
    assert_eq!(wobbly.attr("plugin.digest"), digests["flaky"]);
    assert_eq!(wobbly.attr("outcome"), "failed");
    assert_eq!(wobbly.status, StatusCode::Error as i32);
    assert!(
        wobbly.status_message.contains("retry limit reached"),
        "{wobbly:?}"
    );
    let attempts = attempts_of(&spans, wobbly);
    let numbers: Vec<&str> = attempts.iter().map(|a| a.attr("attempt")).collect();
    assert_eq!(numbers, ["1", "2"], "{spans:#?}");
    for attempt in attempts {
        assert!(attempt.attr("result").starts_with("failed"), "{attempt:?}");
        assert_eq!(attempt.status, StatusCode::Error as i32);
        assert_eq!(attempt.trace_id, wobbly.trace_id);
    }

    // A task still running at shutdown: its spans are sent before the
    // daemon exits.
    daemon.submit(&[&p("sleeper"), "--name", "late", "--param", "ms=600000"]);
    daemon.wait_until_state("late", "running");
    let out = daemon.run(&["shutdown", "--cancel-all"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (status, _) = daemon.finish(LIMIT);
    assert!(status.success(), "{status}");
    let spans = collector.until("span of the task canceled at shutdown", |spans| {
        task_span(spans, "late").is_some()
    });
    let late = task_span(&spans, "late").unwrap();
    assert_eq!(late.attr("outcome"), "canceled");
    assert_eq!(attempts_of(&spans, late).len(), 1);
}

#[test]
fn run_exports_over_the_standard_variable_and_flushes_at_exit() {
    let mut collector = Collector::start();
    let out = common::host()
        .args(["run", &p("hello"), "--input", "hi"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url())
        .env("OTEL_SERVICE_NAME", "nightly-report")
        .output()
        .expect("run host");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hi");
    // The default batch delay is 5 s and the run took far less: these
    // spans were sent by the flush at exit.
    let spans = collector.until("span of the run", |spans| {
        spans.iter().any(|s| s.name == "task") && spans.iter().any(|s| s.name == "attempt")
    });
    let task = spans.iter().find(|s| s.name == "task").unwrap();
    assert_eq!(task.attr("outcome"), "completed");
    assert!(task.attr("plugin.digest").starts_with("sha256:"));
    assert_eq!(task.resource["service.name"], "nightly-report");
    assert_eq!(attempts_of(&spans, task).len(), 1);
}

#[test]
fn a_collector_that_is_down_is_said_once_and_costs_no_task() {
    // A port that was free a moment ago: nothing listens on it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut daemon = Daemon::start_with_env(
        &["--store", "memory", "--otlp", &url],
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
    );
    for input in ["a", "b", "c"] {
        let out = daemon.run(&["submit", &p("hello"), "--input", input, "--wait"]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        assert_eq!(out.stdout.trim(), input);
    }
    let process = daemon.process.as_mut().unwrap();
    let line = process.wait_for_line("OTLP export failed", LIMIT);
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    let out = daemon.run(&["submit", &p("hello"), "--input", "d", "--wait"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = daemon.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (status, finished) = daemon.finish(LIMIT);
    assert!(status.success(), "{status}");
    let warnings = finished
        .stderr
        .lines()
        .filter(|l| l.contains("OTLP export failed"))
        .count();
    assert_eq!(warnings, 1, "said once: {}", finished.stderr);
}

#[test]
fn an_otlp_setting_the_host_cannot_honour_is_one_clear_error() {
    let started = Instant::now();
    let out = common::run_host(&[
        "serve",
        "--store",
        "memory",
        "--otlp",
        "https://collector:4318",
    ]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("--otlp") && out.stderr.contains("http://127.0.0.1:4318"),
        "{}",
        out.stderr
    );
    let out = common::host()
        .args(["run", &p("hello"), "--input", "hi"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .expect("run host");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc") && stderr.contains("http/protobuf"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    // Verbs that run no task start no exporter, whatever the environment.
    let out = common::host()
        .args(["ps", "--socket", "/nonexistent/h.sock"])
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .output()
        .expect("run host");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("OTEL"));
    assert!(started.elapsed() < Duration::from_secs(30));
}
