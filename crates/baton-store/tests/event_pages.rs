//! A run's stored events, kept in pages (one row per write): read back whole and in order, a
//! retried write stored once, another tenant's run invisible, and the events of a database
//! from before pages carried over by the migration (and back by its `down`). SQLite by
//! default; PostgreSQL with `BATON_TEST_DATABASE_URL=postgres://...`.

#![allow(clippy::unwrap_used)]

use baton_domain::run::{RawJson, RunKind, RunRecord, RunStatus, StoredEvent};
use baton_domain::{TenantId, Timestamp};
use baton_migrations::{Migrator, MigratorTrait, packed_pages};
use baton_store::runs::new_record;
use baton_store::{Store, StoreOptions};
use sea_orm::sea_query::{Alias, Expr, Query};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use serde_json::json;

mod support;
use support::{Scratch, database};

const PAGES_MIGRATION: &str = "m20261124_000001_leaner_run_log";

fn event(run: &str, seq: u32, event_type: &str) -> StoredEvent {
    StoredEvent {
        id: format!("{run}-event-{seq}"),
        run_id: run.to_string(),
        seq,
        event_type: event_type.to_string(),
        payload: RawJson::of(&json!({"type": event_type, "data": {"seq": seq}})),
        created_at: Timestamp::now(),
    }
}

fn summary(events: &[StoredEvent]) -> Vec<(String, u32, String, serde_json::Value)> {
    events
        .iter()
        .map(|e| {
            (
                e.id.clone(),
                e.seq,
                e.event_type.clone(),
                e.payload.to_value(),
            )
        })
        .collect()
}

#[tokio::test]
async fn events_written_in_several_batches_read_back_once_and_in_order() {
    let db = database("pages").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let other = store.create_tenant("other").await.unwrap().id;
    let first: Vec<(TenantId, StoredEvent)> = [
        event("run-1", 0, "requestStarted"),
        event("run-1", 2, "toolStarted"),
    ]
    .into_iter()
    .map(|e| (tenant.clone(), e))
    .collect();
    let second: Vec<(TenantId, StoredEvent)> = vec![
        (tenant.clone(), event("run-2", 0, "requestStarted")),
        (tenant.clone(), event("run-1", 5, "requestCompleted")),
    ];
    store.write_runs(&[], &first).await.unwrap();
    // A retried batch (its first attempt's commit was not seen) keeps what is stored.
    store.write_runs(&[], &first).await.unwrap();
    store.write_runs(&[], &second).await.unwrap();

    let read = store.run_events(&tenant, "run-1").await.unwrap();
    let expected: Vec<StoredEvent> =
        vec![first[0].1.clone(), first[1].1.clone(), second[1].1.clone()];
    assert_eq!(summary(&read), summary(&expected));
    assert!(read.iter().all(|e| e.run_id == "run-1"));
    assert_eq!(
        read[0].created_at.0.timestamp_millis(),
        first[0].1.created_at.0.timestamp_millis()
    );
    assert_eq!(store.run_events(&tenant, "run-2").await.unwrap().len(), 1);
    assert!(
        store.run_events(&other, "run-1").await.unwrap().is_empty(),
        "another tenant's run reads as having no events"
    );
    db.drop_database().await;
}

async fn legacy_event_count(db: &DatabaseConnection) -> i64 {
    let mut count = Query::select();
    count
        .expr(Expr::cust("COUNT(*)"))
        .from(Alias::new("run_events"));
    let row = db.query_one(&count).await.unwrap().unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

#[tokio::test]
async fn the_migration_carries_per_event_rows_to_pages_and_back() {
    let scratch = Scratch::new("upgrade").await;
    let db = Database::connect(scratch.raw_url()).await.unwrap();
    let before = Migrator::migrations()
        .iter()
        .position(|m| m.name() == PAGES_MIGRATION)
        .unwrap();
    Migrator::up(&db, Some(u32::try_from(before).unwrap()))
        .await
        .unwrap();
    let store = Store::connect(&StoreOptions::new(scratch.url.clone()))
        .await
        .unwrap();
    let tenant = store.create_tenant("t").await.unwrap().id;
    let legacy = [
        event("run-1", 0, "requestStarted"),
        event("run-1", 3, "requestCompleted"),
        event("run-1", 1, "usageUpdate"),
        event("run-2", 0, "requestStarted"),
    ];
    let mut insert = Query::insert();
    insert.into_table(Alias::new("run_events")).columns(
        [
            "id",
            "run_id",
            "tenant_id",
            "seq",
            "event_type",
            "payload",
            "created_at",
        ]
        .map(Alias::new),
    );
    for e in &legacy {
        insert
            .values([
                e.id.clone().into(),
                e.run_id.clone().into(),
                tenant.as_str().into(),
                i32::try_from(e.seq).unwrap().into(),
                e.event_type.clone().into(),
                e.payload.as_str().into(),
                e.created_at.0.timestamp_millis().into(),
            ])
            .unwrap();
    }
    // A row whose payload is not JSON (read as `null` before pages) does not stop the upgrade.
    insert
        .values([
            "broken-event".into(),
            "run-3".into(),
            tenant.as_str().into(),
            0i32.into(),
            "requestStarted".into(),
            "{not json".into(),
            0i64.into(),
        ])
        .unwrap();
    db.execute(&insert).await.unwrap();

    let mut in_order = vec![legacy[0].clone(), legacy[2].clone(), legacy[1].clone()];
    Migrator::up(&db, None).await.unwrap();
    let read = store.run_events(&tenant, "run-1").await.unwrap();
    assert_eq!(summary(&read), summary(&in_order));
    assert_eq!(
        read[2].created_at.0.timestamp_millis(),
        legacy[1].created_at.0.timestamp_millis()
    );
    assert_eq!(store.run_events(&tenant, "run-2").await.unwrap().len(), 1);
    let broken = store.run_events(&tenant, "run-3").await.unwrap();
    assert_eq!(broken.len(), 1);
    assert!(broken[0].payload.to_value().is_null());

    // Written after the upgrade, then taken back down: one row per event again.
    let late = event("run-1", 4, "requestCompleted");
    store
        .write_runs(&[], &[(tenant.clone(), late.clone())])
        .await
        .unwrap();
    // Down past pages (and every migration after them): the packing migration unpacks the
    // late page first.
    let after_pages = Migrator::migrations().len() - before;
    Migrator::down(&db, Some(u32::try_from(after_pages).unwrap()))
        .await
        .unwrap();
    assert_eq!(legacy_event_count(&db).await, 6);
    Migrator::up(&db, None).await.unwrap();
    in_order.push(late);
    assert_eq!(
        summary(&store.run_events(&tenant, "run-1").await.unwrap()),
        summary(&in_order)
    );

    let _ = store.close().await;
    let _ = db.close().await;
    scratch.remove().await;
}

/// The first page of the run whose page the test corrupts.
const BROKEN_PAGE: &str = "run_id = 'run-broken' AND first_seq = 0";

/// A run 10 days old with its prompt and answer kept, and its one event page.
fn old_run_with_text(tenant: &TenantId, id: &str) -> (RunRecord, (TenantId, StoredEvent)) {
    let mut run = new_record(id.into(), tenant.clone(), RunKind::Chat, "m".into());
    run.created_at = Timestamp(chrono::Utc::now() - chrono::Duration::days(10));
    run.status = RunStatus::Succeeded;
    run.completed_at = Some(run.created_at);
    run.request = Some(RawJson::of(
        &json!({"messages": [{"role": "user", "content": "old"}]}),
    ));
    let mut completed = event(id, 0, "requestCompleted");
    completed.payload = RawJson::of(
        &json!({"type": "requestCompleted", "data": {"result": {"textResponse": "old answer"}}}),
    );
    (run, (tenant.clone(), completed))
}

#[tokio::test]
async fn an_unreadable_page_is_left_out_of_reads_and_emptied_by_retention() {
    let db = database("corrupt").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let (broken_run, broken_page) = old_run_with_text(&tenant, "run-broken");
    let (sound_run, sound_page) = old_run_with_text(&tenant, "run-sound");
    let later = (tenant.clone(), event("run-broken", 1, "requestCompleted"));
    store
        .write_runs(&[broken_run, sound_run], &[broken_page, sound_page])
        .await
        .unwrap();
    store.write_runs(&[], &[later]).await.unwrap();
    let raw = Database::connect(db.url()).await.unwrap();
    let mut corrupt = Query::update();
    corrupt
        .table(Alias::new("run_event_pages"))
        .value(Alias::new("packed"), b"\x10\0\0\0not lz4".to_vec())
        .and_where(Expr::cust(BROKEN_PAGE));
    raw.execute(&corrupt).await.unwrap();

    let read = store.run_events(&tenant, "run-broken").await.unwrap();
    assert_eq!(
        read.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1],
        "the readable page's events are still served"
    );
    // Retention goes on past the page: both runs stripped, the page emptied.
    assert_eq!(store.strip_expired_text(&tenant, 7, 10).await.unwrap(), 2);
    let sound = store.run_events(&tenant, "run-sound").await.unwrap();
    assert!(sound[0].payload.to_value()["data"]["result"].is_null());
    let mut page = Query::select();
    page.column(Alias::new("packed"))
        .from(Alias::new("run_event_pages"))
        .and_where(Expr::cust(BROKEN_PAGE));
    let row = raw.query_one(&page).await.unwrap().unwrap();
    let packed = row.try_get_by_index::<Vec<u8>>(0).unwrap();
    assert_eq!(packed_pages::unpack(&packed).unwrap(), b"[]");
    raw.close().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn pages_are_stored_packed_and_pages_from_before_are_read_and_stripped() {
    let db = database("packed").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let (run, page) = old_run_with_text(&tenant, "run-new");
    let written = page.1.clone();
    store.write_runs(&[run], &[page]).await.unwrap();
    let raw = Database::connect(db.url()).await.unwrap();
    let mut stored = Query::select();
    stored
        .columns([Alias::new("events"), Alias::new("packed")])
        .from(Alias::new("run_event_pages"))
        .and_where(Expr::cust("run_id = 'run-new'"));
    let row = raw.query_one(&stored).await.unwrap().unwrap();
    assert_eq!(row.try_get_by_index::<String>(0).unwrap(), "");
    let json = packed_pages::unpack(&row.try_get_by_index::<Vec<u8>>(1).unwrap()).unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(listed[0]["id"], written.id.as_str());
    assert_eq!(listed[0]["payload"], written.payload.to_value());

    // A page as written before packing: JSON text, no packed bytes.
    let (old_run, old_page) = old_run_with_text(&tenant, "run-old");
    store.write_runs(&[old_run], &[]).await.unwrap();
    let text = json!([{"id": old_page.1.id, "seq": 0, "type": "requestCompleted",
                       "at": old_page.1.created_at.0.timestamp_millis(),
                       "payload": old_page.1.payload.to_value()}])
    .to_string();
    let mut insert = Query::insert();
    insert
        .into_table(Alias::new("run_event_pages"))
        .columns(["tenant_id", "run_id", "first_seq", "events", "created_at"].map(Alias::new))
        .values([
            tenant.as_str().into(),
            "run-old".into(),
            0i32.into(),
            text.into(),
            old_page.1.created_at.0.timestamp_millis().into(),
        ])
        .unwrap();
    raw.execute(&insert).await.unwrap();
    assert_eq!(
        summary(&store.run_events(&tenant, "run-old").await.unwrap()),
        summary(std::slice::from_ref(&old_page.1))
    );
    assert_eq!(store.strip_expired_text(&tenant, 7, 10).await.unwrap(), 2);
    for run in ["run-old", "run-new"] {
        let events = store.run_events(&tenant, run).await.unwrap();
        assert_eq!(events.len(), 1, "{run}");
        assert!(
            events[0].payload.to_value()["data"]["result"].is_null(),
            "{run}"
        );
    }
    raw.close().await.unwrap();
    db.drop_database().await;
}
