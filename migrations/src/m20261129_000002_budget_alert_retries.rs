//! A budget alert whose five attempts all failed (the receiver down, or answering errors) is
//! tried again later, in rounds further apart, instead of staying failed: `retry_at` says when
//! its next round is due, and the partial index keeps the sweep's query on the few alerts
//! waiting for one.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum BudgetAlerts {
    Table,
    RetryAt,
}

const INDEX: &str = "ix_budget_alerts_retry_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(BudgetAlerts::Table)
                    // Epoch milliseconds when the next delivery round is due; NULL: none is
                    // (delivered, not tried yet, or given up). Alerts that failed before this
                    // migration stay given up.
                    .add_column(ColumnDef::new(BudgetAlerts::RetryAt).big_integer().null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table(BudgetAlerts::Table)
                    .col(BudgetAlerts::RetryAt)
                    .and_where(Expr::col(BudgetAlerts::RetryAt).is_not_null())
                    .take(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(INDEX)
                    .table(BudgetAlerts::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(BudgetAlerts::Table)
                    .drop_column(BudgetAlerts::RetryAt)
                    .to_owned(),
            )
            .await
    }
}
