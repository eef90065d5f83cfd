//! Owns the JSON forms of what the daemon shows: a task's result, a `ps`
//! row, a slot, a cancel's answer and the rest. The CLI's `--json` output
//! and the HTTP API (`host serve --http`) both serialize these types, and
//! the API's OpenAPI document is derived from them (`JsonSchema`), so the
//! three cannot drift.

use crate::wire::protocol::{DeploymentRow, NamespaceRow, Quota, SlotRuleRow};
use base64::Engine as _;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use taskhost_core::controller::SlotView;
use taskhost_core::outcome::TaskOutcome;
use taskhost_core::supervisor::TaskReport;

use crate::wire::protocol::TaskRow;

/// The JSON result of one task (`host wait --json`, `host run --json`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct JsonResult<'a> {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: &'a str,
    /// Its slot.
    pub slot: &'a str,
    /// How it ended (`completed`, `failed`, ...).
    #[schemars(extend("enum" = OUTCOMES))]
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
    #[schemars(extend("enum" = ["utf8", "base64", null]))]
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

/// Every outcome's word, as `outcome` fields say it.
pub const OUTCOMES: [&str; 7] = [
    "completed",
    "failed",
    "fatal",
    "canceled",
    "force-aborted",
    "panicked",
    "rejected",
];

/// A task's last progress report.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Progress {
    /// Units done.
    pub done: u64,
    /// Units in all (0: unknown).
    pub total: u64,
}

/// One row of `host ps --json` (and of `GET /api/tasks`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskRowJson {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// Its state (`queued`, `waiting`, `running`, `backing-off`,
    /// `stopping`, `finishing`, `finished`, ...).
    pub state: &'static str,
    /// Attempts started.
    pub attempts: u32,
    /// Time since it was submitted, in ms.
    pub age_ms: u64,
    /// Its last progress report.
    pub progress: Option<Progress>,
    /// Its plugin's name.
    pub plugin: String,
    /// How a finished task ended.
    #[schemars(extend("enum" = [ "completed", "failed", "fatal", "canceled", "force-aborted", "panicked", "rejected", null ]))]
    pub outcome: Option<&'static str>,
    /// In cluster mode, the node running it.
    pub node: Option<String>,
    /// A delayed task's due time, ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_ms: Option<u64>,
    /// The same, as RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due: Option<String>,
    /// The schedule that fired it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The task that spawned it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
}

/// One row of `host ps --json`.
pub fn task_row(t: &TaskRow) -> TaskRowJson {
    TaskRowJson {
        id: t.id.get(),
        name: t.name.clone(),
        slot: t.slot.clone(),
        state: t.state.as_str(),
        attempts: t.attempts,
        age_ms: t.age.as_millis() as u64,
        progress: t.progress.map(|(done, total)| Progress { done, total }),
        plugin: t.plugin.clone(),
        outcome: t.outcome.map(|o| o.as_str()),
        node: t.node.clone(),
        due_ms: t.due_ms,
        due: t.due_ms.map(crate::schedule::format_ms),
        schedule: t.schedule.clone(),
        parent: t.parent,
    }
}

/// A slot as `host slots --json` and `GET /api/slots` show it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SlotJson {
    /// The slot's key.
    pub key: String,
    /// Its state.
    pub state: taskhost_core::admission::SlotState,
    /// The oldest owner's id.
    pub owner: Option<u64>,
    /// Every owner's id, oldest first.
    pub owners: Vec<u64>,
    /// How many owners it may hold at once.
    pub capacity: usize,
    /// Submissions waiting behind its owners.
    pub queue_depth: usize,
    /// How long it has been in this state, in ms.
    pub in_state_ms: u64,
    /// The ids waiting, in order.
    pub queued: Vec<u64>,
    /// The rate its rule sets (STARTS/PERIOD).
    pub rate: Option<String>,
    /// The burst its rule sets.
    pub burst: Option<u32>,
}

/// A slot as `host slots --json` and `/api/slots` show it, with the rate
/// its rule sets (`rate`, `burst`; null without one).
pub fn slot_with_rule(s: &SlotView, rules: &taskhost_core::slot_settings::SlotRules) -> SlotJson {
    let settings = rules.for_slot(&s.key);
    SlotJson {
        key: s.key.clone(),
        state: s.state,
        owner: s.owner.map(|id| id.get()),
        owners: s.owners.iter().map(|id| id.get()).collect(),
        capacity: s.capacity,
        queue_depth: s.queue_depth,
        in_state_ms: s.in_state_for.as_millis() as u64,
        queued: s.queued.iter().map(|id| id.get()).collect(),
        rate: settings.rate.map(|r| r.to_string()),
        burst: settings.burst,
    }
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
#[derive(Debug, Serialize, JsonSchema)]
pub struct SlotRuleJson {
    /// The slots it covers: a key, or a glob (`db/*`).
    pub pattern: String,
    /// Owners at once.
    pub capacity: Option<u32>,
    /// Submissions waiting at most.
    pub max_queue: Option<usize>,
    /// Debounce window, in ms.
    pub debounce_ms: Option<u64>,
    /// The longest a debounced submission waits, in ms.
    pub max_wait_ms: Option<u64>,
    /// Starts per period (STARTS/PERIOD).
    pub rate: Option<String>,
    /// Starts allowed at once above the rate.
    pub burst: Option<u32>,
}

/// A slot rule as `host slot ls --json` and `/api/slot-rules` show it.
pub fn slot_rule(row: &SlotRuleRow) -> SlotRuleJson {
    SlotRuleJson {
        pattern: row.pattern.clone(),
        capacity: row.settings.capacity,
        max_queue: row.settings.max_queue,
        debounce_ms: row.settings.debounce.map(|d| d.as_millis() as u64),
        max_wait_ms: row.settings.max_wait.map(|d| d.as_millis() as u64),
        rate: row.settings.rate.map(|r| r.to_string()),
        burst: row.settings.burst,
    }
}

/// A deployment row as `host deployments ls|history --json` and
/// `/api/deployments` show it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DeploymentJson {
    /// The deployment's name.
    pub name: String,
    /// The version.
    pub version: String,
    /// The version's plugin, `sha256:HEX`.
    pub digest: String,
    /// When it became current (a list) or happened (a history), ms since
    /// the Unix epoch.
    pub at_ms: u64,
    /// What made it current, or what happened.
    #[schemars(extend("enum" = ["deploy", "rollback", "remove"]))]
    pub what: &'static str,
    /// How many versions the name keeps (a list; 0 in a history).
    pub versions: usize,
}

/// A deployment row as `host deployments ls --json` and `/api/deployments`
/// show it.
pub fn deployment(row: &DeploymentRow) -> DeploymentJson {
    DeploymentJson {
        name: row.name.clone(),
        version: row.version.clone(),
        digest: row.digest.to_string(),
        at_ms: row.at_ms,
        what: row.what.word(),
        versions: row.versions,
    }
}

/// A namespace as `host ns ls --json` and `/api/namespaces` show it: its
/// quotas and its use, each by the quota's key.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NamespaceJson {
    /// Its name.
    pub name: String,
    /// Its weight in the fair share.
    pub weight: u32,
    /// Its quotas, by key (a quota not listed is unlimited).
    pub quotas: std::collections::BTreeMap<String, u64>,
    /// The secrets it may use.
    pub secrets: Vec<String>,
    /// Its use, by the quotas' keys.
    pub usage: std::collections::BTreeMap<String, u64>,
}

/// A namespace as `host ns ls --json` and `/api/namespaces` show it.
pub fn namespace(row: &NamespaceRow) -> NamespaceJson {
    let map = |pairs: &[(Quota, u64)]| {
        pairs
            .iter()
            .map(|(q, n)| (q.key().to_owned(), *n))
            .collect()
    };
    NamespaceJson {
        name: row.name.clone(),
        weight: row.settings.weight,
        quotas: map(&row.settings.quotas),
        secrets: row.settings.secrets.clone(),
        usage: map(&row.usage),
    }
}

/// The final report in a cancel's answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CanceledReport {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// How it ended.
    #[schemars(extend("enum" = OUTCOMES))]
    pub outcome: &'static str,
    /// Why, for the outcomes that have a reason.
    pub reason: Option<String>,
    /// The rejection kind of a rejected submission.
    pub rejection: Option<String>,
    /// Attempts started.
    pub attempts: u32,
    /// Its own run time in ms.
    pub duration_ms: u64,
}

/// The answer of `host cancel --json` / `host remove --json`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CanceledJson {
    /// Whether this request made the stop claim.
    pub claimed: bool,
    /// The final report, when it waited for the end.
    pub report: Option<CanceledReport>,
}

/// The answer of `host cancel --json` / `host remove --json`: whether this
/// request made the stop claim, and the final report when it waited.
pub fn canceled(claimed: bool, report: Option<&TaskReport>) -> CanceledJson {
    let report = report.map(|r| CanceledReport {
        id: r.id.get(),
        name: r.name.to_string(),
        outcome: r.outcome.kind().as_str(),
        reason: r.outcome.reason().map(str::to_owned),
        rejection: r.outcome.rejection().map(|k| k.to_string()),
        attempts: r.attempts,
        duration_ms: r.duration.as_millis() as u64,
    });
    CanceledJson { claimed, report }
}

/// The answer of `host submit --json` (without `--wait`) and of `POST
/// /api/tasks`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SubmittedJson<'a> {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its slot.
    pub slot: String,
    /// Whether it waits (anything but running at once).
    pub queued: bool,
    /// Where it went.
    #[schemars(extend("enum" = ["running", "queued", "replacing", "rejected", "waiting"]))]
    pub state: &'static str,
    /// The owner it replaces (`replacing`).
    pub replacing: Option<u64>,
    /// Whether this is the task an idempotency key made before.
    pub existing: bool,
    /// A delayed task's due time, ms since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_ms: Option<u64>,
    /// The same, as RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due: Option<String>,
    /// A rejected submission's result, over HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<JsonResult<'a>>,
}

/// The answer of `host submit --json` (without `--wait`).
pub fn submitted(s: &crate::wire::protocol::Submitted) -> SubmittedJson<'static> {
    use crate::wire::protocol::Placement;
    let (state, replacing, due_ms) = match &s.placement {
        Placement::Running => ("running", None, None),
        Placement::Queued { .. } => ("queued", None, None),
        Placement::Replacing { owner, .. } => ("replacing", Some(owner.get()), None),
        Placement::Rejected(_) => ("rejected", None, None),
        Placement::Delayed { due_ms } => ("waiting", None, Some(*due_ms)),
    };
    SubmittedJson {
        id: s.id.get(),
        name: s.name.clone(),
        slot: s.slot.clone(),
        queued: state != "running",
        state,
        replacing,
        existing: s.existing,
        due_ms,
        due: due_ms.map(crate::schedule::format_ms),
        outcome: None,
    }
}

/// Why a batch's item was refused.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RefusedJson {
    /// The reason, in the CLI's words.
    pub error: String,
    /// Its kind.
    #[schemars(extend("enum" = ["invalid", "not_found", "conflict", "over_quota", "shutting_down", "forbidden", "internal"]))]
    pub kind: &'static str,
}

/// One answer of a batch: where it went, or why it was refused.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum BatchItemJson {
    /// Accepted (or the task its idempotency key made before).
    Submitted(Box<SubmittedJson<'static>>),
    /// Refused.
    Refused(RefusedJson),
}

/// The answer of `POST /api/tasks/batch`: one item per task, in order.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BatchJson {
    /// One per task submitted, in order.
    pub items: Vec<BatchItemJson>,
}

/// One answer of a batch (`host submit --batch --json`, `POST
/// /api/tasks/batch`): as [`submitted`], or `{"error", "kind"}` with the
/// reason it was refused and its kind (`invalid`, `not_found`, `conflict`,
/// `over_quota`, `shutting_down`, `forbidden`, `internal`).
pub fn batch_item(item: &crate::wire::protocol::BatchItem) -> BatchItemJson {
    use crate::wire::protocol::{BatchItem, ErrorKind};
    match item {
        BatchItem::Submitted(s) => BatchItemJson::Submitted(Box::new(submitted(s))),
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
            BatchItemJson::Refused(RefusedJson {
                error: message.clone(),
                kind,
            })
        }
    }
}

/// A schedule of `host schedule ls --json` (and of its other verbs).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ScheduleJson {
    /// Its name.
    pub name: String,
    /// Its cron expression.
    pub cron: String,
    /// Its time zone.
    pub tz: String,
    /// What a firing missed while the daemon was down does.
    pub missed: &'static str,
    /// Whether it is paused.
    pub paused: bool,
    /// Its plugin's name.
    pub plugin: String,
    /// Its plugin's SHA-256.
    pub digest: String,
    /// The slot its tasks take.
    pub slot: Option<String>,
    /// Its tasks' admission policy.
    pub policy: Option<String>,
    /// Its tasks' priority.
    pub priority: i32,
    /// Its next firing, ms since the Unix epoch.
    pub next_ms: Option<u64>,
    /// The same, as RFC 3339.
    pub next: Option<String>,
    /// Its last firing, ms since the Unix epoch.
    pub last_fire_ms: Option<u64>,
    /// The same, as RFC 3339.
    pub last_fire: Option<String>,
    /// The task of its last firing.
    pub last_task: Option<u64>,
    /// How that task ended.
    pub last_outcome: Option<&'static str>,
    /// When it was added, ms since the Unix epoch.
    pub created_ms: u64,
}

/// A schedule of `host schedule ls --json` (and of its other verbs).
pub fn schedule(r: &crate::wire::protocol::ScheduleRow) -> ScheduleJson {
    let time = |ms: Option<u64>| ms.map(crate::schedule::format_ms);
    ScheduleJson {
        name: r.name.clone(),
        cron: r.cron.clone(),
        tz: r.tz.clone(),
        missed: r.missed.as_str(),
        paused: r.paused,
        plugin: r.plugin.clone(),
        digest: r.digest.to_string(),
        slot: r.slot.clone(),
        policy: r.policy.map(|p| p.to_string()),
        priority: r.priority,
        next_ms: r.next_ms,
        next: time(r.next_ms),
        last_fire_ms: r.last_fire_ms,
        last_fire: time(r.last_fire_ms),
        last_task: r.last_task.map(|id| id.get()),
        last_outcome: r.last_outcome.map(|o| o.as_str()),
        created_ms: r.created_ms,
    }
}

/// A row of `host plugins ls --json`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PluginRowJson {
    /// Its SHA-256.
    pub digest: String,
    /// Its declared name.
    pub name: Option<String>,
    /// Its size.
    pub bytes: u64,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    /// Unfinished tasks that use it.
    pub unfinished: u64,
    /// Finished tasks kept that used it.
    pub finished: u64,
    /// Whether it is compiled in memory.
    pub loaded: bool,
}

/// A row of `host plugins ls --json`.
pub fn plugin_row(r: &crate::wire::protocol::PluginRow) -> PluginRowJson {
    PluginRowJson {
        digest: r.digest.to_string(),
        name: r.name.clone(),
        bytes: r.bytes,
        stored_ms: r.stored_ms,
        unfinished: r.unfinished,
        finished: r.finished,
        loaded: r.loaded,
    }
}

/// The answer of `host shutdown --json`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ShutdownJson {
    /// Whether every task stopped within the grace.
    pub all_stopped: bool,
    /// The names of the tasks force-aborted, sorted.
    pub force_aborted: Vec<String>,
}

/// The answer of `host shutdown --json`.
pub fn shutdown(report: &taskhost_core::supervisor::ShutdownReport) -> ShutdownJson {
    use taskhost_core::supervisor::ShutdownReport;
    let stuck = match report {
        ShutdownReport::AllStopped => Vec::new(),
        ShutdownReport::GraceExceeded { stuck } => stuck.iter().map(|n| n.to_string()).collect(),
    };
    ShutdownJson {
        all_stopped: stuck.is_empty(),
        force_aborted: stuck,
    }
}
