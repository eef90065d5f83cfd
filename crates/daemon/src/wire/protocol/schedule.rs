//! The messages of `host schedule`: its verbs, a schedule as added, and
//! a schedule as listed.

use serde::{Deserialize, Serialize};

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::outcome::OutcomeKind;
use taskhost_core::supervisor::TaskId;
use taskhost_runtime::Digest;

use super::SubmitRequest;
use super::submit::decode_padded;

/// What `host schedule` asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ScheduleVerb {
    /// Store a new schedule; answered with its [`Reply::Schedule`](super::Reply::Schedule).
    Add(Box<ScheduleSpec>),
    /// Every schedule: pages of [`Reply::Schedules`](super::Reply::Schedules), then [`Reply::End`](super::Reply::End).
    List,
    /// Delete a schedule (its tasks go on); answered with its last row.
    Remove(String),
    /// Stop a schedule's firings until it is resumed.
    Pause(String),
    /// Let a paused schedule fire again (its missed firings as it says).
    Resume(String),
    /// Fire a schedule once now, whatever its time; answered as a submit.
    Run(String),
}

/// A schedule as `host schedule add` sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// Its name (unique; its firings are named `<name>-<id>`).
    pub name: String,
    /// The cron expression (5 fields, 6 with seconds, or `@hourly` and
    /// such).
    pub cron: String,
    /// The IANA zone its expression is read in [default: UTC].
    pub tz: Option<String>,
    /// What it does with firings missed while the host was down or it was
    /// paused.
    pub missed: crate::schedule::Missed,
    /// What each firing submits (no name: each firing gets its own).
    pub request: SubmitRequest,
}

impl ScheduleSpec {
    /// Decodes a schedule a store kept (its request as
    /// [`SubmitRequest::decode_stored`] reads one).
    pub fn decode_stored(bytes: &[u8]) -> Result<Self, postcard::Error> {
        decode_padded(bytes)
    }
}

/// A schedule as `host schedule ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRow {
    /// Its name.
    pub name: String,
    /// Its cron expression.
    pub cron: String,
    /// Its zone.
    pub tz: String,
    /// What it does with missed firings.
    pub missed: crate::schedule::Missed,
    /// Whether it is paused.
    pub paused: bool,
    /// Its plugin's name.
    pub plugin: String,
    /// Its plugin's digest.
    pub digest: Digest,
    /// The slot its firings ask for, when given (else the plugin's
    /// resource, else the schedule's name).
    pub slot: Option<String>,
    /// The policy of its firings for a busy slot, when given (else the
    /// plugin's).
    pub policy: Option<AdmissionPolicy>,
    /// Its firings' priority.
    pub priority: i32,
    /// Its next firing, ms since the Unix epoch (none while paused, or if
    /// it never fires again).
    pub next_ms: Option<u64>,
    /// When it last fired (the due time that firing served).
    pub last_fire_ms: Option<u64>,
    /// The task its last firing submitted.
    pub last_task: Option<TaskId>,
    /// How that task ended, once it has.
    pub last_outcome: Option<OutcomeKind>,
    /// When it was added, ms since the Unix epoch.
    pub created_ms: u64,
}
