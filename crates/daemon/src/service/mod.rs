//! The services: what the daemon does with submissions and plugins, and
//! what it remembers of tasks. They use the store and the controller; they
//! know no frames.
//!
//! | file | owns |
//! |---|---|
//! | `error` | why a verb failed, as the services and the backend say it |
//! | `intake` | the checks of a submit request against the daemon's ceilings, its names, its controller spec |
//! | `trees` | spawn trees as one host counts them: each parent's children, each root's unfinished descendants |
//! | `keys` | idempotency keys: which task a key made, checked at intake |
//! | `plugins` | plugins stored by digest under the state directory |
//! | `uploads` | plugin uploads in chunks |
//! | `tasks` | what the daemon remembers of submissions (waiters, logs, names) |
//! | `history` | recent events, bridged to the daemon's log |
//! | `kv` | one host's key-value state: the buckets in memory, each write kept by the store first; `host kv` |
//! | `deployments` | named deployments on one host: each name's versions, its current one, the history; a submission's `NAME[@VERSION]` to a digest |
//! | `namespace` | namespaces: the keys that tell their objects apart, what a connection sees, their weights and quotas |
//! | `json` | the JSON forms shared by the CLI's `--json` and the HTTP API |

pub mod deployments;
pub(crate) mod error;
pub(crate) mod history;
pub(crate) mod intake;
pub mod json;
pub(crate) mod keys;
pub(crate) mod kv;
pub(crate) mod namespace;
pub(crate) mod plugins;
pub(crate) mod tasks;
pub(crate) mod trees;
pub(crate) mod uploads;
