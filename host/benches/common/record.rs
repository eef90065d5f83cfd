//! Issue 55: what the flight recorder costs an attempt. In every round the
//! same closed loop (add → outcome through the supervisor, as the suite's
//! plugin rows do) runs with recording off and with it on, alternating
//! attempt by attempt (off then on, then on then off), after one untimed
//! warm-up round: both sides meet the same moments of a shared, noisy
//! machine, where whole rounds one after the other did not. The rows
//! give each side's median and p99 over every attempt of every round, and
//! the ratio of the medians, on/off, against the target (`hello`
//! ≤ 1.05x, key-value and HTTP ≤ 1.10x); its range is that of the
//! per-round ratios. The recording side hands each record to a sink that
//! counts it and keeps only the last one: the recorder's own cost is
//! measured, not a store's. One runtime with an in-memory key-value store
//! (as `host run` has) runs every scenario:
//! - `hello` (input `hi`);
//! - `counter`: one increment, one get and one set in its slot's bucket;
//! - `counter bench=100`: 100 sets and 100 gets of a 64-byte value, each
//!   timed by the guest (400 monotonic-clock reads, recorded too);
//! - `http-get` of a fixed `200 ok` from a server the bench starts on
//!   127.0.0.1 (one connection per request). The recorder keeps no HTTP
//!   response yet (issue 55's next step): this is what recording costs such
//!   an attempt today.
//!
//! And `record-bytes`: the encoded size of one attempt's record
//! ([`AttemptRecord::encoded_len`]) for `hello` and the Python and
//! JavaScript examples, `*-hello` (input `hi`) and `*-long` with
//! `mode=nondet` (the clocks, random bytes, three random short sleeps).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use taskhost::outcome::TaskOutcome;
use taskhost::plugin_task::PluginTask;
use taskhost::runtime::record::{AttemptRecord, DEFAULT_RECORD_BUDGET, RecordSettings, RecordSink};
use taskhost::runtime::{HttpAllow, KvLimits, MemoryKv, Plugin, Runtime, RuntimeConfig, Sandbox};
use taskhost::supervisor::{Supervisor, TaskBody};

use super::{Check, Flavour, GRACE, ROUNDS, Row, Table, drive, median, once, ours_controller};

/// The slot of every task here: the counter's bucket stays one bucket.
const SLOT: &str = "record-bench";
/// Recorded attempts per program in the bytes scenario.
const BYTES_ATTEMPTS: usize = 5;

/// The recording side's sink: counts the records, keeps the last.
#[derive(Default)]
struct Kept {
    records: AtomicUsize,
    last: Mutex<Option<AttemptRecord>>,
}

impl RecordSink for Kept {
    fn recorded(&self, record: AttemptRecord) {
        self.records.fetch_add(1, Ordering::Relaxed);
        *self.last.lock().unwrap() = Some(record);
    }
}

/// One scenario: a plugin task, how many attempts a round, the target.
struct Case {
    /// The row's name.
    name: &'static str,
    /// A short key for task names.
    key: &'static str,
    plugin: Arc<Plugin>,
    source: String,
    params: Vec<(String, String)>,
    input: Vec<u8>,
    sandbox: Sandbox,
    iterations: usize,
    /// The most on/off may be.
    target: f64,
}

impl Case {
    /// The task body, recording into `kept` if given.
    fn body(&self, runtime: &Arc<Runtime>, kept: Option<&Arc<Kept>>) -> Arc<dyn TaskBody> {
        let task = PluginTask::new(runtime, &self.plugin)
            .input(self.input.clone())
            .params(self.params.clone())
            .sandbox(self.sandbox.clone());
        Arc::new(match kept {
            Some(kept) => task.record(RecordSettings {
                budget: DEFAULT_RECORD_BUDGET,
                source: self.source.clone(),
                sink: Arc::clone(kept) as Arc<dyn RecordSink>,
            }),
            None => task,
        })
    }
}

fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A runtime as the suite's, with an in-memory key-value store.
fn runtime() -> Arc<Runtime> {
    let config = RuntimeConfig::default()
        .cache_dir(Some(super::cache_dir()))
        .key_value(Arc::new(MemoryKv::new(
            KvLimits::default(),
            "the suite keeps its buckets in memory",
        )));
    Arc::new(Runtime::new(&config).expect("the runtime starts"))
}

async fn load(runtime: &Runtime, path: &Path) -> Arc<Plugin> {
    runtime
        .load_file(path)
        .await
        .unwrap_or_else(|e| panic!("{} loads: {e}", path.display()))
}

/// A server on 127.0.0.1 that answers every request `200 ok` and closes
/// the connection; its port.
fn ok_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let port = listener.local_addr().expect("local addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    port
}

async fn cases(runtime: &Runtime, port: u16) -> Vec<Case> {
    let source = |name: &str| plugin_artifacts::path(name).display().to_string();
    let (hello, counter, http) = (
        load(runtime, &plugin_artifacts::path("hello")).await,
        load(runtime, &plugin_artifacts::path("counter")).await,
        load(runtime, &plugin_artifacts::path("http-get")).await,
    );
    let case = |name, key, plugin: &Arc<Plugin>, iterations, target| Case {
        name,
        key,
        plugin: Arc::clone(plugin),
        source: source(&plugin.info().name),
        params: Vec::new(),
        input: Vec::new(),
        sandbox: Sandbox::default(),
        iterations,
        target,
    };
    let url = format!("http://127.0.0.1:{port}/");
    let grant = HttpAllow::parse(&format!("http://127.0.0.1:{port}")).expect("a grant");
    vec![
        Case {
            input: b"hi".to_vec(),
            ..case("hello", "hello", &hello, 2_000, 1.05)
        },
        case("counter", "kv", &counter, 2_000, 1.10),
        Case {
            params: params(&[("bench", "100")]),
            ..case("counter bench=100", "kv-bench", &counter, 500, 1.10)
        },
        Case {
            params: params(&[("url", &url)]),
            sandbox: Sandbox {
                http: vec![grant],
                ..Sandbox::default()
            },
            ..case("http-get 127.0.0.1", "http", &http, 500, 1.10)
        },
    ]
}

/// `n` attempts one after another, each add → outcome, in µs.
async fn attempts(sup: Supervisor, body: Arc<dyn TaskBody>, tag: String, n: usize) -> Vec<f64> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let waiter = sup.add(once(format!("{tag}-{i}"), Arc::clone(&body)).with_slot(SLOT));
        let outcome = waiter.wait().await;
        samples.push(started.elapsed().as_secs_f64() * 1e6);
        assert!(
            matches!(outcome, TaskOutcome::Completed { .. }),
            "{tag}-{i}: {outcome:?}"
        );
    }
    samples
}

/// `n` pairs of attempts, one off (`bodies[0]`) and one on, the side that
/// goes first alternating: each side's times, in µs.
async fn paired(
    sup: Supervisor,
    bodies: [Arc<dyn TaskBody>; 2],
    tag: String,
    n: usize,
) -> [Vec<f64>; 2] {
    let mut samples = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for i in 0..n {
        for turn in 0..2 {
            let side = (i + turn) % 2;
            let tag = format!("{tag}-{i}-{side}");
            let one = attempts(sup.clone(), Arc::clone(&bodies[side]), tag, 1).await;
            samples[side].extend(one);
        }
    }
    samples
}

/// The scenario `record`, on one flavour.
pub(super) fn record(rt: &tokio::runtime::Runtime, flavour: Flavour, table: &mut Table) {
    let flavour = flavour.name();
    let runtime = runtime();
    let port = ok_server();
    let cases = rt.block_on(cases(&runtime, port));
    let ctl = {
        let _guard = rt.enter();
        ours_controller(GRACE)
    };
    for case in &cases {
        side_by_side(rt, flavour, &runtime, ctl.supervisor(), case, table);
    }
    drive(rt, "record: shutdown", async move {
        let _ = ctl.shutdown(GRACE).await;
    });
}

/// One case, off and on, rounds rotated; its rows.
fn side_by_side(
    rt: &tokio::runtime::Runtime,
    flavour: &str,
    runtime: &Arc<Runtime>,
    sup: &Supervisor,
    case: &Case,
    table: &mut Table,
) {
    let kept = Arc::new(Kept::default());
    let bodies = [case.body(runtime, None), case.body(runtime, Some(&kept))];
    let sides = ["off", "on"];
    let run = |round: usize| {
        let n = if round == 0 {
            case.iterations / 10
        } else {
            case.iterations
        };
        let tag = format!("rec-{}-{round}", case.key);
        let fut = paired(sup.clone(), bodies.clone(), tag, n);
        drive(rt, case.name, fut)
    };
    run(0);
    let mut rounds: [Vec<Vec<f64>>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=ROUNDS {
        let [off, on] = run(round);
        rounds[0].push(off);
        rounds[1].push(on);
    }
    let recorded = kept.records.load(Ordering::Relaxed);
    assert_eq!(
        recorded,
        case.iterations / 10 + ROUNDS * case.iterations,
        "every attempt of the recording side is recorded"
    );
    let scenario = format!("recording off/on: {}", case.name);
    let pooled = rounds.each_ref().map(|r| r.concat());
    for (side, samples) in sides.iter().zip(&pooled) {
        table.latency(
            &scenario,
            flavour,
            &format!("recording {side}"),
            samples,
            "µs",
            None,
        );
    }
    let per_round: Vec<f64> = (0..ROUNDS)
        .map(|r| median(&rounds[1][r]) / median(&rounds[0][r]))
        .collect();
    let ratio = median(&pooled[1]) / median(&pooled[0]);
    let (lo, hi) = per_round.iter().fold((f64::INFINITY, 0f64), |(lo, hi), v| {
        (lo.min(*v), hi.max(*v))
    });
    let last = kept.last.lock().unwrap().take().expect("a record");
    println!(
        "  {scenario}: on/off {ratio:.3}x (rounds {}); a record: {} bytes, {} calls",
        per_round
            .iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        last.encoded_len(),
        last.call_count
    );
    table.row(Row {
        scenario: scenario.clone(),
        flavour: flavour.into(),
        side: "on/off median".into(),
        median: format!("{ratio:.3}x"),
        range: format!("{lo:.3}x – {hi:.3}x"),
        unit: "ratio".into(),
        target: Some(Check {
            target: format!("≤ {:.2}x", case.target),
            pass: ratio <= case.target,
        }),
        ..Row::default()
    });
    table.row(Row {
        scenario,
        flavour: flavour.into(),
        side: format!("bytes per record ({} calls)", last.call_count),
        median: last.encoded_len().to_string(),
        unit: "bytes".into(),
        ..Row::default()
    });
}

/// The programs of the bytes scenario: name, path, params, input.
type Program = (String, PathBuf, Vec<(String, String)>, Vec<u8>);

fn programs() -> Vec<Program> {
    let mut out: Vec<Program> = vec![(
        "hello".into(),
        plugin_artifacts::path("hello"),
        Vec::new(),
        b"hi".to_vec(),
    )];
    let Some([py, _]) = super::guests::examples("record-bytes") else {
        return out;
    };
    let dir = py.parent().expect("a directory").to_path_buf();
    for lang in ["py", "js"] {
        out.push((
            format!("{lang}-hello"),
            dir.join(format!("{lang}-hello.wasm")),
            Vec::new(),
            b"hi".to_vec(),
        ));
        out.push((
            format!("{lang}-long mode=nondet"),
            dir.join(format!("{lang}-long.wasm")),
            params(&[("mode", "nondet")]),
            Vec::new(),
        ));
    }
    out
}

/// The scenario `record-bytes`: one record's encoded size per program.
pub(super) fn bytes(table: &mut Table) {
    let rt = Flavour::Current.runtime();
    let runtime = runtime();
    let ctl = {
        let _guard = rt.enter();
        ours_controller(GRACE)
    };
    for (name, path, params, input) in programs() {
        let plugin = rt.block_on(load(&runtime, &path));
        let kept = Arc::new(Kept::default());
        let case = Case {
            name: "bytes",
            key: "bytes",
            plugin,
            source: std::path::absolute(&path)
                .unwrap_or(path)
                .display()
                .to_string(),
            params,
            input,
            sandbox: Sandbox::default(),
            iterations: 1,
            target: 0.0,
        };
        let body = case.body(&runtime, Some(&kept));
        let mut sizes = Vec::new();
        let mut calls = Vec::new();
        for i in 0..BYTES_ATTEMPTS {
            let tag = format!("rec-bytes-{i}");
            drive(
                &rt,
                "record-bytes",
                attempts(ctl.supervisor().clone(), Arc::clone(&body), tag, 1),
            );
            let record = kept.last.lock().unwrap().take().expect("a record");
            sizes.push(record.encoded_len() as f64);
            calls.push(f64::from(record.call_count));
        }
        println!(
            "  bytes per recorded attempt, {name}: {} (calls: {})",
            sizes
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            calls
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        );
        table.spread(
            "bytes per recorded attempt",
            "-",
            &format!("{name} ({:.0} calls)", median(&calls)),
            &sizes,
            "bytes",
            None,
        );
    }
    drive(&rt, "record-bytes: shutdown", async move {
        let _ = ctl.shutdown(GRACE).await;
    });
}

/// `--callgrind record-KEY-off|record-KEY-on` (KEY: `hello`, `kv`,
/// `kv-bench`, `http`): that case's closed loop, recording off or on, alone under
/// callgrind, `CALLGRIND_ITERATIONS` attempts: `valgrind --tool=callgrind
/// --collect-atstart=no --toggle-collect='*measured_record*' <suite binary>
/// --callgrind record-hello-on`.
pub(super) fn callgrind(which: &str) {
    let (key, side) = which
        .strip_prefix("record-")
        .and_then(|w| w.rsplit_once('-'))
        .expect("record-KEY-off or record-KEY-on");
    let rt = Flavour::Current.runtime();
    let runtime = runtime();
    let cases = rt.block_on(cases(&runtime, ok_server()));
    let case = cases.iter().find(|c| c.key == key).expect("a case");
    let kept = Arc::new(Kept::default());
    let body = case.body(&runtime, (side == "on").then_some(&kept));
    let ctl = {
        let _guard = rt.enter();
        ours_controller(GRACE)
    };
    let sup = ctl.supervisor().clone();
    rt.block_on(attempts(
        sup.clone(),
        Arc::clone(&body),
        "cg-warm".into(),
        200,
    ));
    measured_record(&rt, sup, body);
    let _ = rt.block_on(ctl.shutdown(GRACE));
    println!("{} attempts of {which}", attempts_measured());
}

/// `CALLGRIND_ITERATIONS`, or `TASKHOST_BENCH_PROFILE_ATTEMPTS` (enough
/// for a sampling profiler: `perf record -e cpu-clock`).
fn attempts_measured() -> usize {
    std::env::var("TASKHOST_BENCH_PROFILE_ATTEMPTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(super::CALLGRIND_ITERATIONS)
}

#[inline(never)]
fn measured_record(rt: &tokio::runtime::Runtime, sup: Supervisor, body: Arc<dyn TaskBody>) {
    let n = attempts_measured();
    rt.block_on(attempts(sup, body, "cg".into(), n));
}
