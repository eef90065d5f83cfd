//! The client verbs: everything that talks to a running daemon through
//! [`taskhost::daemon::Client`].
//!
//! | module | verbs |
//! |---|---|
//! | `submit` | `submit`, and the wait with live progress it shares with `wait` |
//! | `tasks` | `wait`, `cancel`, `remove`, `ps`, `slots` |
//! | `streams` | `events`, `logs` |
//! | `admin` | `shutdown` |
//! | `plugins` | `plugins ls`, `plugins rm`, `plugins prune` |

pub mod admin;
pub mod plugins;
pub mod streams;
pub mod submit;
pub mod tasks;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use taskhost::daemon::{Client, socket};

use super::args::SocketArg;
use super::exit;

/// How long a client waits for a daemon that is still starting (its socket
/// not there yet, or not accepting yet) before it says none answers.
const STARTING_DAEMON_PATIENCE: Duration = Duration::from_secs(2);

/// Connects to the daemon named by the verb's `--socket`, else the one
/// before the verb, else `TASKHOST_SOCKET`, else the per-user default.
pub async fn connect(arg: &SocketArg, before_verb: Option<&Path>) -> anyhow::Result<Client> {
    let path = socket::resolve(arg.socket.as_deref().or(before_verb));
    Client::connect_waiting(&path, STARTING_DAEMON_PATIENCE)
        .await
        .map_err(exit::client)
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
