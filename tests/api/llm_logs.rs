//! The invocation log API: filters, keyset pagination under concurrent writes, page-size
//! bounds, the full entry, the agent-tree hierarchy, stored events and their counts, log lines.

use std::collections::HashSet;

use baton_domain::logs::RunLogEntry;
use baton_domain::run::{RunKind, RunRecord, RunStatus, ToolCallRecord};
use baton_domain::{TenantId, Timestamp};
use baton_store::runs::new_record;
use baton_testkit::Reply;
use chrono::{DateTime, Duration, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::chat::{app_with_mock, wait_for_run};
use crate::helpers::{TestApp, spawn_app};
use crate::tools::{calls, setup};

fn at(base: DateTime<Utc>, offset_ms: i64) -> Timestamp {
    Timestamp(base + Duration::milliseconds(offset_ms))
}

fn base_time() -> DateTime<Utc> {
    let now = Utc::now() - Duration::hours(1);
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap()
}

fn run(tenant: &TenantId, created_at: Timestamp) -> RunRecord {
    let mut record = new_record(
        uuid::Uuid::now_v7().to_string(),
        tenant.clone(),
        RunKind::Flow,
        "openai/gpt-4o-mini".into(),
    );
    record.status = RunStatus::Succeeded;
    record.created_at = created_at;
    record.completed_at = Some(created_at);
    record
}

fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_string())
        .collect()
}

/// Every id a filtered listing returns, followed across pages.
async fn listed(app: &TestApp, key: &str, query: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/api/v1/llm-logs?pageSize=3&{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let response = app.get(&path, key).await;
        assert_eq!(response.status, 200, "{path}: {}", response.text);
        let page = response.json();
        out.extend(ids(&page));
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return out,
        }
    }
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

#[tokio::test]
async fn every_filter_selects_its_runs() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let tenant = TenantId::new(app.default_tenant.id.clone());

    // One real request through the mock provider.
    mock.push(Reply::text("hello").with_usage(10, 5));
    let response = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-baton-customer-id", "cust-live")
            .header("x-baton-tags", "Team:live")
            .json(&json!({"model": "openai/gpt-4o-mini",
                          "messages": [{"role": "user", "content": "Say hi"}]})),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let live = response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    wait_for_run(&app, &live).await;

    let base = base_time();
    let mut staging = run(&tenant, at(base, 1));
    staging.environment = Some("staging".into());
    staging.flow_name = Some("alpha".into());
    staging.tags = vec!["Team:a".into()];
    staging.customer_external_id = Some("cust-1".into());
    let mut failed = run(&tenant, at(base, 2));
    failed.environment = Some("production".into());
    failed.flow_name = Some("beta".into());
    failed.status = RunStatus::Failed;
    failed.tags = vec!["Team:b".into(), "Feature:x".into()];
    let mut pending = run(&tenant, at(base, 3));
    pending.environment = Some("production".into());
    pending.flow_name = Some("alpha".into());
    pending.status = RunStatus::Pending;
    pending.completed_at = None;
    let mut child = run(&tenant, at(base, 4));
    child.parent_id = Some(staging.id.clone());
    child.root_id = staging.id.clone();
    child.depth = 1;
    child.agent_role = Some("helper".into());
    child.flow_name = Some("gamma".into());
    let mut cancelled = run(&tenant, at(base, 5));
    cancelled.cancel_requested_at = Some(at(base, 6));
    cancelled.cancel_requested_by = Some("user:x".into());
    cancelled.cancelled_at = Some(at(base, 7));
    let old = run(&tenant, Timestamp(base - Duration::days(2)));
    app.store
        .write_runs(
            &[
                staging.clone(),
                failed.clone(),
                pending.clone(),
                child.clone(),
                cancelled.clone(),
                old.clone(),
            ],
            &[],
        )
        .await
        .unwrap();
    let all = vec![
        live.clone(),
        cancelled.id.clone(),
        child.id.clone(),
        pending.id.clone(),
        failed.id.clone(),
        staging.id.clone(),
        old.id.clone(),
    ];
    // Newest first, every run once.
    assert_eq!(listed(&app, &key, "").await, all);

    let cases: Vec<(String, Vec<&String>)> = vec![
        (
            "environments=staging&environments=production".into(),
            vec![&staging.id, &failed.id, &pending.id],
        ),
        ("environments=staging,nowhere".into(), vec![&staging.id]),
        (
            "flows=alpha".into(),
            vec![&staging.id, &pending.id],
        ),
        (
            "flows=beta,gamma".into(),
            vec![&failed.id, &child.id],
        ),
        ("statuses=failed".into(), vec![&failed.id]),
        (
            "statuses=Pending,FAILED".into(),
            vec![&failed.id, &pending.id],
        ),
        (
            "tags=Team:a&tags=Feature:x".into(),
            vec![&staging.id, &failed.id],
        ),
        ("tags=Team:live".into(), vec![&live]),
        ("customerId=cust-1".into(), vec![&staging.id]),
        ("customerId=cust-live".into(), vec![&live]),
        (
            format!("parentRequestId={}", staging.id),
            vec![&child.id],
        ),
        ("cancelled=true".into(), vec![&cancelled.id]),
        (
            format!("from={}", at(base, -1)),
            vec![
                &staging.id,
                &failed.id,
                &pending.id,
                &child.id,
                &cancelled.id,
                &live,
            ],
        ),
        (
            format!("from={}&to={}", at(base, 2), at(base, 4)),
            vec![&failed.id, &pending.id],
        ),
        (
            format!("to={}", at(base, 0)),
            vec![&old.id],
        ),
        (
            format!("to={}", (base - Duration::days(1)).format("%Y-%m-%d")),
            vec![&old.id],
        ),
        (
            "flows=alpha&statuses=Succeeded&environments=staging&tags=Team:a&customerId=cust-1&rootOnly=true&cancelled=false".into(),
            vec![&staging.id],
        ),
    ];
    for (query, expected) in cases {
        assert_eq!(
            sorted(listed(&app, &key, &query).await),
            sorted(expected.into_iter().cloned().collect()),
            "{query}"
        );
    }
    let roots = listed(&app, &key, "rootOnly=true").await;
    assert_eq!(roots.len(), all.len() - 1);
    assert!(!roots.contains(&child.id));
    let not_cancelled = listed(&app, &key, "cancelled=false").await;
    assert_eq!(not_cancelled.len(), all.len() - 1);
    assert!(!not_cancelled.contains(&cancelled.id));

    // Invalid input names the field.
    for (query, param) in [
        ("statuses=Done", "statuses"),
        ("statuses=Succeeded,Cancelled", "statuses"),
        ("pageSize=201", "pageSize"),
        ("pageSize=0", "pageSize"),
        ("from=yesterday", "from"),
        ("to=2026-13-40", "to"),
        ("cancelled=yes", "cancelled"),
        ("rootOnly=maybe", "rootOnly"),
        ("cursor=not-a-cursor", "cursor"),
        ("status=Failed", "status"),
    ] {
        let error = app
            .get(&format!("/api/v1/llm-logs?{query}"), &key)
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param, "{query}");
    }
}

#[tokio::test]
async fn page_size_defaults_to_50_and_is_bounded_at_200() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let base = base_time();
    let rows: Vec<RunRecord> = (0..230).map(|i| run(&tenant, at(base, i))).collect();
    app.store.write_runs(&rows, &[]).await.unwrap();

    let first = app.get("/api/v1/llm-logs", &key).await.json();
    assert_eq!(ids(&first).len(), 50);
    assert!(first["nextCursor"].is_string());
    let biggest = app.get("/api/v1/llm-logs?pageSize=200", &key).await.json();
    assert_eq!(ids(&biggest).len(), 200);
    let rest = app
        .get(
            &format!(
                "/api/v1/llm-logs?pageSize=200&cursor={}",
                biggest["nextCursor"].as_str().unwrap()
            ),
            &key,
        )
        .await
        .json();
    assert_eq!(ids(&rest).len(), 30);
    assert!(rest["nextCursor"].is_null(), "the last page has no cursor");
    app.get("/api/v1/llm-logs?pageSize=201", &key)
        .await
        .error(400, "VALIDATION_ERROR");
    // Summaries leave the bodies out.
    assert!(first["items"][0].get("request").is_none());
    assert_eq!(first["items"][0]["status"], "Succeeded");
}

#[tokio::test]
async fn cursor_pagination_over_1000_rows_while_inserts_continue_has_no_gaps_or_duplicates() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let base = base_time();
    // Runs of the same millisecond in fives, so the id breaks ties inside a page and across
    // page boundaries.
    let rows: Vec<RunRecord> = (0..1000)
        .map(|i| {
            let mut record = run(&tenant, at(base, i / 5));
            if i % 7 == 0 {
                record.status = RunStatus::Pending;
                record.completed_at = None;
            }
            record
        })
        .collect();
    for chunk in rows.chunks(250) {
        app.store.write_runs(chunk, &[]).await.unwrap();
    }
    let existing: HashSet<String> = rows.iter().map(|r| r.id.clone()).collect();

    // Another task keeps writing: new runs, runs written late with old timestamps (the writer
    // is batched), and Pending runs finished (rewritten in place). It writes a batch each time
    // the reader asks, so writes land between every two pages.
    let (ask, mut asked) = mpsc::channel::<()>(1);
    let (done, mut written) = mpsc::channel::<usize>(1);
    let store = app.store.clone();
    let pending: Vec<RunRecord> = rows
        .iter()
        .filter(|r| r.status == RunStatus::Pending)
        .cloned()
        .collect();
    let writer_tenant = tenant.clone();
    let writer = tokio::spawn(async move {
        let mut total = 0;
        let mut round = 0usize;
        while asked.recv().await.is_some() {
            let mut batch = vec![
                run(&writer_tenant, Timestamp::now()),
                run(
                    &writer_tenant,
                    at(base, i64::try_from(round * 7 % 200).unwrap()),
                ),
            ];
            if let Some(finished) = pending.get(round) {
                let mut finished = finished.clone();
                finished.status = RunStatus::Succeeded;
                finished.completed_at = Some(Timestamp::now());
                batch.push(finished);
            }
            store.write_runs(&batch, &[]).await.unwrap();
            total += 2;
            round += 1;
            done.send(total).await.unwrap();
        }
    });

    let mut seen: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/llm-logs?pageSize=37&cursor={c}"),
            None => "/api/v1/llm-logs?pageSize=37".to_string(),
        };
        let response = app.get(&path, &key).await;
        assert_eq!(response.status, 200, "{}", response.text);
        let page = response.json();
        seen.extend(ids(&page));
        pages += 1;
        ask.send(()).await.unwrap();
        written.recv().await.unwrap();
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    drop(ask);
    writer.await.unwrap();

    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no run is listed twice");
    let missing: Vec<&String> = existing.iter().filter(|id| !unique.contains(id)).collect();
    assert!(missing.is_empty(), "{} runs skipped", missing.len());
    assert!(pages >= 1000 / 37, "{pages} pages");
    // The rows the other task wrote are in the log.
    let everything = app.store.list_runs(&tenant).await.unwrap();
    assert_eq!(everything.len(), 1000 + 2 * pages);
}

#[tokio::test]
async fn an_entry_has_every_field_of_the_spec() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let tenant = TenantId::new(app.default_tenant.id.clone());

    mock.push(Reply::text("detailed answer").with_usage(1200, 300));
    let response = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-baton-customer-id", "cust-42")
            .header("x-baton-tags", "Team:search")
            .json(&json!({"model": "openai/gpt-4o-mini", "temperature": 0.5,
                          "messages": [{"role": "user", "content": "Say hi"}]})),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let record = wait_for_run(&app, &id).await;
    let entry = app.get(&format!("/api/v1/llm-logs/{id}"), &key).await;
    assert_eq!(entry.status, 200, "{}", entry.text);
    let entry = entry.json();
    assert_eq!(entry["id"], id);
    assert_eq!(entry["status"], "Succeeded");
    assert_eq!(entry["request"]["model"], "openai/gpt-4o-mini");
    assert_eq!(entry["request"]["environment"], "openai-compatible");
    assert_eq!(entry["request"]["tags"], json!(["Team:search"]));
    assert!(entry["request"]["body"]["messages"].is_array());
    assert_eq!(entry["response"]["body"]["text"], "detailed answer");
    assert_eq!(entry["response"]["finishReason"], "stop");
    assert_eq!(entry["usage"]["tokensIn"], 1200);
    assert_eq!(entry["usage"]["tokensOut"], 300);
    assert_eq!(entry["usage"]["reasoningTokens"], 0);
    assert_eq!(entry["usage"]["costCredits"], record.cost_credits);
    assert!(record.cost_credits > 0);
    assert_eq!(
        entry["usage"]["costUsd"].as_f64().unwrap(),
        record.cost_credits as f64 / 1_000_000.0
    );
    assert!(entry["durationMs"].is_u64());
    assert_eq!(entry["hierarchy"]["rootRequestId"], id);
    assert!(entry["hierarchy"]["parentRequestId"].is_null());
    assert_eq!(entry["hierarchy"]["depth"], 0);
    assert_eq!(entry["customer"]["externalId"], "cust-42");
    assert!(entry["customer"]["id"].is_string());
    assert!(entry["feedbackScore"].is_null());
    assert_eq!(entry["detailDropped"], false);
    for field in ["cancelRequestedAt", "cancelledAt", "cancelRequestedBy"] {
        assert!(entry[field].is_null(), "{field}");
    }
    assert_eq!(entry["cancelled"], false);
    assert_eq!(entry["servedModel"], "openai/gpt-4o-mini");
    assert_eq!(entry["fallbackUsed"], false);
    assert_eq!(entry["attempts"][0]["model"], "openai/gpt-4o-mini");
    assert_eq!(entry["attempts"][0]["outcome"], "succeeded");
    assert_eq!(entry["warnings"], json!([]));
    assert_eq!(entry["toolCalls"], json!([]));
    // Unscored runs carry no progress fields at all (absent is not zero).
    for field in ["progressScore", "progressCertainty", "minProgressScore"] {
        assert!(entry.get(field).is_none(), "{field}");
    }

    // Tool calls with their endpoint and origin, cancel fields, dropped detail.
    let mut stored = run(&tenant, Timestamp::now());
    stored.detail_dropped = true;
    stored.usage.reasoning_tokens = 42;
    stored.cancel_requested_at = Some(Timestamp::now());
    stored.cancel_requested_by = Some("apiKey:k1".into());
    stored.cancelled_at = Some(Timestamp::now());
    stored.tool_calls = vec![ToolCallRecord {
        call_id: "c1".into(),
        tool_name: "lookup".into(),
        tool_type: "External".into(),
        status: "succeeded".into(),
        target_url: Some("https://tools.example.com/lookup".into()),
        origin_source: Some("environment".into()),
        duration_ms: 12,
        error: None,
        turn: 0,
        child_request_id: None,
        child_credits_used: None,
    }];
    app.store.write_runs(&[stored.clone()], &[]).await.unwrap();
    let entry = app
        .get(&format!("/api/v1/llm-logs/{}", stored.id), &key)
        .await
        .json();
    assert_eq!(entry["detailDropped"], true);
    assert!(entry["request"]["body"].is_null());
    assert_eq!(entry["usage"]["reasoningTokens"], 42);
    assert_eq!(entry["cancelled"], true);
    assert_eq!(entry["cancelRequestedBy"], "apiKey:k1");
    assert!(entry["cancelRequestedAt"].is_string());
    assert!(entry["cancelledAt"].is_string());
    assert_eq!(
        entry["toolCalls"][0]["targetUrl"],
        "https://tools.example.com/lookup"
    );
    assert_eq!(entry["toolCalls"][0]["originSource"], "environment");

    app.get(&format!("/api/v1/llm-logs/{}", uuid::Uuid::now_v7()), &key)
        .await
        .error(404, "NOT_FOUND");
}

#[tokio::test]
async fn hierarchy_events_and_stats_of_a_three_level_agent_tree() {
    let s = setup().await;
    let root = s.editor_tree().await;
    s.mock.push(calls(&[(
        "r1",
        "researcher",
        json!({"input": "find facts"}),
    )]));
    s.mock.push(calls(&[(
        "f1",
        "fact_checker",
        json!({"input": "is it 2015?"}),
    )]));
    s.mock.push(Reply::text("Yes, 2015."));
    s.mock.push(Reply::text("2015 (checked)."));
    s.mock.push(Reply::text("Final: 2015."));
    let response = s
        .call(
            Method::POST,
            &format!("/api/v1/flows/{}/runs", root.0),
            Some(json!({"parameters": {"topic": "rust"}})),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let root_id = response.json()["id"].as_str().unwrap().to_string();
    let root_run = wait_for_run(&s.app, &root_id).await;
    let child_id = root_run.tool_calls[0].child_request_id.clone().unwrap();
    let child = wait_for_run(&s.app, &child_id).await;
    let grandchild_id = child.tool_calls[0].child_request_id.clone().unwrap();
    wait_for_run(&s.app, &grandchild_id).await;

    let view = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{grandchild_id}/hierarchy"),
            None,
        )
        .await;
    let crumbs: Vec<&str> = view["breadcrumb"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(crumbs, [&root_id, &child_id, &grandchild_id]);
    assert_eq!(view["breadcrumb"][2]["agentRole"], "fact_checker");
    assert_eq!(view["breadcrumb"][2]["depth"], 2);
    assert_eq!(view["parent"]["id"], child_id);
    assert_eq!(view["parent"]["agentRole"], "researcher");
    assert_eq!(view["children"], json!([]));
    let middle_view = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{child_id}/hierarchy"),
            None,
        )
        .await;
    assert_eq!(middle_view["parent"]["id"], root_id);
    assert_eq!(middle_view["children"][0]["id"], grandchild_id);
    let root_view = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/hierarchy"),
            None,
        )
        .await;
    assert!(root_view["parent"].is_null());
    assert_eq!(root_view["breadcrumb"].as_array().unwrap().len(), 1);
    assert_eq!(root_view["children"][0]["id"], child_id);
    // The listing filters the same tree.
    let children = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs?parentRequestId={root_id}"),
            None,
        )
        .await;
    assert_eq!(ids(&children), std::slice::from_ref(&child_id));
    let roots = s
        .ok(Method::GET, "/api/v1/llm-logs?rootOnly=true", None)
        .await;
    assert_eq!(ids(&roots), std::slice::from_ref(&root_id));

    // Events: the root holds the whole tree's, in order.
    let events = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/events"),
            None,
        )
        .await;
    let events = events.as_array().unwrap().clone();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"requestStarted"));
    assert_eq!(types.last(), Some(&"requestCompleted"));
    assert_eq!(types.iter().filter(|t| **t == "agentStarted").count(), 2);
    assert!(events.iter().all(|e| e["requestId"] == root_id));
    let tools = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/events?types=tool*"),
            None,
        )
        .await;
    let tool_types: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        tool_types.len(),
        types.iter().filter(|t| t.starts_with("tool")).count()
    );
    assert!(tool_types.contains(&"toolStarted") && tool_types.contains(&"toolCompleted"));
    assert!(tool_types.iter().all(|t| t.starts_with("tool")));
    let mixed = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/events?types=agent.started,requestCompleted"),
            None,
        )
        .await;
    let mixed_types: Vec<&str> = mixed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        mixed_types,
        ["agentStarted", "agentStarted", "requestCompleted"]
    );
    // Names in any case (DESIGN.md: enum values are read case-insensitively).
    let shouted = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/events?types=AGENTSTARTED,requestcompleted"),
            None,
        )
        .await;
    assert_eq!(shouted.as_array().unwrap().len(), 3, "{shouted}");
    // A name no event has is refused, not answered with nothing.
    for bad in ["tool-started", "bogus", "tool", "x*"] {
        let error = s
            .call(
                Method::GET,
                &format!("/api/v1/llm-logs/{root_id}/events?types={bad}"),
                None,
            )
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], "types", "{bad}");
    }

    // A sub-agent's events are those of its own subtree.
    let child_events = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{child_id}/events"),
            None,
        )
        .await;
    let child_events = child_events.as_array().unwrap();
    assert!(!child_events.is_empty());
    assert!(
        child_events
            .iter()
            .all(|e| e["agentPath"][0] == "researcher")
    );
    assert!(
        child_events
            .iter()
            .any(|e| e["agentPath"] == json!(["researcher", "fact_checker"]))
    );

    // Stats count what the events endpoint returns.
    let stats = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/events/stats"),
            None,
        )
        .await;
    assert_eq!(stats["total"], events.len());
    assert_eq!(stats["counts"]["agentStarted"], 2);
    assert_eq!(stats["counts"]["requestCompleted"], 1);
    let counted: u64 = stats["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted, events.len() as u64);
    assert_eq!(
        stats["counts"]["agentInferenceCompleted"],
        types
            .iter()
            .filter(|t| **t == "agentInferenceCompleted")
            .count()
    );
    // With the events' own filter, over the same events; unknown parameters are refused.
    let agents = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{root_id}/events/stats?types=agent.*"),
            None,
        )
        .await;
    assert_eq!(agents["counts"]["agentStarted"], 2);
    assert!(
        agents["counts"].get("requestCompleted").is_none(),
        "{agents}"
    );
    let counted: u64 = agents["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(agents["total"], counted);
    for (query, param) in [("types=bad%20type!", "types"), ("foo=1", "foo")] {
        let refused = s
            .call(
                Method::GET,
                &format!("/api/v1/llm-logs/{root_id}/events/stats?{query}"),
                None,
            )
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(refused["param"], param, "{query}");
    }
}

/// Every request stores its lifecycle events, whatever its kind and format (DESIGN.md
/// "Streams"): synchronous and streamed flow runs (whose `requestStarted` names the flow),
/// native inference calls, and a failed call's `error` and `requestFailed`.
#[tokio::test]
async fn every_kind_of_request_stores_its_lifecycle() {
    let s = setup().await;
    let flow = s.empty_flow("Greeter").await;
    s.finish_flow(
        &flow,
        json!({"template": "Greet.", "userTemplate": "[[name]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    let types_of = |id: String| {
        let s = &s;
        async move {
            wait_for_run(&s.app, &id).await;
            let events = s
                .ok(Method::GET, &format!("/api/v1/llm-logs/{id}/events"), None)
                .await;
            events.as_array().unwrap().clone()
        }
    };
    let completed = [
        "requestStarted",
        "agentInferenceStarted",
        "agentInferenceCompleted",
        "requestCompleted",
    ];

    s.mock.push(Reply::text("Hello, Ada."));
    let run = s
        .ok(
            Method::POST,
            &format!("/api/v1/flows/{}/runs", flow.0),
            Some(json!({"parameters": {"name": "Ada"}})),
        )
        .await;
    let events = types_of(run["id"].as_str().unwrap().to_string()).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, completed, "a synchronous flow run");
    assert_eq!(events[0]["data"]["flowName"], flow.0.as_str());
    assert_eq!(events[3]["data"]["result"]["textResponse"], "Hello, Ada.");

    let runs = format!("/api/v1/flows/{}/runs", flow.0);
    s.mock.push(Reply::text("Hello, Bo."));
    let streamed = s
        .app
        .post_events(
            &runs,
            &s.key,
            json!({"stream": true, "parameters": {"name": "Bo"}}),
        )
        .await;
    let first = &streamed[0];
    assert_eq!(first["type"], "requestStarted");
    assert_eq!(first["data"]["flowName"], flow.0.as_str(), "streamed");
    let events = types_of(first["requestId"].as_str().unwrap().to_string()).await;
    assert_eq!(events[0]["data"]["flowName"], flow.0.as_str(), "stored");

    // A parameter left unresolved: the streamed requestStarted says so, as a synchronous
    // response's warnings do.
    s.mock.push(Reply::text("Hello, you."));
    let streamed = s
        .app
        .post_events(&runs, &s.key, json!({"stream": true}))
        .await;
    let first = &streamed[0];
    let warning = &first["data"]["warnings"][0];
    assert_eq!(warning["code"], "UNRESOLVED_PARAMETER", "{first}");
    assert_eq!(warning["parameter"], "name");

    s.mock.push(Reply::text("4"));
    let inference = s
        .ok(
            Method::POST,
            "/api/v1/inference",
            Some(json!({"model": "openai/gpt-4o-mini",
                        "messages": [{"role": "user", "content": "2+2?"}]})),
        )
        .await;
    let events = types_of(inference["id"].as_str().unwrap().to_string()).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, completed, "an inference call");
    assert_eq!(events[0]["data"]["flowName"], Value::Null);
    assert_eq!(events[2]["data"]["provider"], "openai");

    // A call the provider refuses: the failure is the stored end.
    s.mock.push(Reply::status(400, "bad request"));
    let failed = s
        .call(
            Method::POST,
            &format!("/api/v1/flows/{}/runs", flow.0),
            Some(json!({"parameters": {"name": "Cy"}})),
        )
        .await;
    assert_eq!(failed.status, 400, "{}", failed.text);
    let id = failed
        .headers
        .get("x-request-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let events = types_of(id).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "requestStarted",
            "agentInferenceStarted",
            "error",
            "requestFailed"
        ]
    );
    assert_eq!(events[3]["data"]["code"], "PROVIDER_REJECTED");

    // The same refusal of a streamed run and of an events-format chat, before anything was
    // streamed: the request had started, so its failure is a stream of the same events (as a
    // run with tools sends), stored the same.
    for (path, body) in [
        (
            format!("/api/v1/flows/{}/runs", flow.0),
            json!({"stream": true, "parameters": {"name": "Di"}}),
        ),
        (
            "/api/v1/chat/completions".to_string(),
            json!({"model": "openai/gpt-4o-mini", "stream": true,
                   "stream_options": {"format": "events"},
                   "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        s.mock.push(Reply::status(400, "bad request"));
        let streamed = s.app.post_events(&path, &s.key, body).await;
        let lifecycle = [
            "requestStarted",
            "agentInferenceStarted",
            "error",
            "requestFailed",
        ];
        let sent: Vec<&str> = streamed
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(sent, lifecycle, "{path}: streamed");
        assert_eq!(streamed[2]["data"]["code"], "PROVIDER_REJECTED");
        let id = streamed[0]["requestId"].as_str().unwrap().to_string();
        let events = types_of(id).await;
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, lifecycle, "{path}: stored");
        assert_eq!(events, streamed, "{path}: stored as streamed");
    }
}

#[tokio::test]
async fn log_entries_are_empty_unless_kept_and_come_back_in_order() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let plain = run(&tenant, Timestamp::now());
    let mut debug = run(&tenant, Timestamp::now());
    debug.is_debug = true;
    app.store
        .write_runs(&[plain.clone(), debug.clone()], &[])
        .await
        .unwrap();
    let entry = |seq: u32, message: &str| RunLogEntry {
        id: uuid::Uuid::now_v7().to_string(),
        run_id: debug.id.clone(),
        seq,
        level: "debug".into(),
        target: "baton_api::gateway".into(),
        message: message.into(),
        fields: json!({"model": "openai/gpt-4o-mini"}),
        timestamp: Timestamp::now(),
    };
    app.store
        .write_log_entries(&tenant, &[entry(1, "second"), entry(0, "first")])
        .await
        .unwrap();

    let none = app
        .get(&format!("/api/v1/llm-logs/{}/log-entries", plain.id), &key)
        .await;
    assert_eq!(none.status, 200, "{}", none.text);
    assert_eq!(none.json(), json!([]));
    let kept = app
        .get(&format!("/api/v1/llm-logs/{}/log-entries", debug.id), &key)
        .await
        .json();
    let messages: Vec<&str> = kept
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(messages, ["first", "second"]);
    assert_eq!(kept[0]["level"], "debug");
    assert_eq!(kept[0]["fields"]["model"], "openai/gpt-4o-mini");
    app.get(
        &format!("/api/v1/llm-logs/{}/log-entries", uuid::Uuid::now_v7()),
        &key,
    )
    .await
    .error(404, "NOT_FOUND");
}

#[tokio::test]
async fn another_tenants_runs_are_not_found_and_never_listed() {
    let app = spawn_app().await;
    let a = app.create_tenant("logs-a").await;
    let b = app.create_tenant("logs-b").await;
    let a_tenant = TenantId::new(a.id.clone());
    let mut parent = run(&a_tenant, Timestamp::now());
    parent.tags = vec!["Team:a".into()];
    parent.customer_external_id = Some("cust-a".into());
    let mut child = run(&a_tenant, Timestamp::now());
    child.parent_id = Some(parent.id.clone());
    child.root_id = parent.id.clone();
    child.depth = 1;
    app.store
        .write_runs(&[parent.clone(), child.clone()], &[])
        .await
        .unwrap();
    app.store
        .write_log_entries(
            &a_tenant,
            &[RunLogEntry {
                id: uuid::Uuid::now_v7().to_string(),
                run_id: parent.id.clone(),
                seq: 0,
                level: "info".into(),
                target: "t".into(),
                message: "a's line".into(),
                fields: json!({}),
                timestamp: Timestamp::now(),
            }],
        )
        .await
        .unwrap();

    for suffix in ["", "/hierarchy", "/events", "/events/stats", "/log-entries"] {
        for id in [&parent.id, &child.id] {
            app.get(&format!("/api/v1/llm-logs/{id}{suffix}"), &b.api_key)
                .await
                .error(404, "NOT_FOUND");
        }
        assert_eq!(
            app.get(
                &format!("/api/v1/llm-logs/{}{suffix}", parent.id),
                &a.api_key
            )
            .await
            .status,
            200
        );
    }
    for query in [
        String::new(),
        format!("parentRequestId={}", parent.id),
        "tags=Team:a".into(),
        "customerId=cust-a".into(),
    ] {
        let page = app
            .get(&format!("/api/v1/llm-logs?{query}"), &b.api_key)
            .await
            .json();
        assert_eq!(page["items"], json!([]), "{query}");
    }
    let a_page = app.get("/api/v1/llm-logs", &a.api_key).await.json();
    assert_eq!(ids(&a_page).len(), 2);
    // A cursor carries no tenant: B following A's position still sees only B's runs.
    let first = app
        .get("/api/v1/llm-logs?pageSize=1", &a.api_key)
        .await
        .json();
    let cursor = first["nextCursor"].as_str().unwrap();
    let page = app
        .get(&format!("/api/v1/llm-logs?cursor={cursor}"), &b.api_key)
        .await
        .json();
    assert_eq!(page["items"], json!([]));
}

/// The capture layer of `baton_server::telemetry`, installed once for the test process.
fn capture_log_lines() {
    let _ = crate::helpers::captured_log();
}

async fn chat_with_level(app: &TestApp, level: Option<&str>) -> crate::helpers::Response {
    let mut body = json!({"model": "openai/gpt-4o-mini",
                          "messages": [{"role": "user", "content": "hi"}]});
    if let Some(level) = level {
        body["x_log_level"] = json!(level);
    }
    crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&app.default_tenant.api_key)
            .json(&body),
    )
    .await
}

/// The run's kept log lines; when `expect_some`, waits for them (they are queued right after the
/// run row, possibly into the writer's next batch).
async fn entries_of(
    app: &TestApp,
    response: &crate::helpers::Response,
    expect_some: bool,
) -> Vec<Value> {
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"].to_str().unwrap();
    crate::chat::wait_for_run(app, id).await;
    let mut lines = Vec::new();
    for _ in 0..100 {
        let read = app
            .get(
                &format!("/api/v1/llm-logs/{id}/log-entries"),
                &app.default_tenant.api_key,
            )
            .await;
        assert_eq!(read.status, 200, "{}", read.text);
        lines = read.json().as_array().unwrap().clone();
        if !expect_some || !lines.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    lines
}

#[tokio::test]
async fn requests_with_a_log_level_keep_their_internal_log_lines() {
    capture_log_lines();
    let (app, _mock) = crate::chat::app_with_mock().await;

    // Above the lines' level, and without a level: nothing is kept. They are sent first: the
    // writer is a queue, so once the debug run's lines are in, theirs would be too.
    let error_level = chat_with_level(&app, Some("Error")).await;
    let no_level = chat_with_level(&app, None).await;
    let debug = chat_with_level(&app, Some("Debug")).await;
    let lines = entries_of(&app, &debug, true).await;
    let answered = lines
        .iter()
        .find(|l| l["message"] == "model chain answered")
        .unwrap_or_else(|| panic!("no routing line in {lines:?}"));
    assert_eq!(answered["level"], "debug");
    assert_eq!(answered["fields"]["attempts"], 1);
    assert_eq!(answered["fields"]["served"], "gpt-4o-mini");
    assert!(
        answered["target"]
            .as_str()
            .unwrap()
            .starts_with("baton_executor")
    );
    assert!(entries_of(&app, &error_level, false).await.is_empty());
    assert!(entries_of(&app, &no_level, false).await.is_empty());

    let bad = chat_with_level(&app, Some("loud")).await;
    bad.error(400, "VALIDATION_ERROR");
    assert_eq!(bad.json()["error"]["param"], "x_log_level");
}

#[tokio::test]
async fn a_debug_flow_run_keeps_the_lines_of_its_model_and_tool_calls() {
    capture_log_lines();
    let s = crate::tools::setup().await;
    let tool = s
        .tool(json!({"name": "echo", "toolType": "External",
                     "webUrl": format!("{}/echo", s.host.origin()),
                     "description": "Echo"}))
        .await;
    let flow = s.empty_flow("Debugged").await;
    s.finish_flow(
        &flow,
        json!({"template": "use the tool", "toolIds": [tool], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.mock
        .push(crate::tools::calls(&[("e1", "echo", json!({"q": "x"}))]));
    s.mock.push(baton_testkit::Reply::text("done"));
    let run = s.run(&flow.0, json!({"isDebug": true}), &[]).await;
    let id = run["id"].as_str().unwrap().to_string();
    crate::chat::wait_for_run(&s.app, &id).await;
    let mut lines = Value::Null;
    for _ in 0..100 {
        lines = s
            .ok(
                reqwest::Method::GET,
                &format!("/api/v1/llm-logs/{id}/log-entries"),
                None,
            )
            .await;
        if lines.as_array().is_some_and(|l| !l.is_empty()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let messages: Vec<&str> = lines
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    for expected in [
        "model call",
        "tool call",
        "tool call finished",
        "model answered",
    ] {
        assert!(
            messages.contains(&expected),
            "{expected} missing from {messages:?}"
        );
    }
    let seqs: Vec<u64> = lines
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "in order");
}

#[tokio::test]
async fn a_full_batch_is_written_without_waiting_for_the_batch_delay() {
    // A minute's delay, one run per batch: the run is logged at once, because its batch is
    // full; with the default batch (256 runs) it would wait the minute.
    let (app, mock) = crate::chat::app_with_mock_and(|config| {
        config.invocation_log.batch_max_runs = 1;
        config.invocation_log.batch_max_delay_ms = 60_000;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::text("logged at once").with_usage(10, 5));
    let response = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini",
                   "messages": [{"role": "user", "content": "Say hi"}]}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"].to_str().unwrap();
    let run = wait_for_run(&app, id).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    app.stop().await;
}

/// A client reading back (or cancelling) the run it was just given the id of finds it, though
/// its row waits in the log writer's batch (a minute here): the miss has the writer write now.
#[tokio::test]
async fn a_run_just_answered_is_found_by_its_id_at_once() {
    let (app, mock) = crate::chat::app_with_mock_and(|config| {
        config.invocation_log.batch_max_delay_ms = 60_000;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::text("answered"));
    let response = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini",
                   "messages": [{"role": "user", "content": "Say hi"}]}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"].to_str().unwrap();
    let run = app.get(&format!("/api/v1/runs/{id}"), &key).await;
    assert_eq!(run.status, 200, "{}", run.text);
    assert_eq!(run.json()["status"], "Succeeded");
    let entry = app.get(&format!("/api/v1/llm-logs/{id}"), &key).await;
    assert_eq!(entry.status, 200, "{}", entry.text);
    // What the run stored, read at once too (each read below comes right after an answer).
    for part in ["hierarchy", "events", "events/stats", "log-entries"] {
        mock.push(Reply::text("answered"));
        let response = app
            .post(
                "/api/v1/chat/completions",
                &key,
                json!({"model": "openai/gpt-4o-mini",
                       "messages": [{"role": "user", "content": "Say hi"}]}),
            )
            .await;
        let id = response.headers["x-request-id"].to_str().unwrap();
        let read = app
            .get(&format!("/api/v1/llm-logs/{id}/{part}"), &key)
            .await;
        assert_eq!(read.status, 200, "{part}: {}", read.text);
    }
    // An id nobody made is still not found (after the writer had nothing to write).
    app.get("/api/v1/runs/no-such-run", &key)
        .await
        .error(404, "NOT_FOUND");
    app.stop().await;
}

/// Inference calls and flow runs queue their run after the reply too (while the writer keeps
/// up): a read of the run straight after the answer still finds it, the miss's flush waiting
/// for the runs promised after their replies.
#[tokio::test]
async fn inference_calls_and_flow_runs_are_found_by_their_id_at_once() {
    let s = crate::tools::setup_with(|config| {
        config.invocation_log.batch_max_delay_ms = 60_000;
    })
    .await;
    let flow = s.empty_flow("Read back").await;
    s.finish_flow(
        &flow,
        json!({"template": "Greet.", "userTemplate": "[[name]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    for round in 0..3 {
        s.mock.push(Reply::text("4"));
        let inference = s
            .ok(
                Method::POST,
                "/api/v1/inference",
                Some(json!({"model": "openai/gpt-4o-mini",
                            "messages": [{"role": "user", "content": "2+2?"}]})),
            )
            .await;
        s.mock.push(Reply::text("Hello, Ada."));
        let run = s
            .ok(
                Method::POST,
                &format!("/api/v1/flows/{}/runs", flow.0),
                Some(json!({"parameters": {"name": "Ada"}})),
            )
            .await;
        for (what, id) in [("inference", &inference["id"]), ("flow run", &run["id"])] {
            let id = id.as_str().unwrap();
            let read = s
                .call(Method::GET, &format!("/api/v1/runs/{id}"), None)
                .await;
            assert_eq!(read.status, 200, "{what}, round {round}: {}", read.text);
            let read = read.json();
            assert_eq!(read["status"], "Succeeded", "{what}: {read}");
            let events = s
                .ok(Method::GET, &format!("/api/v1/llm-logs/{id}/events"), None)
                .await;
            assert_eq!(
                events.as_array().map(Vec::len),
                Some(4),
                "{what}: its lifecycle came with it: {events}"
            );
        }
    }
    s.app.stop().await;
}

#[tokio::test]
async fn with_the_invocation_log_off_requests_succeed_and_nothing_is_written() {
    let (app, mock) = crate::chat::app_with_mock_and(|config| {
        config.invocation_log.enabled = false;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    // Room for one request at a time: a hold that was never given back would refuse the next.
    let budget = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Room for one", "period": "Day", "limitCredits": 1,
                   "hardLimit": true}),
        )
        .await
        .json();
    let budget_id = budget["id"].as_str().unwrap().to_string();
    for _ in 0..3 {
        mock.push(Reply::text("not logged").with_usage(10, 5));
        let response = app
            .post(
                "/api/v1/chat/completions",
                &key,
                json!({"model": "openai/gpt-4o-mini", "max_tokens": 10,
                       "messages": [{"role": "user", "content": "Say hi"}]}),
            )
            .await;
        assert_eq!(response.status, 200, "{}", response.text);
        assert_eq!(
            response.json()["choices"][0]["message"]["content"],
            "not logged"
        );
    }
    mock.push(Reply::text("streamed, not logged"));
    let streamed = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini", "stream": true, "max_tokens": 10,
                   "messages": [{"role": "user", "content": "Say hi"}]}),
        )
        .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    assert!(streamed.text.contains("[DONE]"), "{}", streamed.text);
    // The events format still streams every lifecycle event, though none is stored.
    mock.push(Reply::text("events, not logged"));
    let events = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini", "stream": true, "max_tokens": 10,
                   "stream_options": {"format": "events"},
                   "messages": [{"role": "user", "content": "Say hi"}]}),
        )
        .await;
    assert_eq!(events.status, 200, "{}", events.text);
    for event in [
        "requestStarted",
        "agentInferenceStarted",
        "requestCompleted",
    ] {
        assert!(events.text.contains(event), "{event}: {}", events.text);
    }

    let page = app.get("/api/v1/llm-logs", &key).await.json();
    assert_eq!(page["items"], json!([]), "{page}");
    let budget = app
        .get(&format!("/api/v1/budgets/{budget_id}"), &key)
        .await
        .json();
    assert_eq!(budget["currentPeriod"]["reservedCredits"], 0, "{budget}");
    assert_eq!(budget["currentPeriod"]["spentCredits"], 0, "{budget}");

    // Stopping flushes the log writer: whatever it had queued is in the database now.
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let db = app.stop_keeping_database().await;
    let store = baton_store::Store::connect(&baton_store::StoreOptions::new(db.url()))
        .await
        .unwrap();
    assert!(store.list_runs(&tenant).await.unwrap().is_empty());
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_batch_longer_than_one_statement_is_written_whole() {
    let app = spawn_app().await;
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let key = app.default_tenant.api_key.clone();
    let base = base_time();
    // 450 runs: several statements of runs; 12 events each: 5,400 event rows of 7 columns, more
    // parameters than SQLite binds in one statement (32,766).
    let mut runs: Vec<RunRecord> = (0..450)
        .map(|i| {
            let mut record = run(&tenant, at(base, i));
            record.tags = vec!["Batch:all".into(), format!("Batch:n{}", i % 3)];
            record
        })
        .collect();
    // One run written twice in the batch, pending then finished: the later write wins.
    let twice = runs[10].id.clone();
    let mut pending = runs[10].clone();
    pending.status = RunStatus::Pending;
    pending.completed_at = None;
    runs.insert(5, pending);
    let events: Vec<_> = runs
        .iter()
        .filter(|r| r.status != RunStatus::Pending)
        .flat_map(|r| {
            (0..12).map(|seq| {
                (
                    tenant.clone(),
                    baton_domain::run::StoredEvent {
                        id: uuid::Uuid::now_v7().to_string(),
                        run_id: r.id.clone(),
                        seq,
                        event_type: "toolCompleted".into(),
                        payload: baton_domain::run::RawJson::of(&json!({"seq": seq})),
                        created_at: r.created_at,
                    },
                )
            })
        })
        .collect();
    assert_eq!(events.len(), 5_400);
    app.store.write_runs(&runs, &events).await.unwrap();

    let stored = app.store.list_runs(&tenant).await.unwrap();
    assert_eq!(stored.len(), 450);
    let again = stored.iter().find(|r| r.id == twice).unwrap();
    assert_eq!(again.status, RunStatus::Succeeded);
    let mut event_rows = 0;
    for record in &stored {
        let events = app.store.run_events(&tenant, &record.id).await.unwrap();
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (0..12).collect::<Vec<_>>()
        );
        event_rows += events.len();
    }
    assert_eq!(event_rows, 5_400);
    let tagged = |tag: &str| {
        runs.iter()
            .filter(|r| r.status != RunStatus::Pending && r.tags.iter().any(|t| t == tag))
            .map(|r| r.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        sorted(listed(&app, &key, "tags=Batch:n1").await),
        sorted(tagged("Batch:n1"))
    );

    // A debug run's lines, up to the capture's 5,000 (9 columns each), in one write.
    let lines: Vec<RunLogEntry> = (0..5_000)
        .map(|seq| RunLogEntry {
            id: uuid::Uuid::now_v7().to_string(),
            run_id: twice.clone(),
            seq,
            level: "debug".into(),
            target: "baton_executor".into(),
            message: format!("line {seq}"),
            fields: json!({}),
            timestamp: at(base, 0),
        })
        .collect();
    app.store.write_log_entries(&tenant, &lines).await.unwrap();
    let kept = app.store.run_log_entries(&tenant, &twice).await.unwrap();
    assert_eq!(kept.len(), 5_000);
    assert_eq!(kept.last().unwrap().message, "line 4999");
}
