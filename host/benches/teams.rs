//! Noisy-neighbour benchmark: namespace A floods one daemon with 20,000
//! `sleeper --param ms=10` submissions (pipelined from 8 tasks), while
//! namespace B submits one `hello` every 100 ms until A's flood has run.
//! Measured: B's submit → start (from sending the submission to seeing its
//! `AttemptStarting` on B's own event stream) p50, p99 and max, and A's
//! throughput (its 20,000 over the time from its first submission to the
//! daemon drained).
//!
//! Three variants on the release `host serve` (SQLite store,
//! `--max-concurrent 32`, so the run permits are the bottleneck), rounds
//! interleaved, each on a fresh daemon:
//! - `alone`: A's flood with no B (A's throughput alone);
//! - `namespaces`: A in namespace `alpha`, B in `beta` (weights 1 and 1);
//! - `one-namespace`: A and B both in the default namespace, where B waits
//!   behind A's whole queue.
//!
//! Run with `cargo bench -p taskhost --bench teams`; `TASKHOST_BENCH_ROUNDS`
//! sets the rounds (default 2), `TASKHOST_BENCH_FLOOD` A's submissions.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{Enter, EventFilter, Reply, Request, SubmitRequest};
use taskhost::supervisor::EventKind;

const MAX_CONCURRENT: &str = "32";
const B_EVERY: Duration = Duration::from_millis(100);
const A_CLIENTS: usize = 8;

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Alone,
    Namespaces,
    OneNamespace,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Alone => "alone",
            Variant::Namespaces => "namespaces",
            Variant::OneNamespace => "one-namespace",
        }
    }
}

struct Round {
    a_per_s: f64,
    b_ms: Vec<f64>,
}

fn main() {
    let rounds: usize = std::env::var("TASKHOST_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let flood: usize = std::env::var("TASKHOST_BENCH_FLOOD")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "# noisy neighbour: A floods {flood} sleeper ms=10, B one hello every 100 ms; \
         --max-concurrent {MAX_CONCURRENT}, SQLite; {rounds} rounds, variants interleaved"
    );
    let variants = [Variant::Alone, Variant::Namespaces, Variant::OneNamespace];
    let mut results: Vec<(Variant, Vec<Round>)> =
        variants.iter().map(|v| (*v, Vec::new())).collect();
    for round in 0..rounds {
        for (variant, seen) in &mut results {
            let dir = tempfile::tempdir().unwrap();
            let r = rt.block_on(run(dir.path(), *variant, flood));
            let b = summary(&r.b_ms);
            println!(
                "round {round} {:<14} A {:>7.0} tasks/s  B submit->start {b}",
                variant.label(),
                r.a_per_s
            );
            seen.push(r);
        }
    }
    println!("# medians over rounds");
    for (variant, seen) in &results {
        let mut a: Vec<f64> = seen.iter().map(|r| r.a_per_s).collect();
        a.sort_by(f64::total_cmp);
        let b: Vec<f64> = seen.iter().flat_map(|r| r.b_ms.iter().copied()).collect();
        println!(
            "{:<14} A {:>7.0} tasks/s  B submit->start {}",
            variant.label(),
            a[a.len() / 2],
            summary(&b)
        );
    }
}

fn summary(ms: &[f64]) -> String {
    if ms.is_empty() {
        return "-".to_owned();
    }
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    let q = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms  (n={})",
        q(0.5),
        q(0.99),
        v[v.len() - 1],
        v.len()
    )
}

async fn run(dir: &Path, variant: Variant, flood: usize) -> Round {
    let socket = dir.join("s.sock");
    let mut daemon = start(dir, &socket);
    let admin = Client::connect(&socket).await.expect("connect");
    let (a_ns, b_ns) = match variant {
        Variant::OneNamespace => (None, None),
        _ => (Some("alpha"), Some("beta")),
    };
    for ns in [a_ns, b_ns].into_iter().flatten() {
        admin
            .call(Request::Namespace(
                taskhost::daemon::protocol::NamespaceVerb::Add(ns.to_owned(), Default::default()),
            ))
            .await
            .expect("ns add");
    }
    let sleeper = admin
        .ensure_plugin(&std::fs::read(plugin_artifacts::SLEEPER).unwrap())
        .await
        .unwrap();
    let hello = admin
        .ensure_plugin(&std::fs::read(plugin_artifacts::HELLO).unwrap())
        .await
        .unwrap();
    let a = client_in(&socket, a_ns).await;
    let b = client_in(&socket, b_ns).await;

    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let b_task = (variant != Variant::Alone).then(|| {
        let flooding = Arc::clone(&flooding);
        tokio::spawn(neighbour(b, hello, flooding))
    });
    let started = Instant::now();
    let mut senders = Vec::new();
    for c in 0..A_CLIENTS {
        let a = a.clone();
        senders.push(tokio::spawn(async move {
            for _ in (c..flood).step_by(A_CLIENTS) {
                let mut request = SubmitRequest::new(sleeper);
                request.params = vec![("ms".into(), "10".into())];
                a.submit(request).await.expect("A's submission");
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    // Drained: no unfinished task of A left.
    loop {
        let live = a.list(false).await.expect("ps");
        if live.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_per_s = flood as f64 / started.elapsed().as_secs_f64();
    flooding.store(false, std::sync::atomic::Ordering::SeqCst);
    let b_ms = match b_task {
        Some(task) => task.await.unwrap(),
        None => Vec::new(),
    };
    let _ = daemon.kill();
    let _ = daemon.wait();
    Round { a_per_s, b_ms }
}

/// B: one `hello` every 100 ms while A floods; each one's submit → start.
async fn neighbour(
    b: Client,
    hello: taskhost::runtime::Digest,
    flooding: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<f64> {
    let mut events = b
        .request(Request::Events {
            follow: true,
            filter: EventFilter {
                task: None,
                kinds: vec![EventKind::AttemptStarting],
            },
        })
        .await
        .expect("events");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(reply) = events.next().await {
            if let Reply::Event(event) = reply
                && let Some(id) = event.task_id
            {
                let _ = tx.send((id, Instant::now()));
            }
        }
    });
    let mut sent = std::collections::HashMap::new();
    let mut latencies = Vec::new();
    let mut tick = tokio::time::interval(B_EVERY);
    while flooding.load(std::sync::atomic::Ordering::SeqCst) {
        tick.tick().await;
        let at = Instant::now();
        let submitted = b.submit(SubmitRequest::new(hello)).await.expect("B's");
        sent.insert(submitted.id, at);
        while let Ok((id, seen)) = rx.try_recv() {
            if let Some(at) = sent.remove(&id) {
                latencies.push(seen.duration_since(at).as_secs_f64() * 1e3);
            }
        }
    }
    // The last ones' starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sent.is_empty() && Instant::now() < deadline {
        if let Ok(Some((id, seen))) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await
            && let Some(at) = sent.remove(&id)
        {
            latencies.push(seen.duration_since(at).as_secs_f64() * 1e3);
        }
    }
    latencies
}

async fn client_in(socket: &Path, ns: Option<&str>) -> Client {
    let client = Client::connect(socket).await.expect("connect");
    if ns.is_some() {
        client
            .enter(Enter {
                namespace: ns.map(str::to_owned),
                all: false,
            })
            .await
            .expect("enter");
    }
    client
}

fn start(dir: &Path, socket: &Path) -> Child {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["serve", "--socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--store", "sqlite", "--max-concurrent", MAX_CONCURRENT])
        .args([
            "--max-total-pending",
            "1000000",
            "--max-slot-queue",
            "1000000",
        ])
        .args(["--worker-threads", "2"])
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
