//! The global concurrency bound: never more than `max_concurrent` attempts
//! run at once, and all the work still gets done (docs/semantics.md).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::EventKind as K;
use taskhost_runtime::prelude::*;

use crate::common_sup::{Fixture, NATIVE_LIMIT, WASM_LIMIT, load, ms, params, runtime, within};

const LIMIT: usize = 4;

/// A listing taken as an attempt starts shows no more attempts running
/// than there are permits: a task is shown finishing, backing off or
/// waiting before its permit goes to the next. On two worker threads, so
/// that the next attempt starts while the last one's task winds down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_never_shows_more_running_than_permits() {
    const TASKS: usize = 400;
    let sup = Supervisor::builder().max_concurrent(2).build();
    let most = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<TaskWaiter> = (0..TASKS)
        .map(|i| {
            let (list, most) = (sup.clone(), Arc::clone(&most));
            let body = native(move |ctx| {
                let (list, most) = (list.clone(), Arc::clone(&most));
                async move {
                    let running = list
                        .list()
                        .iter()
                        .filter(|t| t.phase == TaskState::Running)
                        .count();
                    most.fetch_max(running, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    match (i % 3, ctx.attempt()) {
                        (0, 1) | (1, _) => Err(TaskError::Fail {
                            reason: "once more".into(),
                            exit_code: None,
                        }),
                        _ => Ok(Vec::new()),
                    }
                }
            });
            // Fails once and backs off, fails for good, or completes.
            sup.add(match i % 3 {
                0 => TaskSpec::restartable(format!("retried-{i}"), body)
                    .with_max_retries(Some(1))
                    .with_backoff(BackoffPolicy::constant(ms(1))),
                _ => TaskSpec::once(format!("once-{i}"), body),
            })
        })
        .collect();
    for w in waiters {
        within(NATIVE_LIMIT, "a listing task", w.wait()).await;
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 2, "a listing showed {most} running for 2 permits");
}

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

/// A share group that comes to a full line gets permits in turn with the
/// group already waiting, instead of after its whole line.
#[tokio::test(start_paused = true)]
async fn a_share_group_does_not_wait_behind_another_groups_line() {
    let run = ms(10);
    let mut fx = Fixture::new(
        Supervisor::builder().max_concurrent(1).build(),
        NATIVE_LIMIT,
    );
    fx.sup.set_share_weight(Some("a"), 1);
    let started = Arc::new(std::sync::Mutex::new(Vec::new()));
    let job = |label: String| {
        let started = Arc::clone(&started);
        native(move |_| {
            let (started, label) = (Arc::clone(&started), label.clone());
            async move {
                started
                    .lock()
                    .unwrap()
                    .push((label, tokio::time::Instant::now()));
                tokio::time::sleep(run).await;
                Ok(Vec::new())
            }
        })
    };
    let flood: Vec<TaskWaiter> = (0..30)
        .map(|i| {
            let name = format!("a-{i}");
            fx.add(TaskSpec::once(name.clone(), job(name)).with_share("a"))
        })
        .collect();
    // The first of a's tasks holds the only permit; the rest are in line.
    fx.events
        .until_kind(flood[0].id(), K::AttemptStarting)
        .await;
    let added = tokio::time::Instant::now();
    let late: Vec<TaskWaiter> = (0..3)
        .map(|i| {
            let name = format!("b-{i}");
            fx.add(TaskSpec::once(name.clone(), job(name)).with_share("b"))
        })
        .collect();
    for w in late.into_iter().chain(flood) {
        let (_, report) = fx.settle(w).await;
        assert_eq!(
            report.outcome,
            TaskOutcome::Completed { output: Vec::new() }
        );
    }
    let started = started.lock().unwrap();
    assert_eq!(started.len(), 33);
    let waited: Vec<std::time::Duration> = started
        .iter()
        .filter(|(label, _)| label.starts_with("b-"))
        .map(|(_, at)| at.duration_since(added))
        .collect();
    assert_eq!(waited.len(), 3);
    for (i, waited) in waited.iter().enumerate() {
        // At most one of a's attempts before each of b's.
        let bound = run * 2 * (i as u32 + 1);
        assert!(
            *waited <= bound,
            "b-{i} waited {waited:?} (bound {bound:?}): {started:?}"
        );
    }
}

/// What a group's bodies saw: attempts running now, the most at once, and
/// the most [`Supervisor::share_running`] showed from inside one.
#[derive(Default)]
struct Tally {
    running: AtomicUsize,
    most: AtomicUsize,
    shown: AtomicUsize,
}

/// A native body of share group `group` that runs 10 ms, counted in `tally`.
fn tallied(sup: &Supervisor, group: &'static str, tally: &Arc<Tally>) -> impl TaskBody {
    let (sup, tally) = (sup.clone(), Arc::clone(tally));
    native(move |_| {
        let (sup, tally) = (sup.clone(), Arc::clone(&tally));
        async move {
            let now = tally.running.fetch_add(1, Ordering::SeqCst) + 1;
            tally.most.fetch_max(now, Ordering::SeqCst);
            let shown = sup.share_running(Some(group));
            tally.shown.fetch_max(shown, Ordering::SeqCst);
            tokio::time::sleep(ms(10)).await;
            tally.running.fetch_sub(1, Ordering::SeqCst);
            Ok(group.as_bytes().to_vec())
        }
    })
}

/// A share group capped at one attempt runs its attempts one at a time,
/// while another group's run alongside, on the permits the cap leaves.
#[tokio::test(start_paused = true)]
async fn a_capped_share_group_runs_at_most_its_cap_at_once() {
    let sup = Supervisor::builder().max_concurrent(LIMIT).build();
    sup.set_share_limit(Some("a"), Some(1));
    let (a, b) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let started = tokio::time::Instant::now();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let spec = TaskSpec::once(format!("a-{i}"), tallied(&sup, "a", &a));
        waiters.push(sup.add(spec.with_share("a")));
        let spec = TaskSpec::once(format!("b-{i}"), tallied(&sup, "b", &b));
        waiters.push(sup.add(spec.with_share("b")));
    }
    for w in waiters {
        let outcome = within(NATIVE_LIMIT, "a shared job", w.wait()).await;
        assert!(
            matches!(outcome, TaskOutcome::Completed { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(a.most.load(Ordering::SeqCst), 1, "a never ran two at once");
    assert_eq!(a.shown.load(Ordering::SeqCst), 1, "a's count");
    assert_eq!(b.most.load(Ordering::SeqCst), 3, "b's ran in parallel");
    assert_eq!(b.shown.load(Ordering::SeqCst), 3, "b's count");
    assert_eq!(started.elapsed(), ms(30), "a's ran one after another");
    assert_eq!(sup.share_running(Some("a")), 0);
    assert_eq!(sup.share_running(Some("b")), 0);
    assert_eq!(sup.free_permits(), Some(LIMIT), "every permit came back");
}

/// A tree of native tasks, each parent adding `fanout` children and
/// waiting for all of them, down to `depth`: parked while it waits.
fn tree(
    sup: &Supervisor,
    name: String,
    depth: u32,
    fanout: usize,
    park: bool,
    running: &Arc<AtomicUsize>,
    most: &Arc<AtomicUsize>,
) -> TaskWaiter {
    let (sup2, running, most) = (sup.clone(), Arc::clone(running), Arc::clone(most));
    sup.add(TaskSpec::once(
        name.clone(),
        native(move |ctx| {
            let (sup, name, running, most) = (
                sup2.clone(),
                name.clone(),
                Arc::clone(&running),
                Arc::clone(&most),
            );
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(ms(1)).await;
                let mut sum = 1usize;
                if depth > 0 {
                    let children: Vec<TaskWaiter> = (0..fanout)
                        .map(|i| {
                            let child = format!("{name}.{i}");
                            tree(&sup, child, depth - 1, fanout, park, &running, &most)
                        })
                        .collect();
                    let parked = park && ctx.park();
                    if parked {
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                    for child in children {
                        match child.wait().await {
                            TaskOutcome::Completed { output } => {
                                sum += String::from_utf8(output).unwrap().parse::<usize>().unwrap();
                            }
                            other => return Err(TaskError::fail(format!("child: {other:?}"))),
                        }
                    }
                    if parked {
                        ctx.unpark().await;
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                    }
                }
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(sum.to_string().into_bytes())
            }
        }),
    ))
}

#[tokio::test(start_paused = true)]
async fn a_parent_that_parks_lets_its_children_run_under_one_permit() {
    let sup = Supervisor::builder().max_concurrent(1).build();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    // 1 + 3 + 9 + 27 tasks, 13 of them parents waiting at once.
    let root = tree(&sup, "root".into(), 3, 3, true, &running, &most);
    assert_eq!(
        within(NATIVE_LIMIT, "the tree", root.wait()).await,
        TaskOutcome::Completed {
            output: b"40".to_vec()
        }
    );
    assert_eq!(most.load(Ordering::SeqCst), 1, "one body runs at a time");
    assert_eq!(sup.parked(), 0);
    assert_eq!(sup.free_permits(), Some(1), "every permit came back");
}

#[tokio::test(start_paused = true)]
async fn a_parent_that_keeps_its_permit_starves_its_children() {
    // The control: without parking, the parent holds the only permit and
    // its children never start.
    let sup = Supervisor::builder().max_concurrent(1).build();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let root = tree(&sup, "root".into(), 1, 2, false, &running, &most);
    let waited = tokio::time::timeout(ms(60_000), root.wait()).await;
    assert!(
        waited.is_err(),
        "deadlocked, as the control must: {waited:?}"
    );
    assert_eq!(sup.free_permits(), Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_parked_attempt_stopped_ends_without_waiting_for_a_permit() {
    let sup = Supervisor::builder().max_concurrent(1).build();
    let (parked_tx, parked) = tokio::sync::oneshot::channel::<()>();
    let parked_tx = Arc::new(std::sync::Mutex::new(Some(parked_tx)));
    let parent = sup.add(TaskSpec::once(
        "parent",
        native(move |ctx| {
            let parked_tx = parked_tx.lock().unwrap().take();
            async move {
                assert!(ctx.park(), "it held the permit");
                if let Some(tx) = parked_tx {
                    let _ = tx.send(());
                }
                ctx.cancellation().cancelled().await;
                ctx.unpark().await;
                Err(TaskError::Canceled)
            }
        }),
    ));
    within(NATIVE_LIMIT, "parked", parked).await.unwrap();
    assert_eq!(sup.parked(), 1);
    // Another task takes the permit the parent gave back, and keeps it.
    let (hold_tx, hold) = tokio::sync::oneshot::channel::<()>();
    let hold = Arc::new(std::sync::Mutex::new(Some(hold)));
    let holder = sup.add(TaskSpec::once(
        "holder",
        native(move |_| {
            let hold = hold.lock().unwrap().take();
            async move {
                if let Some(hold) = hold {
                    let _ = hold.await;
                }
                Ok(Vec::new())
            }
        }),
    ));
    tokio::time::sleep(ms(10)).await;
    assert_eq!(sup.free_permits(), Some(0), "the holder runs");
    let listed = sup.list();
    let phase = |name: &str| listed.iter().find(|t| t.name == name).unwrap().phase;
    assert_eq!(
        phase("parent"),
        taskhost_core::lifecycle::TaskState::Waiting
    );
    assert_eq!(
        phase("holder"),
        taskhost_core::lifecycle::TaskState::Running
    );
    // A stop reaches the parked parent, which ends at once.
    assert!(sup.remove(parent.id()));
    assert_eq!(
        within(NATIVE_LIMIT, "the parent", parent.wait()).await,
        TaskOutcome::Canceled
    );
    assert_eq!(sup.parked(), 0);
    hold_tx.send(()).unwrap();
    within(NATIVE_LIMIT, "the holder", holder.wait()).await;
    assert_eq!(sup.free_permits(), Some(1), "nothing was lost or invented");
}
