//! A run's budget holds are stored with its `Pending` row, so that a run whose process died
//! (or gave its final row up) can be finished later and its holds given back; the sweep that
//! does it selects `Pending` runs by start time, hence the index.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Runs {
    Table,
    BudgetHolds,
    Status,
    CreatedAt,
}

const INDEX: &str = "ix_runs_status_created";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .add_column(
                        ColumnDef::new(Runs::BudgetHolds)
                            .text()
                            .not_null()
                            .default("[]"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table(Runs::Table)
                    .col(Runs::Status)
                    .col(Runs::CreatedAt)
                    .take(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table(Runs::Table).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .drop_column(Runs::BudgetHolds)
                    .to_owned(),
            )
            .await
    }
}
