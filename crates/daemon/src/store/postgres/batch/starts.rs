//! Owns a batch of attempt starts: each task's row under its claim's
//! token, and a row of the attempt each, in one statement.

use std::collections::HashSet;

use taskhost_core::supervisor::TaskId;

use crate::store::StoreError;
use crate::store::postgres::{Pg, db, id_of, ms, sql_id};

/// One transaction for a batch of attempt starts; the ids recorded.
pub(super) async fn started(
    pg: &Pg,
    items: &[(TaskId, i64, u32, u64)],
) -> Result<HashSet<TaskId>, StoreError> {
    let ids: Vec<i64> = items.iter().map(|i| sql_id(i.0)).collect();
    let tokens: Vec<i64> = items.iter().map(|i| i.1).collect();
    let attempts: Vec<i32> = items.iter().map(|i| i.2 as i32).collect();
    let at: Vec<i64> = items.iter().map(|i| ms(i.3)).collect();
    let client = pg.client().await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&ids, &tokens, &attempts, &at];
    let plain = client.prepare_cached(START).await.map_err(db(START_WHAT))?;
    let rows = match client.query(&plain, &params).await {
        // A start tried again after a commit whose answer was lost (the
        // database restarted) finds its attempt's row there: then the
        // batch is recorded again without adding the rows it has.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            let again = client
                .prepare_cached(START_AGAIN)
                .await
                .map_err(db(START_WHAT))?;
            client
                .query(&again, &params)
                .await
                .map_err(db(START_WHAT))?
        }
        rows => rows.map_err(db(START_WHAT))?,
    };
    Ok(rows.iter().map(|r| id_of(r.get(0))).collect())
}

const START_WHAT: &str = "cannot record an attempt";

/// Attempt starts: the tasks' rows locked under their tokens, and a row
/// each. A first attempt leaves the task's row as it is (no new version
/// of it, nor of its index entries): `attempts_started!` counts it from
/// its attempt's row. A later one writes its count, and clears the pause.
const START: &str = "WITH u AS (SELECT * FROM unnest($1::int8[], $2::int8[], $3::int4[], \
     $4::int8[]) AS u(id, token, attempt, at)), \
     c AS (SELECT t.id, t.token, u.attempt, t.slot, t.node, u.at, \
           (u.attempt > 1 OR t.attempts > 0 OR t.resume_at_ms IS NOT NULL) AS written \
           FROM taskhost_tasks t JOIN u ON t.id = u.id AND t.token = u.token \
           WHERE t.state IN ('running', 'stopping') FOR NO KEY UPDATE OF t), \
     w AS (UPDATE taskhost_tasks t SET attempts = c.attempt, resume_at_ms = NULL FROM c \
           WHERE t.id = c.id AND c.written) \
     INSERT INTO taskhost_attempts (task_id, attempt, token, slot, node, started_ms) \
     SELECT id, attempt, token, slot, node, at FROM c RETURNING task_id";

/// [`START`], where some of the rows may be there already.
const START_AGAIN: &str = "WITH u AS (SELECT * FROM unnest($1::int8[], $2::int8[], $3::int4[], \
     $4::int8[]) AS u(id, token, attempt, at)), \
     c AS (SELECT t.id, t.token, u.attempt, t.slot, t.node, u.at, \
           (u.attempt > 1 OR t.attempts > 0 OR t.resume_at_ms IS NOT NULL) AS written \
           FROM taskhost_tasks t JOIN u ON t.id = u.id AND t.token = u.token \
           WHERE t.state IN ('running', 'stopping') FOR NO KEY UPDATE OF t), \
     w AS (UPDATE taskhost_tasks t SET attempts = c.attempt, resume_at_ms = NULL FROM c \
           WHERE t.id = c.id AND c.written), \
     i AS (INSERT INTO taskhost_attempts (task_id, attempt, token, slot, node, started_ms) \
           SELECT id, attempt, token, slot, node, at FROM c ON CONFLICT DO NOTHING) \
     SELECT id FROM c";
