//! Restart policies and the retry budget: OnFailure retries retryable errors
//! only, Fatal is final, `max_retries = N` allows N+1 consecutive failures,
//! backoff delays follow the policy, and Always re-runs after success with a
//! success resetting the failure streak (docs/semantics.md).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use taskhost_core::supervisor::{BackoffSource, EventKind as K, Resume, RunFuture};
use taskhost_runtime::prelude::*;
use tokio::time::Instant;

use crate::common_sup::{
    ENDED, FAILED_ONCE, FAILED_THEN_PAUSED, Fixture, NATIVE_LIMIT, REGISTERED, load, ms, params,
    runtime, sequence, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flaky_plugin_succeeds_on_its_third_attempt() {
    let rt = runtime();
    let flaky = load(&rt, "flaky").await;
    let mut fx = Fixture::wasm();
    let task = PluginTask::new(&rt, &flaky).params(params(&[("fail_times", "2")]));
    let (id, report) = fx
        .run(TaskSpec::restartable("flaky", task).with_backoff(BackoffPolicy::constant(ms(1))))
        .await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"ok after 3 attempts".to_vec()
        }
    );
    assert_eq!(report.attempts, 3);
    let results: Vec<&str> = report.history.iter().map(|r| r.result.as_str()).collect();
    assert_eq!(
        results,
        [
            "failed: flaky: attempt 1 of fail_times=2 fails on purpose",
            "failed: flaky: attempt 2 of fail_times=2 fails on purpose",
            "succeeded"
        ]
    );

    fx.assert_kinds(
        id,
        &sequence(&[
            &REGISTERED,
            &FAILED_THEN_PAUSED.repeat(2),
            &[K::AttemptStarting, K::AttemptSucceeded],
            &ENDED,
        ]),
    );
    let failed: Vec<_> = fx
        .events
        .of_kind(id, K::AttemptFailed)
        .iter()
        .map(|e| (e.attempt, e.exit_code))
        .collect();
    assert_eq!(failed, [(Some(1), Some(3)), (Some(2), Some(3))]);
    for e in fx.events.of_kind(id, K::BackoffScheduled) {
        assert_eq!(
            (e.delay_ms, e.source),
            (Some(1), Some(BackoffSource::Failure))
        );
    }
    let starting: Vec<_> = fx
        .events
        .of_kind(id, K::AttemptStarting)
        .iter()
        .map(|e| e.attempt)
        .collect();
    assert_eq!(starting, [Some(1), Some(2), Some(3)]);
}

#[tokio::test(start_paused = true)]
async fn fatal_error_is_never_retried() {
    let mut fx = Fixture::native();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let (id, report) = fx
        .run(
            TaskSpec::restartable(
                "fatal",
                native(move |_| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async {
                        Err(TaskError::Fatal {
                            reason: "bad config".into(),
                            exit_code: Some(2),
                        })
                    }
                }),
            )
            .with_backoff(BackoffPolicy::constant(ms(1)))
            .with_max_retries(None),
        )
        .await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Fatal {
            reason: "bad config".into(),
            exit_code: Some(2)
        }
    );
    assert_eq!(report.attempts, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    fx.assert_kinds(id, &FAILED_ONCE);
    assert_eq!(
        fx.events.of_kind(id, K::TaskFinished)[0].outcome,
        Some(OutcomeKind::Fatal)
    );
}

#[tokio::test(start_paused = true)]
async fn retry_budget_allows_exactly_n_plus_one_attempts() {
    let mut fx = Fixture::native();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&starts);
    let backoff = BackoffPolicy::new(ms(10), ms(1000), 2.0, Jitter::None).unwrap();
    let (id, report) = fx
        .run(
            TaskSpec::restartable(
                "budget",
                native(move |ctx| {
                    log.lock().unwrap().push(Instant::now());
                    async move {
                        Err(TaskError::Fail {
                            reason: format!("boom {}", ctx.attempt()),
                            exit_code: Some(10 + ctx.attempt() as i32),
                        })
                    }
                }),
            )
            .with_backoff(backoff)
            .with_max_retries(Some(3)),
        )
        .await;
    assert_eq!(report.attempts, 4);
    match &report.outcome {
        TaskOutcome::Failed { reason, exit_code } => {
            assert!(reason.contains("retry limit"), "{reason}");
            assert!(
                reason.contains("boom 4"),
                "carries the last error: {reason}"
            );
            assert_eq!(*exit_code, Some(14), "the last error's exit code");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(
        report.duration,
        ms(10 + 20 + 40),
        "from the first start to the outcome: the backoffs"
    );

    fx.assert_kinds(
        id,
        &sequence(&[
            &REGISTERED,
            &FAILED_THEN_PAUSED.repeat(3),
            &[K::AttemptStarting, K::AttemptFailed],
            &ENDED,
        ]),
    );
    let delays: Vec<_> = fx
        .events
        .of_kind(id, K::BackoffScheduled)
        .iter()
        .map(|e| e.delay_ms)
        .collect();
    assert_eq!(delays, [Some(10), Some(20), Some(40)]);
    let starts = starts.lock().unwrap().clone();
    let gaps: Vec<_> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        [ms(10), ms(20), ms(40)],
        "the backoff is really waited"
    );
}

#[tokio::test(start_paused = true)]
async fn always_reruns_after_success_and_a_success_resets_the_failure_streak() {
    let mut fx = Fixture::native();
    // Odd attempts fail, even ones succeed: with max_retries = 1 two
    // failures in a row would end the task, alternating ones never do.
    let waiter = fx.add(
        TaskSpec::from_defaults(
            "alternating",
            native(|ctx| async move {
                if ctx.attempt() % 2 == 1 {
                    Err(TaskError::fail(format!("odd attempt {}", ctx.attempt())))
                } else {
                    Ok(b"even".to_vec())
                }
            }),
        )
        .with_restart(RestartPolicy::Always { interval: ms(5) })
        .with_backoff(BackoffPolicy::constant(ms(1)))
        .with_max_retries(Some(1)),
    );
    let id = waiter.id();
    // The 10th pause is the one after the 5th success.
    fx.events.until_count(id, K::BackoffScheduled, 10).await;
    assert_eq!(fx.events.of_kind(id, K::AttemptSucceeded).len(), 5);
    assert_eq!(
        waiter.try_outcome(),
        None,
        "Always never ends on its own, and the streak never exceeds 1"
    );
    // The task is now pausing after its 5th success (10th attempt).
    let backoffs: Vec<_> = fx
        .events
        .of_kind(id, K::BackoffScheduled)
        .iter()
        .map(|e| (e.source, e.delay_ms))
        .collect();
    let mut expected = Vec::new();
    for _ in 0..5 {
        expected.push((Some(BackoffSource::Failure), Some(1)));
        expected.push((Some(BackoffSource::Success), Some(5)));
    }
    assert_eq!(backoffs, expected);

    assert!(fx.sup.cancel(id).await);
    let (_, report) = fx.settle(waiter).await;
    assert_eq!(report.outcome, TaskOutcome::Canceled);
    assert_eq!(report.attempts, 10);

    // A stop during the pause ends the task without another attempt.
    let kinds = fx.events.kinds(id);
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            K::BackoffScheduled,
            K::TaskRemoveRequested,
            K::TaskFinished,
            K::TaskRemoved
        ]
    );
    assert_eq!(fx.events.of_kind(id, K::AttemptStarting).len(), 10);
    assert!(fx.events.of_kind(id, K::AttemptCanceled).is_empty());
}

#[tokio::test(start_paused = true)]
async fn always_with_consecutive_failures_still_hits_the_budget() {
    // The counterpart of the test above: without successes in between, the
    // same budget ends an Always task.
    let sup = Supervisor::default();
    let waiter = sup.add(
        TaskSpec::periodic(
            "always-fails",
            native(|_| async { Err(TaskError::fail("down")) }),
            ms(5),
        )
        .with_backoff(BackoffPolicy::constant(ms(1)))
        .with_max_retries(Some(1)),
    );
    let report = within(NATIVE_LIMIT, "always-fails", waiter.report()).await;
    assert_eq!(report.attempts, 2);
    match &report.outcome {
        TaskOutcome::Failed { reason, .. } => {
            assert!(
                reason.contains("retry limit") && reason.contains("down"),
                "{reason}"
            )
        }
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// A body that records every pause the supervisor tells it of.
struct Pauses {
    inner: Box<dyn TaskBody>,
    seen: Arc<Mutex<Vec<Resume>>>,
}

impl TaskBody for Pauses {
    fn attempt(
        &self,
        ctx: AttemptContext,
    ) -> futures::future::BoxFuture<'static, Result<RunFuture, TaskError>> {
        self.inner.attempt(ctx)
    }

    fn pausing(&self, next: Resume) {
        self.seen.lock().unwrap().push(next);
    }
}

/// `TaskBody::pausing` hears of every pause with where the task stands (what
/// the daemon records so a restart resumes at the same deadline), and a
/// task resumed with a delay starts with that pause.
#[tokio::test(start_paused = true)]
async fn pausing_tells_the_body_of_each_pause_and_resume_starts_with_one() {
    let mut fx = Fixture::native();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let counter = Arc::clone(&calls);
    let body = Pauses {
        inner: Box::new(native(move |_| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n <= 2 {
                    Err(TaskError::fail("not yet"))
                } else {
                    Ok(b"ok".to_vec())
                }
            }
        })),
        seen: Arc::clone(&seen),
    };
    let started = Instant::now();
    let (_, report) = fx
        .run(
            TaskSpec::restartable("paused", body)
                .with_backoff(BackoffPolicy::new(ms(100), ms(10_000), 2.0, Jitter::None).unwrap())
                .resuming(Resume {
                    attempts: 4,
                    failures: 1,
                    delay: ms(50),
                }),
        )
        .await;
    assert_eq!(report.attempts, 7, "it went on from attempt 5");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Resume {
                attempts: 4,
                failures: 1,
                delay: ms(50)
            },
            Resume {
                attempts: 5,
                failures: 2,
                delay: ms(200)
            },
            Resume {
                attempts: 6,
                failures: 3,
                delay: ms(400)
            },
        ]
    );
    assert_eq!(started.elapsed(), ms(650));
}
