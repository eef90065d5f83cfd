//! # taskhost-daemon
//!
//! The daemon behind `host serve`: the runtime, supervisor and controller of
//! one process behind an owner-only Unix socket (and, optionally, an HTTP
//! listener), its store (SQLite, memory, or a PostgreSQL database shared by
//! the nodes of a cluster), and [`Client`], the other end of its protocol.
//! A bad client costs its own connection only.
//!
//! The folders are its layers, each using only those below it:
//!
//! | module | owns |
//! |---|---|
//! | `wire` | the protocol's messages and framing, the client, socket paths |
//! | `server` | start-up and shutdown, connections, what each request does, the HTTP listener |
//! | `backend` | the one seam to where work is kept: one host's store and controller, or a cluster node's database |
//! | `service` | submissions, plugins, uploads, the memory of tasks, history, recovery, JSON forms |
//! | `cluster` | what a cluster node does that a single host does not: claims, leases, notifications, shipping |
//! | `store` | what survives a restart: submissions, states, outcomes, logs |
//! | `schedule` | the rules of time: cron in a zone, missed firings, RFC 3339 |
//! | `config` | the settings: one type the flags and the TOML file fill, flags over file over defaults, checked |
//! | `state` | what the connections share |
//! | `state_dir` | the state directory: its default, privacy and lock |

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod cluster;
pub mod config;
pub mod schedule;
mod server;
mod service;
mod state;
pub mod state_dir;
pub mod store;
mod wire;

pub use config::ClusterSettings;
pub use config::{DaemonConfig, default_worker_threads};
pub use server::listener::{ServeError, serve};
pub use service::json;
pub use service::plugins::plugin_path;
pub use state_dir::default_state_dir;
pub use wire::client::{Client, ClientError, Replies};
pub use wire::remote::Remote;
pub use wire::{protocol, socket};
