//! Operating a daemon from elsewhere: `host --remote URL` over the HTTP
//! listener (plain on loopback, TLS with a test CA), tokens with scopes,
//! and the JSON API driven by a plain HTTP client.

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use crate::common::{self, Finished};
use crate::daemon::{Daemon, LIMIT, p};
use crate::http::{self, Api};

/// A token file (owner-only) with one token per scope: `read-token`,
/// `submit-token`, `admin-token`; and one file per token for clients.
struct Tokens {
    dir: tempfile::TempDir,
}

impl Tokens {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens { dir };
        tokens.write(
            "tokens",
            "# scope token\nread read-token\nsubmit submit-token\nadmin-token\n",
        );
        for scope in ["read", "submit", "admin"] {
            tokens.write(scope, &format!("{scope}-token\n"));
        }
        tokens.write("wrong", "not-a-token\n");
        tokens
    }

    fn write(&self, name: &str, text: &str) {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// The port of the listening line, `http://` or `https://`.
fn listening_port(daemon: &Daemon) -> u16 {
    let seen = &daemon.process.as_ref().expect("running").stderr_seen;
    let line = seen
        .iter()
        .find(|l| l.contains("taskhost HTTP listening on "))
        .unwrap_or_else(|| panic!("no HTTP listening line in {seen:?}"));
    let rest = line.split("://").nth(1).expect("a URL");
    let addr = rest.split('/').next().expect("an address");
    addr.rsplit(':').next().unwrap().parse().expect("a port")
}

/// A remote client: `host --remote URL [--token-file F] [--ca-file C]`,
/// in an environment where no socket is found.
struct Remote {
    url: String,
    token: Option<String>,
    ca: Option<String>,
    nowhere: tempfile::TempDir,
}

impl Remote {
    fn new(url: String, token: Option<String>) -> Self {
        Remote {
            url,
            token,
            ca: None,
            nowhere: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, args: &[&str]) -> Finished {
        let mut cmd = common::host();
        cmd.env("TASKHOST_SOCKET", self.nowhere.path().join("no.sock"))
            .env("XDG_RUNTIME_DIR", self.nowhere.path())
            .env_remove("TASKHOST_TOKEN")
            .env_remove("TASKHOST_URL")
            .args(["--remote", &self.url]);
        if let Some(token) = &self.token {
            cmd.args(["--token-file", token]);
        }
        if let Some(ca) = &self.ca {
            cmd.args(["--ca-file", ca]);
        }
        let out = cmd.args(args).output().expect("spawn host");
        Finished {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A daemon whose listener takes `tokens`, with `extra` flags; its port.
fn serve_with(tokens: &Tokens, extra: &[&str]) -> (Daemon, u16) {
    let file = tokens.file("tokens");
    let mut args = vec!["--http", "127.0.0.1:0", "--http-token-file", file.as_str()];
    args.extend_from_slice(extra);
    let daemon = Daemon::start(&args);
    let port = listening_port(&daemon);
    (daemon, port)
}

/// Uploads the example plugin `name` with `PUT /api/plugins/{sha256}`;
/// its digest (hex).
fn put_plugin(api: &Api, name: &str) -> String {
    let bytes = std::fs::read(common::plugin(name)).unwrap();
    let digest = sha256_hex(&bytes);
    let bearer = api.bearer();
    let put = http::request_bytes(
        api.port,
        "PUT",
        &format!("/api/plugins/{digest}"),
        &[("Authorization", bearer.as_str())],
        &bytes,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    digest
}

fn all_tasks(daemon: &Daemon) -> usize {
    let out = daemon.run(&["ps", "--all", "--json"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    serde_json::from_str::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .len()
}

#[test]
fn every_verb_works_remotely_with_the_sockets_output_and_exit_codes() {
    let tokens = Tokens::new();
    let (mut daemon, port) = serve_with(&tokens, &[]);
    let url = format!("http://127.0.0.1:{port}");
    let admin = Remote::new(url.clone(), Some(tokens.file("admin")));
    let submitter = Remote::new(url.clone(), Some(tokens.file("submit")));

    // submit --wait from a machine with no socket: the same output and code.
    let hello = p("hello");
    let remote = submitter.run(&["submit", &hello, "--slot", "r", "--input", "hi", "--wait"]);
    let local = daemon.run(&["submit", &hello, "--slot", "l", "--input", "hi", "--wait"]);
    assert_eq!(remote.code, Some(0), "{remote:?}");
    assert_eq!(remote.stdout, local.stdout);
    let failing = submitter.run(&[
        "submit",
        &p("flaky"),
        "--name",
        "broken",
        "--param",
        "fail_times=5",
        "--wait",
    ]);
    assert_eq!(failing.code, Some(1), "{failing:?}");

    // The reads and waits: equal answers, equal codes.
    for args in [
        &["ps", "--all", "--json"][..],
        &["slots", "--json"],
        &["wait", "broken", "--json"],
        &["logs", "broken", "--json"],
        &["logs", "broken", "--follow", "--json"],
        &["wait", "no-such-task"],
        &["plugins", "ls", "--json"],
        &["events", "--task", "broken", "--json"],
    ] {
        let remote = admin.run(args);
        let local = daemon.run(args);
        assert_eq!(remote.code, local.code, "{args:?}: {remote:?} / {local:?}");
        if args.contains(&"ps") || args.contains(&"slots") {
            // Times in state move on between the two calls.
            let shape = |out: &str| {
                let mut v: Value = serde_json::from_str(out).unwrap();
                for row in v.as_array_mut().unwrap() {
                    row.as_object_mut()
                        .unwrap()
                        .retain(|k, _| !k.ends_with("_ms"));
                }
                v
            };
            assert_eq!(shape(&remote.stdout), shape(&local.stdout), "{args:?}");
        } else {
            assert_eq!(remote.stdout, local.stdout, "{args:?}");
        }
    }

    // Follow a live task's events remotely; cancel it remotely (exit 4 for
    // a canceled wait, as over the socket); remove another.
    let read_token = tokens.file("read");
    let (mut follower, lines) = daemon.spawn_stdout_lines(&[
        "--remote",
        &url,
        "--token-file",
        &read_token,
        "events",
        "--follow",
        "--task",
        "nap",
    ]);
    let id = submitter.run(&[
        "submit",
        &p("sleeper"),
        "--name",
        "nap",
        "--param",
        "ms=600000",
    ]);
    assert_eq!(id.code, Some(0), "{id:?}");
    daemon.wait_until_state("nap", "running");
    let waiter = {
        let mut cmd = common::host();
        cmd.args([
            "--remote",
            &url,
            "--token-file",
            &tokens.file("submit"),
            "wait",
            "nap",
        ]);
        common::Running::spawn_command(cmd)
    };
    let canceled = admin.run(&["cancel", "nap"]);
    assert_eq!(canceled.code, Some(0), "{canceled:?}");
    let (status, _) = waiter.finish(LIMIT);
    assert_eq!(status.code(), Some(4), "a canceled task's wait exits 4");
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("the remote follower prints nap's end");
        if line.contains("TaskFinished") && line.contains("outcome=canceled") {
            break;
        }
    }
    let _ = follower.kill();
    let _ = follower.wait();
    let queued = admin.run(&[
        "submit",
        &p("sleeper"),
        "--name",
        "q",
        "--param",
        "ms=600000",
    ]);
    assert_eq!(queued.code, Some(0));
    assert_eq!(admin.run(&["remove", "q"]).code, Some(0));

    let rerun_remote = admin.run(&["rerun", "broken", "--wait"]);
    let rerun_local = daemon.run(&["rerun", "broken", "--wait"]);
    assert_eq!(rerun_remote.code, Some(1), "{rerun_remote:?}");
    assert_eq!(rerun_remote.code, rerun_local.code);

    let version = admin.run(&["version", "--json"]);
    let v: Value = serde_json::from_str(&version.stdout).unwrap();
    assert_eq!(v["daemon"]["version"], v["client"], "{v}");

    // A submit-scoped token cannot shut the daemon down; an admin one can.
    let refused = submitter.run(&["shutdown"]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(
        refused.stderr.contains("scope is submit") && refused.stderr.contains("needs admin"),
        "{}",
        refused.stderr
    );
    let down = admin.run(&["shutdown", "--json"]);
    assert_eq!(down.code, Some(0), "{down:?}");
    let (status, _) = daemon.finish(LIMIT);
    assert!(status.success());
}

#[test]
fn missing_wrong_and_under_scoped_tokens_are_refused_with_nothing_created() {
    let tokens = Tokens::new();
    let (daemon, port) = serve_with(&tokens, &[]);
    let url = format!("http://127.0.0.1:{port}");
    let hello = p("hello");
    let before = all_tasks(&daemon);
    for (token, says) in [
        (
            None,
            "give a token with --token-file FILE or TASKHOST_TOKEN",
        ),
        (Some(tokens.file("wrong")), "is not one the daemon accepts"),
        (
            Some(tokens.file("read")),
            "this token's scope is read, and this needs submit",
        ),
    ] {
        let out = Remote::new(url.clone(), token).run(&["submit", &hello, "--wait"]);
        assert_eq!(out.code, Some(5), "{out:?}");
        assert!(out.stderr.contains(says), "{says}: {}", out.stderr);
    }
    // The JSON API refuses the same way.
    let api = |token: &str| Api {
        port: listening_port(&daemon),
        token: token.into(),
    };
    let digest = sha256_hex(&std::fs::read(common::plugin("hello")).unwrap());
    let body = format!(r#"{{"plugin":"{digest}","input":"hi"}}"#);
    let json = [("Content-Type", "application/json")];
    assert_eq!(
        api("not-a-token")
            .request("POST", "/api/tasks", &json, &body)
            .status,
        401
    );
    assert_eq!(
        api("read-token")
            .request("POST", "/api/tasks", &json, &body)
            .status,
        403
    );
    assert_eq!(api("submit-token").post("/api/shutdown").status, 403);
    assert_eq!(api("read-token").get("/api/tasks").status, 200);
    assert_eq!(all_tasks(&daemon), before, "nothing was created");

    // A token file others can read is refused at start.
    let exposed = tokens.dir.path().join("exposed");
    std::fs::write(&exposed, "admin-token\n").unwrap();
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = common::run_host(&[
        "serve",
        "--socket",
        dir.path().join("h.sock").to_str().unwrap(),
        "--state-dir",
        dir.path().join("state").to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        exposed.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("is open to other users"),
        "{}",
        out.stderr
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn tls_with_a_private_ca_and_refusals_without_it() {
    let certs = tempfile::tempdir().unwrap();
    crate::postgres::make_certificates(certs.path());
    let tokens = Tokens::new();
    let cert = certs.path().join("server.pem");
    let key = certs.path().join("server.key");
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        &tokens.file("tokens"),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let port = listening_port(&daemon);
    let ca = certs.path().join("ca.pem").display().to_string();
    let mut remote = Remote::new(
        format!("https://localhost:{port}"),
        Some(tokens.file("submit")),
    );
    remote.ca = Some(ca.clone());
    let out = remote.run(&["submit", &p("hello"), "--input", "tls", "--wait"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let local = daemon.run(&["submit", &p("hello"), "--input", "tls", "--wait"]);
    assert_eq!(out.stdout, local.stdout);

    // Without the CA: the certificate does not verify, and the message
    // names the fix.
    remote.ca = None;
    let out = remote.run(&["ps"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(out.stderr.contains("--ca-file"), "{}", out.stderr);
    // Plain HTTP to the TLS port gets no answer it can use.
    let plain = Remote::new(
        format!("http://127.0.0.1:{port}"),
        Some(tokens.file("submit")),
    );
    let out = plain.run(&["ps"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(out.stderr.contains("https://"), "{}", out.stderr);

    // A renewed certificate is served after SIGHUP without a restart.
    let again = tempfile::tempdir().unwrap();
    crate::postgres::make_certificates(again.path());
    std::fs::copy(again.path().join("server.pem"), &cert).unwrap();
    std::fs::copy(again.path().join("server.key"), &key).unwrap();
    daemon.process.as_ref().unwrap().signal("HUP");
    remote.ca = Some(again.path().join("ca.pem").display().to_string());
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let out = remote.run(&["ps"]);
        if out.code == Some(0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new certificate was never served: {out:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    remote.ca = Some(ca);
    assert_eq!(
        remote.run(&["ps"]).code,
        Some(5),
        "the old CA no longer verifies it"
    );

    // A changed file is noticed without a signal too.
    let third = tempfile::tempdir().unwrap();
    crate::postgres::make_certificates(third.path());
    std::fs::copy(third.path().join("server.key"), &key).unwrap();
    std::fs::copy(third.path().join("server.pem"), &cert).unwrap();
    remote.ca = Some(third.path().join("ca.pem").display().to_string());
    let deadline = std::time::Instant::now() + LIMIT;
    while remote.run(&["ps"]).code != Some(0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the changed certificate was never served"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A self-signed certificate and its key, made in `dir` by the command of
/// docs/remote.md and issue 49 (which marks the certificate `CA:TRUE`):
/// `NAME.pem`, `NAME.key` (owner-only).
fn self_signed(dir: &std::path::Path, name: &str) -> (String, String) {
    let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
    let args = [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &cert,
        "-days",
        "30",
        "-subj",
        "/CN=127.0.0.1",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
    ];
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): the TLS tests need it (Debian: openssl)")
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = dir.join(key);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (
        dir.join(cert).display().to_string(),
        key.display().to_string(),
    )
}

/// Issue 49: the listener's own self-signed certificate as `--ca-file` is
/// pinned (webpki alone refused it: `CaUsedAsEndEntity`); another
/// self-signed certificate, or a host the certificate does not name, is
/// refused naming the fix. Connections idle in no TLS handshake at the
/// cap make room for the client.
#[test]
fn a_self_signed_certificate_is_its_own_ca_file() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(certs.path(), "cert");
    let (other, _) = self_signed(certs.path(), "other");
    let tokens = Tokens::new();
    let daemon = Daemon::start(&[
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        &tokens.file("tokens"),
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--http-max-connections",
        "4",
    ]);
    let port = listening_port(&daemon);
    let mut remote = Remote::new(
        format!("https://127.0.0.1:{port}"),
        Some(tokens.file("submit")),
    );
    remote.ca = Some(cert.clone());
    let out = remote.run(&["submit", &p("hello"), "--input", "pinned", "--wait"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "pinned");
    let out = remote.run(&["ps", "--all"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("hello-1") && out.stdout.contains("finished (completed)"),
        "{}",
        out.stdout
    );

    // Ten connections that never start their TLS handshake take every
    // place; the client's takes the place of the one idle the longest.
    let idle: Vec<std::net::TcpStream> = (0..10)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let out = remote.run(&["ps", "--all"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("hello-1"), "{}", out.stdout);
    drop(idle);

    // Another self-signed certificate: refused, naming the fix.
    remote.ca = Some(other.clone());
    let out = remote.run(&["ps"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "--ca-file {other} does not hold it: give that very certificate"
        )) && out.stderr.contains("basicConstraints=CA:FALSE"),
        "{}",
        out.stderr
    );
    // The right one, but for a name it does not hold.
    let mut by_name = Remote::new(
        format!("https://localhost:{port}"),
        Some(tokens.file("submit")),
    );
    by_name.ca = Some(cert);
    let out = by_name.run(&["ps"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr.contains("does not name localhost")
            && out.stderr.contains("-addext subjectAltName=DNS:localhost"),
        "{}",
        out.stderr
    );
    // Without --ca-file: refused, naming it.
    remote.ca = None;
    let out = remote.run(&["ps"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr
            .contains("give that very certificate (the listener's --tls-cert) with --ca-file"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_plain_http_client_uploads_submits_and_long_polls_the_outcome() {
    let tokens = Tokens::new();
    let (daemon, port) = serve_with(&tokens, &[]);
    let api = Api {
        port,
        token: "submit-token".into(),
    };
    let bytes = std::fs::read(common::plugin("hello")).unwrap();
    let digest = sha256_hex(&bytes);
    let bearer = api.bearer();
    let auth = [("Authorization", bearer.as_str())];
    let put = http::request_bytes(
        port,
        "PUT",
        &format!("/api/plugins/{digest}"),
        &auth,
        &bytes,
    );
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(put.json()["stored"], true);
    let again = http::request_bytes(
        port,
        "PUT",
        &format!("/api/plugins/{digest}"),
        &auth,
        &bytes,
    );
    assert_eq!(again.json()["stored"], false, "a no-op when present");
    let wrong = http::request_bytes(port, "PUT", &format!("/api/plugins/{digest}"), &auth, b"x");
    // Present or not, the body must be the plugin: only who holds it
    // learns that it is stored.
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    let other = sha256_hex(b"not a plugin");
    let bad = http::request_bytes(port, "PUT", &format!("/api/plugins/{other}"), &auth, b"x");
    assert_eq!(bad.status, 400, "{}", bad.body);

    let json = [("Content-Type", "application/json")];
    let body = format!(r#"{{"plugin":"{digest}","input":"over http","slot":"h","name":"web"}}"#);
    let submitted = api.request("POST", "/api/tasks", &json, &body);
    assert_eq!(submitted.status, 201, "{}", submitted.body);
    let id = submitted.json()["id"].as_u64().unwrap();
    let outcome = api.get(&format!("/api/tasks/{id}/outcome?wait=30s"));
    assert_eq!(outcome.status, 200, "{}", outcome.body);
    let waited = daemon.run(&["wait", &id.to_string(), "--json"]);
    let cli: Value = serde_json::from_str(&waited.stdout).unwrap();
    assert_eq!(outcome.json(), cli, "the same result as `host wait --json`");

    // A task still running: the long poll ends after its time with 202.
    let sleeper_digest = put_plugin(&api, "sleeper");
    let body =
        format!(r#"{{"plugin":"{sleeper_digest}","params":{{"ms":"600000"}},"name":"long"}}"#);
    let long = api.request("POST", "/api/tasks", &json, &body);
    assert_eq!(long.status, 201, "{}", long.body);
    let pending = api.get("/api/tasks/long/outcome?wait=50ms");
    assert_eq!(pending.status, 202, "{}", pending.body);
    assert_eq!(pending.json()["outcome"], Value::Null);

    // Invalid requests get the CLI's wording, and nothing is created.
    let before = all_tasks(&daemon);
    for (body, says) in [
        (
            format!(r#"{{"plugin":"{digest}","policy":"sometimes"}}"#),
            "policy",
        ),
        (
            format!(r#"{{"plugin":"{digest}","timeout":"soon"}}"#),
            "timeout",
        ),
        (
            format!(r#"{{"plugin":"{digest}","colour":"red"}}"#),
            "colour",
        ),
        // (A name is a deployment's: `abc` is one that is not there, 404.)
        (
            r#"{"plugin":"sha256:abc"}"#.to_owned(),
            "neither a plugin digest",
        ),
        (
            format!(r#"{{"plugin":"{digest}","max_retries":3,"restart":"never"}}"#),
            "max_retries",
        ),
    ] {
        let answer = api.request("POST", "/api/tasks", &json, &body);
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert!(
            answer.json()["error"].as_str().unwrap().contains(says),
            "{}",
            answer.body
        );
    }
    assert_eq!(all_tasks(&daemon), before);

    // max_retries implies restart on-failure, as --max-retries does.
    let flaky = put_plugin(&api, "flaky");
    let body = format!(
        r#"{{"plugin":"{flaky}","params":{{"fail_times":"2"}},"max_retries":3,"backoff":"1ms,2ms,2,none"}}"#
    );
    let retried = api.request("POST", "/api/tasks", &json, &body);
    assert_eq!(retried.status, 201, "{}", retried.body);
    let id = retried.json()["id"].as_u64().unwrap();
    let outcome = api.get(&format!("/api/tasks/{id}/outcome?wait=30s")).json();
    assert_eq!(outcome["outcome"], "completed", "{outcome}");
    assert_eq!(outcome["attempts"], 3, "{outcome}");

    // Logs, plugins and the version as JSON.
    let logs = api.get("/api/tasks/web/logs");
    assert_eq!(logs.status, 200, "{}", logs.body);
    assert!(logs.json().is_array());
    let plugins = api.get("/api/plugins").json();
    assert!(
        plugins
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["digest"] == format!("sha256:{digest}") || p["digest"] == digest),
        "{plugins}"
    );
    let version = api.get("/api/version").json();
    assert_eq!(version["daemon"], env!("CARGO_PKG_VERSION"));

    // Shutdown with an admin token.
    let admin = Api {
        port,
        token: "admin-token".into(),
    };
    let down = admin.request(
        "POST",
        "/api/shutdown",
        &json,
        r#"{"grace":"0s","cancel_all":true}"#,
    );
    assert_eq!(down.status, 200, "{}", down.body);
    assert_eq!(down.json()["force_aborted"], serde_json::json!(["long"]));
}

#[test]
fn an_idempotency_key_gives_back_its_task_across_a_kill_and_refuses_another_request() {
    let mut daemon = Daemon::start(&[]);
    let hello = p("hello");
    let submit = |daemon: &Daemon, input: &str| {
        daemon.run(&[
            "submit",
            &hello,
            "--slot",
            "k",
            "--input",
            input,
            "--idempotency-key",
            "deploy-42",
        ])
    };
    let first = submit(&daemon, "once");
    assert_eq!(first.code, Some(0), "{first:?}");
    let id = first.stdout.trim().to_owned();
    let again = submit(&daemon, "once");
    assert_eq!(again.code, Some(0), "{again:?}");
    assert_eq!(again.stdout.trim(), id, "the same task");
    assert!(
        again.stderr.contains("already submitted"),
        "{}",
        again.stderr
    );
    let other = submit(&daemon, "twice");
    assert_eq!(other.code, Some(3), "{other:?}");
    assert!(
        other.stderr.contains("deploy-42") && other.stderr.contains(&format!("task id {id}")),
        "{}",
        other.stderr
    );
    let waited = daemon.run(&["wait", &id, "--json"]);
    assert_eq!(waited.code, Some(0));
    assert_eq!(all_tasks(&daemon), 1, "one task");

    // After SIGKILL and a restart the key still names the task, and with
    // --wait gives its outcome.
    let mut process = daemon.process.take().unwrap();
    process.child.kill().unwrap();
    let _ = process.child.wait();
    daemon.restart(&[]);
    let after = daemon.run(&[
        "submit",
        &hello,
        "--slot",
        "k",
        "--input",
        "once",
        "--idempotency-key",
        "deploy-42",
        "--wait",
        "--json",
    ]);
    assert_eq!(after.code, Some(0), "{after:?}");
    let report: Value = serde_json::from_str(&after.stdout).unwrap();
    assert_eq!(report["id"].to_string(), id);
    let first: Value = serde_json::from_str(&waited.stdout).unwrap();
    assert_eq!(report, first);
    assert_eq!(all_tasks(&daemon), 1, "still one task");

    // A key the daemon kept past its retention is free again.
    drop(daemon);
    let short = Daemon::start(&["--idempotency-retention", "1ms"]);
    let one = short.submit(&[&hello, "--idempotency-key", "k"]);
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let two = short.run(&["submit", &hello, "--idempotency-key", "k"]);
        if two.stdout.trim() != one {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the key never expired"
        );
    }
}

#[test]
fn keys_and_reruns_over_the_json_api_and_the_cli() {
    let tokens = Tokens::new();
    let (daemon, port) = serve_with(&tokens, &["--store", "memory"]);
    let api = Api {
        port,
        token: "submit-token".into(),
    };
    let digest = put_plugin(&api, "flaky");
    let headers = [
        ("Content-Type", "application/json"),
        ("Idempotency-Key", "job-7"),
    ];
    let body = format!(r#"{{"plugin":"{digest}","params":{{"fail_times":"9"}},"name":"shaky"}}"#);
    let first = api.request("POST", "/api/tasks", &headers, &body);
    assert_eq!(first.status, 201, "{}", first.body);
    let id = first.json()["id"].as_u64().unwrap();
    let again = api.request("POST", "/api/tasks", &headers, &body);
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.json()["id"].as_u64(), Some(id));
    assert_eq!(again.json()["existing"], true);
    let other = body.replace("\"9\"", "\"1\"");
    let refused = api.request("POST", "/api/tasks", &headers, &other);
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(
        refused.json()["error"]
            .as_str()
            .unwrap()
            .contains(&format!("task id {id}"))
    );
    let failed = api.get(&format!("/api/tasks/{id}/outcome?wait=30s")).json();
    assert_eq!(failed["outcome"], "failed", "{failed}");

    // Rerun through the API: a new task with the same request.
    let json = [("Content-Type", "application/json")];
    let rerun = api.request("POST", &format!("/api/tasks/{id}/rerun"), &json, "{}");
    assert_eq!(rerun.status, 201, "{}", rerun.body);
    let second = rerun.json()["id"].as_u64().unwrap();
    assert_ne!(second, id);
    assert_eq!(rerun.json()["name"], "shaky");
    let read = Api {
        port,
        token: "read-token".into(),
    };
    assert_eq!(
        read.request("POST", &format!("/api/tasks/{id}/rerun"), &json, "{}")
            .status,
        403,
        "a read token cannot rerun"
    );

    // And through the CLI: the same outcome and exit code as the first.
    let out = daemon.run(&["rerun", &second.to_string(), "--wait", "--json"]);
    assert_eq!(out.code, Some(1), "{out:?}");
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["outcome"], "failed");
    assert_eq!(report["name"], "shaky");
    assert_ne!(report["id"].as_u64(), Some(second));
    let missing = daemon.run(&["rerun", "no-such-task"]);
    assert_eq!(missing.code, Some(2), "{missing:?}");
}

#[test]
fn a_durable_rerun_after_a_restart_runs_the_stored_request() {
    let mut daemon = Daemon::start(&[]);
    let id = daemon.submit(&[&p("hello"), "--input", "again", "--name", "greet"]);
    let first = daemon.run(&["wait", &id]);
    assert_eq!(first.code, Some(0));
    daemon.run(&["shutdown"]);
    let _ = daemon.finish(LIMIT);
    daemon.restart(&[]);
    let out = daemon.run(&["rerun", &id, "--wait"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, first.stdout, "the same input, the same output");
}

#[test]
fn the_openapi_document_names_every_route_with_the_scope_it_enforces() {
    let tokens = Tokens::new();
    let (daemon, port) = serve_with(&tokens, &[]);
    let reader = Api {
        port,
        token: "read-token".into(),
    };
    let doc = reader.get("/api/openapi.json");
    assert_eq!(doc.status, 200, "{}", doc.body);
    let doc = doc.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{}", paths.len());
    let below = |scope: &str| match scope {
        "submit" => Some("read-token"),
        "admin" => Some("submit-token"),
        _ => None,
    };
    let mut checked = 0;
    for (path, methods) in paths {
        let concrete = path
            .replace("{task}", "1")
            .replace("{digest}", &"0".repeat(64))
            .replace("{schedule}", "nightly")
            .replace("{deployment}", "worker");
        for (method, operation) in methods.as_object().unwrap() {
            let method = method.to_uppercase();
            let json = [("Content-Type", "application/json")];
            // No token: 401, so the route exists (an unknown one is 404).
            let anonymous = http::request(port, &method, &concrete, &json, "{}");
            assert_eq!(anonymous.status, 401, "{method} {path}: {}", anonymous.body);
            // A token just below the documented scope: 403.
            let scope = operation["x-taskhost-scope"].as_str().unwrap();
            if let Some(token) = below(scope) {
                let api = Api {
                    port,
                    token: token.into(),
                };
                let refused = api.request(&method, &concrete, &json, "{}");
                assert_eq!(
                    refused.status, 403,
                    "{method} {path} ({scope}): {}",
                    refused.body
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 18, "{checked} operations");
    assert_eq!(all_tasks(&daemon), 0, "nothing was created");
}
