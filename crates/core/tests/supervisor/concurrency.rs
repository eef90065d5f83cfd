//! The global concurrency bound: never more than `max_concurrent` attempts
//! run at once, and all the work still gets done (docs/semantics.md).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskhost_core::supervisor::EventKind as K;
use taskhost_runtime::prelude::*;

use crate::common_sup::{Fixture, NATIVE_LIMIT, WASM_LIMIT, load, ms, params, runtime, within};

const LIMIT: usize = 4;

#[tokio::test(start_paused = true)]
async fn at_most_max_concurrent_native_bodies_run_at_once() {
    const TASKS: usize = 100;
    let sup = Supervisor::builder().max_concurrent(LIMIT).build();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<TaskWaiter> = (0..TASKS)
        .map(|i| {
            let running = Arc::clone(&running);
            let most = Arc::clone(&most);
            sup.add(TaskSpec::once(
                format!("native-{i}"),
                native(move |_| {
                    let running = Arc::clone(&running);
                    let most = Arc::clone(&most);
                    async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(ms(20)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok(b"slept".to_vec())
                    }
                }),
            ))
        })
        .collect();
    let started = tokio::time::Instant::now();
    for w in waiters {
        assert_eq!(
            within(NATIVE_LIMIT, "native sleeper", w.wait()).await,
            TaskOutcome::Completed {
                output: b"slept".to_vec()
            }
        );
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        LIMIT,
        "the bound is reached, never passed"
    );
    assert_eq!(
        started.elapsed(),
        ms(20) * (TASKS / LIMIT) as u32,
        "the work runs in full rounds of {LIMIT}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_concurrent_plugin_attempts_run_at_once() {
    const TASKS: usize = 100;
    let rt = runtime();
    let sleeper = load(&rt, "sleeper").await;
    let mut fx = Fixture::new(
        Supervisor::builder().max_concurrent(LIMIT).build(),
        WASM_LIMIT,
    );
    let waiters: Vec<TaskWaiter> = (0..TASKS)
        .map(|i| {
            fx.add(TaskSpec::once(
                format!("sleeper-{i}"),
                PluginTask::new(&rt, &sleeper).params(params(&[("ms", "20")])),
            ))
        })
        .collect();
    for w in waiters {
        let (_, report) = fx.settle(w).await;
        assert_eq!(
            report.outcome,
            TaskOutcome::Completed {
                output: b"slept 20 ms".to_vec()
            }
        );
    }

    // Replay the attempts in seq order: a start holds a permit until the
    // attempt's end event.
    let mut alive: HashSet<TaskId> = HashSet::new();
    let mut most = 0;
    for e in &fx.events.seen {
        let Some(id) = e.task_id else { continue };
        match e.kind {
            K::AttemptStarting => {
                assert!(alive.insert(id), "one attempt per task at a time");
            }
            K::AttemptSucceeded | K::AttemptFailed | K::AttemptTimedOut | K::AttemptCanceled => {
                assert!(alive.remove(&id), "an end without a start");
            }
            _ => continue,
        }
        most = most.max(alive.len());
        assert!(
            alive.len() <= LIMIT,
            "{} attempts alive at seq {}: {:?}",
            alive.len(),
            e.seq,
            alive
        );
    }
    assert_eq!(most, LIMIT, "the bound is reached");
    assert!(alive.is_empty());
}

/// Among attempts waiting for a permit, the higher priority starts first;
/// equal ones start in the order they began to wait.
#[tokio::test(start_paused = true)]
async fn waiting_attempts_get_permits_by_priority_then_arrival() {
    let sup = Supervisor::builder().max_concurrent(1).build();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let job = |label: &'static str| {
        let order = Arc::clone(&order);
        native(move |_| {
            let order = Arc::clone(&order);
            async move {
                order.lock().unwrap().push(label);
                tokio::time::sleep(ms(10)).await;
                Ok(Vec::new())
            }
        })
    };
    // The first holds the only permit; the rest wait, in this order.
    let mut waiters = vec![sup.add(TaskSpec::once("first", job("first")))];
    tokio::task::yield_now().await;
    for (label, priority) in [
        ("low-1", -1),
        ("normal-1", 0),
        ("urgent", 10),
        ("normal-2", 0),
        ("high", 5),
        ("low-2", -1),
    ] {
        waiters.push(sup.add(TaskSpec::once(label, job(label)).with_priority(priority)));
        tokio::task::yield_now().await;
    }
    for w in waiters {
        within(NATIVE_LIMIT, "prioritised job", w.wait()).await;
    }
    assert_eq!(
        *order.lock().unwrap(),
        [
            "first", "urgent", "high", "normal-1", "normal-2", "low-1", "low-2"
        ]
    );
    assert_eq!(sup.free_permits(), Some(1));
}
