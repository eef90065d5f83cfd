//! Events are best-effort, outcomes are not: a slow lane drops and reports
//! how much, without changing any outcome; per task the order is
//! TaskFinished, outcome delivery, TaskRemoved; a panicking subscriber is
//! reported and stops nobody (docs/semantics.md).

use std::collections::HashMap;
use std::io::Write;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use taskhost_core::supervisor::{Event, EventKind as K, JsonLinesWriter, Received, Subscriber};
use taskhost_runtime::prelude::*;

use crate::common_sup::{Recorder, WASM_LIMIT, ms, returns, within};

/// A subscriber that blocks on its first event until the test opens it.
struct Gate {
    entered: Option<mpsc::Sender<()>>,
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl Subscriber for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    fn on_event(&mut self, _event: &Event) {
        if let Some(entered) = self.entered.take() {
            let _ = entered.send(());
        }
        let (lock, opened) = &*self.open;
        let mut open = lock.lock().unwrap();
        while !*open {
            open = opened.wait(open).unwrap();
        }
    }
}

fn release(gate: &(Mutex<bool>, Condvar)) {
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_lane_drops_and_reports_it_while_outcomes_stay_exact() {
    const TASKS: usize = 5;
    const FAILURES: u32 = 5;
    let open = Arc::new((Mutex::new(false), Condvar::new()));
    let (entered, gate_entered) = mpsc::channel();
    let sup = Supervisor::builder()
        .bus_capacity(2)
        .subscriber(Gate {
            entered: Some(entered),
            open: Arc::clone(&open),
        })
        .build();
    // A lane the test reads only after every task has ended.
    let mut unread = sup.subscribe();

    let waiters: Vec<TaskWaiter> = (0..TASKS)
        .map(|i| {
            sup.add(
                TaskSpec::restartable(
                    format!("noisy-{i}"),
                    native(|ctx| async move {
                        if ctx.attempt() <= FAILURES {
                            Err(TaskError::fail(format!("noise {}", ctx.attempt())))
                        } else {
                            Ok(b"quiet".to_vec())
                        }
                    }),
                )
                .with_backoff(BackoffPolicy::constant(ms(1))),
            )
        })
        .collect();
    gate_entered
        .recv_timeout(WASM_LIMIT)
        .expect("the gate's lane receives its first event");

    let ids: Vec<TaskId> = waiters.iter().map(TaskWaiter::id).collect();
    for w in waiters {
        let report = within(WASM_LIMIT, "noisy task", w.report()).await;
        assert_eq!(
            report.outcome,
            TaskOutcome::Completed {
                output: b"quiet".to_vec()
            }
        );
        assert_eq!(report.attempts, FAILURES + 1);
    }
    for id in ids {
        within(WASM_LIMIT, "gone", sup.gone(id)).await;
    }

    // The unread lane kept only the newest events and says how many it lost.
    match unread.recv().await {
        Some(Received::Dropped(n)) => {
            println!("the unread lane (capacity 2) dropped {n} events");
            assert!(n > 0);
        }
        other => panic!("expected a drop report first, got {other:?}"),
    }

    // The blocked subscriber reports its loss as an event once it reads on.
    let mut after = Recorder::new(&sup, WASM_LIMIT);
    release(&open);
    let overflow = after.until(|e| e.kind == K::SubscriberOverflow).await;
    let dropped = overflow.dropped.expect("an overflow says how many");
    println!("the blocked subscriber lane dropped {dropped} events");
    assert!(dropped > 0);
    assert!(
        overflow.reason.as_deref().unwrap_or("").contains("`gate`"),
        "{overflow:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_task_order_is_finished_then_outcome_then_removed() {
    const TASKS: usize = 20;
    let sup = Supervisor::default();
    let mut events = Recorder::new(&sup, WASM_LIMIT);
    let waiters: HashMap<TaskId, TaskWaiter> = (0..TASKS)
        .map(|i| {
            let name = format!("mixed-{i}");
            let spec = match i % 4 {
                0 => TaskSpec::once(name, returns(b"ok")),
                1 => TaskSpec::once(name, native(|_| async { Err(TaskError::fail("no")) })),
                2 => TaskSpec::restartable(
                    name,
                    native(|_| async { Err(TaskError::fatal("never")) }),
                ),
                _ => TaskSpec::restartable(
                    name,
                    native(|ctx| async move {
                        if ctx.attempt() == 1 {
                            Err(TaskError::fail("once"))
                        } else {
                            Ok(b"ok".to_vec())
                        }
                    }),
                )
                .with_backoff(BackoffPolicy::constant(ms(1))),
            };
            let w = sup.add(spec);
            (w.id(), w)
        })
        .collect();

    let mut removed = 0;
    events
        .until(|e| {
            if e.kind == K::TaskRemoved {
                let id = e.task_id.unwrap();
                assert!(
                    waiters[&id].try_outcome().is_some(),
                    "the outcome of task {id} is delivered before its TaskRemoved"
                );
                removed += 1;
            }
            removed == TASKS
        })
        .await;

    assert!(
        events.seen.windows(2).all(|w| w[0].seq < w[1].seq),
        "seq increases along a lane"
    );
    for (id, waiter) in &waiters {
        let of = events.of(*id);
        let finished: Vec<_> = of.iter().filter(|e| e.kind == K::TaskFinished).collect();
        assert_eq!(finished.len(), 1, "exactly one TaskFinished for {id}");
        let last = of.last().unwrap();
        assert_eq!(
            last.kind,
            K::TaskRemoved,
            "TaskRemoved is the last event of {id}"
        );
        assert!(finished[0].seq < last.seq);
        let outcome = waiter.try_outcome().unwrap();
        assert_eq!(finished[0].outcome, Some(outcome.kind()));
    }
}

/// A subscriber that panics on every TaskAdded.
struct Panicky;

impl Subscriber for Panicky {
    fn name(&self) -> &str {
        "panicky"
    }

    fn on_event(&mut self, event: &Event) {
        if event.kind == K::TaskAdded {
            panic!("the panicky subscriber fails on purpose");
        }
    }
}

/// A byte buffer shared between a subscriber and the test.
#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_subscriber_is_reported_and_stops_nobody() {
    let buf = SharedBuf::default();
    let sup = Supervisor::builder()
        .subscriber(Panicky)
        .subscriber(JsonLinesWriter::new(buf.clone()))
        .build();
    let mut events = Recorder::new(&sup, WASM_LIMIT);

    let first = sup.add(TaskSpec::once("first", returns(b"1")));
    assert_eq!(
        within(WASM_LIMIT, "first", first.wait()).await,
        TaskOutcome::Completed {
            output: b"1".to_vec()
        }
    );
    let panicked = events.until(|e| e.kind == K::SubscriberPanicked).await;
    assert!(
        panicked
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("`panicky`"),
        "{panicked:?}"
    );

    // The panicking lane carries on (it panics again), and so do the others.
    let second = sup.add(TaskSpec::once("second", returns(b"2")));
    let second_id = second.id();
    assert_eq!(
        within(WASM_LIMIT, "second", second.wait()).await,
        TaskOutcome::Completed {
            output: b"2".to_vec()
        }
    );
    events.until(|e| e.kind == K::SubscriberPanicked).await;
    events.until_removed(second_id).await;

    // Shutdown drains the subscriber lanes, so the writer has seen it all.
    assert_eq!(
        within(WASM_LIMIT, "shutdown", sup.shutdown(ms(100))).await,
        ShutdownReport::AllStopped
    );
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let seqs: Vec<u64> = lines.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let position = |pred: &dyn Fn(&serde_json::Value) -> bool| lines.iter().position(pred);
    let first_panic = position(&|v| v["kind"] == "SubscriberPanicked")
        .expect("the writer sees the SubscriberPanicked event");
    let second_removed =
        position(&|v| v["kind"] == "TaskRemoved" && v["task_id"] == second_id.get())
            .expect("the writer sees later events");
    assert!(first_panic < second_removed);
    assert_eq!(
        lines
            .iter()
            .filter(|v| v["kind"] == "SubscriberPanicked")
            .count(),
        2
    );
    assert!(
        position(&|v| v["kind"] == "AllStoppedWithinGrace").is_some(),
        "the writer is drained to the end"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_deep_lane_keeps_what_fits_and_tells_what_it_lost() {
    let sup = Supervisor::builder().bus_capacity(2).build();
    let mut shallow = sup.subscribe();
    let mut deep = sup.subscribe_deep(100);
    let note = |i: u64| Event::new(K::Progress).reason(format!("note {i}"));
    // Five times the bus's capacity, unread: the deep lane holds them all.
    for i in 0..10 {
        sup.publish(note(i));
    }
    for i in 0..10 {
        match deep.try_recv() {
            Some(Received::Event(e)) => assert_eq!(e.reason, Some(format!("note {i}"))),
            other => panic!("expected note {i}, got {other:?}"),
        }
    }
    assert!(deep.try_recv().is_none(), "the lane is empty");
    match shallow.recv().await {
        Some(Received::Dropped(n)) => assert_eq!(n, 8),
        other => panic!("the shallow lane should report a drop, got {other:?}"),
    }
    // Past its own capacity a deep lane keeps the oldest and says how many
    // newer ones it lost, before the next event it has room for.
    for i in 10..110 {
        sup.publish(note(i));
    }
    for i in 110..115 {
        sup.publish(note(i));
    }
    for i in 10..110 {
        match deep.recv().await {
            Some(Received::Event(e)) => assert_eq!(e.reason, Some(format!("note {i}"))),
            other => panic!("expected note {i}, got {other:?}"),
        }
    }
    sup.publish(note(115));
    match deep.recv().await {
        Some(Received::Dropped(n)) => assert_eq!(n, 5),
        other => panic!("expected a drop report, got {other:?}"),
    }
    match deep.recv().await {
        Some(Received::Event(e)) => assert_eq!(e.reason.as_deref(), Some("note 115")),
        other => panic!("expected note 115, got {other:?}"),
    }
    // A shut-down supervisor closes the lane once it is drained.
    sup.shutdown(std::time::Duration::ZERO).await;
    while let Some(received) = deep.recv().await {
        assert!(matches!(received, Received::Event(_)), "{received:?}");
    }
}

/// An observer sees every event as it is published, before `publish`
/// returns, in seq order, whatever the bus's capacity; one that panics is
/// removed and the others and the supervisor go on.
#[tokio::test(flavor = "current_thread")]
async fn an_observer_sees_each_event_as_it_is_published() {
    let sup = Supervisor::builder().bus_capacity(2).build();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    sup.observe(move |e| record.lock().unwrap().push((e.seq, e.reason.clone())));
    let calls = Arc::new(Mutex::new(0u32));
    let counted = Arc::clone(&calls);
    sup.observe(move |_| {
        *counted.lock().unwrap() += 1;
        panic!("an observer that panics");
    });
    for i in 0..10u64 {
        sup.publish(Event::new(K::Progress).reason(format!("note {i}")));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len() as u64, i + 1, "seen before publish returned");
        assert_eq!(
            seen.last().unwrap().1.as_deref(),
            Some(format!("note {i}").as_str())
        );
    }
    let seqs: Vec<u64> = seen.lock().unwrap().iter().map(|(seq, _)| *seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(
        *calls.lock().unwrap(),
        1,
        "the panicking observer was removed"
    );
    // The supervisor still runs tasks and reports them.
    let waiter = sup.add(TaskSpec::once("after", returns(b"done")));
    let report = within(WASM_LIMIT, "the task after", waiter.report()).await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"done".to_vec()
        }
    );
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().any(|(seq, _)| *seq > 10),
        "the task's events were observed too"
    );
}
