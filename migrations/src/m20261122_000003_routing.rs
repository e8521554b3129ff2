//! Routing rules (tenant aliases over model chains) and the response-cache flag on runs.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum RoutingRules {
    Table,
    Id,
    TenantId,
    Alias,
    Models,
    Strategy,
    Weights,
    Description,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Runs {
    Table,
    WasCached,
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
                    .table(RoutingRules::Table)
                    .col(string_len(RoutingRules::Id, 64).primary_key())
                    .col(string_len(RoutingRules::TenantId, 64))
                    .col(string_len(RoutingRules::Alias, 256))
                    // JSON arrays: the chain and, for Weighted, one weight per model.
                    .col(text(RoutingRules::Models))
                    .col(string_len(RoutingRules::Strategy, 32))
                    .col(text_null(RoutingRules::Weights))
                    .col(text_null(RoutingRules::Description))
                    .col(big_integer(RoutingRules::CreatedAt))
                    .col(big_integer(RoutingRules::UpdatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from_tbl(RoutingRules::Table)
                            .from_col(RoutingRules::TenantId)
                            .to(Tenants::Table, Tenants::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_routing_rules_tenant_alias")
                    .table(RoutingRules::Table)
                    .col(RoutingRules::TenantId)
                    .col(RoutingRules::Alias)
                    .unique()
                    .take(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .add_column(boolean(Runs::WasCached).default(false))
                    .take(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .drop_column(Runs::WasCached)
                    .take(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(RoutingRules::Table).take())
            .await
    }
}
