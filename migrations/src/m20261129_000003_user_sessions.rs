//! Session tokens carry the user's `session_version`; changing the password bumps it, so tokens
//! issued before the change are refused (and a deleted user's, whose row is gone).
//! `password_changed_at` is shown on the user record.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Users {
    Table,
    SessionVersion,
    PasswordChangedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite's ALTER TABLE adds one at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    // 0 matches tokens issued before this migration (their version claim is
                    // absent and read as 0), so nobody is logged out by the upgrade.
                    .add_column(
                        ColumnDef::new(Users::SessionVersion)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    // Epoch milliseconds; NULL: never changed.
                    .add_column(
                        ColumnDef::new(Users::PasswordChangedAt)
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    .drop_column(Users::PasswordChangedAt)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Users::Table)
                    .drop_column(Users::SessionVersion)
                    .to_owned(),
            )
            .await
    }
}
