//! Shutdown is single-flight and terminal: it stops every task, force-aborts
//! what outlives the grace and names it, gives every caller the same report,
//! and rejects adds from then on (SEMANTICS §7).

use taskhost::outcome::{RejectionKind, TaskOutcome};
use taskhost::supervisor::{
    BackoffPolicy, EventKind as K, ShutdownReport, Supervisor, SupervisorConfig, TaskError,
    TaskSpec,
};
use tokio::time::Instant;

use crate::common_sup::{
    NATIVE_LIMIT, Recorder, WASM_LIMIT, body, load, ms, plugin_body, returns, runtime, stubborn,
    until_canceled, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_names_the_stuck_spinners_and_every_caller_gets_the_same_report() {
    let rt = runtime();
    let sleeper = load(&rt, "sleeper").await;
    let spin = load(&rt, "spin").await;
    let sup = Supervisor::new(SupervisorConfig::default());
    let mut events = Recorder::new(&sup, WASM_LIMIT);
    let sleepy = |name: &str| {
        sup.add(TaskSpec::once(
            name,
            plugin_body(&rt, &sleeper, &[("ms", "60000")], b""),
        ))
    };
    let spinning = |name: &str| sup.add(TaskSpec::once(name, plugin_body(&rt, &spin, &[], b"")));
    // Added out of order: the report sorts the names.
    let spin_b = spinning("spin-b");
    let sleep_a = sleepy("sleep-a");
    let spin_a = spinning("spin-a");
    let sleep_b = sleepy("sleep-b");
    for s in [&sleep_a, &sleep_b] {
        events.until_count(s.id(), K::Progress, 1).await;
    }
    for s in [&spin_a, &spin_b] {
        events.until_count(s.id(), K::AttemptStarting, 1).await;
    }

    let started = std::time::Instant::now();
    let (one, two, three) = within(WASM_LIMIT, "shutdown", async {
        tokio::join!(
            sup.shutdown(ms(100)),
            sup.shutdown(ms(100)),
            sup.shutdown(ms(100))
        )
    })
    .await;
    let took = started.elapsed();
    println!("shutdown with two spinning guests and a 100 ms grace took {took:?}");
    let expected = ShutdownReport::GraceExceeded {
        stuck: vec!["spin-a".to_owned(), "spin-b".to_owned()],
    };
    assert_eq!(one, expected);
    assert_eq!(two, expected);
    assert_eq!(three, expected);
    assert!(took >= ms(100), "{took:?}");
    assert_eq!(sup.shutdown(ms(1)).await, expected, "a later caller too");

    assert_eq!(sleep_a.wait().await, TaskOutcome::Canceled);
    assert_eq!(sleep_b.wait().await, TaskOutcome::Canceled);
    assert_eq!(spin_a.wait().await, TaskOutcome::ForceAborted);
    assert_eq!(spin_b.wait().await, TaskOutcome::ForceAborted);
    assert!(
        sup.list().is_empty(),
        "shutdown waits until every task is gone"
    );
    assert!(sup.is_shutting_down());

    let late = sup.add(TaskSpec::once("late", returns(b"")));
    match late.try_outcome() {
        Some(TaskOutcome::Rejected {
            kind: RejectionKind::ShuttingDown,
            ..
        }) => {}
        other => panic!("expected Rejected ShuttingDown, got {other:?}"),
    }
    assert!(!sup.is_alive("late"));

    events.until_closed().await;
    let requested = events.all_of_kind(K::ShutdownRequested);
    assert_eq!(requested.len(), 1, "single-flight");
    let exceeded = events.all_of_kind(K::GraceExceeded);
    assert_eq!(exceeded.len(), 1);
    let reason = exceeded[0].reason.as_deref().unwrap_or("");
    assert!(reason.contains("spin-a, spin-b"), "{reason}");
    assert!(events.all_of_kind(K::AllStoppedWithinGrace).is_empty());
    assert!(requested[0].seq < exceeded[0].seq);
    let finished: Vec<_> = events
        .all_of_kind(K::TaskFinished)
        .iter()
        .map(|e| (e.name.as_deref().unwrap().to_owned(), e.outcome.unwrap()))
        .collect();
    for (name, outcome) in [
        ("sleep-a", "canceled"),
        ("sleep-b", "canceled"),
        ("spin-a", "force-aborted"),
        ("spin-b", "force-aborted"),
    ] {
        assert!(
            finished.contains(&(name.to_owned(), outcome)),
            "{name} {outcome}: {finished:?}"
        );
    }
    for e in events.all_of_kind(K::TaskFinished) {
        assert!(e.seq > requested[0].seq);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_within_grace_cancels_running_waiting_and_backing_off_tasks() {
    let sup = Supervisor::new(SupervisorConfig {
        max_concurrent: Some(2),
        ..SupervisorConfig::default()
    });
    let mut events = Recorder::new(&sup, NATIVE_LIMIT);
    let retrying = sup.add(
        TaskSpec::restartable("retrying", body(|_| async { Err(TaskError::fail("down")) }))
            .with_backoff(BackoffPolicy::constant(ms(3_600_000))),
    );
    events.until_kind(retrying.id(), K::BackoffScheduled).await;
    let running = [
        sup.add(TaskSpec::once("running-1", until_canceled())),
        sup.add(TaskSpec::once("running-2", until_canceled())),
    ];
    for r in &running {
        events.until_kind(r.id(), K::AttemptStarting).await;
    }
    let waiting = sup.add(TaskSpec::once("waiting", returns(b"never")));
    events.until_kind(waiting.id(), K::TaskAdded).await;

    let started = Instant::now();
    let (one, two) = tokio::join!(sup.shutdown(ms(1000)), sup.shutdown(ms(5)));
    assert_eq!(one, ShutdownReport::AllStopped);
    assert_eq!(two, ShutdownReport::AllStopped);
    assert_eq!(started.elapsed(), ms(0), "cooperative tasks stop at once");

    let report = retrying.report().await;
    assert_eq!(
        (report.outcome.clone(), report.attempts),
        (TaskOutcome::Canceled, 1)
    );
    for r in running {
        let report = r.report().await;
        assert_eq!(
            (report.outcome.clone(), report.attempts),
            (TaskOutcome::Canceled, 1)
        );
    }
    let report = waiting.report().await;
    assert_eq!(
        (report.outcome.clone(), report.attempts),
        (TaskOutcome::Canceled, 0)
    );

    events.until_closed().await;
    assert_eq!(events.all_of_kind(K::ShutdownRequested).len(), 1);
    assert_eq!(events.all_of_kind(K::AllStoppedWithinGrace).len(), 1);
    assert!(events.all_of_kind(K::GraceExceeded).is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_force_aborts_a_stubborn_body_exactly_at_the_grace() {
    let sup = Supervisor::new(SupervisorConfig::default());
    let mut events = Recorder::new(&sup, NATIVE_LIMIT);
    let stuck = sup.add(TaskSpec::once("stuck", stubborn()));
    let fine = sup.add(TaskSpec::once("fine", until_canceled()));
    events.until_kind(stuck.id(), K::AttemptStarting).await;
    events.until_kind(fine.id(), K::AttemptStarting).await;

    let started = Instant::now();
    let report = sup.shutdown(ms(300)).await;
    assert_eq!(started.elapsed(), ms(300));
    assert_eq!(
        report,
        ShutdownReport::GraceExceeded {
            stuck: vec!["stuck".to_owned()]
        }
    );
    assert_eq!(stuck.wait().await, TaskOutcome::ForceAborted);
    assert_eq!(fine.wait().await, TaskOutcome::Canceled);
}
