//! The invocation log: one row per request (run), its tags, and its stored stream events.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Runs {
    Table,
    Id,
    TenantId,
    RootId,
    ParentId,
    Depth,
    AgentRole,
    Kind,
    Environment,
    FlowName,
    RequestedModel,
    ServedModel,
    Provider,
    Status,
    FinishReason,
    TokensIn,
    TokensOut,
    ReasoningTokens,
    CachedTokens,
    WebSearchCalls,
    CostCredits,
    RawCostCredits,
    PricingUncertain,
    DurationMs,
    CustomerId,
    CustomerExternalId,
    Tags,
    RequestText,
    ResponseText,
    ErrorCode,
    ErrorMessage,
    DetailDropped,
    FallbackUsed,
    Attempts,
    IsDebug,
    CancelRequestedAt,
    CancelledAt,
    CancelRequestedBy,
    CreatedAt,
    CompletedAt,
}

#[derive(DeriveIden)]
enum RunTags {
    Table,
    RunId,
    TenantId,
    Tag,
    CreatedAt,
}

#[derive(DeriveIden)]
enum RunEvents {
    Table,
    Id,
    RunId,
    TenantId,
    Seq,
    EventType,
    Payload,
    CreatedAt,
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
                    .table(Runs::Table)
                    .col(string_len(Runs::Id, 64).primary_key())
                    .col(string_len(Runs::TenantId, 64))
                    .col(string_len(Runs::RootId, 64))
                    .col(string_len_null(Runs::ParentId, 64))
                    .col(integer(Runs::Depth))
                    .col(string_len_null(Runs::AgentRole, 200))
                    .col(string_len(Runs::Kind, 32))
                    .col(string_len_null(Runs::Environment, 256))
                    .col(string_len_null(Runs::FlowName, 256))
                    .col(string_len(Runs::RequestedModel, 256))
                    .col(string_len_null(Runs::ServedModel, 256))
                    .col(string_len_null(Runs::Provider, 64))
                    .col(string_len(Runs::Status, 16))
                    .col(string_len_null(Runs::FinishReason, 32))
                    .col(big_integer(Runs::TokensIn))
                    .col(big_integer(Runs::TokensOut))
                    .col(big_integer(Runs::ReasoningTokens))
                    .col(big_integer(Runs::CachedTokens))
                    .col(big_integer(Runs::WebSearchCalls))
                    .col(big_integer(Runs::CostCredits))
                    .col(big_integer(Runs::RawCostCredits))
                    .col(boolean(Runs::PricingUncertain))
                    .col(big_integer(Runs::DurationMs))
                    .col(string_len_null(Runs::CustomerId, 64))
                    .col(string_len_null(Runs::CustomerExternalId, 256))
                    .col(text(Runs::Tags))
                    .col(text_null(Runs::RequestText))
                    .col(text_null(Runs::ResponseText))
                    .col(string_len_null(Runs::ErrorCode, 64))
                    .col(text_null(Runs::ErrorMessage))
                    .col(boolean(Runs::DetailDropped))
                    .col(boolean(Runs::FallbackUsed))
                    .col(text(Runs::Attempts))
                    .col(boolean(Runs::IsDebug))
                    .col(big_integer_null(Runs::CancelRequestedAt))
                    .col(big_integer_null(Runs::CancelledAt))
                    .col(string_len_null(Runs::CancelRequestedBy, 200))
                    .col(big_integer(Runs::CreatedAt))
                    .col(big_integer_null(Runs::CompletedAt))
                    .foreign_key(&mut tenant_fk(Runs::Table))
                    .take(),
            )
            .await?;
        for (name, cols) in [
            (
                "ix_runs_tenant_created",
                vec![Runs::TenantId, Runs::CreatedAt, Runs::Id],
            ),
            ("ix_runs_tenant_root", vec![Runs::TenantId, Runs::RootId]),
            (
                "ix_runs_tenant_parent",
                vec![Runs::TenantId, Runs::ParentId],
            ),
            (
                "ix_runs_tenant_customer",
                vec![Runs::TenantId, Runs::CustomerExternalId, Runs::CreatedAt],
            ),
        ] {
            let mut index = Index::create();
            index.name(name).table(Runs::Table);
            for col in cols {
                index.col(col);
            }
            manager.create_index(index.take()).await?;
        }

        manager
            .create_table(
                Table::create()
                    .table(RunTags::Table)
                    .col(string_len(RunTags::RunId, 64))
                    .col(string_len(RunTags::TenantId, 64))
                    .col(string_len(RunTags::Tag, 200))
                    .col(big_integer(RunTags::CreatedAt))
                    .primary_key(Index::create().col(RunTags::RunId).col(RunTags::Tag))
                    .foreign_key(&mut tenant_fk(RunTags::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_run_tags_tenant_tag")
                    .table(RunTags::Table)
                    .col(RunTags::TenantId)
                    .col(RunTags::Tag)
                    .col(RunTags::CreatedAt)
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(RunEvents::Table)
                    .col(string_len(RunEvents::Id, 64).primary_key())
                    .col(string_len(RunEvents::RunId, 64))
                    .col(string_len(RunEvents::TenantId, 64))
                    .col(integer(RunEvents::Seq))
                    .col(string_len(RunEvents::EventType, 64))
                    .col(text(RunEvents::Payload))
                    .col(big_integer(RunEvents::CreatedAt))
                    .foreign_key(&mut tenant_fk(RunEvents::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_run_events_run")
                    .table(RunEvents::Table)
                    .col(RunEvents::TenantId)
                    .col(RunEvents::RunId)
                    .col(RunEvents::Seq)
                    .take(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            RunEvents::Table.into_iden(),
            RunTags::Table.into_iden(),
            Runs::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).take())
                .await?;
        }
        Ok(())
    }
}
