//! A task's life from add to removal: once, periodic, refused registrations
//! (duplicate name, registry bound) and specs that inherit the supervisor's
//! defaults (docs/semantics.md).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskhost_core::supervisor::{BackoffSource, EventKind as K, TaskDefaults};
use taskhost_runtime::prelude::*;
use tokio::time::Instant;

use crate::common_sup::{
    COMPLETED_ONCE, ENDED, FAILED_ONCE, Fixture, NATIVE_LIMIT, REGISTERED, REJECTED_AT_ADD,
    SUCCEEDED_THEN_PAUSED, load, ms, returns, runtime, sequence, sleeps, until_canceled, within,
};

#[tokio::test(start_paused = true)]
async fn once_task_completes_with_its_output() {
    let mut fx = Fixture::native();
    let (id, report) = fx.run(TaskSpec::once("one", returns(b"done"))).await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"done".to_vec()
        }
    );
    assert_eq!(report.attempts, 1);
    assert_eq!((&*report.name, &*report.slot), ("one", "one"));
    assert_eq!(report.history.len(), 1);
    assert_eq!(report.history[0].result, "succeeded");
    assert_eq!(report.duration, Duration::ZERO, "it returned at once");

    fx.assert_kinds(id, &COMPLETED_ONCE);
    let finished = &fx.events.of_kind(id, K::TaskFinished)[0];
    assert_eq!(finished.outcome, Some(OutcomeKind::Completed));
    assert_eq!(finished.attempt, Some(1));
    assert!(
        !fx.sup.is_alive("one"),
        "the name is free once the task is removed"
    );
    assert!(fx.sup.list().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_plugin_task_completes_with_its_output_and_guest_log() {
    let rt = runtime();
    let hello = load(&rt, "hello").await;
    let mut fx = Fixture::wasm();
    let task = PluginTask::new(&rt, &hello).input(b"hi".to_vec());
    let (id, report) = fx.run(TaskSpec::once("hello", task)).await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"hi".to_vec()
        }
    );
    assert_eq!(report.attempts, 1);

    fx.assert_kinds(id, &COMPLETED_ONCE);
    let logs: Vec<_> = fx
        .events
        .seen
        .iter()
        .filter(|e| e.task_id == Some(id) && e.kind == K::GuestLog)
        .collect();
    assert!(
        logs.iter()
            .any(|e| e.reason.as_deref() == Some("hello: got 2 bytes") && e.attempt == Some(1)),
        "the guest's log line is an event of attempt 1: {logs:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn once_task_failure_is_final_and_keeps_the_exit_code() {
    let mut fx = Fixture::native();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let (id, report) = fx
        .run(TaskSpec::once(
            "fails",
            native(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    Err(TaskError::Fail {
                        reason: "disk full".into(),
                        exit_code: Some(5),
                    })
                }
            }),
        ))
        .await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Failed {
            reason: "disk full".into(),
            exit_code: Some(5)
        }
    );
    assert_eq!(report.attempts, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    fx.assert_kinds(id, &FAILED_ONCE);
    let failed = &fx.events.of_kind(id, K::AttemptFailed)[0];
    assert_eq!(failed.reason.as_deref(), Some("disk full"));
    assert_eq!(failed.exit_code, Some(5));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_native_body_is_a_failed_attempt() {
    let sup = Supervisor::default();
    let waiter = sup.add(TaskSpec::once(
        "panics",
        native(|_| async { panic!("body blew up") }),
    ));
    match within(NATIVE_LIMIT, "outcome", waiter.wait()).await {
        TaskOutcome::Failed { reason, exit_code } => {
            assert!(
                reason.contains("panicked") && reason.contains("body blew up"),
                "{reason}"
            );
            assert_eq!(exit_code, None);
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn duplicate_name_is_rejected_already_exists() {
    let mut fx = Fixture::native();
    let first = fx.add(TaskSpec::once("dup", until_canceled()));
    fx.events.until_kind(first.id(), K::AttemptStarting).await;

    let second = fx.add(TaskSpec::once("dup", returns(b"never")));
    assert!(second.id() > first.id());
    match second.try_outcome() {
        Some(TaskOutcome::Rejected {
            kind: RejectionKind::AlreadyExists,
            reason,
        }) => assert!(reason.contains("`dup`"), "{reason}"),
        other => panic!("expected Rejected AlreadyExists at once, got {other:?}"),
    }
    let report = second.report().await;
    assert_eq!(report.attempts, 0);
    assert_eq!(report.duration, Duration::ZERO);
    let failed = fx.events.until_kind(report.id, K::TaskAddFailed).await;
    assert_eq!(failed.rejection, Some(RejectionKind::AlreadyExists));
    assert_eq!(failed.outcome, Some(OutcomeKind::Rejected));
    fx.assert_kinds(report.id, &REJECTED_AT_ADD);

    // The first task is untouched.
    assert_eq!(first.try_outcome(), None);
    assert!(fx.sup.is_alive("dup"));
    assert!(fx.sup.cancel(first.id()).await);
    assert_eq!(first.wait().await, TaskOutcome::Canceled);
}

#[tokio::test(start_paused = true)]
async fn registry_bound_rejects_with_resource_limit() {
    let sup = Supervisor::builder().max_registered_tasks(2).build();
    let a = sup.add(TaskSpec::once("a", until_canceled()));
    let b = sup.add(TaskSpec::once("b", until_canceled()));
    let c = sup.add(TaskSpec::once("c", returns(b"c")));
    match c.try_outcome() {
        Some(TaskOutcome::Rejected {
            kind: RejectionKind::ResourceLimit,
            reason,
        }) => assert!(reason.contains('2'), "{reason}"),
        other => panic!("expected Rejected ResourceLimit, got {other:?}"),
    }
    assert_eq!(a.try_outcome(), None);
    assert_eq!(b.try_outcome(), None);
    assert_eq!(sup.list().len(), 2);

    // A task that is gone frees its place.
    assert!(sup.remove(a.id()));
    sup.gone(a.id()).await;
    assert_eq!(a.wait().await, TaskOutcome::Canceled);
    let c2 = sup.add(TaskSpec::once("c", returns(b"c")));
    assert_eq!(
        within(NATIVE_LIMIT, "c2", c2.wait()).await,
        TaskOutcome::Completed {
            output: b"c".to_vec()
        }
    );
    assert!(sup.cancel(b.id()).await);
}

#[tokio::test(start_paused = true)]
async fn periodic_task_reruns_every_interval_until_canceled() {
    let mut fx = Fixture::native();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&starts);
    let waiter = fx.add(TaskSpec::periodic(
        "tick",
        native(move |_| {
            log.lock().unwrap().push(Instant::now());
            async {
                tokio::time::sleep(ms(10)).await;
                Ok(b"tick".to_vec())
            }
        }),
        ms(100),
    ));
    let id = waiter.id();
    fx.events.until_count(id, K::AttemptSucceeded, 3).await;
    assert_eq!(
        waiter.try_outcome(),
        None,
        "a periodic task never completes"
    );

    assert!(fx.sup.cancel(id).await);
    let (_, report) = fx.settle(waiter).await;
    assert_eq!(report.outcome, TaskOutcome::Canceled);
    assert_eq!(report.attempts, 3);

    let starts = starts.lock().unwrap().clone();
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, [ms(110), ms(110)], "10 ms run + 100 ms interval");

    fx.assert_kinds(
        id,
        &sequence(&[
            &REGISTERED,
            &SUCCEEDED_THEN_PAUSED.repeat(3),
            &[K::TaskRemoveRequested],
            &ENDED,
        ]),
    );
    for e in fx.events.of_kind(id, K::BackoffScheduled) {
        assert_eq!(e.source, Some(BackoffSource::Success));
        assert_eq!(e.delay_ms, Some(100));
    }
}

#[tokio::test(start_paused = true)]
async fn periodic_task_with_zero_interval_still_waits_one_millisecond() {
    let mut fx = Fixture::native();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&starts);
    let waiter = fx.add(TaskSpec::periodic(
        "busy",
        native(move |_| {
            log.lock().unwrap().push(Instant::now());
            async { Ok(Vec::new()) }
        }),
        Duration::ZERO,
    ));
    let id = waiter.id();
    fx.events.until_count(id, K::AttemptSucceeded, 3).await;
    assert!(fx.sup.cancel(id).await);
    let (_, report) = fx.settle(waiter).await;
    assert_eq!(report.outcome, TaskOutcome::Canceled);
    let starts = starts.lock().unwrap().clone();
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, [ms(1), ms(1)]);
    let delays: Vec<_> = fx
        .events
        .of_kind(id, K::BackoffScheduled)
        .iter()
        .map(|e| e.delay_ms)
        .collect();
    assert_eq!(delays, [Some(1); 3]);
}

#[tokio::test(start_paused = true)]
async fn from_defaults_inherits_the_supervisors_task_defaults() {
    let mut defaults = TaskDefaults::default();
    defaults.restart = RestartPolicy::OnFailure;
    defaults.backoff = BackoffPolicy::constant(ms(5));
    defaults.timeout = Some(ms(50));
    defaults.max_retries = Some(2);
    let mut fx = Fixture::new(
        Supervisor::builder().defaults(defaults).build(),
        NATIVE_LIMIT,
    );
    let always_fails = || {
        native(|_| async {
            Err(TaskError::Fail {
                reason: "nope".into(),
                exit_code: Some(7),
            })
        })
    };

    // Restart OnFailure, the retry budget and the backoff come from the
    // defaults.
    let inherits = fx.add(TaskSpec::from_defaults("inherits", always_fails()));
    // OnFailure: a success after a failure completes the task.
    let recovers = fx.add(TaskSpec::from_defaults(
        "recovers",
        native(|ctx| async move {
            if ctx.attempt() == 1 {
                Err(TaskError::fail("first try fails"))
            } else {
                Ok(b"second try".to_vec())
            }
        }),
    ));
    // An explicit restart policy overrides the default.
    let overrides = fx.add(TaskSpec::once("overrides", always_fails()));
    // The default timeout applies...
    let slow = fx.add(TaskSpec::from_defaults("slow", sleeps(ms(200))));
    // ...unless the spec sets zero, which means none.
    let untimed =
        fx.add(TaskSpec::from_defaults("untimed", sleeps(ms(200))).with_timeout(Duration::ZERO));

    let (id, report) = fx.settle(inherits).await;
    assert_eq!(report.attempts, 3);
    match &report.outcome {
        TaskOutcome::Failed { reason, exit_code } => {
            assert!(
                reason.contains("retry limit") && reason.contains("nope"),
                "{reason}"
            );
            assert_eq!(*exit_code, Some(7));
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    let delays: Vec<_> = fx
        .events
        .of_kind(id, K::BackoffScheduled)
        .iter()
        .map(|e| (e.delay_ms, e.source))
        .collect();
    assert_eq!(delays, [(Some(5), Some(BackoffSource::Failure)); 2]);

    let report = recovers.report().await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"second try".to_vec()
        }
    );
    assert_eq!(report.attempts, 2);

    let report = overrides.report().await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Failed {
            reason: "nope".into(),
            exit_code: Some(7)
        }
    );
    assert_eq!(report.attempts, 1);

    let (id, report) = fx.settle(slow).await;
    assert_eq!(report.attempts, 3, "timeouts are retried within the budget");
    match &report.outcome {
        TaskOutcome::Failed { reason, exit_code } => {
            assert!(
                reason.contains("retry limit") && reason.contains("timed out"),
                "{reason}"
            );
            assert_eq!(*exit_code, None);
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    let timeouts: Vec<_> = fx
        .events
        .of_kind(id, K::AttemptTimedOut)
        .iter()
        .map(|e| e.timeout_ms)
        .collect();
    assert_eq!(timeouts, [Some(50); 3]);

    let report = within(NATIVE_LIMIT, "untimed", untimed.report()).await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"ok".to_vec()
        }
    );
    assert_eq!(report.attempts, 1);
}

/// `TaskWaiter::on_report` calls its function once with the final report:
/// as the report is delivered when it is registered before the end (before
/// any waiter wakes up to read it), at once when registered after, and
/// for a task rejected at add, at once too. One that panics harms nobody.
#[tokio::test(start_paused = true)]
async fn on_report_is_called_once_with_the_final_report() {
    let mut fx = Fixture::native();
    let seen: Arc<Mutex<Vec<(TaskId, TaskOutcome)>>> = Arc::default();
    let record = |seen: &Arc<Mutex<Vec<(TaskId, TaskOutcome)>>>| {
        let seen = Arc::clone(seen);
        move |report: Arc<TaskReport>| {
            seen.lock()
                .unwrap()
                .push((report.id, report.outcome.clone()));
        }
    };

    let before = fx.add(TaskSpec::once("hooked", until_canceled()));
    before.on_report(|_| panic!("a hook that panics"));
    before.on_report(record(&seen));
    fx.events.until_kind(before.id(), K::AttemptStarting).await;
    assert!(seen.lock().unwrap().is_empty(), "not called before the end");
    assert!(fx.sup.cancel(before.id()).await);
    // Delivered and hooked in one step: by the time cancel returns the
    // report is out, and so is the hook's call.
    assert_eq!(
        *seen.lock().unwrap(),
        [(before.id(), TaskOutcome::Canceled)]
    );

    let after = fx.add(TaskSpec::once("late", returns(b"done")));
    let report = within(NATIVE_LIMIT, "the late task", after.clone().report()).await;
    after.on_report(record(&seen));
    assert_eq!(
        seen.lock().unwrap().last(),
        Some(&(report.id, report.outcome.clone()))
    );

    let first = fx.add(TaskSpec::once("dup", until_canceled()));
    let rejected = fx.add(TaskSpec::once("dup", returns(b"never")));
    rejected.on_report(record(&seen));
    match seen.lock().unwrap().last() {
        Some((
            id,
            TaskOutcome::Rejected {
                kind: RejectionKind::AlreadyExists,
                ..
            },
        )) => {
            assert_eq!(*id, rejected.id());
        }
        other => panic!("expected the rejection at once, got {other:?}"),
    }
    assert_eq!(seen.lock().unwrap().len(), 3, "each hook once");
    assert!(fx.sup.cancel(first.id()).await);
    assert_eq!(seen.lock().unwrap().len(), 3, "no hook was called twice");
}
