//! An answered one-call request keeps its lifecycle in `runs.event_page` instead of a page of
//! its four events (`crate::packed_pages::wrap_lifecycle`, `baton_domain::lifecycle`; docs/
//! performance.md "Lifecycles rebuilt when read"). No schema change going up; going down,
//! each lifecycle becomes the packed page of the events it stands for (rebuilt with the run's
//! logged response, as the store reads it), which is what the code before it reads.

use baton_domain::lifecycle::{CallLifecycle, LoggedAnswer};
use baton_domain::run::RawJson;
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::FromQueryResult;

use crate::packed_pages::{self, PagedEventRef};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Runs {
    Table,
    Id,
    TenantId,
    EventPage,
    ResponseText,
}

/// Runs read per batch on the way down.
const BATCH: u64 = 500;

#[derive(FromQueryResult)]
struct RowPage {
    id: String,
    tenant_id: String,
    event_page: Vec<u8>,
    response_text: Option<String>,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let backend = manager.get_database_backend();
        let mut after = String::new();
        loop {
            let mut select = Query::select();
            select
                .columns([
                    Runs::Id,
                    Runs::TenantId,
                    Runs::EventPage,
                    Runs::ResponseText,
                ])
                .from(Runs::Table)
                .and_where(Expr::col(Runs::EventPage).is_not_null())
                .and_where(Expr::col(Runs::Id).gt(after.clone()))
                .order_by(Runs::Id, Order::Asc)
                .limit(BATCH);
            let rows = RowPage::find_by_statement(backend.build(&select))
                .all(db)
                .await?;
            let Some(last) = rows.last() else {
                return Ok(());
            };
            after.clone_from(&last.id);
            for row in rows {
                let Some(page) = page_of_lifecycle(&row) else {
                    continue;
                };
                let mut update = Query::update();
                update
                    .table(Runs::Table)
                    .value(Runs::EventPage, page)
                    .and_where(Expr::col(Runs::TenantId).eq(row.tenant_id))
                    .and_where(Expr::col(Runs::Id).eq(row.id));
                db.execute(&update).await?;
            }
        }
    }
}

/// The packed page of the events `row`'s lifecycle stands for; `None` when the row holds a page
/// already. A lifecycle that does not read becomes an empty page (what the store read it as).
fn page_of_lifecycle(row: &RowPage) -> Option<Vec<u8>> {
    let json = packed_pages::lifecycle(&row.event_page)?;
    let answer = row
        .response_text
        .clone()
        .and_then(|text| RawJson::from_text(text).ok())
        .and_then(|response| LoggedAnswer::read(&response).ok());
    let events = serde_json::from_slice::<CallLifecycle>(json)
        .map(|lifecycle| lifecycle.events(&row.id, answer.as_ref()))
        .unwrap_or_default();
    let page: Vec<PagedEventRef<'_>> = events
        .iter()
        .map(|event| PagedEventRef {
            id: &event.id,
            seq: event.seq,
            event_type: &event.event_type,
            at: event.created_at.0.timestamp_millis(),
            payload: &event.payload,
        })
        .collect();
    let page = serde_json::to_vec(&page).unwrap_or_else(|_| b"[]".to_vec());
    Some(packed_pages::pack(&page))
}
