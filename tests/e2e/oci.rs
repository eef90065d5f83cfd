//! Plugins through an OCI registry: `host push` of a file and of a
//! deployment, `host deploy oci://…` by tag and by digest, with TLS from a
//! private CA and basic auth (from flags and from a Docker config file),
//! against a real `docker-registry` on 127.0.0.1; a wrong digest, tampered
//! bytes, missing credentials, an unknown CA and a registry that is down
//! each refused with a clear error and no partial deployment.

use std::io::Write;
use std::process::Stdio;

use crate::common::{self, Finished};
use crate::daemon::{Daemon, p};
use crate::registry::{PASSWORD, Registry, USER};

use serde_json::Value;
use taskhost::runtime::Digest;

/// Runs a client verb against `d` with `stdin`, and `docker_config` as
/// the Docker config directory (an empty one: no credentials).
fn run(d: &Daemon, docker_config: &std::path::Path, args: &[&str], stdin: &str) -> Finished {
    let mut child = common::host()
        .args(d.args(args))
        .env("DOCKER_CONFIG", docker_config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn host");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Finished {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(out: Finished) -> Finished {
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out
}

fn deployments(d: &Daemon) -> Vec<Value> {
    ok(d.run(&["deployments", "ls", "--json"]))
        .json()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn push_and_deploy_through_a_registry_with_tls_and_basic_auth() {
    let mut registry = Registry::start();
    let d = Daemon::start(&[]);
    let none = tempfile::tempdir().unwrap();
    let ca = registry.ca_file();
    let with_password = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--registry-ca-file", &ca, "--registry-user", USER]);
        all.push("--registry-password-stdin");
        run(&d, none.path(), &all, &format!("{PASSWORD}\n"))
    };

    // A file pushed with the user's password.
    let hello = registry.url("tools/hello:1.0");
    let out = ok(with_password(&["push", &p("hello"), &hello]));
    let pushed = out.stderr.trim();
    assert!(pushed.contains(&format!("to {hello}@sha256:")), "{pushed}");
    let manifest = pushed.rsplit_once('@').unwrap().1.to_owned();
    // Without credentials the registry refuses, and the error says what to give.
    let refused = run(
        &d,
        none.path(),
        &["push", &p("hello"), &hello, "--registry-ca-file", &ca],
        "",
    );
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(
        refused.stderr.contains("--registry-user"),
        "{}",
        refused.stderr
    );

    // Deployed by tag, with the credentials of a Docker config file.
    let docker = tempfile::tempdir().unwrap();
    let auth = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    };
    let host_port = hello
        .trim_start_matches("oci://")
        .split('/')
        .next()
        .unwrap();
    std::fs::write(
        docker.path().join("config.json"),
        format!(r#"{{"auths":{{"{host_port}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    let deploy = |reference: &str, extra: &[&str]| {
        let mut all = vec!["deploy", reference, "--registry-ca-file", &ca];
        all.extend(extra);
        run(&d, docker.path(), &all, "")
    };
    let out = ok(deploy(&hello, &["--name", "greeter", "--version", "1"]));
    assert!(
        out.stderr.contains("greeter@1 is current"),
        "{}",
        out.stderr
    );
    let done = ok(d.run(&[
        "submit",
        "greeter",
        "--input",
        "from a registry",
        "--wait",
        "--json",
    ]));
    assert_eq!(done.json()["output"], "from a registry", "{}", done.stdout);
    let hello_digest = Digest::of(&std::fs::read(p("hello")).unwrap()).to_string();
    assert_eq!(deployments(&d)[0]["digest"], hello_digest.as_str());

    // A deployment pushed from the daemon, then deployed by its manifest's digest.
    ok(d.run(&[
        "deploy",
        &p("sleeper"),
        "--name",
        "worker",
        "--version",
        "1",
    ]));
    let worker = registry.url("tools/worker:1");
    let out = ok(with_password(&["push", "worker@1", &worker]));
    let worker_manifest = out.stderr.trim().rsplit_once('@').unwrap().1.to_owned();
    let by_digest = registry.url(&format!("tools/worker@{worker_manifest}"));
    ok(deploy(&by_digest, &["--name", "copy", "--version", "1"]));
    let rows = deployments(&d);
    let digest_of = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .map(|r| r["digest"].clone())
            .unwrap()
    };
    assert_eq!(digest_of("copy"), digest_of("worker"), "{rows:?}");

    // Every refusal leaves the deployments as they were.
    let before = deployments(&d);
    let wrong = registry.url(&format!("tools/hello@sha256:{}", "0".repeat(64)));
    let out = deploy(&wrong, &["--name", "greeter", "--version", "2"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("manifest unknown"), "{}", out.stderr);
    assert_ne!(manifest, format!("sha256:{}", "0".repeat(64)));
    let unknown_ca = run(
        &d,
        docker.path(),
        &["deploy", &hello, "--name", "greeter", "--version", "2"],
        "",
    );
    assert_eq!(unknown_ca.code, Some(5), "{unknown_ca:?}");
    assert!(
        unknown_ca.stderr.contains("UnknownIssuer"),
        "{}",
        unknown_ca.stderr
    );
    assert!(
        unknown_ca.stderr.contains("--registry-ca-file"),
        "{}",
        unknown_ca.stderr
    );
    // Bytes changed in the registry's storage (same length) do not match
    // the digest the manifest names.
    let layer = registry.blob_file(&hello_digest);
    let mut tampered = std::fs::read(&layer).unwrap();
    let last = tampered.len() - 1;
    tampered[last] ^= 0xff;
    std::fs::write(&layer, tampered).unwrap();
    let out = deploy(&hello, &["--name", "greeter", "--version", "2"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr.contains("not the ones the manifest names")
            && out.stderr.contains(&hello_digest)
            && out.stderr.contains("nothing deployed"),
        "{}",
        out.stderr
    );
    // A registry that is down.
    registry.stop();
    let out = deploy(&worker, &["--name", "greeter", "--version", "2"]);
    assert_eq!(out.code, Some(5), "{out:?}");
    assert!(
        out.stderr.contains("Connection refused")
            && out.stderr.contains("check that the registry runs"),
        "{}",
        out.stderr
    );
    assert_eq!(deployments(&d), before);
}
