//! A node that loses its lease stops its work. Cut off from the database
//! (no answer, no error), it fences itself by its own clock, three
//! quarters of a lease after its last renewal: its attempt has ended
//! before another node may take the task over. Its lease taken by another
//! node, it stops its attempt at its next renewal. Either way it records
//! nothing for that work afterwards (the task ends once, by the node that
//! took it over) and serves again as a new node.

use std::time::Duration;

use taskhost_core::outcome::{OutcomeKind, TaskOutcome};
use taskhost_core::supervisor::{BackoffPolicy, Event, EventKind, RestartPolicy, TaskRef};
use taskhost_daemon::Client;
use taskhost_daemon::protocol::SubmitRequest;
use taskhost_runtime::Digest;

use crate::common::{
    Events, Line, Node, Partition, SHORT_LEASE, STEADY_LEASE, assert_no_overlap, attempts,
    final_report, now_ms, sleeper, upload,
};
use crate::postgres::Postgres;

/// Submits the restartable sleeper `long` (4 s) through `client`.
async fn submit_long(client: &Client, plugin: Digest) {
    let mut long = sleeper(plugin, "long", "long", 4_000);
    long.restart = Some(RestartPolicy::OnFailure);
    long.backoff = Some(BackoffPolicy::constant(Duration::from_millis(100)));
    client.submit(long).await.expect("admitted");
}

/// Whether `line` is the supervisor's event `kind` of task `long`.
fn long_event(line: &Line, kind: &str) -> bool {
    line.target == "taskhost::events"
        && line.field("kind") == Some(kind)
        && line.field("name") == Some("long")
}

/// The outcomes of `long`'s `TaskFinished` events the cluster kept, once
/// the one of its end has arrived.
async fn ends(events: &mut Events) -> Vec<OutcomeKind> {
    events
        .until("long's end", |e| e.kind == EventKind::TaskFinished)
        .await;
    events
        .seen
        .iter()
        .filter(|e| e.kind == EventKind::TaskFinished)
        .filter_map(|e: &Event| e.outcome)
        .collect()
}

/// Node `a` serves again (as a new node): a `hello` through it completes.
async fn serves_again(a: &Node) {
    a.logs
        .until("a joining the cluster again", |l| {
            l.text.contains("joined the cluster again")
        })
        .await;
    let client = a.client().await;
    let hello = upload(&client, "hello").await;
    let mut request = SubmitRequest::new(hello);
    request.input = b"back".to_vec();
    let submitted = client.submit(request).await.expect("admitted");
    let report = final_report(&client, TaskRef::Id(submitted.id)).await;
    assert_eq!(
        report.outcome,
        TaskOutcome::Completed {
            output: b"back".to_vec()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_database_stops_its_work_before_anyone_may_take_it() {
    let pg = Postgres::start();
    let partition = Partition::start(&pg);
    let a = Node::start(&partition.url(), "a", SHORT_LEASE).await;
    let ca = a.client().await;
    let plugin = upload(&ca, "sleeper").await;
    submit_long(&ca, plugin).await;
    a.logs
        .until("long's first attempt starting on a", |l| {
            long_event(l, "AttemptStarting")
        })
        .await;
    let b = Node::start(&pg.url(), "b", SHORT_LEASE).await;
    let cb = b.client().await;
    let mut events = Events::of(&cb, "long").await;

    // No answer from the database, no error either.
    partition.cut(true);
    let cut = now_ms();
    let fenced = a
        .logs
        .until("a fencing itself", |l| l.text.contains("lost its lease"))
        .await;
    assert!(fenced.text.contains("fenced itself"), "{fenced:?}");
    assert_eq!(fenced.field("orphaned"), Some("1"), "{fenced:?}");
    assert!(
        fenced.at_ms - cut < SHORT_LEASE.as_millis() as u64,
        "a fenced itself {} ms after the cut, past its {SHORT_LEASE:?} lease",
        fenced.at_ms - cut
    );
    // Its own supervisor ended the attempt...
    let stopped = a
        .logs
        .until("long's end on a", |l| long_event(l, "TaskFinished"))
        .await;
    // ...before b took the task over and started it again.
    let second = events
        .until("long's second attempt starting", |e| {
            e.kind == EventKind::AttemptStarting && e.attempt == Some(2)
        })
        .await;
    assert!(
        stopped.at_ms <= second.at_ms,
        "a's attempt ended at {} ms, after b's started at {} ms",
        stopped.at_ms,
        second.at_ms
    );
    partition.cut(false);

    let report = final_report(&cb, TaskRef::Name("long".into())).await;
    assert!(
        matches!(report.outcome, TaskOutcome::Completed { .. }),
        "{report:?}"
    );
    assert_eq!(report.attempts, 2, "{report:?}");
    let rows = attempts(&pg, "long");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].result, "interrupted", "{rows:?}");
    assert_eq!(rows[1].result, "completed", "{rows:?}");
    assert!(rows[1].started >= stopped.at_ms, "{rows:?}");
    assert_no_overlap("long", &rows);
    assert_eq!(ends(&mut events).await, [OutcomeKind::Completed]);
    serves_again(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_is_taken_stops_its_work_at_its_next_renewal() {
    let pg = Postgres::start();
    // A lease far longer than the test: a stops because its renewal finds
    // the lease gone, not by its own clock.
    let a = Node::start(&pg.url(), "a", STEADY_LEASE).await;
    let ca = a.client().await;
    let plugin = upload(&ca, "sleeper").await;
    submit_long(&ca, plugin).await;
    a.logs
        .until("long's first attempt starting on a", |l| {
            long_event(l, "AttemptStarting")
        })
        .await;
    let b = Node::start(&pg.url(), "b", STEADY_LEASE).await;
    let cb = b.client().await;
    let mut events = Events::of(&cb, "long").await;

    // As a takeover leaves it: a is dead to the cluster, and b's next
    // round settles its work.
    let taken = pg.psql("UPDATE taskhost_nodes SET alive = FALSE WHERE name = 'a' RETURNING id");
    assert!(!taken.trim().is_empty(), "a's row: {taken:?}");
    let lost = a
        .logs
        .until("a finding its lease gone", |l| {
            l.text.contains("lost its lease")
        })
        .await;
    assert!(
        lost.text
            .contains("another node took this node's work over"),
        "{lost:?}"
    );
    assert_eq!(lost.field("orphaned"), Some("1"), "{lost:?}");
    a.logs
        .until("long's end on a", |l| long_event(l, "TaskFinished"))
        .await;

    let report = final_report(&cb, TaskRef::Name("long".into())).await;
    assert!(
        matches!(report.outcome, TaskOutcome::Completed { .. }),
        "{report:?}"
    );
    assert_eq!(report.attempts, 2, "{report:?}");
    let rows = attempts(&pg, "long");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].result, "interrupted", "{rows:?}");
    assert_eq!(rows[1].result, "completed", "{rows:?}");
    assert_ne!(rows[0].node, rows[1].node, "{rows:?}");
    assert_no_overlap("long", &rows);
    assert_eq!(ends(&mut events).await, [OutcomeKind::Completed]);
    serves_again(&a).await;
}
