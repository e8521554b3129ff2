//! The invocation log's batch write, the database work behind every logged request: 256
//! one-call runs, each with its run row and its page of four lifecycle events (shaped like a
//! plain chat completion's), committed in one transaction, as the log writer does: to a SQLite
//! file, and to a fresh PostgreSQL database when `BATON_TEST_DATABASE_URL` names a server (the
//! time then includes the server's work: it runs on the same machine). `cargo xtask bench` (or
//! `cargo bench -p baton-store`); figures in docs/performance.md ("Packed event pages", "One
//! row a run").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use baton_domain::chat::Usage;
use baton_domain::run::{RawJson, RunKind, RunRecord, RunStatus, StoredEvent};
use baton_domain::{TenantId, Timestamp};
use baton_store::runs::new_record;
use baton_store::{Store, StoreOptions};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;

const BATCH: usize = 256;

fn one_call_run(tenant: &TenantId) -> (RunRecord, Vec<(TenantId, StoredEvent)>) {
    let id = uuid::Uuid::now_v7().to_string();
    let mut run = new_record(
        id.clone(),
        tenant.clone(),
        RunKind::Chat,
        "openai/gpt-4o-mini".into(),
    );
    run.status = RunStatus::Succeeded;
    run.served_model = Some("openai/gpt-4o-mini".into());
    run.provider = Some("openai".into());
    run.finish_reason = Some("stop".into());
    run.usage = Usage {
        tokens_in: 12,
        tokens_out: 6,
        ..Usage::default()
    };
    run.cost_credits = 5;
    run.raw_cost_credits = 5;
    run.request = Some(RawJson::of(
        &json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]}),
    ));
    run.response = Some(RawJson::of(
        &json!({"text": "Hello from the fast mock.", "toolCalls": [], "finishReason": "stop"}),
    ));
    run.completed_at = Some(Timestamp::now());
    let inference = uuid::Uuid::now_v7().to_string();
    let data = [
        (
            "requestStarted",
            json!({"flowName": null, "contextId": null, "model": "openai/gpt-4o-mini", "hasTools": false, "toolCount": 0}),
        ),
        (
            "agentInferenceStarted",
            json!({"inferenceRequestId": inference, "model": "gpt-4o-mini", "provider": "openai", "messageCount": 1, "hasTools": false, "toolCount": 0}),
        ),
        (
            "agentInferenceCompleted",
            json!({"inferenceRequestId": inference, "model": "gpt-4o-mini", "provider": "openai", "durationMs": 3, "usage": {"tokensIn": 12, "tokensOut": 6, "reasoningTokens": 0, "costCredits": 5, "costUsd": 5e-6}, "finishReason": "stop", "toolCallCount": 0, "wasCached": false, "wasFallback": false}),
        ),
        (
            "requestCompleted",
            json!({"durationMs": 3, "totalCreditsUsed": 5, "totalCostUsd": 5e-6, "totalTokensIn": 12, "totalTokensOut": 6, "totalInferenceCount": 1, "totalToolCalls": 0, "totalAgentSpawns": 0, "maxDepthReached": 0, "result": {"textResponse": "Hello from the fast mock."}}),
        ),
    ];
    let events = data
        .into_iter()
        .zip(0u32..)
        .map(|((event_type, data), seq)| {
            let event_id = uuid::Uuid::now_v7().to_string();
            let payload = json!({"id": event_id, "timestamp": "2026-11-24T14:02:21.315Z",
                                 "requestId": id, "type": event_type, "agentPath": [],
                                 "depth": 0, "data": data});
            let event = StoredEvent {
                id: event_id,
                run_id: id.clone(),
                seq,
                event_type: event_type.to_string(),
                payload: RawJson::of(&payload),
                created_at: Timestamp::now(),
            };
            (tenant.clone(), event)
        })
        .collect();
    (run, events)
}

fn batch(tenant: &TenantId) -> (Vec<RunRecord>, Vec<(TenantId, StoredEvent)>) {
    let mut runs = Vec::with_capacity(BATCH);
    let mut events = Vec::with_capacity(BATCH * 4);
    for _ in 0..BATCH {
        let (run, mut pages) = one_call_run(tenant);
        runs.push(run);
        events.append(&mut pages);
    }
    (runs, events)
}

/// Writes batches to `url`'s database as `name`.
fn write_batches(c: &mut Criterion, name: &str, url: String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (store, tenant) = runtime.block_on(async {
        let store = Store::connect(&StoreOptions::new(url)).await.unwrap();
        store.migrate().await.unwrap();
        let tenant = store.create_tenant("bench").await.unwrap().id;
        (store, tenant)
    });
    c.bench_function(name, |b| {
        b.iter_batched(
            || batch(&tenant),
            |(runs, events)| {
                runtime
                    .block_on(store.write_runs(&runs, &events))
                    .expect("batch written")
            },
            BatchSize::PerIteration,
        );
    });
    runtime.block_on(async { store.close().await.unwrap() });
}

fn run_log(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("baton_bench_run_log_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("log.db").display());
    write_batches(c, "write_256_one_call_runs_sqlite", url);
    let _ = std::fs::remove_dir_all(&dir);

    let Some(admin) = std::env::var("BATON_TEST_DATABASE_URL")
        .ok()
        .filter(|url| url.starts_with("postgres"))
    else {
        return;
    };
    let provision = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let name = format!("baton_bench_run_log_{}", std::process::id());
    let url = provision
        .block_on(baton_store::provision::create_postgres_database(
            &admin, &name,
        ))
        .unwrap();
    write_batches(c, "write_256_one_call_runs_postgres", url);
    provision
        .block_on(baton_store::provision::drop_postgres_database(
            &admin, &name,
        ))
        .unwrap();
}

criterion_group!(benches, run_log);
criterion_main!(benches);
