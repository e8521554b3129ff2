//! The invocation log's tables carry no foreign key to `tenants` on PostgreSQL (its per-row
//! check was a fifth of the log writer's database time) and keep it on SQLite; the migration's
//! `down` puts PostgreSQL's back. SQLite by default; PostgreSQL with
//! `BATON_TEST_DATABASE_URL=postgres://...`.

#![allow(clippy::unwrap_used)]

use baton_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};

mod support;
use support::Scratch;

const KEYS_MIGRATION: &str = "m20261127_000001_log_tables_without_tenant_keys";

const LOG_TABLES: [&str; 5] = [
    "runs",
    "run_event_pages",
    "run_tags",
    "run_log_entries",
    "budget_charges",
];

/// How many of the log tables hold a foreign key to `tenants`.
async fn tables_keyed_to_tenants(db: &DatabaseConnection) -> usize {
    let mut keyed = 0;
    for table in LOG_TABLES {
        let sql = match db.get_database_backend() {
            DbBackend::Postgres => format!(
                "SELECT COUNT(*) FROM pg_constraint \
                 WHERE contype = 'f' AND conrelid = '\"{table}\"'::regclass \
                 AND confrelid = 'tenants'::regclass"
            ),
            _ => format!(
                "SELECT COUNT(*) FROM pragma_foreign_key_list('{table}') WHERE \"table\" = 'tenants'"
            ),
        };
        let row = db
            .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
            .await
            .unwrap()
            .unwrap();
        if row.try_get_by_index::<i64>(0).unwrap() > 0 {
            keyed += 1;
        }
    }
    keyed
}

#[tokio::test]
async fn log_tables_drop_their_tenant_keys_on_postgres_only() {
    let scratch = Scratch::new("log_keys").await;
    let db = Database::connect(scratch.raw_url()).await.unwrap();
    let postgres = db.get_database_backend() == DbBackend::Postgres;
    let before = Migrator::migrations()
        .iter()
        .position(|m| m.name() == KEYS_MIGRATION)
        .unwrap();
    Migrator::up(&db, Some(u32::try_from(before).unwrap()))
        .await
        .unwrap();
    assert_eq!(tables_keyed_to_tenants(&db).await, LOG_TABLES.len());

    Migrator::up(&db, None).await.unwrap();
    let expected = if postgres { 0 } else { LOG_TABLES.len() };
    assert_eq!(tables_keyed_to_tenants(&db).await, expected);

    let from_keys = Migrator::migrations().len() - before;
    Migrator::down(&db, Some(u32::try_from(from_keys).unwrap()))
        .await
        .unwrap();
    assert_eq!(tables_keyed_to_tenants(&db).await, LOG_TABLES.len());
    Migrator::up(&db, None).await.unwrap();
    assert_eq!(tables_keyed_to_tenants(&db).await, expected);

    let _ = db.close().await;
    scratch.remove().await;
}
