//! Identities under contention: one name admits exactly one task, ids are
//! unique and strictly increasing, exactly one stop claim wins, unknown ids
//! make no claim, and a name is reusable (with a new id) once its task is
//! gone (docs/semantics.md).

use std::sync::Barrier;

use taskhost_core::supervisor::{EventKind as K, TaskRef};
use taskhost_runtime::prelude::*;

use crate::common_sup::{
    COMPLETED_ONCE, Fixture, NATIVE_LIMIT, REJECTED_AT_ADD, WASM_LIMIT, returns, until_canceled,
    within,
};

const ADDERS: usize = 64;
const REMOVERS: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_admits_exactly_one_of_many_concurrent_adds() {
    let sup = Supervisor::default();
    let handle = tokio::runtime::Handle::current();

    // Real threads released together by a barrier: as much contention as
    // the machine allows.
    let barrier = Barrier::new(ADDERS);
    let waiters: Vec<TaskWaiter> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..ADDERS)
            .map(|_| {
                s.spawn(|| {
                    let _runtime = handle.enter();
                    barrier.wait();
                    sup.add(TaskSpec::once("contended", until_canceled()))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });

    let (admitted, rejected): (Vec<&TaskWaiter>, Vec<&TaskWaiter>) =
        waiters.iter().partition(|w| w.try_outcome().is_none());
    assert_eq!(admitted.len(), 1, "exactly one add wins the name");
    for w in &rejected {
        match w.try_outcome() {
            Some(TaskOutcome::Rejected {
                kind: RejectionKind::AlreadyExists,
                ..
            }) => {}
            other => panic!("expected Rejected AlreadyExists, got {other:?}"),
        }
    }
    let winner = admitted[0].id();
    assert_eq!(sup.list().len(), 1);
    assert_eq!(sup.list()[0].id, winner);

    // Every add got its own id, rejected or not.
    let mut ids: Vec<TaskId> = waiters.iter().map(TaskWaiter::id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ADDERS, "ids are never shared");
    let highest = *ids.last().unwrap();

    // Sequential adds get strictly increasing ids, above every earlier one.
    let later: Vec<TaskWaiter> = ["x", "y", "z"]
        .iter()
        .map(|n| sup.add(TaskSpec::once(*n, returns(b""))))
        .collect();
    let later_ids: Vec<TaskId> = later.iter().map(TaskWaiter::id).collect();
    assert!(later_ids[0] > highest);
    assert!(later_ids.windows(2).all(|w| w[0] < w[1]), "{later_ids:?}");

    // Many concurrent removes, by id and by name: one claim wins.
    let barrier = Barrier::new(REMOVERS);
    let claims: Vec<bool> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..REMOVERS)
            .map(|i| {
                let barrier = &barrier;
                let sup = &sup;
                s.spawn(move || {
                    let target = if i % 2 == 0 {
                        TaskRef::Id(winner)
                    } else {
                        TaskRef::Name("contended".into())
                    };
                    barrier.wait();
                    sup.remove(target)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(
        claims.iter().filter(|c| **c).count(),
        1,
        "exactly one remove makes the stop claim"
    );
    let winner_waiter = admitted[0].clone();
    assert_eq!(
        within(WASM_LIMIT, "winner", winner_waiter.wait()).await,
        TaskOutcome::Canceled
    );
    assert!(!sup.remove(winner), "no claim once the outcome is decided");

    // The name is reusable once the task is gone, under a new id.
    within(WASM_LIMIT, "gone", sup.gone(winner)).await;
    assert!(!sup.is_alive("contended"));
    let reused = sup.add(TaskSpec::once("contended", until_canceled()));
    assert_eq!(reused.try_outcome(), None);
    assert!(reused.id() > *later_ids.last().unwrap());
    assert!(sup.cancel(reused.id()).await);
    assert!(
        !sup.cancel(reused.id()).await,
        "a repeat cancel makes no claim"
    );
    assert_eq!(reused.wait().await, TaskOutcome::Canceled);

    for w in later {
        assert_eq!(
            within(WASM_LIMIT, "later", w.wait()).await,
            TaskOutcome::Completed { output: Vec::new() }
        );
    }
}

#[tokio::test(start_paused = true)]
async fn unknown_tasks_make_no_claim() {
    let sup = Supervisor::default();
    let unknown = TaskId::from_u64(999_999);
    assert!(!sup.remove(unknown));
    assert!(!sup.cancel(unknown).await);
    assert!(!sup.remove("nobody"));
    assert!(!sup.cancel("nobody").await);
    assert!(sup.watch(unknown).is_none());
    assert!(sup.info(unknown).is_none());
    assert!(!sup.is_alive("nobody"));
    // Resolves at once for unknown tasks.
    sup.gone(unknown).await;

    // A finished and removed task is unknown too.
    let done = sup.add(TaskSpec::once("done", returns(b"")));
    let id = done.id();
    done.wait().await;
    sup.gone(id).await;
    assert!(!sup.remove(id));
    assert!(!sup.cancel("done").await);
    assert!(sup.watch(id).is_none());
}

/// The regression test of "duplicate ids corrupt the registry": a task is
/// only ever registered under an id its own supervisor minted, once, so two
/// tasks never share an id. Another supervisor's reservation is refused
/// (Rejected AdmissionFailed), whether its id is that of a live task here or
/// one this supervisor has not minted yet, and the live task is untouched.
/// (Using one reservation twice does not compile: registering consumes it
/// and it is not `Clone`.)
#[tokio::test(start_paused = true)]
async fn a_reservation_from_another_supervisor_is_refused_so_ids_are_never_shared() {
    let mut fx = Fixture::native();
    let other = Supervisor::default();

    // Reserved first, registered later: the task gets the reserved id, below
    // the ids minted meanwhile.
    let early = fx.sup.reserve();
    let early_id = early.id();
    let live = fx.add(TaskSpec::once("live", until_canceled()));
    assert!(live.id() > early_id);
    fx.events.until_kind(live.id(), K::AttemptStarting).await;

    // The other supervisor mints the same numbers.
    let mut foreign = other.reserve();
    while foreign.id() < live.id() {
        foreign = other.reserve();
    }
    assert_eq!(foreign.id(), live.id());
    let clash = fx
        .sup
        .add_reserved(foreign, TaskSpec::once("clash", returns(b"never")));
    assert_eq!(clash.id(), live.id());
    match clash.try_outcome() {
        Some(TaskOutcome::Rejected {
            kind: RejectionKind::AdmissionFailed,
            reason,
        }) => assert!(
            reason.contains("not reserved from this supervisor"),
            "{reason}"
        ),
        other => panic!("expected Rejected AdmissionFailed at once, got {other:?}"),
    }
    assert_eq!(clash.report().await.attempts, 0);
    let refused = fx.events.until(|e| e.kind == K::TaskAddFailed).await;
    assert_eq!(
        (refused.name.as_deref(), refused.rejection),
        (Some("clash"), Some(RejectionKind::AdmissionFailed))
    );
    // The live task with that id is untouched.
    assert_eq!(live.try_outcome(), None);
    assert_eq!(fx.sup.list().len(), 1);
    assert_eq!(fx.sup.info(live.id()).map(|t| t.name), Some("live".into()));
    assert!(!fx.sup.is_alive("clash"));

    // A foreign id this supervisor has not minted yet is refused too:
    // accepted, it would be shared with the next task added here.
    let ahead = other.reserve();
    let ahead_id = ahead.id();
    let refused = fx
        .sup
        .add_reserved(ahead, TaskSpec::once("ahead", returns(b"never")));
    assert_eq!(
        refused.try_outcome().and_then(|o| o.rejection()),
        Some(RejectionKind::AdmissionFailed)
    );
    let (next, report) = fx.run(TaskSpec::once("next", returns(b"next"))).await;
    assert_eq!(next, ahead_id, "the id the foreign reservation named");
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"next".to_vec()
        }
    );
    // The refused add's events name the id too; by name, each has its own.
    let kinds_of = |id: TaskId, name: &str| -> Vec<K> {
        fx.events
            .of(id)
            .iter()
            .filter(|e| e.name.as_deref() == Some(name))
            .map(|e| e.kind)
            .collect()
    };
    assert_eq!(kinds_of(next, "ahead"), REJECTED_AT_ADD);
    assert_eq!(kinds_of(next, "next"), COMPLETED_ONCE);
    assert_eq!(kinds_of(live.id(), "clash"), REJECTED_AT_ADD);

    // The early reservation still works, under its own id.
    let waiter = fx
        .sup
        .add_reserved(early, TaskSpec::once("early", returns(b"early")));
    assert_eq!(waiter.id(), early_id);
    let (id, report) = fx.settle(waiter).await;
    assert_eq!(id, early_id);
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"early".to_vec()
        }
    );
    fx.assert_kinds(early_id, &COMPLETED_ONCE);

    assert!(fx.sup.cancel(live.id()).await);
    fx.events.until_removed(live.id()).await;
    let mut registered: Vec<TaskId> = fx
        .events
        .all_of_kind(K::TaskAdded)
        .iter()
        .map(|e| e.task_id.unwrap())
        .collect();
    assert_eq!(registered.len(), 3, "live, next and early");
    registered.sort_unstable();
    registered.dedup();
    assert_eq!(registered.len(), 3, "no two registered tasks share an id");
    let refused: Vec<_> = fx
        .events
        .all_of_kind(K::TaskAddFailed)
        .iter()
        .map(|e| (e.task_id.unwrap(), e.rejection))
        .collect();
    assert_eq!(
        refused,
        [
            (live.id(), Some(RejectionKind::AdmissionFailed)),
            (ahead_id, Some(RejectionKind::AdmissionFailed))
        ]
    );
}

/// A host that keeps tasks across restarts gets back the ids of an earlier
/// run with `restore`: only ids below `first_id`, each once, so a recovered
/// task can never share an id with another.
#[tokio::test(start_paused = true)]
async fn restored_ids_are_handed_out_once_and_only_below_the_first_id() {
    let mut fx = Fixture::new(Supervisor::builder().first_id(100).build(), NATIVE_LIMIT);
    let fresh = fx.sup.reserve();
    assert_eq!(fresh.id().get(), 100, "minting starts at first_id");

    let old = TaskId::from_u64(7);
    let restored = fx.sup.restore(old).expect("an earlier run's id");
    assert_eq!(restored.id(), old);
    assert!(fx.sup.restore(old).is_none(), "an id is restored once");
    for not_earlier in [0, 100, 101, 150] {
        assert!(
            fx.sup.restore(TaskId::from_u64(not_earlier)).is_none(),
            "{not_earlier} is not an id of an earlier run"
        );
    }

    let waiter = fx
        .sup
        .add_reserved(restored, TaskSpec::once("recovered", returns(b"r")));
    assert_eq!(waiter.id(), old);
    let (id, report) = fx.settle(waiter).await;
    assert_eq!(id, old);
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"r".to_vec()
        }
    );
    fx.assert_kinds(old, &COMPLETED_ONCE);
    assert!(
        fx.sup.restore(old).is_none(),
        "not even once its task is gone"
    );

    let waiter = fx
        .sup
        .add_reserved(fresh, TaskSpec::once("fresh", returns(b"f")));
    assert_eq!(waiter.id().get(), 100);
    let (_, report) = fx.settle(waiter).await;
    assert_eq!(report.attempts, 1);
    let (later, _) = fx.run(TaskSpec::once("later", returns(b""))).await;
    assert_eq!(later.get(), 101);
    assert!(fx.events.all_of_kind(K::TaskAddFailed).is_empty());
}
