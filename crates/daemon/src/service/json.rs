//! Owns the JSON forms of what the daemon shows: a task's result, a `ps`
//! row, a slot and a cancel's answer. The CLI's `--json` output and the
//! HTTP API (`host serve --http`) both use these, so the two cannot drift.

use crate::wire::protocol::{NamespaceRow, Quota, SlotRuleRow};
use base64::Engine as _;
use serde::Serialize;
use serde_json::{Value, json};

use taskhost_core::controller::SlotView;
use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::TaskReport;

use crate::wire::protocol::TaskRow;

/// The JSON result of one task (`host wait --json`, `host run --json`).
#[derive(Debug, Serialize)]
pub struct JsonResult<'a> {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: &'a str,
    /// Its slot.
    pub slot: &'a str,
    /// How it ended (`completed`, `failed`, ...).
    pub outcome: &'static str,
    /// Why, for the outcomes that have a reason.
    pub reason: Option<&'a str>,
    /// The guest's exit code, if it gave one.
    pub exit_code: Option<i32>,
    /// The rejection kind of a rejected submission.
    pub rejection: Option<String>,
    /// Attempts started.
    pub attempts: u32,
    /// Its own run time in ms.
    pub duration_ms: u64,
    /// The output of a completed task: text, or base64 (see
    /// `output_encoding`).
    pub output: Option<String>,
    /// `utf8` or `base64`.
    pub output_encoding: Option<&'static str>,
}

impl<'a> JsonResult<'a> {
    /// The JSON form of a report.
    pub fn new(report: &'a TaskReport) -> Self {
        let outcome = &report.outcome;
        let (output, output_encoding) = match outcome {
            TaskOutcome::Completed { output } => match std::str::from_utf8(output) {
                Ok(text) => (Some(text.to_owned()), Some("utf8")),
                Err(_) => (
                    Some(base64::engine::general_purpose::STANDARD.encode(output)),
                    Some("base64"),
                ),
            },
            _ => (None, None),
        };
        Self {
            id: report.id.get(),
            name: &report.name,
            slot: &report.slot,
            outcome: outcome.kind().as_str(),
            reason: outcome.reason(),
            exit_code: outcome.exit_code(),
            rejection: outcome.rejection().map(|k| k.to_string()),
            attempts: report.attempts,
            duration_ms: report.duration.as_millis() as u64,
            output,
            output_encoding,
        }
    }

    /// As a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// One row of `host ps --json`.
pub fn task_row(t: &TaskRow) -> Value {
    let mut row = json!({
        "id": t.id,
        "name": t.name,
        "slot": t.slot,
        "state": t.state.as_str(),
        "attempts": t.attempts,
        "age_ms": t.age.as_millis() as u64,
        "progress": t.progress.map(|(done, total)| json!({ "done": done, "total": total })),
        "plugin": t.plugin,
        "outcome": t.outcome,
        "node": t.node,
    });
    if let Some(due_ms) = t.due_ms {
        row["due_ms"] = json!(due_ms);
        row["due"] = json!(crate::schedule::format_ms(due_ms));
    }
    if let Some(schedule) = &t.schedule {
        row["schedule"] = json!(schedule);
    }
    if let Some(parent) = t.parent {
        row["parent"] = json!(parent);
    }
    row
}

/// One slot of `host slots --json`.
pub fn slot(s: &SlotView) -> Value {
    json!({
        "key": s.key,
        "state": s.state,
        "owner": s.owner,
        "owners": s.owners,
        "capacity": s.capacity,
        "queue_depth": s.queue_depth,
        "in_state_ms": s.in_state_for.as_millis() as u64,
        "queued": s.queued,
    })
}

/// A slot as `host slots --json` and `/api/slots` show it: [`slot`] with
/// the rate its rule sets (`rate`, `burst`; null without one).
pub fn slot_with_rule(s: &SlotView, rules: &taskhost_core::slot_settings::SlotRules) -> Value {
    let mut slot = slot(s);
    let settings = rules.for_slot(&s.key);
    slot["rate"] = settings.rate.map(|r| r.to_string()).into();
    slot["burst"] = settings.burst.into();
    slot
}

/// The rules of `rows` (as `host slot ls` lists them), for
/// [`slot_with_rule`]; a row the rules refuse is left out.
pub fn rules_of(rows: Vec<SlotRuleRow>) -> taskhost_core::slot_settings::SlotRules {
    let mut rules = taskhost_core::slot_settings::SlotRules::default();
    for row in rows {
        let _ = rules.set(&row.pattern, row.settings);
    }
    rules
}

/// A slot rule as `host slot ls --json` and `/api/slot-rules` show it (a
/// setting left to its default is null).
pub fn slot_rule(row: &SlotRuleRow) -> Value {
    json!({
        "pattern": row.pattern,
        "capacity": row.settings.capacity,
        "max_queue": row.settings.max_queue,
        "debounce_ms": row.settings.debounce.map(|d| d.as_millis() as u64),
        "max_wait_ms": row.settings.max_wait.map(|d| d.as_millis() as u64),
        "rate": row.settings.rate.map(|r| r.to_string()),
        "burst": row.settings.burst,
    })
}

/// A namespace as `host ns ls --json` and `/api/namespaces` show it: its
/// quotas and its use, each by the quota's key.
pub fn namespace(row: &NamespaceRow) -> Value {
    let map = |pairs: &[(Quota, u64)]| {
        pairs
            .iter()
            .map(|(q, n)| (q.key().to_owned(), Value::from(*n)))
            .collect::<serde_json::Map<_, _>>()
    };
    json!({
        "name": row.name,
        "weight": row.settings.weight,
        "quotas": map(&row.settings.quotas),
        "secrets": row.settings.secrets,
        "usage": map(&row.usage),
    })
}

/// The answer of `host cancel --json` / `host remove --json`: whether this
/// request made the stop claim, and the final report when it waited.
pub fn canceled(claimed: bool, report: Option<&TaskReport>) -> Value {
    let report = report.map(|r| {
        json!({ "id": r.id, "name": r.name, "outcome": r.outcome.kind(), "reason": r.outcome.reason(),
                "rejection": r.outcome.rejection().map(|k| k.to_string()),
                "attempts": r.attempts, "duration_ms": r.duration.as_millis() as u64 })
    });
    json!({ "claimed": claimed, "report": report })
}

/// The answer of `host submit --json` (without `--wait`).
pub fn submitted(s: &crate::wire::protocol::Submitted) -> Value {
    use crate::wire::protocol::Placement;
    let (state, replacing, due_ms) = match &s.placement {
        Placement::Running => ("running", None, None),
        Placement::Queued { .. } => ("queued", None, None),
        Placement::Replacing { owner, .. } => ("replacing", Some(owner.get()), None),
        Placement::Rejected(_) => ("rejected", None, None),
        Placement::Delayed { due_ms } => ("waiting", None, Some(*due_ms)),
    };
    let mut value = json!({ "id": s.id, "name": s.name, "slot": s.slot,
            "queued": state != "running", "state": state, "replacing": replacing,
            "existing": s.existing });
    if let Some(due_ms) = due_ms {
        value["due_ms"] = json!(due_ms);
        value["due"] = json!(crate::schedule::format_ms(due_ms));
    }
    value
}

/// One answer of a batch (`host submit --batch --json`, `POST
/// /api/tasks/batch`): as [`submitted`], or `{"error", "kind"}` with the
/// reason it was refused and its kind (`invalid`, `not_found`, `conflict`,
/// `over_quota`, `shutting_down`, `forbidden`, `internal`).
pub fn batch_item(item: &crate::wire::protocol::BatchItem) -> Value {
    use crate::wire::protocol::{BatchItem, ErrorKind};
    match item {
        BatchItem::Submitted(s) => submitted(s),
        BatchItem::Refused { kind, message } => {
            let kind = match kind {
                ErrorKind::Invalid => "invalid",
                ErrorKind::NotFound => "not_found",
                ErrorKind::ShuttingDown => "shutting_down",
                ErrorKind::Internal => "internal",
                ErrorKind::Forbidden => "forbidden",
                ErrorKind::Conflict => "conflict",
                ErrorKind::OverQuota => "over_quota",
            };
            json!({ "error": message, "kind": kind })
        }
    }
}

/// A schedule of `host schedule ls --json` (and of its other verbs).
pub fn schedule(r: &crate::wire::protocol::ScheduleRow) -> Value {
    let time = |ms: Option<u64>| ms.map(crate::schedule::format_ms);
    json!({
        "name": r.name,
        "cron": r.cron,
        "tz": r.tz,
        "missed": r.missed.as_str(),
        "paused": r.paused,
        "plugin": r.plugin,
        "digest": r.digest.to_string(),
        "slot": r.slot,
        "policy": r.policy.map(|p| p.to_string()),
        "priority": r.priority,
        "next_ms": r.next_ms,
        "next": time(r.next_ms),
        "last_fire_ms": r.last_fire_ms,
        "last_fire": time(r.last_fire_ms),
        "last_task": r.last_task,
        "last_outcome": r.last_outcome,
        "created_ms": r.created_ms,
    })
}

/// A row of `host plugins ls --json`.
pub fn plugin_row(r: &crate::wire::protocol::PluginRow) -> Value {
    json!({
        "digest": r.digest.to_string(),
        "name": r.name,
        "bytes": r.bytes,
        "stored_ms": r.stored_ms,
        "unfinished": r.unfinished,
        "finished": r.finished,
        "loaded": r.loaded,
    })
}

/// The answer of `host shutdown --json`.
pub fn shutdown(report: &taskhost_core::supervisor::ShutdownReport) -> Value {
    use taskhost_core::supervisor::ShutdownReport;
    let stuck = match report {
        ShutdownReport::AllStopped => Vec::new(),
        ShutdownReport::GraceExceeded { stuck } => stuck.clone(),
    };
    json!({ "all_stopped": stuck.is_empty(), "force_aborted": stuck })
}
