//! Resource exhaustion: 1,000 parked sleepers in one daemon (its peak RSS is
//! measured and held to a documented bound), 10,000 in a pool sized from
//! `--max-concurrent` alone, and a full instance pool (work
//! waits for a permit and is admitted later; an attempt that still finds
//! the pool full fails retryably; never a crash), and a `--max-concurrent`
//! far above what the process can map (capped at start, no attempt
//! fails). Guests that exhaust
//! memory, stack, tables or time one by one are in `bad_plugins.rs`.

use crate::{common, daemon, wire};

use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::{Daemon, LIMIT, proc_kib};
use taskhost::daemon::Client;
use taskhost::daemon::protocol::{Placement, Reply, Request, SubmitRequest, TaskRow, TaskState};
use taskhost::outcome::TaskOutcome;
use taskhost::plugin_task::PluginTask;
use taskhost::runtime::{
    AllocatorChoice, AttemptError, AttemptFacts, AttemptRequest, NullSink, Runtime, RuntimeConfig,
    Sandbox, StopSignals,
};
use taskhost::supervisor::{
    BackoffPolicy, EventKind, Jitter, RestartPolicy, ShutdownReport, Supervisor, TaskSpec,
};
use wire::params;

/// Parked sleepers in the RSS test.
const SLEEPERS: usize = 1_000;
/// The documented bound (README "Limits", TESTING.md) on the daemon's peak
/// RSS with 1,000 parked sleepers.
const PARKED_RSS_BOUND_MIB: u64 = 256;

/// Polls `List` until `pred` holds for the rows, at most `limit`.
async fn until_tasks(
    conn: &Client,
    limit: Duration,
    mut pred: impl FnMut(&[TaskRow]) -> bool,
) -> Vec<TaskRow> {
    let deadline = Instant::now() + limit;
    loop {
        let rows = conn.list(false).await.expect("ps");
        if pred(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "the tasks never got there: {} rows",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_parked_sleepers_stay_under_the_rss_bound_and_all_resolve() {
    let (_, peak_kib) = park_and_cancel(
        SLEEPERS,
        &[
            "--max-concurrent",
            "1010",
            "--pool-instances",
            "1100",
            "--max-total-pending",
            "2000",
        ],
    )
    .await;
    assert!(
        peak_kib / 1024 < PARKED_RSS_BOUND_MIB,
        "peak RSS {} MiB is over the documented bound of {PARKED_RSS_BOUND_MIB} MiB",
        peak_kib / 1024
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_parked_sleepers_fit_a_pool_sized_from_max_concurrent() {
    // No --pool-instances: the pool is sized for --max-concurrent (within
    // the address space), so all 10,000 run at once and none finds the
    // pool full.
    let n = 10_000;
    // 200 connections wait for the reports.
    let config = tempfile::NamedTempFile::new().expect("a config file");
    std::fs::write(config.path(), "max_connections = 1024\n").unwrap();
    let (per_task_kib, _) = park_and_cancel(
        n,
        &[
            // Room for the hello that checks the daemon still serves.
            "--max-concurrent",
            "10010",
            "--max-total-pending",
            "20000",
            "--config",
            config.path().to_str().unwrap(),
            "--store",
            "memory",
        ],
    )
    .await;
    // Generous for a debug build on a shared machine; the benchmark suite
    // holds the release figure to 48 KiB.
    assert!(
        per_task_kib <= 96,
        "{per_task_kib} KiB of RSS per parked sleeper"
    );
}

/// Parks `n` sleepers in a daemon started with `flags` (each in its own
/// slot, all running at once), checks they all hold an instance, then
/// cancels them all with a shutdown and checks every report: returns the
/// RSS they added per task (KiB) and the daemon's peak RSS (KiB).
async fn park_and_cancel(n: usize, flags: &[&str]) -> (u64, u64) {
    let mut d = Daemon::start(flags);
    let log = d.process.as_ref().unwrap().stderr_seen.join("\n");
    assert!(
        !log.contains("running at most"),
        "max_concurrent was not lowered: {log}"
    );
    let pid = d.pid();
    let conn = wire::connect(&d.socket).await;
    let digest = wire::upload_plugin(&conn, "sleeper").await;
    let idle_kib = proc_kib(pid, "VmRSS");

    // n submissions, pipelined; each sleeps ten minutes in one host
    // sleep (step_ms = ms), in its own slot.
    let started = Instant::now();
    let mut pending = Vec::new();
    for _ in 0..n {
        let mut s = SubmitRequest::new(digest);
        s.params = params(&[("ms", "600000"), ("step_ms", "600000")]);
        pending.push(
            conn.request(Request::Submit(Box::new(s)))
                .await
                .expect("a submission"),
        );
    }
    let mut ids = Vec::new();
    for mut rx in pending {
        match rx.next().await {
            Some(Reply::Submitted(s)) if s.placement == Placement::Running => ids.push(s.id),
            other => panic!("a sleeper was not admitted: {other:?}"),
        }
    }
    until_tasks(&conn, LIMIT, |rows| {
        rows.len() == n && rows.iter().all(|r| r.state == TaskState::Running)
    })
    .await;
    // Running means it holds a permit; wait until every instance exists and
    // is parked: the resident size stops growing.
    let mut last = proc_kib(pid, "VmRSS");
    let mut stable = 0;
    while stable < 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = proc_kib(pid, "VmRSS");
        stable = if now.abs_diff(last) < 1024 {
            stable + 1
        } else {
            0
        };
        last = now;
    }
    let parked_in = started.elapsed();
    let rss_kib = proc_kib(pid, "VmRSS");
    let hwm_kib = proc_kib(pid, "VmHWM");
    let per_task_kib = rss_kib.saturating_sub(idle_kib) / n as u64;
    eprintln!(
        "{n} parked sleepers: daemon VmRSS {} MiB ({per_task_kib} KiB per task), VmHWM (peak) {} MiB, idle before {} MiB; all parked in {:.1}s",
        rss_kib / 1024,
        hwm_kib / 1024,
        idle_kib / 1024,
        parked_in.as_secs_f64()
    );

    // The daemon stays responsive with every guest parked.
    d.assert_served("with-all-parked");

    // Every sleeper has a waiter (at most 50 per connection: a connection
    // has at most 64 requests in flight).
    let mut waits = Vec::new();
    for chunk in ids.chunks(50) {
        // Each wait keeps its connection open until it is answered.
        let waiter = wire::connect(&d.socket).await;
        for id in chunk {
            waits.push((
                *id,
                waiter
                    .request(Request::Wait((*id).into()))
                    .await
                    .expect("a wait"),
            ));
        }
    }
    let stopping = Instant::now();
    let reply = wire::call(
        &conn,
        Request::Shutdown {
            grace: Some(Duration::from_secs(10)),
            cancel_all: true,
        },
    )
    .await;
    assert_eq!(
        reply,
        Reply::ShutdownDone(ShutdownReport::AllStopped),
        "all stop within the grace"
    );
    for (id, mut rx) in waits {
        match rx.next().await {
            Some(Reply::Report(report)) => {
                assert_eq!(report.outcome, TaskOutcome::Canceled, "sleeper {id}")
            }
            other => panic!("sleeper {id}: no report: {other:?}"),
        }
    }
    eprintln!(
        "{n} sleepers canceled and reported in {:.2}s",
        stopping.elapsed().as_secs_f64()
    );
    let (status, out) = d.finish(LIMIT);
    assert_eq!(status.code(), Some(0), "{}", out.stderr);
    assert!(!d.socket.exists(), "the socket is removed");
    (per_task_kib, hwm_kib)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_instance_pool_admits_work_later_and_never_crashes() {
    // 24 pool slots less the reserve for describe: at most 16 attempts.
    let mut d = Daemon::start(&["--pool-instances", "24", "--max-concurrent", "256"]);
    let log = d.process.as_ref().unwrap().stderr_seen.join("\n");
    assert!(
        log.contains("running at most 16 attempts at once"),
        "the daemon says it lowered max_concurrent: {log}"
    );
    let events = wire::follow_events(&d.socket).await;
    let conn = wire::connect(&d.socket).await;
    let digest = wire::upload_plugin(&conn, "sleeper").await;
    let mut waits = Vec::new();
    for _ in 0..48 {
        let mut s = SubmitRequest::new(digest);
        s.params = params(&[("ms", "300")]);
        let submitted = conn.submit(s).await.expect("admitted");
        assert_eq!(submitted.placement, Placement::Running);
        waits.push(submitted.id);
    }
    // While they run: never more than 16 running, in any listing and in
    // the events (below), and the rest wait for a permit.
    let (mut listed, mut saw_waiting) = (0, false);
    let deadline = Instant::now() + LIMIT;
    loop {
        let rows = conn.list(false).await.expect("ps");
        let running = rows
            .iter()
            .filter(|r| r.state == TaskState::Running)
            .count();
        listed = listed.max(running);
        saw_waiting |= rows.iter().any(|r| r.state == TaskState::Waiting);
        if rows.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the sleepers never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(listed <= 16, "ps listed {listed} running in a pool for 16");
    assert!(saw_waiting, "work beyond the pool waited for a permit");
    let waiter = wire::connect(&d.socket).await;
    for id in waits {
        let r = waiter.wait(id.into()).await.expect("a report");
        assert!(
            matches!(r.outcome, TaskOutcome::Completed { .. }),
            "{id}: {:?}",
            r.outcome
        );
    }
    d.assert_served("after-a-full-pool");
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // An attempt holds its permit from its start event to its end event.
    let (mut now, mut most, mut starts) = (0i32, 0, 0);
    for e in events.await.expect("the event follower") {
        match e.kind {
            EventKind::AttemptStarting => {
                starts += 1;
                now += 1;
            }
            EventKind::AttemptSucceeded
            | EventKind::AttemptFailed
            | EventKind::AttemptTimedOut
            | EventKind::AttemptCanceled => now -= 1,
            _ => continue,
        }
        most = most.max(now);
    }
    assert_eq!(starts, 49, "48 sleepers and one hello, an attempt each");
    assert_eq!(now, 0, "every attempt ended");
    assert!(most <= 16, "{most} attempts ran at once in a pool for 16");
    assert!(most >= 8, "the pool was used: at most {most} at once");
}

/// Under an address-space limit that leaves room for a dozen instances,
/// `--max-concurrent 20000` is capped at start, with the effective figure
/// and its reason in the log, and 30 sleepers in distinct slots all
/// complete: none fails for a limit the daemon could have known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_concurrent_beyond_what_fits_is_capped_and_nothing_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("h.sock");
    let mut cmd = std::process::Command::new("prlimit");
    // Half of 200 GiB for instances: 12 of 8 GiB, too few for a pool.
    cmd.args(["--as=214748364800", common::host_bin()]);
    common::host_env(&mut cmd).args([
        "serve",
        "--store",
        "memory",
        "--max-concurrent",
        "20000",
        "--max-total-pending",
        "20000",
        "--socket",
        socket.to_str().unwrap(),
        "--state-dir",
        tmp.path().join("state").to_str().unwrap(),
    ]);
    let mut daemon = common::Running::spawn_command(cmd);
    daemon.wait_for_line("taskhost daemon listening on", LIMIT);
    let log = daemon.stderr_seen.join("\n");
    assert!(
        log.contains("max_concurrent 20000 is more than this process can run at once; running at most 4 attempts at once, bounded by the instances this process can map"),
        "the daemon says what it runs at once and why: {log}"
    );
    assert!(log.contains("OnDemand { capacity: 12 }"), "{log}");
    let conn = wire::connect(&socket).await;
    let digest = wire::upload_plugin(&conn, "sleeper").await;
    let mut ids = Vec::new();
    for i in 0..30 {
        let mut s = SubmitRequest::new(digest);
        s.slot = Some(format!("s{i}"));
        s.params = params(&[("ms", "100")]);
        ids.push(conn.submit(s).await.expect("admitted").id);
    }
    let waiter = wire::connect(&socket).await;
    for id in ids {
        let r = waiter.wait(id.into()).await.expect("a report");
        assert!(
            matches!(r.outcome, TaskOutcome::Completed { .. }) && r.attempts == 1,
            "{id}: {:?} after {} attempts",
            r.outcome,
            r.attempts
        );
    }
    daemon.signal("TERM");
    let (status, _) = daemon.finish(LIMIT);
    assert!(status.success(), "{status:?}");
}

fn pooled_runtime(instances: u32) -> Arc<Runtime> {
    Arc::new(
        Runtime::new(
            &RuntimeConfig::default()
                .cache_dir(Some(common::cache_dir()))
                .allocator(AllocatorChoice::Pooling)
                .pool_instances(instances),
        )
        .expect("a pooled runtime"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_finds_the_pool_full_fails_retryably_and_runs_later() {
    let runtime = pooled_runtime(16);
    let plugin = runtime
        .load_file(&common::plugin("sleeper"))
        .await
        .expect("sleeper loads");

    // Fill every slot with an instance, then ask for one more.
    let request = AttemptRequest {
        facts: Arc::new(AttemptFacts::default()),
        input: Arc::from(&b""[..]),
        sandbox: Arc::new(Sandbox::default()),
        sink: Arc::new(NullSink),
        parking: None,
        record: None,
    };
    let signals = StopSignals::default();
    let mut held = Vec::new();
    let err = loop {
        match runtime.prepare_attempt(&plugin, &request, &signals).await {
            Ok(prepared) => held.push(prepared),
            Err(err) => break err,
        }
        assert!(
            held.len() <= 16,
            "a pool of 16 held {} instances",
            held.len()
        );
    };
    match &err {
        AttemptError::Fail { reason, .. } => {
            assert!(reason.contains("the instance pool is full"), "{reason}");
            assert!(!reason.contains('\n'), "one line: {reason}");
        }
        other => panic!("a full pool is a retryable Fail, got {other:?}"),
    }
    drop(held);

    // Through a supervisor without a concurrency limit: the tasks that find
    // the pool full retry after a backoff and complete once slots free up.
    let supervisor = Supervisor::default();
    let backoff = BackoffPolicy::new(
        Duration::from_millis(50),
        Duration::from_millis(200),
        2.0,
        Jitter::None,
    )
    .unwrap();
    let waiters: Vec<_> = (0..24)
        .map(|i| {
            let body = PluginTask::new(&runtime, &plugin).params(params(&[("ms", "200")]));
            supervisor.add(
                TaskSpec::from_defaults(format!("s{i}"), body)
                    .with_restart(RestartPolicy::OnFailure)
                    .with_backoff(backoff.clone()),
            )
        })
        .collect();
    let mut retried = 0;
    for waiter in waiters {
        let report = tokio::time::timeout(LIMIT, waiter.report())
            .await
            .expect("every task ends");
        assert!(
            matches!(report.outcome, TaskOutcome::Completed { .. }),
            "{:?}",
            report.outcome
        );
        if report.attempts > 1 {
            assert!(
                report.history[0]
                    .result
                    .contains("the instance pool is full"),
                "{:?}",
                report.history
            );
            retried += 1;
        }
    }
    assert!(retried > 0, "some tasks found the pool full and retried");
    supervisor.shutdown(Duration::from_secs(1)).await;
}
