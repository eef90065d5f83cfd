//! Identities under contention: one name admits exactly one task, ids are
//! unique and strictly increasing, exactly one stop claim wins, unknown ids
//! make no claim, and a name is reusable (with a new id) once its task is
//! gone (SEMANTICS §1, §5).

use std::sync::Barrier;

use taskhost::outcome::{RejectionKind, TaskOutcome};
use taskhost::supervisor::{Supervisor, SupervisorConfig, TaskRef, TaskSpec, TaskWaiter};

use crate::common_sup::{WASM_LIMIT, returns, until_canceled, within};

const ADDERS: usize = 64;
const REMOVERS: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_admits_exactly_one_of_many_concurrent_adds() {
    let sup = Supervisor::new(SupervisorConfig::default());
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
    let mut ids: Vec<u64> = waiters.iter().map(TaskWaiter::id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ADDERS, "ids are never shared");
    let highest = *ids.last().unwrap();

    // Sequential adds get strictly increasing ids, above every earlier one.
    let later: Vec<TaskWaiter> = ["x", "y", "z"]
        .iter()
        .map(|n| sup.add(TaskSpec::once(*n, returns(b""))))
        .collect();
    let later_ids: Vec<u64> = later.iter().map(TaskWaiter::id).collect();
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
    let sup = Supervisor::new(SupervisorConfig::default());
    assert!(!sup.remove(999_999));
    assert!(!sup.cancel(999_999).await);
    assert!(!sup.remove("nobody"));
    assert!(!sup.cancel("nobody").await);
    assert!(sup.watch(999_999).is_none());
    assert!(!sup.is_alive("nobody"));
    // Resolves at once for unknown tasks.
    sup.gone(999_999).await;

    // A finished and removed task is unknown too.
    let done = sup.add(TaskSpec::once("done", returns(b"")));
    let id = done.id();
    done.wait().await;
    sup.gone(id).await;
    assert!(!sup.remove(id));
    assert!(!sup.cancel("done").await);
    assert!(sup.watch(id).is_none());
}
