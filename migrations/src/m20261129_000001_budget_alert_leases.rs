//! Budget alerts survive the process that recorded them: an alert is recorded in the log
//! writer's transaction and POSTed by the process that wrote it, so one that process never got
//! to send (stopped, crashed) stayed unsent. A sweep now sends alerts left unattempted; the
//! lease keeps two instances (or two sweeps) from sending one alert at once, and the partial
//! index keeps the sweep's query on the few alerts still waiting, not every alert ever sent.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum BudgetAlerts {
    Table,
    LeasedUntil,
    CreatedAt,
    DeliveredAt,
    Attempts,
    LastError,
}

const INDEX: &str = "ix_budget_alerts_unsent_created";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(BudgetAlerts::Table)
                    // Epoch milliseconds until which a sender holds the alert; 0: nobody.
                    .add_column(
                        ColumnDef::new(BudgetAlerts::LeasedUntil)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await?;
        // The condition the sweep names as a literal (`baton-store`'s `budgets::UNSENT`), so
        // both planners can prove it implies this one.
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table(BudgetAlerts::Table)
                    .col(BudgetAlerts::CreatedAt)
                    .and_where(Expr::col(BudgetAlerts::DeliveredAt).is_null())
                    .and_where(Expr::col(BudgetAlerts::Attempts).eq(0))
                    .and_where(Expr::col(BudgetAlerts::LastError).is_null())
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
                    .drop_column(BudgetAlerts::LeasedUntil)
                    .to_owned(),
            )
            .await
    }
}
