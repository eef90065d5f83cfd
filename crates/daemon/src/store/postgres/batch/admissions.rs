//! Owns a batch of admissions: one transaction that decides every waiting
//! submission in arrival order as if one at a time (`place` applies each
//! decision, as it does for a single admission), and the admissions whose
//! slot another transaction holds, then together in a transaction that
//! waits for their slots.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use tokio::sync::mpsc;

use taskhost_core::admission::{AdmissionPolicy, Decision};
use taskhost_core::lifecycle::TaskState;
use taskhost_core::outcome::RejectionKind;

use super::{AdmitJob, Reply, gone, notify_ids};
use crate::store::StoreError;
use crate::store::postgres::place::{
    NewRow, SLOT_JOINS, SlotNow, decide, insert, slot_columns, write_declared,
};
use crate::store::postgres::rules::RowSettings;
use crate::store::postgres::{
    Admission, AdmitError, Claimed, FINISHED, NodeHooks, Pg, all, db, exec, id_of, one, retry,
    sql_id,
};
use crate::wire::protocol::{Placement, Submitted};

/// Slots with admissions waiting in the writer that waits for locks, with
/// how many each: later admissions to them wait there too, in order.
pub(super) type Deferred = Arc<std::sync::Mutex<HashMap<String, usize>>>;

/// A submission's name, slot and policy.
type Names = (String, String, AdmissionPolicy);

/// An admission whose slot another transaction held, with the id and
/// names the batch gave it.
pub(super) struct DeferredJob {
    admission: Arc<Admission>,
    id: i64,
    names: Names,
    reply: Reply<Result<Submitted, AdmitError>>,
}

/// What a batch of admissions decided: an answer for each, except those
/// whose slot was held (index, id, names), left for `admit_alone`.
type Decided = (
    Vec<Option<Result<Submitted, AdmitError>>>,
    Vec<(usize, i64, Names)>,
);

/// Admits deferred submissions (in arrival order) in one transaction that
/// waits (within `lock_timeout`) for their slots, and answers each.
pub(super) async fn admit_deferred(pg: &Pg, jobs: Vec<DeferredJob>, held: &Deferred) {
    let result = retry(|| admit_waiting(pg, &jobs)).await;
    let slots: Vec<String> = jobs.iter().map(|j| j.names.1.clone()).collect();
    match result {
        Ok(results) => {
            for (job, result) in jobs.into_iter().zip(results) {
                let _ = job.reply.send(result);
            }
        }
        Err(err) => {
            for job in jobs {
                let _ = job.reply.send(Err(AdmitError::Store(err.clone())));
            }
        }
    }
    let mut held = held
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for slot in slots {
        if let Some(n) = held.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                held.remove(&slot);
            }
        }
    }
}

/// One transaction for deferred submissions, with the ids and names their
/// batch gave them: their slots locked (waiting), read, each decided in
/// order as in a batch.
async fn admit_waiting(
    pg: &Pg,
    jobs: &[DeferredJob],
) -> Result<Vec<Result<Submitted, AdmitError>>, StoreError> {
    let mut client = pg.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(db("cannot start a transaction"))?;
    let admissions: Vec<&Admission> = jobs.iter().map(|j| &*j.admission).collect();
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    let mut named: Vec<Option<Names>> = jobs.iter().map(|j| Some(j.names.clone())).collect();
    let mut results: Vec<Option<Result<Submitted, AdmitError>>> =
        jobs.iter().map(|_| None).collect();
    let slots = Slots {
        waiting: &HashSet::new(),
        wait: true,
    };
    decide_in(pg, tx, (&admissions, &ids), &mut named, &mut results, slots).await?;
    Ok(results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(AdmitError::Store(StoreError::Failed(
                    "PostgreSQL: the submission was not decided".into(),
                )))
            })
        })
        .collect())
}

/// Admits a batch of submissions and answers each (those whose slot was
/// held, once `admit_alone` has).
pub(super) async fn admit_all(
    pg: &Pg,
    jobs: Vec<AdmitJob>,
    slow: &mpsc::UnboundedSender<DeferredJob>,
    deferred: &Deferred,
) {
    let admissions: Vec<&Admission> = jobs.iter().map(|(a, _)| &**a).collect();
    let decided = retry(|| {
        let waiting: HashSet<String> = deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        let admissions = &admissions;
        async move { admit_batch(pg, admissions, &waiting).await }
    })
    .await;
    let (results, later) = match decided {
        Ok(decided) => decided,
        Err(err) => {
            for (_, reply) in jobs {
                let _ = reply.send(Err(AdmitError::Store(err.clone())));
            }
            return;
        }
    };
    let mut later: HashMap<usize, (i64, Names)> =
        later.into_iter().map(|(i, id, n)| (i, (id, n))).collect();
    {
        let mut held = deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, names) in later.values() {
            *held.entry(names.1.clone()).or_default() += 1;
        }
    }
    for (i, ((admission, reply), result)) in jobs.into_iter().zip(results).enumerate() {
        match (later.remove(&i), result) {
            (Some((id, names)), _) => {
                let job = DeferredJob {
                    admission,
                    id,
                    names,
                    reply,
                };
                if let Err(mpsc::error::SendError(job)) = slow.send(job) {
                    let _ = job.reply.send(Err(AdmitError::Store(gone())));
                }
            }
            (None, Some(result)) => {
                let _ = reply.send(result);
            }
            (None, None) => {
                let _ = reply.send(Err(AdmitError::Store(StoreError::Failed(
                    "PostgreSQL: the submission was not decided".into(),
                ))));
            }
        }
    }
}

/// One transaction for a batch of admissions, decided in arrival order as
/// if one at a time: ids, the plugins' presence, every slot's row locked
/// (in order) and read, each decision made on the slots as the earlier ones
/// left them, then every new row in one statement and one notification.
async fn admit_batch(
    pg: &Pg,
    admissions: &[&Admission],
    waiting: &HashSet<String>,
) -> Result<Decided, StoreError> {
    let mut client = pg.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(db("cannot start a transaction"))?;
    let ids: Vec<i64> = all(
        &tx,
        "cannot allocate ids",
        "SELECT nextval('taskhost_task_ids') FROM generate_series(1, $1)",
        &[&(admissions.len() as i32)],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let mut results: Vec<Option<Result<Submitted, AdmitError>>> =
        admissions.iter().map(|_| None).collect();
    let mut named: Vec<Option<Names>> = Vec::with_capacity(admissions.len());
    for (i, a) in admissions.iter().enumerate() {
        match (a.names)(id_of(ids[i])) {
            Ok(names) => named.push(Some(names)),
            Err(e) => {
                results[i] = Some(Err(AdmitError::Invalid(e)));
                named.push(None);
            }
        }
    }
    let slots = Slots {
        waiting,
        wait: false,
    };
    let later = decide_in(pg, tx, (admissions, &ids), &mut named, &mut results, slots).await?;
    Ok((results, later))
}

/// How a batch takes its slots' locks: waiting for them, or leaving those
/// another transaction holds (and those with admissions `waiting`).
struct Slots<'a> {
    waiting: &'a HashSet<String>,
    wait: bool,
}

/// Decides `admissions` (with their ids, named: those answered already
/// in `results` are not) in `tx` in arrival order, on their slots as
/// `slots` takes them, writes the rows and commits; returns those whose
/// slot was left (index, id, names).
async fn decide_in(
    pg: &Pg,
    tx: deadpool_postgres::Transaction<'_>,
    (admissions, ids): (&[&Admission], &[i64]),
    named: &mut [Option<Names>],
    results: &mut [Option<Result<Submitted, AdmitError>>],
    slots: Slots<'_>,
) -> Result<Vec<(usize, i64, Names)>, StoreError> {
    keep_plugins(&tx, admissions, results, named).await?;
    let (locked, later) = lock_slots(pg, &tx, ids, named, slots.waiting, slots.wait).await?;
    let bound = admissions
        .iter()
        .map(|a| i64::try_from(a.max_slot_queue).unwrap_or(i64::MAX))
        .min()
        .unwrap_or(i64::MAX);
    let mut batch = read_slots(pg, &tx, (&locked, bound), named).await?;
    for (i, a) in admissions.iter().enumerate() {
        let Some(names) = named[i].take() else {
            continue;
        };
        results[i] = Some(batch.admit(pg, &tx, a, ids[i], names).await?);
    }
    let mut here = claim_at_insert(pg, &tx, &mut batch).await?;
    let tokens: HashMap<i64, i64> = insert(&tx, batch.rows).await?.into_iter().collect();
    write_declared(&tx, batch.now.iter_mut().map(|(s, n)| (s.as_str(), n))).await?;
    let claim_here = pg.announce_ready(&tx, batch.ready).await?;
    notify_ids(pg, &tx, FINISHED, &batch.rejected).await?;
    if let Err(e) = tx.commit().await {
        if let Some(here) = &here
            && !here.tasks.is_empty()
        {
            (here.hooks.unsure)();
        }
        return Err(db("cannot commit the submissions")(e));
    }
    if let Some(here) = here.as_mut() {
        here.hand_over(&tokens);
    }
    if claim_here {
        pg.claim_here();
    }
    Ok(later)
}

/// Ready rows of a batch that the admitting node claims in the same
/// insert, and the room it holds for them (freed if they are not handed
/// over).
struct Here<'p> {
    hooks: &'p NodeHooks,
    held: usize,
    tasks: Vec<Claimed>,
}

impl Here<'_> {
    /// Hands the claimed tasks, with the tokens their insert gave them,
    /// to the node.
    fn hand_over(&mut self, tokens: &HashMap<i64, i64>) {
        let mut tasks = std::mem::take(&mut self.tasks);
        tasks.retain_mut(|task| {
            tokens
                .get(&sql_id(task.id))
                .map(|token| task.token = *token)
                .is_some()
        });
        (self.hooks.claimed)(tasks, std::mem::take(&mut self.held));
    }
}

impl Drop for Here<'_> {
    fn drop(&mut self) {
        if self.held > 0 {
            (self.hooks.claimed)(Vec::new(), self.held);
        }
    }
}

/// Claims, for this node, ready rows of the batch that it has room for,
/// when nothing else waits for a claim: no ready task in the cluster (so
/// priorities and namespaces' shares are not passed over), no slot rules
/// (whose rates the claims share out) and this node alive. Those rows are
/// inserted running under a fencing token each, without the new version
/// of each row a claim makes.
async fn claim_at_insert<'p>(
    pg: &'p Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    batch: &mut Batch,
) -> Result<Option<Here<'p>>, StoreError> {
    let Some(hooks) = pg.node.get() else {
        return Ok(None);
    };
    let mut wanted: Vec<usize> = (0..batch.rows.len())
        .filter(|i| batch.rows[*i].claimable())
        .collect();
    if wanted.is_empty() || pg.has_rules() {
        return Ok(None);
    }
    let held = (hooks.reserve)(wanted.len());
    let mut here = Here {
        hooks,
        held,
        tasks: Vec::new(),
    };
    if held == 0 {
        return Ok(None);
    }
    let node = (hooks.id)();
    let free = one(
        tx,
        "cannot look for ready work",
        "SELECT coalesce((SELECT alive FROM taskhost_nodes WHERE id = $1), false) \
         AND NOT EXISTS (SELECT 1 FROM taskhost_tasks WHERE state = 'ready')",
        &[&node],
    )
    .await?;
    if !free.get::<_, bool>(0) {
        return Ok(None);
    }
    wanted.sort_by_key(|i| {
        (
            std::cmp::Reverse(batch.rows[*i].priority()),
            batch.rows[*i].id,
        )
    });
    for &i in wanted.iter().take(held) {
        here.tasks.push(batch.rows[i].claim_by(node)?);
    }
    batch.ready -= here.tasks.len();
    Ok(Some(here))
}

/// Keeps the batch's plugins while its transaction runs (collection locks
/// one to delete it; the task rows then keep them); an admission whose
/// plugin is gone is answered so, and decided no further.
async fn keep_plugins(
    tx: &deadpool_postgres::Transaction<'_>,
    admissions: &[&Admission],
    results: &mut [Option<Result<Submitted, AdmitError>>],
    named: &mut [Option<Names>],
) -> Result<(), StoreError> {
    let digests: Vec<&[u8]> = admissions.iter().map(|a| &a.request.plugin.0[..]).collect();
    let present: HashSet<Vec<u8>> = all(
        tx,
        "cannot check the plugins",
        "SELECT digest FROM taskhost_plugins WHERE digest = ANY($1) FOR KEY SHARE",
        &[&digests],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    for (i, a) in admissions.iter().enumerate() {
        if results[i].is_none() && !present.contains(&a.request.plugin.0[..]) {
            results[i] = Some(Err(AdmitError::PluginGone));
            named[i] = None;
        }
    }
    Ok(())
}

/// Creates every slot's row if new, then locks them in order: admissions
/// and releases in these slots wait for this transaction from here on. A
/// slot another transaction holds (or one with admissions `waiting` in
/// `admit_alone`) is not waited for: its admissions (and every later one
/// to it) are taken out of `named` and left for `admit_alone`. Returns the
/// slots locked and those left.
async fn lock_slots(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    ids: &[i64],
    named: &mut [Option<Names>],
    waiting: &HashSet<String>,
    wait: bool,
) -> Result<(Vec<String>, Vec<(usize, i64, Names)>), StoreError> {
    let mut slots: Vec<String> = named
        .iter()
        .flatten()
        .map(|(_, slot, _)| slot.clone())
        .collect();
    slots.sort_unstable();
    slots.dedup();
    slots.retain(|slot| !waiting.contains(slot));
    // New slots' rows take the settings this node's rules give them.
    let settings: Vec<_> = slots.iter().map(|slot| pg.settings_for(slot)).collect();
    let (capacities, queues, debounces, waits) = RowSettings::columns(&settings);
    exec(
        tx,
        "cannot create the slots",
        "INSERT INTO taskhost_slots (slot, capacity, max_queue, debounce_ms, max_wait_ms) \
             SELECT * FROM unnest($1::text[], $2::int4[], $3::int8[], $4::int8[], $5::int8[]) \
             AS u(s, c, q, d, w) ORDER BY s ON CONFLICT (slot) DO NOTHING",
        &[&slots, &capacities, &queues, &debounces, &waits],
    )
    .await?;
    let lock = if wait {
        "SELECT slot FROM taskhost_slots WHERE slot = ANY($1) ORDER BY slot FOR UPDATE"
    } else {
        "SELECT slot FROM taskhost_slots WHERE slot = ANY($1) ORDER BY slot \
             FOR UPDATE SKIP LOCKED"
    };
    let locked: HashSet<String> = all(tx, "cannot lock the slots", lock, &[&slots])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    slots.retain(|slot| locked.contains(slot));
    let mut later = Vec::new();
    for (i, names) in named.iter_mut().enumerate() {
        if names
            .as_ref()
            .is_some_and(|(_, slot, _)| !locked.contains(slot))
            && let Some(names) = names.take()
        {
            later.push((i, ids[i], names));
        }
    }
    Ok((slots, later))
}

/// Reads the locked `slots`: `slot_columns` after each slot's name (the
/// node's `max_slot_queue` in `$2`).
static READ_SLOTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT sl.slot, {} FROM unnest($1::text[]) AS u(slot) \
             JOIN taskhost_slots sl ON sl.slot = u.slot {SLOT_JOINS}",
        slot_columns("$2")
    )
});

/// Reads the locked `slots` (with the pending work of the whole cluster)
/// and the live holders of the batch's names, for its decisions.
async fn read_slots(
    pg: &Pg,
    tx: &deadpool_postgres::Transaction<'_>,
    (slots, bound): (&[String], i64),
    named: &[Option<Names>],
) -> Result<Batch, StoreError> {
    let mut batch = Batch::default();
    if slots.is_empty() {
        // Every slot was left to the writer that waits for locks.
        return Ok(batch);
    }
    loop {
        let mut version = None;
        for row in all(tx, "cannot read the slots", &READ_SLOTS, &[&slots, &bound]).await? {
            let (now, pending, read_at) = SlotNow::from_row(&row);
            batch.pending = pending;
            version = Some(read_at);
            batch.now.insert(row.get(0), now);
        }
        match version {
            Some(version) if pg.catch_up(tx, version, slots).await? => batch.now.clear(),
            _ => break,
        }
    }
    let names: Vec<&str> = named
        .iter()
        .flatten()
        .map(|(name, _, _)| name.as_str())
        .collect();
    // Live holders of the names (a name is held by one live task).
    for row in all(
        tx,
        "cannot read the names",
        "SELECT name, slot, id FROM taskhost_tasks WHERE name = ANY($1) \
             AND state IN ('ready', 'running', 'stopping')",
        &[&names],
    )
    .await?
    {
        batch.holders.insert(row.get(0), (row.get(1), row.get(2)));
    }
    Ok(batch)
}

/// A batch of admissions as its decisions go: the slots and names as the
/// earlier ones left them, and what they made.
#[derive(Default)]
struct Batch {
    now: HashMap<String, SlotNow>,
    /// The live holder of each name: its slot and id.
    holders: HashMap<String, (String, i64)>,
    /// Queued tasks in the whole cluster.
    pending: usize,
    /// The rows to insert.
    rows: Vec<NewRow>,
    /// How many rows are ready (admitted to their slot).
    ready: usize,
    /// The ids of the rows rejected (recorded finished).
    rejected: Vec<i64>,
}

impl Batch {
    /// Decides the next admission, `a` as task `id_value` named `names`,
    /// on the slots as the batch has left them. A Replace, and every later
    /// admission to its slot, is the single admission's (`Pg::admit_in`):
    /// what it displaces and stops changes the slot in ways only the
    /// database follows, so it is read again.
    async fn admit(
        &mut self,
        pg: &Pg,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id_value: i64,
        (name, slot, policy): Names,
    ) -> Result<Result<Submitted, AdmitError>, StoreError> {
        let id = id_of(id_value);
        let now = self
            .now
            .get_mut(&slot)
            .ok_or_else(|| StoreError::Failed(format!("PostgreSQL: slot `{slot}` was not read")))?;
        let holder = self
            .holders
            .get(&name)
            .filter(|(held_in, _)| *held_in != slot)
            .map(|(_, holder)| *holder);
        let names = (name.as_str(), slot.as_str(), policy);
        // The registry's rule first (a name is held by one live task),
        // then the slot's; None: the single admission's to decide.
        // A debounced slot's submissions, like a Replace, are the single
        // admission's: each supersedes the one held before it.
        let decision = (holder.is_some() || (!now.stale && now.debounce_ms.is_none()))
            .then(|| decide(a, names, now, holder, self.pending));
        // A full queue whose length was not counted (the span of its
        // positions stood in) is counted by the single admission's read.
        let uncounted = |d: &Decision| {
            matches!(
                d,
                Decision::Reject {
                    kind: RejectionKind::QueueFull,
                    ..
                }
            ) && !now.queued_counted
        };
        let decision = match decision {
            Some(Decision::Replace { .. }) | None => None,
            Some(d) if uncounted(&d) => None,
            Some(d) => Some(d),
        };
        let decision = match decision {
            None => {
                insert(tx, std::mem::take(&mut self.rows)).await?;
                now.stale = true;
                // The single admission writes what its plugin declares.
                now.declared_changed = false;
                let result = pg
                    .admit_in(tx, a, id_value, (name.clone(), slot, policy))
                    .await;
                match &result {
                    Ok(s) if !matches!(s.placement, Placement::Rejected(_)) => {
                        self.holders.insert(name, (s.slot.clone(), id_value));
                    }
                    Err(AdmitError::Store(e)) => return Err(e.clone()),
                    _ => {}
                }
                self.pending = count_pending(tx).await?;
                return Ok(result);
            }
            Some(decision) => decision,
        };
        let placed = pg.apply(tx, id, decision, now).await?;
        self.rows.push(NewRow::new(a, id_value, names, &placed)?);
        match placed.state {
            TaskState::Finished => self.rejected.push(id_value),
            TaskState::Ready => {
                self.ready += 1;
                self.holders.insert(name.clone(), (slot.clone(), id_value));
            }
            TaskState::Queued => self.pending += 1,
            _ => {}
        }
        Ok(Ok(Submitted {
            id,
            name,
            slot,
            placement: placed.placement,
            existing: false,
        }))
    }
}

/// Queued tasks in the whole cluster, counted afresh.
async fn count_pending(tx: &deadpool_postgres::Transaction<'_>) -> Result<usize, StoreError> {
    all(
        tx,
        "cannot count the pending work",
        "SELECT count(*) FROM taskhost_tasks WHERE state = 'queued'",
        &[],
    )
    .await
    .map(|rows| {
        rows.first()
            .map_or(0, |r| r.get::<_, i64>(0).max(0) as usize)
    })
}
