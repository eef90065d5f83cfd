//! Time benchmark: the release `host serve` with schedules and delayed
//! submissions, driven by the library's `Client` over its socket.
//!
//! - schedules: 10,000 schedules in one daemon (the durable SQLite store),
//!   each firing `hello` every minute, for `TASKHOST_BENCH_MINUTES` minutes
//!   (default 2), in two shapes side by side (one daemon each, one after the
//!   other): `burst`, every schedule `* * * * *` (all 10,000 due at the same
//!   instant, the top of each minute), and `spread`, 6-field expressions
//!   `S * * * * *` with S = i mod 60 (each still once a minute, 167 due each
//!   second). Lateness of each firing (its `ScheduleFired` event's
//!   `delay_ms`: due time to the task placed in its slot): median, p99, max;
//!   the daemon's CPU per minute and per firing (placing, storing and
//!   running each `hello`); and the CPU of a daemon holding the same 10,000
//!   schedules for a minute in which none is due (what the firing loop costs
//!   while it waits).
//! - delayed: 500 submissions of `hello` with `--delay 20ms`, one at a time
//!   (each waited for), on the memory and the SQLite store: due to start
//!   (the first `AttemptStarting`'s `delay_ms`): median, p99.
//!
//! `TASKHOST_BENCH_ONLY=schedules|delayed` runs one scenario,
//! `TASKHOST_BENCH_SHAPE=burst|spread` one shape of schedules;
//! `TASKHOST_BENCH_SERVE="--flag value …"` adds flags to the schedules'
//! daemons. Run with
//! `cargo bench -p taskhost --bench time`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{
    EventFilter, NotBefore, Reply, Request, ScheduleSpec, ScheduleVerb, SubmitRequest,
};
use taskhost::daemon::schedule::Missed;
use taskhost::runtime::Digest;
use taskhost::supervisor::{EventKind, TaskRef};

const SCHEDULES: usize = 10_000;
const DELAYED: usize = 500;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let only = std::env::var("TASKHOST_BENCH_ONLY").ok();
    let minutes: u64 = std::env::var("TASKHOST_BENCH_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
    if only.as_deref().is_none_or(|o| o == "delayed") {
        rt.block_on(delayed(dir.path(), &hello));
    }
    if only.as_deref().is_none_or(|o| o == "schedules") {
        println!(
            "# {SCHEDULES} schedules of hello, each firing once a minute, {minutes} minutes each shape (sqlite store)"
        );
        let shape = std::env::var("TASKHOST_BENCH_SHAPE").ok();
        for s in ["burst", "spread"] {
            if shape.as_deref().is_none_or(|only| only == s) {
                rt.block_on(schedules(dir.path(), &hello, s, minutes));
            }
        }
        if shape.is_none() {
            rt.block_on(idle(dir.path(), &hello));
        }
    }
}

/// A delayed `hello` at a time, each waited for: due to start.
async fn delayed(dir: &Path, hello: &[u8]) {
    println!("# {DELAYED} delayed submissions of hello (--delay 20ms), one at a time");
    for store in ["memory", "sqlite"] {
        let socket = dir.join(format!("delayed-{store}.sock"));
        let mut daemon = start(&socket, &dir.join(format!("delayed-{store}")), store, &[]);
        let client = Client::connect(&socket).await.expect("connect");
        let digest = client.ensure_plugin(hello).await.expect("upload");
        let mut events = client
            .request(Request::Events {
                follow: true,
                filter: EventFilter {
                    task: None,
                    kinds: vec![EventKind::AttemptStarting],
                },
            })
            .await
            .expect("events");
        let mut late = Vec::with_capacity(DELAYED);
        for _ in 0..DELAYED {
            let mut request = SubmitRequest::new(digest);
            request.not_before = Some(NotBefore::After(Duration::from_millis(20)));
            let submitted = client.submit(request).await.expect("submit");
            client.wait(TaskRef::Id(submitted.id)).await.expect("wait");
            loop {
                match events.next().await {
                    Some(Reply::Event(e)) if e.task_id == Some(submitted.id) => {
                        late.push(e.delay_ms.expect("delay_ms") as f64);
                        break;
                    }
                    Some(_) => {}
                    None => panic!("the event stream ended"),
                }
            }
        }
        late.sort_by(f64::total_cmp);
        println!(
            "delayed {store}: due -> start median {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            quantile(&late, 0.5),
            quantile(&late, 0.99),
            late[late.len() - 1]
        );
        stop(&mut daemon);
    }
}

/// 10,000 schedules, each once a minute, in `shape`; lateness and CPU over
/// `minutes` minutes of firings.
async fn schedules(dir: &Path, hello: &[u8], shape: &str, minutes: u64) {
    let socket = dir.join(format!("{shape}.sock"));
    // Every event of a burst kept for the reader below.
    let config = dir.join(format!("{shape}.toml"));
    std::fs::write(&config, "event_lane_capacity = 1000000\n").unwrap();
    let extra = std::env::var("TASKHOST_BENCH_SERVE").unwrap_or_default();
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(extra.split_whitespace());
    let mut daemon = start(&socket, &dir.join(shape), "sqlite", &args);
    let client = Client::connect(&socket).await.expect("connect");
    let digest = client.ensure_plugin(hello).await.expect("upload");
    add_schedules(&client, digest, |i| match shape {
        "burst" => "* * * * *".to_owned(),
        _ => format!("{} * * * * *", i % 60),
    })
    .await;
    let mut events = client
        .request(Request::Events {
            follow: true,
            filter: EventFilter {
                task: None,
                kinds: vec![EventKind::ScheduleFired],
            },
        })
        .await
        .expect("events");
    // From the next top of a minute: whole minutes of firings.
    let wait = 60_000 - now_ms() % 60_000;
    tokio::time::sleep(Duration::from_millis(wait.saturating_sub(500))).await;
    let cpu_before = cpu_time(daemon.id());
    let expected = SCHEDULES * minutes as usize;
    let mut late = Vec::with_capacity(expected);
    // Each minute's firings apart too: (the minute of the due time, late).
    let mut by_minute: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60 * minutes + 30);
    while late.len() < expected {
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        match next {
            Ok(Some(Reply::Event(e))) => {
                let ms = e.delay_ms.unwrap_or(0);
                late.push(ms as f64);
                let due = e.at_ms.saturating_sub(ms);
                by_minute.entry(due / 60_000).or_default().push(ms as f64);
            }
            Ok(Some(Reply::Dropped(n))) => panic!("the event reader lost {n} events"),
            Ok(Some(_)) => {}
            Ok(None) => panic!("the event stream ended"),
            Err(_) => break,
        }
    }
    let cpu = cpu_time(daemon.id()).saturating_sub(cpu_before);
    late.sort_by(f64::total_cmp);
    let fired = late.len();
    let per_minute: Vec<String> = by_minute
        .values_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            format!("{:.0}/{:.0}", quantile(v, 0.5), quantile(v, 0.99))
        })
        .collect();
    println!(
        "schedules {shape}: {fired} firings in {minutes} min; lateness median {:.0} ms, p99 {:.0} ms, max {:.0} ms (each minute's median/p99: {}); daemon CPU {:.2} s per minute, {:.0} µs per firing",
        quantile(&late, 0.5),
        quantile(&late, 0.99),
        late.last().copied().unwrap_or(0.0),
        per_minute.join(", "),
        cpu.as_secs_f64() / minutes as f64,
        cpu.as_secs_f64() * 1e6 / fired.max(1) as f64,
    );
    stop(&mut daemon);
}

/// The CPU a daemon holding 10,000 schedules spends in a minute none is
/// due, beside one that holds none, in the same minute.
async fn idle(dir: &Path, hello: &[u8]) {
    let mut daemons = Vec::new();
    for held in [0, SCHEDULES] {
        let socket = dir.join(format!("idle-{held}.sock"));
        let daemon = start(&socket, &dir.join(format!("idle-{held}")), "sqlite", &[]);
        let client = Client::connect(&socket).await.expect("connect");
        let digest = client.ensure_plugin(hello).await.expect("upload");
        if held > 0 {
            // New Year's Day at midnight: none due within the minute.
            add_schedules(&client, digest, |_| "0 0 1 1 *".to_owned()).await;
        }
        daemons.push((held, daemon));
    }
    let before: Vec<Duration> = daemons.iter().map(|(_, d)| cpu_time(d.id())).collect();
    tokio::time::sleep(Duration::from_secs(60)).await;
    for ((held, daemon), before) in daemons.iter_mut().zip(before) {
        let cpu = cpu_time(daemon.id()).saturating_sub(before);
        println!(
            "schedules idle: {held} schedules, none due: daemon CPU {:.1} ms in a minute",
            cpu.as_secs_f64() * 1e3
        );
        stop(daemon);
    }
}

async fn add_schedules(client: &Client, digest: Digest, cron: impl Fn(usize) -> String) {
    for i in 0..SCHEDULES {
        let spec = ScheduleSpec {
            name: format!("s{i}"),
            cron: cron(i),
            tz: None,
            missed: Missed::Skip,
            request: SubmitRequest::new(digest),
        };
        client
            .schedule(ScheduleVerb::Add(Box::new(spec)))
            .await
            .expect("schedule add");
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The CPU time a process has used so far, its threads that ended
/// included (`/proc/PID/stat`'s utime and stime, in ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // After the command: field 3 is rest[0]; utime is field 14, stime 15.
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Starts the release daemon (slots and queues unbounded enough for 10,000
/// schedules) and returns once it listens.
fn start(socket: &Path, state: &Path, store: &str, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["serve", "--socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(state)
        .args(["--store", store, "--max-total-pending", "1000000"])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn host serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("taskhost daemon listening on") => break,
            Some(Ok(_)) => {}
            _ => panic!("the daemon exited before listening"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

fn stop(daemon: &mut Child) {
    let _ = daemon.kill();
    let _ = daemon.wait();
}
