//! Every column of a run reads back as it was written, through the log writer's bulk insert:
//! each optional field set, each unset, empty text told apart from NULL (PostgreSQL receives
//! the rows as one array per column, with NULLs as flags), batches of uneven sizes, and a run
//! written again (in the same batch and in a later one) keeping its last write. SQLite by
//! default; PostgreSQL with `BATON_TEST_DATABASE_URL=postgres://...`.

#![allow(clippy::unwrap_used)]

use baton_domain::chat::Usage;
use baton_domain::run::{RawJson, RunKind, RunRecord, RunStatus, StoredEvent};
use baton_domain::{TenantId, Timestamp};
use baton_store::runs::new_record;
use serde_json::json;

mod support;
use support::database;

fn at(millis: i64) -> Timestamp {
    Timestamp(chrono::DateTime::from_timestamp_millis(millis).unwrap())
}

/// A finished run with every optional field set, text with quotes, backslashes and non-ASCII.
fn everything_set(tenant: &TenantId, id: &str) -> RunRecord {
    let mut run = new_record(
        id.into(),
        tenant.clone(),
        RunKind::Flow,
        "openai/gpt".into(),
    );
    run.root_id = "root-\"1\"".into();
    run.parent_id = Some("parent\\1".into());
    run.depth = 3;
    run.agent_role = Some("critic – ünïcode".into());
    run.environment = Some("production".into());
    run.flow_name = Some("support-bot".into());
    run.served_model = Some("anthropic/claude".into());
    run.provider = Some("anthropic".into());
    run.status = RunStatus::Failed;
    run.finish_reason = Some("length".into());
    run.usage = Usage {
        tokens_in: 11,
        tokens_out: 22,
        reasoning_tokens: 33,
        cached_tokens: 44,
        web_search_calls: 5,
    };
    run.cost_credits = 1_234_567;
    run.raw_cost_credits = -7;
    run.pricing_uncertain = true;
    run.duration_ms = 9_876;
    run.customer_id = Some("customer-id".into());
    run.customer_external_id = Some("acme".into());
    run.tags = vec!["a".into(), "b \"quoted\"".into()];
    run.request = Some(RawJson::of(
        &json!({"messages": [{"role": "user", "content": "hi \"there\"\n"}]}),
    ));
    run.response = Some(RawJson::of(&json!({"text": "ok"})));
    run.error_code = Some("PROVIDER_ERROR".into());
    run.error_message = Some("upstream said {\"no\"}".into());
    run.detail_dropped = true;
    run.fallback_used = true;
    run.was_cached = true;
    run.callback_origin = Some("https://example.test".into());
    run.cancel_requested_at = Some(at(1_800_000_000_001));
    run.cancel_requested_by = Some("key:ops".into());
    run.cancelled_at = Some(at(1_800_000_000_002));
    run.is_debug = true;
    run.created_at = at(1_800_000_000_000);
    run.completed_at = Some(at(1_800_000_000_003));
    run
}

/// A pending run with every optional field unset, or set to empty text where it is text.
fn nothing_set(tenant: &TenantId, id: &str, empty_text: bool) -> RunRecord {
    let mut run = new_record(id.into(), tenant.clone(), RunKind::Chat, String::new());
    run.created_at = at(1_800_000_001_000);
    if empty_text {
        for field in [
            &mut run.parent_id,
            &mut run.agent_role,
            &mut run.environment,
            &mut run.flow_name,
            &mut run.served_model,
            &mut run.provider,
            &mut run.finish_reason,
            &mut run.customer_id,
            &mut run.error_code,
            &mut run.error_message,
            &mut run.callback_origin,
            &mut run.cancel_requested_by,
        ] {
            *field = Some(String::new());
        }
        run.cancel_requested_at = Some(at(0));
    }
    run
}

#[tokio::test]
async fn every_column_of_a_run_reads_back_as_written() {
    let db = database("run_rows").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    let written = [
        everything_set(&tenant, "run-all"),
        nothing_set(&tenant, "run-none", false),
        nothing_set(&tenant, "run-empty", true),
    ];
    store.write_runs(&written, &[]).await.unwrap();
    for run in &written {
        assert_eq!(&store.get_run(&tenant, &run.id).await.unwrap(), run);
    }
    db.drop_database().await;
}

#[tokio::test]
async fn uneven_batches_and_rewritten_runs_keep_every_row_and_the_last_write() {
    let db = database("run_rows_batches").await;
    let store = &db.store;
    let tenant = store.create_tenant("t").await.unwrap().id;
    for size in [1usize, 37, 300] {
        let runs: Vec<RunRecord> = (0..size)
            .map(|i| {
                let mut run = everything_set(&tenant, &format!("run-{size}-{i}"));
                run.cost_credits = i64::try_from(i).unwrap();
                if i % 2 == 0 {
                    run.error_code = None;
                }
                run
            })
            .collect();
        store.write_runs(&runs, &[]).await.unwrap();
        for run in &runs {
            assert_eq!(&store.get_run(&tenant, &run.id).await.unwrap(), run);
        }
    }

    // Pending, then finished in the same batch; then finished again in a later one.
    let pending = nothing_set(&tenant, "run-again", false);
    let mut finished = everything_set(&tenant, "run-again");
    finished.root_id = pending.root_id.clone();
    finished.created_at = pending.created_at;
    store
        .write_runs(&[pending.clone(), finished.clone()], &[])
        .await
        .unwrap();
    let stored = store.get_run(&tenant, "run-again").await.unwrap();
    assert_eq!(stored.status, RunStatus::Failed);
    assert_eq!(stored.served_model, finished.served_model);
    let mut later = finished.clone();
    later.status = RunStatus::Succeeded;
    later.error_code = None;
    later.cost_credits = 42;
    store.write_runs(&[later], &[]).await.unwrap();
    let stored = store.get_run(&tenant, "run-again").await.unwrap();
    assert_eq!(
        (stored.status, stored.error_code, stored.cost_credits),
        (RunStatus::Succeeded, None, 42)
    );
    db.drop_database().await;
}

#[tokio::test]
async fn a_store_writing_short_statements_keeps_every_row_of_a_batch() {
    let db = database("run_rows_short").await;
    let store = db.store.clone().with_array_statement_rows(7);
    let tenant = store.create_tenant("t").await.unwrap().id;
    let runs: Vec<RunRecord> = (0..37)
        .map(|i| {
            let mut run = everything_set(&tenant, &format!("run-short-{i}"));
            run.tags = vec![format!("tag-{i}"), "shared".into()];
            run
        })
        .collect();
    let events: Vec<(TenantId, StoredEvent)> = runs
        .iter()
        .flat_map(|run| {
            (1..=2).map(|seq| {
                let event = StoredEvent {
                    id: format!("{}-event-{seq}", run.id),
                    run_id: run.id.clone(),
                    seq,
                    event_type: "execution.started".into(),
                    payload: RawJson::of(&json!({"seq": seq})),
                    created_at: at(1_700_000_000_000),
                };
                (tenant.clone(), event)
            })
        })
        .collect();
    store.write_runs(&runs, &events).await.unwrap();
    for run in &runs {
        assert_eq!(&store.get_run(&tenant, &run.id).await.unwrap(), run);
        let seqs: Vec<u32> = store
            .run_events(&tenant, &run.id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2], "{}", run.id);
    }
    db.drop_database().await;
}
