//! Owns the wire: the messages exchanged over the daemon's socket, the
//! version handshake, and the framing (a 4-byte big-endian length, then a
//! postcard body of at most [`MAX_FRAME`] bytes). Every message carries the
//! library's own types in their serde form (policies, reports, events, slot
//! views), so nothing is parsed twice. Decoding never trusts a length prefix
//! for allocation: a frame's buffer grows only as its bytes arrive, and a
//! prefix over the maximum ends the connection. Replies that could outgrow a
//! frame are sent in parts: a task's output as [`Reply::OutputPart`]s before
//! its [`Reply::Report`], task and slot lists as pages ended by [`Reply::End`].
//!
//! | file | owns |
//! |---|---|
//! | `frame` | the handshake, the envelope, framing and its errors |
//! | `submit` | a submission: its request, its delay, its checks, old stored forms, its answer |
//! | `submit_json` | a submission as JSON (the API's body, a line of `host submit --batch`) |
//! | `request` | what a client asks, event filters, the checks serde cannot make |
//! | `reply` | what the daemon answers: error kinds, rows, output in parts |
//! | `schedule` | the messages of `host schedule` |
//! | `kv` | the messages of `host kv` |
//! | `slot` | the messages of `host slot`: the operator's rules of slots |
//! | `namespace` | the messages of namespaces: the one a connection acts in, `host ns` |
//! | `deployment` | the messages of named deployments: `host deploy`, `host deployments`, `host rollback` |

use std::time::Duration;

pub use taskhost_core::lifecycle::{Placement, TaskState};

mod deployment;
mod frame;
mod kv;
mod namespace;
mod reply;
mod request;
mod schedule;
mod slot;
mod submit;
mod submit_json;

pub use deployment::{
    DeploymentEvent, DeploymentRow, DeploymentVerb, EventWhat, Pick, Reference,
    check_name as check_deployment_name, check_version,
};
pub use frame::{Envelope, FrameError, Hello, Welcome, decode, encode, read_frame, write_frame};
pub use kv::{KvRow, KvTarget, KvVerb};
pub use namespace::{
    DEFAULT_NAMESPACE, Enter, MAX_NAMESPACE_NAME, NamespaceChange, NamespaceRow, NamespaceSettings,
    NamespaceVerb, Quota, check_name as check_namespace_name,
};
pub(crate) use reply::Reassembly;
pub use reply::{BatchItem, ErrorKind, PluginRow, Reply, TaskRow};
pub(crate) use request::check_submission;
pub use request::{EventFilter, Request, TaskFilter, TaskPage};
pub use schedule::{ScheduleRow, ScheduleSpec, ScheduleVerb};
pub use slot::{SlotRuleRow, SlotRuleVerb};
pub use submit::{
    MAX_ARGS, MAX_ARGS_BYTES, MAX_IDEMPOTENCY_KEY, NotBefore, SubmitRequest, Submitted,
};
pub use submit_json::{DURATION, SubmitJson};

/// The protocol version; both sides must agree.
pub const PROTOCOL_VERSION: u32 = 23;
/// The largest frame accepted in either direction.
pub const MAX_FRAME: usize = 4 << 20;
/// Plugin bytes per upload chunk (well under [`MAX_FRAME`]).
pub const UPLOAD_CHUNK: usize = 1 << 20;
/// Output bytes per [`Reply::OutputPart`].
pub const OUTPUT_CHUNK: usize = 1 << 20;
/// Rows per page of [`Reply::Tasks`] and [`Reply::Slots`].
pub const LIST_PAGE: usize = 1_000;
/// The most submissions one batch carries (`host submit --batch` splits
/// a longer file into calls of at most this many).
pub const MAX_BATCH: usize = 1_000;
/// The largest input one submission carries (the frame less room for the
/// rest of the request).
pub const MAX_SUBMIT_INPUT: usize = MAX_FRAME - (64 << 10);
/// The magic that opens a client's hello, so a stray client fails fast.
pub const MAGIC: [u8; 8] = *b"TASKHOST";

/// The longest duration a request may carry (a timeout, an interval, a
/// backoff, a grace): ten years. Longer ones are refused when decoded, so
/// that no deadline computed from one can overflow a clock.
pub const MAX_WIRE_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
