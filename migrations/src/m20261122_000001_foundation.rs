//! Tenants, users, API keys, environments, customers and server secrets.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
    Name,
    Settings,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    TenantId,
    Email,
    PasswordHash,
    CreatedAt,
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    Id,
    TenantId,
    Name,
    KeyHash,
    Prefix,
    CreatedBy,
    CreatedAt,
    LastUsedAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum Environments {
    Table,
    Id,
    TenantId,
    Name,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Customers {
    Table,
    Id,
    TenantId,
    ExternalId,
    Name,
    Email,
    Metadata,
    IsActive,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum ServerSecrets {
    Table,
    Name,
    Value,
    CreatedAt,
}

fn id_pk<T: IntoIden>(col: T) -> ColumnDef {
    string_len(col, 64).primary_key().take()
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
                    .table(Tenants::Table)
                    .col(id_pk(Tenants::Id))
                    .col(string_len_uniq(Tenants::Name, 128))
                    .col(text(Tenants::Settings))
                    .col(big_integer(Tenants::CreatedAt))
                    .col(big_integer(Tenants::UpdatedAt))
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Users::Table)
                    .col(id_pk(Users::Id))
                    .col(string_len(Users::TenantId, 64))
                    // Login names a user by email alone, so emails are unique platform-wide.
                    .col(string_len_uniq(Users::Email, 320))
                    .col(text(Users::PasswordHash))
                    .col(big_integer(Users::CreatedAt))
                    .foreign_key(&mut tenant_fk(Users::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_users_tenant")
                    .table(Users::Table)
                    .col(Users::TenantId)
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ApiKeys::Table)
                    .col(id_pk(ApiKeys::Id))
                    .col(string_len(ApiKeys::TenantId, 64))
                    .col(string_len(ApiKeys::Name, 200))
                    .col(string_len_uniq(ApiKeys::KeyHash, 64))
                    .col(string_len(ApiKeys::Prefix, 32))
                    .col(string_len_null(ApiKeys::CreatedBy, 64))
                    .col(big_integer(ApiKeys::CreatedAt))
                    .col(big_integer_null(ApiKeys::LastUsedAt))
                    .col(big_integer_null(ApiKeys::RevokedAt))
                    .foreign_key(&mut tenant_fk(ApiKeys::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_api_keys_tenant")
                    .table(ApiKeys::Table)
                    .col(ApiKeys::TenantId)
                    .col(ApiKeys::Id)
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Environments::Table)
                    .col(id_pk(Environments::Id))
                    .col(string_len(Environments::TenantId, 64))
                    .col(string_len(Environments::Name, 256))
                    .col(big_integer(Environments::CreatedAt))
                    .foreign_key(&mut tenant_fk(Environments::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_environments_tenant_name")
                    .table(Environments::Table)
                    .col(Environments::TenantId)
                    .col(Environments::Name)
                    .unique()
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Customers::Table)
                    .col(id_pk(Customers::Id))
                    .col(string_len(Customers::TenantId, 64))
                    .col(string_len(Customers::ExternalId, 256))
                    .col(string_len_null(Customers::Name, 320))
                    .col(string_len_null(Customers::Email, 320))
                    .col(text(Customers::Metadata))
                    .col(boolean(Customers::IsActive))
                    .col(big_integer(Customers::CreatedAt))
                    .col(big_integer(Customers::UpdatedAt))
                    .foreign_key(&mut tenant_fk(Customers::Table))
                    .take(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_customers_tenant_external")
                    .table(Customers::Table)
                    .col(Customers::TenantId)
                    .col(Customers::ExternalId)
                    .unique()
                    .take(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ServerSecrets::Table)
                    .col(string_len(ServerSecrets::Name, 64).primary_key())
                    .col(text(ServerSecrets::Value))
                    .col(big_integer(ServerSecrets::CreatedAt))
                    .take(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            ServerSecrets::Table.into_iden(),
            Customers::Table.into_iden(),
            Environments::Table.into_iden(),
            ApiKeys::Table.into_iden(),
            Users::Table.into_iden(),
            Tenants::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).take())
                .await?;
        }
        Ok(())
    }
}
