//! Slots that hold more than one owner (`SlotRules`): the policies against
//! a full slot, the per-slot queue bound, settings changed while work
//! waits, and an invariant checker over the event history of random
//! programs (never more owners than the capacity at any instant), shown
//! to catch a capacity off by one.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use taskhost_core::slot_settings::{SlotRules, SlotSettings};
use taskhost_core::supervisor::{Event, Received};
use tokio::sync::Notify;

use super::invariants::{most_owners, over_capacity};
use super::*;

fn rules(pattern: &str, capacity: u32, max_queue: Option<usize>) -> SlotRules {
    let mut rules = SlotRules::default();
    rules
        .set(
            pattern,
            SlotSettings {
                capacity: Some(capacity),
                max_queue,
                ..SlotSettings::default()
            },
        )
        .unwrap();
    rules
}

/// Every event until the lane is empty after a shutdown.
async fn history(mut stream: taskhost_core::supervisor::EventStream) -> Vec<Arc<Event>> {
    let mut events = Vec::new();
    while let Some(received) = stream.recv().await {
        match received {
            Received::Event(e) => events.push(e),
            Received::Dropped(n) => panic!("the checker's lane dropped {n} events"),
        }
    }
    events
}

#[tokio::test(start_paused = true)]
async fn a_slot_of_capacity_three_runs_three_and_queues_the_fourth() {
    let c = controller();
    c.set_slot_rules(rules("db/*", 3, None));
    let started = Arc::new(Notify::new());
    let mut owners = Vec::new();
    for i in 0..3 {
        let name = format!("o{i}");
        owners.push(submit(
            &c,
            &name,
            "db/x",
            AdmissionPolicy::Queue,
            owner(&started),
        ));
        // One start at a time: a Notify keeps one wake-up, not three.
        started.notified().await;
    }
    let fourth = submit(&c, "o3", "db/x", AdmissionPolicy::Queue, returns(b"4"));
    let view = &c.snapshot()[0];
    assert_eq!(view.capacity, 3);
    assert_eq!(
        view.owners,
        owners.iter().map(TaskWaiter::id).collect::<Vec<_>>()
    );
    assert_eq!(view.queued, vec![fourth.id()]);
    // Another slot the pattern does not match keeps one owner.
    let _solo = submit(&c, "s0", "web", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let busy = submit(
        &c,
        "s1",
        "web",
        AdmissionPolicy::DropIfRunning,
        returns(b""),
    );
    assert_eq!(rejected(&busy.wait().await), Some(RejectionKind::SlotBusy));
    // One owner leaves: the fourth takes its place.
    c.remove(owners[1].id());
    assert_eq!(
        fourth.wait().await,
        TaskOutcome::Completed {
            output: b"4".to_vec()
        }
    );
    c.shutdown(ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn drop_if_running_takes_a_free_place_and_replace_stops_the_oldest() {
    let c = controller();
    c.set_slot_rules(rules("pool", 2, None));
    let started = Arc::new(Notify::new());
    let first = submit(&c, "a", "pool", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let second = submit(
        &c,
        "b",
        "pool",
        AdmissionPolicy::DropIfRunning,
        owner(&started),
    );
    started.notified().await;
    let third = submit(
        &c,
        "c",
        "pool",
        AdmissionPolicy::DropIfRunning,
        returns(b""),
    );
    assert_eq!(rejected(&third.wait().await), Some(RejectionKind::SlotBusy));
    // A full slot: Replace asks the oldest owner to stop and goes next.
    let (waiter, placement) = c.submit_placed(
        c.supervisor().reserve(),
        Submission::new(TaskSpec::once("d", returns(b"d")).with_slot("pool"))
            .policy(AdmissionPolicy::Replace),
    );
    assert!(
        matches!(placement, Placement::Replacing { owner, .. } if owner == first.id()),
        "{placement:?}"
    );
    assert_eq!(first.wait().await, TaskOutcome::Canceled);
    assert_eq!(
        waiter.wait().await,
        TaskOutcome::Completed {
            output: b"d".to_vec()
        }
    );
    // The second owner ran on throughout.
    assert!(c.snapshot()[0].owners.contains(&second.id()));
    c.shutdown(ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_of_its_own_queue_bound_refuses_past_it() {
    let c = builder().max_slot_queue(100).build();
    c.set_slot_rules(rules("narrow", 1, Some(1)));
    let started = Arc::new(Notify::new());
    let _owner = submit(&c, "a", "narrow", AdmissionPolicy::Queue, owner(&started));
    started.notified().await;
    let _waits = submit(&c, "b", "narrow", AdmissionPolicy::Queue, returns(b""));
    let full = submit(&c, "c", "narrow", AdmissionPolicy::Queue, returns(b""));
    let TaskOutcome::Rejected { kind, reason } = full.wait().await else {
        panic!("past the slot's own bound")
    };
    assert_eq!(kind, RejectionKind::QueueFull);
    assert!(
        reason.contains("(max_queue of its slot rule 1)"),
        "{reason}"
    );
    c.shutdown(ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn a_capacity_raised_while_work_waits_admits_it_and_a_lowered_one_stops_nobody() {
    let c = controller();
    let started = Arc::new(Notify::new());
    let waiters: Vec<TaskWaiter> = (0..3)
        .map(|i| {
            submit(
                &c,
                &format!("w{i}"),
                "s",
                AdmissionPolicy::Queue,
                owner(&started),
            )
        })
        .collect();
    started.notified().await;
    assert_eq!(c.snapshot()[0].queue_depth, 2);
    c.set_slot_rules(rules("s", 3, None));
    // Both are admitted at once: the first start wakes this waiter, the
    // second leaves the one wake-up a Notify keeps.
    started.notified().await;
    started.notified().await;
    let view = &c.snapshot()[0];
    assert_eq!((view.owners.len(), view.queue_depth), (3, 0));
    // Lowered to one: all three run on; a newcomer waits until two are gone.
    c.set_slot_rules(rules("s", 1, None));
    let late = submit(&c, "late", "s", AdmissionPolicy::Queue, returns(b"late"));
    assert_eq!(c.snapshot()[0].owners.len(), 3);
    let [w0, w1, w2] = <[TaskWaiter; 3]>::try_from(waiters).ok().unwrap();
    c.remove(w0.id());
    w0.wait().await;
    c.remove(w1.id());
    w1.wait().await;
    assert_eq!(c.snapshot()[0].queued, vec![late.id()]);
    c.remove(w2.id());
    assert_eq!(
        late.wait().await,
        TaskOutcome::Completed {
            output: b"late".to_vec()
        }
    );
    c.shutdown(ms(100)).await;
}

/// One step of a random program: a submission to one of three slots under
/// a policy, whose body runs for some ticks, and maybe a removal of an
/// earlier one.
#[derive(Debug, Clone)]
struct Step {
    slot: usize,
    policy: AdmissionPolicy,
    runs_ms: u64,
    remove: Option<usize>,
}

fn step() -> impl Strategy<Value = Step> {
    let policy = prop_oneof![
        3 => Just(AdmissionPolicy::Queue),
        1 => Just(AdmissionPolicy::Replace),
        1 => Just(AdmissionPolicy::DropIfRunning),
    ];
    (
        0..3usize,
        policy,
        0..30u64,
        proptest::option::of(0..40usize),
    )
        .prop_map(|(slot, policy, runs_ms, remove)| Step {
            slot,
            policy,
            runs_ms,
            remove,
        })
}

/// Plays a program against slots of capacity 1, 2 and 3 (set while it
/// runs, half way) and returns the event history.
fn play(steps: &[Step], capacities: [u32; 3]) -> Vec<Arc<Event>> {
    let runtime = paused_runtime();
    runtime.block_on(async {
        let c = Controller::builder(Supervisor::builder().bus_capacity(1 << 16).build())
            .max_slot_queue(4)
            .build();
        let stream = c.supervisor().subscribe();
        let mut all = SlotRules::default();
        for (i, cap) in capacities.iter().enumerate() {
            let settings = SlotSettings {
                capacity: Some(*cap),
                ..SlotSettings::default()
            };
            all.set(&format!("s{i}"), settings).unwrap();
        }
        let mut waiters = Vec::new();
        for (n, step) in steps.iter().enumerate() {
            if n == steps.len() / 2 {
                c.set_slot_rules(all.clone());
            }
            let body = sleeps(ms(step.runs_ms));
            let name = format!("t{n}");
            waiters.push(submit(
                &c,
                &name,
                &format!("s{}", step.slot),
                step.policy,
                body,
            ));
            if let Some(w) = step.remove.and_then(|i| waiters.get(i)) {
                c.remove(w.id());
            }
            tokio::time::sleep(ms(step.runs_ms / 3)).await;
        }
        for w in waiters {
            w.wait().await;
        }
        c.shutdown(ms(100)).await;
        drop(c);
        history(stream).await
    })
}

#[test]
fn random_programs_never_hold_more_owners_than_the_capacity() {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let capacities = [1u32, 2, 3];
    // The programs must fill the larger slots now and then, or the check
    // proves nothing.
    let filled = std::cell::Cell::new(0);
    runner
        .run(&proptest::collection::vec(step(), 1..40), |steps| {
            let events = play(&steps, capacities);
            // Before the rules are set every slot holds one; after, its
            // capacity: the larger bound holds throughout.
            let most = |slot: &str| match slot {
                "s0" => 1,
                "s1" => 2,
                _ => 3,
            };
            prop_assert_eq!(over_capacity(events.iter().map(|e| &**e), most), Ok(()));
            let top = most_owners(events.iter().map(|e| &**e));
            if top.get("s2") == Some(&3) {
                filled.set(filled.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    assert!(
        filled.get() > 0,
        "no program filled slot s2 to its capacity"
    );
}

#[test]
fn the_checker_catches_a_capacity_off_by_one() {
    // The controller holds three in s2 (as set), the checker expects two:
    // a controller admitting one more than its capacity looks like this.
    let steps: Vec<Step> = (0..12)
        .map(|_| Step {
            slot: 2,
            policy: AdmissionPolicy::Queue,
            runs_ms: 20,
            remove: None,
        })
        .collect();
    let events = play(&steps, [1, 2, 3]);
    assert_eq!(most_owners(events.iter().map(|e| &**e)).get("s2"), Some(&3));
    let err = over_capacity(events.iter().map(|e| &**e), |_| 2).unwrap_err();
    assert!(err.contains("held 3 owners"), "{err}");
    assert_eq!(over_capacity(events.iter().map(|e| &**e), |_| 3), Ok(()));
}
