//! `runs.inference_count`: the model calls a run made (a tool loop makes several), so reports
//! count model calls rather than runs. Rows written before it hold 0: reports count those as
//! one call when a model served them, as they did before.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Runs {
    Table,
    InferenceCount,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .add_column(
                        ColumnDef::new(Runs::InferenceCount)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .drop_column(Runs::InferenceCount)
                    .to_owned(),
            )
            .await
    }
}
