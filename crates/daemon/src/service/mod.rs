//! The services: what the daemon does with submissions and plugins, and
//! what it remembers of tasks. They use the store and the controller; they
//! know no frames.
//!
//! | file | owns |
//! |---|---|
//! | `submissions` | a submit request into a controller submission |
//! | `children` | child tasks: a guest's spawn as a submission with its parent's grants and key, the wait, the cascade of a cancel |
//! | `keys` | idempotency keys: which task a key made, checked at intake |
//! | `plugins` | plugins stored by digest under the state directory |
//! | `uploads` | plugin uploads in chunks |
//! | `tasks` | what the daemon remembers of submissions (waiters, logs, names) |
//! | `history` | recent events, bridged to the daemon's log |
//! | `recovery` | rebuilding the controller from the store at start |
//! | `kv` | guests' key-value state: one host's buckets in memory, each write kept by the store first; a cluster node's in the database under its attempts' fencing tokens; `host kv` |
//! | `schedules` | one host's schedules: their table, the firing loop, the verbs |
//! | `json` | the JSON forms shared by the CLI's `--json` and the HTTP API |

pub(crate) mod children;
pub(crate) mod history;
pub mod json;
pub(crate) mod keys;
pub(crate) mod kv;
pub(crate) mod plugins;
pub(crate) mod recovery;
pub(crate) mod schedules;
pub(crate) mod submissions;
pub(crate) mod tasks;
pub(crate) mod uploads;
