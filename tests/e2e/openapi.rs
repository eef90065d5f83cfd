//! The JSON API as other programs use it, through its OpenAPI document
//! (`GET /api/openapi.json`) served by a live daemon: schemathesis checks
//! the daemon against the document; openapi-python-client and
//! openapi-typescript turn the document into a Python client and
//! TypeScript types, which must cover every operation and type every body
//! the document describes, and the programs of `tests/clients/` drive the
//! API with them (upload, submit, long-poll the outcome, a batch, the task
//! list, cancel).
//!
//! The tools are the versions `cargo xtask test` installs (xtask's
//! components: schemathesis and openapi-python-client from PyPI,
//! openapi-typescript, TypeScript and openapi-fetch by `npm ci` in
//! `tests/clients/ts`); a missing one fails its test, naming the install.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::daemon::{Daemon, p};
use crate::generated::{Operation, operations, python_untyped, snake, typescript_untyped};
use crate::http::{self, Api};

/// The token of the daemon's token file (admin scope: every route).
const TOKEN: &str = "admin-token";

/// Bounds on the tools' runs: generous, a run takes seconds to a minute.
const SCHEMATHESIS_LIMIT: Duration = Duration::from_secs(15 * 60);
const TOOL_LIMIT: Duration = Duration::from_secs(5 * 60);

/// Routes schemathesis leaves alone: shutdown ends the daemon, the others
/// do not end (the wire's WebSocket, the event stream, a log followed).
const NOT_FUZZED: &[&str] = &[
    "/api/shutdown",
    "/api/wire",
    "/api/events",
    "/api/tasks/{task}/logs",
];

/// A daemon listening on `--http 127.0.0.1:0` with a token file holding
/// [`TOKEN`]; its port.
struct Served {
    daemon: Daemon,
    port: u16,
    _tokens: tempfile::TempDir,
}

impl Served {
    fn start() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let tokens = tempfile::tempdir().unwrap();
        let file = tokens.path().join("tokens");
        std::fs::write(&file, format!("# scope token\n{TOKEN}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = file.display().to_string();
        let daemon = Daemon::start(&["--http", "127.0.0.1:0", "--http-token-file", &file]);
        let port = http::http_port(&daemon);
        Self {
            daemon,
            port,
            _tokens: tokens,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The document, written to `dir/openapi.json`; and as JSON.
    fn document(&self, dir: &Path) -> (PathBuf, Value) {
        let api = Api {
            port: self.port,
            token: TOKEN.into(),
        };
        let answer = api.get("/api/openapi.json");
        assert_eq!(answer.status, 200, "{}", answer.body);
        let path = dir.join("openapi.json");
        std::fs::write(&path, &answer.body).unwrap();
        (path, answer.json())
    }
}

/// The repository's root.
fn root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// `name` on `PATH`, or a failure naming how to install it.
fn on_path(name: &str, install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH: this test runs it for real. Install it with \
                 `{install}`, or let `cargo xtask setup` (`cargo xtask test`) install it"
            )
        })
}

/// A program of `tests/clients/ts/node_modules/.bin`, or a failure naming
/// how to install it.
fn npm_bin(name: &str) -> PathBuf {
    let ts = root().join("tests/clients/ts");
    let bin = ts.join("node_modules/.bin").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: this test runs it for real. Install it with `(cd {} && npm ci)`, \
         or let `cargo xtask setup` (`cargo xtask test`) install it",
        bin.display(),
        ts.display()
    );
    bin
}

/// What a finished program wrote, and its exit code.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Its exit code and the last `lines` lines of its output, for a message.
    fn tail(&self, lines: usize) -> String {
        let both = self.both();
        let all: Vec<&str> = both.lines().collect();
        let from = all.len().saturating_sub(lines);
        format!(
            "exit code {:?}; its last {} lines:\n{}",
            self.code,
            all.len() - from,
            all[from..].join("\n")
        )
    }
}

/// Runs `cmd` to its end, killed (and the test failed) after `limit`.
fn run(cmd: &mut Command, what: &str, limit: Duration) -> Ran {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let pid = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = tx.send((text, child.wait()));
    });
    let Ok((stdout, status)) = rx.recv_timeout(limit) else {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("{what} did not end within {limit:?}: killed");
    };
    Ran {
        code: status.expect("wait").code(),
        stdout,
        stderr: err.join().unwrap_or_default(),
    }
}

#[test]
fn schemathesis_finds_the_daemon_as_its_document_says() {
    let schemathesis = on_path(
        "schemathesis",
        "python3 -m pip install schemathesis==4.32.5",
    );
    let mut served = Served::start();
    let work = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(schemathesis);
    cmd.current_dir(work.path())
        .arg("--config-file")
        .arg(root().join("tests/clients/schemathesis.toml"))
        .arg("run")
        .arg(format!("{}/api/openapi.json", served.url()))
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        // Repeatable: the same cases each run.
        .args(["--max-examples", "30", "--seed", "53"])
        .args(["--request-timeout", "60"])
        .args(["--generation-database", "none", "--no-color"]);
    for path in NOT_FUZZED {
        cmd.args(["--exclude-path", path]);
    }
    let ran = run(&mut cmd, "schemathesis", SCHEMATHESIS_LIMIT);
    let output = ran.both();
    // `Selected: 28/32`: every path left out is one of the document's.
    let selected = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Selected: "))
        .and_then(|s| s.split_once('/'))
        .and_then(|(n, all)| Some((n.parse::<usize>().ok()?, all.parse::<usize>().ok()?)));
    let Some((selected, all)) = selected else {
        panic!("schemathesis did not test the document: {}", ran.tail(80));
    };
    assert_eq!(
        all - selected,
        NOT_FUZZED.len(),
        "schemathesis left out {} operations, not the {} of {NOT_FUZZED:?}: one is no longer \
         in the document under that path",
        all - selected,
        NOT_FUZZED.len()
    );
    // `___ METHOD /path ___` heads each operation's failures and errors.
    let mut failing: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("___") && l.ends_with("___"))
        .map(|l| l.trim_matches(|c| c == '_' || c == ' '))
        .collect();
    failing.sort_unstable();
    failing.dedup();
    assert_eq!(
        ran.code,
        Some(0),
        "schemathesis found the daemon unlike its document; operations with failures or \
         errors: {failing:?}\n{}",
        ran.tail(80)
    );
    // None of it ended the daemon (shutdown is excluded by its path).
    served.daemon.assert_alive();
}

#[test]
fn a_python_client_generated_from_the_document_drives_the_api() {
    let generator = on_path(
        "openapi-python-client",
        "python3 -m pip install openapi-python-client==0.29.1",
    );
    let served = Served::start();
    let work = tempfile::tempdir().unwrap();
    let (doc_path, doc) = served.document(work.path());
    let package = work.path().join("gen").join("taskhost_api");
    let generated = run(
        Command::new(generator)
            .current_dir(work.path())
            .args(["generate", "--meta", "none", "--config"])
            .arg(root().join("tests/clients/python/generator.yaml"))
            .arg("--path")
            .arg(&doc_path)
            .arg("--output-path")
            .arg(&package),
        "openapi-python-client",
        TOOL_LIMIT,
    );
    assert_eq!(
        generated.code,
        Some(0),
        "openapi-python-client could not generate a client from the document: {}",
        generated.tail(60)
    );
    let mut problems = Vec::new();
    // Any warning: an endpoint, a body or a parameter left out.
    if generated.both().to_lowercase().contains("warning") {
        problems.push(format!(
            "openapi-python-client warned (what it warns of is not generated):\n{}",
            generated.both().trim()
        ));
    }
    problems.extend(python_untyped(&package, &operations(&doc)));

    let program = root().join("tests/clients/python/client_test.py");
    let ran = run(
        Command::new("python3")
            .arg(&program)
            .args(["--url", &served.url(), "--token", TOKEN])
            .args(["--plugin", &p("hello"), "--sleeper", &p("sleeper")])
            .env("PYTHONPATH", package.parent().unwrap()),
        "the Python client program",
        TOOL_LIMIT,
    );
    if ran.code != Some(0) {
        problems.push(format!("{} failed: {}", program.display(), ran.tail(40)));
    }
    assert!(
        problems.is_empty(),
        "the Python client of the document:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn a_typescript_client_generated_from_the_document_drives_the_api() {
    let generator = npm_bin("openapi-typescript");
    let tsc = npm_bin("tsc");
    let node = on_path("node", "apt-get install -y nodejs npm");
    let served = Served::start();
    let work = tempfile::tempdir().unwrap();
    let (doc_path, doc) = served.document(work.path());
    // The program, its compiler settings and the project's packages beside
    // the generated types, as in tests/clients/ts itself.
    let ts = root().join("tests/clients/ts");
    for file in ["client_test.ts", "tsconfig.json", "package.json"] {
        std::fs::copy(ts.join(file), work.path().join(file)).unwrap();
    }
    std::os::unix::fs::symlink(ts.join("node_modules"), work.path().join("node_modules")).unwrap();
    let generated = run(
        Command::new(generator)
            .current_dir(work.path())
            .arg(&doc_path)
            // A request property with a default may be left out: without
            // this, openapi-typescript makes it required in a component.
            .args(["--default-non-nullable", "false"])
            .args(["-o", "api.d.ts"]),
        "openapi-typescript",
        TOOL_LIMIT,
    );
    assert_eq!(
        generated.code,
        Some(0),
        "openapi-typescript could not generate types from the document: {}",
        generated.tail(60)
    );
    let types = std::fs::read_to_string(work.path().join("api.d.ts")).unwrap();
    let mut problems = typescript_untyped(&types, &operations(&doc));

    let compiled = run(
        Command::new(tsc)
            .current_dir(work.path())
            .args(["-p", "tsconfig.json"]),
        "tsc",
        TOOL_LIMIT,
    );
    if compiled.code != Some(0) {
        problems.push(format!(
            "tests/clients/ts/client_test.ts does not compile against the generated types: {}",
            compiled.tail(60)
        ));
    } else {
        let ran = run(
            Command::new(node)
                .current_dir(work.path())
                .arg("out/client_test.js")
                .args([&served.url(), TOKEN, &p("hello"), &p("sleeper")]),
            "the TypeScript client program",
            TOOL_LIMIT,
        );
        if ran.code != Some(0) {
            problems.push(format!(
                "tests/clients/ts/client_test.ts failed: {}",
                ran.tail(40)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the TypeScript client of the document:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn the_checks_of_the_typescript_types_see_untyped_bodies() {
    // The checks themselves, on what the generators make of a body without
    // a schema and of one with: the first is found, the second is not.
    let types = r#"
export interface operations {
    submitTask: {
        requestBody: {
            content: {
                "application/json": components["schemas"]["Task"];
            };
        };
        responses: {
            /** @description an {"error": …} */
            201: {
                headers: {
                    [name: string]: unknown;
                };
                content: {
                    "application/json": unknown;
                };
            };
            401: {
                headers: {
                    [name: string]: unknown;
                };
                content?: never;
            };
        };
    };
}
export interface components {
    schemas: {
        Task: {
            plugin: string;
        };
        Open: Record<string, never>;
    };
}
"#;
    let op = submit_task();
    let found = typescript_untyped(types, std::slice::from_ref(&op));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("submitTask 201") && found[0].contains("`unknown`"),
        "{found:?}"
    );
    // The 201's body as each of these: found untyped or not.
    let body = "\"application/json\": unknown;";
    let with = |ty: &str| types.replace(body, &format!("\"application/json\": {ty};"));
    for (ty, untyped) in [
        ("components[\"schemas\"][\"Task\"]", false),
        ("components[\"schemas\"][\"Task\"] | null", false),
        ("components[\"schemas\"][\"Task\"][]", false),
        ("{\n id: number;\n extra: unknown;\n }", false),
        ("string", false),
        ("components[\"schemas\"][\"Open\"]", true),
        ("components[\"schemas\"][\"Absent\"]", true),
        ("{\n [key: string]: unknown;\n }", true),
        ("Record<string, never>", true),
        ("unknown[]", true),
        ("(components[\"schemas\"][\"Task\"] | unknown)[]", true),
    ] {
        let found = typescript_untyped(&with(ty), std::slice::from_ref(&op));
        assert_eq!(found.len(), usize::from(untyped), "{ty}: {found:?}");
    }
    let missing = Operation {
        id: Some("getOutcome".into()),
        ..op
    };
    let typed = with("string");
    assert_eq!(typescript_untyped(&typed, &[missing]).len(), 1);

    assert_eq!(snake("listSlotRules"), "list_slot_rules");
    assert_eq!(snake("openapi"), "openapi");
    assert_eq!(snake("getTaskLogs"), "get_task_logs");
}

#[test]
fn the_checks_of_the_python_client_see_untyped_bodies() {
    // A generated package in miniature, as openapi-python-client 0.29
    // writes it: an operation with a model body, a typed 201, a list
    // answer and the 401 without a body; a typed model and an open one.
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("taskhost_api");
    std::fs::create_dir_all(package.join("api/default")).unwrap();
    std::fs::create_dir_all(package.join("models")).unwrap();
    let model = |name: &str, fields: &str| {
        format!(
            "@_attrs_define\nclass {name}:\n    \"\"\"A model.\n\n    Attributes:\n        \
             x (int): no field\n    \"\"\"\n\n{fields}    additional_properties: dict[str, Any] = \
             _attrs_field(init=False, factory=dict)\n\n    def to_dict(self) -> dict[str, Any]:\n"
        )
    };
    let write = |path: &str, text: &str| std::fs::write(package.join(path), text).unwrap();
    write(
        "models/task.py",
        &model("Task", "    plugin: str\n    name: None | str | Unset\n"),
    );
    write("models/open_.py", &model("Open", ""));
    let module = |body: &str, answer: &str| {
        format!(
            "from ...models.task import Task\nfrom ...models.open_ import Open\n\n\
             def _get_kwargs(\n    *,\n    body: {body},\n) -> dict[str, Any]:\n    pass\n\n\n\
             def _parse_response(\n    *, client: AuthenticatedClient | Client, response: \
             httpx.Response\n) -> Task | None:\n    if response.status_code == 201:\n\
             {answer}\n        return response_201\n\n    if response.status_code == 401:\n\
             \x20       response_401 = cast(Any, None)\n        return response_401\n\n    \
             if client.raise_on_unexpected_status:\n        raise\n\n\n\
             def _build_response(\n"
        )
    };
    let op = submit_task();
    let typed = "        response_201 = Task.from_dict(response.json())";
    let list = "        response_201 = []\n        _response_201 = response.json()\n        \
                for item in _response_201:\n            response_201.append(Task.from_dict(item))";
    for (body, answer, found) in [
        ("Task", typed, 0),
        ("Task | Unset = UNSET", list, 0),
        ("Any | Unset = UNSET", typed, 1),
        ("Open", typed, 1),
        ("Task", "        response_201 = response.json()", 1),
        (
            "Task",
            "        response_201 = cast(list[Any], response.json())",
            1,
        ),
        (
            "Task",
            "        response_201 = Open.from_dict(response.json())",
            1,
        ),
        ("Open", "        response_201 = cast(Any, None)", 2),
    ] {
        write("api/default/submit_task.py", &module(body, answer));
        let problems = python_untyped(&package, std::slice::from_ref(&op));
        assert_eq!(problems.len(), found, "{body} / {answer}: {problems:?}");
    }
    let missing = Operation {
        id: Some("getOutcome".into()),
        ..op
    };
    let problems = python_untyped(&package, &[missing]);
    assert!(problems[0].contains("not generated"), "{problems:?}");
}

/// `POST /api/tasks` as the checks' examples name it.
fn submit_task() -> Operation {
    Operation {
        method: "post".into(),
        path: "/api/tasks".into(),
        id: Some("submitTask".into()),
        request: vec!["application/json".into()],
        responses: vec![("201".into(), vec!["application/json".into()])],
    }
}
