//! Internal log lines kept with debug runs (`x_log_level`, `is_debug`), read back through
//! `/llm-logs/{id}/log-entries`.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum RunLogEntries {
    Table,
    Id,
    TenantId,
    RunId,
    Seq,
    Level,
    Target,
    Message,
    Fields,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(RunLogEntries::Table)
                    .col(string_len(RunLogEntries::Id, 64).primary_key())
                    .col(string_len(RunLogEntries::TenantId, 64))
                    .col(string_len(RunLogEntries::RunId, 64))
                    .col(integer(RunLogEntries::Seq))
                    .col(string_len(RunLogEntries::Level, 16))
                    .col(string_len(RunLogEntries::Target, 256))
                    .col(text(RunLogEntries::Message))
                    .col(text(RunLogEntries::Fields))
                    .col(big_integer(RunLogEntries::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from_tbl(RunLogEntries::Table)
                            .from_col(RunLogEntries::TenantId)
                            .to(Tenants::Table, Tenants::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_run_log_entries_run")
                    .table(RunLogEntries::Table)
                    .col(RunLogEntries::TenantId)
                    .col(RunLogEntries::RunId)
                    .col(RunLogEntries::Seq)
                    .take(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(RunLogEntries::Table).take())
            .await
    }
}
