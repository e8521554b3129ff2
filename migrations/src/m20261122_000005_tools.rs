//! The tool library, registered MCP servers, and what a run records of its tool calls.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tools {
    Table,
    Id,
    TenantId,
    Name,
    ToolType,
    Description,
    Parameters,
    Config,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum McpServers {
    Table,
    Id,
    TenantId,
    Name,
    Url,
    Headers,
    DiscoveredToolCount,
    LastConnectedAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Runs {
    Table,
    ToolCalls,
    Warnings,
    CallbackOrigin,
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

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Tools::Table)
                    .col(string_len(Tools::Id, 64).primary_key())
                    .col(string_len(Tools::TenantId, 64))
                    .col(string_len(Tools::Name, 64))
                    .col(string_len(Tools::ToolType, 32))
                    .col(text_null(Tools::Description))
                    // JSON: service-format parameters, and the type-specific fields.
                    .col(text(Tools::Parameters))
                    .col(text(Tools::Config))
                    .col(big_integer(Tools::CreatedAt))
                    .col(big_integer(Tools::UpdatedAt))
                    .foreign_key(&mut tenant_fk(Tools::Table, Tools::TenantId))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_tools_tenant_name")
                    .table(Tools::Table)
                    .col(Tools::TenantId)
                    .col(Tools::Name)
                    .unique()
                    .take(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(McpServers::Table)
                    .col(string_len(McpServers::Id, 64).primary_key())
                    .col(string_len(McpServers::TenantId, 64))
                    .col(string_len(McpServers::Name, 200))
                    .col(text(McpServers::Url))
                    // JSON object of header name to value.
                    .col(text(McpServers::Headers))
                    .col(integer_null(McpServers::DiscoveredToolCount))
                    .col(big_integer_null(McpServers::LastConnectedAt))
                    .col(big_integer(McpServers::CreatedAt))
                    .col(big_integer(McpServers::UpdatedAt))
                    .foreign_key(&mut tenant_fk(McpServers::Table, McpServers::TenantId))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_mcp_servers_tenant")
                    .table(McpServers::Table)
                    .col(McpServers::TenantId)
                    .take(),
            )
            .await?;
        // One column per statement: SQLite alters one column at a time.
        for column in [
            text(Runs::ToolCalls).default("[]").take(),
            text(Runs::Warnings).default("[]").take(),
            text_null(Runs::CallbackOrigin).take(),
        ] {
            manager
                .alter_table(Table::alter().table(Runs::Table).add_column(column).take())
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Runs::CallbackOrigin, Runs::Warnings, Runs::ToolCalls] {
            manager
                .alter_table(Table::alter().table(Runs::Table).drop_column(column).take())
                .await?;
        }
        manager
            .drop_table(Table::drop().table(McpServers::Table).take())
            .await?;
        manager
            .drop_table(Table::drop().table(Tools::Table).take())
            .await
    }
}
