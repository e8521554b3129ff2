//! A store on a connection of its own (the invocation log's writer) against a real database
//! (SQLite by default; PostgreSQL with `BATON_TEST_DATABASE_URL=postgres://...`).

#![allow(clippy::unwrap_used)]

use baton_domain::run::{RunKind, RunRecord, RunStatus};

mod support;
use support::database;

#[tokio::test]
async fn a_store_on_its_own_connection_writes_what_the_shared_pool_reads() {
    let db = database("own_connection").await;
    let tenant = db.store.create_tenant("t").await.unwrap().id;
    let writer = db.store.own_connection().await.unwrap();

    // Batches of several shapes, so statements are prepared and then reused on the one
    // connection: every write lands, and readers on the shared pool see each batch at once.
    for (batch, size) in [130usize, 3, 130, 1].into_iter().enumerate() {
        let records: Vec<RunRecord> = (0..size)
            .map(|i| {
                let mut record = RunRecord::pending(
                    format!("run-{batch}-{i}"),
                    tenant.clone(),
                    RunKind::Chat,
                    "openai/gpt-4o-mini".into(),
                );
                record.status = RunStatus::Succeeded;
                record
            })
            .collect();
        writer.write_runs(&records, &[]).await.unwrap();
        let last = db
            .store
            .get_run(&tenant, &format!("run-{batch}-{}", size - 1))
            .await
            .unwrap();
        assert_eq!(last.status, RunStatus::Succeeded);
    }
    // The shared pool still writes too (another connection, the same database).
    db.store.create_tenant("u").await.unwrap();
    assert_eq!(writer.count_tenants().await.unwrap(), 2);
    drop(writer);
    db.drop_database().await;
}
