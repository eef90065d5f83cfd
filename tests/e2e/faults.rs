//! Faults: clients killed mid-stream, a client and a subscriber that stop
//! reading, and SIGTERM to the daemon with work in every state it can be
//! caught in (queued, running, waiting for a permit, backing off,
//! terminating after a replace, a cancel in flight). Every waiter resolves
//! (ShuttingDown, Canceled or ForceAborted), the socket is removed, and the
//! daemon exits with 0. (`admitting` lasts only while the controller holds
//! its lock, so no outside client can catch a task in it.)

use crate::{common, daemon, wire};

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use daemon::{Daemon, LIMIT, p};
use serde_json::Value;
use taskhost::daemon::protocol::{Placement, Request, SubmitRequest};
use taskhost::outcome::TaskOutcome;
use taskhost::supervisor::{
    Event, EventKind, Received, ShutdownReport, Subscriber, Supervisor, TaskSpec, native,
};

#[test]
fn clients_killed_mid_stream_cost_only_their_connection() {
    let mut d = Daemon::start(&[]);
    let id = d.submit(&[&p("deploy"), "--param", "env=k", "--param", "ms=600000"]);
    let (mut events, event_lines) = d.spawn_stdout_lines(&["events", "--follow"]);
    let (mut logs, log_lines) = d.spawn_stdout_lines(&["logs", &id, "--follow"]);
    event_lines
        .recv_timeout(LIMIT)
        .expect("events are streaming");
    let first = log_lines.recv_timeout(LIMIT).expect("logs are streaming");
    assert!(first.contains("deploying to k"), "{first}");

    // SIGKILL both in the middle of their streams, while events flow.
    events.kill().unwrap();
    logs.kill().unwrap();
    events.wait().unwrap();
    logs.wait().unwrap();
    for i in 0..5 {
        d.assert_served(&format!("after-kill-{i}"));
    }
    let out = d.run(&["cancel", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("canceled"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_event_stream_stalls_nobody() {
    let mut d = Daemon::start(&[]);
    // A follower that never reads: its socket buffer and reply queue fill,
    // then its lane drops events. It is never read and never closed here.
    let stuck = wire::connect(&d.socket).await;
    let _never_read = stuck
        .request(Request::Events {
            follow: true,
            filter: Default::default(),
        })
        .await
        .expect("a follower");
    let stuck_raw = {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        let hello = taskhost::daemon::protocol::encode(&taskhost::daemon::protocol::Hello {
            magic: taskhost::daemon::protocol::MAGIC,
            version: taskhost::daemon::protocol::PROTOCOL_VERSION,
        })
        .unwrap();
        let events = taskhost::daemon::protocol::encode(&taskhost::daemon::protocol::Envelope {
            id: 1,
            body: Request::Events {
                follow: true,
                filter: Default::default(),
            },
        })
        .unwrap();
        s.write_all(&hello).unwrap();
        s.write_all(&events).unwrap();
        s
    };

    // Meanwhile 500 submissions, with chatty guests, go through on time.
    let conn = wire::connect(&d.socket).await;
    let chatty = wire::upload_plugin(&conn, "chatty").await;
    let started = Instant::now();
    let mut waits = Vec::new();
    for i in 0..500 {
        let mut s = SubmitRequest::new(chatty);
        s.params = wire::params(&[("lines", "20")]);
        s.slot = Some(format!("c{}", i % 20));
        let submitted = conn.submit(s).await.expect("taken in");
        assert!(
            !matches!(submitted.placement, Placement::Rejected(_)),
            "{submitted:?}"
        );
        waits.push(submitted.id);
    }
    let waiter = wire::connect(&d.socket).await;
    for id in waits {
        let r = waiter.wait(id.into()).await.expect("a report");
        assert!(
            matches!(r.outcome, TaskOutcome::Completed { .. }),
            "{:?}",
            r.outcome
        );
    }
    let took = started.elapsed();
    eprintln!("500 chatty tasks past two stuck followers in {took:?}");
    assert!(took < LIMIT, "{took:?}");
    d.assert_served("past-stuck-followers");
    drop(stuck_raw);
}

/// A client that pipelines its waits and reads nothing until all are sent
/// gets every reply whole: replies queue behind a full socket (far more
/// than the daemon queues per connection), and each request's parts arrive
/// in order, frame by frame.
#[test]
fn a_client_that_reads_late_gets_every_reply_whole() {
    use std::io::{Read, Write};
    use taskhost::daemon::protocol::{
        Envelope, Hello, MAGIC, PROTOCOL_VERSION, Reply, Welcome, decode, encode,
    };
    use taskhost::supervisor::TaskRef;

    const WAITS: u32 = 12;
    const MIB: usize = 3;
    let d = Daemon::start(&[]);
    let id = d.submit(&[&p("output-huge"), "--param", &format!("mib={MIB}")]);
    let out = d.run(&["wait", &id, "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    fn read_frame(s: &mut std::os::unix::net::UnixStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).expect("a frame's length");
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).expect("a frame's body");
        body
    }
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
    };
    s.write_all(&encode(&hello).unwrap()).unwrap();
    let welcome: Welcome = decode(&read_frame(&mut s)).unwrap();
    assert_eq!(welcome.version, PROTOCOL_VERSION);
    for request in 1..=WAITS {
        let wait = Envelope {
            id: request,
            body: Request::Wait(TaskRef::parse(&id)),
        };
        s.write_all(&encode(&wait).unwrap()).unwrap();
    }

    let mut received = vec![0usize; WAITS as usize + 1];
    let mut reports = 0;
    while reports < WAITS {
        let reply: Envelope<Reply> = decode(&read_frame(&mut s)).expect("a whole frame");
        let got = &mut received[reply.id as usize];
        match reply.body {
            Reply::OutputPart(part) => {
                assert!(part.iter().all(|b| *b == b'x'), "request {}", reply.id);
                *got += part.len();
            }
            Reply::Report(report) => {
                let TaskOutcome::Completed { output } = report.outcome else {
                    panic!("request {}: {:?}", reply.id, report.outcome);
                };
                *got += output.len();
                assert_eq!(*got, MIB << 20, "request {}", reply.id);
                reports += 1;
            }
            other => panic!("request {}: {other:?}", reply.id),
        }
    }
}

/// A subscriber whose handler never returns.
struct Blocker(std::sync::mpsc::Receiver<()>);

impl Subscriber for Blocker {
    fn name(&self) -> &str {
        "blocker"
    }
    fn on_event(&mut self, _event: &Event) {
        // Blocks until the test ends (the sender is never used).
        let _ = self.0.recv();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_blocks_forever_stalls_no_task_lane_or_shutdown() {
    let (_keep, never) = channel();
    let drain = Duration::from_millis(300);
    let supervisor = Supervisor::builder()
        .drain_deadline(drain)
        .subscriber(Blocker(never))
        .build();
    let mut lane = supervisor.subscribe();
    let waiters: Vec<_> = (0..200)
        .map(|i| {
            supervisor.add(TaskSpec::once(
                format!("t{i}"),
                native(move |_ctx| async move { Ok(format!("{i}").into_bytes()) }),
            ))
        })
        .collect();
    for (i, w) in waiters.into_iter().enumerate() {
        let outcome = tokio::time::timeout(LIMIT, w.wait())
            .await
            .expect("on time");
        assert_eq!(
            outcome,
            TaskOutcome::Completed {
                output: i.to_string().into_bytes()
            }
        );
    }
    // Another lane sees every task finish, in spite of the blocked one.
    let mut finished = 0;
    while finished < 200 {
        match tokio::time::timeout(LIMIT, lane.recv())
            .await
            .expect("events flow")
        {
            Some(Received::Event(e)) if e.kind == EventKind::TaskFinished => finished += 1,
            Some(Received::Dropped(n)) => panic!("the healthy lane dropped {n} events"),
            Some(_) => {}
            None => panic!("the bus closed early"),
        }
    }
    // Shutdown returns once the blocked lane's drain deadline passes.
    let started = Instant::now();
    let report = supervisor.shutdown(Duration::from_secs(1)).await;
    assert_eq!(report, ShutdownReport::AllStopped);
    let took = started.elapsed();
    assert!(took >= drain, "it waited for the lane to drain: {took:?}");
    assert!(
        took < drain + Duration::from_secs(5),
        "and no longer: {took:?}"
    );
}

fn json(out: &common::Finished) -> Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "one JSON object, got {:?} ({e}); stderr {:?}",
            out.stdout, out.stderr
        )
    })
}

#[test]
fn sigterm_with_work_in_every_state_resolves_every_waiter() {
    // The memory store: a graceful stop gives every task its outcome now
    // (with the durable store the work waits for the next start instead;
    // tests/e2e/durability.rs).
    let mut d = Daemon::start(&[
        "--grace",
        "3s",
        "--max-concurrent",
        "4",
        "--store",
        "memory",
    ]);
    let baseline = d.socket_fds();
    let sleeper = p("sleeper");
    let spin = p("spin");
    let hello = p("hello");

    // Running, and queued behind it.
    let run = d.submit(&[
        &sleeper,
        "--param",
        "ms=600000",
        "--name",
        "run-1",
        "--slot",
        "a",
    ]);
    d.wait_until_state("run-1", "running");
    let queued = d.submit(&[&hello, "--slot", "a", "--name", "queued-1"]);
    // Backing off: 10 s between attempts.
    let backoff = d.submit(&[
        &p("flaky"),
        "--param",
        "fail_times=1000",
        "--restart",
        "on-failure",
        "--backoff",
        "10s,10s,1,none",
        "--name",
        "backoff-1",
    ]);
    d.wait_until_state("backoff-1", "backing-off");
    // Terminating: a spinner replaced by a newer submission; the new head
    // waits for the spinner, which ignores the stop until its grace ends.
    let spin1 = d.submit(&[&spin, "--name", "spin-1", "--slot", "t"]);
    d.wait_until_state("spin-1", "running");
    let replacer = d.submit(&[
        &hello, "--slot", "t", "--policy", "replace", "--name", "replacer",
    ]);
    d.wait_until_state("spin-1", "stopping");
    // A cancel in flight on another spinner.
    let spin2 = d.submit(&[&spin, "--name", "spin-2"]);
    d.wait_until_state("spin-2", "running");
    let canceling = d.spawn(&["cancel", &spin2]);
    d.wait_until_state("spin-2", "stopping");
    // The fourth permit, then one that waits for a permit.
    let extra = d.submit(&[&sleeper, "--param", "ms=600000", "--name", "extra-1"]);
    d.wait_until_state("extra-1", "running");
    let waiting = d.submit(&[&sleeper, "--param", "ms=600000", "--name", "waiting-1"]);
    d.wait_until_state("waiting-1", "waiting");
    let slots = d.run(&["slots", "--json"]);
    let slots: Vec<Value> = serde_json::from_str(&slots.stdout).unwrap();
    assert!(
        slots
            .iter()
            .any(|s| s["key"] == "t" && s["state"] == "terminating"),
        "{slots:?}"
    );

    // A waiter for each, connected before the signal.
    let expected = [
        (&run, "canceled", 4),
        (&queued, "rejected", 3),
        (&backoff, "canceled", 4),
        (&spin1, "force-aborted", 4),
        (&replacer, "rejected", 3),
        (&spin2, "force-aborted", 4),
        (&extra, "canceled", 4),
        (&waiting, "canceled", 4),
    ];
    let waiters: Vec<_> = expected
        .iter()
        .map(|(id, _, _)| d.spawn(&["wait", id, "--json"]))
        .collect();
    // Every waiter and the cancel hold an accepted connection.
    let clients = waiters.len() + 1;
    let deadline = Instant::now() + LIMIT;
    while d.socket_fds() != baseline + clients {
        assert!(Instant::now() < deadline, "the waiters never all connected");
        std::thread::sleep(Duration::from_millis(10));
    }

    let signaled = Instant::now();
    d.process.as_ref().unwrap().signal("TERM");
    let (status, out) = d.finish(LIMIT);
    let took = signaled.elapsed();
    assert_eq!(status.code(), Some(0), "{}", out.stderr);
    assert!(!d.socket.exists(), "the socket is removed");
    assert!(
        out.stderr
            .contains("force-aborted after the grace: spin-1, spin-2"),
        "{}",
        out.stderr
    );
    assert!(
        took < Duration::from_secs(10),
        "the grace bounds the shutdown: {took:?}"
    );

    for ((id, outcome, code), waiter) in expected.iter().zip(waiters) {
        let (_, waited) = waiter.finish(LIMIT);
        assert_eq!(waited.code, Some(*code), "{id}: {}", waited.stderr);
        let v = json(&waited);
        assert_eq!(v["outcome"], *outcome, "{id}: {v}");
        if *outcome == "rejected" {
            assert_eq!(v["rejection"], "ShuttingDown", "{id}: {v}");
        }
    }
    let (_, canceled) = canceling.finish(LIMIT);
    assert_eq!(
        canceled.code,
        Some(0),
        "the cancel made the claim: {}",
        canceled.stderr
    );
    assert!(
        canceled.stderr.contains("force-aborted"),
        "{}",
        canceled.stderr
    );
}
