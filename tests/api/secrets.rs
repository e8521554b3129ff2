//! Secret hygiene (`docs/reliability.md` "Secret hygiene"): canary secrets are seeded (a provider
//! key, tenant API keys, a session token, a user password, a callback token, a stored External
//! tool header, an MCP server header, a budget webhook's signing secret), the service is
//! exercised (successes, provider errors that echo the key, streams, flow runs with tools, debug
//! capture, exports, the log API), and no canary may appear in the server's log output, any
//! response body or header, event streams, the log API, or (for secrets Baton need not keep in
//! clear) the database.

use baton_providers::ProviderConfig;
use baton_testkit::tool_host::ToolHost;
use baton_testkit::{MockMcpServer, MockProvider, Reply};
use reqwest::Method;
use serde_json::{Value, json};

use crate::chat::wait_for_run;
use crate::helpers::{Response, captured_log, send, spawn_app_with};
use crate::tools::{Setup, calls};

const PROVIDER_KEY: &str = "sk-hygiene-canary-provider-7f3a9c";
const PASSWORD: &str = "pw-hygiene-canary-4c0e";
const CALLBACK_TOKEN: &str = "cb-hygiene-canary-token-51d2";
const TOOL_HEADER: &str = "th-hygiene-canary-header-88e1";
const MCP_HEADER: &str = "mcp-hygiene-canary-header-2b7c";

/// Every response the test saw, as text (status line, headers, body).
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    fn keep(&mut self, response: &Response) -> Value {
        let headers: Vec<String> = response
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        self.0.push(format!(
            "{}\n{}\n{}",
            response.status,
            headers.join("\n"),
            response.text
        ));
        serde_json::from_str(&response.text).unwrap_or(Value::Null)
    }
}

#[tokio::test]
async fn no_canary_secret_reaches_logs_responses_events_or_the_database() {
    let log = captured_log();
    let mock = MockProvider::start().await.unwrap();
    let host = ToolHost::start().await.unwrap();
    let mcp =
        MockMcpServer::start_with_required_header("Authorization", &format!("Bearer {MCP_HEADER}"))
            .await;
    let (host_addr, mcp_addr, base) = (host.addr(), mcp.address(), mock.openai_base());
    let app = spawn_app_with(move |config| {
        config.outbound_allowed.push(host_addr);
        config.outbound_allowed.push(mcp_addr);
        config.providers.insert(
            "openai".into(),
            ProviderConfig {
                base_url: Some(base),
                api_key: Some(PROVIDER_KEY.into()),
                ..Default::default()
            },
        );
    })
    .await;
    let s = Setup {
        key: app.default_tenant.api_key.clone(),
        app,
        mock,
        host,
    };
    let mut seen = Seen::default();
    let origin = s.host.origin();

    // A user with a canary password logs in (and fails once with a wrong one).
    let email = "hygiene@example.com";
    baton_server::admin::create_user(&s.app.store, &s.app.default_tenant.name, email, PASSWORD)
        .await
        .unwrap();
    let wrong = s
        .app
        .request(
            Method::POST,
            "/api/v1/auth/login",
            None,
            Some(json!({"email": email, "password": format!("{PASSWORD}-wrong")})),
        )
        .await;
    seen.keep(&wrong);
    let login = s
        .app
        .request(
            Method::POST,
            "/api/v1/auth/login",
            None,
            Some(json!({"email": email, "password": PASSWORD})),
        )
        .await;
    assert_eq!(login.status, 200, "{}", login.text);
    let session = login.json()["accessToken"].as_str().unwrap().to_string();
    // A second API key: shown once in its creation response (not kept), then never again.
    let created = s
        .app
        .post("/api/v1/api-keys", &session, json!({"name": "hygiene"}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let second_key = created.json()["apiKey"].as_str().unwrap().to_string();
    seen.keep(&s.app.get("/api/v1/api-keys", &session).await);
    seen.keep(&s.app.get("/api/v1/environments", &second_key).await);
    seen.keep(
        &s.app
            .get("/api/v1/environments", &format!("{second_key}x"))
            .await,
    );

    // Chat: success with debug capture, a provider error echoing the key, streams.
    let messages = json!([{"role": "user", "content": "hi"}]);
    s.mock.push(Reply::text("fine"));
    let ok = s
        .app
        .post(
            "/api/v1/chat/completions",
            &s.key,
            json!({"model": "openai/gpt-4o-mini", "messages": messages, "x_log_level": "Trace"}),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    seen.keep(&ok);
    s.mock.push(Reply::status(
        401,
        format!("Incorrect API key provided: {PROVIDER_KEY}. Bearer {PROVIDER_KEY}"),
    ));
    let echoed = s
        .app
        .post(
            "/api/v1/chat/completions",
            &s.key,
            json!({"model": "openai/gpt-4o-mini", "messages": messages, "x_log_level": "Debug"}),
        )
        .await;
    assert!(echoed.status.is_client_error() || echoed.status.is_server_error());
    assert!(
        echoed.text.contains("Incorrect API key provided"),
        "{}",
        echoed.text
    );
    seen.keep(&echoed);
    s.mock.push(Reply::text("streamed"));
    seen.keep(
        &s.app
            .post(
                "/api/v1/chat/completions",
                &s.key,
                json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true}),
            )
            .await,
    );
    s.mock
        .push(Reply::status(500, format!("upstream saw {PROVIDER_KEY}")));
    seen.keep(
        &s.app
            .post(
                "/api/v1/chat/completions",
                &s.key,
                json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true,
                       "stream_options": {"format": "events"}}),
            )
            .await,
    );

    // An error event inside a stream that echoes the key (after the 200 and some content).
    s.mock.push(Reply::Raw(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"half\"}},\"finish_reason\":null}}]}}\n\n\
         data: {{\"error\":{{\"message\":\"mid-stream: upstream saw {PROVIDER_KEY}\"}}}}\n\n"
    )));
    let in_stream = s
        .app
        .post(
            "/api/v1/chat/completions",
            &s.key,
            json!({"model": "openai/gpt-4o-mini", "messages": messages, "stream": true}),
        )
        .await;
    assert!(
        in_stream
            .text
            .contains("mid-stream: upstream saw [redacted]"),
        "{}",
        in_stream.text
    );
    seen.keep(&in_stream);

    // Flow runs with a header-carrying External tool and a caller-hosted tool with a token.
    s.set_origins(json!([origin])).await;
    let fixed = s
        .tool(json!({"name": "fixed", "toolType": "External",
                     "webUrl": format!("{origin}/sleep?ms=1"),
                     "headers": {"Authorization": format!("Bearer {TOOL_HEADER}")}}))
        .await;
    let hosted = s
        .tool(json!({"name": "hosted", "toolType": "External", "webUrl": "/sleep?ms=1"}))
        .await;
    let (sid, imported) = s
        .import_mcp(
            json!({"name": "calc", "url": mcp.url(),
                   "headers": {"Authorization": format!("Bearer {MCP_HEADER}")}}),
            &["add"],
        )
        .await;
    let flow = s
        .flow(
            "Hygiene",
            json!({"template": "t", "llm": "openai/gpt-4o-mini",
                   "toolIds": [fixed, hosted, imported[0].0]}),
        )
        .await;
    let headers = [
        ("X-Baton-Callback-Url", origin.as_str()),
        ("X-Baton-Callback-Token", CALLBACK_TOKEN),
    ];
    let mut run_ids = Vec::new();
    for stream in [false, true] {
        s.mock.push(calls(&[
            ("c1", "fixed", json!({})),
            ("c2", "hosted", json!({})),
            ("c3", "add", json!({"a": 1, "b": 2})),
        ]));
        s.mock.push(Reply::text("done"));
        let mut request = s
            .app
            .client
            .post(s.app.url(&format!("/api/v1/flows/{flow}/runs")))
            .bearer_auth(&s.key)
            .json(&json!({"stream": stream, "isDebug": true,
                          "stream_options": {"include_tool_results": true}}));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let response = send(request).await;
        assert_eq!(response.status, 200, "{}", response.text);
        seen.keep(&response);
        let id = response.headers["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        run_ids.push(id);
    }
    // The secrets were used: the tool host saw the header and the token, the MCP server its header.
    let host_saw = s.host.requests();
    let bearer = format!("Bearer {TOOL_HEADER}");
    assert!(
        host_saw
            .iter()
            .any(|r| r.header("authorization") == Some(bearer.as_str()))
    );
    assert!(
        host_saw
            .iter()
            .any(|r| r.header("x-tool-token") == Some(CALLBACK_TOKEN))
    );
    assert!(!mcp.calls().is_empty());
    let bearer = format!("Bearer {PROVIDER_KEY}");
    assert!(
        s.mock
            .received()
            .iter()
            .all(|r| r.headers["authorization"] == bearer.as_str()),
        "the provider key was sent with every call"
    );

    // Reading back: tools, MCP servers, export, budgets, the log API.
    let budget = s
        .app
        .post(
            "/api/v1/budgets",
            &s.key,
            json!({"name": "b", "period": "Day", "limitCredits": 1000000,
                   "webhookUrl": "https://hooks.example.com/baton"}),
        )
        .await;
    assert_eq!(budget.status, 201, "{}", budget.text);
    let webhook_secret = budget.json()["webhookSecret"].as_str().unwrap().to_string();
    for path in [
        "/api/v1/tools".to_string(),
        format!("/api/v1/tools/{fixed}"),
        "/api/v1/mcp-servers".to_string(),
        format!("/api/v1/mcp-servers/{sid}"),
        "/api/v1/export".to_string(),
        "/api/v1/budgets".to_string(),
        "/api/v1/settings".to_string(),
    ] {
        seen.keep(&s.app.get(&path, &s.key).await);
    }
    for id in &run_ids {
        wait_for_run(&s.app, id).await;
    }
    let page = seen.keep(&s.app.get("/api/v1/llm-logs?pageSize=100", &s.key).await);
    let ids: Vec<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.len() >= 6, "{page}");
    for id in &ids {
        for suffix in ["", "/events", "/log-entries", "/hierarchy"] {
            seen.keep(
                &s.app
                    .get(&format!("/api/v1/llm-logs/{id}{suffix}"), &s.key)
                    .await,
            );
        }
        seen.keep(&s.app.get(&format!("/api/v1/runs/{id}"), &s.key).await);
    }

    let tool = s
        .ok(Method::GET, &format!("/api/v1/tools/{fixed}"), None)
        .await;
    assert_eq!(tool["headers"]["Authorization"], "********");
    let tenant_key = s.key.clone();
    let log_text = {
        let bytes = log.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    assert!(
        log_text.contains("chat/completions"),
        "the server's log was captured"
    );
    let dump = s.app.db.dump();
    let responses = seen.0.join("\n");
    // Never anywhere, the database included (only hashes or prefixes are kept).
    for secret in [
        PROVIDER_KEY,
        PASSWORD,
        CALLBACK_TOKEN,
        tenant_key.as_str(),
        second_key.as_str(),
        session.as_str(),
    ] {
        assert!(!responses.contains(secret), "{secret} in a response");
        assert!(!log_text.contains(secret), "{secret} in the log output");
        assert!(!dump.contains(secret), "{secret} in the database");
    }
    // Kept in the database because Baton must send them, but never shown or logged.
    for secret in [TOOL_HEADER, MCP_HEADER, webhook_secret.as_str()] {
        assert!(!responses.contains(secret), "{secret} in a response");
        assert!(!log_text.contains(secret), "{secret} in the log output");
    }
}

/// External tool headers are shown redacted; sending the redacted value back keeps the stored
/// one (the tool host still gets it), a new value replaces it.
#[tokio::test]
async fn tool_header_values_are_redacted_and_kept_on_update() {
    let s = crate::tools::setup().await;
    let url = format!("{}/sleep?ms=1", s.host.origin());
    let id = s
        .tool(
            json!({"name": "fixed", "toolType": "External", "webUrl": url,
                     "headers": {"X-Api-Key": TOOL_HEADER}}),
        )
        .await;
    let listed = s.ok(Method::GET, "/api/v1/tools", None).await;
    assert_eq!(listed[0]["headers"]["X-Api-Key"], "********");
    let export = s.ok(Method::GET, "/api/v1/export", None).await;
    assert!(!export.to_string().contains(TOOL_HEADER));
    // Under another case too (header names ignore it).
    let updated = s
        .ok(
            Method::PUT,
            &format!("/api/v1/tools/{id}"),
            Some(
                json!({"name": "fixed", "toolType": "External", "webUrl": url,
                        "description": "changed", "headers": {"x-api-key": "********"}}),
            ),
        )
        .await;
    assert_eq!(updated["headers"]["x-api-key"], "********");
    // Not for another host: whoever edits the tool could collect the key there.
    for moved in [
        json!({"webUrl": "https://collector.example.com/hook"}),
        json!({"webUrl": url, "webUrls": {"staging": "https://collector.example.com/hook"}}),
        // A host a run fills in, or the caller's: not one the secret was given for.
        json!({"webUrl": "http://[[host]]/hook"}),
        json!({"webUrl": "/hook"}),
    ] {
        let mut body = json!({"name": "fixed", "toolType": "External",
                              "headers": {"X-Api-Key": "********"}});
        body.as_object_mut()
            .unwrap()
            .extend(moved.as_object().unwrap().clone());
        let refused = s
            .call(Method::PUT, &format!("/api/v1/tools/{id}"), Some(body))
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(refused["param"], "headers.X-Api-Key", "{moved}");
    }
    let flow = s
        .flow(
            "Keyed",
            json!({"template": "t", "toolIds": [id], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[("c1", "fixed", json!({}))]));
    s.mock.push(Reply::text("done"));
    s.run(&flow, json!({}), &[]).await;
    assert_eq!(
        s.host.requests().last().unwrap().header("x-api-key"),
        Some(TOOL_HEADER),
        "the stored value was kept"
    );
    s.ok(
        Method::PUT,
        &format!("/api/v1/tools/{id}"),
        Some(
            json!({"name": "fixed", "toolType": "External", "webUrl": url,
                    "headers": {"X-Api-Key": "new-value"}}),
        ),
    )
    .await;
    s.mock.push(calls(&[("c1", "fixed", json!({}))]));
    s.mock.push(Reply::text("done"));
    s.run(&flow, json!({}), &[]).await;
    assert_eq!(
        s.host.requests().last().unwrap().header("x-api-key"),
        Some("new-value")
    );
}
