//! Admission across nodes: the database decides each submission with the
//! controller's rules under the slot's row lock, whichever node takes it
//! and whichever path it takes there (a batch of the node's waiting
//! submissions, or a transaction of its own for one with an idempotency
//! key), so a slot has one owner at a time and Queue, Replace and
//! DropIfRunning decide as on one host.

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{EventKind, TaskId, TaskRef};
use taskhost_daemon::Client;
use taskhost_daemon::protocol::{Placement, Submitted};

use crate::common::{
    Events, Node, STEADY_LEASE, assert_no_overlap, attempts, final_report, sleeper, upload,
};
use crate::postgres::Postgres;

/// The rejection a placement says, if it is one.
fn rejection(placement: &Placement) -> Option<RejectionKind> {
    match placement {
        Placement::Rejected(TaskOutcome::Rejected { kind, .. }) => Some(*kind),
        _ => None,
    }
}

async fn wait(client: &Client, id: TaskId) -> TaskOutcome {
    final_report(client, TaskRef::Id(id)).await.outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_admitting_into_one_free_slot_make_one_owner_and_only_it_runs() {
    let pg = Postgres::start();
    let n1 = Node::start(&pg.url(), "n1", STEADY_LEASE).await;
    let n2 = Node::start(&pg.url(), "n2", STEADY_LEASE).await;
    let (c1, c2) = (n1.client().await, n2.client().await);
    let plugin = upload(&c1, "sleeper").await;
    upload(&c2, "sleeper").await;

    // Each round, both nodes admit a drop-if-running sleeper into one free
    // slot at once. Odd rounds send n1's with an idempotency key: it is
    // then decided in a transaction of its own, not in n1's batch.
    let mut owners = Vec::new();
    for round in 0..6 {
        let slot = format!("race-{round}");
        let mut requests = [("n1", &c1), ("n2", &c2)].map(|(node, client)| {
            let mut request = sleeper(plugin, &format!("{slot}-{node}"), &slot, 60_000);
            request.policy = Some(AdmissionPolicy::DropIfRunning);
            (request, client)
        });
        if round % 2 == 1 {
            requests[0].0.idempotency_key = Some(format!("key-{round}"));
        }
        let [(r1, via1), (r2, via2)] = requests;
        let (s1, s2) = tokio::join!(via1.submit(r1), via2.submit(r2));
        let placed: Vec<Submitted> = vec![s1.expect("n1 admits"), s2.expect("n2 admits")];
        let running: Vec<&Submitted> = placed
            .iter()
            .filter(|s| s.placement == Placement::Running)
            .collect();
        assert_eq!(running.len(), 1, "round {round}: one owner: {placed:?}");
        let refused: Vec<_> = placed
            .iter()
            .filter_map(|s| rejection(&s.placement))
            .collect();
        assert_eq!(
            refused,
            [RejectionKind::SlotBusy],
            "round {round}: the other found the slot busy: {placed:?}"
        );
        owners.push((slot, running[0].id, running[0].name.clone()));
    }

    // Each owner runs; the refused ones never do.
    for (slot, id, name) in &owners {
        let mut events = Events::of(&c2, name).await;
        events
            .until("its attempt starting", |e| {
                e.kind == EventKind::AttemptStarting && e.task_id == Some(*id)
            })
            .await;
        let rows = attempts(&pg, slot);
        assert_eq!(rows.len(), 1, "slot {slot}: one attempt: {rows:?}");
        assert_eq!(rows[0].task, id.get(), "slot {slot}: the owner's: {rows:?}");
    }
    let slots = c1.slots().await.expect("slots");
    for (slot, id, _) in &owners {
        let view = slots
            .iter()
            .find(|v| &v.key == slot)
            .unwrap_or_else(|| panic!("slot {slot} is listed: {slots:?}"));
        assert_eq!(view.owner, Some(*id), "{view:?}");
        assert_eq!(view.queue_depth, 0, "{view:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_replace_and_drop_if_running_decide_across_nodes_as_on_one_host() {
    let pg = Postgres::start();
    let bounded = |c: &mut taskhost_daemon::DaemonConfig| c.max_slot_queue = 2;
    let n1 = Node::start_with(&pg.url(), "n1", STEADY_LEASE, bounded).await;
    let n2 = Node::start_with(&pg.url(), "n2", STEADY_LEASE, bounded).await;
    let (c1, c2) = (n1.client().await, n2.client().await);
    let sleep = upload(&c1, "sleeper").await;
    upload(&c2, "sleeper").await;
    let hello = upload(&c1, "hello").await;
    upload(&c2, "hello").await;
    let say = |name: &str, input: &str| {
        let mut request = taskhost_daemon::protocol::SubmitRequest::new(hello);
        request.name = Some(name.to_owned());
        request.slot = Some("b".to_owned());
        request.input = input.as_bytes().to_vec();
        request
    };

    // Queue: submissions of one slot through both nodes run one after the
    // other, in the order they were accepted.
    let mut order = Vec::new();
    for (client, name) in [(&c1, "o1"), (&c2, "o2"), (&c1, "o3")] {
        let submitted = client
            .submit(sleeper(sleep, name, "order", 200))
            .await
            .expect("admitted");
        order.push(submitted.id);
    }
    for id in &order {
        let outcome = wait(&c2, *id).await;
        assert!(
            matches!(outcome, TaskOutcome::Completed { .. }),
            "{outcome:?}"
        );
    }
    let rows = attempts(&pg, "order");
    assert_no_overlap("order", &rows);
    let ran: Vec<u64> = rows.iter().map(|r| r.task).collect();
    let accepted: Vec<u64> = order.iter().map(|id| id.get()).collect();
    assert_eq!(ran, accepted, "the slot ran its work in the order accepted");

    // DropIfRunning: refused while the slot's owner runs, on another node.
    let owner = c1
        .submit(sleeper(sleep, "owner", "b", 60_000))
        .await
        .expect("admitted");
    assert_eq!(owner.placement, Placement::Running);
    let mut events = Events::of(&c2, "owner").await;
    events
        .until("the owner's attempt starting", |e| {
            e.kind == EventKind::AttemptStarting
        })
        .await;
    let mut busy = say("busy", "no");
    busy.policy = Some(AdmissionPolicy::DropIfRunning);
    let busy = c2.submit(busy).await.expect("decided");
    assert_eq!(rejection(&busy.placement), Some(RejectionKind::SlotBusy));

    // Queue behind it, up to the slot's bound.
    let queued = c2.submit(say("queued", "q")).await.expect("admitted");
    assert_eq!(
        queued.placement,
        Placement::Queued {
            owner: Some(owner.id)
        }
    );
    let behind = c1.submit(say("behind", "later")).await.expect("admitted");
    assert!(
        matches!(behind.placement, Placement::Queued { .. }),
        "{behind:?}"
    );
    let full = c2.submit(say("full", "no")).await.expect("decided");
    assert_eq!(rejection(&full.placement), Some(RejectionKind::QueueFull));

    // Replace: the head it displaces ends SupersededByReplace, the owner
    // (running on whichever node) is stopped, and it runs next; the rest
    // of the queue after it.
    let mut replace = say("replacement", "new");
    replace.policy = Some(AdmissionPolicy::Replace);
    let replacement = c2.submit(replace).await.expect("admitted");
    assert!(
        matches!(&replacement.placement, Placement::Replacing { owner: o, .. } if *o == owner.id),
        "{replacement:?}"
    );
    let displaced = wait(&c1, queued.id).await;
    assert!(
        matches!(
            &displaced,
            TaskOutcome::Rejected {
                kind: RejectionKind::SupersededByReplace,
                ..
            }
        ),
        "{displaced:?}"
    );
    assert_eq!(wait(&c1, owner.id).await, TaskOutcome::Canceled);
    assert_eq!(
        wait(&c1, replacement.id).await,
        TaskOutcome::Completed {
            output: b"new".to_vec()
        }
    );
    assert_eq!(
        wait(&c2, behind.id).await,
        TaskOutcome::Completed {
            output: b"later".to_vec()
        }
    );
    let rows = attempts(&pg, "b");
    assert_no_overlap("b", &rows);
    let ran: Vec<u64> = rows.iter().map(|r| r.task).collect();
    assert_eq!(
        ran,
        [owner.id.get(), replacement.id.get(), behind.id.get()],
        "the owner, the replacement, then the rest of the queue: {rows:?}"
    );
}
