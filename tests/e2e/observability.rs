//! `host serve --http`: `/metrics` parsed by a strict OpenMetrics/Prometheus
//! text parser as tasks run, the JSON API against the CLI's `--json`, the
//! security rules (every endpoint but the page needs the token, the
//! operator's or the daemon's own; a non-loopback bind needs the
//! operator's; foreign `Host`s get 421 and foreign `Origin`s 403), the
//! listener's bounds (header timeout, connections, event streams), and the
//! dashboard in a real headless Chromium driven over the DevTools protocol:
//! it asks for the token, takes it from the logged URL's fragment, shows a
//! running sleeper whose progress moves, cancels it with its button, and
//! shows guest-written control characters as escapes. Screenshots go to
//! `target/test-artifacts/`.

use crate::{common, daemon, http};

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use daemon::{Daemon, LIMIT, p};
use http::{Api, dashboard_url, get, http_port, open_stream, own_token, request};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// A strict parser of the text exposition format (OpenMetrics 1.0, which
// Prometheus scrapes): every line is a HELP/TYPE/UNIT comment or a sample
// of a declared family, label values are quoted with the format's escapes,
// values are numbers, and the text ends with `# EOF`.

#[derive(Debug, Default)]
struct Family {
    kind: String,
    help: String,
    /// (suffixed name, labels, value)
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(text: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after);
        }
        let (key, after) = rest.split_once("=\"").expect("label=\"value\"");
        assert!(is_name(key), "bad label name {key:?} in {text:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next().expect("an unterminated label value");
            match c {
                '"' => break i,
                '\\' => match chars.next().expect("an escape").1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    other => panic!("bad escape \\{other} in {text:?}"),
                },
                '\n' => panic!("a raw newline in a label value"),
                c => value.push(c),
            }
        };
        assert!(
            labels.insert(key.to_owned(), value).is_none(),
            "label {key} twice in {text:?}"
        );
        rest = &after[end + 1..];
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        }
    }
}

fn parse_metrics(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut lines: Vec<&str> = text.split('\n').collect();
    assert_eq!(lines.pop(), Some(""), "the text ends with a newline");
    assert_eq!(lines.pop(), Some("# EOF"), "the text ends with # EOF");
    for line in lines {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (what, name, rest) = (
                parts.next().unwrap(),
                parts.next().expect("a family name"),
                parts.next().unwrap_or(""),
            );
            assert!(is_name(name), "bad family name in {line:?}");
            let family = families.entry(name.to_owned()).or_default();
            match what {
                "HELP" => family.help = rest.to_owned(),
                "TYPE" => {
                    assert!(
                        [
                            "counter",
                            "gauge",
                            "histogram",
                            "summary",
                            "info",
                            "stateset",
                            "unknown"
                        ]
                        .contains(&rest),
                        "bad type in {line:?}"
                    );
                    family.kind = rest.to_owned();
                }
                "UNIT" => assert!(name.ends_with(rest), "unit {rest} not in {name}"),
                other => panic!("unknown comment {other} in {line:?}"),
            }
            continue;
        }
        assert!(!line.is_empty(), "an empty line");
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let name = &line[..name_end];
        assert!(is_name(name), "bad sample name in {line:?}");
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(after) => parse_labels(after),
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let value_text = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before the value in {line:?}"));
        let value: f64 = match value_text {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value {v:?} in {line:?}")),
        };
        // The family a sample belongs to: its name less a type's suffix.
        let family = [
            "_total", "_bucket", "_count", "_sum", "_created", "_info", "",
        ]
        .iter()
        .find_map(|suffix| {
            let base = name.strip_suffix(suffix)?;
            families.contains_key(base).then(|| base.to_owned())
        })
        .unwrap_or_else(|| panic!("sample {name} of no declared family"));
        let family = families.get_mut(&family).unwrap();
        let suffix_ok = match family.kind.as_str() {
            "counter" => name.ends_with("_total") || name.ends_with("_created"),
            "histogram" => ["_bucket", "_count", "_sum", "_created"]
                .iter()
                .any(|s| name.ends_with(s)),
            _ => true,
        };
        assert!(
            suffix_ok,
            "sample {name} does not fit its {} family",
            family.kind
        );
        family.samples.push((name.to_owned(), labels, value));
    }
    for (name, family) in &families {
        assert!(!family.kind.is_empty(), "family {name} has no TYPE");
        assert!(!family.help.is_empty(), "family {name} has no HELP");
        if family.kind == "histogram" {
            check_histogram(name, family);
        }
    }
    families
}

/// Buckets are cumulative, end with `+Inf`, and `+Inf` equals `_count`.
fn check_histogram(name: &str, family: &Family) {
    let buckets: Vec<(f64, f64)> = family
        .samples
        .iter()
        .filter(|(n, _, _)| n.ends_with("_bucket"))
        .map(|(_, labels, v)| {
            let le = labels.get("le").expect("a bucket has le");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("a numeric le")
            };
            (le, *v)
        })
        .collect();
    assert!(!buckets.is_empty(), "{name} has no buckets");
    assert!(
        buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{name}: buckets not cumulative: {buckets:?}"
    );
    assert_eq!(
        buckets.last().unwrap().0,
        f64::INFINITY,
        "{name} ends with +Inf"
    );
    let count = value(family, &format!("{name}_count"), &[]);
    assert_eq!(
        buckets.last().unwrap().1,
        count,
        "{name}: +Inf bucket is the count"
    );
}

fn value(family: &Family, sample: &str, labels: &[(&str, &str)]) -> f64 {
    family
        .samples
        .iter()
        .find(|(n, l, _)| {
            n == sample
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .unwrap_or_else(|| panic!("no sample {sample}{labels:?} in {family:?}"))
}

struct Metrics(BTreeMap<String, Family>);

impl Metrics {
    fn scrape(api: &Api) -> Self {
        let answer = api.get("/metrics");
        assert_eq!(answer.status, 200, "{answer:?}");
        let kind = answer
            .headers
            .get("content-type")
            .cloned()
            .unwrap_or_default();
        assert!(
            kind.starts_with("application/openmetrics-text"),
            "content type {kind}"
        );
        Self(parse_metrics(&answer.body))
    }

    fn family(&self, name: &str, kind: &str) -> &Family {
        let family = self
            .0
            .get(name)
            .unwrap_or_else(|| panic!("no family {name}; have {:?}", self.0.keys()));
        assert_eq!(family.kind, kind, "{name}'s type");
        family
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        value(
            self.family(name, "counter"),
            &format!("{name}_total"),
            labels,
        )
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        value(self.family(name, "gauge"), name, labels)
    }

    fn histogram_count(&self, name: &str) -> f64 {
        value(
            self.family(name, "histogram"),
            &format!("{name}_count"),
            &[],
        )
    }
}

/// Scrapes until `ready` holds (the counters follow the event bus, a
/// moment after the outcome a client saw).
fn scrape_until(api: &Api, what: &str, ready: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + LIMIT;
    loop {
        let metrics = Metrics::scrape(api);
        if ready(&metrics) {
            return metrics;
        }
        assert!(Instant::now() < deadline, "metrics never showed {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn metrics_parse_and_count_tasks_as_they_run() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = Api::of(&daemon);

    let before = Metrics::scrape(&api);
    // The standard process metrics.
    assert!(before.gauge("process_resident_memory_bytes", &[]) > 1e6);
    assert!(before.gauge("process_open_fds", &[]) >= 3.0);
    assert!(before.gauge("process_max_fds", &[]) >= before.gauge("process_open_fds", &[]));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value(
        before.family("process_start_time_seconds", "gauge"),
        "process_start_time_seconds",
        &[],
    );
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "start time {started}, now {now}"
    );
    assert_eq!(before.counter("taskhost_submissions", &[]), 0.0);
    assert_eq!(
        before.counter("taskhost_outcomes", &[("outcome", "completed")]),
        0.0
    );
    assert_eq!(before.gauge("taskhost_tasks", &[("state", "running")]), 0.0);
    assert_eq!(
        before.histogram_count("taskhost_attempt_duration_seconds"),
        0.0
    );

    // Two completed, one failed, one rejected (the slot is busy), one
    // queued behind a running sleeper in a slot whose name needs escaping.
    for input in ["a", "b"] {
        let out = daemon.run(&["submit", &p("hello"), "--input", input, "--wait"]);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    let out = daemon.run(&["submit", &p("flaky"), "--param", "fail_times=5", "--wait"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let slot = r#"we"ird\slot"#;
    daemon.submit(&[
        &p("sleeper"),
        "--name",
        "nap",
        "--slot",
        slot,
        "--param",
        "ms=600000",
    ]);
    daemon.wait_until_state("nap", "running");
    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--slot",
        slot,
        "--policy",
        "drop-if-running",
        "--wait",
    ]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    daemon.submit(&[
        &p("sleeper"),
        "--name",
        "next",
        "--slot",
        slot,
        "--policy",
        "queue",
    ]);

    let during = scrape_until(&api, "the queued sleeper", |m| {
        m.counter("taskhost_submissions", &[]) == 6.0
            && m.gauge("taskhost_tasks", &[("state", "queued")]) == 1.0
    });
    assert_eq!(
        during.counter("taskhost_outcomes", &[("outcome", "completed")]),
        2.0
    );
    assert_eq!(
        during.counter("taskhost_outcomes", &[("outcome", "failed")]),
        1.0
    );
    assert_eq!(
        during.counter("taskhost_outcomes", &[("outcome", "rejected")]),
        1.0
    );
    assert_eq!(
        during.counter("taskhost_rejections", &[("kind", "SlotBusy")]),
        1.0
    );
    assert_eq!(
        during.counter("taskhost_rejections", &[("kind", "QueueFull")]),
        0.0
    );
    assert_eq!(
        during.counter("taskhost_attempts", &[("result", "succeeded")]),
        2.0
    );
    assert_eq!(
        during.counter("taskhost_attempts", &[("result", "failed")]),
        1.0
    );
    assert_eq!(
        during.histogram_count("taskhost_attempt_duration_seconds"),
        3.0
    );
    assert_eq!(during.gauge("taskhost_tasks", &[("state", "running")]), 1.0);
    assert_eq!(
        during.gauge("taskhost_slot_queue_depth", &[("slot", slot)]),
        1.0
    );
    assert_eq!(during.gauge("taskhost_queued_submissions", &[]), 1.0);
    assert_eq!(during.gauge("taskhost_slots", &[("state", "running")]), 1.0);
    assert_eq!(during.gauge("taskhost_attempt_permits_in_use", &[]), 1.0);
    assert_eq!(during.gauge("taskhost_attempts_parked", &[]), 0.0);
    assert!(during.gauge("taskhost_attempt_permits", &[]) >= 1.0);
    // hello, flaky and sleeper were compiled once each; the later hello
    // submissions found it in the cache.
    assert_eq!(during.counter("taskhost_plugin_cache_misses", &[]), 3.0);
    assert!(during.counter("taskhost_plugin_cache_hits", &[]) >= 2.0);
    assert_eq!(
        during.histogram_count("taskhost_plugin_compile_seconds"),
        3.0
    );
    assert!(during.gauge("taskhost_plugin_cache_bytes", &[]) > 0.0);
    assert!(during.histogram_count("taskhost_store_commit_seconds") >= 3.0);
    assert_eq!(
        during.counter("taskhost_event_drops", &[("reader", "metrics")]),
        0.0
    );
    // Three compiles take CPU time.
    assert!(
        during.counter("process_cpu_seconds", &[]) > before.counter("process_cpu_seconds", &[])
    );
    assert!(during.counter("taskhost_events", &[]) > before.counter("taskhost_events", &[]));

    // Canceling the owner lets the queued one run; cancel that one too.
    assert_eq!(daemon.run(&["cancel", "nap"]).code, Some(0));
    daemon.wait_until_state("next", "running");
    assert_eq!(daemon.run(&["cancel", "next"]).code, Some(0));
    let after = scrape_until(&api, "two cancels", |m| {
        m.counter("taskhost_outcomes", &[("outcome", "canceled")]) == 2.0
    });
    assert_eq!(after.gauge("taskhost_tasks", &[("state", "running")]), 0.0);
    assert_eq!(after.gauge("taskhost_queued_submissions", &[]), 0.0);
    assert_eq!(
        after.counter("taskhost_attempts", &[("result", "canceled")]),
        2.0
    );
    assert_eq!(after.counter("taskhost_force_aborts", &[]), 0.0);
    assert!(after.counter("taskhost_events", &[]) > during.counter("taskhost_events", &[]));
}

/// The per-slot metrics of flow control: a rate-limited slot's throttled
/// attempts (counted, and waiting now) and its budget, a debounced slot's
/// superseded submissions; `/api/slots` shows each slot's rate.
#[test]
fn slot_metrics_count_throttled_and_superseded_submissions() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = Api::of(&daemon);
    for rule in [
        &["slot", "set", "api", "--capacity", "2", "--rate", "1/1m"][..],
        &["slot", "set", "deb", "--debounce", "10s"],
    ] {
        let out = daemon.run(rule);
        assert_eq!(out.code, Some(0), "{rule:?}: {}", out.stderr);
    }
    // Two owners of `api`: the first starts, the second waits for the rate.
    for name in ["first", "second"] {
        daemon.submit(&[
            &p("sleeper"),
            "--slot",
            "api",
            "--name",
            name,
            "--param",
            "ms=600000",
        ]);
    }
    // Two submissions to `deb` inside its window: the older is superseded.
    let older = daemon.submit(&[&p("hello"), "--slot", "deb"]);
    daemon.submit(&[&p("hello"), "--slot", "deb"]);
    assert_eq!(daemon.run(&["wait", &older]).code, Some(3));
    let metrics = scrape_until(&api, "the throttled owner and the superseded one", |m| {
        [
            "taskhost_slot_throttled",
            "taskhost_slot_superseded",
            "taskhost_slot_throttled_now",
        ]
        .iter()
        .all(|name| m.0.get(*name).is_some_and(|f| !f.samples.is_empty()))
    });
    assert!(metrics.counter("taskhost_slot_throttled", &[("slot", "api")]) >= 1.0);
    assert_eq!(
        metrics.gauge("taskhost_slot_throttled_now", &[("slot", "api")]),
        1.0
    );
    assert_eq!(
        metrics.gauge("taskhost_slot_rate_budget", &[("slot", "api")]),
        0.0
    );
    assert_eq!(
        metrics.counter("taskhost_slot_superseded", &[("slot", "deb")]),
        1.0
    );
    assert_eq!(
        metrics.gauge("taskhost_tasks", &[("state", "throttled")]),
        1.0
    );
    let slots = api.get("/api/slots").json();
    let slot = slots
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "api")
        .unwrap_or_else(|| panic!("no slot api in {slots}"));
    assert!(
        slot["rate"].as_str().is_some_and(|r| r.starts_with("1/")),
        "{slot}"
    );
    assert_eq!(slot["capacity"], 2, "{slot}");
    for name in ["first", "second"] {
        assert_eq!(daemon.run(&["cancel", name]).code, Some(0));
    }
}

#[test]
fn a_non_loopback_bind_needs_a_token_and_no_flag_means_no_listener() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("h.sock");
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            dir.path().join("state").to_str().unwrap(),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::run_host(&args)
    };
    let out = serve(&["--http", "0.0.0.0:0"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("--http 0.0.0.0:0 is not a loopback address")
            && out.stderr.contains("--http-token-file FILE"),
        "{}",
        out.stderr
    );
    assert!(!socket.exists(), "refused before it listened");

    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = serve(&[
        "--http",
        "0.0.0.0:0",
        "--http-allow-plain",
        "--http-token-file",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("is empty"), "{}", out.stderr);

    // A non-loopback address with a token but neither TLS nor
    // --http-allow-plain: refused, naming both.
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "admin t0ken\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = serve(&[
        "--http",
        "0.0.0.0:0",
        "--http-token-file",
        tokens.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("has no TLS")
            && out.stderr.contains("--tls-cert")
            && out.stderr.contains("--http-allow-plain"),
        "{}",
        out.stderr
    );
    assert!(!socket.exists(), "refused before it listened");

    // The listener's settings are checked before anything starts too.
    for (flags, says) in [
        (
            &["--http", "127.0.0.1:0", "--http-allow-host", "evil/x"][..],
            "`evil/x` is not a host name",
        ),
        (
            &["--http", "127.0.0.1:0", "--http-max-streams", "0"][..],
            "--http-max-streams",
        ),
        (
            &["--http", "127.0.0.1:0", "--http-header-timeout", "1ms"][..],
            "at least 100ms",
        ),
    ] {
        let out = serve(flags);
        assert_eq!(out.code, Some(2), "{flags:?}: {out:?}");
        assert!(out.stderr.contains(says), "{flags:?}: {}", out.stderr);
        assert!(!socket.exists(), "refused before it listened");
    }

    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = serve(&["--http-token-file", token.to_str().unwrap()]);
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("--http (http) is not"),
        "{}",
        out.stderr
    );

    // Without --http the daemon opens no TCP socket at all.
    let daemon = Daemon::start(&[]);
    let seen = &daemon.process.as_ref().unwrap().stderr_seen;
    assert!(!seen.iter().any(|l| l.contains("HTTP")), "{seen:?}");
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap()
        + &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    for line in tcp.lines().skip(1) {
        let inode = line.split_whitespace().nth(9).unwrap_or("");
        assert!(
            !inodes.iter().any(|i| i == inode),
            "the daemon holds a TCP socket: {line}"
        );
    }

    // A non-loopback bind with a token starts.
    drop(daemon);
    let dir2 = tempfile::tempdir().unwrap();
    let mut args = vec![
        "serve".to_owned(),
        "--socket".to_owned(),
        dir2.path().join("h.sock").display().to_string(),
        "--state-dir".to_owned(),
        dir2.path().join("state").display().to_string(),
        "--http".to_owned(),
        "0.0.0.0:0".to_owned(),
        "--http-allow-plain".to_owned(),
        "--http-token-file".to_owned(),
        token.display().to_string(),
    ];
    let args: Vec<&str> = args.iter_mut().map(|s| s.as_str()).collect();
    let mut open = common::Running::spawn(&args);
    let line = open.wait_for_line("taskhost HTTP listening on http://0.0.0.0:", LIMIT);
    assert!(
        line.contains("every request but the dashboard page needs the token of --http-token-file"),
        "{line}"
    );
    open.wait_for_line("taskhost daemon listening on", LIMIT);
    let socket2 = dir2.path().join("h.sock");
    let out = common::run_host(&["shutdown", "--socket", socket2.to_str().unwrap()]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (status, out) = open.finish(LIMIT);
    assert!(status.success(), "{}", out.stderr);
}

#[test]
fn the_api_answers_as_the_cli_and_mutations_need_the_token() {
    // With --http-token-file on a loopback bind: the operator's token.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        token_file.to_str().unwrap(),
    ]);
    let port = http_port(&daemon);
    let api = Api {
        port,
        token: "s3cret-token".into(),
    };

    let done = daemon.submit(&[&p("hello"), "--name", "greet", "--input", "hi"]);
    let waited = daemon.run(&["wait", &done, "--json"]);
    let id = daemon.submit(&[
        &p("sleeper"),
        "--name",
        "nap",
        "--slot",
        "s",
        "--param",
        "ms=600000",
    ]);
    daemon.submit(&[&p("hello"), "--name", "after", "--slot", "s"]);
    daemon.wait_until_state("nap", "running");

    // The same rows as the CLI's --json (ages move, so they are left out).
    let strip = |mut v: Value, field: &str| {
        for row in v.as_array_mut().unwrap() {
            row.as_object_mut().unwrap().remove(field);
        }
        v
    };
    let cli_ps: Value = serde_json::from_str(&daemon.run(&["ps", "--json"]).stdout).unwrap();
    let api_ps = api.get("/api/tasks").json();
    let ps_without_progress = |v: Value| {
        let mut v = strip(v, "age_ms");
        for row in v.as_array_mut().unwrap() {
            row.as_object_mut().unwrap().remove("progress");
        }
        v
    };
    assert_eq!(ps_without_progress(api_ps), ps_without_progress(cli_ps));
    let cli_all: Value =
        serde_json::from_str(&daemon.run(&["ps", "--all", "--json"]).stdout).unwrap();
    let api_all = api.get("/api/tasks?all=true").json();
    assert_eq!(ps_without_progress(api_all), ps_without_progress(cli_all));
    let cli_slots: Value = serde_json::from_str(&daemon.run(&["slots", "--json"]).stdout).unwrap();
    let api_slots = api.get("/api/slots").json();
    assert_eq!(
        strip(api_slots, "in_state_ms"),
        strip(cli_slots, "in_state_ms")
    );
    // A finished task's page carries `host wait --json`'s object, and its log.
    let page = api.get(&format!("/api/tasks/{done}")).json();
    let cli_result: Value = serde_json::from_str(&waited.stdout).unwrap();
    assert_eq!(page["outcome"], cli_result);
    assert_eq!(page["name"], "greet");
    assert_eq!(page["attempts"][0]["attempt"], 1);
    assert!(
        page["log"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["text"] == "hello: got 2 bytes"),
        "{page}"
    );
    let live = api.get("/api/tasks/nap").json();
    assert_eq!(live["row"]["state"], "running");
    assert_eq!(live["outcome"], Value::Null);
    let missing = api.get("/api/tasks/404");
    assert_eq!(missing.status, 404);
    assert!(
        missing.json()["error"]
            .as_str()
            .unwrap()
            .contains("no task with id 404")
    );

    // Mutations: without the token, with a wrong one, without JSON, from a
    // foreign Host, from a foreign Origin; nothing is stopped by any of them.
    let json_type = ("Content-Type", "application/json");
    let cancel = format!("/api/tasks/{id}/cancel");
    let remove = format!("/api/tasks/{id}/remove");
    for path in [&cancel, &remove] {
        let answer = request(port, "POST", path, &[json_type], "{}");
        assert_eq!(answer.status, 401, "{answer:?}");
        assert_eq!(
            answer.headers.get("www-authenticate").map(String::as_str),
            Some("Bearer realm=\"taskhost\"")
        );
        assert!(
            answer.json()["error"]
                .as_str()
                .unwrap()
                .contains("Authorization: Bearer")
        );
        let wrong = request(
            port,
            "POST",
            path,
            &[json_type, ("Authorization", "Bearer s3cret-tokeX")],
            "{}",
        );
        assert_eq!(wrong.status, 401);
    }
    let bearer = ("Authorization", "Bearer s3cret-token");
    let form = request(
        port,
        "POST",
        &cancel,
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            bearer,
        ],
        "",
    );
    assert_eq!(form.status, 415, "{form:?}");
    let rebound = request(
        port,
        "POST",
        &cancel,
        &[json_type, bearer, ("Host", "evil.example:80")],
        "{}",
    );
    assert_eq!(rebound.status, 421, "{rebound:?}");
    let cross_site = request(
        port,
        "POST",
        &cancel,
        &[json_type, bearer, ("Origin", "http://evil.example")],
        "{}",
    );
    assert_eq!(cross_site.status, 403, "{cross_site:?}");
    assert_eq!(api.get("/metrics").status, 200);
    assert_eq!(api.get(&cancel).status, 405);
    daemon.wait_until_state("nap", "running");

    // With the token: cancel waits for the end, as `host cancel --json`.
    let answer = request(port, "POST", &cancel, &[json_type, bearer], "{}");
    assert_eq!(answer.status, 200, "{answer:?}");
    let body = answer.json();
    assert_eq!(body["claimed"], true, "{body}");
    assert_eq!(body["report"]["outcome"], "canceled", "{body}");
    let again = request(port, "POST", &remove, &[json_type, bearer], "{}").json();
    assert_eq!(again, json!({ "claimed": false, "report": null }));
    let out = daemon.run(&["wait", "after", "--json"]);
    assert_eq!(
        out.code,
        Some(0),
        "the queued one ran after the cancel: {}",
        out.stderr
    );
}

// ---------------------------------------------------------------------------
// Headless Chromium over the DevTools protocol.

/// Where screenshots go: `target/test-artifacts/`.
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Chromium {
    child: Child,
    _profile: tempfile::TempDir,
    port: u16,
}

impl Chromium {
    fn launch() -> Self {
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|b| Path::new(b).exists())
            .unwrap_or_else(|| {
                panic!(
                    "Chromium is not installed (/usr/bin/chromium): install the Debian package \
                     `chromium` (apt-get install -y chromium; .ci/run does it)"
                )
            });
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1280,900",
                &format!("--user-data-dir={}", profile.path().display()),
                "--remote-debugging-port=0",
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Keep draining so Chromium never blocks on a full pipe.
                    continue;
                }
            }
        });
        let deadline = Instant::now() + LIMIT;
        let mut seen = Vec::new();
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.split("DevTools listening on ").nth(1) {
                        let port = url
                            .strip_prefix("ws://")
                            .and_then(|r| r.split('/').next())
                            .and_then(|a| a.rsplit(':').next())
                            .and_then(|p| p.parse().ok())
                            .unwrap_or_else(|| panic!("no port in {line:?}"));
                        break port;
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "Chromium did not start its DevTools endpoint within {LIMIT:?}: {seen:?}"
                    );
                }
            }
        };
        Self {
            child,
            _profile: profile,
            port,
        }
    }

    /// A DevTools session on the browser's first page.
    /// A page with its events on, at `url` once it has loaded.
    fn open(&self, url: &str) -> Cdp {
        let mut page = self.page();
        page.call("Page.enable", json!({}));
        page.call("Runtime.enable", json!({}));
        page.call("Page.navigate", json!({ "url": url }));
        page.wait_event("Page.loadEventFired");
        page
    }

    fn page(&self) -> Cdp {
        let deadline = Instant::now() + LIMIT;
        let url = loop {
            let targets = get(self.port, "/json/list");
            let list: Value = serde_json::from_str(&targets.body).unwrap_or(Value::Null);
            if let Some(url) = list.as_array().and_then(|l| {
                l.iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_owned))
            }) {
                break url;
            }
            assert!(
                Instant::now() < deadline,
                "Chromium has no page: {}",
                targets.body
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let (mut socket, _) = tungstenite::connect(url.as_str()).expect("connect to DevTools");
        if let tungstenite::stream::MaybeTlsStream::Plain(stream) = socket.get_mut() {
            stream.set_read_timeout(Some(LIMIT)).unwrap();
        }
        Cdp {
            socket,
            next_id: 0,
            events: Vec::new(),
        }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A DevTools protocol session: commands by id, events kept in order.
struct Cdp {
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
    events: Vec<Value>,
}

impl Cdp {
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({ "id": id, "method": method, "params": params });
        self.socket
            .send(tungstenite::Message::text(message.to_string()))
            .expect("send a DevTools command");
        loop {
            let reply = self.read();
            if reply["id"] == id {
                if let Some(error) = reply.get("error") {
                    panic!("{method} failed: {error}");
                }
                return reply["result"].clone();
            }
            self.events.push(reply);
        }
    }

    fn read(&mut self) -> Value {
        loop {
            match self.socket.read().expect("read from DevTools") {
                tungstenite::Message::Text(text) => {
                    return serde_json::from_str(text.as_str()).expect("DevTools sends JSON");
                }
                tungstenite::Message::Close(_) => panic!("DevTools closed the session"),
                _ => {}
            }
        }
    }

    /// Waits for an event of this method (one seen before included).
    fn wait_event(&mut self, method: &str) -> Value {
        if let Some(i) = self.events.iter().position(|e| e["method"] == method) {
            return self.events.remove(i);
        }
        loop {
            let event = self.read();
            if event["method"] == method {
                return event;
            }
            self.events.push(event);
        }
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("{expression} threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is truthy; returns its value.
    fn wait_for(&mut self, what: &str, expression: &str) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let value = self.eval(expression);
            if !(value.is_null() || value == false || value == "") {
                return value;
            }
            if Instant::now() > deadline {
                let page = self.eval("document.body.innerText");
                panic!("the page never showed {what}; it shows:\n{page}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A real mouse click (pressed and released) on the element's centre.
    fn click(&mut self, selector: &str) {
        self.click_across(selector, None);
    }

    /// A real mouse click whose press and release have `between` evaluated
    /// (and awaited) between them, as a page's own work may run there.
    fn click_across(&mut self, selector: &str, between: Option<&str>) {
        let rect = self.wait_for(
            selector,
            &format!(
                "(() => {{ const e = document.querySelector({selector:?}); if (!e) return null;
                   e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
                   return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ),
        );
        let (x, y) = (rect[0].as_f64().unwrap(), rect[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
            if let (Some(between), "mousePressed") = (between, kind) {
                self.eval(between);
            }
        }
    }

    fn screenshot(&mut self, name: &str) -> PathBuf {
        use base64::Engine as _;
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("base64 PNG");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = artifacts().join(name);
        std::fs::write(&path, png).unwrap();
        path
    }
}

#[test]
fn the_dashboard_asks_for_an_operator_token_once_and_reruns_a_failed_task_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "read viewer-token\nsubmit ci-token\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        tokens.to_str().unwrap(),
    ]);
    let port = http_port(&daemon);
    let out = daemon.run(&[
        "submit",
        &p("flaky"),
        "--name",
        "shaky",
        "--param",
        "fail_times=9",
        "--wait",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    let failed_id = daemon.ps_all_ids();

    let browser = Chromium::launch();
    let mut page = browser.open(&format!("http://127.0.0.1:{port}/"));
    // Asked once; kept for the tab.
    page.wait_for(
        "the token prompt",
        "document.querySelector('#token-form').style.display === 'inline'",
    );
    page.click("#token-input");
    page.call("Input.insertText", json!({ "text": "ci-token" }));
    page.click("#token-save");
    let row = format!("#failed tr[data-task-id=\"{}\"]", failed_id[0]);
    page.wait_for(
        "the failed view",
        &format!("(() => {{ const r = document.querySelector('{row}'); return r && r.innerText.includes('shaky') && r.innerText.includes('failed'); }})()"),
    );
    assert_eq!(
        page.eval("sessionStorage.getItem('taskhost-token')"),
        json!("ci-token")
    );
    page.click(&format!("{row} button[data-action=\"rerun\"]"));
    // The page goes to the new task, which runs the same request.
    let title = page.wait_for(
        "the new task's page",
        &format!("(() => {{ const t = document.querySelector('#task-title').innerText; return location.hash.startsWith('#/task/') && location.hash !== '#/task/{}' && t.includes('shaky') && t; }})()", failed_id[0]),
    );
    let new_id: String = title
        .as_str()
        .unwrap()
        .rsplit("task ")
        .next()
        .unwrap()
        .trim_end_matches(')')
        .to_owned();
    let waited = daemon.run(&["wait", &new_id, "--json"]);
    assert_eq!(waited.code, Some(1), "{waited:?}");
    let result: Value = serde_json::from_str(&waited.stdout).unwrap();
    assert_eq!(result["name"], "shaky");
    // The page's own task view offers the rerun too, once it has ended.
    page.wait_for(
        "the rerun button on the task page",
        "document.querySelector('#task-actions button[data-action=\"rerun\"]') !== null",
    );
    assert_eq!(daemon.ps_all_ids().len(), 2, "one rerun");
}

#[test]
fn the_dashboard_pages_the_failed_view_and_reruns_every_failed_task_in_chromium() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let url = dashboard_url(&daemon);
    // 17 failed tasks (one attempt each) and one that completed.
    for i in 0..17 {
        let name = format!("shaky-{i:02}");
        let out = daemon.run(&[
            "submit",
            &p("flaky"),
            "--name",
            &name,
            "--param",
            "fail_times=9",
            "--wait",
        ]);
        assert_eq!(out.code, Some(1), "{out:?}");
    }
    let out = daemon.run(&["submit", &p("hello"), "--input", "fine", "--wait"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let browser = Chromium::launch();
    let mut page = browser.open(&url);
    let rows = "document.querySelectorAll('#failed tbody tr[data-task-id]')";
    // The newest 15, then the 2 older ones, then the newest again.
    page.wait_for(
        "the newest page of failed tasks",
        &format!("{rows}.length === 15 && {rows}[0].innerText.includes('shaky-16') && !document.querySelector('#failed-older').disabled"),
    );
    // Each with the command that replays its last attempt from its record.
    let newest = daemon.ps_all_ids()[1];
    page.wait_for(
        "the replay command of a failed task",
        &format!("{rows}[0].querySelector('code.replay').innerText === 'host replay {newest} --attempt 1'"),
    );
    page.click("#failed-older");
    page.wait_for(
        "the older page",
        &format!("{rows}.length === 2 && {rows}[1].innerText.includes('shaky-00') && document.querySelector('#failed-older').disabled"),
    );
    page.click("#failed-newer");
    page.wait_for(
        "the newest page again",
        &format!("{rows}.length === 15 && {rows}[0].innerText.includes('shaky-16')"),
    );
    // Rerun all: the first click counts, the second submits each once.
    page.click("#failed-rerun-all");
    page.wait_for(
        "the count of every failed task",
        "document.querySelector('#failed-rerun-all').innerText === 'Rerun 17 tasks'",
    );
    assert_eq!(daemon.ps_all_ids().len(), 18, "a count submits nothing");
    page.click("#failed-rerun-all");
    page.wait_for(
        "the notice of the rerun",
        "document.body.innerText.includes('17 failed tasks submitted again')",
    );
    assert_eq!(daemon.ps_all_ids().len(), 35, "each failed task once more");
}

#[test]
fn the_dashboard_shows_a_running_task_and_cancels_it_in_chromium() {
    // No token file: the daemon's own token, in the URL it logs.
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let port = http_port(&daemon);
    let api = Api::of(&daemon);
    let url = dashboard_url(&daemon);
    // Something finished, something queued, and a sleeper reporting
    // progress every 200 ms for ten minutes.
    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--name",
        "greet",
        "--input",
        "hi",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0));
    // A finished task whose output (guest-written) holds control
    // characters and a right-to-left override.
    let odd = daemon.submit(&[
        &p("hello"),
        "--name",
        "odd",
        "--input",
        "bell\u{7}esc\u{1b}[31mred\u{9b}c1\u{202e}rtl\ttab",
    ]);
    assert_eq!(daemon.run(&["wait", &odd]).code, Some(0));
    // A rate on the sleeper's slot that never binds: the slot view shows it.
    let out = daemon.run(&["slot", "set", "deploy/*", "--rate", "100/s", "--burst", "5"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let id = daemon.submit(&[
        &p("sleeper"),
        "--name",
        "nap",
        "--slot",
        "deploy/prod",
        "--param",
        "ms=600000",
        "--param",
        "step_ms=200",
    ]);
    daemon.submit(&[&p("hello"), "--name", "after-nap", "--slot", "deploy/prod"]);
    daemon.wait_until_state("nap", "running");

    let browser = Chromium::launch();
    let mut page = browser.page();
    page.call("Page.enable", json!({}));
    page.call("Runtime.enable", json!({}));
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
    );
    let open = |page: &mut Cdp, url: &str| {
        page.call("Page.navigate", json!({ "url": url }));
        page.wait_event("Page.loadEventFired");
    };
    let prompt = "document.querySelector('#notice').classList.contains('shown') && document.querySelector('#token-form').style.display === 'inline'";

    // Without the token the page shows no data and asks for it.
    open(&mut page, &format!("http://127.0.0.1:{port}/"));
    page.wait_for(
        "the token prompt",
        &format!("{prompt} && document.querySelector('#notice-text').innerText.includes(\"needs the daemon's token\")"),
    );
    assert_eq!(
        page.eval("document.querySelectorAll('#tasks tr[data-task-id], #outcomes tr[data-task-id]').length"),
        json!(0)
    );
    // A wrong one typed in is refused.
    page.click("#token-input");
    page.call("Input.insertText", json!({ "text": "not-the-token" }));
    page.click("#token-save");
    page.wait_for(
        "the refusal",
        &format!("{prompt} && document.querySelector('#notice-text').innerText.includes('refused this token')"),
    );

    // The logged URL: the page keeps the token from its fragment for the
    // tab and takes it out of the address bar.
    page.eval("sessionStorage.clear()");
    open(&mut page, "about:blank");
    open(&mut page, &url);
    let row = format!("#tasks tr[data-task-id=\"{id}\"]");
    page.wait_for("the running sleeper", &format!(
        "(() => {{ const r = document.querySelector('{row}'); return r && r.innerText.includes('nap') && r.innerText.includes('running'); }})()"
    ));
    assert_eq!(
        page.eval("location.href"),
        json!(format!("http://127.0.0.1:{port}/"))
    );
    assert_eq!(
        page.eval("sessionStorage.getItem('taskhost-token')"),
        json!(api.token)
    );
    page.wait_for("the live event stream", "document.querySelector('#status').className === 'live' && document.querySelectorAll('#events li').length > 0");
    page.wait_for("the slot with its owner and queue", &format!(
        "[...document.querySelectorAll('#slots tbody tr')].some(r => r.innerText.includes('deploy/prod') && r.innerText.includes('{id}') && r.children[3].innerText === '1' && r.children[6].innerText.startsWith('100/') && r.children[6].innerText.endsWith('+5'))"
    ));
    page.wait_for("the finished hello", "[...document.querySelectorAll('#outcomes tbody tr')].some(r => r.innerText.includes('greet') && r.innerText.includes('completed'))");
    // Progress moves: read it, then wait until it reads further.
    let progress = |page: &mut Cdp| -> u64 {
        let text = page.wait_for("progress", &format!(
            "(() => {{ const p = document.querySelector('{row} .progress'); return p && p.innerText; }})()"
        ));
        let text = text.as_str().unwrap().to_owned();
        text.split('/')
            .next()
            .and_then(|d| d.trim().parse().ok())
            .unwrap_or_else(|| panic!("progress reads {text:?}"))
    };
    let first = progress(&mut page);
    let deadline = Instant::now() + LIMIT;
    let later = loop {
        let now = progress(&mut page);
        if now > first {
            break now;
        }
        assert!(Instant::now() < deadline, "progress stayed at {first}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(later > first);
    page.wait_for(
        "the progress bar",
        &format!("document.querySelector('{row} .bar > span').style.width !== ''"),
    );
    let shot = page.screenshot("dashboard.png");
    eprintln!("screenshot: {}", shot.display());

    // Cancel, with the token the page holds; the page refreshes its tables
    // (as it does every two seconds) between the press and the release.
    page.click_across(
        &format!("{row} button[data-action=\"cancel\"]"),
        Some("refreshOverview().then(() => true)"),
    );
    page.wait_for("the canceled outcome", &format!(
        "[...document.querySelectorAll('#outcomes tbody tr')].some(r => r.dataset.taskId === '{id}' && r.innerText.includes('canceled'))"
    ));
    let out = daemon.run(&["wait", &id, "--json"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["outcome"], "canceled");
    assert_eq!(
        api.get(&format!("/api/tasks/{id}")).json()["outcome"]["outcome"],
        "canceled"
    );
    page.wait_for("the queued one completed", "[...document.querySelectorAll('#outcomes tbody tr')].some(r => r.innerText.includes('after-nap') && r.innerText.includes('completed'))");
    assert_eq!(
        page.eval("document.querySelector('#notice').classList.contains('shown')"),
        json!(false)
    );

    // A tab without the token: the right one typed in is used.
    page.eval("sessionStorage.clear()");
    open(&mut page, "about:blank");
    open(&mut page, &format!("http://127.0.0.1:{port}/"));
    page.wait_for("the token prompt again", prompt);
    page.click("#token-input");
    page.call("Input.insertText", json!({ "text": api.token }));
    page.click("#token-save");
    page.wait_for("the outcomes with the typed token", &format!(
        "!document.querySelector('#notice').classList.contains('shown') && document.querySelector('#status').className === 'live' && [...document.querySelectorAll('#outcomes tbody tr')].some(r => r.dataset.taskId === '{id}' && r.innerText.includes('canceled'))"
    ));

    // The task page: its outcome, attempts, log and events.
    page.call(
        "Page.navigate",
        json!({ "url": format!("http://127.0.0.1:{port}/#/task/{id}") }),
    );
    page.wait_for("the task page", "document.querySelector('#task-outcome') && document.querySelector('#task-outcome').innerText === 'canceled'");
    page.wait_for(
        "its attempt",
        "document.querySelector('#attempts tbody').innerText.includes('1')",
    );
    page.wait_for("its events", "[...document.querySelectorAll('#events li')].some(li => li.dataset.kind === 'TaskFinished')");
    let shot = page.screenshot("dashboard-task.png");
    eprintln!("screenshot: {}", shot.display());

    // Guest-written control characters are shown as escapes (tab kept).
    page.call(
        "Page.navigate",
        json!({ "url": format!("http://127.0.0.1:{port}/#/task/{odd}") }),
    );
    let output = page.wait_for(
        "the odd output",
        r#"(() => { const d = document.querySelector('#task-facts dd[data-fact="output"]'); return d && d.textContent; })()"#,
    );
    assert_eq!(
        output,
        json!("bell\\x07esc\\x1b[31mred\\u{9b}c1\\u{202e}rtl\ttab")
    );
    let title = page.eval("document.querySelector('#task-title').textContent");
    assert_eq!(title, json!(format!("odd (task {odd})")));
}

/// The answer's body of a stream whose head was read (by its length).
fn stream_body(stream: &mut http::Stream) -> Value {
    use std::io::Read;
    let length: usize = stream
        .headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("no length in {:?}", stream.headers));
    let mut body = vec![0; length];
    stream.reader.read_exact(&mut body).expect("read the body");
    serde_json::from_slice(&body).expect("a JSON body")
}

/// Asserts a 401 that names the bearer scheme.
fn assert_unauthorized(answer: &http::Answer, what: &str) {
    assert_eq!(answer.status, 401, "{what}: {answer:?}");
    assert_eq!(
        answer.headers.get("www-authenticate").map(String::as_str),
        Some("Bearer realm=\"taskhost\""),
        "{what}"
    );
    assert!(
        answer.json()["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"),
        "{what}: {answer:?}"
    );
}

#[test]
fn every_endpoint_but_the_page_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "read-token-7\n").unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        token_file.to_str().unwrap(),
    ]);
    let api = Api {
        port: http_port(&daemon),
        token: "read-token-7".into(),
    };
    let done = daemon.submit(&[&p("hello"), "--name", "greet", "--input", "private"]);
    assert_eq!(daemon.run(&["wait", &done]).code, Some(0));

    for path in [
        "/api/tasks".to_owned(),
        "/api/tasks?all=true".to_owned(),
        format!("/api/tasks/{done}"),
        "/api/slots".to_owned(),
        "/metrics".to_owned(),
    ] {
        assert_unauthorized(&get(api.port, &path), &format!("{path} without a token"));
        for wrong in [
            "Bearer read-token-8",
            "Bearer read-token-77",
            "Basic read-token-7",
        ] {
            let answer = request(api.port, "GET", &path, &[("Authorization", wrong)], "");
            assert_unauthorized(&answer, &format!("{path} with {wrong}"));
        }
        let answer = api.get(&path);
        assert_eq!(answer.status, 200, "{path} with the token: {answer:?}");
    }
    // What a stranger got told nothing of the task.
    let stranger = get(api.port, &format!("/api/tasks/{done}"));
    assert!(!stranger.body.contains("private") && !stranger.body.contains("greet"));
    assert_eq!(
        api.get(&format!("/api/tasks/{done}")).json()["outcome"]["output"],
        "private"
    );

    // The event stream: 401 without, the history with the token.
    let mut refused = open_stream(api.port, "/api/events", &[]);
    assert_eq!(refused.status, 401);
    assert!(refused.headers.contains_key("www-authenticate"));
    let body = stream_body(&mut refused);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer")
    );
    let bearer = api.bearer();
    let mut events = open_stream(
        api.port,
        &format!("/api/events?task={done}"),
        &[("Authorization", &bearer)],
    );
    assert_eq!(events.status, 200);
    assert_eq!(
        events.headers.get("content-type").map(String::as_str),
        Some("text/event-stream")
    );
    loop {
        if events.line().contains("TaskFinished") {
            break;
        }
    }

    // The page itself is static: no token needed, and it sends none away.
    let page = get(api.port, "/");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<title>taskhost</title>"));
    assert_eq!(
        page.headers.get("referrer-policy").map(String::as_str),
        Some("no-referrer")
    );
}

#[test]
fn a_loopback_listener_without_a_token_file_makes_its_own_token() {
    use std::os::unix::fs::PermissionsExt;

    let mut daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let port = http_port(&daemon);
    let path = daemon.dir.path().join("state").join("http-token");
    let seen = &daemon.process.as_ref().unwrap().stderr_seen;
    let listening = seen
        .iter()
        .find(|l| l.contains("taskhost HTTP listening on"))
        .unwrap();
    assert!(
        listening.contains(&format!(
            "every request but the dashboard page needs the token in {}",
            path.display()
        )),
        "{listening}"
    );
    // Owner-only, 32 random bytes in hex, and the logged URL carries it in
    // its fragment.
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", path.display());
    let token = own_token(&daemon);
    assert_eq!(token.len(), 64, "{token}");
    assert!(token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    assert_eq!(
        dashboard_url(&daemon),
        format!("http://127.0.0.1:{port}/#token={token}")
    );

    let id = daemon.submit(&[&p("sleeper"), "--name", "nap", "--param", "ms=600000"]);
    daemon.wait_until_state("nap", "running");
    // No longer open to local users: reads and stops need the token.
    for path in [
        "/api/tasks".to_owned(),
        format!("/api/tasks/{id}"),
        "/api/slots".to_owned(),
        "/metrics".to_owned(),
    ] {
        assert_unauthorized(&get(port, &path), &path);
    }
    assert_eq!(open_stream(port, "/api/events", &[]).status, 401);
    let json_type = ("Content-Type", "application/json");
    for verb in ["cancel", "remove"] {
        let answer = request(
            port,
            "POST",
            &format!("/api/tasks/{id}/{verb}"),
            &[json_type],
            "{}",
        );
        assert_unauthorized(&answer, verb);
    }
    daemon.wait_until_state("nap", "running");

    // With the token from the file: the task is listed and stopped.
    let api = Api::of(&daemon);
    let rows = api.get("/api/tasks").json();
    assert!(
        rows.as_array().unwrap().iter().any(|r| r["name"] == "nap"),
        "{rows}"
    );
    // Still only JSON POSTs: a form (which always names its type, even
    // empty) cannot stop it; a POST with neither a body nor a type can.
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    let form = api.request("POST", &format!("/api/tasks/{id}/remove"), &[form_type], "");
    assert_eq!(form.status, 415, "{form:?}");
    let typed = api.request("POST", &format!("/api/tasks/{id}/remove"), &[], "x");
    assert_eq!(typed.status, 415, "a body without a type: {typed:?}");
    let answer = api.request("POST", &format!("/api/tasks/{id}/remove"), &[], "");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json(), json!({ "claimed": true, "report": null }));
    let out = daemon.run(&["wait", &id, "--json"]);
    assert_eq!(out.code, Some(4), "{}", out.stderr);

    // A later start reuses it.
    assert_eq!(daemon.run(&["shutdown"]).code, Some(0));
    let (status, _) = daemon.process.take().unwrap().finish(LIMIT);
    assert!(status.success());
    daemon.restart(&["--http", "127.0.0.1:0"]);
    assert_eq!(own_token(&daemon), token, "the same token");
    let again = Api::of(&daemon);
    assert_ne!(again.port, 0);
    assert!(dashboard_url(&daemon).ends_with(&format!("/#token={token}")));
    assert_eq!(again.get("/api/tasks?all=true").status, 200);

    // One that other users could read is refused, with the fix.
    assert_eq!(daemon.run(&["shutdown"]).code, Some(0));
    let (status, _) = daemon.process.take().unwrap().finish(LIMIT);
    assert!(status.success());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = common::run_host(&[
        "serve",
        "--socket",
        daemon.socket(),
        "--state-dir",
        daemon.dir.path().join("state").to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("is open to other users (mode 644")
            && out
                .stderr
                .contains(&format!("chmod 600 {}", path.display())),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(&token), "the token is not shown");
}

#[test]
fn a_non_loopback_listener_answers_only_its_hosts_and_its_own_origin() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "lan-token\n").unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let daemon = Daemon::start(&[
        "--http",
        "0.0.0.0:0",
        "--http-allow-plain",
        "--http-token-file",
        token_file.to_str().unwrap(),
        "--http-allow-host",
        "dash.example",
        "--http-allow-host",
        "proxy.example:8443",
    ]);
    let api = Api {
        port: http_port(&daemon),
        token: "lan-token".into(),
    };
    let port = api.port;
    let as_host = |host: &str, origin: Option<&str>| {
        let mut headers = vec![("Host", host)];
        headers.extend(origin.map(|o| ("Origin", o)));
        api.request("GET", "/api/tasks", &headers, "")
    };
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned();
    let mut answered = vec![
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("10.1.2.3:{port}"),
        format!("localhost:{port}"),
        "dash.example".to_owned(),
        format!("dash.example:{port}"),
        "DASH.example".to_owned(),
        "proxy.example:8443".to_owned(),
    ];
    if !hostname.is_empty() {
        answered.push(hostname.clone());
        answered.push(format!("{hostname}:{port}"));
    }
    for host in &answered {
        let answer = as_host(host, None);
        assert_eq!(answer.status, 200, "Host {host}: {answer:?}");
    }
    for host in [
        "evil.example".to_owned(),
        format!("evil.example:{port}"),
        "dash.example:1".to_owned(),
        "proxy.example".to_owned(),
        format!("proxy.example:{port}"),
        "127.0.0.1:1".to_owned(),
        "10.1.2.3".to_owned(),
        format!("{hostname}:1"),
        String::new(),
    ] {
        let answer = as_host(&host, None);
        assert_eq!(answer.status, 421, "Host {host:?}: {answer:?}");
        assert!(
            answer.json()["error"]
                .as_str()
                .unwrap()
                .contains("does not answer to Host"),
            "{answer:?}"
        );
    }
    // Without the token a foreign Host is refused as such too.
    assert_eq!(get(port, "/api/tasks").status, 401);
    let foreign = request(port, "GET", "/api/tasks", &[("Host", "evil.example")], "");
    assert_eq!(foreign.status, 421);

    // An Origin must be the page's own.
    let own = format!("127.0.0.1:{port}");
    for (host, origin) in [
        (own.as_str(), format!("http://{own}")),
        ("dash.example", "http://dash.example".to_owned()),
        ("dash.example", "https://dash.example".to_owned()),
    ] {
        let answer = as_host(host, Some(&origin));
        assert_eq!(answer.status, 200, "{host} from {origin}: {answer:?}");
    }
    for (host, origin) in [
        (own.as_str(), "http://evil.example".to_owned()),
        (own.as_str(), "null".to_owned()),
        (own.as_str(), format!("http://localhost:{port}")),
        (
            own.as_str(),
            format!("http://127.0.0.1:{}", port.wrapping_add(1)),
        ),
        (
            "dash.example",
            "http://dash.example.evil.example".to_owned(),
        ),
    ] {
        let answer = as_host(host, Some(&origin));
        assert_eq!(answer.status, 403, "{host} from {origin}: {answer:?}");
    }
    // A cross-site POST stops nothing, even with the token.
    let id = daemon.submit(&[&p("sleeper"), "--name", "nap", "--param", "ms=600000"]);
    daemon.wait_until_state("nap", "running");
    let cancel = format!("/api/tasks/{id}/cancel");
    let json_type = ("Content-Type", "application/json");
    let answer = api.request(
        "POST",
        &cancel,
        &[json_type, ("Origin", "http://evil.example")],
        "{}",
    );
    assert_eq!(answer.status, 403, "{answer:?}");
    daemon.wait_until_state("nap", "running");
    let origin = format!("http://127.0.0.1:{port}");
    let answer = api.request("POST", &cancel, &[json_type, ("Origin", &origin)], "{}");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["report"]["outcome"], "canceled");
}

/// Reads until the server closes the connection; returns what it sent and
/// the time from `started` until then. Panics if it is still open after
/// `LIMIT`.
fn read_until_closed(stream: &mut TcpStream, started: Instant) -> (Vec<u8>, Duration) {
    use std::io::Read;
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (got, started.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (got, started.elapsed());
            }
            Err(e) => panic!(
                "the listener kept the connection open ({e} after {:?}; got {} bytes: {:?})",
                started.elapsed(),
                got.len(),
                String::from_utf8_lossy(&got[..got.len().min(300)])
            ),
        }
    }
}

#[test]
fn a_client_slow_to_send_its_header_is_disconnected_at_the_header_timeout() {
    use std::io::{Read, Write};

    let daemon = Daemon::start(&["--http", "127.0.0.1:0", "--http-header-timeout", "1s"]);
    let api = Api::of(&daemon);
    // Half a header, then nothing. (The server's clock starts after
    // `started`, so nothing is closed before `started` + 1 s.)
    let started = Instant::now();
    let mut slow = TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    write!(
        slow,
        "GET /api/tasks HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n",
        api.port
    )
    .unwrap();
    let (got, took) = read_until_closed(&mut slow, started);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(10),
        "closed after {took:?}"
    );
    assert!(
        !String::from_utf8_lossy(&got).contains(" 200 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    // Silence from the start is a slow header too.
    let started = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    let (_, took) = read_until_closed(&mut silent, started);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(10),
        "closed after {took:?}"
    );

    // A keep-alive connection idle after its answer is closed alike.
    let mut idle = TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    idle.set_read_timeout(Some(LIMIT)).unwrap();
    let started = Instant::now();
    write!(
        idle,
        "GET /api/tasks HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: {}\r\n\r\n",
        api.port,
        api.bearer()
    )
    .unwrap();
    let mut reader = BufReader::new(idle.try_clone().unwrap());
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    assert_eq!(&body, b"[]");
    assert!(reader.buffer().is_empty());
    let (_, took) = read_until_closed(&mut idle, started);
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(10),
        "closed after {took:?}"
    );
    // The listener still serves.
    assert_eq!(api.get("/api/tasks").status, 200);
}

/// One request on a fresh connection; `None` if the listener closes it
/// without an answer.
fn try_get(api: &Api, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", api.port)).ok()?;
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
        api.port,
        api.bearer()
    )
    .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A connection to the listener, holding its place until dropped.
fn connect(api: &Api) -> TcpStream {
    TcpStream::connect(("127.0.0.1", api.port)).expect("connect to the HTTP listener")
}

/// `GET path` with the token on a connection already open
/// (`Connection: close`); the whole answer.
fn get_on(stream: &mut TcpStream, api: &Api, path: &str) -> String {
    use std::io::Write;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
        api.port,
        api.bearer()
    )
    .expect("send a request");
    let (answer, _) = read_until_closed(stream, Instant::now());
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether the listener has closed this connection (without waiting).
fn closed_by_peer(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let closed = match stream.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Err(e) => panic!("peek: {e}"),
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

#[test]
fn at_the_connection_cap_the_longest_idle_connection_makes_room() {
    let mut daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-max-connections",
        "4",
        "--http-header-timeout",
        "5m",
    ]);
    let api = Api::of(&daemon);
    let bearer = api.bearer();
    let auth = [("Authorization", bearer.as_str())];
    // An event stream is served for as long as it is open; three idle
    // connections take the other places (accepted in order).
    let mut events = open_stream(api.port, "/api/events", &auth);
    assert_eq!(events.status, 200);
    let mut oldest: Vec<TcpStream> = (0..3).map(|_| connect(&api)).collect();
    // Each of 20 more takes the place of the one idle the longest.
    let burst = Instant::now();
    let mut newest: Vec<TcpStream> = (0..20).map(|_| connect(&api)).collect();
    oldest.extend(newest.drain(..17));
    for (i, mut closed) in oldest.into_iter().enumerate() {
        let (got, _) = read_until_closed(&mut closed, Instant::now());
        assert!(got.is_empty(), "idle connection {i} got {got:?}");
    }
    // The three newest are open and served.
    for mut kept in newest {
        let answer = get_on(&mut kept, &api, "/api/tasks");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let burst = burst.elapsed();
    // The daemon's socket is not starved of descriptors or workers.
    let ps = daemon.run(&["ps"]);
    assert_eq!(ps.code, Some(0), "{}", ps.stderr);
    // The stream, serving all along, was never closed: it carries the
    // end of a task run now.
    let hello = daemon.run(&["submit", &p("hello"), "--input", "x", "--wait"]);
    assert_eq!(hello.code, Some(0), "{}", hello.stderr);
    while !events.line().contains("TaskFinished") {}

    // With every place serving, a new connection is closed at once.
    let more: Vec<http::Stream> = (0..3)
        .map(|_| open_stream(api.port, "/api/events", &auth))
        .collect();
    assert!(more.iter().all(|s| s.status == 200));
    let mut extra = connect(&api);
    let (got, _) = read_until_closed(&mut extra, Instant::now());
    assert!(got.is_empty(), "the extra connection got {got:?}");
    // A stream's place is free again once its reader closes it.
    drop(more);
    let deadline = Instant::now() + LIMIT;
    loop {
        match try_get(&api, "/api/tasks") {
            Some(status) => {
                assert_eq!(status, 200);
                break;
            }
            None => assert!(Instant::now() < deadline, "no place freed"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(events);

    // Both were logged, at most once a second each.
    assert_eq!(daemon.run(&["shutdown"]).code, Some(0));
    let (status, out) = daemon.process.take().unwrap().finish(LIMIT);
    assert!(status.success(), "{}", out.stderr);
    let made_room: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("HTTP connection closed to make room"))
        .collect();
    assert!(!made_room.is_empty(), "{}", out.stderr);
    assert!(
        made_room.len() as u64 <= burst.as_secs() + 1,
        "{} warnings in {burst:?}: {made_room:?}",
        made_room.len()
    );
    assert!(
        made_room[0].contains("4 are open, the most --http-max-connections")
            && made_room[0].contains("idle the longest"),
        "{}",
        made_room[0]
    );
    let refused: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("HTTP connection refused"))
        .collect();
    assert!(
        !refused.is_empty() && refused[0].contains("each is serving a request"),
        "{}",
        out.stderr
    );
}

/// A client that pipelines requests without the token and never reads
/// the answers keeps them under way for good (hyper stops writing at a
/// full buffer); such connections are idle all the same and make room.
#[test]
fn connections_not_reading_answers_to_requests_without_the_token_make_room() {
    use std::io::Write;
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-max-connections",
        "4",
        "--http-header-timeout",
        "5m",
    ]);
    let api = Api::of(&daemon);
    // The dashboard page needs no token: 100 requests for it at a time,
    // until the socket takes no more (far more answers than the buffers
    // between the listener and this test hold: they will stay under way).
    let pages = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", api.port).repeat(100);
    let stuck: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = connect(&api);
            stream.set_nonblocking(true).unwrap();
            loop {
                match stream.write(pages.as_bytes()) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("pipelining: {e}"),
                }
            }
            stream.set_nonblocking(false).unwrap();
            stream
        })
        .collect();
    // A client with the token takes the place of the oldest (their
    // requests never changed their turn), which is closed.
    let answer = api.get("/api/tasks");
    assert_eq!(answer.status, 200, "{answer:?}");
    let mut oldest = stuck.into_iter().next().unwrap();
    let (got, _) = read_until_closed(&mut oldest, Instant::now());
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"),
        "the dashboard was answered until then"
    );
}

/// Issue 49: 600 connections that never send a byte, from the address the
/// client uses too, do not lock a client with the token out: each new one
/// takes the place of the one idle the longest, which is closed.
#[test]
fn six_hundred_idle_connections_do_not_lock_a_client_out() {
    const FLOOD: usize = 600;
    // `DEFAULT_HTTP_MAX_CONNECTIONS`.
    const PLACES: usize = 64;
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = Api::of(&daemon);
    let baseline = daemon.socket_fds();
    let started = Instant::now();
    let flood: Vec<TcpStream> = (0..FLOOD).map(|_| connect(&api)).collect();
    let flooded = started.elapsed();
    let asked = Instant::now();
    let answer = api.get("/api/tasks");
    let took = asked.elapsed();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, "[]");
    assert!(
        took < Duration::from_secs(1),
        "answered after {took:?} (the flood took {flooded:?})"
    );
    // The daemon holds no more than its places: the ones it closed to
    // make room are closed, the oldest first.
    let held = daemon.socket_fds().saturating_sub(baseline);
    assert!(held <= PLACES, "the daemon holds {held} more sockets");
    let closed: Vec<bool> = flood.iter().map(closed_by_peer).collect();
    let count = closed.iter().filter(|c| **c).count();
    assert!(
        count > FLOOD - PLACES,
        "only {count} of {FLOOD} idle connections were closed"
    );
    assert!(
        closed[..FLOOD - PLACES].iter().all(|c| *c),
        "an older idle connection is still open"
    );
    eprintln!(
        "{FLOOD} idle connections opened in {flooded:?}; a GET answered in {took:?}; \
         {count} closed; the daemon holds {held} connections"
    );
}

#[test]
fn event_streams_over_the_cap_are_answered_503() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0", "--http-max-streams", "2"]);
    let api = Api::of(&daemon);
    let bearer = api.bearer();
    let auth = [("Authorization", bearer.as_str())];
    let first = open_stream(api.port, "/api/events", &auth);
    assert_eq!(first.status, 200);
    let second = open_stream(api.port, "/api/events?task=1", &auth);
    assert_eq!(second.status, 200);
    let mut third = open_stream(api.port, "/api/events", &auth);
    assert_eq!(third.status, 503);
    assert_eq!(
        third.headers.get("retry-after").map(String::as_str),
        Some("5")
    );
    let body = stream_body(&mut third);
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("2 streams are open") && error.contains("--http-max-streams"),
        "{error}"
    );
    // The rest of the API is not capped by it.
    assert_eq!(api.get("/api/tasks").status, 200);
    // A stream closed by its reader gives its place back.
    drop(first);
    let deadline = Instant::now() + LIMIT;
    loop {
        let next = open_stream(api.port, "/api/events", &auth);
        if next.status == 200 {
            break;
        }
        assert_eq!(next.status, 503);
        assert!(
            Instant::now() < deadline,
            "the closed stream kept its place"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(second);
}

/// Schedules and delayed submissions over the JSON API, and on the
/// dashboard in Chromium: listed with their next firing, paused, resumed
/// and run by a click.
#[test]
fn the_api_and_the_dashboard_show_and_drive_schedules_in_chromium() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = Api::of(&daemon);
    let url = dashboard_url(&daemon);
    let out = daemon.run(&["plugins", "ls", "--json"]);
    assert_eq!(out.code, Some(0));
    // The plugin by digest, then the schedule as JSON.
    let bytes = std::fs::read(p("hello")).unwrap();
    let digest = {
        use std::fmt::Write as _;
        let mut hex = String::new();
        for b in sha256(&bytes) {
            write!(hex, "{b:02x}").unwrap();
        }
        hex
    };
    let put = http::request_bytes(
        api.port,
        "PUT",
        &format!("/api/plugins/{digest}"),
        &[("Authorization", api.bearer().as_str())],
        &bytes,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let json_body = [("Content-Type", "application/json")];
    let bad = api.request(
        "POST",
        "/api/schedules",
        &json_body,
        &format!(r#"{{"name":"bad","cron":"0 25 * * *","task":{{"plugin":"{digest}"}}}}"#),
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("hour field"), "{}", bad.body);
    let added = api.request(
        "POST",
        "/api/schedules",
        &json_body,
        &format!(
            r#"{{"name":"daily-hi","cron":"@daily","tz":"Europe/Berlin","missed":"skip","task":{{"plugin":"{digest}","input":"hi","priority":3}}}}"#
        ),
    );
    assert_eq!(added.status, 201, "{}", added.body);
    let row = added.json();
    assert_eq!(row["tz"], "Europe/Berlin");
    assert_eq!(row["missed"], "skip");
    assert_eq!(row["priority"], 3);
    assert_eq!(row["slot"], "daily-hi", "the schedule's own slot");
    assert!(row["next"].as_str().unwrap().ends_with('Z'), "{row}");
    let listed = api.get("/api/schedules").json();
    let out = daemon.run(&["schedule", "ls", "--json"]);
    let cli: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(listed, cli, "the API answers as the CLI");
    // A delayed task over the API.
    let later = api.request(
        "POST",
        "/api/tasks",
        &json_body,
        &format!(r#"{{"plugin":"{digest}","name":"later","delay":"1h"}}"#),
    );
    assert_eq!(later.status, 201, "{}", later.body);
    assert_eq!(later.json()["state"], "waiting");

    let browser = Chromium::launch();
    let mut page = browser.open(&url);
    let row = "#schedules tr[data-schedule=\"daily-hi\"]";
    page.wait_for(
        "the schedule's row",
        &format!("(() => {{ const r = document.querySelector('{row}'); return r && r.innerText.includes('@daily') && r.innerText.includes('Europe/Berlin'); }})()"),
    );
    page.wait_for(
        "the delayed task, waiting with its time",
        "(() => { const r = document.querySelector('#tasks tbody tr'); return r && r.innerText.includes('later') && r.innerText.includes('waiting until'); })()",
    );
    page.click(&format!("{row} button[data-action=\"pause\"]"));
    page.wait_for(
        "the paused schedule",
        &format!("document.querySelector('{row}') && document.querySelector('{row}').innerText.includes('paused')"),
    );
    let paused = api.get("/api/schedules").json();
    assert_eq!(paused[0]["paused"], true, "{paused}");
    page.click(&format!("{row} button[data-action=\"resume\"]"));
    page.wait_for(
        "the resumed schedule",
        &format!("document.querySelector('{row} button[data-action=\"pause\"]') !== null"),
    );
    page.click(&format!("{row} button[data-action=\"run\"]"));
    page.wait_for(
        "the firing's outcome on the row",
        &format!("document.querySelector('{row}') && document.querySelector('{row}').innerText.includes('completed')"),
    );
    page.screenshot("dashboard-schedules.png");
    let metrics = scrape_until(&api, "the run's firing", |m| {
        m.counter("taskhost_schedule_firings", &[("kind", "run")]) >= 1.0
    });
    assert_eq!(metrics.gauge("taskhost_schedules", &[]), 1.0);
    assert_eq!(metrics.gauge("taskhost_delayed_submissions", &[]), 1.0);
    assert_eq!(
        metrics.counter("taskhost_schedule_firings", &[("kind", "on-time")]),
        0.0
    );
    let ran = api.get("/api/schedules").json();
    let task = ran[0]["last_task"].as_u64().expect("the run's task");
    let out = daemon.run(&["wait", &task.to_string(), "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["output"], "hi");
    let gone = api.request("DELETE", "/api/schedules/daily-hi", &[], "");
    assert_eq!(gone.status, 200, "{}", gone.body);
    assert_eq!(api.get("/api/schedules").json(), json!([]));
    let missing = api.post("/api/schedules/daily-hi/run");
    assert_eq!(missing.status, 404, "{}", missing.body);
}

/// SHA-256, for a plugin's digest in the API's paths.
fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

/// A child task shows its parent in the dashboard's live tasks.
#[test]
fn the_dashboard_links_a_child_task_to_its_parent_in_chromium() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let url = dashboard_url(&daemon);
    let parent = daemon.submit(&[
        &p("fanout"),
        "--name",
        "fan",
        "--param",
        "n=2",
        "--param",
        "ms=600000",
    ]);
    daemon.wait_until_state("fan.child-1", "running");
    let browser = Chromium::launch();
    let mut page = browser.open(&url);
    page.wait_for(
        "the children's parent link",
        &format!(
            "Array.from(document.querySelectorAll('#tasks tr[data-task-id]')).filter((r) => \
             r.innerText.includes('fan.child-') && r.innerText.includes('child of {parent}')).length === 2"
        ),
    );
    // The cancel cascades to both children.
    let out = daemon.run(&["cancel", &parent]);
    assert!(out.stderr.contains("canceled"), "{out:?}");
}

#[test]
fn the_dashboard_shows_a_teams_namespace_and_lets_an_operator_switch_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "read alpha-view alpha\nadmin root-token *\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        tokens.to_str().unwrap(),
    ]);
    for ns in ["alpha", "beta"] {
        assert_eq!(daemon.run(&["ns", "add", ns]).code, Some(0));
        let name = format!("{ns}-fails");
        let out = daemon.run(&[
            "--namespace",
            ns,
            "submit",
            &p("flaky"),
            "--name",
            &name,
            "--param",
            "fail_times=9",
            "--wait",
        ]);
        assert_eq!(out.code, Some(1), "{out:?}");
    }
    let port = http_port(&daemon);
    let browser = Chromium::launch();
    let mut page = browser.page();
    page.call("Page.enable", json!({}));
    page.call("Runtime.enable", json!({}));
    // Signs in with `token` on a fresh load (the tab forgets the last).
    let open = |page: &mut Cdp, token: &str| {
        page.call(
            "Page.navigate",
            json!({ "url": format!("http://127.0.0.1:{port}/") }),
        );
        page.wait_event("Page.loadEventFired");
        page.wait_for(
            "the token prompt",
            "document.querySelector('#token-form').style.display === 'inline'",
        );
        page.click("#token-input");
        page.call("Input.insertText", json!({ "text": token }));
        page.click("#token-save");
    };
    let failed =
        "[...document.querySelectorAll('#failed tbody tr')].map(r => r.innerText).join('|')";
    // A team's token: its namespace shown, no switch, none of beta's.
    open(&mut page, "alpha-view");
    let team = &mut page;
    team.wait_for(
        "alpha's failed task",
        &format!("({failed}).includes('alpha-fails')"),
    );
    assert!(!team.eval(failed).as_str().unwrap().contains("beta"));
    assert_eq!(team.eval("$('#namespace').value"), json!("alpha"));
    assert_eq!(team.eval("$('#namespace').disabled"), json!(true));
    assert_eq!(team.eval("$('#namespace-pick').hidden"), json!(false));
    // An operator's token switches between them.
    page.eval("sessionStorage.clear()");
    open(&mut page, "root-token");
    let operator = &mut page;
    operator.wait_for(
        "the namespaces to pick from",
        "document.querySelectorAll('#namespace option').length === 3",
    );
    assert_eq!(operator.eval("$('#namespace').disabled"), json!(false));
    operator.eval(
        "(() => { const s = $('#namespace'); s.value = 'beta'; \
         s.dispatchEvent(new Event('change')); return true; })()",
    );
    operator.wait_for(
        "beta's failed task",
        &format!("({failed}).includes('beta-fails')"),
    );
    assert!(!operator.eval(failed).as_str().unwrap().contains("alpha"));
}

#[test]
fn the_dashboard_shows_deployments_and_an_operator_rolls_one_back_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "read viewer-token\nadmin ops-token\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        tokens.to_str().unwrap(),
    ]);
    let port = http_port(&daemon);
    for (plugin, version) in [("hello", "1"), ("sleeper", "2")] {
        let out = daemon.run(&[
            "deploy",
            &p(plugin),
            "--name",
            "greet",
            "--version",
            version,
        ]);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    let browser = Chromium::launch();
    let mut page = browser.open(&format!("http://127.0.0.1:{port}/"));
    let token = |page: &mut Cdp, token: &str| {
        page.wait_for(
            "the token prompt",
            "document.querySelector('#token-form').style.display === 'inline'",
        );
        page.click("#token-input");
        page.call("Input.insertText", json!({ "text": token }));
        page.click("#token-save");
    };
    token(&mut page, "viewer-token");
    let row = "#deployments tr[data-deployment=\"greet\"]";
    page.wait_for(
        "the deployment's row",
        &format!("(() => {{ const r = document.querySelector('{row}'); return r && r.children[1].innerText === '2' && r.children[5].innerText === '2'; }})()"),
    );
    page.click(&format!("{row} button[data-action=\"history\"]"));
    page.wait_for(
        "its history",
        "!document.querySelector('#deployment-history').hidden && document.querySelectorAll('#history tbody tr').length === 2",
    );
    // A reader's token cannot roll back: the page asks for an operator's,
    // then rolls back with it.
    page.click("#history button[data-action=\"rollback-to\"][data-version=\"1\"]");
    page.wait_for(
        "the notice asking for an operator's token",
        "document.querySelector('#notice-text').innerText.includes(\"operator's token\")",
    );
    let current = || daemon.run(&["deployments", "ls", "--json"]).json()[0]["version"].clone();
    assert_eq!(current(), "2");
    token(&mut page, "ops-token");
    page.wait_for(
        "the rollback in the row",
        &format!("(() => {{ const r = document.querySelector('{row}'); return r && r.children[1].innerText === '1' && r.children[3].innerText === 'rollback'; }})()"),
    );
    page.wait_for(
        "the rollback in the history",
        "document.querySelectorAll('#history tbody tr').length === 3",
    );
    page.screenshot("dashboard-deployments.png");
    assert_eq!(current(), "1");
    let done = daemon.run(&["submit", "greet", "--input", "back", "--wait"]);
    assert_eq!(done.stdout, "back", "{done:?}");
}
