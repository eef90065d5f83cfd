//! Named deployments: `host deploy` by name and version,
//! `host submit NAME` (and `NAME@VERSION`, `NAME@sha256:…`), tasks that keep
//! their version through a deploy and a rollback, a schedule that follows
//! its name, a version's removal refused while it is in use, the history
//! kept across a restart, the JSON API's `plugin` naming one, and the same across
//! two nodes of a cluster.

use crate::{cluster, common, daemon, http, postgres};

use serde_json::Value;

use common::Finished;
use daemon::{Daemon, p};

fn ok(out: Finished) -> Finished {
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out
}

fn rows(out: Finished) -> Vec<Value> {
    let out = ok(out);
    serde_json::from_str::<Value>(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
        .as_array()
        .unwrap()
        .clone()
}

fn current(d: &Daemon, name: &str) -> String {
    rows(d.run(&["deployments", "ls", "--json"]))
        .into_iter()
        .find(|r| r["name"] == name)
        .map(|r| r["version"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no deployment {name}"))
}

#[test]
fn tasks_keep_their_version_through_a_deploy_and_a_rollback() {
    let mut d = Daemon::start(&[]);
    // `worker` 1 is the sleeper, 2 is hello: each output says which ran.
    ok(d.run(&[
        "deploy",
        &p("sleeper"),
        "--name",
        "worker",
        "--version",
        "1",
    ]));
    assert_eq!(current(&d, "worker"), "1");
    // One task of version 1 runs, another queues behind it in one slot.
    let running = d.submit(&["worker", "--slot", "w", "--param", "ms=1500"]);
    d.wait_until_state(&format!("worker-{running}"), "running");
    let queued = d.submit(&["worker", "--slot", "w", "--param", "ms=10"]);
    // Version 2 is deployed while they run and wait.
    let out = ok(d.run(&["deploy", &p("hello"), "--name", "worker", "--version", "2"]));
    assert!(out.stderr.contains("worker@2 is current"), "{}", out.stderr);
    let fresh = d.submit(&["worker", "--input", "new"]);
    // Removing version 1 is refused while its tasks are unfinished, naming them.
    let refused = d.run(&["deployments", "rm", "worker", "1"]);
    assert_eq!(refused.code, Some(3), "{refused:?}");
    assert!(
        refused.stderr.contains("is still used by unfinished tasks")
            && refused.stderr.contains(&format!("id {queued}")),
        "{}",
        refused.stderr
    );
    // Each ends on the version it was submitted with.
    let first = ok(d.run(&["wait", &running, "--json"])).json();
    assert_eq!(first["output"], "slept 1500 ms", "{first}");
    let second = ok(d.run(&["wait", &queued, "--json"])).json();
    assert_eq!(second["output"], "slept 10 ms", "{second}");
    let third = ok(d.run(&["wait", &fresh, "--json"])).json();
    assert_eq!(third["output"], "new", "{third}");
    let ps = rows(d.run(&["ps", "--all", "--json"]));
    let plugin_of = |id: &str| {
        ps.iter()
            .find(|r| r["id"].as_u64().map(|n| n.to_string()).as_deref() == Some(id))
            .map(|r| r["plugin"].as_str().unwrap().to_owned())
    };
    assert_eq!(plugin_of(&queued).as_deref(), Some("worker@1"), "{ps:?}");
    assert_eq!(plugin_of(&fresh).as_deref(), Some("worker@2"), "{ps:?}");
    // A rollback is a deploy of the earlier version: recorded, at once.
    let out = ok(d.run(&["rollback", "worker"]));
    assert!(
        out.stderr.contains("worker@1 is current again"),
        "{}",
        out.stderr
    );
    let out = ok(d.run(&["submit", "worker", "--param", "ms=5", "--wait"]));
    assert_eq!(out.stdout, "slept 5 ms");
    // By version and by digest.
    let out = ok(d.run(&["submit", "worker@2", "--input", "two", "--wait"]));
    assert_eq!(out.stdout, "two");
    let hello = std::fs::read(p("hello")).unwrap();
    let digest = {
        use sha2::Digest as _;
        format!("{:x}", sha2::Sha256::digest(&hello))
    };
    let by_digest = format!("worker@sha256:{digest}");
    let out = ok(d.run(&["submit", &by_digest, "--input", "d", "--wait"]));
    assert_eq!(out.stdout, "d");
    // Unknown names and versions are told with the fix.
    let out = d.run(&["submit", "nobody", "--wait"]);
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("no deployment named `nobody`"),
        "{}",
        out.stderr
    );
    let out = d.run(&["submit", "worker@9", "--wait"]);
    assert!(
        out.stderr.contains("has no version 9; its versions: 1, 2"),
        "{}",
        out.stderr
    );
    // A version keeps its bytes.
    let out = d.run(&[
        "deploy",
        &p("sleeper"),
        "--name",
        "worker",
        "--version",
        "2",
    ]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(
        out.stderr.contains("a version's bytes never change"),
        "{}",
        out.stderr
    );
    // The current version is never removed; another one, once unused, is.
    let out = d.run(&["deployments", "rm", "worker", "1"]);
    assert!(
        out.stderr.contains("is the current version"),
        "{}",
        out.stderr
    );
    ok(d.run(&["deployments", "rm", "worker", "2"]));
    let history = rows(d.run(&["deployments", "history", "worker", "--json"]));
    let what: Vec<(&str, &str)> = history
        .iter()
        .map(|r| (r["what"].as_str().unwrap(), r["version"].as_str().unwrap()))
        .collect();
    assert_eq!(
        what,
        [
            ("remove", "2"),
            ("rollback", "1"),
            ("deploy", "2"),
            ("deploy", "1")
        ]
    );
    // All of it is kept across a SIGKILL and a restart.
    d.kill_9();
    d.restart(&[]);
    assert_eq!(current(&d, "worker"), "1");
    assert_eq!(
        rows(d.run(&["deployments", "history", "worker", "--json"])).len(),
        4
    );
    let out = ok(d.run(&["submit", "worker", "--param", "ms=1", "--wait"]));
    assert_eq!(out.stdout, "slept 1 ms");
    // A deployed version holds its plugin as a task does: pruning keeps
    // one no task has used yet.
    ok(d.run(&["deploy", &p("chatty"), "--name", "quiet", "--version", "1"]));
    ok(d.run(&["plugins", "prune"]));
    let out = ok(d.run(&["submit", "quiet", "--param", "lines=1", "--wait"]));
    assert_eq!(out.stdout, "chatty done");
}

#[test]
fn a_schedule_follows_its_names_current_version() {
    let d = Daemon::start(&[]);
    ok(d.run(&["deploy", &p("hello"), "--name", "greet", "--version", "1"]));
    ok(d.run(&[
        "schedule",
        "add",
        "tick",
        "--cron",
        "0 0 1 1 *",
        "greet",
        "--input",
        "from v1",
    ]));
    ok(d.run(&[
        "schedule",
        "add",
        "pinned",
        "--cron",
        "0 0 1 1 *",
        "greet@1",
        "--input",
        "pinned",
    ]));
    let first = ok(d.run(&["schedule", "run", "tick", "--wait", "--json"])).json();
    assert_eq!(first["output"], "from v1", "{first}");
    // Version 2 (the sleeper) is what the next firing runs.
    ok(d.run(&["deploy", &p("sleeper"), "--name", "greet", "--version", "2"]));
    let second = ok(d.run(&["schedule", "run", "tick", "--wait", "--json"])).json();
    assert!(
        second["output"].as_str().unwrap().starts_with("slept"),
        "{second}"
    );
    // A pinned schedule keeps its version, which is then in use.
    let pinned = ok(d.run(&["schedule", "run", "pinned", "--wait", "--json"])).json();
    assert_eq!(pinned["output"], "pinned", "{pinned}");
    let out = d.run(&["deployments", "rm", "greet", "1"]);
    assert!(out.stderr.contains("schedules pinned"), "{}", out.stderr);
    ok(d.run(&["schedule", "rm", "pinned"]));
    ok(d.run(&["deployments", "rm", "greet", "1"]));
}

#[test]
fn children_are_spawned_by_deployment() {
    let d = Daemon::start(&[]);
    ok(d.run(&["deploy", &p("hello"), "--name", "echo", "--version", "1"]));
    // Each child of `echo` answers its input, `i`: 0 + 1 + 2.
    let done = ok(d.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "child=echo",
        "--wait",
        "--json",
    ]))
    .json();
    let output: Value = serde_json::from_str(done["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["sum"], 3, "{output}");
    let ps = rows(d.run(&["ps", "--all", "--json"]));
    let children: Vec<_> = ps.iter().filter(|r| r["plugin"] == "echo@1").collect();
    assert_eq!(children.len(), 3, "{ps:?}");
    // An idempotency key holds the request as given: the same submission
    // of the name after a deploy is the task it first made.
    let keyed = ["echo", "--idempotency-key", "k1", "--input", "once"];
    let first = d.submit(&keyed);
    // A pinned version, and one that is not there.
    ok(d.run(&["deploy", &p("sleeper"), "--name", "echo", "--version", "2"]));
    assert_eq!(d.submit(&keyed), first);
    let done = ok(d.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "child=echo@1",
        "--param",
        "n=2",
        "--wait",
        "--json",
    ]))
    .json();
    assert!(
        done["output"].as_str().unwrap().contains("\"sum\":1"),
        "{done}"
    );
    let out = d.run(&["submit", &p("fanout"), "--param", "child=echo@9", "--wait"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("cannot start a child: deployment `echo` has no version 9"),
        "{out:?}"
    );
}

#[test]
fn the_json_api_and_a_wasi_command_take_deployments() {
    let d = Daemon::start(&["--http", "127.0.0.1:0"]);
    let api = http::Api::of(&d);
    ok(d.run(&["deploy", &p("hello"), "--name", "echo", "--version", "1.0"]));
    let body = serde_json::json!({"plugin": "echo", "name": "api-echo", "input": "x"});
    let answer = api.request(
        "POST",
        "/api/tasks",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    assert_eq!(answer.status, 201, "{answer:?}");
    let out = ok(d.run(&["wait", "api-echo"]));
    assert_eq!(out.stdout, "x");
    let body = serde_json::json!({"plugin": "missing@1.0"});
    let answer = api.request(
        "POST",
        "/api/tasks",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    assert_eq!(answer.status, 404, "{answer:?}");
    // The verbs as routes, in the CLI's JSON shapes.
    let json = [("Content-Type", "application/json")];
    let sleeper = format!(
        "{}",
        taskhost::runtime::Digest::of(&std::fs::read(p("sleeper")).unwrap())
    );
    let unknown = api.request("POST", "/api/deployments", &json, r#"{"plugin": "00"}"#);
    assert_eq!(unknown.status, 400, "{unknown:?}");
    // POST /api/deployments takes a stored plugin: deploying `spare`
    // stores the sleeper.
    ok(d.run(&["deploy", &p("sleeper"), "--name", "spare", "--version", "0"]));
    let body = serde_json::json!({"plugin": sleeper, "name": "echo", "version": "2.0"});
    let deployed = api.request("POST", "/api/deployments", &json, &body.to_string());
    assert_eq!(deployed.status, 200, "{deployed:?}");
    assert_eq!(deployed.json()[0]["version"], "2.0", "{deployed:?}");
    assert_eq!(current(&d, "echo"), "2.0");
    let listed = api.request("GET", "/api/deployments", &[], "");
    assert_eq!(listed.status, 200, "{listed:?}");
    let echo = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "echo")
        .cloned();
    assert_eq!(echo.unwrap()["versions"], 2, "{listed:?}");
    let back = api.request("POST", "/api/deployments/echo/rollback", &json, "");
    assert_eq!(back.status, 200, "{back:?}");
    assert_eq!(back.json()[0]["what"], "rollback", "{back:?}");
    assert_eq!(current(&d, "echo"), "1.0");
    let history = api.request("GET", "/api/deployments/echo", &[], "");
    let words: Vec<_> = history
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["what"].clone())
        .collect();
    assert_eq!(words, ["rollback", "deploy", "deploy"], "{history:?}");
    let current_one = api.request("DELETE", "/api/deployments/echo?version=1.0", &[], "");
    assert_eq!(current_one.status, 409, "{current_one:?}");
    let removed = api.request("DELETE", "/api/deployments/echo?version=2.0", &[], "");
    assert_eq!(removed.status, 200, "{removed:?}");
    assert_eq!(
        api.request("GET", "/api/deployments/nothing", &[], "")
            .status,
        404
    );
    // A WASI command names itself only by --name.
    let out = d.run(&["deploy", &p("command-probe")]);
    assert!(out.stderr.contains("declares no name"), "{}", out.stderr);
    ok(d.run(&[
        "deploy",
        &p("command-probe"),
        "--name",
        "probe",
        "--version",
        "1",
    ]));
    let out = ok(d.run(&["submit", "probe", "--wait", "--", "echo", "x"]));
    assert!(
        out.stdout.starts_with("probe-") && out.stdout.ends_with("\nx\n"),
        "named after the deployment: {:?}",
        out.stdout
    );
}

#[test]
fn a_deployment_is_the_same_on_every_node_of_a_cluster() {
    let pg = postgres::Postgres::start();
    let one = cluster::node(&pg, "n1", &[]);
    let two = cluster::node(&pg, "n2", &[]);
    ok(one.run(&[
        "deploy",
        &p("sleeper"),
        "--name",
        "worker",
        "--version",
        "1",
    ]));
    // The other node answers the same version as soon as deploy returned.
    assert_eq!(current(&two, "worker"), "1");
    let running = two.submit(&["worker", "--slot", "w", "--param", "ms=1500"]);
    cluster::wait_until(&two, &format!("worker-{running}"), "running", None);
    let queued = one.submit(&["worker", "--slot", "w", "--param", "ms=10"]);
    ok(two.run(&["deploy", &p("hello"), "--name", "worker", "--version", "2"]));
    assert_eq!(current(&one, "worker"), "2");
    let refused = one.run(&["deployments", "rm", "worker", "1"]);
    assert_eq!(refused.code, Some(3), "{refused:?}");
    assert!(
        refused.stderr.contains(&format!("id {queued}")),
        "{}",
        refused.stderr
    );
    let fresh = one.submit(&["worker", "--input", "new"]);
    let first = ok(one.run(&["wait", &running, "--json"])).json();
    assert_eq!(first["output"], "slept 1500 ms", "{first}");
    let second = ok(two.run(&["wait", &queued, "--json"])).json();
    assert_eq!(second["output"], "slept 10 ms", "{second}");
    let third = ok(two.run(&["wait", &fresh, "--json"])).json();
    assert_eq!(third["output"], "new", "{third}");
    // A rollback on one node is the other's current version at once.
    ok(two.run(&["rollback", "worker"]));
    assert_eq!(current(&one, "worker"), "1");
    let out = ok(one.run(&["submit", "worker", "--param", "ms=3", "--wait"]));
    assert_eq!(out.stdout, "slept 3 ms");
    let history = rows(one.run(&["deployments", "history", "worker", "--json"]));
    assert_eq!(history.len(), 3, "{history:?}");
    ok(two.run(&["deployments", "rm", "worker", "2"]));
    // A deployed version holds its plugin in the database: pruning keeps it.
    ok(one.run(&["deploy", &p("chatty"), "--name", "quiet", "--version", "1"]));
    ok(two.run(&["plugins", "prune"]));
    let out = ok(two.run(&["submit", "quiet", "--param", "lines=1", "--wait"]));
    assert_eq!(out.stdout, "chatty done");
    // A schedule of the name follows it on every node; one of a version
    // keeps it, and holds it against removal.
    for (name, plugin) in [("tick", "worker"), ("pinned", "worker@1")] {
        ok(one.run(&[
            "schedule",
            "add",
            name,
            "--cron",
            "0 0 1 1 *",
            plugin,
            "--param",
            "ms=1",
            "--input",
            "fired",
        ]));
    }
    let out = ok(two.run(&["schedule", "run", "tick", "--wait"]));
    assert_eq!(out.stdout, "slept 1 ms");
    ok(one.run(&["deploy", &p("hello"), "--name", "worker", "--version", "3"]));
    let out = ok(two.run(&["schedule", "run", "tick", "--wait"]));
    assert_eq!(out.stdout, "fired");
    let out = ok(one.run(&["schedule", "run", "pinned", "--wait"]));
    assert_eq!(out.stdout, "slept 1 ms");
    let refused = two.run(&["deployments", "rm", "worker", "1"]);
    assert_eq!(refused.code, Some(3), "{refused:?}");
    assert!(
        refused.stderr.contains("schedules pinned"),
        "{}",
        refused.stderr
    );
    ok(two.run(&["schedule", "rm", "pinned"]));
    ok(two.run(&["deployments", "rm", "worker", "1"]));
    // Children by deployment, on a node that never saw the deploy.
    let done = ok(two.run(&[
        "submit",
        &p("fanout"),
        "--param",
        "child=worker",
        "--wait",
        "--json",
    ]))
    .json();
    assert!(
        done["output"].as_str().unwrap().contains("\"sum\":3"),
        "{done}"
    );
    // An idempotency key holds the request as given: the same submission
    // of the name after a deploy is the task it first made.
    let keyed = ["worker", "--idempotency-key", "k1", "--input", "once"];
    let first = one.submit(&keyed);
    ok(two.run(&[
        "deploy",
        &p("sleeper"),
        "--name",
        "worker",
        "--version",
        "4",
    ]));
    assert_eq!(two.submit(&keyed), first);
}
