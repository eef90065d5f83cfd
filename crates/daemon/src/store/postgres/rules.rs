//! Owns the cluster's slot rules: the rows every node reads, a change of
//! them (`host slot set`/`unset`) in one transaction that rewrites each
//! slot's settings on its row and admits the heads a larger capacity makes
//! room for, each node's copy (loaded again when a decision reads a newer
//! version), and filling slots up to their capacity. It decides no
//! admission: `place` reads the settings off the slot's row.

use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::GenericClient;

use taskhost_core::slot_settings::{MAX_DEBOUNCE, Rate, SlotRules, SlotSettings};

use super::{Pg, READY, all, db, exec, one};
use crate::store::StoreError;

/// A node's copy of the rules, with the version it was read at.
#[derive(Default)]
pub(super) struct Copy {
    version: i64,
    rules: SlotRules,
}

/// A node's copy, shared by its handles.
pub(super) type Rules = Arc<Mutex<Copy>>;

/// A slot's settings as its row keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RowSettings {
    /// None: no rule sets it (the plugin's declared capacity counts).
    pub capacity: Option<i32>,
    /// None: the node's `--max-slot-queue`.
    pub max_queue: Option<i64>,
    /// Debounce and its `max-wait`, in milliseconds.
    pub debounce_ms: Option<i64>,
    pub max_wait_ms: Option<i64>,
}

/// [`RowSettings`] of many slots, a column each: capacity, queue bound,
/// debounce and its `max-wait`.
type Columns = (
    Vec<Option<i32>>,
    Vec<Option<i64>>,
    Vec<Option<i64>>,
    Vec<Option<i64>>,
);

impl RowSettings {
    /// The settings of many slots as the statements take them.
    pub(super) fn columns(settings: &[RowSettings]) -> Columns {
        (
            settings.iter().map(|s| s.capacity).collect(),
            settings.iter().map(|s| s.max_queue).collect(),
            settings.iter().map(|s| s.debounce_ms).collect(),
            settings.iter().map(|s| s.max_wait_ms).collect(),
        )
    }

    fn of(settings: &SlotSettings) -> Self {
        let ms = |d: std::time::Duration| d.as_millis().min(i64::MAX as u128) as i64;
        Self {
            capacity: settings.capacity.map(|c| c.min(i32::MAX as u32) as i32),
            max_queue: settings.max_queue.map(|q| q.min(i64::MAX as usize) as i64),
            debounce_ms: settings.debounce.map(ms),
            max_wait_ms: settings.max_wait.map(ms),
        }
    }
}

/// What a change of rules did: the rule there was before, or the change
/// refused (the rules' own words).
type RuleChange = Result<Option<SlotSettings>, String>;

/// Every rule in the database.
async fn load(c: &impl GenericClient) -> Result<SlotRules, StoreError> {
    let mut rules = SlotRules::default();
    for row in all(
        c,
        "cannot read the slot rules",
        "SELECT pattern, settings FROM taskhost_slot_rules ORDER BY pattern",
        &[],
    )
    .await?
    {
        let pattern: String = row.get(0);
        let bad = |e: String| {
            StoreError::Failed(format!(
                "PostgreSQL: the slot rule for `{pattern}` cannot be read ({e}); \
                 unset it with `host slot unset '{pattern}'`"
            ))
        };
        let settings: SlotSettings =
            serde_json::from_str(row.get(1)).map_err(|e| bad(e.to_string()))?;
        rules.set(&pattern, settings).map_err(bad)?;
    }
    Ok(rules)
}

/// Writes `settings` on the rows of `slots` (whose locks the caller holds,
/// or the table's).
async fn rewrite(
    tx: &deadpool_postgres::Transaction<'_>,
    slots: &[String],
    settings: &[RowSettings],
) -> Result<(), StoreError> {
    if slots.is_empty() {
        return Ok(());
    }
    let (capacities, queues, debounces, waits) = RowSettings::columns(settings);
    exec(
        tx,
        "cannot write the slots' settings",
        "UPDATE taskhost_slots s SET capacity = u.c, max_queue = u.q, debounce_ms = u.d, \
             max_wait_ms = u.w \
             FROM unnest($1::text[], $2::int4[], $3::int8[], $4::int8[], $5::int8[]) \
             AS u(slot, c, q, d, w) WHERE s.slot = u.slot",
        &[&slots, &capacities, &queues, &debounces, &waits],
    )
    .await?;
    Ok(())
}

/// Makes the heads of `slots`' queues their owners while each has room
/// (its capacity, less the owners it has; without a rule's capacity, the
/// one its latest submission's plugin declared), in queue order; the caller
/// holds the slots' locks. Returns the ids made ready.
pub(super) async fn fill(
    tx: &deadpool_postgres::Transaction<'_>,
    slots: &[&str],
) -> Result<Vec<i64>, StoreError> {
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    // The owner sequence is drawn after the sort: heads take their
    // owners' ages in queue order.
    Ok(all(
        tx,
        "cannot admit the next in the slots",
        "UPDATE taskhost_tasks t SET state = 'ready', pos = p.seq FROM \
             (SELECT h.id, nextval('taskhost_owner_seq') AS seq FROM taskhost_slots s \
              CROSS JOIN LATERAL (SELECT id, pos FROM taskhost_tasks \
                  WHERE slot = s.slot AND state = 'queued' ORDER BY pos, id \
                  LIMIT greatest(0, coalesce(s.capacity, s.declared, 1) - (SELECT count(*) FROM taskhost_tasks o \
                      WHERE o.slot = s.slot AND o.state IN ('ready', 'running', 'stopping')))) h \
              WHERE s.slot = ANY($1) ORDER BY s.slot, h.pos, h.id) p \
             WHERE t.id = p.id RETURNING t.id",
        &[&slots],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

impl Pg {
    fn copy(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this node's copy of the cluster's slot rules holds any.
    pub(super) fn has_rules(&self) -> bool {
        !self.copy().rules.is_empty()
    }

    /// The settings this node resolves for a slot whose row it creates.
    pub(super) fn settings_for(&self, slot: &str) -> RowSettings {
        RowSettings::of(&self.copy().rules.for_slot(slot))
    }

    /// After a decision read the rules' `version` with `slots` locked: if
    /// this node's copy is of another, loads the rules and writes the
    /// slots' settings as they resolve (a row this node created from an
    /// older copy). True if it did: the caller reads the slots again.
    pub(super) async fn catch_up(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        version: i64,
        slots: &[String],
    ) -> Result<bool, StoreError> {
        if self.copy().version == version {
            return Ok(false);
        }
        let rules = load(tx).await?;
        let settings: Vec<RowSettings> = slots
            .iter()
            .map(|slot| RowSettings::of(&rules.for_slot(slot)))
            .collect();
        rewrite(tx, slots, &settings).await?;
        *self.copy() = Copy { version, rules };
        Ok(true)
    }

    /// Loads the rules if this node's copy is not of `version` (read by a
    /// claim).
    pub(super) async fn refresh_rules(
        &self,
        c: &impl GenericClient,
        version: i64,
    ) -> Result<(), StoreError> {
        if self.copy().version != version {
            let rules = load(c).await?;
            *self.copy() = Copy { version, rules };
        }
        Ok(())
    }

    /// This node's copy of the rules, for its own controller, if it is of
    /// another version or another count of live nodes than `seen` (which
    /// it then becomes). Its controller applies the capacities and queue
    /// bounds to the tasks it claimed (the database decides them) and a
    /// rate's share: of `n` live nodes, each starts `starts / n` per
    /// period (the first `starts % n` by id one more) with `burst / n`, so
    /// that all of them together keep within the rate and burst in every
    /// period. With fewer starts than nodes, each node starts one per `n`
    /// periods (together, up to `n` in one period). The database debounces.
    pub(crate) fn rules_since(&self, seen: &mut (i64, (u32, u32))) -> Option<SlotRules> {
        let copy = self.copy();
        let (nodes, rank) = self.nodes();
        let nodes = nodes.max(1);
        (*seen != (copy.version, (nodes, rank))).then(|| {
            *seen = (copy.version, (nodes, rank));
            let mut local = SlotRules::default();
            for (pattern, rule) in copy.rules.rules() {
                let rate = rule.rate.map(|rate| {
                    let starts = rate.starts / nodes + u32::from(rank < rate.starts % nodes);
                    match starts {
                        0 => Rate {
                            starts: 1,
                            per: rate.per.saturating_mul(nodes).min(MAX_DEBOUNCE),
                        },
                        starts => Rate {
                            starts,
                            per: rate.per,
                        },
                    }
                });
                let settings = SlotSettings {
                    capacity: rule.capacity,
                    max_queue: rule.max_queue,
                    rate,
                    burst: rule.burst.map(|b| b / nodes),
                    ..SlotSettings::default()
                };
                // Each was a good rule, and so is its share.
                let _ = local.set(&pattern, settings);
            }
            local
        })
    }

    /// The rules, as the database holds them now.
    pub(crate) async fn slot_rules(&self) -> Result<Vec<(String, SlotSettings)>, StoreError> {
        let client = self.client().await?;
        Ok(load(&client).await?.rules())
    }

    /// Sets the rule for `pattern` (None: removes it), for every node:
    /// each slot's row takes its new settings, and a slot whose capacity
    /// grew admits its waiting heads, in the same transaction. Admissions
    /// wait for it (a table lock), so the next decision in any slot reads
    /// the new settings.
    pub(crate) async fn set_slot_rule(
        &self,
        pattern: &str,
        settings: Option<SlotSettings>,
    ) -> Result<RuleChange, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let version: i64 = one(
            &tx,
            "cannot read the rules' version",
            "SELECT version FROM taskhost_slot_rules_version FOR UPDATE",
            &[],
        )
        .await?
        .get(0);
        let mut rules = load(&tx).await?;
        let old = rules
            .rules()
            .into_iter()
            .find(|(p, _)| p == pattern)
            .map(|(_, s)| s);
        match settings {
            Some(settings) => {
                if let Err(refused) = rules.set(pattern, settings) {
                    return Ok(Err(refused));
                }
                let json = serde_json::to_string(&settings)
                    .map_err(|e| StoreError::Failed(format!("cannot encode a slot rule: {e}")))?;
                exec(
                    &tx,
                    "cannot store the slot rule",
                    "INSERT INTO taskhost_slot_rules (pattern, settings) VALUES ($1, $2) \
                         ON CONFLICT (pattern) DO UPDATE SET settings = excluded.settings",
                    &[&pattern, &json],
                )
                .await?;
            }
            None if old.is_none() => return Ok(Ok(None)),
            None => {
                rules.unset(pattern);
                exec(
                    &tx,
                    "cannot remove the slot rule",
                    "DELETE FROM taskhost_slot_rules WHERE pattern = $1",
                    &[&pattern],
                )
                .await?;
            }
        }
        let version = version + 1;
        exec(
            &tx,
            "cannot count the change of rules",
            "UPDATE taskhost_slot_rules_version SET version = $1",
            &[&version],
        )
        .await?;
        // Slot rows are created and decided on under the lock of the table
        // this takes: a node that created one from its older copy has
        // committed (this rewrites it) or reads the new version after it.
        tx.batch_execute("LOCK TABLE taskhost_slots IN SHARE ROW EXCLUSIVE MODE")
            .await
            .map_err(db("cannot lock the slots"))?;
        let (mut slots, mut new, mut grown) = (Vec::new(), Vec::new(), Vec::new());
        for row in all(
            &tx,
            "cannot read the slots",
            "SELECT slot, capacity, max_queue, debounce_ms, max_wait_ms FROM taskhost_slots",
            &[],
        )
        .await?
        {
            let slot: String = row.get(0);
            let was = RowSettings {
                capacity: row.get(1),
                max_queue: row.get(2),
                debounce_ms: row.get(3),
                max_wait_ms: row.get(4),
            };
            let now = RowSettings::of(&rules.for_slot(&slot));
            if now != was {
                if now.capacity != was.capacity {
                    grown.push(slot.clone());
                }
                slots.push(slot);
                new.push(now);
            }
        }
        rewrite(&tx, &slots, &new).await?;
        let grown: Vec<&str> = grown.iter().map(String::as_str).collect();
        if !fill(&tx, &grown).await?.is_empty() {
            self.notify(&tx, READY, "").await?;
        }
        tx.commit()
            .await
            .map_err(db("cannot commit the slot rule"))?;
        *self.copy() = Copy { version, rules };
        Ok(Ok(old))
    }
}
