//! Owns the answers only the HTTP API gives (a task's page, a pending
//! outcome, an upload's, a verb by filter's, the version, an error), as
//! types: the handlers serialize them and `openapi.rs` derives their
//! schemas, so the document says what the handlers send.

use schemars::JsonSchema;
use serde::Serialize;

use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::TaskReport;

use crate::service::json::{JsonResult, TaskRowJson};

/// An error: the CLI's wording of what is wrong and what to do.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ErrorJson {
    /// What is wrong, and the fix.
    pub error: String,
}

/// One attempt of a task.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct AttemptJson {
    /// Its number (1-based).
    pub attempt: u32,
    /// How it ended, in words.
    pub result: String,
    /// How long it ran, in ms.
    pub duration_ms: u64,
}

/// `GET /api/tasks/{task}`: a task's page.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct TaskDetailJson<'a> {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// Its plugin's name.
    pub plugin: String,
    /// Its `ps` row while it is live or kept.
    pub row: Option<TaskRowJson>,
    /// Its result, once recorded.
    pub outcome: Option<JsonResult<'a>>,
    /// Its attempts, once it has a result.
    pub attempts: Vec<AttemptJson>,
    /// Its log lines.
    pub log: &'a [LogLine],
}

impl<'a> TaskDetailJson<'a> {
    pub(super) fn attempts(report: Option<&TaskReport>) -> Vec<AttemptJson> {
        report
            .map(|r| {
                r.history
                    .iter()
                    .map(|a| AttemptJson {
                        attempt: a.attempt,
                        result: a.result.clone(),
                        duration_ms: a.duration.as_millis() as u64,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `GET /api/tasks/{task}/outcome` before the task has a result (202).
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct PendingJson {
    /// Its id.
    pub id: u64,
    /// Always null: no result yet.
    pub outcome: Option<()>,
}

/// `PUT /api/plugins/{digest}`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct StoredJson {
    /// The plugin's SHA-256.
    pub digest: String,
    /// Its declared name (when this upload stored it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether this upload stored it (false: the daemon had it).
    pub stored: bool,
}

/// `POST /api/tasks/cancel` and `POST /api/tasks/rerun`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct MatchedJson {
    /// How many tasks matched.
    pub matched: u64,
    /// The newest of them (up to 1,000).
    pub ids: Vec<u64>,
    /// How many this call stopped or submitted again (0 for a dry run).
    pub acted: u64,
}

/// `GET /api/version`.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct VersionJson {
    /// The daemon's build.
    pub daemon: &'static str,
    /// Its wire protocol's version.
    pub protocol: u32,
}
