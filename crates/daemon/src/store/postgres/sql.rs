//! Owns the SQL plumbing every job of the cluster's database shares: running
//! a statement with what failed named, telling a lost race or an unreachable
//! database from a failed statement (and running a transaction again after a
//! lost race), and the rows' encodings (postcard, ids, milliseconds).

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use taskhost_core::supervisor::TaskId;

use crate::store::StoreError;
use crate::wire::protocol::SubmitRequest;

pub(super) fn db(what: &str) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
    move |e| {
        // A lost deadlock or serialisation race is told apart, so that
        // `retry` runs the transaction again; so is a database that could
        // not be reached, so that a claimed attempt's writes are tried
        // again while the node holds its lease.
        let message = format!("PostgreSQL: {what}: {}", error_text(&e));
        if is_lost_race(&e) {
            StoreError::Lost(message)
        } else if is_unreachable(&e) {
            StoreError::Unreachable(message)
        } else {
            StoreError::Failed(message)
        }
    }
}

/// Whether `e` is the database being away rather than the statement
/// failing: no answer at all (a closed or refused connection, a timeout),
/// or the server's own word that it is shutting down, starting up, or out
/// of connections (SQLSTATE classes 08, 57 and 53).
fn is_unreachable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => {
            e.is_closed()
                || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
                || e.to_string().contains("timeout")
        }
        Some(code) => {
            let class = &code.code()[..2];
            matches!(class, "08" | "57" | "53")
        }
    }
}

/// The parameters of a statement.
pub(super) type Params<'a> = &'a [&'a (dyn tokio_postgres::types::ToSql + Sync)];

/// Runs a statement (prepared once per connection), naming `what` failed.
pub(super) async fn exec(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.execute(&stmt, params).await.map_err(db(what))
}

/// The one row a query returns.
pub(super) async fn one(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<tokio_postgres::Row, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.query_one(&stmt, params).await.map_err(db(what))
}

/// A new task id from the database's sequence.
pub(super) async fn next_id(c: &impl GenericClient) -> Result<i64, StoreError> {
    let row = one(
        c,
        "cannot allocate an id",
        "SELECT nextval('taskhost_task_ids')",
        &[],
    )
    .await?;
    Ok(row.get(0))
}

/// The row a query returns, if any.
pub(super) async fn opt(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<tokio_postgres::Row>, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.query_opt(&stmt, params).await.map_err(db(what))
}

/// Every row a query returns.
pub(super) async fn all(
    c: &impl GenericClient,
    what: &str,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let stmt = c.prepare_cached(sql).await.map_err(db(what))?;
    c.query(&stmt, params).await.map_err(db(what))
}

fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => chain(e),
    }
}

/// An error with its causes, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub(super) fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    let text = match &e {
        deadpool_postgres::PoolError::Backend(e) => error_text(e),
        other => chain(other),
    };
    StoreError::NoConnection(format!("PostgreSQL: no connection: {text}"))
}

/// Whether `e` is a lost deadlock or serialisation race.
fn is_lost_race(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_DEADLOCK_DETECTED) | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    )
}

pub(super) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_allocvec(value)
        .map_err(|e| StoreError::Failed(format!("cannot encode a row: {e}")))
}

pub(super) fn decode<T: for<'de> serde::Deserialize<'de>>(bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes)
        .map_err(|e| StoreError::Failed(format!("a stored row does not decode: {e}")))
}

/// A stored submission, also one a protocol-5 node wrote (before
/// `allow_http`).
pub(super) fn decode_request(bytes: &[u8]) -> Result<SubmitRequest, StoreError> {
    SubmitRequest::decode_stored(bytes)
        .map_err(|e| StoreError::Failed(format!("a stored row does not decode: {e}")))
}

pub(super) fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn id_of(v: i64) -> TaskId {
    TaskId::from_u64(u64::try_from(v).unwrap_or(0))
}

pub(super) fn sql_id(id: TaskId) -> i64 {
    ms(id.get())
}
