//! Owns admission, one submission at a time in a transaction of its own
//! (an idempotency key's, a Replace in a batch, a delayed one come due):
//! the plugin kept, the slot's row locked and read in one round trip, then
//! decided and written as a batch of one (`place`).

use std::sync::{Arc, LazyLock};

use deadpool_postgres::GenericClient;

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::lifecycle::TaskState;
use taskhost_core::supervisor::TaskId;

use crate::store::StoreError;
use crate::wire::protocol::{Placement, Submitted};

use super::place::{self, NewRow, SLOT_JOINS, SlotNow, decide, slot_columns};
use super::*;

/// Reads a slot for a decision: a live holder of the name (`$2`) in
/// another slot, then `slot_columns` (the node's `max_slot_queue` in `$3`).
static READ_SLOT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT (SELECT id FROM taskhost_tasks WHERE name = $2 AND slot <> $1 \
             AND state IN ('ready', 'running', 'stopping') LIMIT 1), {} \
         FROM taskhost_slots sl {SLOT_JOINS} WHERE sl.slot = $1",
        slot_columns("$3")
    )
});

/// The first key of a tree's advisory lock (the second is its root's id);
/// two-key locks never meet the one-key `MIGRATION_LOCK`.
const TREE_LOCK: i32 = 1;

pub(super) async fn lock_slot_of(
    tx: &deadpool_postgres::Transaction<'_>,
    id: TaskId,
) -> Result<Option<String>, StoreError> {
    let stmt = tx
        .prepare_cached(
            "SELECT s.slot FROM taskhost_slots s \
             WHERE s.slot = (SELECT slot FROM taskhost_tasks WHERE id = $1) FOR UPDATE",
        )
        .await
        .map_err(db("cannot lock the slot"))?;
    Ok(tx
        .query_opt(&stmt, &[&sql_id(id)])
        .await
        .map_err(db("cannot lock the slot"))?
        .map(|r| r.get(0)))
}

impl Pg {
    /// Admits a submission that carries an idempotency key, in a
    /// transaction of its own that inserts the key first: the node that
    /// inserts it admits the task; one that finds it (having waited for the
    /// transaction that inserted it) answers with that key's task, or
    /// refuses another request. Keys older than `since_ms` are replaced.
    pub(crate) async fn admit_keyed(
        &self,
        admission: &Admission,
        key: &str,
        fingerprint: [u8; 32],
        since_ms: i64,
    ) -> Result<Submitted, AdmitError> {
        retry(|| self.admit_keyed_once(admission, key, fingerprint, since_ms)).await
    }

    async fn admit_keyed_once(
        &self,
        admission: &Admission,
        key: &str,
        fingerprint: [u8; 32],
        since_ms: i64,
    ) -> Result<Submitted, AdmitError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let now = crate::store::now_ms() as i64;
        // A spawned task's tree (`request.root`) is counted in the same
        // round trip: its unfinished descendants, under a lock of the tree
        // (an advisory one, in memory: two spawns in one tree take turns).
        let root = admission.request.root.map(ms);
        let won = opt(
            &tx,
            "cannot record the idempotency key",
            "WITH held AS (SELECT pg_advisory_xact_lock($6, ($5::int8 % 2147483647)::int4) \
                 WHERE $5::int8 IS NOT NULL), \
             tree AS (SELECT count(*) AS n FROM taskhost_tasks \
                 WHERE root = $5 AND root IS NOT NULL AND state <> 'finished') \
             INSERT INTO taskhost_idempotency (key, fingerprint, created_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO UPDATE SET task_id = NULL, fingerprint = excluded.fingerprint, \
             created_ms = excluded.created_ms WHERE taskhost_idempotency.created_ms < $4 \
             RETURNING key, (SELECT n FROM tree), (SELECT count(*) FROM held)",
            &[&key, &&fingerprint[..], &now, &since_ms, &root, &TREE_LOCK],
        )
        .await?;
        let tree: i64 = won.as_ref().map_or(0, |row| row.get(1));
        let won = won.is_some();
        if !won {
            let row = one(
                &tx,
                "cannot read the idempotency key",
                "SELECT k.task_id, k.fingerprint, t.name, t.slot FROM taskhost_idempotency k \
                 LEFT JOIN taskhost_tasks t ON t.id = k.task_id WHERE k.key = $1",
                &[&key],
            )
            .await?;
            let id: Option<i64> = row.get(0);
            let stored: Vec<u8> = row.get(1);
            let id = id_of(id.unwrap_or(0));
            if stored[..] != fingerprint[..] {
                return Err(AdmitError::Conflict(crate::store::key_conflict(key, id)));
            }
            let name: Option<String> = row.get(2);
            let slot: Option<String> = row.get(3);
            return Ok(Submitted {
                id,
                name: name.unwrap_or_else(|| id.to_string()),
                slot: slot.unwrap_or_default(),
                placement: Placement::Running,
                existing: true,
            });
        }
        // A spawned task: its tree's unfinished descendants, counted under
        // the root's row lock so that two spawns in one tree take turns.
        if let Some(root) = root
            && tree as usize >= admission.max_descendants
        {
            return Err(AdmitError::TreeFull {
                root: root as u64,
                max: admission.max_descendants,
            });
        }
        let id: i64 = next_id(&tx).await?;
        let names = (admission.names)(id_of(id)).map_err(AdmitError::Invalid)?;
        let submitted = match admission.due {
            Some((due_ms, max_delayed)) => {
                self.delay_in(&tx, admission, id, names, due_ms, max_delayed)
                    .await?
            }
            None => self.admit_in(&tx, admission, id, names).await?,
        };
        exec(
            &tx,
            "cannot record the idempotency key",
            "UPDATE taskhost_idempotency SET task_id = $2 WHERE key = $1",
            &[&key, &id],
        )
        .await?;
        tx.commit()
            .await
            .map_err(db("cannot commit the submission"))?;
        // Now and then, the expired keys go (an expired one is also
        // replaced when it is given again).
        if fastrand::u32(..256) == 0 {
            let _ = exec(
                &client,
                "cannot forget expired idempotency keys",
                "DELETE FROM taskhost_idempotency WHERE created_ms < $1",
                &[&since_ms],
            )
            .await;
        }
        Ok(submitted)
    }

    /// Queues a submission for the next batch of admissions now (its
    /// place among this node's submissions); the future resolves with its
    /// decision.
    pub(crate) fn admit_queued(
        &self,
        admission: Arc<Admission>,
    ) -> impl std::future::Future<Output = Result<Submitted, AdmitError>> + Send + 'static {
        self.writer().admit(admission)
    }

    /// Admits one submission in `tx` under id `id_value`, reading its
    /// slot afresh (a Replace in a batch of admissions; the caller holds
    /// nothing of the slot it has not written).
    pub(super) async fn admit_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id_value: i64,
        names: (String, String, AdmissionPolicy),
    ) -> Result<Submitted, AdmitError> {
        self.admit_row(tx, a, id_value, names, false).await
    }

    /// Like [`Pg::admit_in`]; with `existing`, the task's row is there
    /// already (a delayed submission come due) and is changed, not added.
    pub(super) async fn admit_row(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id_value: i64,
        (name, slot, policy): (String, String, AdmissionPolicy),
        existing: bool,
    ) -> Result<Submitted, AdmitError> {
        let id = id_of(id_value);
        // The plugin stays while this transaction runs (collection locks
        // it to delete it), and the task row then keeps it.
        let plugin_row = tx
            .prepare_cached("SELECT 1 FROM taskhost_plugins WHERE digest = $1 FOR KEY SHARE")
            .await
            .map_err(db("cannot check the plugin"))?;
        if tx
            .query_opt(&plugin_row, &[&&a.request.plugin.0[..]])
            .await
            .map_err(db("cannot check the plugin"))?
            .is_none()
        {
            return Err(AdmitError::PluginGone);
        }
        // The slot's row, created if new (with the settings this node's
        // rules give it), locked either way: admissions and releases in
        // this slot wait for each other from here on.
        let settings = self.settings_for(&slot);
        exec(
            tx,
            "cannot lock the slot",
            "INSERT INTO taskhost_slots (slot, capacity, max_queue, debounce_ms, max_wait_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (slot) DO UPDATE SET slot = excluded.slot",
            &[
                &slot,
                &settings.capacity,
                &settings.max_queue,
                &settings.debounce_ms,
                &settings.max_wait_ms,
            ],
        )
        .await?;
        let (mut now, pending, holder) = loop {
            // Everything the rules read, in one round trip: a live holder
            // of the name elsewhere, then `slot_columns`.
            let bound = i64::try_from(a.max_slot_queue).unwrap_or(i64::MAX);
            let row = one(
                tx,
                "cannot read the slot",
                &READ_SLOT,
                &[&slot, &name, &bound],
            )
            .await?;
            let (now, pending, version) = SlotNow::from_row(&row);
            if !self
                .catch_up(tx, version, std::slice::from_ref(&slot))
                .await?
            {
                break (now, pending, row.get::<_, Option<i64>>(0));
            }
        };
        // A new submission to a debounced slot is held, superseding the
        // one held before; the held one is decided when its time comes.
        if let (false, Some(debounce_ms)) = (existing, now.debounce_ms) {
            return self
                .debounce_in(
                    tx,
                    a,
                    id_value,
                    (name, slot, policy),
                    (debounce_ms, now.max_wait_ms),
                )
                .await;
        }
        let names = (name.as_str(), slot.as_str(), policy);
        let decision = decide(a, names, &mut now, holder, pending);
        place::write_declared(tx, std::iter::once((slot.as_str(), &mut now))).await?;
        let placed = self.apply(tx, id, decision, &mut now).await?;
        let new = NewRow::new(a, id_value, names, &placed)?;
        if existing {
            place::update(tx, &new).await?;
        } else {
            place::insert(tx, vec![new]).await?;
        }
        match placed.state {
            TaskState::Finished => self.notify(tx, FINISHED, &id.get().to_string()).await?,
            TaskState::Ready => self.notify(tx, READY, "").await?,
            _ => {}
        }
        Ok(Submitted {
            id,
            name,
            slot,
            placement: placed.placement,
            existing: false,
        })
    }
}
