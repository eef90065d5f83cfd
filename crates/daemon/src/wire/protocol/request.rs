//! What a client asks ([`Request`]), which events it follows, and the
//! checks of what serde cannot check.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use taskhost_core::lifecycle::TaskState;
use taskhost_core::outcome::OutcomeKind;
use taskhost_core::slot_settings;
use taskhost_core::supervisor::{Event, EventKind, TaskId, TaskRef};
use taskhost_runtime::Digest;

use super::namespace::{Enter, NamespaceVerb, check_name};
use super::submit::{check_submit, duration};
use super::{KvVerb, ScheduleVerb, SlotRuleVerb, SubmitRequest};

/// Which events `host events` wants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventFilter {
    /// Only events of this task (by id, or by name).
    pub task: Option<TaskRef>,
    /// Only these kinds (empty: every kind).
    pub kinds: Vec<EventKind>,
}

impl EventFilter {
    /// Whether `event` passes the filter.
    pub fn admits(&self, event: &Event) -> bool {
        let task = match &self.task {
            None => true,
            Some(TaskRef::Id(id)) => event.task_id == Some(*id),
            Some(TaskRef::Name(name)) => event.name.as_deref() == Some(name.as_str()),
        };
        task && (self.kinds.is_empty() || self.kinds.contains(&event.kind))
    }
}

/// Which live tasks a bulk verb acts on (`host cancel --filter`): each
/// condition given holds of each one, as `host ps` shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskFilter {
    /// Its state (`queued`, `running`, `waiting`, ...).
    pub state: Option<TaskState>,
    /// Its slot: a name, or a glob (`*` any run, `?` one character).
    pub slot: Option<String>,
    /// Its name: a name, or a glob.
    pub name: Option<String>,
    /// Its plugin's name.
    pub plugin: Option<String>,
    /// How it ended (`failed`, `canceled`, ...): finished tasks only.
    pub outcome: Option<OutcomeKind>,
    /// Submitted at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Submitted before this time (ms since the Unix epoch).
    pub until_ms: Option<u64>,
}

impl TaskFilter {
    /// Whether `row` passes.
    pub fn admits(&self, row: &super::TaskRow) -> bool {
        let glob = |pattern: &Option<String>, text: &str| {
            pattern
                .as_deref()
                .is_none_or(|p| slot_settings::glob_matches(p, text))
        };
        let submitted = || crate::schedule::now_ms().saturating_sub(row.age.as_millis() as u64);
        self.state.is_none_or(|s| row.state.shown() == s)
            && self.since_ms.is_none_or(|since| submitted() >= since)
            && self.until_ms.is_none_or(|until| submitted() < until)
            && glob(&self.slot, &row.slot)
            && glob(&self.name, &row.name)
            && self.plugin.as_deref().is_none_or(|p| row.plugin == p)
            && self.outcome.is_none_or(|o| row.outcome == Some(o))
    }

    /// The filter of the conditions given, each a key of
    /// [`TaskFilter::set`] with its value when there is one.
    pub fn of<'a>(
        conditions: impl IntoIterator<Item = (&'a str, Option<String>)>,
    ) -> Result<Self, String> {
        let mut filter = Self::default();
        for (key, value) in conditions {
            if let Some(value) = value {
                filter.set(key, &value)?;
            }
        }
        Ok(filter)
    }

    /// Sets the condition `key` (`state`, `slot`, `name`, `plugin`,
    /// `outcome`, `since`, `until`) to `value`, the words of `host ps`
    /// (a time is RFC 3339, or a duration ago such as `2h`); what is wrong
    /// otherwise, naming the key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "state" => {
                self.state = Some(TaskState::parse(value).ok_or_else(|| {
                    format!(
                        "state `{value}` is not a state; `host ps` shows queued, running, \
                         waiting, backing-off, throttled, stopping, finishing, finished"
                    )
                })?)
            }
            "outcome" => {
                self.outcome = Some(OutcomeKind::from_word(value).ok_or_else(|| {
                    format!(
                        "outcome `{value}` is not an outcome; give completed, failed, fatal, \
                         canceled, force-aborted, panicked or rejected"
                    )
                })?)
            }
            "slot" => self.slot = Some(value.to_owned()),
            "name" => self.name = Some(value.to_owned()),
            "plugin" => self.plugin = Some(value.to_owned()),
            "since" => self.since_ms = Some(time_of(key, value)?),
            "until" => self.until_ms = Some(time_of(key, value)?),
            other => {
                return Err(format!(
                    "`{other}` is not a key; give state, slot, name, plugin, outcome, since \
                     or until"
                ));
            }
        }
        Ok(())
    }

    /// Whether it names no condition (it would match every task).
    pub fn is_empty(&self) -> bool {
        self == &TaskFilter::default()
    }
}

/// A filter's time: RFC 3339, or a duration before now (`90m`: an hour
/// and a half ago), as ms since the Unix epoch.
fn time_of(key: &str, value: &str) -> Result<u64, String> {
    // A duration has its unit here (a bare `0` is no time).
    let duration = value.trim() != "0";
    if let Some(ago) = duration
        .then(|| taskhost_core::units::parse_duration(value).ok())
        .flatten()
    {
        return Ok(crate::schedule::now_ms().saturating_sub(ago.as_millis() as u64));
    }
    crate::schedule::parse_rfc3339(value)
        .map_err(|e| format!("{key}: {e}; or give a duration before now, such as 2h"))
}

/// One page of a filtered task list (`host ps --filter --limit
/// --before`, `GET /api/tasks?...`): the tasks that pass the filter,
/// newest first, older than `before`, at most `limit`; the next page is
/// the one before the last id of this one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskPage {
    /// Finished ones too (as `host ps --all`; implied by an `outcome`).
    pub all: bool,
    /// Which tasks (none: every one).
    pub filter: TaskFilter,
    /// Only tasks with a smaller id (the cursor: the last id of the page
    /// before).
    pub before: Option<TaskId>,
    /// At most this many (none: every one).
    pub limit: Option<u32>,
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Is this plugin already known to the daemon?
    HasPlugin(Digest),
    /// One chunk of a plugin upload; `offset` continues this connection's
    /// upload of `digest`; `last` completes it.
    Upload {
        /// The digest of the whole plugin.
        digest: Digest,
        /// Where this chunk starts.
        offset: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Whether this is the final chunk.
        last: bool,
    },
    /// Submit a task.
    Submit(Box<SubmitRequest>),
    /// Submit up to [`MAX_BATCH`](super::MAX_BATCH) tasks in one call,
    /// each as a [`Request::Submit`] of its own (its checks, its idempotency
    /// key, the admission rules), in order; answered with one
    /// [`Reply::SubmittedBatch`](super::Reply::SubmittedBatch) once every
    /// accepted one is durable.
    SubmitBatch(Vec<SubmitRequest>),
    /// Wait for a task's final report.
    Wait(TaskRef),
    /// Submit a new task with the request of this one (as it was placed:
    /// its name, slot and policy); answered as a [`Request::Submit`].
    Rerun(TaskRef),
    /// Stop a task (or remove queued work); with `wait`, wait for its end.
    Cancel {
        /// Which task.
        target: TaskRef,
        /// Wait for the logical end.
        wait: bool,
    },
    /// Stop every live task that passes the filter (queued work is
    /// removed), each as [`Request::Cancel`] would one, without waiting;
    /// with `dry_run`, only count them. Answered with
    /// [`Reply::Matched`](super::Reply::Matched).
    CancelMatching {
        /// Which tasks (at least one condition).
        filter: TaskFilter,
        /// Count and list them, stop none.
        dry_run: bool,
    },
    /// Submit again the request of every finished task (of those `host
    /// ps --all` lists) that passes the filter, each as [`Request::Rerun`]
    /// would its id, in one batch; with `dry_run`, only count them.
    /// Answered with [`Reply::Matched`](super::Reply::Matched).
    RerunMatching {
        /// Which tasks (at least one condition).
        filter: TaskFilter,
        /// Count and list them, submit none.
        dry_run: bool,
    },
    /// A page of tasks: pages of [`Reply::Tasks`](super::Reply::Tasks)
    /// (newest first), then [`Reply::End`](super::Reply::End).
    Page(TaskPage),
    /// Live tasks (queued ones included); with `all`, recently finished ones
    /// too. Answered with pages of [`Reply::Tasks`](super::Reply::Tasks), then [`Reply::End`](super::Reply::End).
    List {
        /// Include recently finished tasks.
        all: bool,
    },
    /// The controller's slots: pages of [`Reply::Slots`](super::Reply::Slots), then
    /// [`Reply::End`](super::Reply::End).
    Slots,
    /// Recent events that pass the filter; with `follow`, then live ones
    /// until the client leaves.
    Events {
        /// Keep streaming.
        follow: bool,
        /// Which events.
        filter: EventFilter,
    },
    /// A task's log lines; with `follow`, then live ones until it ends.
    Logs {
        /// Which task.
        target: TaskRef,
        /// Keep streaming.
        follow: bool,
    },
    /// Shut the daemon down.
    Shutdown {
        /// Grace for running tasks; `None`: the daemon's own.
        grace: Option<Duration>,
        /// End every task and queued submission now (Canceled,
        /// ForceAborted, Rejected ShuttingDown) instead of keeping
        /// unfinished work in a durable store for the next start.
        cancel_all: bool,
    },
    /// The stored plugins: pages of [`Reply::Plugins`](super::Reply::Plugins), then [`Reply::End`](super::Reply::End).
    Plugins,
    /// Remove stored plugins: the one whose digest starts with `prefix`
    /// (refused while an unfinished task uses it), or with `prefix` `None`
    /// every plugin no task uses. Answered with [`Reply::PluginsRemoved`](super::Reply::PluginsRemoved).
    RemovePlugins {
        /// A digest or its unique prefix (hex); `None`: every unused one.
        prefix: Option<String>,
    },
    /// A verb on schedules (`host schedule …`).
    Schedule(ScheduleVerb),
    /// A verb on guests' key-value state (`host kv …`).
    Kv(KvVerb),
    /// A verb on the operator's slot rules (`host slot …`).
    SlotRule(SlotRuleVerb),
    /// Act in a namespace from now on (`--namespace`, `--all-namespaces`).
    Enter(Enter),
    /// A verb on namespaces (`host ns …`).
    Namespace(NamespaceVerb),
    /// A verb on named deployments (`host deploy`, `host deployments …`,
    /// `host rollback`).
    Deployment(super::DeploymentVerb),
    /// Up to [`UPLOAD_CHUNK`](super::UPLOAD_CHUNK) bytes of a stored
    /// plugin from `offset` (`host push` of a deployment); answered with
    /// [`Reply::PluginChunk`](super::Reply::PluginChunk).
    Download {
        /// The plugin.
        digest: Digest,
        /// Where the chunk starts.
        offset: u64,
    },
    /// The record of one of a task's attempts (`host record export`,
    /// `host replay ID`): a record file holding it, in
    /// [`Reply::RecordPart`](super::Reply::RecordPart)s, then
    /// [`Reply::End`](super::Reply::End).
    Record {
        /// Which task.
        target: TaskRef,
        /// Which attempt [default: the last one recorded].
        attempt: Option<u32>,
    },
}

impl Request {
    /// Checks the durations and sizes a request carries, which serde only
    /// checked for their type: every one within [`MAX_WIRE_DURATION`](super::MAX_WIRE_DURATION), a
    /// memory limit of at least one WebAssembly page; and that a client
    /// sets nothing only the daemon sets.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Request::Submit(submit) => check_submission(submit),
            Request::SubmitBatch(batch) => {
                if batch.len() > super::MAX_BATCH {
                    return Err(format!(
                        "a batch of {} submissions is over the limit of {}: split it",
                        batch.len(),
                        super::MAX_BATCH
                    ));
                }
                // Each item is checked on its own: a bad one is refused in
                // its place, the others go on.
                Ok(())
            }
            Request::Schedule(ScheduleVerb::Add(spec)) => {
                if spec.request.parent.is_some()
                    || spec.request.root.is_some()
                    || spec.request.depth != 0
                {
                    return Err("a schedule's firings have no parent".into());
                }
                if spec.request.namespace.is_some() {
                    return Err("a schedule's firings go to the schedule's namespace".into());
                }
                if spec.request.schedule.is_some() || spec.request.name.is_some() {
                    return Err(
                        "a schedule's firings are named `<schedule>-<id>`: it takes \
                                no task name"
                            .into(),
                    );
                }
                if spec.request.not_before.is_some() {
                    return Err("a schedule's firings take no --delay or --at".into());
                }
                if spec.request.idempotency_key.is_some() {
                    return Err("a schedule's firings take no idempotency key".into());
                }
                check_submit(&spec.request)
            }
            Request::Shutdown { grace, .. } => duration("the grace", *grace),
            Request::CancelMatching { filter, .. } | Request::RerunMatching { filter, .. }
                if filter.is_empty() =>
            {
                Err(
                    "a filter needs at least one condition (state, slot, name, plugin, \
                     outcome, since or until): an empty one would act on every task"
                        .into(),
                )
            }
            Request::SlotRule(SlotRuleVerb::Set(row)) => {
                slot_settings::check_pattern(&row.pattern)?;
                row.settings.check()
            }
            Request::SlotRule(SlotRuleVerb::Unset(pattern)) => {
                slot_settings::check_pattern(pattern)
            }
            Request::Namespace(
                NamespaceVerb::Add(name, change) | NamespaceVerb::Set(name, change),
            ) => {
                check_name(name)?;
                change.check()
            }
            Request::Enter(Enter {
                namespace: Some(name),
                ..
            })
            | Request::Namespace(NamespaceVerb::Remove(name)) => check_name(name),
            Request::Deployment(verb) => check_deployment(verb),
            _ => Ok(()),
        }
    }
}

/// A deployment verb's names and versions, as the service reads them.
fn check_deployment(verb: &super::DeploymentVerb) -> Result<(), String> {
    use super::DeploymentVerb as V;
    use super::deployment::{check_name, check_version};
    match verb {
        V::Deploy { name, version, .. } => {
            name.as_deref().map(check_name).transpose()?;
            version.as_deref().map(check_version).transpose()?;
        }
        V::List => {}
        V::History(name) => check_name(name)?,
        V::Rollback { name, to } => {
            check_name(name)?;
            to.as_deref().map(check_version).transpose()?;
        }
        V::Remove { name, version } => {
            check_name(name)?;
            check_version(version)?;
        }
    }
    Ok(())
}

/// The checks of one submission a client sends (a Submit's, each item of a
/// batch's): nothing only the daemon sets, durations and sizes in range.
pub(crate) fn check_submission(submit: &SubmitRequest) -> Result<(), String> {
    if submit.schedule.is_some() {
        return Err(
            "a submission cannot name a schedule: schedules fire their own \
                    (`host schedule add`)"
                .into(),
        );
    }
    if submit.namespace.is_some() {
        return Err(
            "a submission cannot name its namespace: it goes to the connection's \
                    (`host --namespace NAME submit ...`)"
                .into(),
        );
    }
    if submit.parent.is_some() || submit.root.is_some() || submit.depth != 0 {
        return Err(
            "a submission cannot name a parent: a task's children are spawned by \
                    its plugin (taskhost:plugin/children)"
                .into(),
        );
    }
    check_submit(submit)
}
