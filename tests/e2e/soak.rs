//! A soak of the real daemon over its socket (loopback only: a Unix socket
//! in a temporary directory): thousands of mixed submissions (hello,
//! sleeper, flaky, deploy) with random policies, random cancels and
//! replaces over about 60 slots, from 8 pipelined clients, while one
//! `Events { follow: true }` stream records everything. Then an invariant
//! checker over the recorded stream and the replies:
//!
//! - one owner per slot at every moment: an owner holds its slot from its
//!   `TaskAdded` to its `TaskRemoved`, and no `TaskAdded` on a slot comes
//!   while another owner holds it (so physical completion comes before the
//!   slot's reuse);
//! - exactly one final outcome per submission (`ControllerRejected`,
//!   `TaskAddFailed` or `TaskFinished`), matching its `Wait` reply or its
//!   rejection at intake;
//! - after the drain, an empty `Slots` reply and an empty `List`.
//!
//! Bounded: 4,000 submissions by default, failing after 90 s.
//! `TASKHOST_SOAK=N` runs N submissions instead (the time bound scales).

use crate::{daemon, wire};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskhost::controller::AdmissionPolicy;
use taskhost::daemon::Replies;
use taskhost::daemon::protocol::{Placement, Reply, Request, SubmitRequest};
use taskhost::outcome::TaskOutcome;
use taskhost::runtime::Digest;
use taskhost::supervisor::{BackoffPolicy, Event, EventKind, Jitter, RestartPolicy, TaskId};
use tokio::sync::mpsc;
use wire::params;

const CLIENTS: usize = 8;
/// Waits a client keeps in flight (a connection may have 64 requests).
const MAX_WAITS: usize = 40;

/// A small xorshift generator: the soak is random but reproducible from
/// its printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The final outcome of a submission as its client saw it.
#[derive(Debug)]
struct Seen {
    id: TaskId,
    outcome: TaskOutcome,
}

struct Digests {
    hello: Digest,
    sleeper: Digest,
    flaky: Digest,
    deploy: Digest,
}

fn random_request(rng: &mut Rng, d: &Digests) -> SubmitRequest {
    let policy = match rng.below(100) {
        0..60 => AdmissionPolicy::Queue,
        60..85 => AdmissionPolicy::Replace,
        _ => AdmissionPolicy::DropIfRunning,
    };
    let slot = format!("s{}", rng.below(50));
    let mut s = match rng.below(4) {
        0 => {
            let mut s = SubmitRequest::new(d.hello);
            s.input = format!("hi {}", rng.below(1000)).into_bytes();
            s.slot = Some(slot);
            s
        }
        1 => {
            let mut s = SubmitRequest::new(d.sleeper);
            s.params = params(&[("ms", &(1 + rng.below(50)).to_string())]);
            s.slot = Some(slot);
            s
        }
        2 => {
            let mut s = SubmitRequest::new(d.flaky);
            s.params = params(&[("fail_times", &rng.below(3).to_string())]);
            s.restart = Some(RestartPolicy::OnFailure);
            s.max_retries = Some(rng.below(3) as u32);
            s.backoff = Some(
                BackoffPolicy::new(
                    Duration::from_millis(1 + rng.below(10)),
                    Duration::from_millis(50),
                    2.0,
                    Jitter::None,
                )
                .unwrap(),
            );
            s.slot = Some(slot);
            s
        }
        _ => {
            // The slot comes from the plugin's resource template.
            let mut s = SubmitRequest::new(d.deploy);
            let env = format!("e{}", rng.below(10));
            s.params = params(&[("env", &env), ("ms", &(1 + rng.below(30)).to_string())]);
            s
        }
    };
    s.policy = Some(policy);
    s
}

/// One client: submits its share, cancels some at random, waits for every
/// accepted submission; returns what it saw.
async fn client(
    socket: std::path::PathBuf,
    digests: Arc<Digests>,
    seed: u64,
    count: usize,
) -> Vec<Seen> {
    let conn = wire::connect(&socket).await;
    let mut rng = Rng(seed);
    let mut seen = Vec::new();
    let mut waits: std::collections::VecDeque<(TaskId, Replies)> = Default::default();
    let mut mine: Vec<TaskId> = Vec::new();
    for _ in 0..count {
        let request = random_request(&mut rng, &digests);
        let submitted = conn
            .submit(request)
            .await
            .unwrap_or_else(|e| panic!("a submission was not taken in: {e}"));
        let id = submitted.id;
        mine.push(id);
        match submitted.placement {
            Placement::Rejected(outcome) => seen.push(Seen { id, outcome }),
            _ => waits.push_back((
                id,
                conn.request(Request::Wait(id.into()))
                    .await
                    .expect("a wait"),
            )),
        }
        if rng.chance(10) {
            let victim = mine[rng.below(mine.len() as u64) as usize];
            let _ = wire::call(
                &conn,
                Request::Cancel {
                    target: victim.into(),
                    wait: false,
                },
            )
            .await;
        }
        while waits.len() >= MAX_WAITS {
            let (id, rx) = waits.pop_front().unwrap();
            seen.push(Seen {
                id,
                outcome: report(id, rx).await,
            });
        }
    }
    for (id, rx) in waits {
        seen.push(Seen {
            id,
            outcome: report(id, rx).await,
        });
    }
    seen
}

async fn report(id: TaskId, mut rx: Replies) -> TaskOutcome {
    match rx.next().await {
        Some(Reply::Report(r)) => {
            assert_eq!(r.id, id);
            r.outcome
        }
        other => panic!("no report for {id}: {other:?}"),
    }
}

/// The invariant checker over the recorded stream.
fn check(events: &[Event], seen: &[Seen]) -> HashMap<&'static str, usize> {
    let mut owner: HashMap<String, TaskId> = HashMap::new();
    let mut finals: HashMap<TaskId, Vec<String>> = HashMap::new();
    let mut added: HashSet<TaskId> = HashSet::new();
    let mut removed: HashSet<TaskId> = HashSet::new();
    let mut last_seq = 0;
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    for e in events {
        assert!(
            e.seq > last_seq,
            "seqs increase: {} after {last_seq}",
            e.seq
        );
        last_seq = e.seq;
        let kind = e.kind;
        if !matches!(
            kind,
            EventKind::TaskAdded
                | EventKind::TaskRemoved
                | EventKind::TaskFinished
                | EventKind::TaskAddFailed
                | EventKind::ControllerRejected
        ) {
            continue;
        }
        let id = e.task_id.expect("a task event has a task id");
        let slot = e
            .slot
            .as_deref()
            .expect("a task event has a slot")
            .to_owned();
        match kind {
            EventKind::TaskAdded => {
                if let Some(other) = owner.get(&slot) {
                    panic!(
                        "two owners: task {id} added to slot `{slot}` (seq {}) while task {other} \
                         still holds it",
                        e.seq
                    );
                }
                owner.insert(slot, id);
                assert!(added.insert(id), "task {id} added twice");
                *counts.entry("added").or_default() += 1;
            }
            EventKind::TaskRemoved => {
                assert_eq!(
                    owner.remove(&slot),
                    Some(id),
                    "task {id} removed from slot `{slot}` it did not own (seq {})",
                    e.seq
                );
                assert!(
                    finals.contains_key(&id),
                    "task {id} removed before its outcome"
                );
                removed.insert(id);
            }
            _ => {
                let outcome = e.outcome.map_or("?", |o| o.as_str()).to_owned();
                let label = match e.rejection {
                    Some(r) => format!("{outcome}:{r}"),
                    None => outcome,
                };
                finals.entry(id).or_default().push(label);
                if kind == EventKind::TaskFinished {
                    assert!(
                        added.contains(&id),
                        "task {id} finished without being added"
                    );
                }
            }
        }
    }
    assert!(owner.is_empty(), "slots still owned at the end: {owner:?}");
    assert_eq!(added, removed, "every added task was removed");
    let submitted: HashSet<TaskId> = seen.iter().map(|s| s.id).collect();
    assert_eq!(submitted.len(), seen.len(), "one reply per submission");
    for s in seen {
        let labels = finals
            .get(&s.id)
            .unwrap_or_else(|| panic!("submission {} has no final event", s.id));
        assert_eq!(
            labels.len(),
            1,
            "submission {} has {} final events: {labels:?}",
            s.id,
            labels.len()
        );
        let expected = match &s.outcome {
            TaskOutcome::Rejected { kind, .. } => format!("rejected:{kind}"),
            other => other.kind().as_str().to_owned(),
        };
        assert_eq!(labels[0], expected, "submission {}: event vs reply", s.id);
        *counts.entry(outcome_label(&s.outcome)).or_default() += 1;
    }
    assert_eq!(
        finals.len(),
        seen.len(),
        "final events only for submissions"
    );
    counts
}

fn outcome_label(o: &TaskOutcome) -> &'static str {
    match o {
        TaskOutcome::Rejected { kind, .. } => match kind.to_string().as_str() {
            "SlotBusy" => "rejected SlotBusy",
            "QueueFull" => "rejected QueueFull",
            "SupersededByReplace" => "rejected SupersededByReplace",
            "RemovedFromQueue" => "rejected RemovedFromQueue",
            _ => "rejected (other)",
        },
        other => other.kind().as_str(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mixed_submissions_keep_every_invariant() {
    let total: usize = std::env::var("TASKHOST_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    let limit = Duration::from_secs(90).max(Duration::from_millis(45 * total as u64));
    let seed = std::env::var("TASKHOST_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("soak: {total} submissions, seed {seed} (TASKHOST_SOAK_SEED={seed} repeats it)");
    // The event lanes are sized so that the recorder cannot fall behind by
    // more than the whole soak: the checker needs every event (a daemon
    // with the default 4,096 may drop under this load, as documented).
    let config = tempfile::tempdir().unwrap();
    let config_file = config.path().join("host.toml");
    let capacity = (total * 16).clamp(1 << 16, 1 << 22);
    std::fs::write(&config_file, format!("event_lane_capacity = {capacity}\n")).unwrap();
    let mut d =
        daemon::Daemon::start(&["--grace", "2s", "--config", config_file.to_str().unwrap()]);
    let started = Instant::now();
    let run = async {
        let setup = wire::connect(&d.socket).await;
        let digests = Arc::new(Digests {
            hello: wire::upload_plugin(&setup, "hello").await,
            sleeper: wire::upload_plugin(&setup, "sleeper").await,
            flaky: wire::upload_plugin(&setup, "flaky").await,
            deploy: wire::upload_plugin(&setup, "deploy").await,
        });

        // The recorder: every event from before the first submission on.
        let recorder = wire::connect(&d.socket).await;
        let mut stream = recorder
            .request(Request::Events {
                follow: true,
                filter: Default::default(),
            })
            .await
            .expect("the event stream");
        let (marks, mut marked) = mpsc::unbounded_channel::<()>();
        let recording = tokio::spawn(async move {
            let mut events = Vec::new();
            let mut dropped = 0;
            let mut first = true;
            while let Some(reply) = stream.next().await {
                match reply {
                    Reply::Event(e) => events.push(e),
                    Reply::Dropped(n) => dropped += n,
                    Reply::End => break,
                    other => panic!("unexpected reply on the event stream: {other:?}"),
                }
                if first {
                    first = false;
                    let _ = marks.send(());
                }
            }
            (events, dropped)
        });
        // Something to see: the stream is live before the soak starts.
        let mut probe = SubmitRequest::new(digests.hello);
        probe.slot = Some("probe".into());
        let probe_id = setup.submit(probe).await.expect("the probe is taken in").id;
        marked.recv().await.expect("the event stream is live");

        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let share = total / CLIENTS + usize::from(i < total % CLIENTS);
                tokio::spawn(client(
                    d.socket.clone(),
                    Arc::clone(&digests),
                    seed.wrapping_mul(i as u64 + 1) | 1,
                    share,
                ))
            })
            .collect();
        let probed = setup
            .wait(probe_id.into())
            .await
            .expect("the probe has a report");
        let mut seen = vec![Seen {
            id: probe_id,
            outcome: probed.outcome,
        }];
        for c in clients {
            seen.extend(c.await.expect("a client finished"));
        }
        assert_eq!(seen.len(), total + 1);

        // The drain: no slot and no task left.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let slots = setup.slots().await.expect("slots");
            let tasks = setup.list(false).await.expect("ps");
            if slots.is_empty() && tasks.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "leaked after the drain: {slots:?} {tasks:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let drained_in = started.elapsed();

        // Shut down so the stream ends with everything in it.
        let done = wire::call(
            &setup,
            Request::Shutdown {
                grace: Some(Duration::from_secs(1)),
                cancel_all: true,
            },
        )
        .await;
        assert_eq!(
            done,
            Reply::ShutdownDone(taskhost::supervisor::ShutdownReport::AllStopped)
        );
        let (events, dropped) = recording.await.unwrap();
        assert_eq!(
            dropped, 0,
            "the event stream dropped {dropped} events, so the invariants cannot be checked"
        );
        (seen, events, drained_in)
    };
    let (seen, events, drained_in) = tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("the soak took longer than {limit:?}"));
    let counts = check(&events, &seen);
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    eprintln!(
        "soak: {} submissions drained in {:.1}s, {} events checked; invariants hold; {counts:?}",
        seen.len(),
        drained_in.as_secs_f64(),
        events.len()
    );
    let (status, out) = d.finish(daemon::LIMIT);
    assert_eq!(status.code(), Some(0), "{}", out.stderr);
}
