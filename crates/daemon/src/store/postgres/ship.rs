//! Owns what nodes ship to the database for every node to show: running
//! tasks' lines and the cluster's events (read by a feed), and retention.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use taskhost_core::logline::LogLine;
use taskhost_core::supervisor::{Event, TaskId};

use crate::store::{StoreError, now_ms};

use super::*;

/// Events kept in the database (each node prunes beyond it).
pub(crate) const EVENTS_KEPT: i64 = 100_000;

/// Most events in one row of `taskhost_events`.
const EVENTS_PER_ROW: usize = 1_000;

/// An event's seq is its row's seq times this, plus its place in the row.
const SEQ_SPAN: i64 = 1_024;

/// Rows of events read by one statement.
const ROWS_AT_ONCE: i64 = 16;

/// The events of a row of `taskhost_events` (seq, n, event), each with
/// its seq: a list of `n` events, or one shipped before rows held lists
/// (`n` = 0).
fn row_events(row: &tokio_postgres::Row) -> Result<Vec<Event>, StoreError> {
    let seq: i64 = row.get(0);
    let bytes: &[u8] = row.get(2);
    let mut events = if row.get::<_, i32>(1) == 0 {
        vec![decode_event(bytes)?]
    } else {
        decode::<Vec<Event>>(bytes)?
    };
    for (i, event) in events.iter_mut().enumerate() {
        event.seq = (seq * SEQ_SPAN + i as i64).max(0) as u64;
    }
    Ok(events)
}

/// Locks the slot of task `id` (the row lock every decision in a slot
/// takes first); returns the slot, None for an unknown task.
/// An event as a node shipped it: one shipped before `Event::parent`
/// existed lacks its last byte (`None`).
pub(super) fn decode_event(bytes: &[u8]) -> Result<Event, StoreError> {
    decode(bytes).or_else(|e| {
        let mut padded = bytes.to_vec();
        padded.push(0);
        postcard::from_bytes(&padded).map_err(|_| e)
    })
}

impl Pg {
    /// Ships lines of running tasks, each kept only while its claim (task,
    /// token) holds.
    pub(crate) async fn ship_lines(
        &self,
        lines: &[(TaskId, i64, LogLine)],
        keep_lines: usize,
    ) -> Result<(), StoreError> {
        let mut ids = Vec::with_capacity(lines.len());
        let mut tokens = Vec::with_capacity(lines.len());
        let mut encoded = Vec::with_capacity(lines.len());
        for (id, token, line) in lines {
            ids.push(sql_id(*id));
            tokens.push(*token);
            encoded.push(encode(line)?);
        }
        // One transaction: readers never see more than `keep_lines` of a
        // running task's lines (the newest are kept, as a node's memory
        // keeps them), so the table is bounded while tasks run, not only
        // after their end.
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot ship log lines"))?;
        exec(
            &tx,
            "cannot ship log lines",
            "INSERT INTO taskhost_logs (task_id, line) \
                 SELECT u.id, u.line FROM unnest($1::bigint[], $2::bigint[], $3::bytea[]) \
                 WITH ORDINALITY AS u(id, token, line, n) \
                 JOIN taskhost_tasks t ON t.id = u.id AND t.token = u.token \
                 AND t.state IN ('running', 'stopping') ORDER BY u.n",
            &[&ids, &tokens, &encoded],
        )
        .await?;
        ids.sort_unstable();
        ids.dedup();
        let trim = tx
            .prepare_cached(
                "DELETE FROM taskhost_logs l USING unnest($1::bigint[]) AS t(id) \
                 WHERE l.task_id = t.id AND l.seq <= (SELECT seq FROM taskhost_logs \
                 WHERE task_id = t.id ORDER BY seq DESC OFFSET $2 LIMIT 1)",
            )
            .await
            .map_err(db("cannot trim log lines"))?;
        let keep = i64::try_from(keep_lines).unwrap_or(i64::MAX);
        tx.execute(&trim, &[&ids, &keep])
            .await
            .map_err(db("cannot trim log lines"))?;
        tx.commit().await.map_err(db("cannot ship log lines"))?;
        Ok(())
    }

    /// A running task's shipped lines after `after` (a `seq`); returns them
    /// with the last seq.
    pub(crate) async fn shipped_lines(
        &self,
        id: TaskId,
        after: i64,
    ) -> Result<(Vec<LogLine>, i64), StoreError> {
        let client = self.client().await?;
        let rows = all(
            &client,
            "cannot read log lines",
            "SELECT seq, line FROM taskhost_logs WHERE task_id = $1 AND seq > $2 \
                 ORDER BY seq LIMIT 1000",
            &[&sql_id(id), &after],
        )
        .await?;
        let mut last = after;
        let mut lines = Vec::with_capacity(rows.len());
        for row in &rows {
            last = row.get(0);
            lines.push(decode(row.get::<_, &[u8]>(1))?);
        }
        Ok((lines, last))
    }

    /// Ships a node's events, one row for each [`EVENTS_PER_ROW`] of them,
    /// and tells the nodes' feeds (once the statement, and so the insert,
    /// has committed).
    pub(crate) async fn ship_events(&self, node: i64, events: &[Event]) -> Result<(), StoreError> {
        let mut rows = Vec::new();
        let mut counts = Vec::new();
        for chunk in events.chunks(EVENTS_PER_ROW) {
            rows.push(encode(&chunk)?);
            counts.push(chunk.len() as i32);
        }
        let client = self.client().await?;
        exec(
            &client,
            "cannot ship events",
            "WITH shipped AS (INSERT INTO taskhost_events (node, event, n) \
                 SELECT $1, e, c FROM unnest($2::bytea[], $3::int4[]) WITH ORDINALITY \
                 AS u(e, c, i) ORDER BY i RETURNING 1) \
                 SELECT pg_notify($4, '') FROM (SELECT 1 FROM shipped LIMIT 1) s",
            &[&node, &rows, &counts, &super::EVENTS],
        )
        .await?;
        Ok(())
    }

    /// The cluster's events after seq `after` (None: the newest `limit`),
    /// at most `limit`, oldest first, each with its seq (its row's seq
    /// times [`SEQ_SPAN`] plus its place in the row).
    pub(crate) async fn events(
        &self,
        after: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let limit = usize::try_from(limit).unwrap_or(0);
        let client = self.client().await?;
        let Some(after) = after else {
            // The newest rows, a few at a time, until they hold `limit`.
            let mut rows = Vec::new();
            let mut held = 0;
            let mut below = i64::MAX;
            while held < limit {
                let more = all(
                    &client,
                    "cannot read events",
                    "SELECT seq, n, event FROM taskhost_events WHERE seq < $1 \
                     ORDER BY seq DESC LIMIT $2",
                    &[&below, &ROWS_AT_ONCE],
                )
                .await?;
                for row in &more {
                    below = row.get(0);
                    held += usize::try_from(row.get::<_, i32>(1)).unwrap_or(0).max(1);
                    rows.push(row_events(row)?);
                }
                if (more.len() as i64) < ROWS_AT_ONCE {
                    break;
                }
            }
            let mut events: Vec<Event> = rows.into_iter().rev().flatten().collect();
            let extra = events.len().saturating_sub(limit);
            events.drain(..extra);
            return Ok(events);
        };
        let mut events = Vec::new();
        let mut from = after.div_euclid(SEQ_SPAN);
        let mut first = true;
        while events.len() < limit {
            let rows = all(
                &client,
                "cannot read events",
                if first {
                    "SELECT seq, n, event FROM taskhost_events WHERE seq >= $1 \
                     ORDER BY seq LIMIT $2"
                } else {
                    "SELECT seq, n, event FROM taskhost_events WHERE seq > $1 \
                     ORDER BY seq LIMIT $2"
                },
                &[&from, &ROWS_AT_ONCE],
            )
            .await?;
            first = false;
            for row in &rows {
                from = row.get(0);
                let room = limit - events.len();
                events.extend(
                    row_events(row)?
                        .into_iter()
                        .filter(|e| e.seq as i64 > after)
                        .take(room),
                );
            }
            if (rows.len() as i64) < ROWS_AT_ONCE {
                break;
            }
        }
        Ok(events)
    }

    /// Deletes finished tasks beyond the retention bounds (and their
    /// attempts): those older than `max_age` (read by the finished index),
    /// and with `bounds` those beyond the newest `max_finished` or
    /// `max_bytes` too (a window over every finished task).
    pub(crate) async fn prune(
        &self,
        (max_finished, max_age, max_bytes): (usize, Duration, u64),
        bounds: bool,
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let cutoff = ms(now_ms().saturating_sub(max_age.as_millis() as u64));
        let n = if bounds {
            let keep = i64::try_from(max_finished).unwrap_or(i64::MAX);
            let bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
            exec(
                &client,
                "cannot apply retention",
                "WITH gone AS (DELETE FROM taskhost_tasks WHERE state = 'finished' AND \
                 (finished_ms < $1 OR id IN (SELECT id FROM (SELECT id, \
                 row_number() OVER newest AS n, \
                 sum(length(request) + coalesce(length(report), 0) + coalesce(length(log), 0) \
                 + coalesce(length(records), 0)) \
                 OVER newest AS bytes FROM taskhost_tasks WHERE state = 'finished' \
                 WINDOW newest AS (ORDER BY finished_ms DESC, id DESC)) kept \
                 WHERE n > $2 OR bytes > $3)) RETURNING id), \
                 lines AS (DELETE FROM taskhost_logs WHERE task_id IN (SELECT id FROM gone)) \
                 DELETE FROM taskhost_attempts WHERE task_id IN (SELECT id FROM gone)",
                &[&cutoff, &keep, &bytes],
            )
            .await?
        } else {
            exec(
                &client,
                "cannot apply retention",
                "WITH gone AS (DELETE FROM taskhost_tasks WHERE state = 'finished' AND \
                 finished_ms < $1 RETURNING id), \
                 lines AS (DELETE FROM taskhost_logs WHERE task_id IN (SELECT id FROM gone)) \
                 DELETE FROM taskhost_attempts WHERE task_id IN (SELECT id FROM gone)",
                &[&cutoff],
            )
            .await?
        };
        // The rows older than the newest that hold EVENTS_KEPT events.
        exec(
            &client,
            "cannot prune events",
            "DELETE FROM taskhost_events WHERE seq < (SELECT seq FROM (SELECT seq, \
             sum(greatest(n, 1)) OVER (ORDER BY seq DESC) AS held FROM taskhost_events) e \
             WHERE held >= $1 ORDER BY seq DESC LIMIT 1)",
            &[&EVENTS_KEPT],
        )
        .await?;
        Ok(n)
    }
}
