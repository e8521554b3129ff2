//! Flows, their versions, the versions' templates and the activation history.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Flows {
    Table,
    Id,
    TenantId,
    Name,
    Title,
    ExecutionMode,
    ClassifierModel,
    CreatedAt,
    UpdatedAt,
    DeletedAt,
}

#[derive(DeriveIden)]
enum FlowVersions {
    Table,
    Id,
    TenantId,
    FlowId,
    Number,
    Entrypoint,
    CreatedAt,
}

#[derive(DeriveIden)]
enum FlowTemplates {
    Table,
    VersionId,
    TenantId,
    Name,
    Position,
    Description,
    Template,
    UserTemplate,
    Llm,
    Temperature,
    MaxToolCalls,
    ToolIds,
    Fallbacks,
    ResponseSchema,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum FlowActivations {
    Table,
    Id,
    TenantId,
    FlowId,
    VersionId,
    Environment,
    Comment,
    ActivatedBy,
    ActivatedAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

fn tenant_fk<T: IntoIden + 'static>(table: T) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .from_tbl(table)
        .from_col(Alias::new("tenant_id"))
        .to(Tenants::Table, Tenants::Id)
        .on_delete(ForeignKeyAction::Cascade)
        .take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Flows::Table)
                    .col(string_len(Flows::Id, 64).primary_key())
                    .col(string_len(Flows::TenantId, 64))
                    .col(string_len(Flows::Name, 128))
                    .col(string_len(Flows::Title, 256))
                    .col(string_len(Flows::ExecutionMode, 16))
                    .col(string_len_null(Flows::ClassifierModel, 256))
                    .col(big_integer(Flows::CreatedAt))
                    .col(big_integer(Flows::UpdatedAt))
                    .col(big_integer_null(Flows::DeletedAt))
                    .foreign_key(&mut tenant_fk(Flows::Table))
                    .take(),
            )
            .await?;
        // Slugs stay unique even after a soft delete, so an old URL never names a new flow.
        manager
            .create_index(
                Index::create()
                    .name("ux_flows_tenant_name")
                    .table(Flows::Table)
                    .col(Flows::TenantId)
                    .col(Flows::Name)
                    .unique()
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(FlowVersions::Table)
                    .col(string_len(FlowVersions::Id, 64).primary_key())
                    .col(string_len(FlowVersions::TenantId, 64))
                    .col(string_len(FlowVersions::FlowId, 64))
                    .col(integer(FlowVersions::Number))
                    .col(string_len(FlowVersions::Entrypoint, 64))
                    .col(big_integer(FlowVersions::CreatedAt))
                    .foreign_key(&mut tenant_fk(FlowVersions::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_flow_versions_flow_number")
                    .table(FlowVersions::Table)
                    .col(FlowVersions::TenantId)
                    .col(FlowVersions::FlowId)
                    .col(FlowVersions::Number)
                    .unique()
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(FlowTemplates::Table)
                    .col(string_len(FlowTemplates::VersionId, 64))
                    .col(string_len(FlowTemplates::TenantId, 64))
                    .col(string_len(FlowTemplates::Name, 64))
                    .col(integer(FlowTemplates::Position))
                    .col(text_null(FlowTemplates::Description))
                    .col(text(FlowTemplates::Template))
                    .col(text_null(FlowTemplates::UserTemplate))
                    .col(string_len_null(FlowTemplates::Llm, 256))
                    .col(double_null(FlowTemplates::Temperature))
                    .col(integer_null(FlowTemplates::MaxToolCalls))
                    .col(text(FlowTemplates::ToolIds))
                    .col(text(FlowTemplates::Fallbacks))
                    .col(text_null(FlowTemplates::ResponseSchema))
                    .col(big_integer(FlowTemplates::UpdatedAt))
                    .primary_key(
                        Index::create()
                            .col(FlowTemplates::VersionId)
                            .col(FlowTemplates::Name),
                    )
                    .foreign_key(&mut tenant_fk(FlowTemplates::Table))
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(FlowActivations::Table)
                    .col(string_len(FlowActivations::Id, 64).primary_key())
                    .col(string_len(FlowActivations::TenantId, 64))
                    .col(string_len(FlowActivations::FlowId, 64))
                    .col(string_len(FlowActivations::VersionId, 64))
                    .col(string_len(FlowActivations::Environment, 64))
                    .col(text_null(FlowActivations::Comment))
                    .col(string_len(FlowActivations::ActivatedBy, 200))
                    .col(big_integer(FlowActivations::ActivatedAt))
                    .foreign_key(&mut tenant_fk(FlowActivations::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_flow_activations_flow")
                    .table(FlowActivations::Table)
                    .col(FlowActivations::TenantId)
                    .col(FlowActivations::FlowId)
                    .col(FlowActivations::ActivatedAt)
                    .take(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            FlowActivations::Table.into_iden(),
            FlowTemplates::Table.into_iden(),
            FlowVersions::Table.into_iden(),
            Flows::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).take())
                .await?;
        }
        Ok(())
    }
}
