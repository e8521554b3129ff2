//! Abuse limits (`[limits]`, `docs/reliability.md` "Abuse limits"): body size on every kind of
//! route, message count, tool result size, stream lifetime, agent fan-out per turn and open
//! streams per tenant, each on the real server with its error shape and what was (not) recorded.

use std::time::Duration;

use baton_providers::ProviderConfig;
use baton_testkit::{FastMock, FastMockOptions};
use baton_testkit::{MockMcpServer, Reply};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::chat::wait_for_run;
use crate::helpers::{TestApp, send, spawn_app_with};
use crate::tools::{calls, setup_with, tool_messages};

/// An app whose `openai` provider streams `chunks` content chunks `gap` apart (a long stream).
async fn app_with_slow_stream(
    chunks: usize,
    gap: Duration,
    extra: impl FnOnce(&mut baton_server::config::Config),
) -> (TestApp, FastMock) {
    let fast = FastMock::start(FastMockOptions {
        delay: Duration::ZERO,
        stream_chunks: chunks,
        chunk_gap: gap,
    })
    .await
    .unwrap();
    let base = fast.openai_base();
    let app = spawn_app_with(move |config| {
        config.providers.insert(
            "openai".into(),
            ProviderConfig {
                base_url: Some(base),
                api_key: Some("sk-limits-test".into()),
                ..Default::default()
            },
        );
        extra(config);
    })
    .await;
    (app, fast)
}

fn data_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

fn envelopes(text: &str) -> Vec<Value> {
    data_lines(text)
        .into_iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

async fn log_count(app: &TestApp, key: &str) -> usize {
    app.get("/api/v1/llm-logs", key).await.json()["items"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_on_chat_streams_runs_inference_and_mcp() {
    let s = setup_with(|config| config.server.max_body_bytes = 16 * 1024).await;
    let flow = s
        .flow(
            "Plain",
            json!({"template": "t", "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    let big = "x".repeat(32 * 1024);
    let messages = json!([{"role": "user", "content": big}]);
    for (path, body) in [
        (
            "/api/v1/chat/completions".to_string(),
            json!({"model": "openai/gpt-4o-mini", "messages": messages}),
        ),
        (
            "/api/v1/chat/completions".to_string(),
            json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true}),
        ),
        (
            format!("/api/v1/flows/{flow}/runs"),
            json!({"parameters": {"p": big}}),
        ),
        (
            format!("/api/v1/flows/{flow}/runs"),
            json!({"parameters": {"p": big}, "stream": true}),
        ),
        (
            "/api/v1/inference".to_string(),
            json!({"model": "openai/gpt-4o-mini", "messages": messages}),
        ),
    ] {
        let response = s.app.post(&path, &s.key, body).await;
        response.error(413, "PAYLOAD_TOO_LARGE");
    }
    // Baton's own MCP server: a JSON-RPC call carrying a large argument.
    let mcp = send(
        s.app
            .client
            .post(s.app.url("/api/v1/mcp"))
            .bearer_auth(&s.key)
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "run_flow", "arguments": {"flowId": flow, "parameters": {"p": big}}}})),
    )
    .await;
    mcp.error(413, "PAYLOAD_TOO_LARGE");
    assert!(s.mock.received().is_empty(), "no provider was called");
    assert_eq!(log_count(&s.app, &s.key).await, 0, "nothing was logged");
}

#[tokio::test]
async fn too_many_messages_is_a_validation_error_naming_messages() {
    let s = setup_with(|config| config.limits.max_messages = 3).await;
    let message = json!({"role": "user", "content": "hi"});
    let four = json!([message, message, message, message]);
    for (path, body) in [
        (
            "/api/v1/chat/completions",
            json!({"model": "openai/gpt-4o-mini", "messages": four}),
        ),
        (
            "/api/v1/chat/completions",
            json!({"model": "openai/gpt-4o-mini", "messages": four, "stream": true}),
        ),
        (
            "/api/v1/inference",
            json!({"model": "openai/gpt-4o-mini", "messages": four}),
        ),
    ] {
        let error = s
            .app
            .post(path, &s.key, body)
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], "messages");
        assert!(
            error["message"].as_str().unwrap().contains("at most 3"),
            "{error}"
        );
    }
    assert!(s.mock.received().is_empty(), "no provider was called");
    assert_eq!(log_count(&s.app, &s.key).await, 0, "nothing was logged");
    // At the bound, the request runs.
    s.mock.push(Reply::text("fine"));
    let three = json!([message, message, message]);
    let ok = s
        .app
        .post(
            "/api/v1/chat/completions",
            &s.key,
            json!({"model": "openai/gpt-4o-mini", "messages": three}),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
}

#[tokio::test]
async fn tool_results_over_the_limit_fail_the_call_and_the_run_goes_on() {
    const LIMIT: usize = 64 * 1024;
    let mcp = MockMcpServer::start().await;
    let mcp_addr = mcp.address();
    let s = setup_with(move |config| {
        config.limits.max_tool_result_bytes = LIMIT;
        config.outbound_allowed.push(mcp_addr);
    })
    .await;
    let origin = s.host.origin();
    s.set_origins(json!([origin])).await;
    let fixed = s
        .sized_tool("fixed", &format!("{origin}/big-chunked"))
        .await;
    let declared = s.sized_tool("declared", &format!("{origin}/big")).await;
    let hosted = s.sized_tool("hosted", "/big-chunked").await;
    let (_, imported) = s
        .import_mcp(json!({"name": "mock", "url": mcp.url()}), &["big"])
        .await;
    let flow = s
        .flow(
            "Big results",
            json!({"template": "t", "llm": "openai/gpt-4o-mini",
                   "toolIds": [fixed, declared, hosted, imported[0].0]}),
        )
        .await;
    let ten_mb = json!({"bytes": 10 * 1024 * 1024});
    s.mock.push(calls(&[
        ("c1", "fixed", ten_mb.clone()),
        ("c2", "declared", ten_mb.clone()),
        ("c3", "hosted", ten_mb.clone()),
        ("c4", "big", json!({"bytes": 2 * LIMIT})),
        ("c5", "fixed", json!({"bytes": 1000})),
    ]));
    s.mock.push(Reply::text("some tools failed"));
    let run = s
        .run(&flow, json!({}), &[("X-Baton-Callback-Url", &origin)])
        .await;
    assert_eq!(run["status"], "Succeeded");
    assert_eq!(run["output"]["text"], "some tools failed");
    let statuses: Vec<&str> = run["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses.iter().filter(|s| **s == "failed").count(), 4);
    assert_eq!(statuses.iter().filter(|s| **s == "succeeded").count(), 1);
    // The model was told why, per call, in call order.
    let told = tool_messages(&s.mock, 1);
    for message in &told[..4] {
        let text = message["content"].as_str().unwrap();
        assert!(
            text.starts_with("Error:") && text.contains(&format!("limit of {LIMIT} bytes")),
            "{text}"
        );
    }
    assert_eq!(told[4]["content"].as_str().unwrap().len(), 1000);
    // The log has the failures with the same message.
    let logged = wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    let failed: Vec<_> = logged
        .tool_calls
        .iter()
        .filter(|c| c.status == "failed")
        .collect();
    assert_eq!(failed.len(), 4);
    assert!(
        failed
            .iter()
            .all(|c| c.error.as_deref().unwrap().contains("limit of"))
    );
}

#[tokio::test]
async fn one_turn_starts_at_most_the_configured_number_of_sub_agents() {
    let s = setup_with(|config| config.limits.max_agent_calls_per_turn = 2).await;
    let child = s.empty_flow("Helper").await;
    let helper = s.agent_tool("helper", &child.0, None).await;
    s.finish_flow(
        &child,
        json!({"template": "You help.", "userTemplate": "[[input]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    let flow = s
        .flow(
            "Fan out",
            json!({"template": "t", "toolIds": [helper], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[
        ("c1", "helper", json!({"input": "a"})),
        ("c2", "helper", json!({"input": "b"})),
        ("c3", "helper", json!({"input": "c"})),
    ]));
    s.mock.push(Reply::text("child a"));
    s.mock.push(Reply::text("child b"));
    s.mock.push(Reply::text("done"));
    let run = s.run(&flow, json!({}), &[]).await;
    assert_eq!(run["status"], "Succeeded");
    assert_eq!(run["output"]["text"], "done");
    // Two children ran, the third call failed without a child request.
    let by_id = |id: &str| -> Value {
        run["toolCalls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["callId"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(by_id("c1")["status"], "succeeded");
    assert_eq!(by_id("c2")["status"], "succeeded");
    assert_eq!(by_id("c3")["status"], "failed");
    assert!(by_id("c3")["childRequestId"].is_null());
    assert_eq!(s.mock.received().len(), 4, "parent twice, two children");
    let told = tool_messages(&s.mock, 3);
    let third = told[2]["content"].as_str().unwrap();
    assert!(
        third.contains("AGENT_FANOUT_EXCEEDED") && third.contains("at most 2"),
        "{third}"
    );
    let logged = wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    let children = logged
        .tool_calls
        .iter()
        .filter(|c| c.child_request_id.is_some())
        .count();
    assert_eq!(children, 2);
}

#[tokio::test]
async fn streams_end_with_an_error_event_at_their_maximum_duration() {
    // 400 chunks 25 ms apart: ten seconds of stream against a one-second bound.
    let (app, _fast) = app_with_slow_stream(400, Duration::from_millis(25), |config| {
        config.limits.max_stream_duration_secs = 1;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    let messages = json!([{"role": "user", "content": "hi"}]);

    // Chunks format: an error chunk in the DESIGN.md error shape, then [DONE].
    let chunks = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true}),
        )
        .await;
    assert_eq!(chunks.status, 200);
    let data = data_lines(&chunks.text);
    assert_eq!(data.last(), Some(&"[DONE]"));
    let error: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "STREAM_DURATION_EXCEEDED");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 seconds")
    );
    let id = chunks.headers["x-request-id"].to_str().unwrap().to_string();
    let logged = wait_for_run(&app, &id).await;
    assert_eq!(
        logged.error_code.as_deref(),
        Some("STREAM_DURATION_EXCEEDED")
    );
    let response = logged.response.as_ref().unwrap().to_value();
    let text = response["text"].as_str().unwrap();
    assert!(!text.is_empty(), "what was streamed is kept");

    // Events format: an `error` event (not recoverable), then requestCompleted, then [DONE].
    let events = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true,
                   "stream_options": {"format": "events"}}),
        )
        .await;
    assert_eq!(events.status, 200);
    assert!(events.text.trim_end().ends_with("data: [DONE]"));
    let envelopes = envelopes(&events.text);
    let error = envelopes.iter().find(|e| e["type"] == "error").unwrap();
    assert_eq!(error["data"]["code"], "STREAM_DURATION_EXCEEDED");
    assert_eq!(error["data"]["recoverable"], false);
    assert_eq!(envelopes.last().unwrap()["type"], "requestCompleted");
    let id = events.headers["x-request-id"].to_str().unwrap().to_string();
    let logged = wait_for_run(&app, &id).await;
    assert_eq!(
        logged.error_code.as_deref(),
        Some("STREAM_DURATION_EXCEEDED")
    );
}

#[tokio::test]
async fn a_streamed_tool_run_past_its_duration_ends_the_stream_and_the_run_goes_on() {
    let s = setup_with(|config| config.limits.max_stream_duration_secs = 1).await;
    let nap = s
        .tool(json!({"name": "nap", "toolType": "External",
                     "webUrl": format!("{}/sleep", s.host.origin()),
                     "parameters": {"type": "Object", "properties": [{"name": "ms", "type": "Integer", "required": true}]}}))
        .await;
    let flow = s
        .flow(
            "Sleepy",
            json!({"template": "t", "toolIds": [nap], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[("c1", "nap", json!({"ms": 2500}))]));
    s.mock.push(Reply::text("rested"));
    let response = s
        .app
        .post(
            &format!("/api/v1/flows/{flow}/runs"),
            &s.key,
            json!({"stream": true}),
        )
        .await;
    assert_eq!(response.status, 200);
    assert!(response.text.trim_end().ends_with("data: [DONE]"));
    let envelopes = envelopes(&response.text);
    let last = envelopes.last().unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["data"]["code"], "STREAM_DURATION_EXCEEDED");
    assert!(
        envelopes.iter().all(|e| e["type"] != "requestCompleted"),
        "the stream ended before the run"
    );
    // The run itself finished and was logged, like one whose client left.
    let run_id = last["requestId"].as_str().unwrap().to_string();
    let logged = wait_for_run(&s.app, &run_id).await;
    assert_eq!(
        logged.response.as_ref().unwrap().to_value()["text"],
        "rested"
    );
    assert_eq!(logged.tool_calls[0].status, "succeeded");
}

#[tokio::test]
async fn open_streams_per_tenant_are_bounded_and_released_on_disconnect() {
    // Long streams: 400 chunks 50 ms apart.
    let (app, _fast) = app_with_slow_stream(400, Duration::from_millis(50), |config| {
        config.limits.max_streams_per_tenant = 1;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    let other = app.create_tenant("other").await;
    let body = json!({"model": "openai/gpt-4o-mini", "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let open = app
        .client
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
    let mut first = open.bytes_stream();
    assert!(first.next().await.is_some(), "the stream started");
    let before = log_count(&app, &key).await;

    // The next stream of the same tenant is refused, before anything runs.
    let refused = app
        .post("/api/v1/chat/completions", &key, body.clone())
        .await;
    refused.error(429, "RATE_LIMITED");
    assert!(refused.headers.contains_key("retry-after"));
    let flow_stream = app
        .post(
            "/api/v1/flows/no-such-flow/runs",
            &key,
            json!({"stream": true}),
        )
        .await;
    flow_stream.error(429, "RATE_LIMITED");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        log_count(&app, &key).await,
        before,
        "refused streams record nothing"
    );
    // Non-streamed requests and other tenants are not affected.
    let other_stream = app
        .client
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(&other.api_key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(other_stream.status(), 200);
    drop(other_stream);

    // The client goes away: its slot comes back once the server notices.
    drop(first);
    let mut reopened = None;
    for _ in 0..100 {
        let response = app
            .client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            reopened = Some(response);
            break;
        }
        assert_eq!(response.status(), 429);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reopened = reopened.expect("the slot was released after the disconnect");
    drop(reopened);
}
