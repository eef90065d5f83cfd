//! Per-attempt timeouts: they start when the attempt's body starts (never
//! while waiting for a permit), a spinning guest is stopped by them, a
//! timeout is a retryable failure within the budget, and spinning guests do
//! not starve the host's timers (docs/semantics.md).

use std::time::Duration;

use taskhost_core::supervisor::EventKind as K;
use taskhost_runtime::prelude::*;
use tokio::time::Instant;

use crate::common_sup::{
    ENDED, Fixture, NATIVE_LIMIT, REGISTERED, TIMED_OUT_ONCE, TIMED_OUT_THEN_PAUSED, WASM_LIMIT,
    load, ms, runtime, sequence, sleeps, stubborn, within,
};

/// How many 10 ms sleeps the timer probe takes while guests spin.
const TIMER_SAMPLES: u32 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_plugin_times_out_twice_then_fails_and_timers_keep_firing() {
    let rt = runtime();
    let spin = load(&rt, "spin").await;
    let mut fx = Fixture::wasm();
    let spec = |name: &str| {
        TaskSpec::restartable(name, PluginTask::new(&rt, &spin))
            .with_timeout(ms(50))
            .with_max_retries(Some(1))
            .with_backoff(BackoffPolicy::constant(ms(1)))
    };
    // Two spinning guests: as many as there are worker threads.
    let spinners = [fx.add(spec("spin-a")), fx.add(spec("spin-b"))];
    for s in &spinners {
        fx.events.until_count(s.id(), K::AttemptStarting, 1).await;
    }

    // A native task measures how late its 10 ms timers fire meanwhile.
    let timer = fx.add(TaskSpec::once(
        "timer",
        native(|_| async {
            let mut worst = Duration::ZERO;
            for _ in 0..TIMER_SAMPLES {
                let started = std::time::Instant::now();
                tokio::time::sleep(ms(10)).await;
                worst = worst.max(started.elapsed().saturating_sub(ms(10)));
            }
            Ok(worst.as_micros().to_string().into_bytes())
        }),
    ));

    for s in spinners {
        let (id, report) = fx.settle(s).await;
        assert_eq!(report.attempts, 2);
        match &report.outcome {
            TaskOutcome::Failed { reason, exit_code } => {
                assert!(reason.contains("timed out"), "{reason}");
                assert!(reason.contains("retry limit"), "{reason}");
                assert_eq!(*exit_code, None);
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        fx.assert_kinds(
            id,
            &sequence(&[
                &REGISTERED,
                &TIMED_OUT_THEN_PAUSED,
                &[K::AttemptStarting, K::AttemptTimedOut],
                &ENDED,
            ]),
        );
        for e in fx.events.of_kind(id, K::AttemptTimedOut) {
            assert_eq!(e.timeout_ms, Some(50));
            let took = e.duration_ms.unwrap();
            assert!(
                took >= 50,
                "an attempt ran {took} ms before its 50 ms timeout"
            );
        }
    }

    let worst = match within(WASM_LIMIT, "timer", timer.wait()).await {
        TaskOutcome::Completed { output } => {
            let micros: u64 = String::from_utf8(output).unwrap().parse().unwrap();
            Duration::from_micros(micros)
        }
        other => panic!("expected Completed, got {other:?}"),
    };
    println!("worst lateness of a 10 ms timer while two guests spin: {worst:?}");
    assert!(
        worst < ms(50),
        "a 10 ms timer fired {worst:?} late while guests spun"
    );
}

#[tokio::test(start_paused = true)]
async fn timeout_starts_when_the_attempt_starts_not_while_waiting() {
    let mut fx = Fixture::new(
        Supervisor::builder().max_concurrent(1).build(),
        NATIVE_LIMIT,
    );
    let holder = fx.add(TaskSpec::once("holder", sleeps(ms(300))));
    fx.events.until_kind(holder.id(), K::AttemptStarting).await;

    // Waits 300 ms for the permit, then runs 80 ms under a 100 ms timeout.
    let added = Instant::now();
    let patient = fx.add(TaskSpec::once("patient", sleeps(ms(80))).with_timeout(ms(100)));
    fx.events.until_kind(patient.id(), K::AttemptStarting).await;
    assert_eq!(added.elapsed(), ms(300), "it waited for the permit");
    assert_eq!(
        within(NATIVE_LIMIT, "patient", patient.wait()).await,
        TaskOutcome::Completed {
            output: b"ok".to_vec()
        }
    );
    assert_eq!(
        holder.wait().await,
        TaskOutcome::Completed {
            output: b"ok".to_vec()
        }
    );

    // A body that never returns is stopped exactly when its timeout expires.
    let stuck = fx.add(TaskSpec::once("stuck", stubborn()).with_timeout(ms(100)));
    let id = stuck.id();
    fx.events.until_kind(id, K::AttemptStarting).await;
    let started = Instant::now();
    let timed_out = fx.events.until_kind(id, K::AttemptTimedOut).await;
    assert_eq!(started.elapsed(), ms(100));
    assert_eq!(timed_out.timeout_ms, Some(100));
    assert_eq!(timed_out.duration_ms, Some(100));
    assert_eq!(timed_out.attempt, Some(1));
    let (_, report) = fx.settle(stuck).await;
    assert_eq!(report.attempts, 1);
    assert_eq!(report.duration, ms(100));
    match &report.outcome {
        TaskOutcome::Failed { reason, exit_code } => {
            assert!(reason.contains("timed out"), "{reason}");
            assert_eq!(*exit_code, None);
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    fx.assert_kinds(id, &TIMED_OUT_ONCE);
}
