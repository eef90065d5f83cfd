//! Namespaces on one host and on a cluster of two nodes through the real
//! binary (beta's objects made through one node, alpha's verbs through the
//! other): from namespace alpha, every verb against beta's ids, names,
//! slots, schedules and keys finds nothing and says so in the words of an
//! unknown one; names, slots and
//! idempotency keys are each namespace's own; each quota refuses naming
//! itself and leaves the other namespaces alone; a team's token reaches its
//! namespace only; namespaces survive a restart.

use crate::cluster::steady_node;
use crate::common::{self, Finished};
use crate::postgres::Postgres;
use crate::{daemon, http};

use daemon::{Daemon, p};
use serde_json::Value;

/// Runs `args` in namespace `ns`.
fn in_ns(d: &Daemon, ns: &str, args: &[&str]) -> Finished {
    let mut all = vec!["--namespace", ns];
    all.extend_from_slice(args);
    d.run(&all)
}

/// Submits in `ns`; the id.
fn submit_in(d: &Daemon, ns: &str, args: &[&str]) -> String {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    let out = in_ns(d, ns, &all);
    assert_eq!(out.code, Some(0), "submit in {ns} {args:?}: {}", out.stderr);
    out.stdout.trim().to_owned()
}

fn json_rows(out: &Finished) -> Vec<Value> {
    assert_eq!(out.code, Some(0), "{out:?}");
    serde_json::from_str(&out.stdout).expect("a JSON array")
}

/// Polls `ps` in `ns` until its task `name` runs.
fn running_in(d: &Daemon, ns: &str, name: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let rows = json_rows(&in_ns(d, ns, &["ps", "--json"]));
        if rows
            .iter()
            .any(|r| r["name"] == name && r["state"] == "running")
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("`{name}` never ran in {ns}");
}

fn added(d: &Daemon, args: &[&str]) {
    let mut all = vec!["ns", "add"];
    all.extend_from_slice(args);
    let out = d.run(&all);
    assert_eq!(out.code, Some(0), "ns add {args:?}: {}", out.stderr);
}

#[test]
fn nothing_of_another_namespace_answers_and_names_are_each_ones_own() {
    let d = Daemon::start(&[]);
    isolated(&d, &d);
}

#[test]
fn nothing_of_another_namespace_answers_through_another_cluster_node() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    isolated(&n2, &n1);
}

/// Beta's objects made through `b`, alpha's verbs through `a` (one daemon
/// twice, or two nodes of a cluster).
fn isolated(b: &Daemon, a: &Daemon) {
    added(b, &["alpha"]);
    added(b, &["beta"]);
    let sleeper = p("sleeper");
    // Beta holds slot `db` with a task named `job`, a finished task, a
    // schedule, an idempotency key and a slot rule.
    let job = submit_in(
        b,
        "beta",
        &[
            &sleeper, "--name", "job", "--slot", "db", "--param", "ms=60000",
        ],
    );
    let done = in_ns(
        b,
        "beta",
        &["submit", &p("hello"), "--name", "done", "--wait"],
    );
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    let keyed = submit_in(
        b,
        "beta",
        &[&p("hello"), "--idempotency-key", "k1", "--name", "keyed"],
    );
    let schedule = in_ns(
        b,
        "beta",
        &[
            "schedule",
            "add",
            "nightly",
            "--cron",
            "0 3 * * *",
            &p("hello"),
        ],
    );
    assert_eq!(schedule.code, Some(0), "{}", schedule.stderr);
    let rule = in_ns(b, "beta", &["slot", "set", "db", "--capacity", "2"]);
    assert_eq!(rule.code, Some(0), "{}", rule.stderr);

    // Alpha sees none of it.
    assert!(json_rows(&in_ns(a, "alpha", &["ps", "--all", "--json"])).is_empty());
    assert!(json_rows(&in_ns(a, "alpha", &["slots", "--json"])).is_empty());
    assert!(json_rows(&in_ns(a, "alpha", &["schedule", "ls", "--json"])).is_empty());
    assert!(json_rows(&in_ns(a, "alpha", &["slot", "ls", "--json"])).is_empty());
    let events = in_ns(a, "alpha", &["events", "--json"]);
    assert_eq!(events.code, Some(0), "{}", events.stderr);
    assert!(
        !events.stdout.contains("job") && !events.stdout.contains("\"done\""),
        "alpha's events show beta's: {}",
        events.stdout
    );
    // Every verb on beta's ids and names answers as an unknown one does.
    let unknown_id = "999999";
    for verb in ["wait", "logs", "cancel", "remove", "rerun"] {
        for (target, unknown) in [(job.as_str(), unknown_id), ("job", "no-such-task")] {
            let theirs = in_ns(a, "alpha", &[verb, target]);
            let none = in_ns(a, "alpha", &[verb, unknown]);
            assert_eq!(theirs.code, none.code, "{verb} {target}: {theirs:?}");
            assert_eq!(
                theirs.stderr.replace(target, "X"),
                none.stderr.replace(unknown, "X"),
                "{verb} {target} tells more than an unknown one"
            );
        }
    }
    for args in [
        vec!["schedule", "rm", "nightly"],
        vec!["schedule", "run", "nightly"],
        vec!["slot", "unset", "db"],
    ] {
        let out = in_ns(a, "alpha", &args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
    }
    // An unknown namespace and one a credential does not reach read alike.
    let none = in_ns(a, "gamma", &["ps"]);
    assert_eq!(none.code, Some(2));
    assert!(
        none.stderr.contains("no namespace `gamma`"),
        "{}",
        none.stderr
    );

    // Alpha's own `job` in its own slot `db` starts at once beside beta's,
    // and its key k1 makes its own task.
    let own = submit_in(
        a,
        "alpha",
        &[
            &sleeper,
            "--name",
            "job",
            "--slot",
            "db",
            "--param",
            "ms=60000",
            "--policy",
            "drop-if-running",
        ],
    );
    assert_ne!(own, job);
    let alpha_keyed = submit_in(
        a,
        "alpha",
        &[&p("hello"), "--idempotency-key", "k1", "--name", "keyed"],
    );
    assert_ne!(alpha_keyed, keyed, "a key is each namespace's own");
    let rows = json_rows(&in_ns(a, "alpha", &["ps", "--json"]));
    let row = rows
        .iter()
        .find(|r| r["name"] == "job")
        .expect("alpha's job");
    assert_eq!(row["slot"], "db", "names are shown bare in their namespace");

    // The default namespace sees neither; the operator's -A sees both.
    assert!(json_rows(&a.run(&["ps", "--all", "--json"])).is_empty());
    let everything = json_rows(&a.run(&["-A", "ps", "--json"]));
    let names: Vec<&str> = everything
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(
        names.contains(&"alpha/job") && names.contains(&"beta/job"),
        "{names:?}"
    );
    for id in [&job, &own] {
        let out = a.run(&["-A", "cancel", id]);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
}

#[test]
fn each_quota_refuses_naming_itself_and_leaves_other_namespaces_alone() {
    let d = Daemon::start(&["--http", "127.0.0.1:0"]);
    added(&d, &["waits", "--max-waiting", "1"]);
    added(&d, &["rated", "--max-submit-rate", "1"]);
    added(&d, &["small", "--memory-ceiling", "64MiB"]);
    added(&d, &["timed", "--max-schedules", "1"]);
    let sleeper = p("sleeper");
    // One task waits in its busy slot; a second would wait too.
    submit_in(
        &d,
        "waits",
        &[&sleeper, "--slot", "s", "--param", "ms=60000"],
    );
    submit_in(
        &d,
        "waits",
        &[&sleeper, "--slot", "s", "--param", "ms=60000"],
    );
    let over = in_ns(&d, "waits", &["submit", &sleeper, "--slot", "s"]);
    assert_eq!(over.code, Some(3), "{over:?}");
    assert!(over.stderr.contains("max-waiting = 1"), "{}", over.stderr);

    let first = in_ns(&d, "rated", &["submit", &p("hello")]);
    assert_eq!(first.code, Some(0), "{first:?}");
    let second = in_ns(&d, "rated", &["submit", &p("hello")]);
    assert_eq!(second.code, Some(3), "{second:?}");
    assert!(
        second.stderr.contains("max-submit-rate = 1"),
        "{}",
        second.stderr
    );

    let big = in_ns(
        &d,
        "small",
        &["submit", &p("hello"), "--max-memory", "512MiB"],
    );
    assert_eq!(big.code, Some(3), "{big:?}");
    assert!(big.stderr.contains("memory-ceiling"), "{}", big.stderr);
    let fits = in_ns(&d, "small", &["submit", &p("hello"), "--wait"]);
    assert_eq!(fits.code, Some(0), "{fits:?}");

    let cron = ["--cron", "0 3 * * *"];
    let one = in_ns(
        &d,
        "timed",
        &["schedule", "add", "a", cron[0], cron[1], &p("hello")],
    );
    assert_eq!(one.code, Some(0), "{one:?}");
    let two = in_ns(
        &d,
        "timed",
        &["schedule", "add", "b", cron[0], cron[1], &p("hello")],
    );
    assert_eq!(two.code, Some(3), "{two:?}");
    assert!(two.stderr.contains("max-schedules = 1"), "{}", two.stderr);

    // Running attempts: one at a time, the others waiting for a permit.
    added(&d, &["capped", "--max-running", "1"]);
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let slot = format!("s{i}");
            submit_in(
                &d,
                "capped",
                &[&sleeper, "--slot", &slot, "--param", "ms=60000"],
            )
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let rows = json_rows(&in_ns(&d, "capped", &["ps", "--json"]));
        let running = rows.iter().filter(|r| r["state"] == "running").count();
        assert!(running <= 1, "{rows:?}");
        if running == 1 && rows.iter().filter(|r| r["state"] == "waiting").count() == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{rows:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The metrics count each namespace's tasks under its label.
    let metrics = http::Api::of(&d).get("/metrics");
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    for (state, n) in [("running", 1), ("waiting", 2)] {
        let series =
            format!("taskhost_namespace_tasks{{namespace=\"capped\",state=\"{state}\"}} {n}");
        assert!(
            metrics.body.contains(&series),
            "{series} in\n{}",
            metrics.body
        );
    }
    let others = d.run(&["submit", &p("hello"), "--wait"]);
    assert_eq!(others.code, Some(0), "another namespace runs: {others:?}");
    for id in &ids {
        assert_eq!(d.run(&["-A", "cancel", id]).code, Some(0));
    }

    // Bytes in its buckets: a write over them fails in the guest, naming
    // the quota; another namespace writes as much.
    added(&d, &["stored", "--max-kv-bytes", "4KiB"]);
    let pad = |ns: &str, slot: &str, bytes: &str| {
        let path = p("counter");
        let param = format!("pad={bytes}");
        in_ns(
            &d,
            ns,
            &["submit", &path, "--slot", slot, "--param", &param, "--wait"],
        )
    };
    for slot in ["a", "b"] {
        let fits = pad("stored", slot, "1500");
        assert_eq!(fits.code, Some(0), "{fits:?}");
    }
    let over = pad("stored", "c", "1500");
    assert_ne!(over.code, Some(0), "{over:?}");
    assert!(over.stderr.contains("max-kv-bytes = 4096"), "{over:?}");
    let elsewhere = pad("timed", "c", "3000");
    assert_eq!(elsewhere.code, Some(0), "{elsewhere:?}");
    let ls = json_rows(&d.run(&["ns", "ls", "--json"]));
    let stored = ls.iter().find(|r| r["name"] == "stored").expect("stored");
    let used = stored["usage"]["max-kv-bytes"].as_u64().unwrap();
    assert!((3000..=4096).contains(&used), "{stored}");

    // The default namespace and the others go on.
    for _ in 0..3 {
        let out = d.run(&["submit", &p("hello"), "--wait"]);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    let ls = json_rows(&d.run(&["ns", "ls", "--json"]));
    let waits = ls.iter().find(|r| r["name"] == "waits").expect("waits");
    assert_eq!(waits["quotas"]["max-waiting"], 1);
    assert_eq!(waits["usage"]["max-waiting"], 1, "{waits}");
}

#[test]
fn a_teams_token_reaches_its_namespace_only_and_namespaces_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, "submit alpha-token alpha\nadmin root-token *\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut d = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        file.to_str().unwrap(),
    ]);
    tokens_reach(&d, &d, dir.path());
    let out = d.run(&["shutdown"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    d.finish(std::time::Duration::from_secs(30));
    d.restart(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        file.to_str().unwrap(),
    ]);
    let ls = json_rows(&d.run(&["ns", "ls", "--json"]));
    let alpha = ls
        .iter()
        .find(|r| r["name"] == "alpha")
        .expect("alpha kept");
    assert_eq!(alpha["weight"], 3);
    let theirs = json_rows(&in_ns(&d, "beta", &["ps", "--all", "--json"]));
    let mut names: Vec<&str> = theirs.iter().filter_map(|r| r["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["hidden-b", "theirs"], "{theirs:?}");
}

/// A team's token through `d`'s HTTP server (its tokens `alpha-token`,
/// alpha's, and `root-token`, every namespace's) reaches alpha's work only;
/// beta's tasks are submitted through `b`.
fn tokens_reach(d: &Daemon, b: &Daemon, dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    added(b, &["alpha", "--weight", "3"]);
    added(b, &["beta"]);
    let theirs = in_ns(
        b,
        "beta",
        &["submit", &p("hello"), "--name", "theirs", "--wait"],
    );
    assert_eq!(theirs.code, Some(0), "{theirs:?}");
    let port = http::http_port(d);
    // The event stream of alpha's token carries none of beta's events.
    let mut events = http::open_stream(
        port,
        "/api/events",
        &[("Authorization", "Bearer alpha-token")],
    );
    assert_eq!(events.status, 200);
    let hidden = in_ns(
        b,
        "beta",
        &["submit", &p("hello"), "--name", "hidden-b", "--wait"],
    );
    assert_eq!(hidden.code, Some(0), "{hidden:?}");
    let remote = |token: &str, args: &[&str]| -> Finished {
        let token_file = dir.join(format!("{token}.file"));
        std::fs::write(&token_file, token).unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let out = common::host()
            .env_remove("TASKHOST_TOKEN")
            .env_remove("TASKHOST_NAMESPACE")
            .args(["--remote", &format!("http://127.0.0.1:{port}")])
            .args(["--token-file", token_file.to_str().unwrap()])
            .args(args)
            .output()
            .expect("spawn host");
        Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let mine = remote(
        "alpha-token",
        &["submit", &p("hello"), "--name", "mine", "--wait"],
    );
    assert_eq!(mine.code, Some(0), "{mine:?}");
    let rows = json_rows(&remote("alpha-token", &["ps", "--all", "--json"]));
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["mine"]);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("TaskFinished")) {
        let line = events.line();
        assert!(
            !line.contains("hidden-b") && !line.contains("beta"),
            "beta's event reached alpha's stream: {line}"
        );
        seen.push(line);
    }
    assert!(seen.iter().any(|l| l.contains("mine")), "{seen:?}");
    for args in [
        vec!["--namespace", "beta", "ps"],
        vec!["--namespace", "gamma", "ps"],
    ] {
        let out = remote("alpha-token", &args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains("no namespace"), "{}", out.stderr);
    }
    let ls = json_rows(&remote("alpha-token", &["ns", "ls", "--json"]));
    assert_eq!(ls.len(), 1, "a team sees its own namespace only: {ls:?}");
    let add = remote("alpha-token", &["ns", "add", "mine"]);
    assert_ne!(add.code, Some(0), "{add:?}");
    let all = remote("alpha-token", &["-A", "ps"]);
    assert_ne!(all.code, Some(0), "{all:?}");
    // The JSON API answers in the token's namespace too; an operator's
    // token picks one with X-Taskhost-Namespace (`*`: all of them).
    let get = |token: &str, ns: Option<&str>, path: &str| {
        let bearer = format!("Bearer {token}");
        let mut headers = vec![("Authorization", bearer.as_str())];
        if let Some(ns) = ns {
            headers.push(("X-Taskhost-Namespace", ns));
        }
        http::request(port, "GET", path, &headers, "")
    };
    let names = |answer: &http::Answer| -> Vec<String> {
        assert_eq!(answer.status, 200, "{}", answer.body);
        let rows: Vec<Value> = serde_json::from_str(&answer.body).unwrap();
        rows.iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&get("alpha-token", None, "/api/tasks?all=true")),
        ["mine"]
    );
    assert_eq!(
        names(&get("alpha-token", None, "/api/namespaces")),
        ["alpha"]
    );
    let theirs = get("alpha-token", Some("beta"), "/api/tasks");
    assert_eq!(theirs.status, 404, "{}", theirs.body);
    assert!(
        theirs.body.contains("no namespace `beta`"),
        "{}",
        theirs.body
    );
    let detail = get("alpha-token", None, "/api/tasks/theirs");
    assert_eq!(detail.status, 404, "{}", detail.body);
    let shutdown = http::request(
        port,
        "POST",
        "/api/shutdown",
        &[
            ("Authorization", "Bearer alpha-token"),
            ("Content-Type", "application/json"),
        ],
        "{}",
    );
    assert_eq!(shutdown.status, 403, "{}", shutdown.body);
    assert_eq!(
        names(&get("root-token", Some("alpha"), "/api/tasks?all=true")),
        ["mine"]
    );
    let mut all = names(&get("root-token", Some("*"), "/api/tasks?all=true"));
    all.sort();
    assert_eq!(all, ["alpha/mine", "beta/hidden-b", "beta/theirs"]);
    assert!(names(&get("root-token", None, "/api/tasks?all=true")).is_empty());
    let root = json_rows(&remote("root-token", &["-A", "ps", "--all", "--json"]));
    assert_eq!(root.len(), 3, "{root:?}");
}

#[test]
fn a_teams_token_reaches_its_namespace_only_through_a_cluster_node() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, "submit alpha-token alpha\nadmin root-token *\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pg = Postgres::start();
    let n1 = steady_node(
        &pg,
        "n1",
        &[
            "--http",
            "127.0.0.1:0",
            "--http-token-file",
            file.to_str().unwrap(),
        ],
    );
    let n2 = steady_node(&pg, "n2", &[]);
    tokens_reach(&n1, &n2, dir.path());
}

#[test]
fn a_namespaces_spawn_trees_stay_in_it_within_its_descendants_quota() {
    let d = Daemon::start(&[]);
    trees_kept(&d, &d);
}

#[test]
fn a_namespaces_spawn_trees_stay_in_it_on_a_cluster() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    trees_kept(&n1, &n2);
}

/// Tree's parents submitted through `d`, beta's work through `b`.
fn trees_kept(d: &Daemon, b: &Daemon) {
    added(d, &["tree", "--max-descendants", "3"]);
    added(d, &["beta"]);
    // Beta holds slot `db`; tree's children go to its own slot `db`.
    submit_in(
        b,
        "beta",
        &[&p("sleeper"), "--slot", "db", "--param", "ms=60000"],
    );
    let out = in_ns(
        d,
        "tree",
        &[
            "submit",
            &p("fanout"),
            "--param",
            "n=2",
            "--param",
            "slot=db",
            "--wait",
            "--json",
        ],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let output: Value = serde_json::from_str(out.json()["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        output["sum"], 1,
        "both children ran beside beta's owner: {output}"
    );
    let children = json_rows(&in_ns(d, "tree", &["ps", "--all", "--json"]));
    assert_eq!(
        children.len(),
        3,
        "the parent and its children: {children:?}"
    );
    assert!(children.iter().all(|c| c["slot"] != "beta/db"));
    let beta = json_rows(&in_ns(b, "beta", &["ps", "--all", "--json"]));
    assert_eq!(beta.len(), 1, "no child went to beta: {beta:?}");

    // Five children with a quota of three unfinished descendants.
    let out = in_ns(
        d,
        "tree",
        &[
            "submit",
            &p("fanout"),
            "--param",
            "depth=1",
            "--param",
            "n=5",
            "--param",
            "ms=1000",
            "--wait",
            "--json",
        ],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    let counts: Value = serde_json::from_str(out.json()["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        (&counts["tasks"], &counts["refused"]),
        (&4.into(), &2.into()),
        "{counts}"
    );
    let events = in_ns(d, "tree", &["events", "--json", "--kind", "GuestLog"]);
    assert!(
        events
            .stdout
            .lines()
            .any(|l| l.contains("spawn refused") && l.contains("max-descendants = 3")),
        "{}",
        events.stdout
    );
    // The default namespace's trees keep the daemon's bound.
    let out = d.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "depth=1",
        "--param",
        "n=5",
        "--wait",
        "--json",
    ]);
    let counts: Value = serde_json::from_str(out.json()["output"].as_str().unwrap()).unwrap();
    assert_eq!(counts["refused"], 0, "{counts}");
}

/// Runs `counter` in `ns` on `slot`; its answer.
fn counted(d: &Daemon, ns: &str, slot: &str, extra: &[&str]) -> Value {
    let path = p("counter");
    let mut args = vec!["submit", &path, "--slot", slot, "--wait", "--json"];
    args.extend_from_slice(extra);
    let out = in_ns(d, ns, &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    serde_json::from_str(out.json()["output"].as_str().unwrap()).unwrap()
}

#[test]
fn a_bucket_of_the_same_name_is_each_namespaces_own() {
    let d = Daemon::start(&["--allow-kv", "hits"]);
    buckets_apart(&d, &d);
}

#[test]
fn a_bucket_of_the_same_name_is_each_namespaces_own_on_a_cluster() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &["--allow-kv", "hits"]);
    let n2 = steady_node(&pg, "n2", &["--allow-kv", "hits"]);
    buckets_apart(&n1, &n2);
}

/// Alpha's guests write through `a`, beta's and the default's through `b`.
fn buckets_apart(a: &Daemon, b: &Daemon) {
    added(a, &["alpha"]);
    added(a, &["beta"]);
    let shared = ["--kv", "hits", "--param", "shared=hits"];
    // A shared bucket `hits`, and slot `a`'s own bucket, in each.
    for _ in 0..2 {
        counted(a, "alpha", "a", &shared);
    }
    let beta = counted(b, "beta", "a", &shared);
    assert_eq!(beta["hits"], 1, "beta's `hits` is not alpha's: {beta}");
    assert_eq!(beta["runs"], 1, "beta's slot `a` is not alpha's: {beta}");
    let default = counted(b, "default", "a", &shared);
    assert_eq!(default["hits"], 1, "{default}");
    // `host kv` reads each namespace's own.
    let get = in_ns(b, "alpha", &["kv", "get", "--shared", "hits", "hits"]);
    assert_eq!(get.stdout, "2", "{get:?}");
    let get = in_ns(a, "beta", &["kv", "get", "--shared", "hits", "hits"]);
    assert_eq!(get.stdout, "1", "{get:?}");
    let buckets = in_ns(a, "beta", &["kv", "ls"]);
    assert_eq!(buckets.code, Some(0), "{buckets:?}");
    assert!(
        buckets.stdout.contains("shared:hits") && !buckets.stdout.contains("alpha"),
        "{}",
        buckets.stdout
    );
}

#[test]
fn a_namespace_names_only_the_secrets_its_operator_granted_it() {
    let secrets = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(secrets.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    for name in ["ALPHA_KEY", "BETA_KEY"] {
        let file = secrets.path().join(name);
        std::fs::write(&file, format!("{name}-value")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let dir = secrets.path().to_str().unwrap();
    let d = Daemon::start(&["--secrets-dir", dir]);
    secrets_granted(&d, &d);
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &["--secrets-dir", dir]);
    let n2 = steady_node(&pg, "n2", &["--secrets-dir", dir]);
    secrets_granted(&n1, &n2);
}

/// Namespaces granted through `b`, their secrets used through `d`.
fn secrets_granted(d: &Daemon, b: &Daemon) {
    added(b, &["alpha", "--allow-secret", "ALPHA_KEY"]);
    added(b, &["beta", "--allow-secret", "BETA_KEY"]);
    let probe = p("sandbox-probe");
    let read = |ns: &str, secret: &str| {
        let var = format!("var={secret}");
        in_ns(
            d,
            ns,
            &[
                "submit",
                &probe,
                "--param",
                "show=digest",
                "--param",
                &var,
                "--secret",
                secret,
                "--wait",
                "--json",
            ],
        )
    };
    let own = read("alpha", "ALPHA_KEY");
    assert_eq!(own.code, Some(0), "{own:?}");
    let theirs = read("alpha", "BETA_KEY");
    assert_eq!(theirs.code, Some(2), "{theirs:?}");
    assert!(
        theirs
            .stderr
            .contains("host ns set alpha --allow-secret BETA_KEY"),
        "{}",
        theirs.stderr
    );
    let schedule = in_ns(
        d,
        "alpha",
        &[
            "schedule",
            "add",
            "s",
            "--cron",
            "0 3 * * *",
            &probe,
            "--secret",
            "BETA_KEY",
        ],
    );
    assert_eq!(schedule.code, Some(2), "{schedule:?}");
    // Taken back, refused again; the default namespace names any.
    let out = d.run(&["ns", "set", "alpha", "--deny-secret", "ALPHA_KEY"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(read("alpha", "ALPHA_KEY").code, Some(2));
    assert_eq!(read("default", "BETA_KEY").code, Some(0));
}

#[test]
fn a_clusters_namespaces_are_every_nodes_and_keep_each_ones_own() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    added(&n1, &["alpha", "--weight", "2"]);
    added(&n1, &["beta", "--max-waiting", "1"]);
    // Added through n1, known to n2 at once.
    let job = submit_in(
        &n2,
        "beta",
        &[
            &p("sleeper"),
            "--name",
            "job",
            "--slot",
            "db",
            "--param",
            "ms=60000",
        ],
    );
    running_in(&n2, "beta", "job");
    let queued = submit_in(&n1, "beta", &[&p("sleeper"), "--slot", "db"]);
    let over = in_ns(&n2, "beta", &["submit", &p("sleeper"), "--slot", "db"]);
    assert_eq!(over.code, Some(3), "{over:?}");
    assert!(over.stderr.contains("max-waiting = 1"), "{}", over.stderr);
    for via in [&n1, &n2] {
        assert!(json_rows(&in_ns(via, "alpha", &["ps", "--all", "--json"])).is_empty());
        assert!(json_rows(&in_ns(via, "alpha", &["slots", "--json"])).is_empty());
        assert!(json_rows(&via.run(&["ps", "--all", "--json"])).is_empty());
        for target in [job.as_str(), "job"] {
            let out = in_ns(via, "alpha", &["wait", target]);
            assert_eq!(out.code, Some(2), "{out:?}");
            assert!(out.stderr.contains("no task with"), "{}", out.stderr);
        }
    }
    // Alpha's own `job` in its own `db` runs beside beta's.
    let own = in_ns(
        &n1,
        "alpha",
        &[
            "submit",
            &p("hello"),
            "--name",
            "job",
            "--slot",
            "db",
            "--wait",
        ],
    );
    assert_eq!(own.code, Some(0), "{own:?}");
    let ls = json_rows(&n2.run(&["ns", "ls", "--json"]));
    let beta = ls.iter().find(|r| r["name"] == "beta").expect("beta");
    assert_eq!(beta["usage"]["max-running"], 1, "{beta}");
    assert_eq!(beta["usage"]["max-waiting"], 1, "{beta}");
    let alpha = ls.iter().find(|r| r["name"] == "alpha").expect("alpha");
    assert_eq!(alpha["weight"], 2);
    // Alpha's buckets are held to its max-kv-bytes across the nodes.
    let set = n2.run(&["ns", "set", "alpha", "--max-kv-bytes", "4KiB"]);
    assert_eq!(set.code, Some(0), "{set:?}");
    // Each node reads the namespaces again every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for via in [&n1, &n2] {
        while !json_rows(&via.run(&["ns", "ls", "--json"]))
            .iter()
            .any(|r| r["name"] == "alpha" && r["quotas"]["max-kv-bytes"] == 4096)
        {
            assert!(std::time::Instant::now() < deadline, "the quota never came");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let counter = p("counter");
    for (via, slot, code) in [
        (&n1, "k1", Some(0)),
        (&n2, "k2", Some(0)),
        (&n1, "k3", Some(1)),
    ] {
        let out = in_ns(
            via,
            "alpha",
            &[
                "submit", &counter, "--slot", slot, "--param", "pad=1500", "--wait",
            ],
        );
        assert_eq!(out.code, code, "{slot}: {out:?}");
    }
    let over = in_ns(
        &n2,
        "alpha",
        &[
            "submit", &counter, "--slot", "k4", "--param", "pad=1500", "--wait",
        ],
    );
    assert!(over.stderr.contains("max-kv-bytes = 4096"), "{over:?}");
    let fits = n2.run(&[
        "submit", &counter, "--slot", "k3", "--param", "pad=3000", "--wait",
    ]);
    assert_eq!(
        fits.code,
        Some(0),
        "another namespace writes more: {fits:?}"
    );
    // Removal waits for the namespace to be empty.
    let rm = n2.run(&["ns", "rm", "beta"]);
    assert_eq!(rm.code, Some(3), "{rm:?}");
    for id in [&job, &queued] {
        let out = n1.run(&["-A", "cancel", id]);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    let rm = n2.run(&["ns", "rm", "beta"]);
    assert_eq!(rm.code, Some(0), "{rm:?}");
    // Gone from the other node within a second or so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while in_ns(&n1, "beta", &["ps"]).code != Some(2) {
        assert!(std::time::Instant::now() < deadline, "n1 still knows beta");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_clusters_quotas_count_every_nodes_work() {
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &[]);
    let n2 = steady_node(&pg, "n2", &[]);
    added(&n1, &["capped", "--max-running", "1"]);
    added(&n1, &["rated", "--max-submit-rate", "1"]);

    // One of capped's tasks claimed at a time, whichever node took it.
    let first = submit_in(
        &n1,
        "capped",
        &[&p("sleeper"), "--name", "one", "--param", "ms=60000"],
    );
    running_in(&n1, "capped", "one");
    let second = submit_in(
        &n2,
        "capped",
        &[&p("sleeper"), "--name", "two", "--param", "ms=60000"],
    );
    // Both nodes claim work meanwhile: another namespace's is served.
    for via in [&n1, &n2, &n1, &n2] {
        let out = via.run(&["submit", &p("hello"), "--wait"]);
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    let rows = json_rows(&in_ns(&n2, "capped", &["ps", "--json"]));
    let two = rows.iter().find(|r| r["name"] == "two").expect("two");
    assert_ne!(two["state"], "running", "over max-running: {rows:?}");
    let ls = json_rows(&n2.run(&["ns", "ls", "--json"]));
    let capped = ls.iter().find(|r| r["name"] == "capped").expect("capped");
    assert_eq!(capped["usage"]["max-running"], 1, "{capped}");
    let out = n2.run(&["--namespace", "capped", "cancel", &first]);
    assert_eq!(out.code, Some(0), "{out:?}");
    running_in(&n1, "capped", "two");
    let out = n1.run(&["--namespace", "capped", "cancel", &second]);
    assert_eq!(out.code, Some(0), "{out:?}");

    // One bucket of submissions for both nodes: a burst of one.
    let mut codes = Vec::new();
    let mut refusal = String::new();
    for via in [&n1, &n2] {
        let out = in_ns(via, "rated", &["submit", &p("hello")]);
        if out.code != Some(0) {
            refusal = out.stderr.clone();
        }
        codes.push(out.code);
    }
    assert_eq!(codes, [Some(0), Some(3)], "{refusal}");
    assert!(refusal.contains("max-submit-rate = 1"), "{refusal}");
}

#[test]
fn the_config_file_and_the_api_set_namespaces_and_a_bad_one_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(
        &config,
        "[namespaces.gamma]\nweight = 2\nmax_waiting = 1\nmemory_ceiling = \"64MiB\"\n\
         secrets = [\"DEPLOY_KEY\"]\n",
    )
    .unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "submit gamma-token gamma\nadmin root-token *\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let d = Daemon::start(&[
        "--config",
        config.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        tokens.to_str().unwrap(),
    ]);
    let ls = json_rows(&d.run(&["ns", "ls", "--json"]));
    let gamma = ls.iter().find(|r| r["name"] == "gamma").expect("gamma");
    assert_eq!(gamma["weight"], 2, "{gamma}");
    assert_eq!(gamma["quotas"]["max-waiting"], 1, "{gamma}");
    assert_eq!(gamma["quotas"]["memory-ceiling"], 64 << 20, "{gamma}");
    assert_eq!(gamma["secrets"], serde_json::json!(["DEPLOY_KEY"]));
    // The file's quota holds: one task waits, the second is refused.
    let sleeper = p("sleeper");
    let first = in_ns(
        &d,
        "gamma",
        &["submit", &sleeper, "--slot", "s", "--delay", "1h"],
    );
    assert_eq!(first.code, Some(0), "{first:?}");
    let second = in_ns(
        &d,
        "gamma",
        &["submit", &sleeper, "--slot", "t", "--delay", "1h"],
    );
    assert_eq!(second.code, Some(3), "{second:?}");
    assert!(second.stderr.contains("max-waiting"), "{}", second.stderr);

    let port = http::http_port(&d);
    let call = |method: &str, token: &str, path: &str, body: &str| {
        let bearer = format!("Bearer {token}");
        http::request(
            port,
            method,
            path,
            &[
                ("Authorization", bearer.as_str()),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    let put = call(
        "PUT",
        "root-token",
        "/api/namespaces/delta",
        r#"{"weight": 4, "quotas": {"max-waiting": 5}}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let row: Value = serde_json::from_str(&put.body).unwrap();
    assert_eq!(
        (row["name"].clone(), row["weight"].clone()),
        ("delta".into(), 4.into())
    );
    assert_eq!(row["quotas"]["max-waiting"], 5, "{row}");
    // A second PUT changes it: `null` makes a quota unlimited, the weight
    // stays.
    let put = call(
        "PUT",
        "root-token",
        "/api/namespaces/delta",
        r#"{"quotas": {"max_waiting": null}}"#,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let row: Value = serde_json::from_str(&put.body).unwrap();
    assert_eq!(row["weight"], 4, "{row}");
    assert_eq!(row["quotas"], serde_json::json!({}), "{row}");
    let listed = json_rows(&d.run(&["ns", "ls", "--json"]));
    assert!(listed.iter().any(|r| r["name"] == "delta"), "{listed:?}");
    let bad = call(
        "PUT",
        "root-token",
        "/api/namespaces/delta",
        r#"{"quotas": {"max-widgets": 1}}"#,
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("max-widgets"), "{}", bad.body);
    let bad = call("PUT", "root-token", "/api/namespaces/Bad_Name", "");
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("not a namespace name"), "{}", bad.body);
    // A team's token changes no namespace, its own either.
    for (method, path) in [
        ("PUT", "/api/namespaces/gamma"),
        ("PUT", "/api/namespaces/epsilon"),
        ("DELETE", "/api/namespaces/delta"),
    ] {
        let refused = call(method, "gamma-token", path, "{}");
        assert_eq!(refused.status, 403, "{method} {path}: {}", refused.body);
    }
    let gone = call("DELETE", "root-token", "/api/namespaces/delta", "");
    assert_eq!(gone.status, 200, "{}", gone.body);
    let again = call("DELETE", "root-token", "/api/namespaces/delta", "");
    assert_eq!(again.status, 404, "{}", again.body);
    // gamma holds a waiting task: it stays.
    let held = call("DELETE", "root-token", "/api/namespaces/gamma", "");
    assert_eq!(held.status, 409, "{}", held.body);

    for (text, named) in [
        ("[namespaces.Bad]\n", "namespaces.Bad"),
        (
            "[namespaces.ok]\nsecrets = [\"no spaces\"]\n",
            "namespaces.ok",
        ),
        ("[namespaces.ok]\nmax_widgets = 1\n", "max_widgets"),
    ] {
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, text).unwrap();
        let out = common::run_host(&[
            "serve",
            "--socket",
            dir.path().join("bad.sock").to_str().unwrap(),
            "--state-dir",
            dir.path().join("bad-state").to_str().unwrap(),
            "--config",
            bad.to_str().unwrap(),
        ]);
        assert_ne!(out.code, Some(0), "{text}");
        assert!(out.stderr.contains(named), "{text}: {}", out.stderr);
    }
}

#[test]
fn a_namespace_lists_the_plugins_its_own_tasks_use_with_its_own_counts() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "submit alpha-token alpha\nadmin root-token *\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let http = [
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        tokens.to_str().unwrap(),
    ];
    let d = Daemon::start(&http);
    plugins_listed(&d, &d);
    let pg = Postgres::start();
    let n1 = steady_node(&pg, "n1", &http);
    let n2 = steady_node(&pg, "n2", &[]);
    plugins_listed(&n1, &n2);
}

/// Alpha's tasks and the HTTP API through `d` (with the tokens
/// `alpha-token` and `root-token`), beta's tasks and the listings through
/// `b`.
fn plugins_listed(d: &Daemon, b: &Daemon) {
    added(d, &["alpha"]);
    added(d, &["beta"]);
    let run = |ns: &str, plugin: &str| {
        let path = p(plugin);
        let via = if ns == "beta" { b } else { d };
        let out = in_ns(via, ns, &["submit", &path, "--param", "ms=1", "--wait"]);
        assert_eq!(out.code, Some(0), "{ns} {plugin}: {out:?}");
    };
    run("alpha", "hello");
    run("alpha", "sleeper");
    run("beta", "counter");
    run("beta", "sleeper");
    run("beta", "sleeper");
    // Stored by the operator, used by nobody: the default namespace's
    // listing shows it, as it did before namespaces.
    let port = http::http_port(d);
    let bytes = std::fs::read(common::plugin("chatty")).unwrap();
    let digest = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let put = http::request_bytes(
        port,
        "PUT",
        &format!("/api/plugins/{digest}"),
        &[("Authorization", "Bearer root-token")],
        &bytes,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    let listed = |rows: Vec<Value>| -> Vec<(String, u64)> {
        let mut named: Vec<(String, u64)> = rows
            .iter()
            .map(|r| {
                let name = r["name"].as_str().unwrap_or("?").to_owned();
                (name, r["finished"].as_u64().unwrap())
            })
            .collect();
        named.sort();
        named
    };
    let plugins = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["plugins", "ls", "--json"]);
        listed(json_rows(&b.run(&all)))
    };
    let own = |name: &str, n: u64| (name.to_owned(), n);
    assert_eq!(
        plugins(&["-n", "alpha"]),
        [own("hello", 1), own("sleeper", 1)]
    );
    assert_eq!(
        plugins(&["-n", "beta"]),
        [own("counter", 1), own("sleeper", 2)]
    );
    assert_eq!(plugins(&[]), [own("chatty", 0)]);
    assert_eq!(
        plugins(&["-A"]),
        [
            own("chatty", 0),
            own("counter", 1),
            own("hello", 1),
            own("sleeper", 3)
        ]
    );
    // The JSON API lists by the token's namespace alike.
    let get = http::request(
        port,
        "GET",
        "/api/plugins",
        &[("Authorization", "Bearer alpha-token")],
        "",
    );
    assert_eq!(get.status, 200, "{}", get.body);
    let rows: Vec<Value> = serde_json::from_str(&get.body).unwrap();
    assert_eq!(listed(rows), [own("hello", 1), own("sleeper", 1)]);
}
