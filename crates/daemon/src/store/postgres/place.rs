//! Owns where a decided submission goes, for single and batched admission
//! alike (a single admission is a batch of one): the slot as the decision
//! sees it ([`SlotNow`]), the registry's rule then `admission::decide`
//! ([`decide`]), the decision applied to the slot ([`Pg::apply`]: the
//! newcomer's state, position and placement; what a Replace displaces and
//! stops), and the newcomer's row ([`NewRow`]), written in one statement
//! however many there are ([`insert`]). State words go through
//! [`TaskState`]. It decides nothing of its own.

use std::sync::Arc;

use taskhost_core::admission::{self, AdmissionPolicy, Decision, Limits, SlotSummary, Totals};
use taskhost_core::lifecycle::TaskState;
use taskhost_core::logline::LogLine;
use taskhost_core::outcome::{RejectionKind, TaskOutcome};
use taskhost_core::supervisor::{TaskId, TaskReport};

use super::claim::{end_task, never_ran_row, report_of};
use super::{
    Admission, Claimed, Pg, STOP, all, decode_request, encode, exec, id_of, ms, one, sql_id,
};
use crate::store::{StoreError, now_ms};
use crate::wire::protocol::{NotBefore, Placement};

/// A slot as admissions see it: read in the transaction that holds its
/// lock, then kept up to date with each decision made in it.
pub(super) struct SlotNow {
    /// How many owners it has (admitted, running or being stopped).
    pub owners: usize,
    /// Its oldest owner, and its oldest not being stopped.
    pub first: Option<TaskId>,
    pub oldest_running: Option<TaskId>,
    /// Its queue's length, or (below its bound, see [`slot_columns`])
    /// the span of its positions, and whether it was counted.
    pub queued: usize,
    pub queued_counted: bool,
    pub last_pos: Option<i64>,
    /// The head of its queue, with its position.
    pub head: Option<(TaskId, i64)>,
    /// Its settings, off its row: a rule's capacity, and the one its
    /// latest submission's plugin declared (what counts without a rule).
    pub capacity: Option<usize>,
    pub declared: Option<u32>,
    /// `declared` changed since the row was read: it is written back.
    pub declared_changed: bool,
    pub max_queue: Option<usize>,
    /// Its debounce and `max-wait`, in milliseconds.
    pub debounce_ms: Option<i64>,
    pub max_wait_ms: Option<i64>,
    /// A Replace changed it in ways only the database follows: later
    /// admissions to it read it again.
    pub stale: bool,
}

/// The columns both slot reads select, from the second on (`SlotNow`'s,
/// then the cluster's queued tasks and the rules' version); the first is
/// the read's own. `bound` is the parameter holding the node's
/// `max_slot_queue`. The queue's length is counted only when it could
/// reach its bound: below it, the span of its positions stands in (queued
/// positions are distinct, so the span is never less than the count, and
/// both are 0 for an empty queue); the last column says whether it was
/// counted.
pub(super) fn slot_columns(bound: &str) -> String {
    format!(
        "o.n, f.id, r.id, \
         CASE WHEN h.pos IS NULL THEN 0 \
             WHEN q.last - h.pos + 1 < coalesce(sl.max_queue, {bound}::int8) THEN q.last - h.pos + 1 \
             ELSE (SELECT count(*) FROM taskhost_tasks WHERE slot = sl.slot AND state = 'queued') END, \
         q.last, h.id, h.pos, \
         sl.capacity, sl.max_queue, sl.declared, sl.debounce_ms, sl.max_wait_ms, \
         (SELECT count(*) FROM taskhost_tasks WHERE state = 'queued'), \
         (SELECT version FROM taskhost_slot_rules_version), \
         h.pos IS NULL OR q.last - h.pos + 1 >= coalesce(sl.max_queue, {bound}::int8)"
    )
}

/// What the slot reads join, for the slot in `sl.slot`: its owners, and
/// its queue's first and last entries in the queue index's order.
pub(super) const SLOT_JOINS: &str = "LEFT JOIN LATERAL (SELECT count(*) AS n FROM taskhost_tasks \
         WHERE slot = sl.slot AND state IN ('ready', 'running', 'stopping')) o ON TRUE \
     LEFT JOIN LATERAL (SELECT id FROM taskhost_tasks WHERE slot = sl.slot \
         AND state IN ('ready', 'running', 'stopping') ORDER BY pos, id LIMIT 1) f ON TRUE \
     LEFT JOIN LATERAL (SELECT id FROM taskhost_tasks WHERE slot = sl.slot \
         AND state IN ('ready', 'running') ORDER BY pos, id LIMIT 1) r ON TRUE \
     LEFT JOIN LATERAL (SELECT pos AS last FROM taskhost_tasks \
         WHERE slot = sl.slot AND state = 'queued' ORDER BY pos DESC, id DESC LIMIT 1) q ON TRUE \
     LEFT JOIN LATERAL (SELECT id, pos FROM taskhost_tasks WHERE slot = sl.slot AND state = 'queued' \
         ORDER BY pos, id LIMIT 1) h ON TRUE";

impl SlotNow {
    /// The slot from a row of [`slot_columns`] (from column 1); with the
    /// cluster's queued tasks and the rules' version the row was read at.
    pub(super) fn from_row(row: &tokio_postgres::Row) -> (Self, usize, i64) {
        let now = Self {
            owners: row.get::<_, i64>(1).max(0) as usize,
            first: row.get::<_, Option<i64>>(2).map(id_of),
            oldest_running: row.get::<_, Option<i64>>(3).map(id_of),
            queued: row.get::<_, i64>(4).max(0) as usize,
            last_pos: row.get(5),
            head: row
                .get::<_, Option<i64>>(6)
                .map(id_of)
                .zip(row.get::<_, Option<i64>>(7)),
            capacity: row.get::<_, Option<i32>>(8).map(|c| c.max(1) as usize),
            max_queue: row.get::<_, Option<i64>>(9).map(|q| q.max(0) as usize),
            declared: row.get::<_, Option<i32>>(10).map(|c| c.max(1) as u32),
            declared_changed: false,
            debounce_ms: row.get(11),
            max_wait_ms: row.get(12),
            stale: false,
            queued_counted: row.get(15),
        };
        let pending = row.get::<_, i64>(13).max(0) as usize;
        (now, pending, row.get(14))
    }
}

/// Decides a submission named `name` to `slot` under `policy`: the
/// registry's rule first (a name is held by one live task; `holder` holds
/// it in another slot), then the slot's, against `pending` queued tasks in
/// the whole cluster. The slot takes the capacity the submission's plugin
/// declares (kept for its releases), which counts unless a rule sets one.
pub(super) fn decide(
    a: &Admission,
    (name, slot, policy): (&str, &str, AdmissionPolicy),
    now: &mut SlotNow,
    holder: Option<i64>,
    pending: usize,
) -> Decision {
    if let Some(holder) = holder {
        return Decision::Reject {
            kind: RejectionKind::AlreadyExists,
            reason: format!(
                "task name `{name}` is held by task {} in another slot",
                id_of(holder)
            ),
        };
    }
    let limits = Limits {
        max_slot_queue: now.max_queue.unwrap_or(a.max_slot_queue),
        queue_bound: if now.max_queue.is_some() {
            "max_queue of its slot rule"
        } else {
            "max_slot_queue"
        },
        max_total_pending: a.max_total_pending,
        // Slot rows stay in the database: it bounds no slot count.
        max_slots: usize::MAX,
        holder: "the cluster",
    };
    if let Some(declared) = a.declared
        && declared != now.declared
    {
        now.declared = declared;
        now.declared_changed = true;
    }
    let summary = SlotSummary {
        owners: now.owners,
        capacity: now
            .capacity
            .or(now.declared.map(|c| c as usize))
            .unwrap_or(1),
        oldest_running: now.oldest_running,
        queued: now.queued,
        head: now.head.map(|h| h.0),
        tracked: true,
    };
    let totals = Totals { pending, slots: 0 };
    admission::decide(slot, &summary, policy, totals, &limits, false)
}

/// Writes the capacity declared by the latest submission of each slot in
/// `slots` whose changed (`SlotNow::declared_changed`), and clears the mark.
pub(super) async fn write_declared<'a>(
    tx: &deadpool_postgres::Transaction<'_>,
    slots: impl Iterator<Item = (&'a str, &'a mut SlotNow)>,
) -> Result<(), StoreError> {
    let (mut names, mut declared) = (Vec::new(), Vec::new());
    for (slot, now) in slots {
        if std::mem::take(&mut now.declared_changed) {
            names.push(slot);
            declared.push(now.declared.map(|c| c.min(i32::MAX as u32) as i32));
        }
    }
    if !names.is_empty() {
        exec(
            tx,
            "cannot record the slots' declared capacity",
            "UPDATE taskhost_slots s SET declared = u.d \
                 FROM unnest($1::text[], $2::int4[]) AS u(slot, d) WHERE s.slot = u.slot",
            &[&names, &declared],
        )
        .await?;
    }
    Ok(())
}

/// What a decision made of a submission: the state and queue position
/// its row records, and where it went.
pub(super) struct Placed {
    pub state: TaskState,
    pub pos: i64,
    pub placement: Placement,
}

impl Placed {
    fn new(state: TaskState, pos: i64, placement: Placement) -> Self {
        Self {
            state,
            pos,
            placement,
        }
    }
}

impl Pg {
    /// Applies `decision` about task `id` to its slot as `now` holds it
    /// (the caller holds the slot's lock): the newcomer's state, position
    /// and placement, with `now` moved on. A Replace ends the head it
    /// displaces and stops the owner in `tx`, and leaves `now` stale.
    pub(super) async fn apply(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        id: TaskId,
        decision: Decision,
        now: &mut SlotNow,
    ) -> Result<Placed, StoreError> {
        let owner = now.first;
        Ok(match decision {
            Decision::Reject { kind, reason } => Placed::new(
                TaskState::Finished,
                0,
                Placement::Rejected(TaskOutcome::Rejected { kind, reason }),
            ),
            Decision::Admit => {
                now.owners += 1;
                now.first = now.first.or(Some(id));
                now.oldest_running = now.oldest_running.or(Some(id));
                Placed::new(TaskState::Ready, 0, Placement::Running)
            }
            Decision::Enqueue => {
                let pos = now.last_pos.unwrap_or(0) + 1;
                now.queued += 1;
                now.last_pos = Some(pos);
                now.head = now.head.or(Some((id, pos)));
                Placed::new(TaskState::Queued, pos, Placement::Queued { owner })
            }
            Decision::Replace { displaced, stop } => {
                let head = now.head.map_or(0, |h| h.1);
                now.stale = true;
                if let Some(old) = displaced {
                    let report = never_ran_row(
                        tx,
                        old,
                        RejectionKind::SupersededByReplace,
                        format!("a newer Replace submission ({id}) took its place"),
                    )
                    .await?;
                    end_task(self, tx, &report, &[]).await?;
                }
                match stop {
                    None => Placed::new(TaskState::Queued, head - 1, Placement::Queued { owner }),
                    Some(owner) => self.stop_for_replace(tx, owner, head).await?,
                }
            }
        })
    }

    /// Stops the owner a Replace displaces, as its row says it can be:
    /// a running one is asked to stop (the newcomer heads the queue, ahead
    /// of `head`), one admitted but not claimed yet ends Canceled at once
    /// (the newcomer owns the slot), one already stopping is left to end.
    async fn stop_for_replace(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        owner: TaskId,
        head: i64,
    ) -> Result<Placed, StoreError> {
        // Locked: a claim may be turning it from ready to running; this
        // waits for that to commit.
        let owner_row = one(
            tx,
            "cannot read the owner",
            "SELECT name, state FROM taskhost_tasks WHERE id = $1 FOR UPDATE",
            &[&sql_id(owner)],
        )
        .await?;
        let name: String = owner_row.get(0);
        let state = owner_row.get::<_, &str>(1);
        Ok(match TaskState::parse(state) {
            Some(TaskState::Running) => {
                exec(
                    tx,
                    "cannot stop the owner",
                    "UPDATE taskhost_tasks SET state = $2 WHERE id = $1",
                    &[&sql_id(owner), &TaskState::Stopping.as_str()],
                )
                .await?;
                self.notify(tx, STOP, &owner.get().to_string()).await?;
                let placement = Placement::Replacing { owner, name };
                Placed::new(TaskState::Queued, head - 1, placement)
            }
            Some(TaskState::Ready) => {
                let report = report_of(tx, owner, TaskOutcome::Canceled).await?;
                end_task(self, tx, &report, &[]).await?;
                Placed::new(TaskState::Ready, 0, Placement::Replacing { owner, name })
            }
            // Already being stopped: first in line.
            _ => {
                let placement = Placement::Queued { owner: Some(owner) };
                Placed::new(TaskState::Queued, head - 1, placement)
            }
        })
    }
}

/// A decided row on its way into `taskhost_tasks`.
pub(super) struct NewRow {
    pub id: i64,
    name: String,
    slot: String,
    plugin: String,
    digest: Vec<u8>,
    request: Vec<u8>,
    pub state: TaskState,
    pos: i64,
    placed: bool,
    priority: i32,
    schedule: Option<String>,
    /// The time it was due (a schedule's firing), kept for the record.
    due_ms: Option<i64>,
    parent: Option<i64>,
    root: Option<i64>,
    /// A rejected one is recorded finished at once: its outcome's word,
    /// report and (empty) log.
    outcome: Option<&'static str>,
    report: Option<Vec<u8>>,
    log: Option<Vec<u8>>,
    /// Whether the node admitting it may claim it at once.
    claimable: bool,
    /// Claimed at its insert by this node (its id): inserted running,
    /// with a fencing token.
    claim: Option<i64>,
}

impl NewRow {
    /// The row of task `id`, admission `a` named `names`, as `placed`
    /// says.
    pub(super) fn new(
        a: &Admission,
        id: i64,
        (name, slot, policy): (&str, &str, AdmissionPolicy),
        placed: &Placed,
    ) -> Result<Self, StoreError> {
        let mut request = a.request.clone();
        request.name = Some(name.to_owned());
        request.slot = Some(slot.to_owned());
        request.policy = Some(policy);
        let (outcome, report, log) = match &placed.placement {
            Placement::Rejected(outcome) => {
                let report = TaskReport::never_ran(
                    id_of(id),
                    Arc::from(name),
                    Arc::from(slot),
                    outcome.clone(),
                );
                let log = encode(&Vec::<LogLine>::new())?;
                (
                    Some(outcome.kind().as_str()),
                    Some(encode(&report)?),
                    Some(log),
                )
            }
            _ => (None, None, None),
        };
        Ok(Self {
            id,
            name: name.to_owned(),
            slot: slot.to_owned(),
            plugin: a.plugin.clone(),
            digest: a.request.plugin.0.to_vec(),
            request: encode(&request)?,
            state: placed.state,
            pos: placed.pos,
            placed: !matches!(placed.placement, Placement::Rejected(_)),
            priority: request.priority,
            schedule: request.schedule.clone(),
            due_ms: match request.not_before {
                Some(NotBefore::At(at)) => Some(ms(at)),
                _ => None,
            },
            parent: request.parent.map(ms),
            root: request.root.map(ms),
            outcome,
            report,
            log,
            claimable: a.claim_here,
            claim: None,
        })
    }

    /// Whether this node may claim the row at its insert: admitted to its
    /// slot, of a submission that allows it.
    pub(super) fn claimable(&self) -> bool {
        self.claimable && self.state == TaskState::Ready
    }

    pub(super) fn priority(&self) -> i32 {
        self.priority
    }

    /// Inserts the row claimed by `node`; returns the task as its claim
    /// will read (its token once the insert has given it one).
    pub(super) fn claim_by(&mut self, node: i64) -> Result<Claimed, StoreError> {
        self.claim = Some(node);
        self.state = TaskState::Running;
        Ok(Claimed {
            id: id_of(self.id),
            token: 0,
            request: decode_request(&self.request)?,
            plugin: self.plugin.clone(),
            attempts: 0,
            failures: 0,
            resume_at_ms: None,
            submitted_ms: now_ms(),
        })
    }
}

/// Inserts decided rows in one statement; returns the fencing tokens of
/// those claimed at their insert (id, token).
pub(super) async fn insert(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: Vec<NewRow>,
) -> Result<Vec<(i64, i64)>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let now = ms(now_ms());
    let n = rows.len();
    let (mut ids, mut names, mut slots, mut plugins) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut digests, mut requests, mut states, mut positions, mut placed) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut outcomes, mut reports, mut logs, mut finished) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut priorities, mut schedules) = (Vec::new(), Vec::new());
    let (mut dues, mut parents, mut roots) = (Vec::new(), Vec::new(), Vec::new());
    let mut nodes = Vec::with_capacity(n);
    for r in rows {
        nodes.push(r.claim);
        ids.push(r.id);
        names.push(r.name);
        slots.push(r.slot);
        plugins.push(r.plugin);
        digests.push(r.digest);
        requests.push(r.request);
        states.push(r.state.as_str());
        positions.push(r.pos);
        placed.push(r.placed);
        priorities.push(r.priority);
        schedules.push(r.schedule);
        dues.push(r.due_ms);
        parents.push(r.parent);
        roots.push(r.root);
        finished.push(r.outcome.map(|_| now));
        outcomes.push(r.outcome);
        reports.push(r.report);
        logs.push(r.log);
    }
    let claimed = all(
        tx,
        "cannot record the submissions",
        "WITH i AS (INSERT INTO taskhost_tasks (id, name, slot, plugin, digest, request, state, \
             pos, placed, submitted_ms, outcome, report, log, finished_ms, priority, schedule, \
             due_ms, parent, root, node, token) \
         SELECT id, name, slot, plugin, digest, request, state, \
             CASE WHEN state IN ('ready', 'running') THEN nextval('taskhost_owner_seq') \
             ELSE pos END, placed, $10, \
             outcome, report, log, finished_ms, priority, schedule, due_ms, parent, root, node, \
             CASE WHEN node IS NOT NULL THEN nextval('taskhost_fence') END \
             FROM unnest($1::int8[], $2::text[], $3::text[], \
             $4::text[], $5::bytea[], $6::bytea[], $7::text[], $8::int8[], $9::bool[], $11::text[], \
             $12::bytea[], $13::bytea[], $14::int8[], $15::int4[], $16::text[], $17::int8[], \
             $18::int8[], $19::int8[], $20::int8[]) \
             AS u(id, name, slot, plugin, digest, request, state, pos, placed, outcome, report, \
             log, finished_ms, priority, schedule, due_ms, parent, root, node) ORDER BY id \
             RETURNING id, token) \
         SELECT id, token FROM i WHERE token IS NOT NULL",
        &[
            &ids,
            &names,
            &slots,
            &plugins,
            &digests,
            &requests,
            &states,
            &positions,
            &placed,
            &now,
            &outcomes,
            &reports,
            &logs,
            &finished,
            &priorities,
            &schedules,
            &dues,
            &parents,
            &roots,
            &nodes,
        ],
    )
    .await?;
    Ok(claimed.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Records the decision about a row that is there already (a delayed
/// submission come due): its state, position and, if rejected, its end.
pub(super) async fn update(
    tx: &deadpool_postgres::Transaction<'_>,
    row: &NewRow,
) -> Result<(), StoreError> {
    let finished = row.outcome.map(|_| ms(now_ms()));
    exec(
        tx,
        "cannot admit the delayed submission",
        "UPDATE taskhost_tasks SET state = $2, \
         pos = CASE WHEN $2 = 'ready' THEN nextval('taskhost_owner_seq') ELSE $3 END, \
         placed = $4, outcome = $5, report = $6, log = $7, finished_ms = $8 WHERE id = $1",
        &[
            &row.id,
            &row.state.as_str(),
            &row.pos,
            &row.placed,
            &row.outcome,
            &row.report,
            &row.log,
            &finished,
        ],
    )
    .await?;
    Ok(())
}
