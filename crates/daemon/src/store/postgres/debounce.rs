//! Owns debounce in a cluster: a submission to a debounced slot is held as
//! a delayed row (its `debounce_first_ms` says when its run began) and the
//! one held before it ends rejected, naming it; the time loop (`time`)
//! places the held one when its time comes, by its policy. It decides no
//! admission.

use taskhost_core::admission::AdmissionPolicy;
use taskhost_core::outcome::RejectionKind;

use super::claim::{end_task, never_ran_row};
use super::time::TIME;
use super::{Admission, AdmitError, Pg, encode, exec, id_of, ms, opt};
use crate::store::now_ms;
use crate::wire::protocol::{NotBefore, Placement, Submitted};

impl Pg {
    /// Holds submission `a` (task `id`) to a debounced slot whose lock the
    /// caller holds: the one the slot held before (whose time has not come)
    /// ends rejected, naming this one, and this one waits `debounce_ms`
    /// from now, but never past `max_wait_ms` after the first of the run.
    pub(super) async fn debounce_in(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        a: &Admission,
        id: i64,
        (name, slot, policy): (String, String, AdmissionPolicy),
        (debounce_ms, max_wait_ms): (i64, Option<i64>),
    ) -> Result<Submitted, AdmitError> {
        let now = ms(now_ms());
        let held = opt(
            tx,
            "cannot read the held submission",
            "SELECT id, debounce_first_ms FROM taskhost_tasks WHERE slot = $1 \
             AND state = 'delayed' AND debounce_first_ms IS NOT NULL AND due_ms > $2 \
             ORDER BY id LIMIT 1 FOR UPDATE",
            &[&slot, &now],
        )
        .await?;
        let first = held.as_ref().map_or(now, |row| row.get::<_, i64>(1));
        if let Some(row) = held {
            let why = format!(
                "debounced: a newer submission ({}) to slot `{slot}` took its place",
                id_of(id)
            );
            let report = never_ran_row(
                tx,
                id_of(row.get(0)),
                RejectionKind::SupersededByReplace,
                why,
            )
            .await?;
            end_task(self, tx, &report, &[]).await?;
        }
        let due = max_wait_ms.map_or(now + debounce_ms, |wait| {
            (now + debounce_ms).min(first.saturating_add(wait))
        });
        let mut request = a.request.clone();
        request.name = Some(name.clone());
        request.slot = Some(slot.clone());
        request.policy = Some(policy);
        request.not_before = Some(NotBefore::At(due.max(0) as u64));
        exec(
            tx,
            "cannot record the submission",
            "INSERT INTO taskhost_tasks (id, name, slot, plugin, digest, request, state, placed, \
             submitted_ms, due_ms, priority, schedule, debounce_first_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, 'delayed', TRUE, $7, $8, $9, $10, $11)",
            &[
                &id,
                &name,
                &slot,
                &a.plugin,
                &&a.request.plugin.0[..],
                &encode(&request)?,
                &now,
                &due,
                &request.priority,
                &request.schedule,
                &first,
            ],
        )
        .await?;
        self.notify(tx, TIME, "").await?;
        Ok(Submitted {
            id: id_of(id),
            name,
            slot,
            placement: Placement::Delayed {
                due_ms: due.max(0) as u64,
            },
            existing: false,
        })
    }
}
