//! The components the tests start for real (no test skips when one is
//! missing): what each test needs, how to tell it is there, and how to
//! install it with the platform's package tools. Installs happen only when
//! allowed (root, `--install` or `TASKHOST_INSTALL=1`), each printed before
//! it runs; otherwise the missing ones are listed with the exact commands.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Failure;

/// The componentize-py release the Python examples are built with
/// (`plugins/guests/build.sh` checks the same version).
const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js release pinned in `plugins/guests/js/package-lock.json`.
const COMPONENTIZE_JS: &str = "0.23.0";
/// `plugins/guests/build.sh` refuses older Node.js releases.
const NODE_MAJOR: u32 = 20;
/// The schemathesis release `tests/e2e/openapi.rs` runs against the live
/// daemon's OpenAPI document.
const SCHEMATHESIS: &str = "4.32.5";
/// The openapi-python-client release `tests/e2e/openapi.rs` generates the
/// Python client of the JSON API with.
const OPENAPI_PYTHON_CLIENT: &str = "0.29.1";

/// Whether system-wide installs may happen.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Granted,
    Refused,
}

impl Permission {
    /// Root may install; anyone else only with `TASKHOST_INSTALL=1` (or
    /// `--install`).
    pub fn from_environment() -> Self {
        let asked = std::env::var_os("TASKHOST_INSTALL").is_some_and(|v| v == "1");
        if is_root() || asked {
            Self::Granted
        } else {
            Self::Refused
        }
    }
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// One missing component and how it is installed.
struct Missing {
    /// What is missing and which tests need it.
    what: String,
    install: Install,
}

enum Install {
    /// Debian packages, installed with `apt-get`.
    Apt(&'static [&'static str]),
    /// A pinned package from PyPI (`name==version`), installed with pip:
    /// componentize-py, schemathesis, openapi-python-client.
    Pip(String),
    /// An npm project's packages (componentize-js in `plugins/guests/js`,
    /// openapi-typescript and TypeScript in `tests/clients/ts`) from the
    /// npm registry, by its checked-in lock file: `npm ci` in that folder.
    NpmCi(PathBuf),
}

/// The npm projects whose packages the tests use, each with its checked-in
/// lock file.
struct Projects {
    /// `plugins/guests/js`: componentize-js.
    js: PathBuf,
    /// `tests/clients/ts`: openapi-typescript, TypeScript, openapi-fetch.
    ts: PathBuf,
}

impl Projects {
    fn of(root: &Path) -> Self {
        Self {
            js: root.join("plugins/guests/js"),
            ts: root.join("tests/clients/ts"),
        }
    }
}

/// Checks every component; installs the missing ones if allowed. Returns a
/// `PATH` for the tests when an install put programs somewhere not on it.
pub fn ensure(root: &Path, permission: Permission) -> Result<Option<OsString>, Failure> {
    let projects = Projects::of(root);
    let missing = check(&projects);
    if missing.is_empty() {
        return Ok(None);
    }
    let system: Vec<&Missing> = missing
        .iter()
        .filter(|m| !matches!(m.install, Install::NpmCi(_)))
        .collect();
    if permission == Permission::Refused && !system.is_empty() {
        return Err(Failure::missing(refusal(&missing)));
    }

    let root_user = is_root();
    let apt: Vec<&str> = missing
        .iter()
        .filter_map(|m| match m.install {
            Install::Apt(packages) => Some(packages),
            _ => None,
        })
        .flatten()
        .copied()
        .collect();
    if !apt.is_empty() {
        apt_install(&apt, root_user)?;
    }
    // After apt: pip and npm may just have been installed.
    let specs = pip_specs(&missing);
    if !specs.is_empty() {
        pip_install(&specs, root_user)?;
    }
    let path = user_bin_path();
    for m in check(&projects) {
        if let Install::NpmCi(dir) = &m.install {
            run(
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund"])
                    .current_dir(dir),
                &format!("(cd {} && npm ci --no-audit --no-fund)", dir.display()),
            )?;
        }
    }

    let still = check_with_path(&projects, path.as_deref());
    if !still.is_empty() {
        let list: Vec<String> = still.iter().map(|m| format!("  - {}", m.what)).collect();
        return Err(Failure::missing(format!(
            "after installing, these are still missing:\n{}\n\n{}",
            list.join("\n"),
            refusal(&still)
        )));
    }
    Ok(path)
}

fn check(projects: &Projects) -> Vec<Missing> {
    check_with_path(projects, None)
}

/// Every check, with `path` as the programs' search path when given.
fn check_with_path(projects: &Projects, path: Option<&std::ffi::OsStr>) -> Vec<Missing> {
    let search: Vec<PathBuf> = match path {
        Some(p) => std::env::split_paths(p).collect(),
        None => std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default(),
    };
    let on_path = |name: &str| search.iter().map(|d| d.join(name)).find(|p| p.is_file());
    let mut missing = Vec::new();

    if !Path::new("/usr/bin/time").is_file() {
        missing.push(Missing {
            what: "/usr/bin/time (tests/e2e/cli_run.rs measures the host's peak memory with it)"
                .into(),
            install: Install::Apt(&["time"]),
        });
    }
    let util_linux = ["setpriv", "prlimit", "mkswap", "swapon", "fallocate"];
    if let Some(name) = util_linux.iter().find(|n| on_path(n).is_none()) {
        missing.push(Missing {
            what: format!(
                "{name} (util-linux: the tests act as a second user, set limits and turn on \
                 swap with these)"
            ),
            install: Install::Apt(&["util-linux"]),
        });
    }
    if on_path("strace").is_none() {
        missing.push(Missing {
            what: "strace (a test checks which files the daemon flushes)".into(),
            install: Install::Apt(&["strace"]),
        });
    }
    if !Path::new("/usr/bin/docker-registry").is_file() {
        missing.push(Missing {
            what: "docker-registry (the OCI tests push to and deploy from a real registry)".into(),
            install: Install::Apt(&["docker-registry"]),
        });
    }
    if on_path("htpasswd").is_none() {
        missing.push(Missing {
            what: "htpasswd (apache2-utils: the OCI tests' registry checks basic auth with it)"
                .into(),
            install: Install::Apt(&["apache2-utils"]),
        });
    }
    if !postgres_installed(&search) {
        missing.push(Missing {
            what: "the PostgreSQL server (initdb, pg_ctl: the cluster tests start a throwaway one)"
                .into(),
            install: Install::Apt(&["postgresql"]),
        });
    }
    if !["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .any(|p| Path::new(p).is_file())
    {
        missing.push(Missing {
            what: "Chromium (/usr/bin/chromium: the dashboard test drives it headless)".into(),
            install: Install::Apt(&["chromium"]),
        });
    }
    let pip = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !pip {
        missing.push(Missing {
            what: "python3 with pip (componentize-py, schemathesis and openapi-python-client come from PyPI)".into(),
            install: Install::Apt(&["python3", "python3-pip"]),
        });
    }
    missing.extend(check_pypi(&on_path));
    let node = on_path("node").and_then(|p| version_line(&p, &["--version"]));
    let node_major = node.as_deref().and_then(|v| {
        v.trim_start_matches('v')
            .split('.')
            .next()?
            .parse::<u32>()
            .ok()
    });
    if node_major.is_none_or(|m| m < NODE_MAJOR) || on_path("npm").is_none() {
        missing.push(Missing {
            what: format!(
                "Node.js {NODE_MAJOR} or newer with npm (the JavaScript guests, the TypeScript client; found: {})",
                node.as_deref().unwrap_or("none")
            ),
            install: Install::Apt(&["nodejs", "npm"]),
        });
    } else {
        missing.extend(check_npm_projects(projects));
    }
    missing
}

/// The PyPI tools, each by the first line of its `--version`.
fn check_pypi(on_path: &dyn Fn(&str) -> Option<PathBuf>) -> Vec<Missing> {
    let mut missing = Vec::new();
    let pypi = [
        (
            "componentize-py",
            COMPONENTIZE_PY,
            format!("componentize-py {COMPONENTIZE_PY}"),
            "the Python guests",
        ),
        (
            "schemathesis",
            SCHEMATHESIS,
            format!("schemathesis, version {SCHEMATHESIS}"),
            "tests/e2e/openapi.rs runs it against the live API",
        ),
        (
            "openapi-python-client",
            OPENAPI_PYTHON_CLIENT,
            format!("openapi-python-client version: {OPENAPI_PYTHON_CLIENT}"),
            "tests/e2e/openapi.rs generates the Python client with it",
        ),
    ];
    for (name, version, expected, why) in pypi {
        let found = on_path(name).and_then(|p| version_line(&p, &["--version"]));
        if found.as_deref() != Some(expected.as_str()) {
            missing.push(Missing {
                what: format!(
                    "{name} {version} ({why}; found: {})",
                    found.as_deref().unwrap_or("none")
                ),
                install: Install::Pip(format!("{name}=={version}")),
            });
        }
    }
    missing
}

/// The npm projects' packages, each at the version its package.json (and
/// lock file) pins.
fn check_npm_projects(projects: &Projects) -> Vec<Missing> {
    let mut missing = Vec::new();
    let js = &projects.js;
    if package_version(js, "@bytecodealliance/componentize-js").as_deref() != Some(COMPONENTIZE_JS)
    {
        missing.push(Missing {
            what: format!(
                "componentize-js {COMPONENTIZE_JS} in {}/node_modules (the JavaScript guests)",
                js.display()
            ),
            install: Install::NpmCi(js.clone()),
        });
    }
    // openapi-typescript, TypeScript, openapi-fetch and Node.js's types,
    // each at the version its package.json pins.
    let ts = &projects.ts;
    let pins = pinned_dev_dependencies(ts);
    let wrong: Vec<String> = pins
        .iter()
        .filter(|(name, want)| package_version(ts, name).as_deref() != Some(want.as_str()))
        .map(|(name, want)| format!("{name} {want}"))
        .collect();
    if pins.is_empty() || !wrong.is_empty() {
        missing.push(Missing {
            what: format!(
                "{} in {}/node_modules (tests/e2e/openapi.rs generates, compiles and \
                 runs the TypeScript client with them)",
                if wrong.is_empty() {
                    "the packages pinned in package.json".to_owned()
                } else {
                    wrong.join(", ")
                },
                ts.display()
            ),
            install: Install::NpmCi(ts.clone()),
        });
    }
    missing
}

fn postgres_installed(search: &[PathBuf]) -> bool {
    if search.iter().any(|d| d.join("initdb").is_file()) {
        return true;
    }
    std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let bin = e.path().join("bin");
            bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()
        })
}

/// The `devDependencies` of the npm project `dir`'s package.json, each
/// pinned to one version: `(name, version)`. Empty when it cannot be read.
fn pinned_dev_dependencies(dir: &Path) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(dir.join("package.json")) else {
        return Vec::new();
    };
    // `"devDependencies": { "name": "1.2.3", ... }`: no braces inside.
    let Some(at) = text.find("\"devDependencies\"") else {
        return Vec::new();
    };
    let rest = &text[at..];
    let (Some(open), Some(close)) = (rest.find('{'), rest.find('}')) else {
        return Vec::new();
    };
    let strings: Vec<&str> = rest[open + 1..close]
        .split('"')
        .skip(1)
        .step_by(2)
        .collect();
    strings
        .chunks_exact(2)
        .map(|pair| (pair[0].to_owned(), pair[1].to_owned()))
        .collect()
}

/// The version of the package `name` installed in the npm project `dir`,
/// read from its package.json.
fn package_version(dir: &Path, name: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(dir.join("node_modules").join(name).join("package.json")).ok()?;
    // `"version": "0.23.0"`: the first such key is the package's own.
    let at = text.find("\"version\"")?;
    let rest = &text[at + "\"version\"".len()..];
    let start = rest.find('"')? + 1;
    let end = rest[start..].find('"')? + start;
    Some(rest[start..end].to_owned())
}

fn version_line(program: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_owned()
    })
}

/// The pinned PyPI packages (`name==version`) of the missing components.
fn pip_specs(missing: &[Missing]) -> Vec<&str> {
    missing
        .iter()
        .filter_map(|m| match &m.install {
            Install::Pip(spec) => Some(spec.as_str()),
            _ => None,
        })
        .collect()
}

/// What is missing and the commands that install it.
fn refusal(missing: &[Missing]) -> String {
    let mut text = String::from("the tests start these for real, and they are missing:\n");
    for m in missing {
        text.push_str(&format!("  - {}\n", m.what));
    }
    let sudo = if is_root() { "" } else { "sudo " };
    let apt: Vec<&str> = missing
        .iter()
        .filter_map(|m| match m.install {
            Install::Apt(p) => Some(p),
            _ => None,
        })
        .flatten()
        .copied()
        .collect();
    text.push_str("\nInstall them with:\n");
    if !apt.is_empty() {
        text.push_str(&format!(
            "  {sudo}apt-get update && {sudo}apt-get install -y {}\n",
            apt.join(" ")
        ));
    }
    let specs = pip_specs(missing);
    if !specs.is_empty() {
        let user = if is_root() { "" } else { " --user" };
        text.push_str(&format!(
            "  python3 -m pip install{user} {}\n",
            specs.join(" ")
        ));
    }
    for m in missing {
        if let Install::NpmCi(dir) = &m.install {
            text.push_str(&format!("  (cd {} && npm ci)\n", dir.display()));
        }
    }
    text.push_str(
        "or let this command install them: `cargo xtask test --install` (apt-get through sudo \
         when not root; also TASKHOST_INSTALL=1).",
    );
    text
}

fn apt_install(packages: &[&str], root_user: bool) -> Result<(), Failure> {
    let prefix: Vec<&str> = if root_user { vec![] } else { vec!["sudo"] };
    if !root_user && Command::new("sudo").arg("--version").output().is_err() {
        return Err(Failure::missing(format!(
            "these Debian packages are missing and sudo is not installed to install them: {}.\n\
             Fix, as root: apt-get update && apt-get install -y {}",
            packages.join(" "),
            packages.join(" ")
        )));
    }
    let apt = |args: &[&str]| {
        let mut all: Vec<&str> = prefix.clone();
        all.push("apt-get");
        all.extend_from_slice(args);
        let mut cmd = Command::new(all[0]);
        cmd.args(&all[1..]).env("DEBIAN_FRONTEND", "noninteractive");
        (cmd, all.join(" "))
    };
    let (mut update, shown) = apt(&["update", "-qq"]);
    run(&mut update, &shown)?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend_from_slice(packages);
    let (mut install, shown) = apt(&args);
    run(&mut install, &shown)
}

/// Installs these pinned PyPI packages with one pip call.
fn pip_install(specs: &[&str], root_user: bool) -> Result<(), Failure> {
    let mut args = vec!["-m", "pip", "install", "-q"];
    if !root_user {
        args.push("--user");
    }
    args.extend_from_slice(specs);
    let shown = format!("python3 {}", args.join(" "));
    if run(Command::new("python3").args(&args), &shown).is_ok() {
        return Ok(());
    }
    // Debian's own Python refuses installs outside a virtual environment
    // (PEP 668) unless told.
    args.push("--break-system-packages");
    let shown = format!("python3 {}", args.join(" "));
    run(Command::new("python3").args(&args), &shown)
}

/// `PATH` with pip's per-user script directory added, when it holds one of
/// the PyPI tools and is not on it already.
fn user_bin_path() -> Option<OsString> {
    let out = Command::new("python3")
        .args(["-m", "site", "--user-base"])
        .output()
        .ok()?;
    let base = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let bin = base.join("bin");
    let scripts = ["componentize-py", "schemathesis", "openapi-python-client"];
    if !scripts.iter().any(|s| bin.join(s).is_file()) {
        return None;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d == bin) {
        return None;
    }
    let mut dirs = vec![bin];
    dirs.extend(std::env::split_paths(&path));
    std::env::join_paths(dirs).ok()
}

fn run(cmd: &mut Command, shown: &str) -> Result<(), Failure> {
    eprintln!("xtask: installing: {shown}");
    match cmd.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(Failure::missing(format!(
            "`{shown}` failed ({status}); run it by hand to see why, then run this command again"
        ))),
        Err(e) => Err(Failure::missing(format!("cannot run `{shown}`: {e}"))),
    }
}
