//! A crash soak of the durable store: rounds of a mixed workload (instant
//! tasks, sleepers queued in shared slots, restartable failures, replaced
//! owners) submitted through pipelined clients, each round ended by
//! SIGKILL of the daemon at a random moment and a restart on the same state
//! directory. Then the invariants, over every id a client saw acknowledged:
//!
//! - it ends with exactly one outcome: `wait` answers it after the last
//!   restart, and an outcome a client saw before a crash never changes;
//! - no acknowledged submission vanished (`wait` never says "no task");
//! - ids only grow: every round's ids are above every earlier round's;
//! - no slot ever had two owners: in each daemon's event stream (followed
//!   from its start until its kill), no attempt of a task starts in a slot
//!   while another task that started there has not been removed.
//!
//! A handful of kills by default; `TASKHOST_CRASH_KILLS=50` for the long
//! mode. The kill moments come from a seeded generator (the seed is printed,
//! `TASKHOST_CRASH_SEED` replays one).

use crate::{daemon, wire};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daemon::Daemon;
use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::protocol::{Placement, Reply, Request, SubmitRequest};
use taskhost::outcome::TaskOutcome;
use taskhost::supervisor::{Event, EventKind, RestartPolicy, TaskId, TaskRef};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_work_survives_random_kills() {
    let kills = env_u64("TASKHOST_CRASH_KILLS", 5);
    let seed = env_u64("TASKHOST_CRASH_SEED", fastrand::u64(..));
    println!("crash soak: {kills} kills, seed {seed} (TASKHOST_CRASH_SEED replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);

    let mut d = Daemon::start(&["--max-slot-queue", "1000"]);
    // Every acknowledged id, and the outcome a client saw for it (if any).
    let seen: Arc<Mutex<BTreeMap<TaskId, Option<TaskOutcome>>>> = Arc::default();
    let mut highest_before = 0u64;
    let mut attempts_checked = 0;

    for round in 0..kills {
        let owners = wire::follow_events(&d.socket).await;
        let client = wire::connect(&d.socket).await;
        let hello = wire::upload_plugin(&client, "hello").await;
        let sleeper = wire::upload_plugin(&client, "sleeper").await;
        let flaky = wire::upload_plugin(&client, "flaky").await;

        // The workload: pipelined, replies collected as they come.
        let mut pending = Vec::new();
        for i in 0..40u32 {
            let mut request = match i % 4 {
                0 => {
                    let mut r = SubmitRequest::new(hello);
                    r.input = format!("r{round}-{i}").into_bytes();
                    r
                }
                1 => {
                    let mut r = SubmitRequest::new(sleeper);
                    r.slot = Some(format!("shared-{}", i % 3));
                    r.policy = Some(AdmissionPolicy::Queue);
                    r.params = wire::params(&[("ms", &rng.u32(0..150).to_string())]);
                    r
                }
                2 => {
                    let mut r = SubmitRequest::new(flaky);
                    r.restart = Some(RestartPolicy::OnFailure);
                    r.backoff = Some("5ms,20ms,2,none".parse().unwrap());
                    r.params = wire::params(&[("fail_times", "1")]);
                    r
                }
                _ => {
                    let mut r = SubmitRequest::new(sleeper);
                    r.slot = Some("replaced".into());
                    r.policy = Some(AdmissionPolicy::Replace);
                    r.params = wire::params(&[("ms", "100")]);
                    r
                }
            };
            request.name = Some(format!("r{round}-t{i}"));
            pending.push(
                client
                    .request(Request::Submit(Box::new(request)))
                    .await
                    .expect("send"),
            );
        }
        // Replies and waits run on their own while the kill comes.
        let collector = {
            let seen = Arc::clone(&seen);
            let client = client.clone();
            tokio::spawn(async move {
                for mut replies in pending {
                    let Ok(Reply::Submitted(submitted)) = replies.next_reply().await else {
                        // The daemon died first: not acknowledged.
                        return;
                    };
                    let outcome = match submitted.placement {
                        Placement::Rejected(outcome) => Some(outcome),
                        _ => None,
                    };
                    seen.lock().unwrap().insert(submitted.id, outcome);
                    let seen = Arc::clone(&seen);
                    let client = client.clone();
                    tokio::spawn(async move {
                        if let Ok(report) = client.wait(TaskRef::Id(submitted.id)).await {
                            record(&seen, submitted.id, report.outcome);
                        }
                    });
                }
            })
        };
        // The kill comes at a random moment of the round.
        tokio::time::sleep(Duration::from_millis(rng.u64(0..250))).await;
        let mut process = d.process.take().expect("running");
        process.child.kill().expect("SIGKILL");
        let _ = process.child.wait();
        let _ = collector.await;
        let events = owners.await.expect("the event follower");
        attempts_checked += check_one_owner_per_slot(round, &events);

        // Ids only grow: this round's are above every earlier one's.
        {
            let seen = seen.lock().unwrap();
            let this_round: Vec<u64> = seen
                .keys()
                .map(|id| id.get())
                .filter(|&id| id > highest_before)
                .collect();
            if let Some(&max) = this_round.iter().max() {
                highest_before = max;
            }
        }
        d.restart(&["--max-slot-queue", "1000"]);
        let client = wire::connect(&d.socket).await;
        let probe = wire::upload_plugin(&client, "hello").await;
        let Reply::Submitted(fresh) = wire::call(
            &client,
            Request::Submit(Box::new(SubmitRequest::new(probe))),
        )
        .await
        else {
            panic!("the restarted daemon takes work");
        };
        assert!(
            fresh.id.get() > highest_before,
            "round {round}: id {} after a restart is not above {highest_before}",
            fresh.id
        );
        highest_before = fresh.id.get();
        seen.lock().unwrap().insert(fresh.id, None);
    }

    // Every acknowledged id ends with exactly one outcome.
    let client = wire::connect(&d.socket).await;
    let ids: Vec<(TaskId, Option<TaskOutcome>)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, o)| (*id, o.clone()))
        .collect();
    assert!(!ids.is_empty());
    for (id, before) in &ids {
        let report = tokio::time::timeout(Duration::from_secs(120), client.wait(TaskRef::Id(*id)))
            .await
            .unwrap_or_else(|_| panic!("task {id} never ended"))
            .unwrap_or_else(|e| panic!("acknowledged task {id} vanished: {e}"));
        if let Some(before) = before {
            assert_eq!(
                &report.outcome, before,
                "task {id} changed its outcome across a crash"
            );
        }
        let again = client.wait(TaskRef::Id(*id)).await.expect("wait again");
        assert_eq!(again.outcome, report.outcome, "task {id} has one outcome");
    }
    println!(
        "crash soak: {} acknowledged tasks checked; {attempts_checked} attempt starts checked for a second owner",
        ids.len()
    );
    assert!(
        attempts_checked > 0,
        "the event followers saw attempts start"
    );
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// In event order: an attempt of a task may start in a slot only when no
/// other task that started there is still there (not yet removed, which
/// comes after its instance is gone).
fn check_one_owner_per_slot(round: u64, events: &[Event]) -> usize {
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| e.seq);
    let mut owners: BTreeMap<String, TaskId> = BTreeMap::new();
    let mut starts = 0;
    for event in events {
        let (Some(id), Some(slot)) = (event.task_id, event.slot.as_deref()) else {
            continue;
        };
        match event.kind {
            EventKind::AttemptStarting => {
                starts += 1;
                if let Some(owner) = owners.insert(slot.to_owned(), id) {
                    assert_eq!(
                        owner, id,
                        "round {round}: task {id} started in slot {slot} while task {owner} still owned it"
                    );
                }
            }
            EventKind::TaskRemoved if owners.get(slot) == Some(&id) => {
                owners.remove(slot);
            }
            _ => {}
        }
    }
    starts
}

fn record(seen: &Mutex<BTreeMap<TaskId, Option<TaskOutcome>>>, id: TaskId, outcome: TaskOutcome) {
    let mut seen = seen.lock().unwrap();
    let slot = seen.entry(id).or_insert(None);
    if let Some(earlier) = slot {
        assert_eq!(earlier, &outcome, "task {id} reported two outcomes");
    }
    *slot = Some(outcome);
}
