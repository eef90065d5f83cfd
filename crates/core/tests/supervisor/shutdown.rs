//! Shutdown is single-flight and terminal: it stops every task, force-aborts
//! what outlives the grace and names it (and only it), gives every caller
//! the same report, and rejects adds from then on (docs/semantics.md).

use std::sync::{Arc, Condvar, Mutex};

use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::EventKind as K;
use taskhost_runtime::prelude::*;
use tokio::time::Instant;

use crate::common_sup::{
    Fixture, NATIVE_LIMIT, WASM_LIMIT, load, ms, params, returns, runtime, stubborn,
    until_canceled, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_names_the_stuck_spinners_and_every_caller_gets_the_same_report() {
    let rt = runtime();
    let sleeper = load(&rt, "sleeper").await;
    let spin = load(&rt, "spin").await;
    let mut fx = Fixture::wasm();
    let sleepy = |name: &str| {
        fx.add(TaskSpec::once(
            name,
            PluginTask::new(&rt, &sleeper).params(params(&[("ms", "60000")])),
        ))
    };
    let spinning = |name: &str| fx.add(TaskSpec::once(name, PluginTask::new(&rt, &spin)));
    // Added out of order: the report sorts the names.
    let spin_b = spinning("spin-b");
    let sleep_a = sleepy("sleep-a");
    let spin_a = spinning("spin-a");
    let sleep_b = sleepy("sleep-b");
    for s in [&sleep_a, &sleep_b] {
        fx.events.until_count(s.id(), K::Progress, 1).await;
    }
    for s in [&spin_a, &spin_b] {
        fx.events.until_count(s.id(), K::AttemptStarting, 1).await;
    }

    let sup = &fx.sup;
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

    fx.events.until_closed().await;
    let requested = fx.events.all_of_kind(K::ShutdownRequested);
    assert_eq!(requested.len(), 1, "single-flight");
    let exceeded = fx.events.all_of_kind(K::GraceExceeded);
    assert_eq!(exceeded.len(), 1);
    let reason = exceeded[0].reason.as_deref().unwrap_or("");
    assert!(reason.contains("spin-a, spin-b"), "{reason}");
    assert!(fx.events.all_of_kind(K::AllStoppedWithinGrace).is_empty());
    assert!(requested[0].seq < exceeded[0].seq);
    let finished: Vec<_> = fx
        .events
        .all_of_kind(K::TaskFinished)
        .iter()
        .map(|e| (e.name.as_deref().unwrap().to_owned(), e.outcome.unwrap()))
        .collect();
    for (name, outcome) in [
        ("sleep-a", OutcomeKind::Canceled),
        ("sleep-b", OutcomeKind::Canceled),
        ("spin-a", OutcomeKind::ForceAborted),
        ("spin-b", OutcomeKind::ForceAborted),
    ] {
        assert!(
            finished.contains(&(name.to_owned(), outcome)),
            "{name} {outcome}: {finished:?}"
        );
    }
    for e in fx.events.all_of_kind(K::TaskFinished) {
        assert!(e.seq > requested[0].seq);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_within_grace_cancels_running_waiting_and_backing_off_tasks() {
    let mut fx = Fixture::new(
        Supervisor::builder().max_concurrent(2).build(),
        NATIVE_LIMIT,
    );
    let retrying = fx.add(
        TaskSpec::restartable(
            "retrying",
            native(|_| async { Err(TaskError::fail("down")) }),
        )
        .with_backoff(BackoffPolicy::constant(ms(3_600_000))),
    );
    fx.events
        .until_kind(retrying.id(), K::BackoffScheduled)
        .await;
    let running = [
        fx.add(TaskSpec::once("running-1", until_canceled())),
        fx.add(TaskSpec::once("running-2", until_canceled())),
    ];
    for r in &running {
        fx.events.until_kind(r.id(), K::AttemptStarting).await;
    }
    let waiting = fx.add(TaskSpec::once("waiting", returns(b"never")));
    fx.events.until_kind(waiting.id(), K::TaskAdded).await;

    let started = Instant::now();
    let (one, two) = tokio::join!(fx.sup.shutdown(ms(1000)), fx.sup.shutdown(ms(5)));
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

    fx.events.until_closed().await;
    assert_eq!(fx.events.all_of_kind(K::ShutdownRequested).len(), 1);
    assert_eq!(fx.events.all_of_kind(K::AllStoppedWithinGrace).len(), 1);
    assert!(fx.events.all_of_kind(K::GraceExceeded).is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_force_aborts_a_stubborn_body_exactly_at_the_grace() {
    let mut fx = Fixture::native();
    let stuck = fx.add(TaskSpec::once("stuck", stubborn()));
    let fine = fx.add(TaskSpec::once("fine", until_canceled()));
    fx.events.until_kind(stuck.id(), K::AttemptStarting).await;
    fx.events.until_kind(fine.id(), K::AttemptStarting).await;

    let started = Instant::now();
    let report = fx.sup.shutdown(ms(300)).await;
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

/// Part of a body's future whose drop blocks the thread dropping it until
/// the test opens `release`, after saying so on `dropping`: a body that
/// takes its time to be torn down (as a plugin instance may). Force-aborted,
/// such a task has its outcome but is still registered until it is gone.
struct SlowTeardown {
    dropping: tokio::sync::mpsc::UnboundedSender<()>,
    release: Arc<(Mutex<bool>, Condvar)>,
}

impl Drop for SlowTeardown {
    fn drop(&mut self) {
        let _ = self.dropping.send(());
        let (lock, opened) = &*self.release;
        let open = lock.lock().unwrap();
        // Bounded, so that a failing test ends instead of hanging.
        let _ = opened
            .wait_timeout_while(open, WASM_LIMIT, |open| !*open)
            .unwrap();
    }
}

/// Regression: `shutdown` named every task whose outcome was ForceAborted,
/// including one an earlier cancel had already force-aborted and that was
/// only still being torn down when shutdown began. Only tasks whose outcome
/// was undecided when shutdown began and that the shutdown had to
/// force-abort are stuck.
///
/// Deterministic: the earlier task's teardown blocks (on a worker thread of
/// its own) until the shutdown has provably taken its list of tasks (it has
/// asked the second task to stop), so the decided task is on that list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_stuck_list_does_not_name_a_task_an_earlier_cancel_already_force_aborted() {
    let mut fx = Fixture::new(Supervisor::builder().grace(ms(50)).build(), WASM_LIMIT);
    let release = Arc::new((Mutex::new(false), Condvar::new()));
    let (dropping_tx, mut dropping) = tokio::sync::mpsc::unbounded_channel();
    let teardown = Arc::clone(&release);
    let aborted = fx.add(TaskSpec::once(
        "aborted-earlier",
        native(move |_| {
            let guard = SlowTeardown {
                dropping: dropping_tx.clone(),
                release: Arc::clone(&teardown),
            };
            async move {
                let _guard = guard;
                std::future::pending().await
            }
        }),
    ));
    // Ignores its stop too, but says when the stop reached it.
    let (stop_seen_tx, mut stop_seen) = tokio::sync::mpsc::unbounded_channel();
    let stuck = fx.add(TaskSpec::once(
        "stuck-at-shutdown",
        native(move |ctx| {
            let stop_seen = stop_seen_tx.clone();
            async move {
                ctx.cancellation().cancelled().await;
                let _ = stop_seen.send(());
                std::future::pending().await
            }
        }),
    ));
    fx.events.until_kind(aborted.id(), K::AttemptStarting).await;
    fx.events.until_kind(stuck.id(), K::AttemptStarting).await;

    // The cancel force-aborts the first task at its grace: its outcome is
    // decided, but it is still being torn down, so it is still registered.
    assert!(
        within(
            WASM_LIMIT,
            "cancel",
            fx.sup.cancel_with_grace(aborted.id(), ms(10))
        )
        .await
    );
    assert_eq!(aborted.try_outcome(), Some(TaskOutcome::ForceAborted));
    within(WASM_LIMIT, "the teardown begins", dropping.recv()).await;
    assert!(fx.sup.is_alive("aborted-earlier"));
    assert!(fx.sup.info(aborted.id()).is_some());

    let shutdown = tokio::spawn({
        let sup = fx.sup.clone();
        async move { sup.shutdown(ms(100)).await }
    });
    // The second task is asked to stop only after shutdown has closed the
    // registry and taken its list, which holds the first task; now its
    // teardown may end.
    within(WASM_LIMIT, "the shutdown's stop", stop_seen.recv()).await;
    assert!(fx.sup.is_shutting_down());
    assert!(
        fx.sup.is_alive("aborted-earlier"),
        "still registered as shutdown runs"
    );
    {
        let (lock, opened) = &*release;
        *lock.lock().unwrap() = true;
        opened.notify_all();
    }

    let report = within(WASM_LIMIT, "shutdown", shutdown).await.unwrap();
    assert_eq!(
        report,
        ShutdownReport::GraceExceeded {
            stuck: vec!["stuck-at-shutdown".to_owned()]
        },
        "the task decided before the shutdown is not stuck"
    );
    assert_eq!(stuck.wait().await, TaskOutcome::ForceAborted);
    assert_eq!(aborted.clone().wait().await, TaskOutcome::ForceAborted);
    assert!(fx.sup.list().is_empty(), "shutdown waited for both");

    fx.events.until_closed().await;
    let requested = fx.events.all_of_kind(K::ShutdownRequested)[0].seq;
    let of_aborted = |kind| fx.events.of_kind(aborted.id(), kind)[0].seq;
    assert!(
        of_aborted(K::TaskFinished) < requested && requested < of_aborted(K::TaskRemoved),
        "decided before the shutdown, gone during it"
    );
    let exceeded = fx.events.all_of_kind(K::GraceExceeded);
    assert_eq!(exceeded.len(), 1);
    let reason = exceeded[0].reason.as_deref().unwrap_or("");
    assert!(
        reason.contains("stuck-at-shutdown") && !reason.contains("aborted-earlier"),
        "{reason}"
    );
}

/// A shutdown with no grace while spinning guests hold the workers: the stop
/// reaches each guest from the caller's thread and the epoch ticker aborts
/// it at once, often in the middle of its actor's poll of the body (before
/// the actor has seen the stop); every one is still force-aborted, never
/// canceled (a guest aborted by its deadline did not stop cooperatively).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_grace_shutdown_force_aborts_every_spinner() {
    let rt = runtime();
    let spin = load(&rt, "spin").await;
    let fx = Fixture::wasm();
    let spinners: Vec<_> = (0..6)
        .map(|i| {
            fx.add(TaskSpec::once(
                format!("spin-{i}"),
                PluginTask::new(&rt, &spin),
            ))
        })
        .collect();
    for s in &spinners {
        while !fx
            .sup
            .list()
            .iter()
            .any(|t| t.id == s.id() && t.phase == TaskState::Running)
        {
            tokio::task::yield_now().await;
        }
    }
    let report = within(WASM_LIMIT, "shutdown", fx.sup.shutdown(ms(0))).await;
    assert!(
        matches!(report, ShutdownReport::GraceExceeded { .. }),
        "{report:?}"
    );
    for s in spinners {
        assert_eq!(s.wait().await, TaskOutcome::ForceAborted);
    }
}
