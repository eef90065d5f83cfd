//! Owns the cluster database's schema: the migrations, applied in order
//! under an advisory lock so that nodes starting together take turns, and
//! the rows an older schema left to fill.

use deadpool_postgres::GenericClient;

use crate::store::StoreError;
use crate::wire::protocol::SubmitRequest;

use super::*;

/// The migrations, in order; `taskhost_schema.version` counts those applied.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_cluster.sql"),
    include_str!("../../../migrations/postgres/0002_logs.sql"),
    include_str!("../../../migrations/postgres/0003_events.sql"),
    include_str!("../../../migrations/postgres/0004_fillfactor.sql"),
    include_str!("../../../migrations/postgres/0005_idempotency.sql"),
    include_str!("../../../migrations/postgres/0006_time.sql"),
    include_str!("../../../migrations/postgres/0007_kv.sql"),
    include_str!("../../../migrations/postgres/0008_lineage.sql"),
    include_str!("../../../migrations/postgres/0009_slot_rules.sql"),
    include_str!("../../../migrations/postgres/0010_namespaces.sql"),
    include_str!("../../../migrations/postgres/0011_namespace_quotas.sql"),
    include_str!("../../../migrations/postgres/0012_queue_order.sql"),
    include_str!("../../../migrations/postgres/0013_deployments.sql"),
    include_str!("../../../migrations/postgres/0014_event_batches.sql"),
    include_str!("../../../migrations/postgres/0015_fewer_indexes.sql"),
    include_str!("../../../migrations/postgres/0016_records.sql"),
];

/// The migration that added `parent` and `root`, filled from each row's
/// request when it runs.
const LINEAGE_MIGRATION: usize = 8;

/// The advisory lock that serialises migrations of nodes starting together.
const MIGRATION_LOCK: i64 = 0x7461_736b_686f_7374;

/// Fills `parent` and `root` of the rows stored before the columns were
/// (from their requests; rows nobody spawned keep NULL).
pub(super) async fn fill_lineage(
    tx: &deadpool_postgres::Transaction<'_>,
) -> Result<(), StoreError> {
    let rows = all(
        tx,
        "cannot read the tasks to migrate",
        "SELECT id, request FROM taskhost_tasks",
        &[],
    )
    .await?;
    for row in rows {
        let Ok(request) = SubmitRequest::decode_stored(row.get::<_, &[u8]>(1)) else {
            continue;
        };
        let Some(parent) = request.parent else {
            continue;
        };
        let root = request.root.unwrap_or(parent);
        exec(
            tx,
            "cannot migrate a task's parent",
            "UPDATE taskhost_tasks SET parent = $2, root = $3 WHERE id = $1",
            &[&row.get::<_, i64>(0), &ms(parent), &ms(root)],
        )
        .await?;
    }
    Ok(())
}

impl Pg {
    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(db("cannot start a transaction"))?;
        exec(
            &tx,
            "cannot take the migration lock",
            "SELECT pg_advisory_xact_lock($1)",
            &[&MIGRATION_LOCK],
        )
        .await?;
        let exists: bool = one(
            &tx,
            "cannot read the schema",
            "SELECT to_regclass('taskhost_schema') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
        if !exists {
            tx.batch_execute("CREATE TABLE taskhost_schema (version INTEGER NOT NULL)")
                .await
                .map_err(db("cannot create the schema table"))?;
        }
        let version: i32 = opt(
            &tx,
            "cannot read the schema version",
            "SELECT version FROM taskhost_schema",
            &[],
        )
        .await?
        .map_or(0, |r| r.get(0));
        let known = MIGRATIONS.len() as i32;
        if version > known {
            return Err(StoreError::Failed(format!(
                "the database's schema is version {version}, newer than this host knows \
                 ({known}); upgrade this host to the version the other nodes run"
            )));
        }
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.batch_execute(migration)
                .await
                .map_err(db("cannot apply a migration"))?;
            if i + 1 == LINEAGE_MIGRATION && version > 0 {
                fill_lineage(&tx).await?;
            }
        }
        if version == 0 {
            exec(
                &tx,
                "cannot record the schema version",
                "INSERT INTO taskhost_schema (version) VALUES ($1)",
                &[&known],
            )
            .await?;
        } else if version < known {
            exec(
                &tx,
                "cannot record the schema version",
                "UPDATE taskhost_schema SET version = $1",
                &[&known],
            )
            .await?;
        }
        tx.commit()
            .await
            .map_err(db("cannot commit the migrations"))
    }
}
