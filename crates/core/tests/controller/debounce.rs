//! Debounced slots (`SlotSettings::debounce`, `max_wait`): a newer
//! submission supersedes the one held, the newest runs once its window
//! has passed, never later than `max_wait` after the first; checked over
//! random programs by the history checker, which is shown to catch a
//! debounce that lets an older submission run.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use taskhost_core::slot_settings::{SlotRules, SlotSettings};
use taskhost_core::supervisor::{Event, Received};

use super::invariants::debounce_broken;
use super::*;

fn debounced(pattern: &str, wait_ms: u64, max_wait_ms: Option<u64>) -> SlotRules {
    let mut rules = SlotRules::default();
    let settings = SlotSettings {
        debounce: Some(ms(wait_ms)),
        max_wait: max_wait_ms.map(ms),
        ..SlotSettings::default()
    };
    rules.set(pattern, settings).unwrap();
    rules
}

#[tokio::test(start_paused = true)]
async fn a_newer_submission_supersedes_the_one_held_and_the_newest_runs_once() {
    let c = controller();
    c.set_slot_rules(debounced("build", 100, None));
    let started = tokio::time::Instant::now();
    let first = submit(&c, "a", "build", AdmissionPolicy::Queue, returns(b"a"));
    tokio::time::sleep(ms(60)).await;
    let second = submit(&c, "b", "build", AdmissionPolicy::Queue, returns(b"b"));
    tokio::time::sleep(ms(60)).await;
    let third = submit(&c, "c", "build", AdmissionPolicy::Queue, returns(b"c"));
    for (older, newer) in [(first, second.id()), (second, third.id())] {
        let TaskOutcome::Rejected { kind, reason } = older.wait().await else {
            panic!("superseded")
        };
        assert_eq!(kind, RejectionKind::SupersededByReplace);
        assert!(reason.contains(&format!("({newer})")), "{reason}");
    }
    assert_eq!(
        third.wait().await,
        TaskOutcome::Completed {
            output: b"c".to_vec()
        }
    );
    // The window restarted with each: the newest ran 100 ms after it came.
    assert!(started.elapsed() >= ms(220), "{:?}", started.elapsed());
    // Another slot is not debounced.
    let other = submit(&c, "d", "other", AdmissionPolicy::Queue, returns(b"d"));
    assert!(matches!(other.wait().await, TaskOutcome::Completed { .. }));
    c.shutdown(ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn a_run_of_submissions_is_placed_max_wait_after_its_first() {
    let c = controller();
    c.set_slot_rules(debounced("ci", 100, Some(250)));
    let started = tokio::time::Instant::now();
    let mut waiters = Vec::new();
    // One every 50 ms: each alone would push the window on forever.
    for i in 0..8 {
        waiters.push(submit(
            &c,
            &format!("t{i}"),
            "ci",
            AdmissionPolicy::Queue,
            returns(b""),
        ));
        tokio::time::sleep(ms(50)).await;
    }
    let mut ran = Vec::new();
    for (i, w) in waiters.into_iter().enumerate() {
        if matches!(w.wait().await, TaskOutcome::Completed { .. }) {
            ran.push(i);
        }
    }
    // t0..t5 came within 250 ms of t0: t5 (the newest at 250 ms) ran then;
    // t6 and t7 began a new run, and t7 ran 100 ms after it came.
    assert_eq!(ran, vec![5, 7]);
    assert!(started.elapsed() >= ms(450), "{:?}", started.elapsed());
    c.shutdown(ms(100)).await;
}

#[tokio::test(start_paused = true)]
async fn removing_the_held_submission_ends_its_run() {
    let c = controller();
    c.set_slot_rules(debounced("s", 100, None));
    let held = submit(&c, "a", "s", AdmissionPolicy::Queue, returns(b"a"));
    assert!(c.remove(held.id()));
    assert_eq!(
        rejected(&held.wait().await),
        Some(RejectionKind::RemovedFromQueue)
    );
    let next = submit(&c, "b", "s", AdmissionPolicy::Queue, returns(b"b"));
    assert_eq!(
        next.wait().await,
        TaskOutcome::Completed {
            output: b"b".to_vec()
        }
    );
    c.shutdown(ms(100)).await;
}

/// Plays submissions to two debounced slots and one plain slot, `gaps`
/// milliseconds apart, and returns the event history.
fn play(gaps: &[(usize, u64)], wait_ms: u64, max_wait_ms: Option<u64>) -> Vec<Arc<Event>> {
    let runtime = paused_runtime();
    runtime.block_on(async {
        let c = Controller::builder(Supervisor::builder().bus_capacity(1 << 16).build()).build();
        let mut stream = c.supervisor().subscribe();
        c.set_slot_rules(debounced("d*", wait_ms, max_wait_ms));
        let mut waiters = Vec::new();
        for (n, (slot, gap)) in gaps.iter().enumerate() {
            let slot = ["d1", "d2", "plain"][*slot];
            waiters.push(submit(
                &c,
                &format!("t{n}"),
                slot,
                AdmissionPolicy::Queue,
                sleeps(ms(5)),
            ));
            tokio::time::sleep(ms(*gap)).await;
        }
        for w in waiters {
            w.wait().await;
        }
        c.shutdown(ms(100)).await;
        drop(c);
        let mut events = Vec::new();
        while let Some(Received::Event(e)) = stream.recv().await {
            events.push(e);
        }
        events
    })
}

#[test]
fn random_programs_run_only_the_newest_of_each_window() {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let program = proptest::collection::vec((0..3usize, 0..80u64), 1..40);
    let max_wait = proptest::option::of(40..200u64);
    runner
        .run(&(program, 10..60u64, max_wait), |(gaps, wait, most)| {
            let most = most.map(|m| m.max(wait));
            let events = play(&gaps, wait, most);
            let all = events.iter().map(|e| &**e);
            prop_assert_eq!(debounce_broken(all, |s| s.starts_with('d')), Ok(()));
            Ok(())
        })
        .unwrap();
}

#[test]
fn the_checker_catches_an_older_submission_that_ran() {
    // Two submissions to d1 10 ms apart: the second runs.
    let events = play(&[(0, 10), (0, 200)], 50, None);
    let all = || events.iter().map(|e| &**e);
    assert_eq!(debounce_broken(all(), |s| s.starts_with('d')), Ok(()));
    let submitted: Vec<TaskId> = all()
        .filter(|e| e.kind == EventKind::ControllerSubmitted)
        .filter_map(|e| e.task_id)
        .collect();
    // The same history from a debounce that let the older one run.
    let mut planted: Vec<Event> = all().cloned().collect();
    let due = planted
        .iter_mut()
        .find(|e| e.kind == EventKind::DelayDue)
        .expect("a placement when due");
    assert_eq!(due.task_id, Some(submitted[1]));
    due.task_id = Some(submitted[0]);
    let err = debounce_broken(&planted, |s| s.starts_with('d')).unwrap_err();
    assert!(err.contains("was newer"), "{err}");
}
