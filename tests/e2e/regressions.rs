//! One test per defect found by trying the host as a user and as a reviewer
//! would. Each failed on the code before its fix. The supervisor's
//! own regressions (duplicate ids, the shutdown "stuck" list) live with the
//! supervisor tests in `tests/supervisor/identity.rs` and `shutdown.rs`.

use crate::{common, daemon, wire};

use daemon::{Daemon, LIMIT, p};
use serde_json::Value;
use taskhost::daemon::protocol::{ErrorKind, Placement, Reply, Request, SubmitRequest, Submitted};
use taskhost::outcome::TaskOutcome;
use taskhost::runtime::Digest;
use taskhost::supervisor::TaskRef;

fn hex(digest: &Digest) -> String {
    digest.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// Defect 1: a task output larger than a frame (4 MiB) used to be dropped by
/// the daemon ("a reply could not be encoded") and the client waited
/// forever. Now it arrives in parts, for `submit --wait` and for `wait`.
#[test]
fn an_output_larger_than_a_frame_reaches_submit_wait_and_wait() {
    let d = Daemon::start(&[]);
    let out = d.run(&[
        "submit",
        &p("output-huge"),
        "--param",
        "mib=5",
        "--name",
        "big",
        "--wait",
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout.len(), 5 << 20, "all 5 MiB of output arrive");
    assert!(out.stdout.bytes().all(|b| b == b'x'));

    let out = d.run(&["wait", "big"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout.len(), 5 << 20);
}

/// Defect 1, the list side: more tasks than one page (1,000 rows) of
/// `ps` used to make one reply too large to encode; now `ps` pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_lists_more_tasks_than_one_page() {
    const TASKS: usize = 1_500;
    let d = Daemon::start(&["--max-slot-queue", "5000"]);
    let client = wire::connect(&d.socket).await;
    let sleeper = wire::upload_plugin(&client, "sleeper").await;
    let mut pending = Vec::new();
    for i in 0..TASKS {
        let mut request = SubmitRequest::new(sleeper);
        request.name = Some(format!("t{i}-{}", "n".repeat(200)));
        request.slot = Some("one".into());
        request.policy = Some(taskhost::controller::AdmissionPolicy::Queue);
        request.params = wire::params(&[("ms", "600000")]);
        pending.push(
            client
                .request(Request::Submit(Box::new(request)))
                .await
                .expect("send"),
        );
    }
    for mut replies in pending {
        let reply = replies.next_reply().await.expect("a reply");
        assert!(matches!(reply, Reply::Submitted(_)), "{reply:?}");
    }
    let rows = client.list(false).await.expect("list");
    assert_eq!(rows.len(), TASKS);
    let out = tokio::task::spawn_blocking(move || {
        let out = d.run(&["ps", "--json"]);
        drop(d);
        out
    })
    .await
    .unwrap();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(json(&out.stdout).as_array().map(Vec::len), Some(TASKS));
}

/// Defect 2: a submission rejected because its name was taken used to
/// become what the name resolved to, so `cancel`, `remove` and `wait` of
/// the name acted on the rejected submission and the running task could no
/// longer be stopped by name.
#[test]
fn a_rejected_duplicate_does_not_steal_the_name() {
    let d = Daemon::start(&[]);
    let id = d.submit(&[&p("sleeper"), "--name", "dup", "--param", "ms=600000"]);
    d.wait_until_state("dup", "running");

    let out = d.run(&["submit", &p("hello"), "--name", "dup", "--slot", "other"]);
    assert_eq!(
        out.code,
        Some(3),
        "the duplicate is rejected: {}",
        out.stderr
    );
    assert!(out.stderr.contains("already"), "{}", out.stderr);

    // The name still names the running sleeper.
    let rows = d.ps();
    let row = rows.iter().find(|r| r["name"] == "dup").expect("dup in ps");
    assert_eq!(row["id"].to_string(), id);
    let out = d.run(&["cancel", "dup", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v = json(&out.stdout);
    assert_eq!(v["claimed"], true);
    assert_eq!(v["report"]["id"].to_string(), id);
    assert_eq!(v["report"]["outcome"], "canceled");

    let out = d.run(&["wait", "dup", "--json"]);
    assert_eq!(json(&out.stdout)["id"].to_string(), id, "{}", out.stderr);
}

/// Defect 4: every request used to run in its own spawned task, so
/// pipelined upload chunks overtook each other ("out of order"), and a Wait
/// pipelined behind its Submit could miss the task. Requests of one
/// connection are now decided in the order they were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_chunks_and_a_submit_then_wait_are_taken_in_order() {
    let d = Daemon::start(&[]);
    let client = wire::connect(&d.socket).await;
    let bytes = std::fs::read(common::plugin("hello")).unwrap();
    let digest = Digest::of(&bytes);
    let chunk = bytes.len().div_ceil(400);
    let chunks: Vec<&[u8]> = bytes.chunks(chunk).collect();
    assert!(chunks.len() >= 300, "{} chunks", chunks.len());
    let mut pending = Vec::new();
    let mut offset = 0;
    for (i, data) in chunks.iter().enumerate() {
        pending.push(
            client
                .request(Request::Upload {
                    digest,
                    offset,
                    data: data.to_vec(),
                    last: i + 1 == chunks.len(),
                })
                .await
                .expect("send"),
        );
        offset += data.len() as u64;
    }
    let mut request = SubmitRequest::new(digest);
    request.name = Some("ordered".into());
    request.input = b"in order".to_vec();
    let mut submitted = client
        .request(Request::Submit(Box::new(request)))
        .await
        .unwrap();
    let mut waited = client
        .request(Request::Wait(TaskRef::Name("ordered".into())))
        .await
        .unwrap();

    let last = pending.len() - 1;
    for (i, mut replies) in pending.into_iter().enumerate() {
        match replies.next_reply().await.expect("a reply") {
            Reply::Uploaded { plugin: None } if i < last => {}
            Reply::Uploaded { plugin: Some(_) } if i == last => {}
            other => panic!("chunk {i}: {other:?}"),
        }
    }
    let reply = submitted.next_reply().await.unwrap();
    assert!(
        matches!(
            reply,
            Reply::Submitted(Submitted {
                placement: Placement::Running,
                ..
            })
        ),
        "{reply:?}"
    );
    match waited.next_reply().await.unwrap() {
        Reply::Report(report) => assert_eq!(
            report.outcome,
            TaskOutcome::Completed {
                output: b"in order".to_vec()
            }
        ),
        other => panic!("wait: {other:?}"),
    }
}

/// Defect 5: concurrent uploads of one digest shared a temporary file name,
/// so one writer could rename the other's half-written file ("cannot store
/// the plugin on disk"). Each upload now has a file of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_uploads_of_one_plugin_all_store_it_whole() {
    let mut d = Daemon::start(&[]);
    let bytes = std::fs::read(common::plugin("chatty")).unwrap();
    let mut uploads = Vec::new();
    for _ in 0..8 {
        let socket = d.socket.clone();
        let bytes = bytes.clone();
        uploads.push(tokio::spawn(async move {
            let client = wire::connect(&socket).await;
            // Small chunks, so the uploads interleave.
            let digest = Digest::of(&bytes);
            let chunks: Vec<&[u8]> = bytes.chunks(4096).collect();
            let mut offset = 0;
            let mut last_reply = None;
            for (i, data) in chunks.iter().enumerate() {
                let reply = wire::call(
                    &client,
                    Request::Upload {
                        digest,
                        offset,
                        data: data.to_vec(),
                        last: i + 1 == chunks.len(),
                    },
                )
                .await;
                offset += data.len() as u64;
                last_reply = Some(reply);
            }
            last_reply.unwrap()
        }));
    }
    for upload in uploads {
        let reply = upload.await.unwrap();
        assert!(
            matches!(reply, Reply::Uploaded { plugin: Some(_) }),
            "{reply:?}"
        );
    }
    let stored = d
        .dir
        .path()
        .join("state/plugins")
        .join(format!("{}.wasm", hex(&Digest::of(&bytes))));
    assert_eq!(std::fs::read(&stored).expect("the stored plugin"), bytes);
    let leftovers: Vec<_> = std::fs::read_dir(d.dir.path().join("state/plugins"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path() != stored)
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (_, finished) = d.finish(LIMIT);
    assert!(
        !finished.stderr.contains("cannot store"),
        "{}",
        finished.stderr
    );
}

/// An upload whose bytes are not those of its digest is refused when its
/// last chunk arrives, and nothing is stored under that digest (the check
/// runs off the async workers since hashing moved there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_bytes_do_not_match_its_digest_is_refused() {
    let d = Daemon::start(&[]);
    let bytes = std::fs::read(common::plugin("hello")).unwrap();
    let wrong = Digest::of(b"other bytes");
    let client = wire::connect(&d.socket).await;
    let reply = wire::call(
        &client,
        Request::Upload {
            digest: wrong,
            offset: 0,
            data: bytes,
            last: true,
        },
    )
    .await;
    match reply {
        Reply::Error { kind, message } => {
            assert_eq!(kind, ErrorKind::Invalid, "{message}");
            assert!(message.contains("do not match their digest"), "{message}");
        }
        other => panic!("the upload was taken: {other:?}"),
    }
    assert_eq!(
        wire::call(&client, Request::HasPlugin(wrong)).await,
        Reply::HasPlugin(false)
    );
    assert!(
        !d.dir
            .path()
            .join("state/plugins")
            .join(format!("{}.wasm", hex(&wrong)))
            .exists()
    );
}

/// Defect 5: `wait` and `cancel` printed the client's own waiting time as if
/// it were the task's duration, and `cancel` a placeholder "(final)".
#[test]
fn wait_and_cancel_print_the_task_duration() {
    let d = Daemon::start(&[]);
    let id = d.submit(&[&p("sleeper"), "--param", "ms=400", "--name", "nap"]);
    let out = d.run(&["wait", &id]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Waiting again costs the client nothing, but the task took ≥ 400 ms.
    let out = d.run(&["wait", &id, "--json"]);
    let took = json(&out.stdout)["duration_ms"]
        .as_u64()
        .expect("duration_ms");
    assert!(took >= 400, "the task's own duration, got {took} ms");
    let out = d.run(&["wait", &id]);
    assert!(
        out.stderr.contains("nap completed in 1 attempt (")
            && !out.stderr.contains("µs)")
            && !out.stderr.contains("(0"),
        "{}",
        out.stderr
    );

    d.submit(&[&p("sleeper"), "--param", "ms=600000", "--name", "long"]);
    d.wait_until_state("long", "running");
    let out = d.run(&["cancel", "long"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("long canceled after 1 attempt ("),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("(final)"), "{}", out.stderr);
}
