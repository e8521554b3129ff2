//! Event pages are stored packed (`crate::packed_pages`): a nullable `packed` column beside
//! `events`. Pages written from now on carry their JSON in `packed` and leave `events` empty;
//! pages written before keep their JSON in `events` and are read as they are. Going down, every
//! packed page's JSON is written back to `events` before the column goes.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::FromQueryResult;

use crate::packed_pages;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum RunEventPages {
    Table,
    TenantId,
    RunId,
    FirstSeq,
    Events,
    Packed,
}

/// Pages unpacked per read on the way down.
const UNPACK_BATCH: u64 = 500;

#[derive(FromQueryResult)]
struct PackedRow {
    tenant_id: String,
    run_id: String,
    first_seq: i32,
    packed: Vec<u8>,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(RunEventPages::Table)
                    .add_column(ColumnDef::new(RunEventPages::Packed).blob().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        unpack_pages(manager).await?;
        manager
            .alter_table(
                Table::alter()
                    .table(RunEventPages::Table)
                    .drop_column(RunEventPages::Packed)
                    .to_owned(),
            )
            .await
    }
}

/// Writes each packed page's JSON to `events`, in batches; a page that does not unpack becomes
/// an empty page (what the store reads it as).
async fn unpack_pages(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    loop {
        // Each batch's pages leave the selection once unpacked.
        let mut select = Query::select();
        select
            .columns([
                RunEventPages::TenantId,
                RunEventPages::RunId,
                RunEventPages::FirstSeq,
                RunEventPages::Packed,
            ])
            .from(RunEventPages::Table)
            .and_where(Expr::col(RunEventPages::Packed).is_not_null())
            .limit(UNPACK_BATCH);
        let pages = PackedRow::find_by_statement(backend.build(&select))
            .all(db)
            .await?;
        if pages.is_empty() {
            return Ok(());
        }
        for page in pages {
            let events = packed_pages::unpack(&page.packed)
                .ok()
                .and_then(|json| String::from_utf8(json).ok())
                .unwrap_or_else(|| "[]".to_string());
            let mut update = Query::update();
            update
                .table(RunEventPages::Table)
                .value(RunEventPages::Events, events)
                .value(RunEventPages::Packed, Option::<Vec<u8>>::None)
                .and_where(Expr::col(RunEventPages::TenantId).eq(page.tenant_id))
                .and_where(Expr::col(RunEventPages::RunId).eq(page.run_id))
                .and_where(Expr::col(RunEventPages::FirstSeq).eq(page.first_seq));
            db.execute(&update).await?;
        }
    }
}
