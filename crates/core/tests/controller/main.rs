//! The controller's behaviour (docs/semantics.md): keyed admission with Queue,
//! Replace and DropIfRunning, bounds, removal of queued work, plugin-declared
//! resources, and an invariant check over a storm of mixed submissions.
//! Native bodies on a paused clock where timing matters, real plugins where
//! the sandbox matters.

mod capacity;
#[path = "../supervisor/common_sup.rs"]
mod common_sup;
mod debounce;
mod invariants;
mod rate;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common_sup::*;
use taskhost_core::controller::{ControllerBuilder, Placement, SlotState};
use taskhost_core::supervisor::{EventKind, Received, TaskRef};
use taskhost_runtime::plugin_task::resolve_slot;
use taskhost_runtime::prelude::*;
use tokio::sync::Notify;

/// A controller with every default in front of a default supervisor.
fn controller() -> Controller {
    builder().build()
}

/// A current-thread runtime on a paused clock, for a test that plays
/// many programs, each in a runtime of its own.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// A builder for a controller in front of a default supervisor.
fn builder() -> ControllerBuilder {
    Controller::builder(Supervisor::default())
}

fn submit(
    c: &Controller,
    name: &str,
    slot: &str,
    policy: AdmissionPolicy,
    body: impl TaskBody,
) -> TaskWaiter {
    c.submit(Submission::new(TaskSpec::once(name, body).with_slot(slot)).policy(policy))
}

/// A body that says it started, then waits to be stopped.
fn owner(started: &Arc<Notify>) -> impl TaskBody {
    let started = Arc::clone(started);
    native(move |ctx| {
        let started = Arc::clone(&started);
        async move {
            started.notify_one();
            ctx.cancellation().cancelled().await;
            Err(TaskError::Canceled)
        }
    })
}

fn rejected(outcome: &TaskOutcome) -> Option<RejectionKind> {
    match outcome {
        TaskOutcome::Rejected { kind, .. } => Some(*kind),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn queue_runs_in_order_without_overlap() {
    let c = controller();
    let mut rec = Recorder::new(c.supervisor(), NATIVE_LIMIT);
    let waiters: Vec<TaskWaiter> = (1..=3)
        .map(|i| {
            submit(
                &c,
                &format!("job-{i}"),
                "s",
                AdmissionPolicy::Queue,
                sleeps(ms(100)),
            )
        })
        .collect();
    let ids: Vec<TaskId> = waiters.iter().map(TaskWaiter::id).collect();
    for w in waiters {
        assert_eq!(
            w.wait().await,
            TaskOutcome::Completed {
                output: b"ok".to_vec()
            }
        );
    }
    rec.until_removed(ids[2]).await;
    // Order: each task starts after the previous one is removed.
    let seq = |id: TaskId, kind| rec.of_kind(id, kind)[0].seq;
    for pair in ids.windows(2) {
        assert!(seq(pair[0], EventKind::TaskRemoved) < seq(pair[1], EventKind::TaskAdded));
        assert!(seq(pair[0], EventKind::TaskRemoved) < seq(pair[1], EventKind::AttemptStarting));
    }
    assert!(
        c.snapshot().is_empty(),
        "an idle slot with no queue is forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn drop_if_running_rejects_without_running_the_body() {
    let c = controller();
    let started = Arc::new(Notify::new());
    let first = submit(&c, "owner", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let second = submit(
        &c,
        "contender",
        "s",
        AdmissionPolicy::DropIfRunning,
        native(move |_| {
            flag.store(true, Ordering::SeqCst);
            async { Ok(Vec::new()) }
        }),
    );
    assert_eq!(
        rejected(&second.wait().await),
        Some(RejectionKind::SlotBusy)
    );
    assert!(!ran.load(Ordering::SeqCst));
    let snap = c.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(
        (snap[0].state, snap[0].owner, snap[0].queue_depth),
        (SlotState::Running, Some(first.id()), 0)
    );
    assert!(c.cancel(first.id()).await);
    assert_eq!(first.wait().await, TaskOutcome::Canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_stops_a_plugin_owner_and_runs_the_replacement() {
    let rt = runtime();
    let sleeper = load(&rt, "sleeper").await;
    let c = controller();
    let mut rec = Recorder::new(c.supervisor(), WASM_LIMIT);
    let first = submit(
        &c,
        "sleepy",
        "s",
        AdmissionPolicy::Queue,
        PluginTask::new(&rt, &sleeper).params(params(&[("ms", "60000")])),
    );
    rec.until_kind(first.id(), EventKind::Progress).await;
    let second = submit(
        &c,
        "quick",
        "s",
        AdmissionPolicy::Replace,
        PluginTask::new(&rt, &sleeper).params(params(&[("ms", "1")])),
    );
    let first_outcome = within(WASM_LIMIT, "owner ends", first.wait()).await;
    assert_eq!(first_outcome, TaskOutcome::Canceled);
    let second_outcome = within(WASM_LIMIT, "replacement ends", second.wait()).await;
    assert_eq!(
        second_outcome,
        TaskOutcome::Completed {
            output: b"slept 1 ms".to_vec()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn fifty_concurrent_replaces_settle_to_one_owner() {
    let c = controller();
    let started = Arc::new(Notify::new());
    let first = submit(&c, "owner-0", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let mut handles = Vec::new();
    for i in 0..50 {
        let c = c.clone();
        let body = owner(&Arc::new(Notify::new()));
        handles.push(tokio::spawn(async move {
            submit(&c, &format!("r-{i}"), "s", AdmissionPolicy::Replace, body)
        }));
    }
    let mut waiters = Vec::new();
    for h in handles {
        waiters.push(h.await.unwrap());
    }
    assert_eq!(
        within(NATIVE_LIMIT, "owner", first.wait()).await,
        TaskOutcome::Canceled
    );
    // All but one of the 50 resolve (superseded while queued, or canceled
    // by the next replacement); the last one placed keeps the slot.
    let mut set = tokio::task::JoinSet::new();
    for w in waiters {
        set.spawn(async move { (w.id(), w.wait().await) });
    }
    let mut resolved = Vec::new();
    for _ in 0..49 {
        let (id, outcome) = within(NATIVE_LIMIT, "49 waiters resolve", set.join_next())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(
                outcome,
                TaskOutcome::Canceled
                    | TaskOutcome::Rejected {
                        kind: RejectionKind::SupersededByReplace,
                        ..
                    }
            ),
            "{id}: {outcome:?}"
        );
        resolved.push(id);
    }
    let snap = c.snapshot();
    assert_eq!(snap.len(), 1, "{snap:?}");
    assert_eq!(snap[0].state, SlotState::Running, "{snap:?}");
    assert_eq!(snap[0].queue_depth, 0, "{snap:?}");
    let owner_id = snap[0].owner.expect("an owner");
    assert!(!resolved.contains(&owner_id));
    assert!(c.cancel(owner_id).await);
    let (id, outcome) = within(NATIVE_LIMIT, "last owner", set.join_next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((id, outcome), (owner_id, TaskOutcome::Canceled));
}

#[tokio::test(start_paused = true)]
async fn replace_displaces_the_head_and_keeps_the_tail() {
    let c = controller();
    let mut rec = Recorder::new(c.supervisor(), NATIVE_LIMIT);
    let started = Arc::new(Notify::new());
    let own = submit(&c, "owner", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let a = submit(&c, "a", "s", AdmissionPolicy::Queue, returns(b"a"));
    let b = submit(&c, "b", "s", AdmissionPolicy::Queue, returns(b"b"));
    assert_eq!(c.snapshot()[0].queued, vec![a.id(), b.id()]);
    let r = submit(&c, "r", "s", AdmissionPolicy::Replace, returns(b"r"));
    assert_eq!(
        rejected(&a.clone().wait().await),
        Some(RejectionKind::SupersededByReplace)
    );
    let snap = c.snapshot();
    assert_eq!(
        snap[0].queued,
        vec![r.id(), b.id()],
        "R is the head, B waits behind it"
    );
    // The owner was asked to stop once; it ends canceled, then R, then B.
    assert_eq!(own.wait().await, TaskOutcome::Canceled);
    assert_eq!(
        r.clone().wait().await,
        TaskOutcome::Completed {
            output: b"r".to_vec()
        }
    );
    assert_eq!(
        b.clone().wait().await,
        TaskOutcome::Completed {
            output: b"b".to_vec()
        }
    );
    rec.until_removed(b.id()).await;
    let started_seq = |id| rec.of_kind(id, EventKind::AttemptStarting)[0].seq;
    assert!(started_seq(r.id()) < started_seq(b.id()));
    assert!(rec.of_kind(a.id(), EventKind::AttemptStarting).is_empty());
    assert_eq!(
        rec.all_of_kind(EventKind::TaskRemoveRequested).len(),
        1,
        "the owner is retired once"
    );
}

#[tokio::test(start_paused = true)]
async fn slot_queue_bounds() {
    let c = builder().max_slot_queue(1).build();
    let started = Arc::new(Notify::new());
    let own = submit(&c, "owner", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let second = submit(&c, "second", "s", AdmissionPolicy::Queue, returns(b""));
    let third = submit(&c, "third", "s", AdmissionPolicy::Queue, returns(b""));
    assert_eq!(
        rejected(&third.wait().await),
        Some(RejectionKind::QueueFull)
    );
    assert!(second.try_outcome().is_none());
    assert!(c.remove(own.id()));
    assert_eq!(
        second.wait().await,
        TaskOutcome::Completed { output: vec![] }
    );

    let c = builder().max_slot_queue(0).build();
    let started = Arc::new(Notify::new());
    let own = submit(&c, "owner", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let queued = submit(&c, "q", "s", AdmissionPolicy::Queue, returns(b""));
    assert_eq!(
        rejected(&queued.wait().await),
        Some(RejectionKind::QueueFull)
    );
    let replace = submit(&c, "r", "s", AdmissionPolicy::Replace, returns(b"r"));
    assert_eq!(own.wait().await, TaskOutcome::Canceled);
    assert_eq!(
        replace.wait().await,
        TaskOutcome::Completed {
            output: b"r".to_vec()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn total_pending_and_slot_limits() {
    let c = builder().max_total_pending(1).max_slots(2).build();
    let s1 = Arc::new(Notify::new());
    let s2 = Arc::new(Notify::new());
    let o1 = submit(&c, "o1", "a", AdmissionPolicy::Queue, owner(&s1));
    let o2 = submit(&c, "o2", "b", AdmissionPolicy::Queue, owner(&s2));
    s1.notified().await;
    s2.notified().await;
    let third_slot = submit(&c, "o3", "c", AdmissionPolicy::Queue, returns(b""));
    assert_eq!(
        rejected(&third_slot.wait().await),
        Some(RejectionKind::ResourceLimit)
    );
    let q1 = submit(&c, "q1", "a", AdmissionPolicy::Queue, returns(b""));
    let q2 = submit(&c, "q2", "b", AdmissionPolicy::Queue, returns(b""));
    assert_eq!(
        rejected(&q2.wait().await),
        Some(RejectionKind::ResourceLimit)
    );
    // Replacing an existing head needs no new pending unit.
    let r1 = submit(&c, "r1", "a", AdmissionPolicy::Replace, returns(b""));
    assert_eq!(
        rejected(&q1.wait().await),
        Some(RejectionKind::SupersededByReplace)
    );
    assert_eq!(o1.wait().await, TaskOutcome::Canceled);
    assert_eq!(r1.wait().await, TaskOutcome::Completed { output: vec![] });
    assert!(c.cancel(o2.id()).await);
}

#[tokio::test(start_paused = true)]
async fn queued_work_removed_by_id_or_name_is_rejected_not_canceled() {
    let c = controller();
    let started = Arc::new(Notify::new());
    let own = submit(&c, "owner", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let by_id = submit(&c, "q1", "s", AdmissionPolicy::Queue, returns(b""));
    let by_name = submit(&c, "q2", "s", AdmissionPolicy::Queue, returns(b""));
    assert!(c.remove(by_id.id()));
    assert!(!c.remove(by_id.id()), "a second removal finds nothing");
    assert!(c.cancel("q2").await);
    assert_eq!(
        rejected(&by_id.wait().await),
        Some(RejectionKind::RemovedFromQueue)
    );
    assert_eq!(
        rejected(&by_name.wait().await),
        Some(RejectionKind::RemovedFromQueue)
    );
    assert_eq!(c.snapshot()[0].queue_depth, 0);
    assert!(c.cancel("owner").await);
    assert_eq!(own.wait().await, TaskOutcome::Canceled);
}

#[tokio::test(start_paused = true)]
async fn shutdown_rejects_queued_work() {
    let c = controller();
    let started = Arc::new(Notify::new());
    let own = submit(&c, "owner", "s", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let queued = submit(&c, "q", "s", AdmissionPolicy::Queue, returns(b""));
    c.shutdown(ms(100)).await;
    assert_eq!(
        rejected(&queued.wait().await),
        Some(RejectionKind::ShuttingDown)
    );
    assert_eq!(own.wait().await, TaskOutcome::Canceled);
    let late = submit(&c, "late", "t", AdmissionPolicy::Queue, returns(b""));
    assert_eq!(
        rejected(&late.wait().await),
        Some(RejectionKind::ShuttingDown)
    );
}

#[tokio::test(start_paused = true)]
async fn the_timeout_never_counts_time_spent_queued() {
    let c = controller();
    let first = submit(&c, "first", "s", AdmissionPolicy::Queue, sleeps(ms(500)));
    let second = c.submit(
        Submission::new(
            TaskSpec::once("second", sleeps(ms(80)))
                .with_slot("s")
                .with_timeout(ms(100)),
        )
        .policy(AdmissionPolicy::Queue),
    );
    assert_eq!(
        first.wait().await,
        TaskOutcome::Completed {
            output: b"ok".to_vec()
        }
    );
    assert_eq!(
        second.wait().await,
        TaskOutcome::Completed {
            output: b"ok".to_vec()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_aborted_spinner_frees_its_slot_only_when_gone() {
    let rt = runtime();
    let spin = load(&rt, "spin").await;
    let hello = load(&rt, "hello").await;
    let c = Controller::builder(Supervisor::builder().grace(ms(50)).build()).build();
    let mut rec = Recorder::new(c.supervisor(), WASM_LIMIT);
    let spinner = submit(
        &c,
        "spinner",
        "s",
        AdmissionPolicy::Queue,
        PluginTask::new(&rt, &spin),
    );
    rec.until_kind(spinner.id(), EventKind::AttemptStarting)
        .await;
    let next = submit(
        &c,
        "next",
        "s",
        AdmissionPolicy::Queue,
        PluginTask::new(&rt, &hello).input(b"hi".to_vec()),
    );
    assert!(c.remove(spinner.id()));
    assert_eq!(
        within(WASM_LIMIT, "spinner", spinner.clone().wait()).await,
        TaskOutcome::ForceAborted
    );
    assert_eq!(
        within(WASM_LIMIT, "next", next.clone().wait()).await,
        TaskOutcome::Completed {
            output: b"hi".to_vec()
        }
    );
    let next_start = rec
        .until_kind(next.id(), EventKind::AttemptStarting)
        .await
        .seq;
    let gone = rec.of_kind(spinner.id(), EventKind::TaskRemoved)[0].seq;
    let finished = rec.of_kind(spinner.id(), EventKind::TaskFinished)[0].seq;
    assert!(
        finished < gone && gone < next_start,
        "{finished} < {gone} < {next_start}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_resources_share_a_slot_per_environment() {
    let rt = runtime();
    let deploy = load(&rt, "deploy").await;
    let template = deploy
        .info()
        .resource
        .clone()
        .expect("deploy declares a resource");
    assert_eq!(template.as_str(), "deploy/{env}");
    let c = controller();
    let mut rec = Recorder::new(c.supervisor(), WASM_LIMIT);
    let mut waiters = Vec::new();
    for (i, env) in ["prod", "prod", "dev"].iter().enumerate() {
        let params = params(&[("env", env), ("ms", "200")]);
        let slot = resolve_slot(None, Some(&template), &params, "unused").unwrap();
        let name = format!("deploy-{i}");
        let body = PluginTask::new(&rt, &deploy).params(params);
        waiters.push(
            c.submit(
                Submission::new(TaskSpec::once(name, body).with_slot(slot))
                    .policy(AdmissionPolicy::Queue),
            ),
        );
    }
    let missing = resolve_slot(None, Some(&template), &[], "x").unwrap_err();
    assert!(missing.to_string().contains("--param env=VALUE"));
    let ids: Vec<TaskId> = waiters.iter().map(TaskWaiter::id).collect();
    for w in waiters {
        assert!(matches!(
            within(WASM_LIMIT, "deploy", w.wait()).await,
            TaskOutcome::Completed { .. }
        ));
    }
    rec.until_removed(ids[1]).await;
    let seq = |id, kind| rec.of_kind(id, kind)[0].seq;
    assert_eq!(
        rec.of_kind(ids[0], EventKind::TaskAdded)[0].slot.as_deref(),
        Some("deploy/prod")
    );
    assert_eq!(
        rec.of_kind(ids[2], EventKind::TaskAdded)[0].slot.as_deref(),
        Some("deploy/dev")
    );
    // The two prod deploys take turns; dev runs alongside the first.
    assert!(seq(ids[0], EventKind::TaskRemoved) < seq(ids[1], EventKind::AttemptStarting));
    assert!(seq(ids[2], EventKind::AttemptStarting) < seq(ids[0], EventKind::TaskFinished));
}

/// 10,000 submissions over 100 slots from 8 concurrent submitters with mixed
/// policies and random cancels: no slot ever has two owners (an owner holds
/// its slot from TaskAdded to TaskRemoved), and every submission gets
/// exactly one final outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_mixed_submissions_keeps_one_owner_per_slot() {
    const SUBMITTERS: usize = 8;
    const PER_SUBMITTER: usize = 1250;
    let c = Controller::builder(
        Supervisor::builder()
            .bus_capacity(1 << 21)
            .grace(ms(1000))
            .build(),
    )
    .max_total_pending(100_000)
    .build();
    let mut stream = c.supervisor().subscribe();
    let ran = Arc::new(AtomicUsize::new(0));
    let mut submitters = Vec::new();
    for s in 0..SUBMITTERS {
        let c = c.clone();
        let ran = Arc::clone(&ran);
        submitters.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(s as u64 + 1);
            let mut waiters = Vec::new();
            for i in 0..PER_SUBMITTER {
                let slot = format!("slot-{}", rng.usize(0..100));
                let policy = match rng.u8(0..10) {
                    0..=5 => AdmissionPolicy::Queue,
                    6..=7 => AdmissionPolicy::Replace,
                    _ => AdmissionPolicy::DropIfRunning,
                };
                let ran = Arc::clone(&ran);
                let yields = rng.usize(0..4);
                let body = native(move |ctx| {
                    let ran = Arc::clone(&ran);
                    async move {
                        ran.fetch_add(1, Ordering::Relaxed);
                        for _ in 0..yields {
                            if ctx.is_cancelled() {
                                return Err(TaskError::Canceled);
                            }
                            tokio::task::yield_now().await;
                        }
                        Ok(Vec::new())
                    }
                });
                let w = submit(&c, &format!("t-{s}-{i}"), &slot, policy, body);
                if rng.u8(0..10) == 0 {
                    c.remove(w.id());
                }
                waiters.push(w);
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let mut outcomes = Vec::new();
            for w in waiters {
                outcomes.push((w.id(), w.wait().await));
            }
            outcomes
        }));
    }
    let mut outcomes = HashMap::new();
    for h in submitters {
        for (id, outcome) in within(Duration::from_secs(120), "storm", h).await.unwrap() {
            assert!(
                outcomes.insert(id, outcome).is_none(),
                "one outcome per submission"
            );
        }
    }
    assert_eq!(outcomes.len(), SUBMITTERS * PER_SUBMITTER);
    c.shutdown(ms(1000)).await;

    // Replay the events.
    let mut holder: HashMap<Arc<str>, TaskId> = HashMap::new();
    let mut finished: HashMap<TaskId, usize> = HashMap::new();
    let mut rejected_by_controller = 0;
    while let Some(received) = stream.recv().await {
        let e = match received {
            Received::Event(e) => e,
            Received::Dropped(n) => panic!("the checker's lane dropped {n} events"),
        };
        match e.kind {
            EventKind::TaskAdded => {
                let slot = e.slot.clone().unwrap();
                let id = e.task_id.unwrap();
                if let Some(other) = holder.insert(slot.clone(), id) {
                    panic!(
                        "slot {slot} has two owners: {other} and {id} (seq {})",
                        e.seq
                    );
                }
            }
            EventKind::TaskRemoved => {
                let slot = e.slot.clone().unwrap();
                assert_eq!(holder.remove(&slot), e.task_id, "TaskRemoved by the holder");
            }
            EventKind::TaskFinished => *finished.entry(e.task_id.unwrap()).or_default() += 1,
            EventKind::ControllerRejected => {
                rejected_by_controller += 1;
                *finished.entry(e.task_id.unwrap()).or_default() += 1;
            }
            _ => {}
        }
    }
    assert!(holder.is_empty(), "every owner left: {holder:?}");
    assert_eq!(
        finished.len(),
        outcomes.len(),
        "every submission ends in an event too"
    );
    assert!(
        finished.values().all(|&n| n == 1),
        "exactly one end per submission"
    );
    let completed = outcomes
        .values()
        .filter(|o| matches!(o, TaskOutcome::Completed { .. }))
        .count();
    assert!(
        completed > 0 && rejected_by_controller > 0,
        "{completed} completed, {rejected_by_controller} rejected"
    );
    assert!(ran.load(Ordering::Relaxed) >= completed);
    assert!(c.snapshot().is_empty());
}

/// A delayed submission is accepted at once, holds no slot while it waits,
/// and is placed at its time by its policy against the slot as it is then;
/// its first attempt reports how long after its due time it started.
#[tokio::test(start_paused = true)]
async fn a_delayed_submission_waits_for_its_time_then_takes_its_turn() {
    let c = controller();
    let mut rec = Recorder::new(c.supervisor(), NATIVE_LIMIT);
    let start = tokio::time::Instant::now();
    let due = start + ms(500);
    let (later, placement) = c.submit_placed(
        c.supervisor().reserve(),
        Submission::new(TaskSpec::once("later", returns(b"later")).with_slot("s")).not_before(due),
    );
    assert!(
        matches!(placement, Placement::Delayed { .. }),
        "{placement:?}"
    );
    let id = later.id();
    let queued = c.queued(&TaskRef::Id(id)).expect("listed while it waits");
    assert_eq!(queued.due_in, Some(ms(500)));
    assert!(c.snapshot().is_empty(), "it holds no slot while it waits");
    // Meanwhile the slot is taken by a task that runs past its time: the
    // delayed one then queues behind it (Queue policy).
    let now = submit(&c, "now", "s", AdmissionPolicy::Queue, sleeps(ms(800)));
    assert_eq!(
        later.wait().await,
        TaskOutcome::Completed {
            output: b"later".to_vec()
        }
    );
    now.wait().await;
    let due_event = rec.until_kind(id, EventKind::DelayDue).await;
    assert_eq!(due_event.delay_ms, Some(0));
    let starting = rec.until_kind(id, EventKind::AttemptStarting).await;
    assert_eq!(
        starting.delay_ms,
        Some(300),
        "started when the owner ended, 300 ms after its due time"
    );
    assert_eq!(start.elapsed(), ms(800));
}

/// A delayed submission can be removed while it waits (it ends
/// RemovedFromQueue and never runs), shutdown rejects the ones left, and a
/// time already past places it at once.
#[tokio::test(start_paused = true)]
async fn delayed_submissions_are_removed_rejected_at_shutdown_or_placed_when_past() {
    let c = controller();
    let ran = Arc::new(AtomicUsize::new(0));
    let counting = || {
        let ran = Arc::clone(&ran);
        native(move |_| {
            ran.fetch_add(1, Ordering::SeqCst);
            async { Ok(Vec::new()) }
        })
    };
    let delayed = |name: &str, after: Duration, body| {
        c.submit(
            Submission::new(TaskSpec::once(name, body).with_slot(name))
                .not_before(tokio::time::Instant::now() + after),
        )
    };
    let removed = delayed("removed", ms(1_000), counting());
    assert!(c.remove("removed"), "found by name while it waits");
    assert_eq!(
        rejected(&removed.wait().await),
        Some(RejectionKind::RemovedFromQueue)
    );
    let past = c.submit(
        Submission::new(TaskSpec::once("past", counting()).with_slot("past"))
            .not_before(tokio::time::Instant::now() - ms(1)),
    );
    assert!(matches!(past.wait().await, TaskOutcome::Completed { .. }));
    let left = delayed("left", ms(60_000), counting());
    c.shutdown(ms(100)).await;
    assert_eq!(
        rejected(&left.wait().await),
        Some(RejectionKind::ShuttingDown)
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1, "only `past` ran");
}

/// Past `max_delayed`, a delayed submission is refused at once.
#[tokio::test(start_paused = true)]
async fn delayed_submissions_are_bounded() {
    let c = builder().max_delayed(2).build();
    let at = tokio::time::Instant::now() + ms(10_000);
    let waiters: Vec<TaskWaiter> = (0..3)
        .map(|i| {
            c.submit(
                Submission::new(TaskSpec::once(format!("d{i}"), returns(b"")).with_slot("s"))
                    .not_before(at),
            )
        })
        .collect();
    assert_eq!(
        rejected(&waiters[2].try_outcome().expect("decided at once")),
        Some(RejectionKind::ResourceLimit)
    );
    assert_eq!(c.queued_all().len(), 2);
    c.shutdown(ms(100)).await;
}
