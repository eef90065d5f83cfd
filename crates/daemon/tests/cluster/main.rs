//! Cluster mode through the daemon's own Rust surface, without the `host`
//! binary: each node is [`taskhost_daemon::serve`] in this process, on a
//! Tokio runtime of its own (so that a node can die as a killed process
//! does: its runtime dropped, nothing left or retired), on a throwaway
//! PostgreSQL that the test starts (`tests/e2e/common/postgres.rs`,
//! shared with the end-to-end suite; the tests fail, never skip, when it
//! cannot start), driven through [`taskhost_daemon::Client`] with the real
//! plugins from `plugins/`. Each node's `tracing` output is its own
//! (`common::Logs`), so a test can wait for what one node did or said.
//! Tests synchronise on replies, events and log lines, never on sleeps.
//!
//! | file | proves |
//! |---|---|
//! | `admission` | two nodes admitting into one slot: one owner at a time, and Queue, Replace and DropIfRunning decided as on one host |
//! | `takeover` | a node that dies without leaving: its running work taken over by another node after its lease |
//! | `fencing` | a node that loses its lease stops its work: cut off, by its own clock before anyone may take it over; its lease taken, at its next renewal |
//! | `common` | the helpers: a node in this process, its logs, a partition between a node and the database |

mod common;
#[path = "../../../../tests/e2e/common/partition.rs"]
mod partition;
#[path = "../../../../tests/e2e/common/postgres.rs"]
mod postgres;

mod admission;
mod fencing;
mod takeover;
