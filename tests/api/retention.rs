//! Text retention: runs outside the tenant's sample store no text (`detailDropped`), debug runs
//! keep theirs, and the cleanup strips text older than the retention, in batches, keeping cost,
//! model and status.

use std::time::Duration;

use baton_domain::run::{RawJson, RunKind, RunRecord, RunStatus, StoredEvent};
use baton_domain::{TenantId, Timestamp};
use baton_testkit::Reply;
use serde_json::{Value, json};

use crate::chat::{app_with_mock, wait_for_run};
use crate::helpers::{TestApp, spawn_app_with};

async fn request(app: &TestApp, path: &str, body: Value) -> String {
    let response = crate::helpers::send(
        app.client
            .post(app.url(path))
            .bearer_auth(&app.default_tenant.api_key)
            .json(&body),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn runs_outside_the_sample_keep_no_text_but_debug_runs_do() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let set = app
        .put("/api/v1/settings", &key, json!({"textSampleRate": 0}))
        .await;
    assert_eq!(set.status, 200, "{}", set.text);

    mock.push(Reply::text("a private answer").with_usage(100, 20));
    let id = request(
        &app,
        "/api/v1/chat/completions",
        json!({"model": "openai/gpt-4o-mini",
               "messages": [{"role": "user", "content": "a private prompt"}]}),
    )
    .await;
    let run = wait_for_run(&app, &id).await;
    assert!(run.detail_dropped);
    assert_eq!(run.request, None);
    assert_eq!(run.response, None);
    // What is always kept.
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.served_model.as_deref(), Some("openai/gpt-4o-mini"));
    assert_eq!((run.usage.tokens_in, run.usage.tokens_out), (100, 20));
    assert!(run.cost_credits > 0);
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let events = app.store.run_events(&tenant, &id).await.unwrap();
    assert!(!events.is_empty(), "the lifecycle is still stored");
    let stored = serde_json::to_string(&events).unwrap();
    assert!(!stored.contains("a private"), "{stored}");

    mock.push(Reply::text("a debug answer"));
    let id = request(
        &app,
        "/api/v1/inference",
        json!({"model": "openai/gpt-4o-mini", "is_debug": true,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "a debug prompt"}]}]}),
    )
    .await;
    let run = wait_for_run(&app, &id).await;
    assert!(!run.detail_dropped, "debug runs always keep text");
    assert_eq!(run.response.unwrap().to_value()["text"], "a debug answer");
    assert!(run.request.unwrap().as_str().contains("a debug prompt"));
}

fn stored_run(tenant: &TenantId, age_days: i64, debug: bool) -> RunRecord {
    let id = uuid::Uuid::now_v7().to_string();
    let mut run = baton_store::runs::new_record(
        id,
        tenant.clone(),
        RunKind::Chat,
        "openai/gpt-4o-mini".into(),
    );
    run.created_at = Timestamp(chrono::Utc::now() - chrono::Duration::days(age_days));
    run.completed_at = Some(run.created_at);
    run.status = RunStatus::Succeeded;
    run.served_model = Some("openai/gpt-4o-mini".into());
    run.cost_credits = 123;
    run.is_debug = debug;
    run.request = Some(RawJson::of(
        &json!({"messages": [{"role": "user", "content": "old prompt"}]}),
    ));
    run.response = Some(RawJson::of(&json!({"text": "old answer"})));
    run
}

fn completed_event(run: &RunRecord) -> (TenantId, StoredEvent) {
    (
        run.tenant.clone().unwrap(),
        StoredEvent {
            id: uuid::Uuid::now_v7().to_string(),
            run_id: run.id.clone(),
            seq: 0,
            event_type: "requestCompleted".into(),
            payload: RawJson::of(
                &json!({"type": "requestCompleted", "data": {"totalCreditsUsed": 123,
                            "result": {"textResponse": "old answer"}}}),
            ),
            created_at: run.created_at,
        },
    )
}

async fn seed(app: &TestApp) -> (TenantId, Vec<RunRecord>) {
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let runs = vec![
        stored_run(&tenant, 10, false),
        stored_run(&tenant, 9, false),
        stored_run(&tenant, 10, true),
        stored_run(&tenant, 0, false),
    ];
    let events: Vec<_> = runs.iter().map(completed_event).collect();
    app.store.write_runs(&runs, &events).await.unwrap();
    let set = app
        .put(
            "/api/v1/settings",
            &app.default_tenant.api_key,
            json!({"textRetentionDays": 7}),
        )
        .await;
    assert_eq!(set.status, 200, "{}", set.text);
    (tenant, runs)
}

async fn assert_stripped(app: &TestApp, tenant: &TenantId, runs: &[RunRecord]) {
    for (run, expect_stripped) in runs.iter().zip([true, true, false, false]) {
        let stored = app.store.get_run(tenant, &run.id).await.unwrap();
        assert_eq!(stored.request.is_none(), expect_stripped, "{}", run.id);
        assert_eq!(stored.response.is_none(), expect_stripped);
        assert_eq!(stored.detail_dropped, expect_stripped);
        assert_eq!(stored.cost_credits, 123, "cost is kept");
        assert_eq!(stored.status, RunStatus::Succeeded);
        assert_eq!(stored.served_model.as_deref(), Some("openai/gpt-4o-mini"));
        let events = app.store.run_events(tenant, &run.id).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(
            events[0].payload.to_value()["data"]["result"].is_null(),
            expect_stripped,
            "{:?}",
            events[0].payload
        );
        assert_eq!(
            events[0].payload.to_value()["data"]["totalCreditsUsed"],
            123
        );
    }
}

#[tokio::test]
async fn cleanup_strips_old_text_only_in_bounded_batches() {
    let app = spawn_app_with(|config| config.retention.cleanup_interval_secs = 0).await;
    let (tenant, runs) = seed(&app).await;
    // Two runs are past the retention; a batch of one strips one at a time.
    assert_eq!(
        app.store.strip_expired_text(&tenant, 7, 1).await.unwrap(),
        1
    );
    assert_eq!(
        app.store.strip_expired_text(&tenant, 7, 1).await.unwrap(),
        1
    );
    assert_eq!(
        app.store.strip_expired_text(&tenant, 7, 1).await.unwrap(),
        0
    );
    assert_stripped(&app, &tenant, &runs).await;
}

#[tokio::test]
async fn the_cleanup_runs_in_the_background() {
    let app = spawn_app_with(|config| {
        config.retention.cleanup_interval_secs = 1;
        config.retention.cleanup_batch = 1;
    })
    .await;
    let (tenant, runs) = seed(&app).await;
    for _ in 0..100 {
        let first = app.store.get_run(&tenant, &runs[1].id).await.unwrap();
        if first.detail_dropped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_stripped(&app, &tenant, &runs).await;
}
