//! Noisy-neighbour benchmark: namespace A floods one daemon with 20,000
//! `sleeper --param ms=10` submissions (pipelined from 8 tasks), while
//! namespace B submits one `hello` every 100 ms until A's flood has run
//! (each of A's clients keeps 64 submissions in flight).
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
//! With `TASKHOST_BENCH_NODES=3`, the same on a cluster of that many nodes
//! on a throwaway PostgreSQL (A's clients spread over the nodes, B through
//! the first).
//!
//! `-- share`: instead, both namespaces flood (`sleeper ms=50`, A weight
//! 1, B weight 2) daemons of `--max-concurrent 4` each (so that the permits,
//! not the intake or the claims, are the bottleneck) for a minute; the
//! attempts each started in that minute, and B's share against the
//! weights' 2/3.
//!
//! Run with `cargo bench -p taskhost --bench teams [-- share]`;
//! `TASKHOST_BENCH_ROUNDS` sets the rounds (default 2),
//! `TASKHOST_BENCH_FLOOD` A's submissions.

#[path = "../../tests/e2e/common/postgres.rs"]
mod postgres;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{Enter, EventFilter, Reply, Request, SubmitRequest};
use taskhost::supervisor::EventKind;

const MAX_CONCURRENT: &str = "32";
const B_EVERY: Duration = Duration::from_millis(100);
const A_CLIENTS: usize = 8;
/// Unanswered submissions each of A's clients keeps in flight.
const IN_FLIGHT: usize = 64;

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
    /// B's submit → accepted (the reply), of the same submissions.
    b_accept_ms: Vec<f64>,
    /// B's submit → the start as its node stamped it (`at_ms`).
    b_began_ms: Vec<f64>,
}

/// The daemons of one run: one host, or a cluster's nodes and its
/// database (dropped last).
struct Daemons {
    children: Vec<Child>,
    sockets: Vec<PathBuf>,
    _pg: Option<postgres::Postgres>,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn nodes() -> usize {
    std::env::var("TASKHOST_BENCH_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn start_all(dir: &Path) -> Daemons {
    start_all_with(dir, MAX_CONCURRENT)
}

fn start_all_with(dir: &Path, permits: &str) -> Daemons {
    let n = nodes();
    if n == 0 {
        let socket = dir.join("s.sock");
        let child = start(dir, &socket, &["--store", "sqlite"], "host", permits);
        return Daemons {
            children: vec![child],
            sockets: vec![socket],
            _pg: None,
        };
    }
    let pg = postgres::Postgres::start();
    let url = pg.url();
    let (mut children, mut sockets) = (Vec::new(), Vec::new());
    for i in 0..n {
        let name = format!("n{i}");
        let socket = dir.join(format!("{name}.sock"));
        let args = [
            "--store",
            url.as_str(),
            "--node-name",
            name.as_str(),
            "--lease",
            "10s",
            "--lease-renew",
            "500ms",
        ];
        children.push(start(dir, &socket, &args, &name, permits));
        sockets.push(socket);
    }
    Daemons {
        children,
        sockets,
        _pg: Some(pg),
    }
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "share") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(share(dir.path()));
        return;
    }
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
    let store = match nodes() {
        0 => "SQLite".to_owned(),
        n => format!("{n} nodes on PostgreSQL"),
    };
    println!(
        "# noisy neighbour: A floods {flood} sleeper ms=10, B one hello every 100 ms; \
         --max-concurrent {MAX_CONCURRENT}, {store}; {rounds} rounds, variants interleaved"
    );
    let variants = [Variant::Alone, Variant::Namespaces, Variant::OneNamespace];
    let mut results: Vec<(Variant, Vec<Round>)> =
        variants.iter().map(|v| (*v, Vec::new())).collect();
    for round in 0..rounds {
        for (variant, seen) in &mut results {
            let dir = tempfile::tempdir().unwrap();
            let r = rt.block_on(run(dir.path(), *variant, flood));
            let (b, accept) = (summary(&r.b_ms), summary(&r.b_accept_ms));
            println!(
                "round {round} {:<14} A {:>7.0} tasks/s  B submit->start {b}  (accepted {accept}; \
                 started on its node {})",
                variant.label(),
                r.a_per_s,
                summary(&r.b_began_ms)
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
    let daemons = start_all(dir);
    let socket = daemons.sockets[0].clone();
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
    // Every node fetches and compiles an uploaded plugin ahead of its
    // tasks: the flood starts once each has (a plugin's first task on a
    // node would otherwise wait for its compile, here 130-400 ms).
    for i in 0..nodes() {
        for digest in [&sleeper, &hello] {
            let file = dir
                .join(format!("n{i}-state"))
                .join("plugins")
                .join(format!("{}.wasm", digest.hex()));
            let deadline = Instant::now() + Duration::from_secs(60);
            while !file.exists() {
                assert!(
                    Instant::now() < deadline,
                    "node n{i} never fetched a plugin"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let mut a_clients = Vec::new();
    for socket in &daemons.sockets {
        a_clients.push(client_in(socket, a_ns).await);
    }
    let a = a_clients[0].clone();
    let b = client_in(&socket, b_ns).await;

    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let b_task = (variant != Variant::Alone).then(|| {
        let flooding = Arc::clone(&flooding);
        tokio::spawn(neighbour(b, hello, flooding))
    });
    let started = Instant::now();
    let mut senders = Vec::new();
    for c in 0..A_CLIENTS {
        let a = a_clients[c % a_clients.len()].clone();
        senders.push(tokio::spawn(async move {
            // Pipelined: up to IN_FLIGHT unanswered submissions per client.
            use futures::StreamExt;
            futures::stream::iter((c..flood).step_by(A_CLIENTS))
                .map(|_| {
                    let a = a.clone();
                    async move {
                        let mut request = SubmitRequest::new(sleeper);
                        request.params = vec![("ms".into(), "10".into())];
                        a.submit(request).await.expect("A's submission");
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .collect::<Vec<()>>()
                .await;
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
    let (b_ms, b_accept_ms, b_began_ms) = match b_task {
        Some(task) => task.await.unwrap(),
        None => Default::default(),
    };
    drop(daemons);
    Round {
        a_per_s,
        b_ms,
        b_accept_ms,
        b_began_ms,
    }
}

/// B: one `hello` every 100 ms while A floods; each one's submit → start
/// as seen, → accepted and → started as stamped by the node running it.
async fn neighbour(
    b: Client,
    hello: taskhost::runtime::Digest,
    flooding: Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
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
                let _ = tx.send((id, Instant::now(), event.at_ms));
            }
        }
    });
    let mut sent = std::collections::HashMap::new();
    let mut latencies = Vec::new();
    let mut accepts = Vec::new();
    let mut began = Vec::new();
    let epoch_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3
    };
    let mut tick = tokio::time::interval(B_EVERY);
    while flooding.load(std::sync::atomic::Ordering::SeqCst) {
        tick.tick().await;
        let (at, wall) = (Instant::now(), epoch_ms());
        let submitted = b.submit(SubmitRequest::new(hello)).await.expect("B's");
        accepts.push(at.elapsed().as_secs_f64() * 1e3);
        sent.insert(submitted.id, (at, wall));
        while let Ok((id, seen, at_ms)) = rx.try_recv() {
            if let Some((at, wall)) = sent.remove(&id) {
                latencies.push(seen.duration_since(at).as_secs_f64() * 1e3);
                began.push(at_ms as f64 - wall);
            }
        }
    }
    // The last ones' starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sent.is_empty() && Instant::now() < deadline {
        if let Ok(Some((id, seen, at_ms))) =
            tokio::time::timeout(Duration::from_secs(1), rx.recv()).await
            && let Some((at, wall)) = sent.remove(&id)
        {
            latencies.push(seen.duration_since(at).as_secs_f64() * 1e3);
            began.push(at_ms as f64 - wall);
        }
    }
    (latencies, accepts, began)
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

fn start(dir: &Path, socket: &Path, store: &[&str], name: &str, permits: &str) -> Child {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["serve", "--socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(dir.join(format!("{name}-state")))
        .args(store)
        .args(["--max-concurrent", permits])
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

/// `-- share`: A (weight 1) and B (weight 2) both keep far more sleepers
/// queued than the permits run, for a minute; the attempts each starts.
async fn share(dir: &Path) {
    const WINDOW: Duration = Duration::from_secs(60);
    const BACKLOG: usize = 3_000;
    let daemons = start_all_with(dir, "4");
    let admin = Client::connect(&daemons.sockets[0]).await.expect("connect");
    for (ns, weight) in [("alpha", 1), ("beta", 2)] {
        let change = taskhost::daemon::protocol::NamespaceChange {
            weight: Some(weight),
            ..Default::default()
        };
        admin
            .call(Request::Namespace(
                taskhost::daemon::protocol::NamespaceVerb::Add(ns.to_owned(), change),
            ))
            .await
            .expect("ns add");
    }
    let sleeper = admin
        .ensure_plugin(&std::fs::read(plugin_artifacts::SLEEPER).unwrap())
        .await
        .unwrap();
    // Counting starts by namespace, from an operator's view of all.
    let watcher = Client::connect(&daemons.sockets[0]).await.expect("connect");
    watcher
        .enter(Enter {
            namespace: None,
            all: true,
        })
        .await
        .expect("enter -A");
    let mut events = watcher
        .request(Request::Events {
            follow: true,
            filter: EventFilter {
                task: None,
                kinds: vec![EventKind::AttemptStarting],
            },
        })
        .await
        .expect("events");
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let counts = Arc::new(std::sync::Mutex::new([0u64; 2]));
    {
        let (counting, counts) = (Arc::clone(&counting), Arc::clone(&counts));
        tokio::spawn(async move {
            while let Some(reply) = events.next().await {
                if let Reply::Event(event) = reply
                    && counting.load(std::sync::atomic::Ordering::SeqCst)
                    && let Some(name) = event.name.as_deref()
                {
                    let i = usize::from(name.starts_with("beta/"));
                    counts.lock().unwrap()[i] += 1;
                }
            }
        });
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut feeders = Vec::new();
    for ns in ["alpha", "beta"] {
        for socket in &daemons.sockets {
            let client = client_in(socket, Some(ns)).await;
            let stop = Arc::clone(&stop);
            feeders.push(tokio::spawn(async move {
                // Keep a backlog: submit whenever fewer are unfinished.
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let live = client.list(false).await.map(|r| r.len()).unwrap_or(0);
                    for _ in live..BACKLOG / 2 {
                        let mut request = SubmitRequest::new(sleeper);
                        request.params = vec![("ms".into(), "50".into())];
                        if client.submit(request).await.is_err() {
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }));
        }
    }
    // Both backlogs full before the window opens.
    tokio::time::sleep(Duration::from_secs(5)).await;
    counting.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(WINDOW).await;
    counting.store(false, std::sync::atomic::Ordering::SeqCst);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let [a, b] = *counts.lock().unwrap();
    let share = b as f64 / (a + b).max(1) as f64;
    println!(
        "# fair share, {} (alpha weight 1, beta weight 2), attempts started in {}s: \
         alpha {a}, beta {b}; beta's share {:.3} against 0.667 ({:+.1}%)",
        match nodes() {
            0 => "one host".to_owned(),
            n => format!("{n} nodes"),
        },
        WINDOW.as_secs(),
        share,
        (share / (2.0 / 3.0) - 1.0) * 100.0
    );
    for f in feeders {
        f.abort();
    }
    drop(daemons);
}
