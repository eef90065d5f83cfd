//! A network partition between a node and its database: a Unix-socket
//! proxy in front of PostgreSQL's socket. Shared by the end-to-end tests
//! and the daemon's own cluster tests (each includes it with `#[path]`
//! beside `postgres.rs`).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::postgres::Postgres;

/// A Unix-socket proxy in front of PostgreSQL's socket that a test can
/// pause: paused, it passes no byte either way and closes nothing, as a
/// network partition looks to a node (no error, no answer).
pub struct Partition {
    dir: tempfile::TempDir,
    paused: Arc<AtomicBool>,
}

impl Partition {
    /// A proxy to `pg`'s socket.
    pub fn start(pg: &Postgres) -> Self {
        let server = pg.socket_dir().join(".s.PGSQL.5432");
        let dir = tempfile::tempdir().expect("a directory for the proxy");
        let listener =
            UnixListener::bind(dir.path().join(".s.PGSQL.5432")).expect("the proxy's socket");
        let paused = Arc::new(AtomicBool::new(false));
        let held = Arc::clone(&paused);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = UnixStream::connect(&server) else {
                    continue;
                };
                let (Ok(client_reader), Ok(upstream_reader)) =
                    (client.try_clone(), upstream.try_clone())
                else {
                    continue;
                };
                for (from, to) in [(client_reader, upstream), (upstream_reader, client)] {
                    let held = Arc::clone(&held);
                    std::thread::spawn(move || pump(from, to, &held));
                }
            }
        });
        Self { dir, paused }
    }

    /// The address a node reaches PostgreSQL at through the proxy.
    pub fn url(&self) -> String {
        format!(
            "postgresql:///postgres?host={}&user=taskhost",
            self.dir.path().display()
        )
    }

    /// Cuts the node off (`true`) or lets it through again.
    pub fn cut(&self, cut: bool) {
        self.paused.store(cut, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, holding every byte read while `paused` is set.
fn pump(mut from: UnixStream, mut to: UnixStream, paused: &AtomicBool) {
    let mut buf = [0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while paused.load(Ordering::SeqCst) {
            // The partition's own pace, not a test's wait: a held byte is
            // let through within 5 ms of the cut ending.
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
