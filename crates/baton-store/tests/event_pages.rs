//! A run's stored events, kept in pages (one row per write): read back whole and in order, a
//! retried write stored once, another tenant's run invisible, and the events of a database
//! from before pages carried over by the migration (and back by its `down`). SQLite by
//! default; PostgreSQL with `BATON_TEST_DATABASE_URL=postgres://...`.

#![allow(clippy::unwrap_used)]

use baton_domain::lifecycle::{
    CallLifecycle, CallTarget, CallTokens, EventStamp, LoggedAnswer, RequestTotals,
};
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

fn run_with_status(tenant: &TenantId, id: &str, status: RunStatus) -> RunRecord {
    let mut run = new_record(id.into(), tenant.clone(), RunKind::Chat, "m".into());
    run.status = status;
    run
}

fn events_of(
    tenant: &TenantId,
    run: &str,
    seqs: std::ops::Range<u32>,
) -> Vec<(TenantId, StoredEvent)> {
    seqs.map(|seq| (tenant.clone(), event(run, seq, "usageUpdate")))
        .collect()
}

async fn count(db: &DatabaseConnection, table: &str, condition: &str) -> i64 {
    let mut select = Query::select();
    select
        .expr(Expr::cust("COUNT(*)"))
        .from(Alias::new(table))
        .and_where(Expr::cust(condition.to_string()));
    let row = db.query_one(&select).await.unwrap().unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// Where each run's events went: (in its row, page rows).
async fn placement(db: &DatabaseConnection, run: &str) -> (bool, i64) {
    let in_row = count(
        db,
        "runs",
        &format!("id = '{run}' AND event_page IS NOT NULL"),
    )
    .await;
    let pages = count(db, "run_event_pages", &format!("run_id = '{run}'")).await;
    (in_row == 1, pages)
}

#[tokio::test]
async fn the_page_written_with_a_finished_run_rides_in_its_row_and_survives_a_downgrade() {
    let db = database("row_page").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let other = store.create_tenant("other").await.unwrap().id;
    let raw = Database::connect(db.url()).await.unwrap();
    let pending = |id: &str| run_with_status(&tenant, id, RunStatus::Pending);
    let done = |id: &str| run_with_status(&tenant, id, RunStatus::Succeeded);

    // one-call: the finished row and its events in one batch, written twice (a retry).
    let one_call = events_of(&tenant, "one-call", 0..4);
    for _ in 0..2 {
        store
            .write_runs(&[done("one-call")], &one_call)
            .await
            .unwrap();
    }
    // queued: its pending row in an earlier batch; same-batch: pending and finished together.
    store.write_runs(&[pending("queued")], &[]).await.unwrap();
    let queued = events_of(&tenant, "queued", 0..2);
    store.write_runs(&[done("queued")], &queued).await.unwrap();
    let same_batch = events_of(&tenant, "same-batch", 0..2);
    store
        .write_runs(&[pending("same-batch"), done("same-batch")], &same_batch)
        .await
        .unwrap();
    // split: the events came a batch after the row; later: the events do not start at the
    // run's first; still-running: a pending row.
    store.write_runs(&[done("split")], &[]).await.unwrap();
    let split = events_of(&tenant, "split", 0..2);
    store.write_runs(&[], &split).await.unwrap();
    let later = events_of(&tenant, "later", 3..5);
    store.write_runs(&[done("later")], &later).await.unwrap();
    let running = events_of(&tenant, "running", 0..1);
    store
        .write_runs(&[pending("running")], &running)
        .await
        .unwrap();

    let expected = [
        ("one-call", &one_call, (true, 0)),
        ("queued", &queued, (true, 0)),
        ("same-batch", &same_batch, (true, 0)),
        ("split", &split, (false, 1)),
        ("later", &later, (false, 1)),
        ("running", &running, (false, 1)),
    ];
    let events = |list: &Vec<(TenantId, StoredEvent)>| -> Vec<StoredEvent> {
        list.iter().map(|(_, e)| e.clone()).collect()
    };
    for (run, written, stored) in expected {
        assert_eq!(placement(&raw, run).await, stored, "{run}");
        let read = store.run_events(&tenant, run).await.unwrap();
        assert_eq!(summary(&read), summary(&events(written)), "{run}");
        assert!(
            store.run_events(&other, run).await.unwrap().is_empty(),
            "{run}"
        );
    }
    // A later write of the finished run without its events keeps the page.
    store.write_runs(&[done("one-call")], &[]).await.unwrap();
    assert_eq!(placement(&raw, "one-call").await, (true, 0));

    // Down: the pages in rows become page rows from the run's first event; read the same.
    // (Down past that migration and every one after it.)
    let one_row = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261127_000002_one_row_a_run")
        .unwrap();
    let from_one_row = u32::try_from(Migrator::migrations().len() - one_row).unwrap();
    Migrator::down(&raw, Some(from_one_row)).await.unwrap();
    assert_eq!(
        count(
            &raw,
            "run_event_pages",
            "first_seq = 0 AND run_id IN ('one-call', 'queued', 'same-batch')"
        )
        .await,
        3
    );
    Migrator::up(&raw, None).await.unwrap();
    for (run, written, _) in expected {
        assert!(!placement(&raw, run).await.0, "{run}");
        let read = store.run_events(&tenant, run).await.unwrap();
        assert_eq!(
            summary(&read),
            summary(&events(written)),
            "{run} after down and up"
        );
    }
    raw.close().await.unwrap();
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

/// Bytes no page unpacks from.
const NOT_A_PAGE: &[u8] = b"\x10\0\0\0not lz4";

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

/// Overwrites the stored page `column` of `table` where `condition` holds.
async fn corrupt(db: &DatabaseConnection, table: &str, column: &str, condition: &str) {
    let mut update = Query::update();
    update
        .table(Alias::new(table))
        .value(Alias::new(column), NOT_A_PAGE.to_vec())
        .and_where(Expr::cust(condition.to_string()));
    assert_eq!(db.execute(&update).await.unwrap().rows_affected(), 1);
}

async fn stored_bytes(
    db: &DatabaseConnection,
    table: &str,
    column: &str,
    condition: &str,
) -> Vec<u8> {
    let mut select = Query::select();
    select
        .column(Alias::new(column))
        .from(Alias::new(table))
        .and_where(Expr::cust(condition.to_string()));
    let row = db.query_one(&select).await.unwrap().unwrap();
    row.try_get_by_index::<Vec<u8>>(0).unwrap()
}

#[tokio::test]
async fn an_unreadable_page_is_left_out_of_reads_and_emptied_by_retention() {
    let db = database("corrupt").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    // run-broken's first page rides in its row, its later page is a page row; run-split's
    // one page came in a batch after its row, so it is a page row.
    let (broken_run, broken_page) = old_run_with_text(&tenant, "run-broken");
    let (sound_run, sound_page) = old_run_with_text(&tenant, "run-sound");
    let (split_run, split_page) = old_run_with_text(&tenant, "run-split");
    let later = (tenant.clone(), event("run-broken", 1, "requestCompleted"));
    store
        .write_runs(
            &[broken_run, sound_run, split_run],
            &[broken_page, sound_page],
        )
        .await
        .unwrap();
    store.write_runs(&[], &[later, split_page]).await.unwrap();
    let raw = Database::connect(db.url()).await.unwrap();
    corrupt(&raw, "runs", "event_page", "id = 'run-broken'").await;
    let split_row = "run_id = 'run-split' AND first_seq = 0";
    corrupt(&raw, "run_event_pages", "packed", split_row).await;

    let read = store.run_events(&tenant, "run-broken").await.unwrap();
    assert_eq!(
        read.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1],
        "the readable page's events are still served"
    );
    assert!(
        store
            .run_events(&tenant, "run-split")
            .await
            .unwrap()
            .is_empty()
    );
    // Retention goes on past the pages: every run stripped, the unreadable pages emptied.
    assert_eq!(store.strip_expired_text(&tenant, 7, 10).await.unwrap(), 3);
    let sound = store.run_events(&tenant, "run-sound").await.unwrap();
    assert!(sound[0].payload.to_value()["data"]["result"].is_null());
    for (table, column, condition) in [
        ("runs", "event_page", "id = 'run-broken'"),
        ("run_event_pages", "packed", split_row),
    ] {
        let packed = stored_bytes(&raw, table, column, condition).await;
        assert_eq!(packed_pages::unpack(&packed).unwrap(), b"[]", "{table}");
    }
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
    // A page in a batch of its own is a page row (one written with its finished run rides in
    // the run's row).
    store.write_runs(&[run], &[]).await.unwrap();
    store.write_runs(&[], &[page]).await.unwrap();
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

/// An answered one-call request's lifecycle, the whole of what its run keeps of its four
/// events.
fn answered_run(tenant: &TenantId, id: &str) -> RunRecord {
    let mut run = run_with_status(tenant, id, RunStatus::Succeeded);
    run.created_at = Timestamp(chrono::Utc::now() - chrono::Duration::days(10));
    run.completed_at = Some(run.created_at);
    run.response = Some(RawJson::of(&json!({
        "text": "the answer", "toolCalls": [], "citations": [], "finishReason": "stop"
    })));
    let at = run.created_at.0.timestamp_millis();
    let stamp = |seq: u32| EventStamp {
        id: format!("{id}-event-{seq}"),
        seq,
        at: at + i64::from(seq),
    };
    let model = |provider: &str, model: &str| CallTarget {
        provider: provider.into(),
        model: model.into(),
    };
    run.lifecycle = Some(Box::new(CallLifecycle {
        stamps: [stamp(0), stamp(1), stamp(2), stamp(3)],
        flow_name: None,
        warnings: Vec::new(),
        requested_model: "m".into(),
        inference_id: format!("{id}-inference"),
        started: model("openai", "gpt-4o-mini"),
        served: model("openai", "gpt-4o-mini"),
        message_count: 1,
        tool_count: 0,
        duration_ms: 3,
        tokens: CallTokens {
            tokens_in: 10,
            tokens_out: 2,
            reasoning_tokens: 0,
        },
        credits: 45,
        finish_reason: Some("stop".into()),
        tool_call_count: 0,
        was_cached: false,
        was_fallback: false,
        totals: RequestTotals {
            credits: 45,
            tokens_in: 10,
            tokens_out: 2,
            inference_count: 1,
            max_depth: 0,
        },
    }));
    run
}

#[tokio::test]
async fn an_answered_call_keeps_its_lifecycle_in_its_row_and_reads_as_its_four_events() {
    let db = database("lifecycle").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let other = store.create_tenant("other").await.unwrap().id;
    let raw = Database::connect(db.url()).await.unwrap();
    let run = answered_run(&tenant, "answered");
    let expected = {
        let lifecycle = run.lifecycle.as_deref().unwrap();
        let answer = LoggedAnswer::read(run.response.as_ref().unwrap()).unwrap();
        lifecycle.events("answered", Some(&answer))
    };
    // Written twice (a retried batch): still one row, nothing in the page table.
    for _ in 0..2 {
        store
            .write_runs(std::slice::from_ref(&run), &[])
            .await
            .unwrap();
    }
    assert_eq!(placement(&raw, "answered").await, (true, 0));
    let page = stored_bytes(&raw, "runs", "event_page", "id = 'answered'").await;
    assert!(
        packed_pages::lifecycle(&page).is_some(),
        "a lifecycle, not a page"
    );

    let read = store.run_events(&tenant, "answered").await.unwrap();
    assert_eq!(summary(&read), summary(&expected));
    assert_eq!(
        read[3].payload.to_value()["data"]["result"]["textResponse"],
        "the answer"
    );
    assert_eq!(
        read.iter().map(|e| e.created_at).collect::<Vec<_>>(),
        expected.iter().map(|e| e.created_at).collect::<Vec<_>>()
    );
    assert!(
        store
            .run_events(&other, "answered")
            .await
            .unwrap()
            .is_empty(),
        "another tenant's run reads as having no events"
    );

    // Down past the change: the lifecycle becomes the page of its events; up again, the same
    // events read from it.
    Migrator::down(&raw, Some(1)).await.unwrap();
    let page = stored_bytes(&raw, "runs", "event_page", "id = 'answered'").await;
    assert!(packed_pages::lifecycle(&page).is_none());
    assert!(packed_pages::unpack(&page).is_ok(), "a packed page");
    Migrator::up(&raw, None).await.unwrap();
    assert_eq!(
        summary(&store.run_events(&tenant, "answered").await.unwrap()),
        summary(&expected)
    );

    // Retention drops the answer with the run's text: the result reads null, the rest stays.
    store
        .write_runs(&[answered_run(&tenant, "kept-short")], &[])
        .await
        .unwrap();
    assert!(store.strip_expired_text(&tenant, 7, 10).await.unwrap() >= 1);
    let stripped = store.run_events(&tenant, "kept-short").await.unwrap();
    assert_eq!(stripped.len(), 4);
    let completed = stripped[3].payload.to_value();
    assert!(completed["data"]["result"].is_null());
    assert_eq!(completed["data"]["totalCreditsUsed"], 45);
    raw.close().await.unwrap();
    db.drop_database().await;
}
