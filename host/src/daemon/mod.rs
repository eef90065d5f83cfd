//! The daemon behind `host serve`: the runtime, supervisor and controller of
//! one process behind an owner-only Unix socket, and [`Client`], the other
//! end of its protocol. A bad client costs its own connection only.
//!
//! | module | owns |
//! |---|---|
//! | `protocol` | message types, version handshake, framing limits |
//! | `client` | the client: pipelined requests, replies routed by id |
//! | `socket` | socket paths and owner-only permissions |
//! | `config` | daemon settings from flags and the TOML file |
//! | `listener` | start-up, the accept loop, shutdown |
//! | `connection` | one connection: handshake, requests in order, batched replies |
//! | `dispatch` | what each request does |
//! | `uploads` | plugin uploads in chunks |
//! | `submissions` | a submit request into a controller submission |
//! | `plugins` | plugins stored by digest under the state directory |
//! | `store` | what survives a restart: submissions, states, outcomes, logs |
//! | `recovery` | rebuilding the controller from the store at start |
//! | `tasks` | what the daemon remembers of submissions (waiters, logs, names) |
//! | `history` | recent events, bridged to the daemon's log |
//! | `json` | the JSON forms shared by the CLI's `--json` and the HTTP API |
//! | `http` | the optional HTTP listener: metrics, JSON API, dashboard |
//! | `state` | what the connections share |
//! | `state_dir` | the state directory: its default, privacy and lock |

mod client;
mod cluster;
pub mod config;
mod connection;
mod dispatch;
mod history;
mod http;
pub mod json;
mod listener;
mod plugins;
pub mod protocol;
mod recovery;
pub mod socket;
mod state;
pub mod state_dir;
pub mod store;
mod submissions;
mod tasks;
mod uploads;

pub use client::{Client, ClientError, Replies};
pub use cluster::ClusterSettings;
pub use config::{DaemonConfig, default_worker_threads};
pub use listener::{ServeError, serve};
pub use plugins::plugin_path;
pub use state_dir::default_state_dir;
