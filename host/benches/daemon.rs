//! Daemon benchmark: the release `host serve` on a temporary socket, driven
//! through the wire protocol (`taskhost::daemon::protocol`) by clients in
//! this process.
//!
//! - intake, one pipelined client: 10,000 fire-and-forget `Submit`s of
//!   `hello` (no name, so each has its own slot) written without waiting,
//!   replies read by a separate task; submissions acknowledged per second.
//! - intake, 8 concurrent pipelined clients sharing the 10,000.
//! - submit-to-outcome latency of `hello` in a closed loop on one connection
//!   (`Submit`, then `Wait` for its report), 1,000 iterations: median, p99.
//! - CPU per submission: the CPU time the daemon's threads and the
//!   clients used over each 8-client intake round and its drain, divided by
//!   the submissions (whether intake is bound by the machine's two cores).
//!
//! Each runs against the memory store and the durable SQLite store side by
//! side (rounds interleaved), both on two worker threads, and against the
//! memory store on one worker thread (how intake scales with the daemon's
//! workers); then the durable store's restart with
//! 10,000 queued submissions after SIGKILL: how soon it accepts again.
//!
//! Between rounds the daemon drains (no slot left), so rounds don't overlap.
//! Run with `cargo bench -p taskhost --bench daemon`. Prints every round and
//! the median over rounds, because this machine is shared and noisy.
//! Last, head-of-line blocking by compiles: the closed-loop latency of
//! `hello` on the memory store, quiet and while another client uploads
//! distinct copies of a large component (the Python example, 18 MiB, each
//! copy with its own custom section so that each is compiled afresh) one
//! after the other. Before it, 10,000 parked `sleeper`s in one memory
//! daemon: their RSS per task, and how soon every waiter has its report
//! after a shutdown that cancels them all.
//!
//! Then the remote scenario: one memory daemon with `--http` on loopback,
//! driven through the library's `Client` over its socket and over HTTP
//! (the upgrade `host --remote` uses), side by side: closed-loop
//! submit-to-outcome latency and 8-client pipelined intake.
//!
//! `TASKHOST_BENCH_INTAKE_ONLY=1` runs intake and latency alone;
//! `TASKHOST_BENCH_ONLY_RESTART=1` runs only the restart scenario;
//! `TASKHOST_BENCH_ONLY_REMOTE=1` only the remote one;
//! `TASKHOST_BENCH_ONLY_PARKED=1` only the parked one;
//! `TASKHOST_BENCH_ONLY_GUESTS=1` only the guest attempts (the Python and
//! JavaScript examples, one task after another, each attempt's own time);
//! `TASKHOST_BENCH_ONLY_STATE=1` only the state scenario (on each store,
//! `counter` setting and getting a 64-byte value 2,000 times from its
//! guest, each call timed there; `fanout` spawning 300 children one after
//! another, each answering the wall-clock time it started: p50 and p99 of
//! the spawn call and of spawn → start);
//! `TASKHOST_BENCH_ONLY_HISTORY=1` only the history scenario (SQLite
//! daemons keeping a million finished tasks and keeping none, side by
//! side: resident memory, intake and latency empty and full, the first
//! page, the restart after SIGKILL; `TASKHOST_BENCH_HISTORY_TASKS=N`);
//! `TASKHOST_BENCH_ONLY_COMPILES=1` only the compile scenario
//! (`TASKHOST_BENCH_LARGE=PATH` names another large component for it);
//! `TASKHOST_BENCH_SLOT_RULES=1` adds both stores with a slot rule that
//! matches every slot and never binds (capacity 1,000, a rate of
//! 1,000,000/s with a burst of 1,000);
//! `TASKHOST_BENCH_BASELINE_HOST=PATH` adds the memory and sqlite stores of
//! another `host` build (same protocol) to the same run, as a before/after
//! baseline.

#[path = "common/guests.rs"]
mod guests;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use taskhost::daemon::protocol::{
    BatchItem, Envelope, Hello, MAGIC, MAX_BATCH, PROTOCOL_VERSION, Placement, Reply, Request,
    SubmitRequest, Submitted, TaskFilter, TaskPage, TaskState, UPLOAD_CHUNK, Welcome, encode,
    read_frame, write_frame,
};
use taskhost::outcome::TaskOutcome;
use taskhost::runtime::Digest;
use taskhost::supervisor::TaskRef;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

const SUBMISSIONS: usize = 10_000;
const CLIENTS: usize = 8;
const LATENCY_ITERATIONS: usize = 1_000;
const INTAKE_ROUNDS: usize = 5;
const LATENCY_ROUNDS: usize = 3;

/// The stores compared side by side: the memory store (nothing survives)
/// and the durable SQLite store (acknowledged = committed).
const STORES: [&str; 2] = ["memory", "sqlite"];
/// Queued submissions in the restart scenario.
const RESTART_QUEUED: usize = 10_000;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    // TASKHOST_BENCH_ONLY_…=1 runs one scenario alone.
    let only = [
        "RESTART", "COMPILES", "PARKED", "REMOTE", "GUESTS", "STATE", "BATCH", "PAGES", "HISTORY",
    ]
    .into_iter()
    .find(|s| std::env::var_os(format!("TASKHOST_BENCH_ONLY_{s}")).is_some());
    if let Some(scenario) = only {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match scenario {
            "RESTART" => rt.block_on(restart_with_queued(dir.path())),
            "COMPILES" => rt.block_on(compiles(dir.path())),
            "REMOTE" => rt.block_on(remote(dir.path())),
            "GUESTS" => rt.block_on(guest_attempts(dir.path())),
            "STATE" => rt.block_on(state(dir.path())),
            "BATCH" => rt.block_on(batch(dir.path())),
            "PAGES" => rt.block_on(pages(dir.path())),
            "HISTORY" => rt.block_on(history(dir.path())),
            _ => rt.block_on(parked(dir.path())),
        }
        return;
    }
    // The daemons side by side: each store, and with
    // TASKHOST_BENCH_BASELINE_HOST=PATH both stores of another build
    // (same protocol) as a before/after baseline in the same run.
    let baseline = std::env::var_os("TASKHOST_BENCH_BASELINE_HOST").map(std::path::PathBuf::from);
    let mut labels: Vec<String> = STORES.iter().map(|s| s.to_string()).collect();
    let mut daemons = Vec::new();
    for store in STORES {
        let socket = dir.path().join(format!("{store}.sock"));
        let host = Path::new(env!("CARGO_BIN_EXE_host"));
        let child = start_daemon(
            host,
            &socket,
            &dir.path().join(format!("{store}-state")),
            store,
            &["--worker-threads", "2"],
        );
        daemons.push((store.to_string(), socket, child));
    }
    // The memory store again on one worker thread: how intake scales with
    // the daemon's workers (--worker-threads) on this machine.
    {
        let label = "memory@1-worker".to_string();
        let socket = dir.path().join("one-worker.sock");
        let host = Path::new(env!("CARGO_BIN_EXE_host"));
        let child = start_daemon(
            host,
            &socket,
            &dir.path().join("one-worker-state"),
            "memory",
            &["--worker-threads", "1"],
        );
        labels.push(label.clone());
        daemons.push((label, socket, child));
    }
    // TASKHOST_BENCH_SLOT_RULES=1: both stores again with a slot rule
    // matching every slot (a glob, so each new slot's lookup walks it)
    // whose capacity and rate never bind here (each attempt still asks
    // its slot's budget).
    if std::env::var_os("TASKHOST_BENCH_SLOT_RULES").is_some() {
        let config = dir.path().join("slot-rules.toml");
        std::fs::write(
            &config,
            "[slots.\"*\"]\ncapacity = 1000\nmax_queue = 1000\nrate = \"1000000/s\"\nburst = 1000\n",
        )
        .unwrap();
        for store in STORES {
            let label = format!("{store}+rules");
            let socket = dir.path().join(format!("rules-{store}.sock"));
            let host = Path::new(env!("CARGO_BIN_EXE_host"));
            let child = start_daemon(
                host,
                &socket,
                &dir.path().join(format!("rules-{store}-state")),
                store,
                &[
                    "--worker-threads",
                    "2",
                    "--config",
                    config.to_str().unwrap(),
                ],
            );
            labels.push(label.clone());
            daemons.push((label, socket, child));
        }
    }
    if let Some(host) = &baseline {
        for store in STORES {
            let label = format!("{store}@baseline");
            let socket = dir.path().join(format!("baseline-{store}.sock"));
            let child = start_daemon(
                host,
                &socket,
                &dir.path().join(format!("baseline-{store}-state")),
                store,
                &["--worker-threads", "2"],
            );
            labels.push(label.clone());
            daemons.push((label, socket, child));
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
        println!(
            "# daemon benchmark: {SUBMISSIONS} submissions of hello per intake round, \
             {INTAKE_ROUNDS} rounds; {LATENCY_ITERATIONS} closed-loop submit+wait per latency round, \
             {LATENCY_ROUNDS} rounds; {labels:?} side by side, rounds interleaved"
        );
        let mut digest = None;
        for (store, socket, child) in &daemons {
            digest = Some(upload(socket, &hello).await);
            println!("{store}: daemon resident memory after the upload: {}", rss(child.id()));
            // Warm up: compile, pool slots, the daemon's allocations.
            intake(socket, digest.unwrap(), 1, 2_000).await;
            drain(socket).await;
            latency(socket, digest.unwrap(), 200).await;
        }
        let digest = digest.unwrap();

        let mut one = vec![Vec::new(); labels.len()];
        let mut many = vec![Vec::new(); labels.len()];
        // CPU time per submission (intake and drain, 8 clients): the
        // daemon's threads, and this process's (the clients).
        let mut cpu = vec![Vec::new(); labels.len()];
        let mut client_cpu = vec![Vec::new(); labels.len()];
        for round in 1..=INTAKE_ROUNDS {
            for (i, (store, socket, child)) in daemons.iter().enumerate() {
                for (clients, rates) in [(1, &mut one[i]), (CLIENTS, &mut many[i])] {
                    let (daemon_before, own_before) = (cpu_time(child.id()), cpu_time(std::process::id()));
                    let rate = intake(socket, digest, clients, SUBMISSIONS).await;
                    let drained = drain(socket).await;
                    let per_task = |before: Duration, pid: u32| {
                        (cpu_time(pid).saturating_sub(before)).as_secs_f64() * 1e6 / SUBMISSIONS as f64
                    };
                    let (daemon_us, client_us) =
                        (per_task(daemon_before, child.id()), per_task(own_before, std::process::id()));
                    println!(
                        "  round {round}: {store}: {clients} pipelined client(s): {rate:.0} submissions/s (drained in {:.0} ms; CPU per submission: daemon {daemon_us:.1} µs, clients {client_us:.1} µs)",
                        drained.as_secs_f64() * 1e3
                    );
                    rates.push(rate);
                    if clients == CLIENTS {
                        cpu[i].push(daemon_us);
                        client_cpu[i].push(client_us);
                    }
                }
            }
        }
        let mut p50 = vec![Vec::new(); labels.len()];
        let mut p99 = vec![Vec::new(); labels.len()];
        for round in 1..=LATENCY_ROUNDS {
            for (i, (store, socket, _)) in daemons.iter().enumerate() {
                let mut samples = latency(socket, digest, LATENCY_ITERATIONS).await;
                samples.sort_by(f64::total_cmp);
                let (m, t) = (quantile(&samples, 0.5), quantile(&samples, 0.99));
                println!("  round {round}: {store}: submit-to-outcome median {m:.1} µs, p99 {t:.1} µs");
                p50[i].push(m);
                p99[i].push(t);
            }
        }
        for (i, store) in labels.iter().enumerate() {
            println!(
                "{store}: intake, 1 pipelined client: median {:.0} submissions/s (min {:.0}, max {:.0})",
                median(&one[i]),
                min(&one[i]),
                max(&one[i])
            );
            println!(
                "{store}: intake, {CLIENTS} pipelined clients: median {:.0} submissions/s (min {:.0}, max {:.0})",
                median(&many[i]),
                min(&many[i]),
                max(&many[i])
            );
            println!(
                "{store}: CPU per submission, {CLIENTS} clients (intake and drain): daemon median {:.1} µs, clients {:.1} µs",
                median(&cpu[i]),
                median(&client_cpu[i])
            );
            println!(
                "{store}: submit-to-outcome latency, closed loop: median of round medians {:.1} µs, median of round p99s {:.1} µs",
                median(&p50[i]),
                median(&p99[i])
            );
        }
        println!(
            "memory, 2 workers / 1 worker: intake, {CLIENTS} pipelined clients {:.2}x; 1 pipelined client {:.2}x",
            median(&many[0]) / median(&many[2]),
            median(&one[0]) / median(&one[2])
        );
        if baseline.is_some() {
            // After the memory store on one worker: memory@baseline, then
            // sqlite@baseline.
            for (i, store) in STORES.iter().enumerate() {
                println!(
                    "{store}/{store}@baseline: intake, {CLIENTS} pipelined clients {:.2}x; 1 pipelined client {:.2}x; submit-to-outcome median {:.2}x",
                    median(&many[i]) / median(&many[3 + i]),
                    median(&one[i]) / median(&one[3 + i]),
                    median(&p50[i]) / median(&p50[3 + i])
                );
            }
        }
        println!(
            "sqlite/memory intake, {CLIENTS} pipelined clients: {:.2}x",
            median(&many[1]) / median(&many[0])
        );
        for (store, _, child) in &daemons {
            println!("{store}: daemon resident memory at the end: {}", rss(child.id()));
        }
    });
    for (_, _, mut child) in daemons {
        let _ = child.kill();
        let _ = child.wait();
    }
    if std::env::var_os("TASKHOST_BENCH_INTAKE_ONLY").is_some() {
        return;
    }
    rt.block_on(restart_with_queued(dir.path()));
    rt.block_on(remote(dir.path()));
    rt.block_on(parked(dir.path()));
    rt.block_on(guest_attempts(dir.path()));
    rt.block_on(state(dir.path()));
    rt.block_on(compiles(dir.path()));
    rt.block_on(batch(dir.path()));
}

/// Batches per round of the batch scenario, of [`MAX_BATCH`] each.
const BATCHES: usize = 20;

/// Issue 53: intake of a SQLite daemon in batches of 1,000
/// (`SubmitBatch`, as `host submit --batch` and `POST /api/tasks/batch`
/// send them; two calls in flight on one connection) against single
/// submissions from one pipelined client, the same number of tasks, rounds
/// alternated in one run; each round's tasks acknowledged durably
/// (acknowledged after the commit holding them) and then drained.
async fn batch(dir: &Path) {
    let host = Path::new(env!("CARGO_BIN_EXE_host"));
    let socket = dir.join("batch.sock");
    let mut child = start_daemon(
        host,
        &socket,
        &dir.join("batch-state"),
        "sqlite",
        &["--worker-threads", "2"],
    );
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
    let digest = upload(&socket, &hello).await;
    let total = BATCHES * MAX_BATCH;
    batch_intake(&socket, digest, 2, None).await;
    drain(&socket).await;
    intake(&socket, digest, 1, 2_000).await;
    drain(&socket).await;
    // Each its own slot: every task starts as it is accepted, so intake
    // shares the two cores with the running; one slot: they queue behind
    // its owner, intake alone.
    for (slot, what) in [
        (None, "each its own slot"),
        (Some("one"), "all queued in one slot"),
    ] {
        let (mut batched, mut single) = (Vec::new(), Vec::new());
        for round in 1..=INTAKE_ROUNDS {
            for first in [round % 2 == 0, round % 2 == 1] {
                let rate = if first {
                    batch_intake(&socket, digest, BATCHES, slot).await
                } else {
                    intake_into(&socket, digest, 1, total, slot).await
                };
                let drained = drain(&socket).await;
                let which = if first {
                    "batches of 1,000"
                } else {
                    "single submissions, 1 pipelined client"
                };
                println!(
                    "  round {round}: sqlite, {what}: {which}: {rate:.0} tasks/s accepted durably (drained in {:.0} ms)",
                    drained.as_secs_f64() * 1e3
                );
                if first {
                    batched.push(rate)
                } else {
                    single.push(rate)
                }
            }
        }
        let (b, s) = (median(&batched), median(&single));
        println!(
            "sqlite, {what}: batch intake, {total} tasks in batches of {MAX_BATCH}: median {b:.0} tasks/s (min {:.0}); single submissions, 1 pipelined client: median {s:.0} /s; batch/single {:.2}x",
            min(&batched),
            b / s
        );
    }
    // Bulk cancel: 100,000 tasks queued behind one running owner (a
    // sleeper), then one CancelMatching of the queued ones, timed to its
    // answer (every one removed from its queue by then).
    let client = taskhost::daemon::Client::connect(&socket).await.unwrap();
    let sleeper = std::fs::read(plugin_artifacts::SLEEPER).expect("sleeper.wasm");
    let sleeper = upload(&socket, &sleeper).await;
    let mut took = Vec::new();
    for round in 1..=3 {
        let mut owner = SubmitRequest::new(sleeper);
        owner.slot = Some("bulk".into());
        owner.params = vec![("ms".into(), "600000".into())];
        client.submit(owner).await.unwrap();
        batch_intake(&socket, digest, 100, Some("bulk")).await;
        let filter = TaskFilter {
            state: Some(TaskState::Queued),
            ..TaskFilter::default()
        };
        let start = Instant::now();
        let reply = client
            .call(Request::CancelMatching {
                filter,
                dry_run: false,
            })
            .await
            .unwrap();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let Reply::Matched { count, acted, .. } = reply else {
            panic!("unexpected reply {reply:?}")
        };
        assert_eq!((count, acted), (100_000, 100_000));
        println!("  round {round}: sqlite: cancel by filter of {count} queued tasks: {ms:.0} ms");
        took.push(ms);
        let owner = TaskFilter {
            slot: Some("bulk".into()),
            ..TaskFilter::default()
        };
        client
            .call(Request::CancelMatching {
                filter: owner,
                dry_run: false,
            })
            .await
            .unwrap();
        drain(&socket).await;
    }
    println!(
        "sqlite: cancel by filter of 100,000 queued tasks: median {:.0} ms (max {:.0})",
        median(&took),
        max(&took)
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Finished tasks kept in the pages scenario (TASKHOST_BENCH_PAGES_TASKS
/// to change it).
const PAGES_TASKS: usize = 1_000_000;

/// Issue 53: the first page of `ps --all` (50 rows, newest first) with a
/// million finished tasks kept, by the daemon's protocol and by the `host`
/// binary, while the daemon remembers them and after a restart (the store
/// alone); with TASKHOST_BENCH_BASELINE_HOST=PATH, that build's daemon
/// filled and timed the same way in the same run.
async fn pages(dir: &Path) {
    let tasks = env_count("TASKHOST_BENCH_PAGES_TASKS", PAGES_TASKS);
    let mut hosts = vec![(
        "this build".to_owned(),
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_host")),
    )];
    if let Some(base) = std::env::var_os("TASKHOST_BENCH_BASELINE_HOST") {
        hosts.push(("baseline".to_owned(), base.into()));
    }
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
    for (n, (which, host)) in hosts.into_iter().enumerate() {
        let socket = dir.join(format!("pages-{n}.sock"));
        let state = dir.join(format!("pages-{n}-state"));
        let kept = tasks.to_string();
        let flags = [
            "--worker-threads",
            "2",
            "--retain-finished",
            kept.as_str(),
            "--retain-bytes",
            "8GiB",
        ];
        let mut child = start_daemon(&host, &socket, &state, "sqlite", &flags);
        let digest = upload(&socket, &hello).await;
        let start = Instant::now();
        fill(&socket, digest, tasks).await;
        println!(
            "  {which}: {tasks} tasks run and finished in {:.0} s",
            start.elapsed().as_secs_f64()
        );
        for when in ["remembered", "after a restart"] {
            if when == "after a restart" {
                let _ = child.kill();
                let _ = child.wait();
                child = start_daemon(&host, &socket, &state, "sqlite", &flags);
            }
            let wire = first_pages(&socket, 50).await;
            let mut cli = Vec::new();
            for _ in 0..10 {
                let start = Instant::now();
                let out = Command::new(&host)
                    .args(["ps", "--all", "--limit", "50", "--socket"])
                    .arg(&socket)
                    .output()
                    .expect("host ps");
                cli.push(start.elapsed().as_secs_f64() * 1e3);
                assert!(out.status.success(), "{out:?}");
            }
            println!(
                "{which}, sqlite, {tasks} finished tasks {when}: first page of ps --all (50 rows): protocol median {:.1} ms (max {:.1}); `host ps --all --limit 50` median {:.1} ms (max {:.1})",
                median(&wire),
                max(&wire),
                median(&cli),
                max(&cli)
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Finished tasks kept in the history scenario (TASKHOST_BENCH_HISTORY_TASKS
/// to change it).
const HISTORY_TASKS: usize = 1_000_000;

/// Issue 56, target 2: what a million finished tasks cost a SQLite daemon
/// that keeps them (`--retain-finished` a million) against the same daemon
/// fed the same work keeping none (`--retain-finished 1`), and with
/// TASKHOST_BENCH_BASELINE_HOST=PATH another build keeping them: resident
/// memory empty (after warm-up) and full; 8-client intake of `SUBMISSIONS`
/// and closed-loop submit → outcome, empty and full (medians of 3 rounds);
/// the first page of `ps --all` (50 rows, 20 times); the restart after
/// SIGKILL until it accepts, and its memory then.
async fn history(dir: &Path) {
    let tasks = env_count("TASKHOST_BENCH_HISTORY_TASKS", HISTORY_TASKS);
    let this = PathBuf::from(env!("CARGO_BIN_EXE_host"));
    let mut daemons = vec![
        ("this build, kept", this.clone(), tasks),
        ("this build, none kept", this, 1),
    ];
    if let Some(base) = std::env::var_os("TASKHOST_BENCH_BASELINE_HOST") {
        daemons.push(("baseline, kept", base.into(), tasks));
    }
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
    for (n, (which, host, keep)) in daemons.into_iter().enumerate() {
        let socket = dir.join(format!("history-{n}.sock"));
        let state = dir.join(format!("history-{n}-state"));
        let keep = keep.to_string();
        let flags = [
            "--worker-threads",
            "2",
            "--retain-finished",
            keep.as_str(),
            "--retain-bytes",
            "8GiB",
        ];
        let mut child = start_daemon(&host, &socket, &state, "sqlite", &flags);
        let digest = upload(&socket, &hello).await;
        // Warm-up, then the empty daemon's figures.
        intake(&socket, digest, CLIENTS, SUBMISSIONS).await;
        drain(&socket).await;
        let empty = history_round(&socket, digest).await;
        let rss_empty = rss_kib(child.id());
        let start = Instant::now();
        fill(&socket, digest, tasks).await;
        let filled = start.elapsed();
        let rss_full = rss_kib(child.id());
        let full = history_round(&socket, digest).await;
        let pages = first_pages(&socket, 1).await;
        let _ = child.kill();
        let _ = child.wait();
        let start = Instant::now();
        child = start_daemon(&host, &socket, &state, "sqlite", &flags);
        let restarted = start.elapsed();
        first_pages(&socket, 1).await;
        let rss_restarted = rss_kib(child.id());
        println!(
            "history: {which}, {tasks} hello run in {:.0} s: RSS {:.0} MiB empty, {:.0} MiB full (+{:.0}), {:.0} MiB after a restart; \
             intake {:.0} /s empty, {:.0} /s full ({:.2}x); submit → outcome p50 {:.0} µs empty, {:.0} µs full ({:.2}x); \
             first page of ps --all {:.1} ms (max {:.1}); restart after SIGKILL {:.0} ms",
            filled.as_secs_f64(),
            rss_empty as f64 / 1024.0,
            rss_full as f64 / 1024.0,
            (rss_full as f64 - rss_empty as f64) / 1024.0,
            rss_restarted as f64 / 1024.0,
            empty.0,
            full.0,
            full.0 / empty.0,
            empty.1,
            full.1,
            full.1 / empty.1,
            median(&pages),
            max(&pages),
            restarted.as_secs_f64() * 1e3,
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Three rounds of 8-client intake and of closed-loop latency (each
/// drained): the median intake (tasks/s) and the median of the rounds'
/// median latencies (µs).
async fn history_round(socket: &Path, digest: Digest) -> (f64, f64) {
    let (mut rates, mut p50s) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        rates.push(intake(socket, digest, CLIENTS, SUBMISSIONS).await);
        drain(socket).await;
        let mut samples = latency(socket, digest, LATENCY_ITERATIONS).await;
        samples.sort_by(f64::total_cmp);
        p50s.push(quantile(&samples, 0.5));
    }
    (median(&rates), median(&p50s))
}

/// A count from the environment variable `name`, else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Runs `tasks` `hello`s to their end: batches of [`MAX_BATCH`], 100
/// calls at a time, each hundred drained.
async fn fill(socket: &Path, digest: Digest, tasks: usize) {
    let mut left = tasks;
    while left > 0 {
        let batches = (left / MAX_BATCH).clamp(1, 100);
        batch_intake(socket, digest, batches, None).await;
        drain(socket).await;
        left = left.saturating_sub(batches * MAX_BATCH);
    }
}

/// The first page of `ps --all` (50 rows) by the protocol, 20 times, each
/// of at least `rows` rows: the times in ms.
async fn first_pages(socket: &Path, rows: usize) -> Vec<f64> {
    let client = taskhost::daemon::Client::connect(socket).await.unwrap();
    let page = TaskPage {
        all: true,
        filter: TaskFilter::default(),
        before: None,
        limit: Some(50),
    };
    let mut took = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let got = client.page(page.clone()).await.unwrap();
        took.push(start.elapsed().as_secs_f64() * 1e3);
        assert!(got.len() >= rows, "{} rows", got.len());
    }
    took
}

/// `batches` calls of [`MAX_BATCH`] submissions on one connection, two in
/// flight; tasks acknowledged per second (first write to last answer).
async fn batch_intake(socket: &Path, digest: Digest, batches: usize, slot: Option<&str>) -> f64 {
    let client = taskhost::daemon::Client::connect(socket).await.unwrap();
    let requests = || -> Vec<SubmitRequest> {
        (0..MAX_BATCH)
            .map(|_| {
                let mut request = SubmitRequest::new(digest);
                request.input = b"hi".to_vec();
                request.slot = slot.map(str::to_owned);
                request
            })
            .collect()
    };
    let start = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    let mut accepted = 0;
    for _ in 0..batches {
        if in_flight.len() == 2 {
            accepted += batch_answer(in_flight.pop_front().unwrap()).await;
        }
        in_flight.push_back(
            client
                .request(Request::SubmitBatch(requests()))
                .await
                .unwrap(),
        );
    }
    for replies in in_flight {
        accepted += batch_answer(replies).await;
    }
    accepted as f64 / start.elapsed().as_secs_f64()
}

async fn batch_answer(mut replies: taskhost::daemon::Replies) -> usize {
    match replies.next_reply().await.unwrap() {
        Reply::SubmittedBatch(items) => {
            for item in &items {
                assert!(
                    matches!(item, BatchItem::Submitted(s) if !matches!(s.placement, Placement::Rejected(_))),
                    "{item:?}"
                );
            }
            items.len()
        }
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Tasks per guest in the guest-attempts scenario, and the first ones left
/// out as warm-up.
const GUEST_TASKS: usize = 60;
const GUEST_WARMUP: usize = 10;

/// Issue 32, target 4: attempts of the Python and JavaScript examples in a
/// memory daemon, warm, one task after another (submit, then wait): each
/// attempt's own time as the report's history gives it (the instance's
/// creation, the guest's run and the instance's drop), the median over
/// `GUEST_TASKS` after `GUEST_WARMUP`; the Rust `hello` as the control;
/// on each store.
async fn guest_attempts(dir: &Path) {
    let Some(examples) = guests::examples("guest attempts") else {
        return;
    };
    for store in STORES {
        guest_attempts_on(dir, store, &examples).await;
    }
}

async fn guest_attempts_on(dir: &Path, store: &str, examples: &[PathBuf; 2]) {
    use taskhost::daemon::Client;
    let host = Path::new(env!("CARGO_BIN_EXE_host"));
    let socket = dir.join(format!("guests-{store}.sock"));
    let state = dir.join(format!("guests-{store}-state"));
    let mut child = start_daemon(host, &socket, &state, store, &[]);
    let client = Client::connect(&socket).await.expect("connect");
    let hello = PathBuf::from(plugin_artifacts::HELLO);
    for (name, path) in [
        ("hello", &hello),
        ("py-hello", &examples[0]),
        ("js-hello", &examples[1]),
    ] {
        let bytes = std::fs::read(path).expect("the example");
        let digest = client.ensure_plugin(&bytes).await.expect("upload");
        let mut took = Vec::with_capacity(GUEST_TASKS);
        for _ in 0..GUEST_TASKS {
            let mut submit = SubmitRequest::new(digest);
            submit.input = b"hi".to_vec();
            let mut replies = client
                .request(Request::Submit(Box::new(submit)))
                .await
                .unwrap();
            let id = match replies.next().await {
                Some(Reply::Submitted(Submitted { id, .. })) => id,
                other => panic!("{name} was not admitted: {other:?}"),
            };
            let mut wait = client
                .request(Request::Wait(TaskRef::Id(id)))
                .await
                .unwrap();
            match wait.next().await {
                Some(Reply::Report(r)) => {
                    assert!(
                        matches!(r.outcome, TaskOutcome::Completed { .. }),
                        "{name}: {:?}",
                        r.outcome
                    );
                    took.push(r.history[0].duration.as_secs_f64() * 1e3);
                }
                other => panic!("{name}: waiting got {other:?}"),
            }
        }
        let mut warm = took[GUEST_WARMUP..].to_vec();
        warm.sort_by(f64::total_cmp);
        println!(
            "guest attempts: {store}: {name}: median {:.2} ms, p90 {:.2} ms, min {:.2} ms \
             ({} attempts after {GUEST_WARMUP} warm-up)",
            median(&warm),
            quantile(&warm, 0.9),
            warm[0],
            warm.len()
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Key-value calls and child spawns of the state scenario.
const STATE_KV_CALLS: &str = "2000";
const STATE_CHILDREN: &str = "300";

/// Guests' state and children, timed from inside the guest, on each store.
async fn state(dir: &Path) {
    use taskhost::daemon::Client;
    for store in STORES {
        let host = Path::new(env!("CARGO_BIN_EXE_host"));
        let socket = dir.join(format!("state-{store}.sock"));
        let mut child = start_daemon(
            host,
            &socket,
            &dir.join(format!("state-{store}-state")),
            store,
            &[],
        );
        let client = Client::connect(&socket).await.expect("connect");
        for (what, plugin, param) in [
            (
                "key-value",
                plugin_artifacts::COUNTER,
                format!("bench={STATE_KV_CALLS}"),
            ),
            (
                "children",
                plugin_artifacts::FANOUT,
                format!("bench={STATE_CHILDREN}"),
            ),
        ] {
            let bytes = std::fs::read(plugin).expect("the plugin");
            let digest = client.ensure_plugin(&bytes).await.expect("upload");
            let mut submit = SubmitRequest::new(digest);
            let (k, v) = param.split_once('=').unwrap();
            submit.params = vec![(k.into(), v.into())];
            let mut replies = client
                .request(Request::Submit(Box::new(submit)))
                .await
                .unwrap();
            let id = match replies.next().await {
                Some(Reply::Submitted(Submitted { id, .. })) => id,
                other => panic!("{what} was not admitted: {other:?}"),
            };
            let mut wait = client
                .request(Request::Wait(TaskRef::Id(id)))
                .await
                .unwrap();
            match wait.next().await {
                Some(Reply::Report(r)) => match r.outcome {
                    TaskOutcome::Completed { output } => {
                        println!(
                            "state: {store}: {what}: {}",
                            String::from_utf8_lossy(&output)
                        );
                    }
                    other => panic!("{what}: {other:?}"),
                },
                other => panic!("{what}: waiting got {other:?}"),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Rounds of the remote scenario.
const REMOTE_ROUNDS: usize = 3;

/// The remote scenario: one memory daemon with `--http` on loopback, driven
/// through the library's `Client` over its Unix socket and over HTTP
/// (`Client::connect_remote`, the upgrade of `host --remote`), side by
/// side: closed-loop submit → outcome latency on one connection, and
/// intake from 8 pipelined clients.
async fn remote(dir: &Path) {
    use taskhost::daemon::{Client, Remote};
    let socket = dir.join("remote.sock");
    let state = dir.join("remote-state");
    let host = Path::new(env!("CARGO_BIN_EXE_host"));
    let (mut child, seen) = start_daemon_seen(
        host,
        &socket,
        &state,
        "memory",
        &["--worker-threads", "2", "--http", "127.0.0.1:0"],
    );
    let line = seen
        .iter()
        .find(|l| l.contains("taskhost HTTP listening on http://"))
        .expect("the HTTP listening line");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("an address");
    let token = std::fs::read_to_string(state.join("http-token")).expect("the daemon's token");
    let remote = Remote {
        url: format!("http://{addr}"),
        token: Some(token.trim().to_owned()),
        ca_file: None,
    };
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
    let local = Client::connect(&socket).await.expect("connect");
    let digest = local.ensure_plugin(&hello).await.expect("upload");
    let transports = ["socket", "remote"];
    let connect = |which: &str| {
        let (socket, remote) = (socket.clone(), remote.clone());
        let which = which.to_owned();
        async move {
            if which == "socket" {
                Client::connect(&socket).await.expect("connect")
            } else {
                Client::connect_remote(&remote)
                    .await
                    .expect("connect remotely")
            }
        }
    };
    println!(
        "# remote: {LATENCY_ITERATIONS} closed-loop submit+wait per round and {SUBMISSIONS} submissions from {CLIENTS} pipelined clients per round, {REMOTE_ROUNDS} rounds, {transports:?} side by side (the library's Client, memory store)"
    );
    // Warm up both.
    for which in transports {
        let client = connect(which).await;
        client_latency(&client, digest, 200).await;
        let clients = vec![client];
        client_intake(&clients, digest, 2_000).await;
        drain(&socket).await;
    }
    let mut p50 = [Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new()];
    let mut rates = [Vec::new(), Vec::new()];
    for round in 1..=REMOTE_ROUNDS {
        for (i, which) in transports.iter().enumerate() {
            let client = connect(which).await;
            let mut samples = client_latency(&client, digest, LATENCY_ITERATIONS).await;
            samples.sort_by(f64::total_cmp);
            let (m, t) = (quantile(&samples, 0.5), quantile(&samples, 0.99));
            let mut clients = Vec::new();
            for _ in 0..CLIENTS {
                clients.push(connect(which).await);
            }
            let rate = client_intake(&clients, digest, SUBMISSIONS).await;
            drain(&socket).await;
            println!(
                "  round {round}: {which}: submit-to-outcome median {m:.1} µs, p99 {t:.1} µs; intake, {CLIENTS} pipelined clients: {rate:.0} submissions/s"
            );
            p50[i].push(m);
            p99[i].push(t);
            rates[i].push(rate);
        }
    }
    for (i, which) in transports.iter().enumerate() {
        println!(
            "{which}: submit-to-outcome median of round medians {:.1} µs, p99s {:.1} µs; intake, {CLIENTS} pipelined clients: median {:.0} submissions/s (min {:.0})",
            median(&p50[i]),
            median(&p99[i]),
            median(&rates[i]),
            min(&rates[i])
        );
    }
    println!(
        "remote/socket: submit-to-outcome median {:.2}x; intake {:.2}x",
        median(&p50[1]) / median(&p50[0]),
        median(&rates[1]) / median(&rates[0])
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Closed-loop submit → outcome through a `Client`, in µs per iteration.
async fn client_latency(
    client: &taskhost::daemon::Client,
    digest: Digest,
    iterations: usize,
) -> Vec<f64> {
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        let mut request = SubmitRequest::new(digest);
        request.input = b"hi".to_vec();
        let submitted = client.submit(request).await.expect("submit");
        let report = client.wait(TaskRef::Id(submitted.id)).await.expect("wait");
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        assert!(matches!(report.outcome, TaskOutcome::Completed { .. }));
    }
    samples
}

/// Submissions per second from these clients, each pipelining its share
/// (every request sent before its replies are read).
async fn client_intake(clients: &[taskhost::daemon::Client], digest: Digest, total: usize) -> f64 {
    let per_client = total / clients.len();
    let start = Instant::now();
    let mut handles = Vec::new();
    for client in clients {
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            let mut replies = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                replies.push(
                    client
                        .request(submit_request(digest, None))
                        .await
                        .expect("send"),
                );
            }
            for mut reply in replies {
                match reply.next_reply().await.expect("reply") {
                    Reply::Submitted(Submitted {
                        placement: Placement::Rejected(_),
                        ..
                    }) => panic!("rejected: raise the daemon's limits"),
                    Reply::Submitted(_) => {}
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            per_client
        }));
    }
    let mut accepted = 0;
    for handle in handles {
        accepted += handle.await.unwrap();
    }
    accepted as f64 / start.elapsed().as_secs_f64()
}

/// Parked sleepers in the parked scenario.
const PARKED: usize = 10_000;
/// Their waits per connection (the daemon allows 64 requests in flight on
/// one connection).
const WAITS_PER_CONNECTION: usize = 50;
/// Rounds of the parked scenario per build.
const PARKED_ROUNDS: usize = 3;

/// The parked scenario for this build and, with
/// `TASKHOST_BENCH_BASELINE_HOST`, for the baseline, rounds alternated.
async fn parked(dir: &Path) {
    let baseline = std::env::var_os("TASKHOST_BENCH_BASELINE_HOST");
    for round in 1..=PARKED_ROUNDS {
        if let Some(host) = &baseline {
            park_and_stop(dir, Path::new(host), &format!("baseline-{round}")).await;
        }
        let host = Path::new(env!("CARGO_BIN_EXE_host"));
        park_and_stop(dir, host, &format!("this-build-{round}")).await;
    }
}

/// Issue 15, target 2: `PARKED` `sleeper`s in one memory daemon (each in
/// its own slot, all running at once, each in one ten-minute host sleep),
/// a waiter on every one of them (`WAITS_PER_CONNECTION` per connection),
/// then a shutdown that cancels them all: the RSS they added per task, and
/// how long from the shutdown request until every waiter has its report and
/// until the daemon answers that all stopped.
async fn park_and_stop(dir: &Path, host: &Path, build: &str) {
    use taskhost::daemon::Client;
    use taskhost::supervisor::ShutdownReport;
    let socket = dir.join(format!("parked-{build}.sock"));
    let config = dir.join("parked.toml");
    std::fs::write(&config, "max_connections = 1024\n").unwrap();
    let mut child = start_daemon(
        host,
        &socket,
        &dir.join(format!("parked-{build}-state")),
        "memory",
        &[
            "--max-concurrent",
            &(PARKED + 10).to_string(),
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let pid = child.id();
    let client = Client::connect(&socket).await.expect("connect");
    let sleeper = std::fs::read(plugin_artifacts::SLEEPER).expect("sleeper.wasm");
    let digest = client.ensure_plugin(&sleeper).await.expect("upload");
    let idle = rss_kib(pid);
    let started = Instant::now();
    let mut pending = Vec::with_capacity(PARKED);
    for _ in 0..PARKED {
        let mut s = SubmitRequest::new(digest);
        s.params = vec![
            ("ms".into(), "600000".into()),
            ("step_ms".into(), "600000".into()),
        ];
        pending.push(client.request(Request::Submit(Box::new(s))).await.unwrap());
    }
    let mut ids = Vec::with_capacity(PARKED);
    for mut replies in pending {
        match replies.next().await {
            Some(Reply::Submitted(Submitted {
                id,
                placement: Placement::Running,
                ..
            })) => ids.push(id),
            other => panic!("a sleeper was not admitted: {other:?}"),
        }
    }
    // Running means it holds a permit; every instance exists and is
    // parked once the resident size stops growing.
    let (mut last, mut stable) = (rss_kib(pid), 0);
    while stable < 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss_kib(pid);
        stable = if now.abs_diff(last) < 1024 {
            stable + 1
        } else {
            0
        };
        last = now;
    }
    let parked_in = started.elapsed();
    let per_task = last.saturating_sub(idle) as f64 / PARKED as f64;
    let mut waits = Vec::with_capacity(PARKED);
    for chunk in ids.chunks(WAITS_PER_CONNECTION) {
        let waiter = Client::connect(&socket).await.expect("connect");
        for id in chunk {
            waits.push(
                waiter
                    .request(Request::Wait(TaskRef::Id(*id)))
                    .await
                    .unwrap(),
            );
        }
    }
    let stopping = Instant::now();
    let mut shutdown = client
        .request(Request::Shutdown {
            grace: Some(Duration::from_secs(30)),
            cancel_all: true,
        })
        .await
        .unwrap();
    let reports = tokio::spawn(async move {
        for mut wait in waits {
            match wait.next().await {
                Some(Reply::Report(r)) => assert_eq!(r.outcome, TaskOutcome::Canceled),
                other => panic!("a waiter got {other:?}"),
            }
        }
        stopping.elapsed()
    });
    let done = shutdown.next().await;
    let stopped_in = stopping.elapsed();
    assert_eq!(
        done,
        Some(Reply::ShutdownDone(ShutdownReport::AllStopped)),
        "all stop within the grace"
    );
    let reported_in = reports.await.unwrap();
    println!(
        "parked: {build}: {PARKED} sleepers parked in {:.1} s, {per_task:.1} KiB of RSS each; \
         shutdown (cancel all) → every report {:.0} ms, → all stopped {:.0} ms",
        parked_in.as_secs_f64(),
        reported_in.as_secs_f64() * 1e3,
        stopped_in.as_secs_f64() * 1e3
    );
    let _ = child.wait();
}

/// A process's resident set size in KiB.
fn rss_kib(pid: u32) -> u64 {
    rss(pid)
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("VmRSS in kB")
}

/// Large components compiled while the latency is measured.
const COMPILES: usize = 3;

/// The compile scenario for this build and, with
/// `TASKHOST_BENCH_BASELINE_HOST`, for the baseline before it (one after
/// the other: two daemons compiling at once would share the cores).
async fn compiles(dir: &Path) {
    let large = large_component();
    if let Some(host) = std::env::var_os("TASKHOST_BENCH_BASELINE_HOST") {
        beside_compiles(dir, Path::new(&host), "baseline", &large).await;
    }
    let host = Path::new(env!("CARGO_BIN_EXE_host"));
    beside_compiles(dir, host, "this build", &large).await;
}

/// Head-of-line blocking by compiles (issue 15, target 6): `hello`'s
/// closed-loop submit-to-outcome latency on a memory daemon, quiet, then
/// while another connection uploads `COMPILES` distinct copies of a large
/// component one after the other (each upload is answered once its copy is
/// compiled and described).
async fn beside_compiles(dir: &Path, host: &Path, build: &str, large: &[u8]) {
    let name = build.replace(' ', "-");
    let socket = dir.join(format!("compiles-{name}.sock"));
    let mut child = start_daemon(
        host,
        &socket,
        &dir.join(format!("compiles-{name}-state")),
        "memory",
        &[],
    );
    let hello = std::fs::read(plugin_artifacts::HELLO).expect("hello.wasm");
    let digest = upload(&socket, &hello).await;
    latency(&socket, digest, 200).await;
    let report = |label: &str, mut samples: Vec<f64>| {
        samples.sort_by(f64::total_cmp);
        println!(
            "compiles: {build}: {label}: {} submit-to-outcome samples: median {:.1} µs, p99 {:.1} µs, max {:.1} µs, {} over 10 ms",
            samples.len(),
            quantile(&samples, 0.5),
            quantile(&samples, 0.99),
            samples[samples.len() - 1],
            samples.iter().filter(|&&s| s > 10_000.0).count()
        );
    };
    let mut quiet = Vec::new();
    while quiet.len() < 2_000 {
        quiet.extend(latency(&socket, digest, 100).await);
    }
    report("quiet", quiet);
    // Distinct copies (a custom section with this run's time), so that
    // neither the daemon nor wasmtime's compilation cache has seen them.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // Hashed here, so that the client's own work does not show up in
    // the latencies.
    let copies: Vec<(Digest, Vec<u8>)> = (0..COMPILES)
        .map(|i| {
            let copy = plugin_artifacts::with_custom_section(
                large,
                &format!("taskhost-bench-{nonce}"),
                &i.to_le_bytes(),
            );
            (Digest::of(&copy), copy)
        })
        .collect();
    let compiler = {
        let socket = socket.clone();
        tokio::spawn(async move {
            let mut took = Vec::new();
            for (digest, copy) in copies {
                let start = Instant::now();
                upload_as(&socket, digest, &copy).await;
                took.push(start.elapsed());
            }
            took
        })
    };
    let mut busy = Vec::new();
    while !compiler.is_finished() {
        busy.extend(latency(&socket, digest, 20).await);
    }
    let took = compiler.await.unwrap();
    println!(
        "compiles: {build}: {COMPILES} uploads of a {} component, each compiled afresh: {:?}",
        large.len(),
        took
    );
    report("during the compiles", busy);
    println!(
        "compiles: {build}: daemon resident memory at the end: {}",
        rss(child.id())
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// A large component: `TASKHOST_BENCH_LARGE`, else the Python example
/// `py-hello.wasm` that tests/e2e/guests.rs builds (built here with
/// plugins/guests/build.sh when missing).
fn large_component() -> Vec<u8> {
    if let Some(path) = std::env::var_os("TASKHOST_BENCH_LARGE") {
        return std::fs::read(&path).unwrap_or_else(|e| {
            panic!("TASKHOST_BENCH_LARGE={}: {e}", Path::new(&path).display())
        });
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("guests/python");
    let path = out.join("py-hello.wasm");
    if !path.is_file() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let status = Command::new(repo.join("plugins/guests/build.sh"))
            .arg(&out)
            .arg("python")
            .status()
            .expect("run plugins/guests/build.sh");
        assert!(
            status.success(),
            "plugins/guests/build.sh failed ({status}): .ci/run installs componentize-py, \
             or name a large component with TASKHOST_BENCH_LARGE=PATH"
        );
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The durable store's restart: a slot owner with `RESTART_QUEUED`
/// submissions queued behind it, SIGKILL, then a new daemon on the same
/// state directory: how long until it accepts connections again (recovery
/// included), and whether every queued submission is back.
async fn restart_with_queued(dir: &Path) {
    let socket = dir.join("restart.sock");
    let state = dir.join("restart-state");
    let serve = || {
        start_daemon(
            Path::new(env!("CARGO_BIN_EXE_host")),
            &socket,
            &state,
            "sqlite",
            &[],
        )
    };
    let mut daemon = serve();
    let sleeper = upload(&socket, &std::fs::read(plugin_artifacts::SLEEPER).unwrap()).await;
    let hello = upload(&socket, &std::fs::read(plugin_artifacts::HELLO).unwrap()).await;
    let (mut reader, mut writer) = connect(&socket).await;
    let mut owner = SubmitRequest::new(sleeper);
    owner.slot = Some("r".into());
    owner.params = vec![("ms".into(), "600000".into())];
    let reply = call(&mut reader, &mut writer, Request::Submit(Box::new(owner))).await;
    assert!(matches!(reply, Reply::Submitted(_)), "{reply:?}");
    let frames: Vec<Vec<u8>> = (0..RESTART_QUEUED)
        .map(|i| {
            let mut request = SubmitRequest::new(hello);
            request.slot = Some("r".into());
            request.policy = Some(taskhost::controller::AdmissionPolicy::Queue);
            encode(&Envelope {
                id: i as u32 + 2,
                body: Request::Submit(Box::new(request)),
            })
            .unwrap()
        })
        .collect();
    // Written by another task while the replies are read here: the daemon
    // answers in order and stops reading from a client that does not read
    // its replies (a full socket buffer both ways would stall both sides).
    let writing = tokio::spawn(async move {
        let mut buffered = BufWriter::new(writer);
        for frame in &frames {
            buffered.write_all(frame).await.unwrap();
        }
        buffered.flush().await.unwrap();
    });
    for _ in 0..RESTART_QUEUED {
        let reply: Envelope<Reply> = read_frame(&mut reader).await.expect("reply");
        assert!(
            matches!(
                reply.body,
                Reply::Submitted(Submitted {
                    placement: Placement::Queued { .. },
                    ..
                })
            ),
            "{:?}",
            reply.body
        );
    }
    writing.await.unwrap();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let started = Instant::now();
    let mut daemon = serve();
    let took = started.elapsed();
    let (mut reader, mut writer) = connect(&socket).await;
    let queued = match call(&mut reader, &mut writer, Request::Slots).await {
        Reply::Slots(slots) => slots.iter().map(|s| s.queue_depth).sum::<usize>(),
        other => panic!("{other:?}"),
    };
    println!(
        "sqlite: restart with {RESTART_QUEUED} queued submissions after SIGKILL: accepting connections after {:.0} ms (process start included); {queued} queued again",
        took.as_secs_f64() * 1e3
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// The CPU time a process's threads have used so far (their
/// `schedstat`s, in nanoseconds; threads that ended are not counted).
fn cpu_time(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// A process's resident set size, from `/proc`.
fn rss(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(|l| l["VmRSS:".len()..].trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Starts the release daemon with limits high enough that nothing throttles,
/// and returns once it listens.
fn start_daemon(host: &Path, socket: &Path, state: &Path, store: &str, extra: &[&str]) -> Child {
    start_daemon_seen(host, socket, state, store, extra).0
}

/// As [`start_daemon`], with the log lines it wrote until it listened.
fn start_daemon_seen(
    host: &Path,
    socket: &Path,
    state: &Path,
    store: &str,
    extra: &[&str],
) -> (Child, Vec<String>) {
    let mut child = Command::new(host)
        .args(["serve", "--socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(state)
        .args(["--store", store])
        .args([
            "--max-total-pending",
            "1000000",
            "--max-slot-queue",
            "1000000",
        ])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn host serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("taskhost daemon listening on") => break,
            Some(Ok(line)) => seen.push(line),
            _ => panic!("the daemon exited before listening"),
        }
    }
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, seen)
}

async fn connect(socket: &Path) -> (OwnedReadHalf, OwnedWriteHalf) {
    let stream = UnixStream::connect(socket).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    write_frame(
        &mut writer,
        &Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
        },
    )
    .await
    .unwrap();
    let welcome: Welcome = read_frame(&mut reader).await.expect("welcome");
    assert_eq!(welcome.version, PROTOCOL_VERSION);
    (reader, writer)
}

async fn call(reader: &mut OwnedReadHalf, writer: &mut OwnedWriteHalf, body: Request) -> Reply {
    write_frame(writer, &Envelope { id: 1, body })
        .await
        .unwrap();
    let reply: Envelope<Reply> = read_frame(reader).await.expect("reply");
    reply.body
}

/// Uploads a plugin in chunks of `UPLOAD_CHUNK`; returns once the daemon
/// has compiled it.
async fn upload(socket: &Path, bytes: &[u8]) -> Digest {
    let digest = Digest::of(bytes);
    upload_as(socket, digest, bytes).await;
    digest
}

/// [`upload`] with the digest already computed.
async fn upload_as(socket: &Path, digest: Digest, bytes: &[u8]) {
    let (mut reader, mut writer) = connect(socket).await;
    let chunks: Vec<&[u8]> = bytes.chunks(UPLOAD_CHUNK).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let reply = call(
            &mut reader,
            &mut writer,
            Request::Upload {
                digest,
                offset: (i * UPLOAD_CHUNK) as u64,
                data: chunk.to_vec(),
                last,
            },
        )
        .await;
        assert!(
            matches!(reply, Reply::Uploaded { plugin: Some(_) } if last)
                || matches!(reply, Reply::Uploaded { plugin: None } if !last),
            "{reply:?}"
        );
    }
}

fn submit_request(digest: Digest, slot: Option<&str>) -> Request {
    let mut request = SubmitRequest::new(digest);
    request.input = b"hi".to_vec();
    request.slot = slot.map(str::to_owned);
    Request::Submit(Box::new(request))
}

/// `total` submissions spread over `clients` pipelined connections; returns
/// submissions acknowledged per second (first write to last reply).
async fn intake(socket: &Path, digest: Digest, clients: usize, total: usize) -> f64 {
    intake_into(socket, digest, clients, total, None).await
}

/// As [`intake`], every submission to `slot` (`None`: each its own).
async fn intake_into(
    socket: &Path,
    digest: Digest,
    clients: usize,
    total: usize,
    slot: Option<&str>,
) -> f64 {
    let per_client = total / clients;
    let mut connections = Vec::new();
    for _ in 0..clients {
        connections.push(connect(socket).await);
    }
    let frames: Vec<Vec<u8>> = (0..per_client)
        .map(|i| {
            encode(&Envelope {
                id: i as u32 + 1,
                body: submit_request(digest, slot),
            })
            .unwrap()
        })
        .collect();
    let frames = std::sync::Arc::new(frames);
    let start = Instant::now();
    let mut handles = Vec::new();
    for (mut reader, writer) in connections {
        let frames = std::sync::Arc::clone(&frames);
        let write = tokio::spawn(async move {
            let mut writer = BufWriter::with_capacity(64 * 1024, writer);
            for frame in frames.iter() {
                writer.write_all(frame).await.unwrap();
            }
            writer.flush().await.unwrap();
            writer
        });
        let read = tokio::spawn(async move {
            let (mut accepted, mut rejected) = (0usize, 0usize);
            for _ in 0..per_client {
                let reply: Envelope<Reply> = read_frame(&mut reader).await.expect("reply");
                match reply.body {
                    Reply::Submitted(Submitted {
                        placement: Placement::Rejected(_),
                        ..
                    }) => rejected += 1,
                    Reply::Submitted(_) => accepted += 1,
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            (accepted, rejected)
        });
        handles.push((write, read));
    }
    let (mut accepted, mut rejected) = (0, 0);
    for (write, read) in handles {
        let (a, r) = read.await.unwrap();
        accepted += a;
        rejected += r;
        drop(write.await.unwrap());
    }
    let took = start.elapsed();
    assert_eq!(
        rejected, 0,
        "{rejected} submissions were rejected: raise the daemon's limits"
    );
    accepted as f64 / took.as_secs_f64()
}

/// Waits until the daemon holds no slot (every task ended); returns how long
/// that took.
async fn drain(socket: &Path) -> Duration {
    let start = Instant::now();
    let (mut reader, mut writer) = connect(socket).await;
    loop {
        // A page of slots (absent when there are none), then the end.
        let mut empty = true;
        let mut reply = call(&mut reader, &mut writer, Request::Slots).await;
        while let Reply::Slots(slots) = reply {
            empty &= slots.is_empty();
            let next: Envelope<Reply> = read_frame(&mut reader).await.expect("reply");
            reply = next.body;
        }
        assert!(matches!(reply, Reply::End), "unexpected reply {reply:?}");
        if empty {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the daemon did not drain"
        );
    }
}

/// Closed loop on one connection: Submit, then Wait for the report;
/// returns each iteration's latency in µs.
async fn latency(socket: &Path, digest: Digest, iterations: usize) -> Vec<f64> {
    let (mut reader, mut writer) = connect(socket).await;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        let Reply::Submitted(Submitted {
            id,
            placement: Placement::Running,
            ..
        }) = call(&mut reader, &mut writer, submit_request(digest, None)).await
        else {
            panic!("the submission was not taken");
        };
        let Reply::Report(report) =
            call(&mut reader, &mut writer, Request::Wait(TaskRef::Id(id))).await
        else {
            panic!("no report");
        };
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(
            report.outcome,
            TaskOutcome::Completed {
                output: b"hi".to_vec()
            }
        );
    }
    samples
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    quantile(&s, 0.5)
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
