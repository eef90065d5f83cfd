//! Cluster benchmark: `host serve --store postgres://…` nodes on one real
//! PostgreSQL that the benchmark starts itself (as the cluster tests do),
//! driven through the library's `Client`.
//!
//! - throughput with 1, 2 and 3 nodes: 10,000 `hello` submissions (each its
//!   own slot) spread over the nodes by 8 pipelined clients, until every
//!   outcome is recorded; tasks/s, and the share of the CPU time the
//!   database's processes used (this 2-core machine runs everything, so
//!   the point is the overhead and the shape, not scaling);
//! - submit → start across two nodes: a closed loop of 200 submissions of
//!   `hello` through node 1, from the client's send to the attempt's
//!   recorded start (whichever node claimed it): p50, p99;
//! - cancel → stop across nodes: 40 `sleeper`s, each submitted through
//!   node 1, and once running (on either node) canceled through the node
//!   that does not run it: from the cancel's send to the outcome's arrival;
//! - takeover: a restartable `sleeper` running on a node that is killed
//!   (SIGKILL); the time until its next attempt starts on the other node,
//!   against the configured lease;
//! - state: on two nodes, `counter` setting and getting a 64-byte value
//!   500 times from its guest (each write a fenced transaction), and
//!   `fanout` spawning 100 children one after another; p50 and p99 timed
//!   in the guest, as the daemon bench's state scenario does.
//!
//! - batch intake on one node (issue 53): 20,000 `hello` tasks, each its
//!   own slot (run as accepted) and all in one slot (queued: intake
//!   alone), as 20 `SubmitBatch` calls of 1,000 (two in flight) against
//!   as many single submissions from one pipelined client, rounds
//!   alternated; tasks acknowledged (after the commit deciding them) per
//!   second, each round drained before the next.
//!
//! - pages (issue 53): a node whose database keeps 1,000,000 finished
//!   tasks (one `hello` run through the node, its row copied in SQL), the
//!   whole `host` process timed 20 times for `ps --all --limit 50` (the
//!   first page), a page from the middle, `ps`, `slots` and `ns ls`:
//!   medians and maxima.
//!
//! - deploy (issue 54): on three nodes, a new version of `hello` (other
//!   bytes) uploaded and deployed through node 1 until its first task,
//!   submitted by name through node 3, has its output; then on one node,
//!   2,000 `hello` submitted by name against by digest until every
//!   outcome, rounds alternated.
//!
//! - rate accuracy (only when named, `-- rate-accuracy`; a minute): one
//!   slot at 1,000 starts/s with a burst of 10 on three nodes, fed more
//!   than that through all three; the starts the database recorded over a
//!   minute against the rate's, and the most in any second.
//!
//! Run with `cargo bench -p taskhost --bench cluster [-- throughput|latency|takeover|state|batch|pages|deploy]`
//! (`TASKHOST_BENCH_HOST=PATH` runs another build's `host` as the nodes;
//! `TASKHOST_BENCH_SLOT_RULES=1` sets, before the throughput runs, a slot
//! rule that every slot matches and none reaches)
//! (the scenarios whose names contain an argument; all without one).
//! `TASKHOST_BENCH_NODES=1,3` runs the throughput scenario with those
//! numbers of nodes (1, 2 and 3 by default). With
//! `TASKHOST_BENCH_PG_PROFILE=1` the throughput and rate-accuracy runs also
//! print the database's statements (pg_stat_statements): calls and time per
//! task (rate accuracy: every 10 s with `TASKHOST_BENCH_RATE_DEBUG`, which
//! also prints the slot's owners, the dead rows and starts per 5 s), and
//! the batch scenario after each round of batches.
//! `TASKHOST_BENCH_BATCH_SHAPES=one` (or `each`) runs only that shape of
//! the batch scenario, `TASKHOST_BENCH_BATCH_ROUNDS=N` N rounds of it.

#[path = "../../tests/e2e/common/postgres.rs"]
mod postgres;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use taskhost::daemon::Client;
use taskhost::daemon::protocol::{
    BatchItem, DeploymentVerb, MAX_BATCH, Placement, Reply, Request, SubmitRequest, TaskFilter,
    TaskState,
};
use taskhost::runtime::Digest;
use taskhost::supervisor::TaskRef;

/// Submissions of the throughput scenario (`TASKHOST_BENCH_TASKS` to change).
const THROUGHPUT_TASKS: usize = 10_000;
const CLIENTS: usize = 8;
const LATENCY_SAMPLES: usize = 200;
const CANCEL_SAMPLES: usize = 40;
const LEASE: &str = "2s";
const RENEW: &str = "200ms";

struct Node {
    child: Child,
    socket: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(dir: &Path, pg: &postgres::Postgres, name: &str) -> Node {
    start_node_with(dir, pg, name, &[])
}

/// [`start_node`] with more flags.
fn start_node_with(dir: &Path, pg: &postgres::Postgres, name: &str, more: &[&str]) -> Node {
    let socket = dir.join(format!("{name}.sock"));
    let mut child = Command::new(host_binary())
        .args([
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--state-dir",
            dir.join(format!("{name}-state")).to_str().unwrap(),
            "--store",
            &pg.url(),
            "--node-name",
            name,
            "--lease",
            LEASE,
            "--lease-renew",
            RENEW,
            "--max-slot-queue",
            "1000000",
            "--max-total-pending",
            "1000000",
        ])
        .args(more)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start host serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("taskhost daemon listening on") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the node starts listening");
    Node { child, socket }
}

/// The `host` the nodes run: this build's, or `TASKHOST_BENCH_HOST` (a
/// baseline build, to compare side by side with the same harness).
fn host_binary() -> PathBuf {
    std::env::var_os("TASKHOST_BENCH_HOST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_host")))
}

/// CPU seconds (user + system) of a process and its children now running.
fn cpu_of(pids: &[u32]) -> f64 {
    let tick = 100.0;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let f: Vec<&str> = after.split_whitespace().collect();
            let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            (t(11) + t(12)) / tick
        })
        .sum()
}

/// The PostgreSQL server's processes (the postmaster and its children).
fn postgres_pids(pg: &postgres::Postgres) -> Vec<u32> {
    let postmaster = pg.postmaster_pid();
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn now_ms_f() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "# cluster benchmark (lease {LEASE}, renewed every {RENEW}); one PostgreSQL per scenario"
    );
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |name: &str| wanted.is_empty() || wanted.iter().any(|w| name.contains(w.as_str()));
    if run("throughput") {
        let counts = std::env::var("TASKHOST_BENCH_NODES").unwrap_or_else(|_| "1,2,3".into());
        for nodes in counts.split(',').filter_map(|n| n.trim().parse().ok()) {
            throughput(&rt, nodes);
        }
    }
    if run("batch") {
        batch(&rt);
    }
    if run("latency") {
        latencies(&rt);
    }
    if run("takeover") {
        takeover(&rt);
    }
    if run("state") {
        state(&rt);
    }
    if run("pages") {
        pages();
    }
    if run("deploy") {
        deploy(&rt);
    }
    // A minute long: only when asked by name.
    if wanted.iter().any(|w| "rate-accuracy".contains(w.as_str())) {
        rate_accuracy(&rt);
    }
}

/// The rate of the rate-accuracy scenario and its burst.
const RATE: u32 = 1_000;
const RATE_BURST: u32 = 10;

/// One slot with `rate 1000/s, burst 10` (capacity 1,000) on three nodes, fed
/// `hello`s through all three at up to 2,400/s (more than the rate allows,
/// with about 2,000 queued at most) for a minute and five seconds: the attempt
/// starts the database recorded over the minute after the first two
/// seconds, against the rate's 60,000, and the most in any second against
/// rate + burst.
fn rate_accuracy(rt: &tokio::runtime::Runtime) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let secs: u64 = std::env::var("TASKHOST_BENCH_RATE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let pg = if profiling() {
        postgres::Postgres::start_with_settings(
            "-c shared_preload_libraries=pg_stat_statements,auto_explain \
             -c pg_stat_statements.track=all -c auto_explain.log_min_duration=3ms",
        )
    } else {
        postgres::Postgres::start()
    };
    let dir = tempfile::tempdir().unwrap();
    // Every finished task kept, so that the attempts' rows count them all.
    let nodes: Vec<Node> = (1..=3)
        .map(|i| {
            start_node_with(
                dir.path(),
                &pg,
                &format!("n{i}"),
                &["--retain-finished", "1000000"],
            )
        })
        .collect();
    let sockets: Vec<PathBuf> = nodes.iter().map(|n| n.socket.clone()).collect();
    rt.block_on(rated_rule(&sockets[0]));
    if profiling() {
        pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    }
    let queued = AtomicU64::new(0);
    // Fed past the counted minute: the first start waits a period after
    // the nodes joined (their rates are held until all know each other).
    let until = Instant::now() + Duration::from_secs(secs + 5);
    std::thread::scope(|scope| {
        // The slot's queue, read every 100 ms (an index's count): the
        // feeder keeps it under 2,000 (a queue that grows without end
        // makes each decision in the slot read a longer one).
        scope.spawn(|| {
            let mut ticks = 0u64;
            while Instant::now() < until {
                let n = pg.psql("SELECT count(*) FROM taskhost_tasks WHERE state = 'queued'");
                queued.store(n.trim().parse().unwrap_or(0), Ordering::Relaxed);
                ticks += 1;
                if std::env::var_os("TASKHOST_BENCH_RATE_DEBUG").is_some() && ticks.is_multiple_of(100) {
                    let s = pg.psql(
                        "SELECT (SELECT count(*) FROM taskhost_tasks WHERE state = 'running'), \
                         (SELECT count(*) FROM taskhost_attempts), \
                         (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'taskhost_tasks'), \
                         (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'taskhost_tasks'), \
                         (SELECT pg_relation_size('taskhost_owners'))",
                    );
                    println!(
                        "  queued {} running|starts|dead|autovacuums|owners index bytes {}",
                        n.trim(),
                        s.trim()
                    );
                    if profiling() {
                        print_profile(&pg, 1000);
                        pg.psql("SELECT pg_stat_statements_reset()");
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        // Through every node, 800/s each (40 every 50 ms) at most.
        rt.block_on(async {
            let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello");
            let feeders: Vec<_> = sockets
                .iter()
                .map(|socket| {
                    let (socket, hello) = (socket.clone(), hello.clone());
                    let queued = &queued;
                    async move {
                        let client = Client::connect(&socket).await.expect("connect");
                        let digest = client.ensure_plugin(&hello).await.expect("upload");
                        let mut tick = tokio::time::interval(Duration::from_millis(50));
                        while Instant::now() < until {
                            tick.tick().await;
                            if queued.load(Ordering::Relaxed) > 2_000 {
                                continue;
                            }
                            let mut pending = Vec::new();
                            for _ in 0..40 {
                                let mut request = SubmitRequest::new(digest);
                                request.slot = Some("rated".into());
                                let request = Request::Submit(Box::new(request));
                                pending.push(client.request(request).await.expect("submit"));
                            }
                            for mut replies in pending {
                                match replies.next().await {
                                    Some(Reply::Submitted(_)) => {}
                                    other => panic!("submit: {other:?}"),
                                }
                            }
                        }
                    }
                })
                .collect();
            futures::future::join_all(feeders).await;
        });
    });
    let starts: Vec<u64> = pg
        .psql("SELECT started_ms FROM taskhost_attempts WHERE slot = 'rated' ORDER BY started_ms")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let from = starts[0] + 2_000;
    let to = from + secs * 1_000;
    let counted = starts.iter().filter(|t| **t >= from && **t < to).count();
    let expected = (u64::from(RATE) * secs) as f64;
    let (mut lo, mut most) = (0, 0);
    for hi in 0..starts.len() {
        while starts[hi] - starts[lo] >= 1_000 {
            lo += 1;
        }
        most = most.max(hi + 1 - lo);
    }
    let per_node = pg.psql(
        "SELECT node, count(*) FROM taskhost_attempts WHERE slot = 'rated' GROUP BY node ORDER BY node",
    );
    if std::env::var_os("TASKHOST_BENCH_RATE_DEBUG").is_some() {
        let mut by_five = vec![0u32; (secs / 5 + 1) as usize];
        for t in starts.iter().filter(|t| **t >= from && **t < to) {
            by_five[((t - from) / 5_000) as usize] += 1;
        }
        println!("  starts per 5 s: {by_five:?}");
    }
    if profiling() {
        print_profile(&pg, starts.len());
        // The plans of statements slower than 3 ms (auto_explain).
        let log = std::env::temp_dir().join("taskhost-bench-rate-pg.log");
        if std::fs::copy(pg.socket_dir().join("server.log"), &log).is_ok() {
            println!("  slow statements' plans: {}", log.display());
        }
    }
    println!(
        "rate accuracy, 3 nodes: {counted} starts in {secs} s against {expected:.0} ({:+.2}%), \
         at most {most} in any second (rate {RATE} + burst {RATE_BURST}); starts by node: {}",
        (counted as f64 / expected - 1.0) * 100.0,
        per_node
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Sets the rule of the rate-accuracy scenario's slot through `socket`.
async fn rated_rule(socket: &Path) {
    use taskhost::daemon::protocol::{SlotRuleRow, SlotRuleVerb};
    use taskhost::slot_settings::{Rate, SlotSettings};
    let client = Client::connect(socket).await.expect("connect");
    let row = SlotRuleRow {
        pattern: "rated".into(),
        settings: SlotSettings {
            capacity: Some(1000),
            rate: Some(Rate {
                starts: RATE,
                per: Duration::from_secs(1),
            }),
            burst: Some(RATE_BURST),
            ..SlotSettings::default()
        },
    };
    let mut replies = client
        .request(Request::SlotRule(SlotRuleVerb::Set(row)))
        .await
        .expect("slot rule");
    assert!(matches!(replies.next().await, Some(Reply::SlotRule(_))));
}

/// Guests' key-value calls and child spawns on a cluster, timed in the
/// guest.
fn state(rt: &tokio::runtime::Runtime) {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let n1 = start_node(dir.path(), &pg, "n1");
    let _n2 = start_node(dir.path(), &pg, "n2");
    rt.block_on(async {
        let client = Client::connect(&n1.socket).await.expect("connect n1");
        for (what, plugin, key, value) in [
            ("key-value", plugin_artifacts::COUNTER, "bench", "500"),
            ("children", plugin_artifacts::FANOUT, "bench", "100"),
        ] {
            let bytes = std::fs::read(plugin).expect("the plugin");
            let digest = client.ensure_plugin(&bytes).await.expect("upload");
            let mut request = SubmitRequest::new(digest);
            request.params = vec![(key.into(), value.into())];
            let submitted = client.submit(request).await.expect("submit");
            let report = client.wait(TaskRef::Id(submitted.id)).await.expect("wait");
            match report.outcome {
                taskhost::outcome::TaskOutcome::Completed { output } => {
                    println!(
                        "state: postgres: {what}: {}",
                        String::from_utf8_lossy(&output)
                    );
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    });
}

/// Whether to profile the database's statements.
fn profiling() -> bool {
    std::env::var_os("TASKHOST_BENCH_PG_PROFILE").is_some_and(|v| v == "1")
}

/// The statements the database ran most time on, per task: calls, time,
/// rows and buffers touched (shared blocks hit or read, dirtied).
fn print_profile(pg: &postgres::Postgres, tasks: usize) {
    let rows = pg.psql(
        "SELECT calls, round(total_exec_time::numeric, 1), rows, \
         shared_blks_hit + shared_blks_read, shared_blks_dirtied, wal_records, \
         regexp_replace(left(query, 90), '\\s+', ' ', 'g') FROM pg_stat_statements \
         WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 25",
    );
    let total = pg.psql(
        "SELECT sum(calls), round(sum(total_exec_time)::numeric, 1), \
         sum(shared_blks_hit + shared_blks_read), sum(wal_records) FROM pg_stat_statements",
    );
    println!(
        "  database profile ({tasks} tasks; all: calls|ms|buffers|WAL records {}); per task: \
         calls, ms, rows, buffers, dirtied, WAL records; statement",
        total.trim()
    );
    let tables = pg.psql(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables \
         WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname",
    );
    println!(
        "  tables (inserted, updated, of them HOT, deleted): {}",
        tables.trim().replace('\n', "; ")
    );
    let per = |v: &str| v.parse::<f64>().unwrap_or(0.0) / tasks as f64;
    for row in rows.lines() {
        let f: Vec<&str> = row.splitn(7, '|').collect();
        if f.len() == 7 {
            println!(
                "  {:>5.2} {:>6.3} {:>5.2} {:>6.1} {:>5.2} {:>5.1}  {}",
                per(f[0]),
                per(f[1]),
                per(f[2]),
                per(f[3]),
                per(f[4]),
                per(f[5]),
                f[6]
            );
        }
    }
}

/// A rule that every slot matches (a glob) and none reaches: capacity
/// 1,000, a queue of 1,000,000 of its own, and a rate of 1,000,000/s with
/// a burst of 1,000 (each node's share asked before every attempt).
async fn slot_rule_for_all(socket: &Path) {
    use taskhost::daemon::protocol::{SlotRuleRow, SlotRuleVerb};
    use taskhost::slot_settings::{Rate, SlotSettings};
    let client = Client::connect(socket).await.expect("connect");
    let settings = SlotSettings {
        capacity: Some(1000),
        max_queue: Some(1_000_000),
        rate: Some(Rate {
            starts: 1_000_000,
            per: Duration::from_secs(1),
        }),
        burst: Some(1000),
        ..SlotSettings::default()
    };
    let row = SlotRuleRow {
        pattern: "*".into(),
        settings,
    };
    let mut replies = client
        .request(Request::SlotRule(SlotRuleVerb::Set(row)))
        .await
        .expect("slot rule");
    match replies.next().await {
        Some(Reply::SlotRule(_)) => {}
        other => panic!("slot rule: {other:?}"),
    }
}

fn throughput(rt: &tokio::runtime::Runtime, count: usize) {
    let pg = if profiling() {
        postgres::Postgres::start_with_settings(
            "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all",
        )
    } else {
        postgres::Postgres::start()
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Node> = (1..=count)
        .map(|i| start_node(dir.path(), &pg, &format!("n{i}")))
        .collect();
    let sockets: Vec<PathBuf> = nodes.iter().map(|n| n.socket.clone()).collect();
    let node_pids: Vec<u32> = nodes.iter().map(|n| n.child.id()).collect();
    if std::env::var_os("TASKHOST_BENCH_SLOT_RULES").is_some() {
        rt.block_on(slot_rule_for_all(&sockets[0]));
    }
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello");
    let tasks = std::env::var("TASKHOST_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(THROUGHPUT_TASKS);
    // Warm: the plugin uploaded, fetched and compiled by every node (each
    // runs a few of the warm-up's tasks), outside the timed part.
    rt.block_on(async {
        for socket in &sockets {
            let client = Client::connect(socket).await.expect("connect");
            let digest = client.ensure_plugin(&hello).await.expect("upload");
            let mut ids = Vec::new();
            for _ in 0..16 {
                ids.push(
                    client
                        .submit(SubmitRequest::new(digest))
                        .await
                        .expect("submit")
                        .id,
                );
            }
            for id in ids {
                client.wait(TaskRef::Id(id)).await.expect("wait");
            }
        }
    });
    if profiling() {
        pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        pg.psql("SELECT pg_stat_statements_reset()");
    }
    let pg_pids = postgres_pids(&pg);
    let (pg_before, nodes_before) = (cpu_of(&pg_pids), cpu_of(&node_pids));
    let started = Instant::now();
    let ids: Vec<u64> = rt.block_on(async {
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let socket = sockets[c % sockets.len()].clone();
            let hello = hello.clone();
            clients.push(tokio::spawn(async move {
                let client = Client::connect(&socket).await.expect("connect");
                let digest = client.ensure_plugin(&hello).await.expect("upload");
                let mut pending = Vec::new();
                for _ in 0..tasks / CLIENTS {
                    pending.push(
                        client
                            .request(Request::Submit(Box::new(SubmitRequest::new(digest))))
                            .await
                            .expect("submit"),
                    );
                }
                let mut ids = Vec::new();
                for mut replies in pending {
                    match replies.next().await {
                        Some(Reply::Submitted(s)) => ids.push(s.id.get()),
                        other => panic!("submit: {other:?}"),
                    }
                }
                ids
            }));
        }
        let mut ids = Vec::new();
        for c in clients {
            ids.extend(c.await.expect("client"));
        }
        ids
    });
    let accepted = started.elapsed();
    loop {
        // Through the partial indexes of the unfinished states (a count
        // of every row would cost the database more than a task).
        let left = pg.psql(
            "SELECT (SELECT count(*) FROM taskhost_tasks WHERE state = 'queued') \
             + (SELECT count(*) FROM taskhost_tasks WHERE state = 'ready') \
             + (SELECT count(*) FROM taskhost_tasks WHERE state IN ('running', 'stopping'))",
        );
        if left.trim() == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    // The pool's backends started during the run: count them all now.
    let (pg_cpu, nodes_cpu) = (
        cpu_of(&postgres_pids(&pg)) - pg_before,
        cpu_of(&node_pids) - nodes_before,
    );
    println!(
        "throughput, {count} node(s): {} tasks in {:.2} s: {:.0} tasks/s (accepted in {:.2} s: \
         {:.0} submissions/s); CPU: database {:.2} s, nodes {:.2} s (database {:.0}% of both)",
        ids.len(),
        took.as_secs_f64(),
        ids.len() as f64 / took.as_secs_f64(),
        accepted.as_secs_f64(),
        ids.len() as f64 / accepted.as_secs_f64(),
        pg_cpu,
        nodes_cpu,
        100.0 * pg_cpu / (pg_cpu + nodes_cpu).max(1e-9),
    );
    println!(
        "  database CPU per task: {:.3} ms",
        1000.0 * pg_cpu / ids.len().max(1) as f64
    );
    if profiling() {
        print_profile(&pg, ids.len());
    }
}

fn latencies(rt: &tokio::runtime::Runtime) {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let n1 = start_node(dir.path(), &pg, "n1");
    let n2 = start_node(dir.path(), &pg, "n2");
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello");
    let sleeper = std::fs::read(plugin_artifacts::path("sleeper")).expect("sleeper");
    let (starts, cancels) = rt.block_on(async {
        let c1 = Client::connect(&n1.socket).await.expect("connect n1");
        let c2 = Client::connect(&n2.socket).await.expect("connect n2");
        let h = c1.ensure_plugin(&hello).await.expect("upload");
        let s = c1.ensure_plugin(&sleeper).await.expect("upload");
        let mut starts = Vec::new();
        for _ in 0..LATENCY_SAMPLES {
            let sent = now_ms_f();
            let submitted = c1.submit(SubmitRequest::new(h)).await.expect("submit");
            c1.wait(TaskRef::Id(submitted.id)).await.expect("wait");
            let started: f64 = pg
                .psql(&format!(
                    "SELECT started_ms FROM taskhost_attempts WHERE task_id = {}",
                    submitted.id
                ))
                .trim()
                .parse()
                .expect("a recorded start");
            starts.push((started - sent).max(0.0));
        }
        let mut cancels = Vec::new();
        for _ in 0..CANCEL_SAMPLES {
            let mut request = SubmitRequest::new(s);
            request.params = vec![("ms".into(), "60000".into())];
            let submitted = c1.submit(request).await.expect("submit");
            assert!(matches!(submitted.placement, Placement::Running));
            // Running on which node? Cancel through the other one.
            let on = loop {
                let row = pg.psql(&format!(
                    "SELECT n.name FROM taskhost_attempts a JOIN taskhost_nodes n ON n.id = a.node \
                     WHERE a.task_id = {}",
                    submitted.id
                ));
                if !row.trim().is_empty() {
                    break row.trim().to_owned();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            let via = if on == "n1" { &c2 } else { &c1 };
            let sent = Instant::now();
            let reply = via
                .call(Request::Cancel {
                    target: TaskRef::Id(submitted.id),
                    wait: true,
                })
                .await
                .expect("cancel");
            assert!(matches!(reply, Reply::Canceled { .. }), "{reply:?}");
            cancels.push(sent.elapsed().as_secs_f64() * 1000.0);
        }
        (starts, cancels)
    });
    drop((n1, n2));
    let report = |what: &str, mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        println!(
            "{what}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
            percentile(&v, 0.5),
            percentile(&v, 0.99),
            v.last().copied().unwrap_or(f64::NAN),
            v.len()
        );
    };
    report("submit → start, 2 nodes (ms resolution)", starts);
    report("cancel → stop through the other node", cancels);
}

fn takeover(rt: &tokio::runtime::Runtime) {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let mut a = start_node(dir.path(), &pg, "a");
    let sleeper = std::fs::read(plugin_artifacts::path("sleeper")).expect("sleeper");
    let id = rt.block_on(async {
        let client = Client::connect(&a.socket).await.expect("connect");
        let s = client.ensure_plugin(&sleeper).await.expect("upload");
        let mut request = SubmitRequest::new(s);
        request.params = vec![("ms".into(), "60000".into())];
        request.restart = Some(taskhost::supervisor::RestartPolicy::OnFailure);
        request.backoff = Some("10ms".parse().expect("a backoff"));
        client.submit(request).await.expect("submit").id
    });
    let attempts = || {
        pg.psql(&format!(
            "SELECT count(*) FROM taskhost_attempts WHERE task_id = {id}"
        ))
        .trim()
        .parse::<u32>()
        .unwrap_or(0)
    };
    while attempts() < 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _b = start_node(dir.path(), &pg, "b");
    let killed = Instant::now();
    let _ = a.child.kill();
    let _ = a.child.wait();
    while attempts() < 2 {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "never taken over"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "takeover after SIGKILL: the next attempt started {:.0} ms after the kill (lease {LEASE}, \
         renewed every {RENEW})",
        killed.elapsed().as_secs_f64() * 1000.0
    );
}

/// Rounds of the batch scenario, and its tasks per round.
const BATCH_ROUNDS: usize = 3;
const BATCH_TASKS: usize = 20_000;

/// Batch intake on one node against single submissions (see the module
/// docs).
fn batch(rt: &tokio::runtime::Runtime) {
    let pg = if profiling() {
        postgres::Postgres::start_with_settings(
            "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all",
        )
    } else {
        postgres::Postgres::start()
    };
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &pg, "n1");
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello");
    let unfinished = || {
        pg.psql(
            "SELECT (SELECT count(*) FROM taskhost_tasks WHERE state = 'queued') \
             + (SELECT count(*) FROM taskhost_tasks WHERE state = 'ready') \
             + (SELECT count(*) FROM taskhost_tasks WHERE state IN ('running', 'stopping'))",
        )
    };
    let drain = || {
        while unfinished().trim() != "0" {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let client = rt.block_on(Client::connect(&node.socket)).expect("connect");
    let digest = rt.block_on(client.ensure_plugin(&hello)).expect("upload");
    let one = |slot: Option<&str>| {
        let mut request = SubmitRequest::new(digest);
        request.input = b"hi".to_vec();
        request.slot = slot.map(str::to_owned);
        request
    };
    let batched = |calls: usize, slot: Option<&str>| {
        rt.block_on(async {
            let started = Instant::now();
            let mut in_flight = std::collections::VecDeque::new();
            let mut accepted = 0;
            let answer = |mut replies: taskhost::daemon::Replies| async move {
                match replies.next().await {
                    Some(Reply::SubmittedBatch(items)) => items
                        .iter()
                        .filter(|i| matches!(i, BatchItem::Submitted(_)))
                        .count(),
                    other => panic!("batch: {other:?}"),
                }
            };
            for _ in 0..calls {
                if in_flight.len() == 2 {
                    accepted += answer(in_flight.pop_front().unwrap()).await;
                }
                let requests = (0..MAX_BATCH).map(|_| one(slot)).collect();
                in_flight.push_back(
                    client
                        .request(Request::SubmitBatch(requests))
                        .await
                        .unwrap(),
                );
            }
            for replies in in_flight {
                accepted += answer(replies).await;
            }
            accepted as f64 / started.elapsed().as_secs_f64()
        })
    };
    let single = |count: usize, slot: Option<&str>| {
        rt.block_on(async {
            let started = Instant::now();
            let mut pending = Vec::with_capacity(count);
            for _ in 0..count {
                pending.push(
                    client
                        .request(Request::Submit(Box::new(one(slot))))
                        .await
                        .unwrap(),
                );
            }
            for mut replies in pending {
                assert!(matches!(replies.next().await, Some(Reply::Submitted(_))));
            }
            count as f64 / started.elapsed().as_secs_f64()
        })
    };
    // Warm: compiled, pools filled.
    batched(2, None);
    single(2_000, None);
    drain();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Each its own slot: every task is claimed and runs as it is
    // accepted, on the same cores; one slot: they queue behind its
    // owner, intake alone.
    if profiling() {
        pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    }
    let shapes = std::env::var("TASKHOST_BENCH_BATCH_SHAPES").unwrap_or_default();
    for (slot, what) in [
        (None, "each its own slot"),
        (Some("one"), "all queued in one slot"),
    ] {
        let short = if slot.is_some() { "one" } else { "each" };
        if !shapes.is_empty() && !shapes.split(',').any(|s| s == short) {
            continue;
        }
        let (mut b, mut s1) = (Vec::new(), Vec::new());
        let rounds: usize = std::env::var("TASKHOST_BENCH_BATCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(BATCH_ROUNDS);
        for round in 1..=rounds {
            for first in [round % 2 == 0, round % 2 == 1] {
                let cpu = || (cpu_of(&postgres_pids(&pg)), cpu_of(&[node.child.id()]));
                let (db_before, node_before) = cpu();
                let rate = if first {
                    if profiling() {
                        pg.psql("SELECT pg_stat_statements_reset()");
                    }
                    let rate = batched(BATCH_TASKS / MAX_BATCH, slot);
                    if profiling() {
                        print_profile(&pg, BATCH_TASKS);
                    }
                    rate
                } else {
                    single(BATCH_TASKS, slot)
                };
                let (db_after, node_after) = cpu();
                let per_k = |secs: f64| secs * 1e6 / BATCH_TASKS as f64;
                let (db_ms, node_ms) =
                    (per_k(db_after - db_before), per_k(node_after - node_before));
                if slot.is_some() {
                    // The queue is not run through: canceled at once.
                    let filter = TaskFilter {
                        state: Some(TaskState::Queued),
                        ..TaskFilter::default()
                    };
                    let cancel = Request::CancelMatching {
                        filter,
                        dry_run: false,
                    };
                    let start = Instant::now();
                    let reply = rt.block_on(client.call(cancel)).expect("cancel the queue");
                    let ms = start.elapsed().as_secs_f64() * 1000.0;
                    if let Reply::Matched { count, acted, .. } = reply {
                        println!(
                            "  round {round}: one CancelMatching stopped {acted} of {count} queued tasks in {ms:.0} ms"
                        );
                    }
                }
                drain();
                let which = if first {
                    "batches of 1,000"
                } else {
                    "single submissions"
                };
                println!(
                    "  round {round}: one node, {what}: {which}: {rate:.0} tasks/s accepted \
                     (CPU per 1,000: database {db_ms:.0} ms, node {node_ms:.0} ms)"
                );
                if first { b.push(rate) } else { s1.push(rate) }
            }
        }
        let (mb, ms) = (median(&mut b), median(&mut s1));
        println!(
            "batch intake, one node, {BATCH_TASKS} tasks, {what}: batches of {MAX_BATCH} median {mb:.0} tasks/s (min {:.0}); single submissions, 1 pipelined client: median {ms:.0} /s; batch/single {:.2}x",
            b[0],
            mb / ms
        );
    }
    drop(node);
}

/// Finished tasks the pages scenario keeps.
const KEPT: u64 = 1_000_000;

/// `host` verbs on a node whose database keeps [`KEPT`] finished tasks.
fn pages() {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let node = start_node_with(dir.path(), &pg, "n1", &["--retain-finished", "2000000"]);
    let host = |args: &[&str]| {
        let out = Command::new(host_binary())
            .arg("--socket")
            .arg(&node.socket)
            .args(args)
            .output()
            .expect("run host");
        assert!(out.status.success(), "host {args:?}: {out:?}");
    };
    host(&["submit", plugin_artifacts::HELLO, "--wait", "--input", "x"]);
    // Every column but the generated ones, the id, name and slot from
    // the series: the million rows are copies of that one finished task.
    let columns = pg.psql(
        "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) \
         FROM information_schema.columns \
         WHERE table_name = 'taskhost_tasks' AND is_generated = 'NEVER'",
    );
    let columns = columns.trim();
    let values: Vec<&str> = columns
        .split(',')
        .map(|c| match c {
            "id" => "g",
            "name" | "slot" => "'hello-' || g",
            other => other,
        })
        .collect();
    let filled = Instant::now();
    pg.psql(&format!(
        "INSERT INTO taskhost_tasks ({columns}) SELECT {} FROM taskhost_tasks, \
         generate_series(1000, {}) g WHERE id = 1",
        values.join(","),
        999 + KEPT
    ));
    pg.psql("VACUUM ANALYZE taskhost_tasks");
    println!(
        "  {KEPT} finished tasks copied in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let middle = (KEPT / 2).to_string();
    for args in [
        &["ps", "--all", "--limit", "50"][..],
        &["ps", "--all", "--limit", "50", "--before", &middle],
        &["ps"],
        &["slots"],
        &["ns", "ls"],
    ] {
        let mut ms: Vec<f64> = (0..20)
            .map(|_| {
                let start = Instant::now();
                host(args);
                start.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "pages, {KEPT} finished tasks kept: host {}: median {:.1} ms (max {:.1})",
            args.join(" "),
            percentile(&ms, 0.5),
            ms[ms.len() - 1]
        );
    }
}

/// Rounds of the deploy scenario, and its submissions per shape and round
/// in the by-name against by-digest part.
const DEPLOY_ROUNDS: usize = 5;
const BY_NAME_TASKS: usize = 2_000;
const BY_NAME_ROUNDS: usize = 5;

/// `hello` with a custom section naming `round` at its end: other bytes,
/// so another digest that each node fetches and compiles, the same code.
fn hello_variant(hello: &[u8], round: usize) -> Vec<u8> {
    let name = b"taskhost-bench-round";
    let payload = round.to_string();
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(payload.as_bytes());
    let mut bytes = hello.to_vec();
    bytes.push(0); // a custom section
    bytes.push(body.len() as u8);
    bytes.extend_from_slice(&body);
    bytes
}

/// Issue 54: on three nodes, a new version deployed through node 1 until
/// its first task, submitted by name through node 3, has its output (the
/// node fetching and compiling the new plugin included); then on one node,
/// `hello` submitted by name against by digest, rounds alternated.
fn deploy(rt: &tokio::runtime::Runtime) {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Node> = (1..=3)
        .map(|i| start_node(dir.path(), &pg, &format!("n{i}")))
        .collect();
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello");
    let (first, last) = (nodes[0].socket.clone(), nodes[2].socket.clone());
    let mut took = Vec::new();
    rt.block_on(async {
        let one = Client::connect(&first).await.expect("connect");
        let three = Client::connect(&last).await.expect("connect");
        for round in 0..=DEPLOY_ROUNDS {
            let bytes = hello_variant(&hello, round);
            let started = Instant::now();
            let digest = one.ensure_plugin(&bytes).await.expect("upload");
            one.deployment(DeploymentVerb::Deploy {
                digest,
                name: Some("bench".into()),
                version: Some(round.to_string()),
            })
            .await
            .expect("deploy");
            let mut request = SubmitRequest::new(Digest([0; 32]));
            request.deployment = Some("bench".into());
            request.input = round.to_string().into_bytes();
            let id = three.submit(request).await.expect("submit").id;
            let report = three.wait(TaskRef::Id(id)).await.expect("wait");
            assert_eq!(
                report.outcome,
                taskhost::outcome::TaskOutcome::Completed {
                    output: round.to_string().into_bytes()
                }
            );
            // Round 0 only puts the name there.
            if round > 0 {
                took.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
    });
    let rounds: Vec<String> = took.iter().map(|ms| format!("{ms:.0}")).collect();
    took.sort_by(f64::total_cmp);
    println!(
        "deploy → first task on the new version, three nodes: median {:.0} ms, max {:.0} ms \
         ({DEPLOY_ROUNDS} rounds: upload and deploy through node 1, submit by name and wait \
         through node 3; each: {} ms)",
        percentile(&took, 0.5),
        took.last().copied().unwrap_or_default(),
        rounds.join(", ")
    );
    drop(nodes);
    // By name against by digest, on one node.
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), &pg, "n1");
    let (mut by_name, mut by_digest) = (Vec::new(), Vec::new());
    rt.block_on(async {
        let client = Client::connect(&node.socket).await.expect("connect");
        let digest = client.ensure_plugin(&hello).await.expect("upload");
        client
            .deployment(DeploymentVerb::Deploy {
                digest,
                name: Some("bench".into()),
                version: Some("1".into()),
            })
            .await
            .expect("deploy");
        for round in 0..2 + 2 * BY_NAME_ROUNDS {
            let named = round % 2 == 1;
            let started = Instant::now();
            let mut pending = Vec::new();
            for _ in 0..BY_NAME_TASKS {
                let mut request = SubmitRequest::new(digest);
                if named {
                    request.plugin = Digest([0; 32]);
                    request.deployment = Some("bench".into());
                }
                pending.push(
                    client
                        .request(Request::Submit(Box::new(request)))
                        .await
                        .expect("submit"),
                );
            }
            let mut ids = Vec::new();
            for mut replies in pending {
                match replies.next().await {
                    Some(Reply::Submitted(s)) => ids.push(s.id),
                    other => panic!("submit: {other:?}"),
                }
            }
            for id in ids {
                client.wait(TaskRef::Id(id)).await.expect("wait");
            }
            let rate = BY_NAME_TASKS as f64 / started.elapsed().as_secs_f64();
            if round >= 2 {
                if named {
                    by_name.push(rate);
                } else {
                    by_digest.push(rate);
                }
            }
        }
    });
    by_name.sort_by(f64::total_cmp);
    by_digest.sort_by(f64::total_cmp);
    let (name, digest) = (percentile(&by_name, 0.5), percentile(&by_digest, 0.5));
    println!(
        "submit → outcome of {BY_NAME_TASKS} hello, one node: by name {name:.0} tasks/s, by digest \
         {digest:.0} tasks/s (by name {:.3}x; medians of {BY_NAME_ROUNDS} rounds each, \
         alternated, after a warm-up pair)",
        name / digest
    );
}
