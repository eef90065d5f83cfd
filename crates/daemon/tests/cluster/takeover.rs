//! A node that dies without leaving (its runtime dropped mid-run, as a
//! SIGKILL leaves a process: no retirement, no handover) loses its running
//! work to another node once its lease runs out; recovery's `fate` decides
//! each interrupted attempt there.

use std::time::{Duration, Instant};

use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::{BackoffPolicy, EventKind, RestartPolicy, TaskRef};

use crate::common::{
    Events, Node, SHORT_LEASE, assert_no_overlap, attempts, final_report, sleeper, upload,
};
use crate::postgres::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_dies_without_leaving_has_its_running_work_taken_over() {
    let pg = Postgres::start();
    let mut a = Node::start(&pg.url(), "a", SHORT_LEASE).await;
    let ca = a.client().await;
    let plugin = upload(&ca, "sleeper").await;
    // Run once: it must not run twice.
    let once = ca
        .submit(sleeper(plugin, "once", "once", 60_000))
        .await
        .expect("admitted");
    // Restartable: it runs again elsewhere.
    let mut again = sleeper(plugin, "again", "again", 1_500);
    again.restart = Some(RestartPolicy::OnFailure);
    again.backoff = Some(BackoffPolicy::constant(Duration::from_millis(100)));
    let again = ca.submit(again).await.expect("admitted");
    for name in ["once", "again"] {
        a.logs
            .until(&format!("{name}'s first attempt starting on a"), |l| {
                l.field("kind") == Some("AttemptStarting") && l.field("name") == Some(name)
            })
            .await;
    }
    let b = Node::start(&pg.url(), "b", SHORT_LEASE).await;
    let cb = b.client().await;
    let mut events = Events::of(&cb, "once").await;

    drop(ca);
    let killed = Instant::now();
    a.kill();

    // After a's lease, the run-once task ends Failed, interrupted.
    let report = final_report(&cb, TaskRef::Id(once.id)).await;
    let took = killed.elapsed();
    assert!(
        matches!(&report.outcome, TaskOutcome::Failed { reason, .. } if reason.contains("interrupted")),
        "{report:?}"
    );
    assert!(
        took < SHORT_LEASE + Duration::from_secs(10),
        "taken over {took:?} after the kill (lease {SHORT_LEASE:?})"
    );
    let recovered = events
        .until("b telling of the takeover", |e| {
            e.kind == EventKind::Recovered
        })
        .await;
    assert!(
        recovered
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("taken over from a stopped node")),
        "{recovered:?}"
    );

    // The restartable one runs again, on b, and completes.
    let report = final_report(&cb, TaskRef::Id(again.id)).await;
    assert!(
        matches!(report.outcome, TaskOutcome::Completed { .. }),
        "{report:?}"
    );
    assert_eq!(report.attempts, 2, "{report:?}");
    let rows = attempts(&pg, "again");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].result, "interrupted", "{rows:?}");
    assert_eq!(rows[1].result, "completed", "{rows:?}");
    assert_ne!(
        rows[0].node, rows[1].node,
        "the second attempt ran on another node: {rows:?}"
    );
    assert_no_overlap("again", &rows);
}
