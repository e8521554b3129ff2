//! Budgets: limits per calendar period, the spend and holds of each period, the alerts sent, and
//! which runs were already charged (a run's spend counts once, whatever retries happen).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Budgets {
    Table,
    Id,
    TenantId,
    Name,
    Period,
    LimitCredits,
    AlertThresholds,
    WebhookUrl,
    WebhookSecret,
    HardLimit,
    CustomerExternalId,
    Tag,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum BudgetWindows {
    Table,
    BudgetId,
    WindowStart,
    TenantId,
    SpentCredits,
    ReservedCredits,
}

#[derive(DeriveIden)]
enum BudgetAlerts {
    Table,
    BudgetId,
    WindowStart,
    Threshold,
    TenantId,
    SpentCredits,
    CreatedAt,
    DeliveredAt,
    Attempts,
    LastError,
}

#[derive(DeriveIden)]
enum BudgetCharges {
    Table,
    RunId,
    TenantId,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

fn tenant_fk(table: impl IntoIden, column: impl IntoIden) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .from_tbl(table)
        .from_col(column)
        .to(Tenants::Table, Tenants::Id)
        .on_delete(ForeignKeyAction::Cascade)
        .take()
}

fn budget_fk(table: impl IntoIden, column: impl IntoIden) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .from_tbl(table)
        .from_col(column)
        .to(Budgets::Table, Budgets::Id)
        .on_delete(ForeignKeyAction::Cascade)
        .take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Budgets::Table)
                    .col(string_len(Budgets::Id, 64).primary_key())
                    .col(string_len(Budgets::TenantId, 64))
                    .col(string_len(Budgets::Name, 200))
                    .col(string_len(Budgets::Period, 16))
                    .col(big_integer(Budgets::LimitCredits))
                    // JSON array of percentages.
                    .col(text(Budgets::AlertThresholds))
                    .col(text_null(Budgets::WebhookUrl))
                    .col(string_len(Budgets::WebhookSecret, 128))
                    .col(boolean(Budgets::HardLimit))
                    .col(string_len_null(Budgets::CustomerExternalId, 256))
                    .col(string_len_null(Budgets::Tag, 200))
                    .col(big_integer(Budgets::CreatedAt))
                    .col(big_integer(Budgets::UpdatedAt))
                    .foreign_key(&mut tenant_fk(Budgets::Table, Budgets::TenantId))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_budgets_tenant_name")
                    .table(Budgets::Table)
                    .col(Budgets::TenantId)
                    .col(Budgets::Name)
                    .unique()
                    .take(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(BudgetWindows::Table)
                    .col(string_len(BudgetWindows::BudgetId, 64))
                    .col(big_integer(BudgetWindows::WindowStart))
                    .col(string_len(BudgetWindows::TenantId, 64))
                    .col(big_integer(BudgetWindows::SpentCredits))
                    .col(big_integer(BudgetWindows::ReservedCredits))
                    .primary_key(
                        Index::create()
                            .col(BudgetWindows::BudgetId)
                            .col(BudgetWindows::WindowStart),
                    )
                    .foreign_key(&mut budget_fk(
                        BudgetWindows::Table,
                        BudgetWindows::BudgetId,
                    ))
                    .take(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(BudgetAlerts::Table)
                    .col(string_len(BudgetAlerts::BudgetId, 64))
                    .col(big_integer(BudgetAlerts::WindowStart))
                    .col(integer(BudgetAlerts::Threshold))
                    .col(string_len(BudgetAlerts::TenantId, 64))
                    .col(big_integer(BudgetAlerts::SpentCredits))
                    .col(big_integer(BudgetAlerts::CreatedAt))
                    .col(big_integer_null(BudgetAlerts::DeliveredAt))
                    .col(integer(BudgetAlerts::Attempts))
                    .col(text_null(BudgetAlerts::LastError))
                    .primary_key(
                        Index::create()
                            .col(BudgetAlerts::BudgetId)
                            .col(BudgetAlerts::WindowStart)
                            .col(BudgetAlerts::Threshold),
                    )
                    .foreign_key(&mut budget_fk(BudgetAlerts::Table, BudgetAlerts::BudgetId))
                    .take(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(BudgetCharges::Table)
                    .col(string_len(BudgetCharges::RunId, 64).primary_key())
                    .col(string_len(BudgetCharges::TenantId, 64))
                    .col(big_integer(BudgetCharges::CreatedAt))
                    .foreign_key(&mut tenant_fk(
                        BudgetCharges::Table,
                        BudgetCharges::TenantId,
                    ))
                    .take(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            BudgetCharges::Table.into_iden(),
            BudgetAlerts::Table.into_iden(),
            BudgetWindows::Table.into_iden(),
            Budgets::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).take())
                .await?;
        }
        Ok(())
    }
}
