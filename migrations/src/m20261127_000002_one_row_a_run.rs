//! One row a logged request (docs/performance.md "One row a run", round 20):
//!
//! - `runs.event_page`: the packed page of a run's events that is written together with its
//!   finished row (a one-call request's only page: its first event onwards) rides in the run's
//!   own row instead of a `run_event_pages` row, one heap tuple and one B-tree entry fewer per
//!   logged request. Pages written any other way (a batch that split a run from its events, a
//!   later page) stay in `run_event_pages`; readers take both.
//! - `ix_runs_tenant_root` covers child runs only: a root run is its own root, found by its
//!   key, so a plain request no longer inserts into it. Queries by root read the children
//!   through it and the root by id.
//!
//! Going down, every page in `runs` is copied to `run_event_pages` (as the page that starts at
//! the run's first event) before the column goes, and the index covers every run again.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Runs {
    Table,
    Id,
    TenantId,
    RootId,
    ParentId,
    CreatedAt,
    EventPage,
}

#[derive(DeriveIden, Clone, Copy)]
enum RunEventPages {
    Table,
    TenantId,
    RunId,
    FirstSeq,
    Events,
    CreatedAt,
    Packed,
}

const ROOT_INDEX: &str = "ix_runs_tenant_root";

async fn rebuild_root_index(manager: &SchemaManager<'_>, children_only: bool) -> Result<(), DbErr> {
    manager
        .drop_index(Index::drop().name(ROOT_INDEX).table(Runs::Table).to_owned())
        .await?;
    let mut index = Index::create();
    index
        .name(ROOT_INDEX)
        .table(Runs::Table)
        .col(Runs::TenantId)
        .col(Runs::RootId);
    if children_only {
        index.and_where(Expr::col(Runs::ParentId).is_not_null());
    }
    manager.create_index(index.take()).await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// On SQLite too: all or nothing, and on one connection, so the index created again under
    /// its name is not refused by a pooled connection that still has the dropped one in the
    /// schema it last read.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .add_column(ColumnDef::new(Runs::EventPage).blob().null())
                    .to_owned(),
            )
            .await?;
        rebuild_root_index(manager, true).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // A run's page in its row holds the run's events from the first one (seq 0).
        let mut pages = Query::select();
        pages
            .column(Runs::TenantId)
            .column(Runs::Id)
            .expr(Expr::val(0))
            .expr(Expr::val(""))
            .column(Runs::CreatedAt)
            .column(Runs::EventPage)
            .from(Runs::Table)
            .and_where(Expr::col(Runs::EventPage).is_not_null());
        let mut copy = Query::insert();
        copy.into_table(RunEventPages::Table)
            .columns([
                RunEventPages::TenantId,
                RunEventPages::RunId,
                RunEventPages::FirstSeq,
                RunEventPages::Events,
                RunEventPages::CreatedAt,
                RunEventPages::Packed,
            ])
            .select_from(pages)
            .map_err(|error| DbErr::Migration(error.to_string()))?
            .on_conflict(
                OnConflict::columns([
                    RunEventPages::TenantId,
                    RunEventPages::RunId,
                    RunEventPages::FirstSeq,
                ])
                .do_nothing()
                .to_owned(),
            );
        manager.get_connection().execute(&copy).await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Runs::Table)
                    .drop_column(Runs::EventPage)
                    .to_owned(),
            )
            .await?;
        rebuild_root_index(manager, false).await
    }
}
