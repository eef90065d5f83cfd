//! Owns a cluster's time in its database: delayed submissions (rows in the
//! state `delayed` until their time, then admitted by one node in the
//! transaction that changes their state) and schedules (a firing locks the
//! schedule's row, moves its next firing on and admits the task, all in
//! one transaction, so each due time fires once whichever nodes are up or
//! die meanwhile). The rules are `schedule::decide` and
//! `admission::decide`, as on one host.

use std::sync::Arc;

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::outcome::OutcomeKind;
use taskhost_core::supervisor::TaskId;

use super::{Admission, AdmitError, Pg, all, db, encode, exec, id_of, ms, next_id, one, opt};
use crate::schedule::{self, CronZone, FireKind, Missed};
use crate::store::{Retryable, retry};
use crate::store::{StoreError, StoredSchedule};
use crate::wire::protocol::{NotBefore, Placement, ScheduleSpec, SubmitRequest, Submitted};

/// The channel nodes are told on when the soonest time may have changed
/// (a delayed submission or a schedule added, resumed, removed).
pub(crate) const TIME: &str = "taskhost_time";

/// Most delayed submissions or firings one transaction takes.
const TIME_BATCH: i64 = 256;

/// What a node placed or fired, for its events and metrics.
pub(crate) struct Placed {
    pub submitted: Submitted,
    /// The due time it served, ms since the Unix epoch.
    pub due_ms: u64,
    /// The schedule that fired it, and why.
    pub fired: Option<(String, FireKind)>,
}

/// What one round of firings did.
#[derive(Default)]
pub(crate) struct Fired {
    /// The firings.
    pub fired: Vec<Placed>,
    /// Schedules that skipped missed due times (`--missed skip`), with how
    /// many.
    pub skipped: Vec<(String, u64)>,
    /// Due times that got no firing of their own.
    pub passed: u64,
}

/// The bounds a node admits under (its own settings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub max_slot_queue: usize,
    pub max_total_pending: usize,
}

/// Turns a firing's deployment (`NAME[@VERSION]`) into its version's
/// plugin, with `deployment` then `NAME@VERSION`: the backend's rules,
/// given by the caller of a firing.
pub(crate) type Resolve = dyn Fn(SubmitRequest) -> futures::future::BoxFuture<'static, Result<SubmitRequest, String>>
    + Send
    + Sync;

/// A schedule verb's refusal.
pub(crate) enum ScheduleError {
    /// No schedule by that name.
    Unknown,
    /// One by that name exists.
    Exists,
    /// The cluster no longer holds its plugin.
    PluginGone,
    /// Its deployment names no version now (why).
    Unresolved(String),
    /// The cluster holds this many schedules already.
    Full(usize),
    /// The database failed.
    Store(StoreError),
}

impl Retryable for ScheduleError {
    fn retryable(&self) -> bool {
        matches!(self, Self::Store(e) if e.retryable())
    }
}

impl From<StoreError> for ScheduleError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// The admission of a submission whose name, slot and policy are already
/// resolved in its request (a delayed one, a schedule's firing).
fn resolved(request: SubmitRequest, plugin: String, bounds: Bounds) -> Admission {
    let slot = request.slot.clone().unwrap_or_default();
    let policy = request.policy.unwrap_or(AdmissionPolicy::Queue);
    let name = request.name.clone();
    let schedule = request.schedule.clone();
    Admission {
        names: Box::new(move |id| {
            let name = match (&name, &schedule) {
                (Some(name), _) => name.clone(),
                (None, Some(schedule)) => format!("{schedule}-{id}"),
                (None, None) => id.to_string(),
            };
            Ok((name, slot.clone(), policy))
        }),
        request,
        plugin,
        max_slot_queue: bounds.max_slot_queue,
        max_total_pending: bounds.max_total_pending,
        declared: None,
        // Delayed work and firings are nobody's children.
        max_descendants: usize::MAX,
        due: None,
        // Claimed as work that came due is: by whichever node has room.
        claim_here: false,
    }
}

/// A stored schedule from its row (`spec, plugin, paused, next_ms,
/// last_fire_ms, last_task, created_ms`).
fn stored_of(row: &tokio_postgres::Row) -> Result<StoredSchedule, StoreError> {
    let spec = ScheduleSpec::decode_stored(row.get::<_, &[u8]>(0))
        .map_err(|e| StoreError::Failed(format!("a stored schedule does not decode: {e}")))?;
    let at = |i: usize| row.get::<_, Option<i64>>(i).map(|v| v.max(0) as u64);
    Ok(StoredSchedule {
        spec,
        plugin: row.get(1),
        paused: row.get(2),
        next_ms: at(3),
        last_fire_ms: at(4),
        last_task: row.get::<_, Option<i64>>(5).map(id_of),
        created_ms: row.get::<_, i64>(6).max(0) as u64,
    })
}

/// The schedule `name`, its row locked for `tx`.
async fn lock_schedule(
    tx: &deadpool_postgres::Transaction<'_>,
    name: &str,
) -> Result<StoredSchedule, ScheduleError> {
    let row = opt(
        tx,
        "cannot read the schedule",
        &format!("SELECT {SCHEDULE_COLUMNS} FROM taskhost_schedules WHERE name = $1 FOR UPDATE"),
        &[&name],
    )
    .await?
    .ok_or(ScheduleError::Unknown)?;
    Ok(stored_of(&row)?)
}

const SCHEDULE_COLUMNS: &str = "spec, plugin, paused, next_ms, last_fire_ms, last_task, created_ms";

impl Pg {
    /// Accepts a delayed submission (`a.due` says when, and the bound):
    /// its row waits in the state `delayed` until then, holding no slot.
    pub(crate) async fn delay(&self, a: &Admission) -> Result<Submitted, AdmitError> {
        let Some((due_ms, max_delayed)) = a.due else {
            return Err(AdmitError::Invalid("not a delayed submission".into()));
        };
        retry(|| async {
            let mut client = self.client().await?;
            let tx = client
                .transaction()
                .await
                .map_err(db("cannot start a transaction"))?;
            let id: i64 = next_id(&tx).await?;
            let names = (a.names)(id_of(id)).map_err(AdmitError::Invalid)?;
            let submitted = self
                .delay_in(&tx, a, id, names, due_ms, max_delayed)
                .await?;
            tx.commit()
                .await
                .map_err(db("cannot commit the submission"))?;
            Ok(submitted)
        })
        .await
    }

    /// Records a delayed submission in `tx` under id `id`.
    pub(super) async fn delay_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id: i64,
        (name, slot, policy): (String, String, AdmissionPolicy),
        due_ms: u64,
        max_delayed: usize,
    ) -> Result<Submitted, AdmitError> {
        let waiting: i64 = one(
            tx,
            "cannot count the delayed submissions",
            "SELECT count(*) FROM taskhost_tasks WHERE state = 'delayed'",
            &[],
        )
        .await?
        .get(0);
        if waiting.max(0) as usize >= max_delayed {
            return Err(AdmitError::Invalid(format!(
                "{waiting} delayed submissions already wait for their time, the most this \
                 cluster holds (max_delayed)"
            )));
        }
        if opt(
            tx,
            "cannot check the plugin",
            "SELECT 1 FROM taskhost_plugins WHERE digest = $1 FOR KEY SHARE",
            &[&&a.request.plugin.0[..]],
        )
        .await?
        .is_none()
        {
            return Err(AdmitError::PluginGone);
        }
        let mut request = a.request.clone();
        request.name = Some(name.clone());
        request.slot = Some(slot.clone());
        request.policy = Some(policy);
        request.not_before = Some(NotBefore::At(due_ms));
        exec(
            tx,
            "cannot record the submission",
            "INSERT INTO taskhost_tasks (id, name, slot, plugin, digest, request, state, placed, \
             submitted_ms, due_ms, priority, schedule) \
             VALUES ($1, $2, $3, $4, $5, $6, 'delayed', TRUE, $7, $8, $9, $10)",
            &[
                &id,
                &name,
                &slot,
                &a.plugin,
                &&a.request.plugin.0[..],
                &encode(&request)?,
                &ms(crate::store::now_ms()),
                &ms(due_ms),
                &request.priority,
                &request.schedule,
            ],
        )
        .await?;
        self.notify(tx, TIME, "").await?;
        Ok(Submitted {
            id: id_of(id),
            name,
            slot,
            placement: Placement::Delayed { due_ms },
            existing: false,
        })
    }

    /// The soonest time anything waits for: a delayed submission's, or a
    /// schedule's next firing.
    pub(crate) async fn next_due(&self) -> Result<Option<u64>, StoreError> {
        let client = self.client().await?;
        let row = one(
            &client,
            "cannot read the next due time",
            "SELECT least((SELECT min(due_ms) FROM taskhost_tasks WHERE state = 'delayed'), \
             (SELECT min(next_ms) FROM taskhost_schedules WHERE NOT paused))",
            &[],
        )
        .await?;
        Ok(row.get::<_, Option<i64>>(0).map(|v| v.max(0) as u64))
    }

    /// Admits the delayed submissions due by `now_ms` (those no other node
    /// is admitting), each by its policy against its slot as it is now.
    pub(crate) async fn place_due(
        &self,
        now_ms: u64,
        bounds: Bounds,
    ) -> Result<Vec<Placed>, StoreError> {
        super::retry(|| self.place_due_once(now_ms, bounds)).await
    }

    async fn place_due_once(&self, now_ms: u64, bounds: Bounds) -> Result<Vec<Placed>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let rows = all(
            &tx,
            "cannot read the delayed submissions",
            "SELECT id, request, plugin, due_ms FROM taskhost_tasks \
             WHERE state = 'delayed' AND due_ms <= $1 ORDER BY due_ms, id LIMIT $2 \
             FOR UPDATE SKIP LOCKED",
            &[&ms(now_ms), &TIME_BATCH],
        )
        .await?;
        let mut placed = Vec::with_capacity(rows.len());
        for row in rows {
            let id: i64 = row.get(0);
            let request = super::decode_request(row.get::<_, &[u8]>(1))?;
            let due_ms = row.get::<_, Option<i64>>(3).unwrap_or(0).max(0) as u64;
            let names = (
                request.name.clone().unwrap_or_else(|| id.to_string()),
                request.slot.clone().unwrap_or_default(),
                request.policy.unwrap_or(AdmissionPolicy::Queue),
            );
            let admission = resolved(request, row.get(2), bounds);
            match self.admit_row(&tx, &admission, id, names, true).await {
                Ok(submitted) => placed.push(Placed {
                    submitted,
                    due_ms,
                    fired: None,
                }),
                Err(AdmitError::Store(e)) => return Err(e),
                Err(other) => {
                    // Its plugin was collected, or its names no longer
                    // work: it ends failed, saying why.
                    let reason = match other {
                        AdmitError::PluginGone => {
                            "its plugin is no longer in the cluster".to_owned()
                        }
                        AdmitError::Invalid(m) | AdmitError::Conflict(m) => m,
                        AdmitError::TreeFull { root, max } => {
                            crate::store::too_many_descendants(root, max)
                        }
                        AdmitError::Store(e) => e.to_string(),
                    };
                    self.fail_delayed(&tx, id_of(id), &reason).await?;
                }
            }
        }
        tx.commit()
            .await
            .map_err(db("cannot commit the delayed submissions"))?;
        Ok(placed)
    }

    async fn fail_delayed(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        id: TaskId,
        reason: &str,
    ) -> Result<(), StoreError> {
        let row = one(
            tx,
            "cannot read a task",
            "SELECT name, slot FROM taskhost_tasks WHERE id = $1",
            &[&super::sql_id(id)],
        )
        .await?;
        let report = taskhost_core::supervisor::TaskReport::never_ran(
            id,
            Arc::from(row.get::<_, &str>(0)),
            Arc::from(row.get::<_, &str>(1)),
            taskhost_core::outcome::TaskOutcome::Failed {
                reason: format!("not placed when it came due: {reason}"),
                exit_code: None,
            },
        );
        super::end_task(self, tx, &report, &[]).await
    }

    /// Stores a new schedule.
    pub(crate) async fn schedule_add(
        &self,
        s: &StoredSchedule,
        most: usize,
    ) -> Result<(), ScheduleError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let held: i64 = one(
            &tx,
            "cannot count the schedules",
            "SELECT count(*) FROM taskhost_schedules",
            &[],
        )
        .await?
        .get(0);
        if held.max(0) as usize >= most {
            return Err(ScheduleError::Full(most));
        }
        // The plugin stays while this runs; the schedule's row then keeps
        // it from collection.
        if opt(
            &tx,
            "cannot check the plugin",
            "SELECT 1 FROM taskhost_plugins WHERE digest = $1 FOR KEY SHARE",
            &[&&s.spec.request.plugin.0[..]],
        )
        .await?
        .is_none()
        {
            return Err(ScheduleError::PluginGone);
        }
        let added = exec(
            &tx,
            "cannot store the schedule",
            "INSERT INTO taskhost_schedules (name, spec, plugin, digest, paused, next_ms, \
             created_ms) VALUES ($1, $2, $3, $4, FALSE, $5, $6) ON CONFLICT (name) DO NOTHING",
            &[
                &s.spec.name,
                &encode(&s.spec)?,
                &s.plugin,
                &&s.spec.request.plugin.0[..],
                &s.next_ms.map(ms),
                &ms(s.created_ms),
            ],
        )
        .await?;
        if added == 0 {
            return Err(ScheduleError::Exists);
        }
        self.notify(&tx, TIME, "").await?;
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(())
    }

    /// Every schedule, by name, with how its last firing's task ended.
    pub(crate) async fn schedules(
        &self,
    ) -> Result<Vec<(StoredSchedule, Option<OutcomeKind>)>, StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot list the schedules",
            &format!(
                "SELECT {}, t.outcome FROM taskhost_schedules s \
                 LEFT JOIN taskhost_tasks t ON t.id = s.last_task ORDER BY s.name",
                SCHEDULE_COLUMNS
                    .split(", ")
                    .map(|c| format!("s.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            &[],
        )
        .await?;
        rows.iter()
            .map(|r| {
                let outcome = r.get::<_, Option<&str>>(7).and_then(OutcomeKind::from_word);
                Ok((stored_of(r)?, outcome))
            })
            .collect()
    }

    /// Deletes a schedule; returns it as it was.
    pub(crate) async fn schedule_remove(
        &self,
        name: &str,
    ) -> Result<StoredSchedule, ScheduleError> {
        let client = self.client().await?;
        let row = opt(
            &client,
            "cannot remove the schedule",
            &format!("DELETE FROM taskhost_schedules WHERE name = $1 RETURNING {SCHEDULE_COLUMNS}"),
            &[&name],
        )
        .await?
        .ok_or(ScheduleError::Unknown)?;
        Ok(stored_of(&row)?)
    }

    /// Pauses or resumes a schedule. A resumed one whose firings passed
    /// while it was paused handles them as its `missed` says (one catch-up
    /// firing, in this transaction, or none). Returns the schedule as it
    /// is now, and the catch-up firing if there was one.
    pub(crate) async fn schedule_pause(
        &self,
        name: &str,
        paused: bool,
        now_ms: u64,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<(StoredSchedule, Option<Placed>), ScheduleError> {
        retry(|| self.schedule_pause_once(name, paused, now_ms, bounds, resolve)).await
    }

    async fn schedule_pause_once(
        &self,
        name: &str,
        paused: bool,
        now_ms: u64,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<(StoredSchedule, Option<Placed>), ScheduleError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let mut stored = lock_schedule(&tx, name).await?;
        let mut placed = None;
        if stored.paused != paused {
            stored.paused = paused;
            if !paused
                && let Some(next) = stored.next_ms
                && next <= now_ms
            {
                // What passed while it was paused is missed.
                let missed = stored.spec.missed;
                placed = self
                    .fire_in(&tx, &mut stored, now_ms, Some(missed), bounds, resolve)
                    .await?
                    .0;
            }
            exec(
                &tx,
                "cannot update the schedule",
                "UPDATE taskhost_schedules SET paused = $2, next_ms = $3, last_fire_ms = $4, \
                 last_task = $5 WHERE name = $1",
                &[
                    &name,
                    &paused,
                    &stored.next_ms.map(ms),
                    &stored.last_fire_ms.map(ms),
                    &stored.last_task.map(|id| ms(id.get())),
                ],
            )
            .await?;
            self.notify(&tx, TIME, "").await?;
        }
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok((stored, placed))
    }

    /// Fires a schedule once now (`host schedule run`); its next firing
    /// stays as it was.
    pub(crate) async fn schedule_run(
        &self,
        name: &str,
        now_ms: u64,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<Placed, ScheduleError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let stored = lock_schedule(&tx, name).await?;
        let submitted = (self.admit_firing(&tx, &stored, now_ms, bounds, resolve)).await?;
        exec(
            &tx,
            "cannot update the schedule",
            "UPDATE taskhost_schedules SET last_fire_ms = $2, last_task = $3 WHERE name = $1",
            &[&name, &ms(now_ms), &ms(submitted.id.get())],
        )
        .await?;
        tx.commit().await.map_err(db("cannot commit"))?;
        Ok(Placed {
            submitted,
            due_ms: now_ms,
            fired: Some((name.to_owned(), FireKind::Run)),
        })
    }

    /// Fires the schedules due by `now_ms` that no other node is firing:
    /// each in this transaction (its row locked, its next firing moved on,
    /// its task admitted). A due time older than `missed_after` is one the
    /// whole cluster missed (no node was up to fire it): the schedule's
    /// `missed` decides; a younger one fires (late), once for however many
    /// passed.
    pub(crate) async fn fire_due(
        &self,
        now_ms: u64,
        missed_after: std::time::Duration,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<Fired, StoreError> {
        super::retry(|| self.fire_due_once(now_ms, missed_after, bounds, resolve)).await
    }

    async fn fire_due_once(
        &self,
        now_ms: u64,
        missed_after: std::time::Duration,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<Fired, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        let rows = all(
            &tx,
            "cannot read the due schedules",
            &format!(
                "SELECT {SCHEDULE_COLUMNS} FROM taskhost_schedules WHERE NOT paused \
                 AND next_ms <= $1 ORDER BY next_ms LIMIT $2 FOR UPDATE SKIP LOCKED"
            ),
            &[&ms(now_ms), &TIME_BATCH],
        )
        .await?;
        let mut done = Fired::default();
        for row in rows {
            let mut stored = stored_of(&row)?;
            let missed = stored.next_ms.and_then(|next| {
                (now_ms.saturating_sub(next) > missed_after.as_millis() as u64)
                    .then_some(stored.spec.missed)
            });
            let before = stored.last_fire_ms;
            let fired = self.fire_in(&tx, &mut stored, now_ms, missed, bounds, resolve);
            match fired.await {
                Ok((placed, passed)) => {
                    done.passed += passed;
                    match placed {
                        Some(placed) => done.fired.push(placed),
                        None if passed > 0 => {
                            done.skipped.push((stored.spec.name.clone(), passed));
                        }
                        None => {}
                    }
                }
                Err(ScheduleError::Store(e)) => return Err(e),
                Err(ScheduleError::Unresolved(why)) => {
                    tracing::warn!(
                        schedule = %stored.spec.name,
                        "schedule `{}` cannot fire: {why}",
                        stored.spec.name
                    );
                    stored.last_fire_ms = before;
                }
                Err(_) => {
                    // Its plugin was collected: it cannot fire; it goes on
                    // to its next firing, and says why in the log.
                    tracing::warn!(
                        schedule = %stored.spec.name,
                        "schedule `{}` cannot fire: its plugin is no longer in the cluster",
                        stored.spec.name
                    );
                    stored.last_fire_ms = before;
                }
            }
            exec(
                &tx,
                "cannot update the schedule",
                "UPDATE taskhost_schedules SET next_ms = $2, last_fire_ms = $3, last_task = $4 \
                 WHERE name = $1",
                &[
                    &stored.spec.name,
                    &stored.next_ms.map(ms),
                    &stored.last_fire_ms.map(ms),
                    &stored.last_task.map(|id| ms(id.get())),
                ],
            )
            .await?;
        }
        tx.commit().await.map_err(db("cannot commit the firings"))?;
        Ok(done)
    }

    /// Decides what a due schedule does now and, if it fires, admits its
    /// task in `tx`; moves `stored` on (its next and last firing). Returns
    /// the firing, and how many due times got none of their own.
    async fn fire_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        stored: &mut StoredSchedule,
        now_ms: u64,
        missed: Option<Missed>,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<(Option<Placed>, u64), ScheduleError> {
        let Some(next) = stored.next_ms else {
            return Ok((None, 0));
        };
        let zone = CronZone::parse(&stored.spec.cron, stored.spec.tz.as_deref())
            .map_err(|e| ScheduleError::Store(StoreError::Failed(e)))?;
        let decision = schedule::decide(&zone, next, now_ms, missed);
        stored.next_ms = decision.next_ms;
        let Some((due_ms, kind)) = decision.fire else {
            return Ok((None, decision.passed));
        };
        let submitted = (self.admit_firing(tx, stored, due_ms, bounds, resolve)).await?;
        stored.last_fire_ms = Some(due_ms);
        stored.last_task = Some(submitted.id);
        let placed = Placed {
            submitted,
            due_ms,
            fired: Some((stored.spec.name.clone(), kind)),
        };
        Ok((Some(placed), decision.passed))
    }

    /// Admits one firing of a schedule in `tx`.
    async fn admit_firing(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        stored: &StoredSchedule,
        due_ms: u64,
        bounds: Bounds,
        resolve: &Resolve,
    ) -> Result<Submitted, ScheduleError> {
        let mut request = stored.spec.request.clone();
        request.schedule = Some(stored.spec.name.clone());
        request.not_before = Some(NotBefore::At(due_ms));
        let mut plugin = stored.plugin.clone();
        // A schedule of a deployment fires its version of now.
        if request.deployment.is_some() {
            request = resolve(request).await.map_err(ScheduleError::Unresolved)?;
            plugin = request.deployment.clone().unwrap_or(plugin);
        }
        let admission = resolved(request, plugin, bounds);
        let id: i64 = next_id(tx).await?;
        let names = (admission.names)(id_of(id))
            .map_err(|e| ScheduleError::Store(StoreError::Failed(e)))?;
        match self.admit_in(tx, &admission, id, names).await {
            Ok(submitted) => Ok(submitted),
            Err(AdmitError::PluginGone) => Err(ScheduleError::PluginGone),
            Err(AdmitError::Store(e)) => Err(ScheduleError::Store(e)),
            Err(AdmitError::Invalid(m) | AdmitError::Conflict(m)) => {
                Err(ScheduleError::Store(StoreError::Failed(m)))
            }
            Err(AdmitError::TreeFull { root, max }) => Err(ScheduleError::Store(
                StoreError::Failed(crate::store::too_many_descendants(root, max)),
            )),
        }
    }
}
