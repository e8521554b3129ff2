//! Per-flow statistics (`/statistics/flow/{flowName}...`) select a tenant's runs of one flow in a
//! period: an index on exactly that, instead of scanning the tenant's whole period.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Runs {
    Table,
    TenantId,
    FlowName,
    CreatedAt,
}

const INDEX: &str = "ix_runs_tenant_flow_created";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table(Runs::Table)
                    .col(Runs::TenantId)
                    .col(Runs::FlowName)
                    .col(Runs::CreatedAt)
                    .take(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table(Runs::Table).to_owned())
            .await
    }
}
