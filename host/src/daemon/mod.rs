//! The daemon behind `host serve`: the runtime, supervisor and controller of
//! one process behind an owner-only Unix socket. It owns the socket's
//! life (permissions, stale files, removal at exit), the connections (a
//! handshake, many requests in flight per connection, streaming replies),
//! content-addressed plugin storage, and the translation of requests into
//! controller calls. A bad client costs its own connection only.
//!
//! | module | owns |
//! |---|---|
//! | `protocol` | message types, version handshake, framing limits |
//! | `socket` | socket paths and owner-only permissions |
//! | `tasks` | what the daemon remembers of submissions (waiters, logs) |
//! | `server` | connections and request handling |
//! | `config` | daemon settings from flags and the TOML file |

pub mod config;
pub mod protocol;
mod server;
pub mod socket;
mod tasks;

use std::path::PathBuf;

pub use config::DaemonConfig;
pub use server::{default_state_dir, serve};

use crate::runtime::Digest;

/// Where the daemon keeps uploaded plugins: `<state dir>/plugins/<hex>.wasm`.
pub fn plugin_path(state_dir: &std::path::Path, digest: &Digest) -> PathBuf {
    let hex: String = digest.0.iter().map(|b| format!("{b:02x}")).collect();
    state_dir.join("plugins").join(format!("{hex}.wasm"))
}
