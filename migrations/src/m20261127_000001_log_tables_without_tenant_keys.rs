//! On PostgreSQL, the tables the invocation-log writer appends to lose their foreign key to
//! `tenants` (docs/decisions.md, "Log tables without a foreign key on PostgreSQL").
//!
//! PostgreSQL checks a foreign key with a trigger per inserted row that runs
//! `SELECT 1 FROM tenants WHERE id = $1 FOR KEY SHARE` through SPI, executor start-up and a
//! tuple lock included: a fifth of the writer's database time per logged request
//! (docs/performance.md). Tenants are never deleted through Baton, so the keys' cascade never
//! ran, and every row these tables get is written for a tenant the request authenticated as.
//! SQLite keeps its keys: its check is one index probe, and dropping one means rebuilding the
//! table.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The log writer's tables; each key is named `<table>_tenant_id_fkey` (PostgreSQL's default
/// name, which the migrations that created them left).
const TABLES: [&str; 5] = [
    "runs",
    "run_event_pages",
    "run_tags",
    "run_log_entries",
    "budget_charges",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        for table in TABLES {
            db.execute_unprepared(&format!(
                "ALTER TABLE \"{table}\" DROP CONSTRAINT IF EXISTS \"{table}_tenant_id_fkey\""
            ))
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let db = manager.get_connection();
        for table in TABLES {
            db.execute_unprepared(&format!(
                "ALTER TABLE \"{table}\" ADD CONSTRAINT \"{table}_tenant_id_fkey\" \
                 FOREIGN KEY (\"tenant_id\") REFERENCES \"tenants\" (\"id\") ON DELETE CASCADE"
            ))
            .await?;
        }
        Ok(())
    }
}
