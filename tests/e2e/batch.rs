//! Batch submission through the real binary: `host submit --batch FILE`
//! in calls of up to 1,000 with an answer per line in order, refusals in
//! their place, every acknowledged task kept across a SIGKILL; flags and
//! bad lines refused before their call is sent; `POST /api/tasks/batch`;
//! cancel and rerun by filter with dry runs; `ps` paged by a cursor.

use std::io::Write;

use serde_json::{Value, json};

use crate::daemon::{Daemon, p};
use crate::http::Api;

/// Writes `lines` to a file in `dir`; its path.
fn jsonl(dir: &tempfile::TempDir, lines: &[String]) -> String {
    let path = dir.path().join("tasks.jsonl");
    let mut file = std::fs::File::create(&path).unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
    path.display().to_string()
}

#[test]
fn a_file_is_taken_in_calls_with_an_answer_per_line_and_kept_across_a_kill() {
    let mut daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let total = 2_500;
    let mut lines: Vec<String> = (0..total)
        .map(|i| json!({ "slot": format!("s{}", i % 50), "input": format!("n{i}") }).to_string())
        .collect();
    // Refusals in their place, the first one a conflict (exit 3): the
    // same key with another request; an unknown plugin; a key given twice
    // with the same request (the same task).
    lines[10] = json!({ "idempotency_key": "k", "input": "one" }).to_string();
    lines[1_200] = json!({ "idempotency_key": "k", "input": "two" }).to_string();
    lines[1_201] = json!({ "plugin": "0".repeat(64) }).to_string();
    lines[2_400] = json!({ "idempotency_key": "k", "input": "one" }).to_string();
    let file = jsonl(&dir, &lines);
    let out = daemon.run(&["submit", &p("hello"), "--batch", &file]);
    assert_eq!(out.code, Some(3), "the first refusal's code: {out:?}");
    let ids: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(ids.len(), total - 2, "an id per accepted line");
    // In the order of the lines: new ids rise; the repeated key answers
    // with the task it made.
    let keyed = ids[10];
    assert_eq!(ids[2_398], keyed, "line 2,401 gives back line 11's task");
    let mut new: Vec<u64> = ids.clone();
    new.remove(2_398);
    assert!(new.windows(2).all(|w| w[0] < w[1]), "ids in line order");
    assert!(
        out.stderr
            .contains("line 1201: refused: idempotency key `k`")
            && out
                .stderr
                .contains("line 1202: refused: the daemon does not know plugin")
            && out.stderr.contains(
                "submitted 2498 tasks (1 already submitted with their idempotency key), 2 refused or rejected"
            ),
        "{}",
        out.stderr
    );
    // Everything acknowledged is kept across a SIGKILL.
    let mut process = daemon.process.take().unwrap();
    process.child.kill().unwrap();
    let _ = process.child.wait();
    daemon.restart(&[]);
    // Once every one has run (a listing taken while tasks end may miss
    // the ones ending between its live part and its stored part).
    let deadline = std::time::Instant::now() + crate::daemon::LIMIT;
    while !daemon.ps().is_empty() {
        assert!(std::time::Instant::now() < deadline, "tasks never ended");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let kept: std::collections::BTreeSet<u64> = daemon.ps_all_ids().into_iter().collect();
    let lost: Vec<&u64> = new.iter().filter(|id| !kept.contains(id)).collect();
    assert!(
        lost.is_empty() && kept.len() == new.len(),
        "{} of {} acknowledged tasks missing after a restart: {:?}",
        lost.len(),
        new.len(),
        &lost[..lost.len().min(20)]
    );
    // And each runs: a line's input is its output.
    let last = ids.last().unwrap().to_string();
    let waited = daemon.run(&["wait", &last]);
    assert_eq!(waited.code, Some(0), "{waited:?}");
    assert_eq!(waited.stdout, format!("n{}", total - 1));
}

#[test]
fn flags_and_bad_lines_are_refused_before_their_call_is_sent() {
    let daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let good = json!({ "input": "x" }).to_string();
    let file = jsonl(&dir, &[good.clone(), good.clone()]);
    let flagged = daemon.run(&["submit", &p("hello"), "--batch", &file, "--slot", "a"]);
    assert_eq!(flagged.code, Some(2), "{flagged:?}");
    assert!(
        flagged.stderr.contains("--slot does not go with --batch"),
        "{}",
        flagged.stderr
    );
    let waits = daemon.run(&["submit", &p("hello"), "--batch", &file, "--wait"]);
    assert_eq!(waits.code, Some(2), "{waits:?}");
    let file = jsonl(
        &dir,
        &[
            good.clone(),
            String::new(),
            r#"{"timeout": "soon"}"#.into(),
            good,
        ],
    );
    let bad = daemon.run(&["submit", &p("hello"), "--batch", &file]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(
        bad.stderr.contains(&format!("{file}:3: timeout:"))
            && bad.stderr.contains("nothing from line 1 on was sent"),
        "{}",
        bad.stderr
    );
    assert!(
        daemon.ps_all_ids().is_empty(),
        "nothing of the file was sent"
    );
    // A submission the slot rejects at intake is told as `host submit`
    // tells it, with its line, and counted apart from the accepted ones.
    let busy = json!({ "slot": "busy", "params": { "ms": "60000" } }).to_string();
    let dropped = json!({ "slot": "busy", "policy": "drop-if-running" }).to_string();
    let file = jsonl(&dir, &[busy, dropped]);
    let out = daemon.run(&["submit", &p("sleeper"), "--batch", &file]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(
        out.stderr.contains("line 2: sleeper-2 (id 2) rejected:")
            && out
                .stderr
                .contains("submitted 1 tasks, 1 refused or rejected"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_json_api_takes_a_batch_with_an_answer_per_task_in_order() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = Api::of(&daemon);
    // The plugin by digest, uploaded through the socket.
    daemon.submit(&[&p("hello"), "--input", "first"]);
    let plugin: String = {
        use sha2::Digest as _;
        let bytes = std::fs::read(p("hello")).unwrap();
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let post = |body: &Value| {
        api.request(
            "POST",
            "/api/tasks/batch",
            &[("Content-Type", "application/json")],
            &body.to_string(),
        )
    };
    // A task the document refuses (a word it does not know, no plugin)
    // refuses the batch, naming it; nothing is created.
    let before = daemon.ps_all_ids().len();
    for (bad, said) in [
        (json!({ "plugin": plugin, "policy": "sometimes" }), "policy"),
        (json!({ "input": "no plugin" }), "plugin: missing"),
    ] {
        let refused = post(&json!({ "tasks": [{ "plugin": plugin, "input": "a" }, bad] }));
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert!(
            refused.body.contains("task 1 of the batch"),
            "{}",
            refused.body
        );
        assert!(refused.body.contains(said), "{}", refused.body);
    }
    assert_eq!(daemon.ps_all_ids().len(), before);
    // The daemon's own refusals are answered per task, in order.
    let answer = post(&json!({ "tasks": [
        { "plugin": plugin, "input": "a", "slot": "x" },
        { "plugin": "0".repeat(64) },
        { "plugin": plugin, "input": "b", "idempotency_key": "k" },
        { "plugin": plugin, "input": "b", "idempotency_key": "k" },
        { "plugin": plugin, "input": "c", "idempotency_key": "k" },
    ] }));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let items = answer.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 5, "{items:?}");
    assert_eq!(items[0]["slot"], "x");
    assert_eq!(items[0]["existing"], false);
    assert_eq!(items[1]["kind"], "not_found", "{}", items[1]);
    assert_eq!(items[3]["id"], items[2]["id"], "the key's task");
    assert_eq!(items[3]["existing"], true);
    assert_eq!(items[4]["kind"], "conflict", "{}", items[4]);
    assert!(
        items[0]["id"].as_u64() < items[2]["id"].as_u64(),
        "in order"
    );
    let waited = daemon.run(&["wait", &items[2]["id"].to_string()]);
    assert_eq!(waited.stdout, "b");
    // Over the limit, and not a batch: refused whole, nothing created.
    let before = daemon.ps_all_ids().len();
    let many: Vec<Value> = (0..1_001).map(|_| json!({ "plugin": plugin })).collect();
    let over = post(&json!({ "tasks": many }));
    assert_eq!(over.status, 400, "{}", over.body);
    assert!(
        over.body.contains("over the limit of 1000"),
        "{}",
        over.body
    );
    let not = post(&json!([{ "plugin": plugin }]));
    assert_eq!(not.status, 400, "{}", not.body);
    assert_eq!(daemon.ps_all_ids().len(), before);
}

#[test]
fn cancel_by_filter_stops_each_matching_task_once_and_a_dry_run_none() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..300)
        .map(|i| json!({ "slot": format!("q{}", i % 3), "params": { "ms": "60000" } }).to_string())
        .collect();
    let file = jsonl(&dir, &lines);
    let out = daemon.run(&["submit", &p("sleeper"), "--batch", &file]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let filter = ["--filter", "state=queued,slot=q1"];
    let dry = daemon.run(&[&["cancel", "--dry-run"][..], &filter].concat());
    assert_eq!(dry.code, Some(0), "{dry:?}");
    let listed: Vec<u64> = dry.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(listed.len(), 99, "{dry:?}");
    assert!(dry.stderr.contains("99 live tasks match"), "{}", dry.stderr);
    assert_eq!(daemon.ps().len(), 300, "a dry run stops nothing");
    let done = daemon.run(&[&["cancel", "--json"][..], &filter].concat());
    assert_eq!(done.code, Some(0), "{done:?}");
    let answer: Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!(answer["matched"], 99, "{answer}");
    assert_eq!(answer["acted"], 99, "{answer}");
    // Each of them ended, once; the others are untouched.
    for id in &listed {
        let waited = daemon.run(&["wait", &id.to_string(), "--json"]);
        // Queued work is removed, as `host cancel ID` removes it.
        assert_eq!(waited.code, Some(3), "{waited:?}");
        let report: Value = serde_json::from_str(&waited.stdout).unwrap();
        assert_eq!(report["rejection"], "RemovedFromQueue", "{report}");
    }
    let live = daemon.ps();
    assert_eq!(live.len(), 201);
    assert!(
        live.iter()
            .all(|r| r["slot"] != "q1" || r["state"] == "running")
    );
    // The same over the JSON API.
    let api = Api::of(&daemon);
    let post = |body: Value| {
        api.request(
            "POST",
            "/api/tasks/cancel",
            &[("Content-Type", "application/json")],
            &body.to_string(),
        )
    };
    let dry = post(json!({ "state": "queued", "slot": "q2", "dry_run": true }));
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(dry.json()["matched"], 99, "{}", dry.body);
    assert_eq!(dry.json()["acted"], 0, "{}", dry.body);
    let empty = post(json!({}));
    assert_eq!(empty.status, 400, "{}", empty.body);
    let unknown = post(json!({ "colour": "red" }));
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    let done = post(json!({ "state": "queued", "slot": "q2" }));
    assert_eq!(done.json()["acted"], 99, "{}", done.body);
    assert_eq!(daemon.ps().len(), 102);
    let again = daemon.run(&[&["cancel"][..], &filter].concat());
    assert!(
        again.stderr.contains("0 live tasks matched; stopped 0"),
        "{again:?}"
    );
    let bad = daemon.run(&["cancel", "--filter", "colour=red"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("not a key"), "{}", bad.stderr);
}

/// Waits until the daemon holds no live task.
fn drained(daemon: &Daemon) {
    let deadline = std::time::Instant::now() + crate::daemon::LIMIT;
    while !daemon.ps().is_empty() {
        assert!(std::time::Instant::now() < deadline, "tasks never ended");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn rerun_by_filter_submits_every_failed_task_again_in_one_call() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let dir = tempfile::tempdir().unwrap();
    let failing: Vec<String> = (0..5_000)
        .map(|i| json!({ "slot": format!("f{}", i % 100) }).to_string())
        .collect();
    let out = daemon.run(&["submit", &p("flaky"), "--batch", &jsonl(&dir, &failing)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let passing: Vec<String> = (0..100)
        .map(|i| json!({ "input": format!("{i}") }).to_string())
        .collect();
    let out = daemon.run(&["submit", &p("hello"), "--batch", &jsonl(&dir, &passing)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    drained(&daemon);
    let dry = daemon.run(&["rerun", "--filter", "outcome=failed", "--dry-run"]);
    assert_eq!(dry.code, Some(0), "{dry:?}");
    assert!(
        dry.stderr.contains("5000 finished tasks match"),
        "{}",
        dry.stderr
    );
    assert_eq!(dry.stdout.lines().count(), 1_000, "the newest 1,000 listed");
    let before = daemon.ps_all_ids().len();
    assert_eq!(before, 5_100, "a dry run submits nothing");
    let done = daemon.run(&["rerun", "--filter", "outcome=failed,plugin=flaky", "--json"]);
    assert_eq!(done.code, Some(0), "{done:?}");
    let answer: Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!(answer["matched"], 5_000, "{answer}");
    assert_eq!(answer["acted"], 5_000, "{answer}");
    drained(&daemon);
    // Each ran again (and failed again): the newest 5,000 tasks are flaky's.
    let mut ids = daemon.ps_all_ids();
    ids.truncate(5_000);
    assert!(ids.iter().all(|id| *id > 5_100), "new tasks");
    let completed = daemon.run(&["rerun", "--filter", "outcome=completed", "--dry-run"]);
    assert!(
        completed.stderr.contains("100 finished tasks match"),
        "{}",
        completed.stderr
    );
    let api = Api::of(&daemon);
    let dry = api.request(
        "POST",
        "/api/tasks/rerun",
        &[("Content-Type", "application/json")],
        &json!({ "outcome": "completed", "plugin": "hello", "dry_run": true }).to_string(),
    );
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(dry.json()["matched"], 100, "{}", dry.body);
    let bad = daemon.run(&["rerun", "--filter", "outcome=sideways"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
}

/// Every page of `ps --all` by cursor (`extra` more flags), newest first:
/// the ids in page order.
fn all_pages(daemon: &Daemon, limit: usize, extra: &[&str]) -> Vec<u64> {
    let mut seen: Vec<u64> = Vec::new();
    loop {
        let limit_text = limit.to_string();
        let mut args = vec!["ps", "--all", "--json", "--limit", limit_text.as_str()];
        args.extend_from_slice(extra);
        let cursor = seen.last().map(u64::to_string);
        if let Some(cursor) = &cursor {
            args.extend(["--before", cursor.as_str()]);
        }
        let out = daemon.run(&args);
        assert_eq!(out.code, Some(0), "{out:?}");
        let rows: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
        assert!(rows.len() <= limit, "{}", rows.len());
        if rows.is_empty() {
            return seen;
        }
        seen.extend(rows.iter().map(|r| r["id"].as_u64().unwrap()));
        assert!(seen.len() <= 20_000, "the pages never end");
    }
}

#[test]
fn pages_of_finished_tasks_join_the_store_and_memory_without_a_gap() {
    let mut daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let lines = |n: usize, slot: &str| -> Vec<String> {
        (0..n)
            .map(|i| json!({ "slot": format!("{slot}{}", i % 7) }).to_string())
            .collect()
    };
    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--batch",
        &jsonl(&dir, &lines(300, "old")),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    drained(&daemon);
    // After a restart the daemon remembers none of them: the store does.
    daemon.kill_9();
    daemon.restart(&[]);
    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--batch",
        &jsonl(&dir, &lines(40, "new")),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    drained(&daemon);
    let mut every = daemon.ps_all_ids();
    every.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(every.len(), 340, "{every:?}");
    for limit in [1, 7, 50, 500] {
        let pages = all_pages(&daemon, limit, &[]);
        assert_eq!(
            pages, every,
            "pages of {limit}: each task once, newest first"
        );
    }
    // A filter across both: the slots `old3` and `new3`.
    let mut threes: Vec<u64> = every.clone();
    let rows = daemon.run(&["ps", "--all", "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&rows.stdout).unwrap();
    threes.retain(|id| {
        rows.iter()
            .any(|r| r["id"].as_u64() == Some(*id) && r["slot"].as_str().unwrap().ends_with('3'))
    });
    assert!(threes.len() > 40, "{}", threes.len());
    let pages = all_pages(&daemon, 9, &["--filter", "slot=*3"]);
    assert_eq!(pages, threes);
}

#[test]
fn a_durable_daemon_reads_finished_tasks_past_its_memory_from_the_store() {
    // The daemon keeps the newest 1,000 finished tasks in memory as well;
    // the older ones of this same run are read from the store.
    let mut daemon = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..1_500)
        .map(|i| json!({ "slot": format!("m{}", i % 100), "input": format!("n{i}") }).to_string())
        .collect();
    lines[0] = json!({ "name": "eldest", "input": "first words" }).to_string();
    let out = daemon.run(&["submit", &p("hello"), "--batch", &jsonl(&dir, &lines)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let ids: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    drained(&daemon);
    let eldest = ids[0].to_string();
    for target in [eldest.as_str(), "eldest"] {
        let wait = daemon.run(&["wait", target]);
        assert_eq!(wait.code, Some(0), "{wait:?}");
        assert_eq!(wait.stdout, "first words", "{target}");
    }
    let logs = daemon.run(&["logs", &eldest]);
    assert_eq!(logs.code, Some(0), "{logs:?}");
    assert!(logs.stdout.contains("hello: got 11 bytes"), "{logs:?}");
    let mut every = daemon.ps_all_ids();
    every.sort_unstable();
    assert_eq!(every, ids, "ps --all lists every one");
    let page = daemon.run(&[
        "ps",
        "--all",
        "--json",
        "--limit",
        "3",
        "--before",
        &ids[2].to_string(),
    ]);
    let rows: Vec<Value> = serde_json::from_str(&page.stdout).unwrap();
    let paged: Vec<u64> = rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(paged, [ids[1], ids[0]], "{}", page.stdout);
    let rerun = daemon.run(&["rerun", &eldest, "--wait"]);
    assert_eq!(rerun.code, Some(0), "{rerun:?}");
    assert!(rerun.stdout.contains("first words"), "{rerun:?}");
    // A lowered bound applies at the next start: the 1,491 oldest of the
    // 1,501 go in two passes of retention, and the counts it keeps follow.
    daemon.kill_9();
    daemon.restart(&["--retain-finished", "10"]);
    let kept = daemon.ps_all_ids();
    assert_eq!(kept.len(), 10, "{kept:?}");
    let hello = daemon.plugins();
    assert_eq!(hello.len(), 1, "{hello:?}");
    assert_eq!(hello[0]["finished"], 10, "{hello:?}");
    assert_eq!(hello[0]["unfinished"], 0, "{hello:?}");
}

/// `ms` since the Unix epoch as RFC 3339 (by coreutils' `date`).
fn rfc3339(ms: u128) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.%3NZ", "-d"])
        .arg(format!("@{}.{:03}", ms / 1000, ms % 1000))
        .output()
        .expect("date");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[test]
fn a_time_range_picks_the_tasks_submitted_in_it() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let dir = tempfile::tempdir().unwrap();
    let lines = |slot: &str| -> Vec<String> {
        (0..20)
            .map(|i| json!({ "slot": format!("{slot}{i}") }).to_string())
            .collect()
    };
    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--batch",
        &jsonl(&dir, &lines("early")),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let early: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    let after_early = now_ms();
    drained(&daemon);
    let before_late = now_ms();
    let out = daemon.run(&[
        "submit",
        &p("hello"),
        "--batch",
        &jsonl(&dir, &lines("late")),
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let late: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    drained(&daemon);
    // Between the two, as far from each as draining the first took.
    let between = rfc3339((after_early + before_late) / 2);
    let ids = |filter: &str| -> Vec<u64> {
        let out = daemon.run(&["ps", "--all", "--json", "--filter", filter]);
        assert_eq!(out.code, Some(0), "{out:?}");
        let rows: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
        let mut ids: Vec<u64> = rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(ids(&format!("since={between}")), late);
    assert_eq!(ids(&format!("until={between}")), early);
    assert_eq!(ids(&format!("since={between},slot=late1*")).len(), 11);
    assert_eq!(ids("since=1h").len(), 40, "a duration ago");
    let bad = daemon.run(&["ps", "--all", "--filter", "since=yesterday"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("since:"), "{}", bad.stderr);
    // The API's list and a rerun by filter take the same words.
    let api = Api::of(&daemon);
    let listed = api.get(&format!("/api/tasks?all=true&until={between}&limit=100"));
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.json().as_array().unwrap().len(), 20);
    let rerun = api.request(
        "POST",
        "/api/tasks/rerun",
        &[("Content-Type", "application/json")],
        &json!({ "outcome": "completed", "until": between, "dry_run": true }).to_string(),
    );
    assert_eq!(rerun.status, 200, "{}", rerun.body);
    assert_eq!(rerun.json()["matched"], 20, "{}", rerun.body);
}

#[test]
fn ps_pages_through_a_filtered_list_newest_first_by_cursor() {
    let daemon = Daemon::start(&["--http", "127.0.0.1:0"]);
    let dir = tempfile::tempdir().unwrap();
    let passing: Vec<String> = (0..300)
        .map(|i| json!({ "slot": format!("{}{}", ["a", "b"][i % 2], i % 10) }).to_string())
        .collect();
    let out = daemon.run(&["submit", &p("hello"), "--batch", &jsonl(&dir, &passing)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let failing: Vec<String> = (0..50)
        .map(|i| json!({ "slot": format!("f{i}") }).to_string())
        .collect();
    let out = daemon.run(&["submit", &p("flaky"), "--batch", &jsonl(&dir, &failing)]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let failed_ids: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    drained(&daemon);
    // Pages of 20 by cursor: 20, 20, 10, then none; newest first, each
    // failed task once.
    let mut seen = Vec::new();
    let mut before: Option<u64> = None;
    for expected in [20, 20, 10, 0] {
        let mut args = vec![
            "ps",
            "--all",
            "--filter",
            "outcome=failed",
            "--limit",
            "20",
            "--json",
        ];
        let cursor = before.map(|b| b.to_string());
        if let Some(cursor) = &cursor {
            args.extend(["--before", cursor.as_str()]);
        }
        let out = daemon.run(&args);
        assert_eq!(out.code, Some(0), "{out:?}");
        let rows: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(rows.len(), expected, "{before:?}: {}", out.stdout);
        let ids: Vec<u64> = rows.iter().map(|r| r["id"].as_u64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
        assert!(
            rows.iter().all(|r| r["plugin"] == "flaky"),
            "{}",
            out.stdout
        );
        before = ids.last().copied();
        seen.extend(ids);
    }
    seen.sort_unstable();
    let mut want = failed_ids.clone();
    want.sort_unstable();
    assert_eq!(seen, want, "every failed task once");
    // The table says where the next page starts.
    let table = daemon.run(&["ps", "--all", "--filter", "slot=a*", "--limit", "5"]);
    assert!(
        table.stderr.contains("more may follow: --before"),
        "{}",
        table.stderr
    );
    let globbed = daemon.run(&["ps", "--all", "--filter", "slot=a*", "--json"]);
    let rows: Vec<Value> = serde_json::from_str(&globbed.stdout).unwrap();
    assert_eq!(rows.len(), 150, "slots a0..a8");
    // The same over the JSON API.
    let api = Api::of(&daemon);
    let first = api.get("/api/tasks?all=true&outcome=failed&limit=20");
    assert_eq!(first.status, 200, "{}", first.body);
    let first = first.json();
    assert_eq!(first.as_array().unwrap().len(), 20);
    let last = first[19]["id"].as_u64().unwrap();
    let next = api
        .get(&format!("/api/tasks?outcome=failed&limit=20&before={last}"))
        .json();
    assert_eq!(next.as_array().unwrap().len(), 20);
    assert!(next[0]["id"].as_u64().unwrap() < last);
    let bad = api.get("/api/tasks?state=sideways");
    assert_eq!(bad.status, 400, "{}", bad.body);
}

/// A slot's queue is full at its length, on a single daemon and on a
/// cluster node alike: a queue whose middle was canceled (its positions
/// spanning more than it holds) takes a batch up to its bound, and the
/// next item is refused with the queue's true length.
#[test]
fn a_queue_with_a_canceled_middle_fills_to_its_bound_in_one_batch() {
    let pg = crate::postgres::Postgres::start();
    let bound = ["--max-slot-queue", "4"];
    let single = Daemon::start(&bound);
    let node = crate::cluster::steady_node(&pg, "n1", &bound);
    let dir = tempfile::tempdir().unwrap();
    for daemon in [&single, &node] {
        let sleeper = p("sleeper");
        let long = ["--slot", "q", "--param", "ms=600000"];
        daemon.submit(&[&[&sleeper[..], "--name", "owner"][..], &long].concat());
        daemon.wait_until_state("owner", "running");
        let mut queued = Vec::new();
        for name in ["a", "b", "c"] {
            queued.push(daemon.submit(&[&[&sleeper[..], "--name", name][..], &long].concat()));
        }
        let out = daemon.run(&["cancel", &queued[1]]);
        assert_eq!(out.code, Some(0), "{out:?}");
        // Two waiting, positions 1 to 3: two more fit, the third not.
        let lines: Vec<String> = (0..3)
            .map(|_| json!({ "slot": "q", "params": { "ms": "600000" } }).to_string())
            .collect();
        let out = daemon.run(&[
            "submit",
            &sleeper,
            "--batch",
            &jsonl(&dir, &lines),
            "--json",
        ]);
        assert_eq!(out.code, Some(3), "{out:?}");
        let answers: Vec<Value> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(answers.len(), 3, "{out:?}");
        for queued in &answers[..2] {
            assert_eq!(queued["state"], "queued", "{queued}");
        }
        assert_eq!(answers[2]["state"], "rejected", "{}", answers[2]);
        assert!(
            out.stderr
                .contains("line 3: sleeper-7 (id 7) rejected: slot `q` already has 4 waiting"),
            "{}",
            out.stderr
        );
        let out = daemon.run(&["cancel", "--filter", "slot=q"]);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
}

/// A cluster node's pages read the database as far as they need: past
/// the newest 10,000 finished tasks that `ps --all` lists whole, each task
/// once, newest first.
#[test]
fn a_cluster_node_pages_past_the_newest_ten_thousand_finished_tasks() {
    let pg = crate::postgres::Postgres::start();
    let node = crate::cluster::steady_node(&pg, "n1", &["--retain-finished", "20000"]);
    let dir = tempfile::tempdir().unwrap();
    // Three failures older than every `hello`: a filter by outcome reads
    // past all of them.
    let failing: Vec<String> = (0..3)
        .map(|i| json!({ "slot": format!("f{i}") }).to_string())
        .collect();
    let out = node.run(&["submit", &p("flaky"), "--batch", &jsonl(&dir, &failing)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let mut failed: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    failed.reverse();
    let lines: Vec<String> = (0..10_050)
        .map(|i| json!({ "input": format!("n{i}") }).to_string())
        .collect();
    let out = node.run(&["submit", &p("hello"), "--batch", &jsonl(&dir, &lines)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let mut every: Vec<u64> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    every.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(every.len(), 10_050);
    drained(&node);
    let mut kept = every.clone();
    kept.extend(&failed);
    assert_eq!(all_pages(&node, 1_000, &[]), kept);
    assert_eq!(all_pages(&node, 2, &["--filter", "outcome=failed"]), failed);
    let older = every[10_000].to_string();
    let out = node.run(&[
        "ps", "--all", "--json", "--limit", "100", "--before", &older,
    ]);
    let rows: Vec<Value> = serde_json::from_str(&out.stdout).unwrap();
    let outcomes: Vec<&str> = rows
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    let mut expected = vec!["completed"; 49];
    expected.extend(["failed"; 3]);
    assert_eq!(outcomes, expected, "{}", out.stdout);
}

/// On a cluster node a cancel by filter ends a long queue in a few
/// transactions, each task once, as `host cancel ID` would: a waiter
/// started before sees its task removed, and the tasks outside the filter
/// are untouched.
#[test]
fn a_cluster_node_cancels_a_long_queue_by_filter_each_task_once() {
    let pg = crate::postgres::Postgres::start();
    let node = crate::cluster::steady_node(&pg, "n1", &["--max-slot-queue", "5000"]);
    let dir = tempfile::tempdir().unwrap();
    let sleeper = p("sleeper");
    node.submit(&[
        &sleeper[..],
        "--name",
        "owner",
        "--slot",
        "q",
        "--param",
        "ms=600000",
    ]);
    node.wait_until_state("owner", "running");
    let lines: Vec<String> = (0..2_500)
        .map(|i| {
            let slot = if i % 500 == 0 { "r" } else { "q" };
            json!({ "slot": slot, "params": { "ms": "600000" } }).to_string()
        })
        .collect();
    let out = node.run(&["submit", &sleeper, "--batch", &jsonl(&dir, &lines)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let ids: Vec<String> = out.stdout.lines().map(str::to_owned).collect();
    let in_r: Vec<&String> = ids.iter().step_by(500).collect();
    let in_q: Vec<&String> = ids.iter().filter(|id| !in_r.contains(id)).collect();
    let waiter = node.spawn(&["wait", in_q[1_000], "--json"]);
    let filter = ["--filter", "state=queued,slot=q"];
    let done = node.run(&[&["cancel", "--json"][..], &filter].concat());
    assert_eq!(done.code, Some(0), "{done:?}");
    let answer: Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!(
        (&answer["matched"], &answer["acted"]),
        (&json!(2_495), &json!(2_495))
    );
    let (_, waited) = waiter.finish(crate::daemon::LIMIT);
    assert_eq!(waited.code, Some(3), "{waited:?}");
    let report: Value = serde_json::from_str(&waited.stdout).unwrap();
    assert_eq!(report["rejection"], "RemovedFromQueue", "{report}");
    let rejected = node.run(&[
        "ps",
        "--all",
        "--json",
        "--filter",
        "outcome=rejected",
        "--limit",
        "5000",
    ]);
    let mut removed: Vec<u64> = serde_json::from_str::<Vec<Value>>(&rejected.stdout)
        .unwrap()
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    removed.sort_unstable();
    let mut expected: Vec<u64> = in_q.iter().map(|id| id.parse().unwrap()).collect();
    expected.sort_unstable();
    assert_eq!(removed, expected, "each queued task of q removed once");
    let live = node.ps();
    let mut names: Vec<&str> = live.iter().map(|r| r["slot"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [vec!["q"], vec!["r"; in_r.len()]].concat(),
        "{live:?}"
    );
    let again = node.run(&[&["cancel"][..], &filter].concat());
    assert!(
        again.stderr.contains("0 live tasks matched; stopped 0"),
        "{}",
        again.stderr
    );
}
