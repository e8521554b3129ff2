//! Less database work per logged request (docs/performance.md "Fewer B-trees per request").
//!
//! - A run's stored events become pages: one `run_event_pages` row per write of the run's events
//!   (a one-call request: one row), holding the events as a JSON array, instead of one
//!   `run_events` row (three B-trees) per event. Existing events are copied over, one page each.
//! - The runs indexes on columns most rows leave empty, or on a status few rows keep, become
//!   partial: a plain request no longer touches the parent, customer and flow indexes, and a
//!   finished run leaves the pending-run index.
//!
//! Page format (read by `baton-store`'s `event_pages`): a JSON array of
//! `{"id", "seq", "type", "at" (epoch ms), "payload" (the event envelope)}`, in `seq` order;
//! `first_seq` is the first event's `seq`.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::FromQueryResult;
use serde_json::value::RawValue;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum RunEventPages {
    Table,
    TenantId,
    RunId,
    FirstSeq,
    Events,
    CreatedAt,
}

#[derive(DeriveIden, Clone, Copy)]
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

#[derive(DeriveIden, Clone, Copy)]
enum Runs {
    Table,
    TenantId,
    ParentId,
    CustomerExternalId,
    FlowName,
    Status,
    CreatedAt,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

/// `run_events`' columns, in the order the copies read and write them.
const EVENT_COLUMNS: [RunEvents; 7] = [
    RunEvents::Id,
    RunEvents::RunId,
    RunEvents::TenantId,
    RunEvents::Seq,
    RunEvents::EventType,
    RunEvents::Payload,
    RunEvents::CreatedAt,
];

/// Rows copied per statement while converting.
const COPY_BATCH: u64 = 500;

/// A runs index and the columns it covers.
struct RunsIndex {
    name: &'static str,
    columns: &'static [Runs],
    /// The partial index's condition.
    partial: fn() -> SimpleExpr,
}

const PARENT: RunsIndex = RunsIndex {
    name: "ix_runs_tenant_parent",
    columns: &[Runs::TenantId, Runs::ParentId],
    partial: || Expr::col(Runs::ParentId).is_not_null(),
};
const CUSTOMER: RunsIndex = RunsIndex {
    name: "ix_runs_tenant_customer",
    columns: &[Runs::TenantId, Runs::CustomerExternalId, Runs::CreatedAt],
    partial: || Expr::col(Runs::CustomerExternalId).is_not_null(),
};
const FLOW: RunsIndex = RunsIndex {
    name: "ix_runs_tenant_flow_created",
    columns: &[Runs::TenantId, Runs::FlowName, Runs::CreatedAt],
    partial: || Expr::col(Runs::FlowName).is_not_null(),
};
const PENDING: RunsIndex = RunsIndex {
    name: "ix_runs_status_created",
    columns: &[Runs::Status, Runs::CreatedAt],
    // The abandoned-run sweep's query names the status as this literal, so both databases'
    // planners can prove it implies the condition.
    partial: || Expr::col(Runs::Status).eq("Pending"),
};

impl RunsIndex {
    async fn rebuild(&self, manager: &SchemaManager<'_>, partial: bool) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(self.name).table(Runs::Table).to_owned())
            .await?;
        let mut index = Index::create();
        index.name(self.name).table(Runs::Table);
        for column in self.columns {
            index.col(*column);
        }
        if partial {
            index.and_where((self.partial)());
        }
        manager.create_index(index.take()).await
    }
}

#[derive(FromQueryResult)]
struct EventRow {
    id: String,
    run_id: String,
    tenant_id: String,
    seq: i32,
    event_type: String,
    payload: String,
    created_at: i64,
}

#[derive(FromQueryResult)]
struct PageRow {
    tenant_id: String,
    run_id: String,
    first_seq: i32,
    events: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct PagedEvent {
    id: String,
    seq: i32,
    #[serde(rename = "type")]
    event_type: String,
    at: i64,
    payload: Box<RawValue>,
}

/// A tenant-owned table's rows go with their tenant.
fn tenant_fk<T: IntoIden + Copy + 'static>(table: T, column: T) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .from(table, column)
        .to(Tenants::Table, Tenants::Id)
        .on_delete(ForeignKeyAction::Cascade)
        .take()
}

fn bad_json(error: serde_json::Error) -> DbErr {
    DbErr::Custom(format!("stored event is not JSON: {error}"))
}

fn bad_row(error: sea_query::error::Error) -> DbErr {
    DbErr::Custom(format!("event row: {error}"))
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    /// On SQLite too (whose DDL is transactional): all or nothing, and on one connection, so
    /// an index dropped and created again under its name, or a table created and then filled,
    /// is seen by the next statement (a pooled connection holding an older read snapshot
    /// would not see it).
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(RunEventPages::Table)
                    .col(
                        ColumnDef::new(RunEventPages::TenantId)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RunEventPages::RunId)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(ColumnDef::new(RunEventPages::FirstSeq).integer().not_null())
                    .col(ColumnDef::new(RunEventPages::Events).text().not_null())
                    .col(
                        ColumnDef::new(RunEventPages::CreatedAt)
                            .big_integer()
                            .not_null(),
                    )
                    .primary_key(
                        Index::create()
                            .col(RunEventPages::TenantId)
                            .col(RunEventPages::RunId)
                            .col(RunEventPages::FirstSeq),
                    )
                    .foreign_key(&mut tenant_fk(
                        RunEventPages::Table,
                        RunEventPages::TenantId,
                    ))
                    .take(),
            )
            .await?;
        copy_events_to_pages(manager).await?;
        manager
            .drop_table(Table::drop().table(RunEvents::Table).take())
            .await?;
        for index in [PARENT, CUSTOMER, FLOW, PENDING] {
            index.rebuild(manager, true).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for index in [PARENT, CUSTOMER, FLOW, PENDING] {
            index.rebuild(manager, false).await?;
        }
        manager
            .create_table(
                Table::create()
                    .table(RunEvents::Table)
                    .col(
                        ColumnDef::new(RunEvents::Id)
                            .string_len(64)
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(RunEvents::RunId).string_len(64).not_null())
                    .col(
                        ColumnDef::new(RunEvents::TenantId)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(ColumnDef::new(RunEvents::Seq).integer().not_null())
                    .col(
                        ColumnDef::new(RunEvents::EventType)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(ColumnDef::new(RunEvents::Payload).text().not_null())
                    .col(
                        ColumnDef::new(RunEvents::CreatedAt)
                            .big_integer()
                            .not_null(),
                    )
                    .foreign_key(&mut tenant_fk(RunEvents::Table, RunEvents::TenantId))
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
        copy_pages_to_events(manager).await?;
        manager
            .drop_table(Table::drop().table(RunEventPages::Table).take())
            .await
    }
}

/// One page per stored event (pages of one run are read together, in `first_seq` order), read
/// in keyset batches so a large log never sits in memory at once.
async fn copy_events_to_pages(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    let mut after: Option<String> = None;
    loop {
        let mut select = Query::select();
        select
            .columns(EVENT_COLUMNS)
            .from(RunEvents::Table)
            .order_by(RunEvents::Id, Order::Asc)
            .limit(COPY_BATCH);
        if let Some(last) = &after {
            select.and_where(Expr::col(RunEvents::Id).gt(last.as_str()));
        }
        let rows = EventRow::find_by_statement(backend.build(&select))
            .all(db)
            .await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = Some(last.id.clone());
        let mut insert = Query::insert();
        insert
            .into_table(RunEventPages::Table)
            .columns([
                RunEventPages::TenantId,
                RunEventPages::RunId,
                RunEventPages::FirstSeq,
                RunEventPages::Events,
                RunEventPages::CreatedAt,
            ])
            .on_conflict(OnConflict::new().do_nothing().to_owned());
        for row in rows {
            let page = serde_json::to_string(&[PagedEvent {
                id: row.id,
                seq: row.seq,
                event_type: row.event_type,
                at: row.created_at,
                // Stored by Baton as JSON; a row that is not read as `null` before and still does.
                payload: RawValue::from_string(row.payload)
                    .unwrap_or_else(|_| RawValue::NULL.to_owned()),
            }])
            .map_err(bad_json)?;
            insert
                .values([
                    row.tenant_id.into(),
                    row.run_id.into(),
                    row.seq.into(),
                    page.into(),
                    row.created_at.into(),
                ])
                .map_err(bad_row)?;
        }
        db.execute(&insert).await?;
    }
}

/// Each page's events back into one row each (`down`).
async fn copy_pages_to_events(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    let mut after: Option<(String, String, i32)> = None;
    loop {
        let mut select = Query::select();
        select
            .columns([
                RunEventPages::TenantId,
                RunEventPages::RunId,
                RunEventPages::FirstSeq,
                RunEventPages::Events,
            ])
            .from(RunEventPages::Table)
            .order_by(RunEventPages::TenantId, Order::Asc)
            .order_by(RunEventPages::RunId, Order::Asc)
            .order_by(RunEventPages::FirstSeq, Order::Asc)
            .limit(COPY_BATCH);
        if let Some((tenant, run, seq)) = &after {
            select.and_where(
                Expr::tuple([
                    Expr::col(RunEventPages::TenantId),
                    Expr::col(RunEventPages::RunId),
                    Expr::col(RunEventPages::FirstSeq),
                ])
                .gt(Expr::tuple([
                    Expr::val(tenant.as_str()),
                    Expr::val(run.as_str()),
                    Expr::val(*seq),
                ])),
            );
        }
        let pages = PageRow::find_by_statement(backend.build(&select))
            .all(db)
            .await?;
        let Some(last) = pages.last() else {
            return Ok(());
        };
        after = Some((last.tenant_id.clone(), last.run_id.clone(), last.first_seq));
        for page in pages {
            let events: Vec<PagedEvent> = serde_json::from_str(&page.events).map_err(bad_json)?;
            if events.is_empty() {
                continue;
            }
            let mut insert = Query::insert();
            insert
                .into_table(RunEvents::Table)
                .columns(EVENT_COLUMNS)
                .on_conflict(OnConflict::new().do_nothing().to_owned());
            for event in events {
                insert
                    .values([
                        event.id.into(),
                        page.run_id.clone().into(),
                        page.tenant_id.clone().into(),
                        event.seq.into(),
                        event.event_type.into(),
                        event.payload.get().to_string().into(),
                        event.at.into(),
                    ])
                    .map_err(bad_row)?;
            }
            db.execute(&insert).await?;
        }
    }
}
