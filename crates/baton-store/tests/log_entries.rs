//! A debug run's captured log lines against a real database (SQLite by default; PostgreSQL with
//! `BATON_TEST_DATABASE_URL=postgres://...`).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_domain::Timestamp;
use baton_domain::logs::RunLogEntry;
use serde_json::json;

mod support;
use support::database;

/// Three lines: more than one statement (statements hold a power of two rows).
const LINES_PER_RUN: u32 = 3;
const RUNS: u32 = 60;

fn lines_of(run_id: &str) -> Vec<RunLogEntry> {
    (0..LINES_PER_RUN)
        .map(|seq| RunLogEntry {
            id: uuid::Uuid::now_v7().to_string(),
            run_id: run_id.to_string(),
            seq,
            level: "debug".into(),
            target: "baton_executor::gateway".into(),
            message: format!("line {seq}"),
            fields: json!({"seq": seq}),
            timestamp: Timestamp::now(),
        })
        .collect()
}

#[tokio::test]
async fn a_reader_sees_all_of_a_runs_lines_or_none() {
    let db = database("log_entries").await;
    let store = db.store.clone();
    let tenant = store.create_tenant("a").await.unwrap().id;
    let other = store.create_tenant("b").await.unwrap().id;
    let done = Arc::new(AtomicBool::new(false));

    // A reader polls each run while the writer stores it, as `/log-entries` does while a
    // client waits for a debug run: it must never find the run half written.
    let reader = tokio::spawn({
        let (store, tenant, done) = (store.clone(), tenant.clone(), done.clone());
        async move {
            let mut partial = Vec::new();
            let mut reads = 0u32;
            while !done.load(Ordering::Relaxed) {
                for run in 0..RUNS {
                    let seen = store
                        .run_log_entries(&tenant, &format!("run-{run}"))
                        .await
                        .unwrap()
                        .len();
                    reads += 1;
                    if seen != 0 && seen != LINES_PER_RUN as usize {
                        partial.push((run, seen));
                    }
                }
            }
            (partial, reads)
        }
    });
    for run in 0..RUNS {
        let id = format!("run-{run}");
        if run % 2 == 0 {
            store
                .write_log_entries(&tenant, &lines_of(&id))
                .await
                .unwrap();
        } else {
            // The log writer's path: a batch of runs' lines at once.
            let (ours, theirs) = (lines_of(&id), lines_of(&id));
            store
                .write_log_entry_sets([(&tenant, &ours[..]), (&other, &theirs[..])])
                .await
                .unwrap();
        }
        tokio::task::yield_now().await;
    }
    done.store(true, Ordering::Relaxed);
    let (partial, reads) = reader.await.unwrap();
    assert!(reads > 0);
    assert!(partial.is_empty(), "runs seen half written: {partial:?}");

    // Every line is there, in order, and each tenant sees only its own.
    let lines = store.run_log_entries(&tenant, "run-1").await.unwrap();
    assert_eq!(
        lines.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(),
        ["line 0", "line 1", "line 2"]
    );
    assert_eq!(
        store.run_log_entries(&other, "run-1").await.unwrap().len(),
        3
    );
    assert!(
        store
            .run_log_entries(&other, "run-0")
            .await
            .unwrap()
            .is_empty()
    );
    db.drop_database().await;
}

#[tokio::test]
async fn lines_the_database_would_refuse_are_stored_made_safe() {
    let db = database("log_entries_safe").await;
    let store = &db.store;
    let tenant = store.create_tenant("a").await.unwrap().id;
    let mut odd = lines_of("odd");
    // PostgreSQL refuses NUL in text; the target column holds 256 characters.
    odd[0].message = "body: a\0b".into();
    odd[1].target = "é".repeat(300);
    // In one batch with a clean run: neither may take the other down.
    let clean = lines_of("clean");
    store
        .write_log_entry_sets([(&tenant, &odd[..]), (&tenant, &clean[..])])
        .await
        .unwrap();

    let stored = store.run_log_entries(&tenant, "odd").await.unwrap();
    assert_eq!(stored[0].message, "body: a\u{FFFD}b");
    assert_eq!(stored[1].target, "é".repeat(256));
    assert_eq!(
        store.run_log_entries(&tenant, "clean").await.unwrap().len(),
        3
    );
    db.drop_database().await;
}
