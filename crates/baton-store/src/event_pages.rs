//! A run's stored events (`/llm-logs/{id}/events`), kept in pages: one row per write of a run's
//! events, holding them as a JSON array. A one-call request writes one row where a row per
//! event wrote four, each into three B-trees (docs/performance.md "Fewer B-trees per request").
//!
//! Page format, shared with the migration that introduced it: an array of
//! `{"id", "seq", "type", "at" (epoch ms), "payload" (the event envelope)}` in `seq` order, the
//! row's `first_seq` being the first event's `seq`. Pages are written packed (the `packed`
//! column, `baton_migrations::packed_pages`; `events` left empty); pages from before that are
//! JSON text in `events` and read as they are.
//!
//! The page written together with its run's finished row, from the run's first event (a
//! one-call request's only page), rides in that row instead (`runs.event_page`; docs/
//! performance.md "One row a run"): one heap tuple and one B-tree entry fewer per request.
//! An answered one-call request keeps no page at all: its row holds its lifecycle
//! (`baton_domain::lifecycle::CallLifecycle`), from which its four events are rebuilt when read
//! (docs/performance.md "Lifecycles rebuilt when read").

use std::sync::LazyLock;

use baton_domain::TenantId;
use baton_domain::lifecycle::{CallLifecycle, LoggedAnswer};
use baton_domain::retention::strip_event_text;
use baton_domain::run::{RawJson, StoredEvent};
use baton_migrations::packed_pages::{self, PagedEventRef};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, Iterable, QueryFilter, QueryOrder, QuerySelect,
    Value,
};
use serde::{Deserialize, Serialize};

use crate::bulk::{BulkInsert, OnConflict};
use crate::entity::{run_event_pages, runs};
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

/// A retried write finds its pages stored (same run, same first event) and keeps them.
pub(crate) static PAGE_INSERT: LazyLock<BulkInsert> =
    LazyLock::new(|| BulkInsert::of::<run_event_pages::Entity>(OnConflict::Ignore));

/// One event of a page, as read.
#[derive(Serialize, Deserialize)]
struct PagedEvent {
    id: String,
    seq: u32,
    #[serde(rename = "type")]
    event_type: String,
    at: i64,
    payload: RawJson,
}

/// What a page adds around an event's envelope: its id, `seq`, type and time, with the keys.
const PAGED_EVENT_OVERHEAD: usize = 128;

/// One run's consecutive events in a batch, packed: a page to store.
pub(crate) struct PackedPage<'a> {
    pub(crate) tenant: &'a TenantId,
    pub(crate) run_id: &'a str,
    pub(crate) first_seq: u32,
    created_at: i64,
    pub(crate) packed: Vec<u8>,
}

/// The pages of a batch's `events`: consecutive events of one run share a page.
pub(crate) fn pack_pages(events: &[(TenantId, StoredEvent)]) -> Vec<PackedPage<'_>> {
    let same_run = |(a_tenant, a): &(TenantId, StoredEvent),
                    (b_tenant, b): &(TenantId, StoredEvent)| {
        a_tenant == b_tenant && a.run_id == b.run_id
    };
    let mut pages = Vec::new();
    for page in events.chunk_by(same_run) {
        let Some((tenant, first)) = page.first() else {
            continue;
        };
        let listed: Vec<PagedEventRef<'_>> = page
            .iter()
            .map(|(_, event)| PagedEventRef {
                id: &event.id,
                seq: event.seq,
                event_type: &event.event_type,
                at: to_millis(event.created_at),
                payload: &event.payload,
            })
            .collect();
        // Sized for the page at once (a one-call request's is ~2 KB): growing from serde_json's
        // default 128 bytes reallocated it four times.
        let mut json = Vec::with_capacity(
            page.iter()
                .map(|(_, event)| event.payload.as_str().len() + PAGED_EVENT_OVERHEAD)
                .sum(),
        );
        // Borrowed strings, numbers and already-checked JSON: serialising cannot fail.
        if serde_json::to_writer(&mut json, &listed).is_err() {
            json = b"[]".to_vec();
        }
        pages.push(PackedPage {
            tenant,
            run_id: &first.run_id,
            first_seq: first.seq,
            created_at: to_millis(first.created_at),
            packed: packed_pages::pack(&json),
        });
    }
    pages
}

/// The `run_event_pages` rows of `pages` (values in [`PAGE_INSERT`]'s column order).
pub(crate) fn page_rows(pages: Vec<PackedPage<'_>>) -> Vec<Value> {
    let mut rows = Vec::with_capacity(pages.len() * PAGE_INSERT.width());
    for page in pages {
        let mut packed = Some(page.packed);
        for column in run_event_pages::Column::iter() {
            rows.push(match column {
                run_event_pages::Column::TenantId => page.tenant.as_str().to_string().into(),
                run_event_pages::Column::RunId => page.run_id.to_string().into(),
                run_event_pages::Column::FirstSeq => {
                    i32::try_from(page.first_seq).unwrap_or(i32::MAX).into()
                }
                run_event_pages::Column::Events => String::new().into(),
                run_event_pages::Column::CreatedAt => page.created_at.into(),
                // Each column comes once: the bytes move into their value.
                run_event_pages::Column::Packed => packed.take().unwrap_or_default().into(),
            });
        }
    }
    rows
}

/// A stored page's events: `packed` when the page has it, else the JSON text of a page from
/// before packing.
fn read_page(
    packed: Option<&[u8]>,
    events: &str,
    run_id: &str,
    first_seq: i32,
) -> StoreResult<Vec<PagedEvent>> {
    let corrupt = |error: String| {
        StoreError::Corrupt(
            "run event page",
            format!("run {run_id} from event {first_seq}: {error}"),
        )
    };
    match packed {
        Some(packed) => {
            let json = packed_pages::unpack(packed).map_err(corrupt)?;
            serde_json::from_slice(&json).map_err(|error| corrupt(error.to_string()))
        }
        None => serde_json::from_str(events).map_err(|error| corrupt(error.to_string())),
    }
}

/// What the rows of the tenant's runs `run_ids` carry of their events, by run id
/// (`runs.event_page`: the page written with a run's finished row, from its first event, or an
/// answered one-call request's lifecycle; most runs have one), with each run's logged response.
async fn in_run_rows<C: ConnectionTrait>(
    conn: &C,
    tenant: &TenantId,
    run_ids: &[String],
) -> StoreResult<Vec<(String, Vec<u8>, Option<String>)>> {
    Ok(runs::Entity::find()
        .select_only()
        .column(runs::Column::Id)
        .column(runs::Column::EventPage)
        .column(runs::Column::ResponseText)
        .filter(runs::Column::TenantId.eq(tenant.as_str()))
        .filter(runs::Column::Id.is_in(run_ids.iter().map(String::as_str)))
        .filter(runs::Column::EventPage.is_not_null())
        .into_tuple::<(String, Option<Vec<u8>>, Option<String>)>()
        .all(conn)
        .await?
        .into_iter()
        .filter_map(|(id, page, response)| Some((id, page?, response)))
        .collect())
}

/// `runs.event_page` for an answered one-call request: its lifecycle, not its four events.
pub(crate) fn lifecycle_page(lifecycle: &CallLifecycle) -> Vec<u8> {
    // Strings, numbers and flags: serialising cannot fail.
    packed_pages::wrap_lifecycle(serde_json::to_vec(lifecycle).unwrap_or_default())
}

/// The four events of run `run_id` rebuilt from its lifecycle and its logged response (none:
/// its text was dropped, and `requestCompleted.result` is null as retention leaves it).
fn lifecycle_events(
    json: &[u8],
    response: Option<String>,
    run_id: &str,
) -> StoreResult<Vec<StoredEvent>> {
    let corrupt = |error: serde_json::Error| {
        StoreError::Corrupt("run lifecycle", format!("run {run_id}: {error}"))
    };
    let lifecycle: CallLifecycle = serde_json::from_slice(json).map_err(corrupt)?;
    let answer = match response {
        Some(text) => {
            let response = RawJson::from_text(text).map_err(corrupt)?;
            Some(LoggedAnswer::read(&response).map_err(corrupt)?)
        }
        None => None,
    };
    Ok(lifecycle.events(run_id, answer.as_ref()))
}

/// The events of a page as stored events of run `run_id`.
fn page_events(listed: Vec<PagedEvent>, run_id: &str) -> Vec<StoredEvent> {
    listed
        .into_iter()
        .map(|event| StoredEvent {
            id: event.id,
            run_id: run_id.to_string(),
            seq: event.seq,
            event_type: event.event_type,
            payload: event.payload,
            created_at: from_millis(event.at),
        })
        .collect()
}

impl Store {
    /// The stored events of a run, in the order they were emitted.
    pub async fn run_events(
        &self,
        tenant: &TenantId,
        run_id: &str,
    ) -> StoreResult<Vec<StoredEvent>> {
        let in_row = in_run_rows(self.conn(), tenant, &[run_id.to_string()]).await?;
        let pages = run_event_pages::Entity::find()
            .filter(run_event_pages::Column::TenantId.eq(tenant.as_str()))
            .filter(run_event_pages::Column::RunId.eq(run_id))
            .order_by_asc(run_event_pages::Column::FirstSeq)
            .all(self.conn())
            .await?;
        let read = in_row
            .into_iter()
            .map(
                |(_, bytes, response)| match packed_pages::lifecycle(&bytes) {
                    Some(json) => lifecycle_events(json, response, run_id),
                    None => read_page(Some(&bytes), "", run_id, 0)
                        .map(|listed| page_events(listed, run_id)),
                },
            )
            .chain(pages.iter().map(|page| {
                read_page(page.packed.as_deref(), &page.events, run_id, page.first_seq)
                    .map(|listed| page_events(listed, run_id))
            }));
        let mut events = Vec::new();
        for listed in read {
            // One unreadable page (Baton writes only valid JSON: corruption) must not hide
            // the run's other events: it is left out and reported.
            match listed {
                Ok(listed) => events.extend(listed),
                Err(error) => tracing::warn!(%error, "leaving out an unreadable run event page"),
            }
        }
        // Pages of one run never overlap; a stable sort keeps any that did in write order.
        events.sort_by_key(|event| event.seq);
        Ok(events)
    }
}

/// A page with its text stripped, packed, or `None` when it had no text to strip. An
/// unreadable page is emptied: its text cannot be told from the rest, and it cannot be read
/// anyway, so retention still removes the text and the pass goes on (failing, it would stop
/// at this page every pass).
fn stripped_page(read: StoreResult<Vec<PagedEvent>>, run_id: &str) -> StoreResult<Option<Vec<u8>>> {
    let mut stripped = false;
    let events = match read {
        Ok(mut events) => {
            for event in &mut events {
                let mut envelope = event.payload.to_value();
                if strip_event_text(&mut envelope) {
                    event.payload = RawJson::of(&envelope);
                    stripped = true;
                }
            }
            events
        }
        Err(error) => {
            tracing::warn!(%error, "emptying an unreadable run event page past its retention");
            stripped = true;
            Vec::new()
        }
    };
    if !stripped {
        return Ok(None);
    }
    let json = serde_json::to_vec(&events)
        .map_err(|error| StoreError::Corrupt("run event page", format!("run {run_id}: {error}")))?;
    Ok(Some(packed_pages::pack(&json)))
}

/// Strips the text (prompts, answers, tool arguments and results) from the stored events of
/// the tenant's runs `run_ids`, in `conn`'s transaction.
pub(crate) async fn strip_text<C: ConnectionTrait>(
    conn: &C,
    tenant: &TenantId,
    run_ids: &[String],
) -> StoreResult<()> {
    for (run_id, packed, _) in in_run_rows(conn, tenant, run_ids).await? {
        // A lifecycle holds no text: its answer is the run's response, dropped with the rest.
        if packed_pages::lifecycle(&packed).is_some() {
            continue;
        }
        let Some(packed) = stripped_page(read_page(Some(&packed), "", &run_id, 0), &run_id)? else {
            continue;
        };
        runs::Entity::update_many()
            .col_expr(runs::Column::EventPage, Expr::value(packed))
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .filter(runs::Column::Id.eq(run_id.as_str()))
            .exec(conn)
            .await?;
    }
    let pages = run_event_pages::Entity::find()
        .filter(run_event_pages::Column::TenantId.eq(tenant.as_str()))
        .filter(run_event_pages::Column::RunId.is_in(run_ids.iter().map(String::as_str)))
        .all(conn)
        .await?;
    for page in pages {
        let read = read_page(
            page.packed.as_deref(),
            &page.events,
            &page.run_id,
            page.first_seq,
        );
        let Some(packed) = stripped_page(read, &page.run_id)? else {
            continue;
        };
        run_event_pages::Entity::update_many()
            .col_expr(run_event_pages::Column::Events, Expr::value(String::new()))
            .col_expr(run_event_pages::Column::Packed, Expr::value(packed))
            .filter(run_event_pages::Column::TenantId.eq(page.tenant_id.as_str()))
            .filter(run_event_pages::Column::RunId.eq(page.run_id.as_str()))
            .filter(run_event_pages::Column::FirstSeq.eq(page.first_seq))
            .exec(conn)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_domain::Timestamp;

    fn event(run: &str, seq: u32) -> StoredEvent {
        StoredEvent {
            id: format!("{run}-{seq}"),
            run_id: run.to_string(),
            seq,
            event_type: "requestStarted".to_string(),
            payload: RawJson::of(&serde_json::json!({ "seq": seq })),
            created_at: Timestamp::now(),
        }
    }

    fn unpacked(value: &Value) -> Vec<serde_json::Value> {
        match value {
            Value::Bytes(Some(packed)) => {
                serde_json::from_slice(&packed_pages::unpack(packed).unwrap()).unwrap()
            }
            other => panic!("not bytes: {other:?}"),
        }
    }

    #[test]
    fn consecutive_events_of_one_run_share_a_page() {
        let a = TenantId::new("a".to_string());
        let b = TenantId::new("b".to_string());
        let events = vec![
            (a.clone(), event("r1", 0)),
            (a.clone(), event("r1", 3)),
            (a.clone(), event("r2", 0)),
            (b.clone(), event("r2", 1)),
        ];
        let rows = page_rows(pack_pages(&events));
        let width = PAGE_INSERT.width();
        assert_eq!(rows.len(), 3 * width, "r1 of a, r2 of a, r2 of b");
        assert_eq!(
            rows[3],
            Value::from(String::new()),
            "the JSON is only packed"
        );
        let first = unpacked(&rows[5]);
        assert_eq!(first.len(), 2);
        assert_eq!(first[1]["seq"], 3);
        assert_eq!(first[1]["id"], "r1-3");
        assert_eq!(first[1]["type"], "requestStarted");
        assert_eq!(first[1]["payload"], serde_json::json!({ "seq": 3 }));
        assert_eq!(rows[width + 1], Value::from("r2".to_string()));
        assert_eq!(rows[2 * width], Value::from("b".to_string()));
        assert_eq!(rows[2 * width + 2], Value::from(1));
    }
}
