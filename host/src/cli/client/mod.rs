//! The client verbs: everything that talks to a running daemon through
//! [`taskhost::daemon::Client`].
//!
//! | module | verbs |
//! |---|---|
//! | `submit` | `submit`, and the wait with live progress it shares with `wait` |
//! | `batch` | `submit --batch`: a file of submissions, in calls of up to a batch each |
//! | `bulk` | `cancel`, `remove` and `rerun` by `--filter`, with `--dry-run` |
//! | `tasks` | `wait`, `rerun`, `cancel`, `remove`, `ps`, `slots` |
//! | `streams` | `events`, `logs` |
//! | `schedule` | `schedule add`, `ls`, `rm`, `pause`, `resume`, `run` |
//! | `kv` | `kv ls`, `kv get`, `kv rm` |
//! | `slot` | `slot set`, `unset`, `ls`: the operator's slot rules |
//! | `ns` | `ns add`, `set`, `rm`, `ls`: namespaces and their quotas |
//! | `admin` | `shutdown` |
//! | `plugins` | `plugins ls`, `plugins rm`, `plugins prune` |
//! | `record` | `record export`: a task's attempt's record; the fetch of `replay ID` |
//! | `deploy` | `deploy`, `deployments ls`, `history`, `rm`, `rollback`, `push`: plugins by name and version |
//! | `oci` | pulls from and pushes to OCI registries: references, credentials, TLS, digests checked |

pub mod admin;
pub mod batch;
pub mod bulk;
pub mod deploy;
pub mod kv;
pub mod ns;
pub mod oci;
pub mod plugins;
pub mod record;
pub mod schedule;
pub mod slot;
pub mod streams;
pub mod submit;
pub mod tasks;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use taskhost::daemon::protocol::Enter;
use taskhost::daemon::{Client, Remote, socket};

use super::args::SocketArg;
use super::exit;

/// How long a client waits for a daemon that is still starting (its socket
/// not there yet, or not accepting yet) before it says none answers.
const STARTING_DAEMON_PATIENCE: Duration = Duration::from_secs(2);

/// The remote daemon `--remote` (or `TASKHOST_URL`) names, set once at
/// start.
static REMOTE: OnceLock<Option<Remote>> = OnceLock::new();

/// Takes `--remote`, `--token-file` (else `TASKHOST_TOKEN`) and `--ca-file`.
pub fn set_remote(
    url: Option<String>,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    let remote = match url.filter(|u| !u.is_empty()) {
        None => {
            if token_file.is_some() || ca_file.is_some() {
                return Err(exit::usage(
                    "--token-file and --ca-file are for a remote daemon: give --remote URL \
                     (or TASKHOST_URL) too",
                ));
            }
            None
        }
        Some(url) => {
            let token = match token_file {
                Some(path) => Some(Remote::token_from_file(&path).map_err(|e| {
                    exit::ExitError::error(exit::EXIT_DAEMON, format!("--token-file: {e}"))
                })?),
                None => std::env::var("TASKHOST_TOKEN")
                    .ok()
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty()),
            };
            Some(Remote {
                url,
                token,
                ca_file,
            })
        }
    };
    let _ = REMOTE.set(remote);
    Ok(())
}

/// The namespace `--namespace` names and whether `--all-namespaces` was
/// given, set once at start.
static NAMESPACE: OnceLock<(Option<String>, bool)> = OnceLock::new();

/// Takes `--namespace` (else `TASKHOST_NAMESPACE`) and `--all-namespaces`.
pub fn set_namespace(namespace: Option<String>, all: bool) {
    let _ = NAMESPACE.set((namespace.filter(|n| !n.is_empty()), all));
}

/// The remote daemon to talk to, if `--remote` named one.
pub fn remote() -> Option<&'static Remote> {
    REMOTE.get().and_then(Option::as_ref)
}

/// Connects to the remote daemon `--remote` names, else the one of the
/// verb's `--socket`, else the one before the verb, else
/// `TASKHOST_SOCKET`, else the per-user default.
pub async fn connect(arg: &SocketArg, before_verb: Option<&Path>) -> anyhow::Result<Client> {
    let client = match remote() {
        Some(remote) => Client::connect_remote(remote).await,
        None => {
            let path = socket::resolve(arg.socket.as_deref().or(before_verb));
            Client::connect_waiting(&path, STARTING_DAEMON_PATIENCE).await
        }
    }
    .map_err(exit::client)?;
    if let Some((namespace, all)) = NAMESPACE.get()
        && (namespace.is_some() || *all)
    {
        client
            .enter(Enter {
                namespace: namespace.clone(),
                all: *all,
            })
            .await
            .map_err(exit::client)?;
    }
    Ok(client)
}

/// Prints rows as aligned columns on stdout.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    // Names, slots and reasons may come from a guest: shown as text.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| crate::cli::report::visible(cell).into_owned())
                .collect()
        })
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(stdout, "{}", line(row.iter().map(String::as_str).collect()));
    }
}
