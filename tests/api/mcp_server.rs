//! Baton's own MCP server (`/api/v1/mcp`), driven by rmcp's Streamable HTTP client: the tools,
//! tenant isolation, cancellation mid-tree through `cancel_run`, and the transport's guards.

use reqwest::Method;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::chat::wait_for_run;
use crate::helpers::TestApp;
use crate::tools::{Setup, calls, events_of, setup};
use baton_testkit::Reply;

type Client = RunningService<RoleClient, ClientConfig>;

async fn connect(app: &TestApp, key: &str) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(app.url("/api/v1/mcp"))
        .auth_header(key.to_string());
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("baton-tests", "0"),
    )
    .serve(transport)
    .await
    .expect("MCP initialize")
}

/// Calls a tool; returns whether it reported an error, and its structured content.
async fn call(client: &Client, tool: &str, arguments: Value) -> (bool, Value) {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let content = result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("{tool} answered no structured content: {result:?}"));
    (result.is_error.unwrap_or(false), content)
}

async fn ok(client: &Client, tool: &str, arguments: Value) -> Value {
    let (is_error, content) = call(client, tool, arguments).await;
    assert!(!is_error, "{tool} failed: {content}");
    content
}

/// The DESIGN.md error body of a failed tool call.
async fn tool_error(client: &Client, tool: &str, arguments: Value, code: &str) -> Value {
    let (is_error, content) = call(client, tool, arguments).await;
    assert!(is_error, "{tool} succeeded: {content}");
    assert_eq!(content["error"]["code"], code, "{content}");
    assert!(content["error"]["requestId"].is_string(), "{content}");
    content["error"].clone()
}

/// Waits until `condition` holds, polling (the run log is written off the request path).
async fn eventually(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if condition().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

impl Setup {
    /// A flow whose template calls the host's `sleep` tool, active in `production`.
    async fn sleeper(&self, title: &str, ms: u64) -> String {
        let nap = self
            .tool(
                json!({"name": format!("nap_{}", title.to_lowercase()), "toolType": "External",
                         "webUrl": format!("{}/sleep?ms={ms}", self.host.origin())}),
            )
            .await;
        self.flow(
            title,
            json!({"template": "w [[input]]", "toolIds": [nap], "llm": "openai/gpt-4o-mini"}),
        )
        .await
    }

    async fn tenant_run(&self, id: &str) -> Option<baton_domain::run::RunRecord> {
        let tenant = baton_store::TenantId::new(self.app.default_tenant.id.clone());
        self.app.store.get_run(&tenant, id).await.ok()
    }
}

#[tokio::test]
async fn the_tools_are_listed_and_do_what_their_rest_routes_do() {
    let s = setup().await;
    let client = connect(&s.app, &s.key).await;
    let info = client.peer_info().expect("server info");
    assert_eq!(info.server_info.as_ref().unwrap().name, "baton");
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "cancel_all_runs",
            "cancel_run",
            "get_run",
            "list_flows",
            "run_flow"
        ]
    );
    let run_flow = tools.iter().find(|t| t.name == "run_flow").unwrap();
    let properties = run_flow.input_schema["properties"].as_object().unwrap();
    for name in [
        "flowId",
        "parameters",
        "environment",
        "overrideModel",
        "tags",
        "customerId",
    ] {
        assert!(properties.contains_key(name), "run_flow lacks {name}");
    }
    assert_eq!(run_flow.input_schema["required"], json!(["flowId"]));

    // A flow whose template calls a caller-hosted tool through the callback origin.
    let origin = s.host.origin();
    s.set_origins(json!([origin.clone()])).await;
    let lookup = s
        .tool(json!({"name": "lookup", "toolType": "External", "webUrl": "/echo"}))
        .await;
    let flow = s
        .flow(
            "Greeter",
            json!({"template": "Greet [[name]].", "toolIds": [lookup], "llm": "openai/gpt-4o-mini"}),
        )
        .await;

    let listed = ok(&client, "list_flows", json!({})).await;
    let flows = listed["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0]["name"], flow);
    assert!(flows[0]["activeVersions"]["production"].is_string());

    // run_flow: the synchronous flow run response; the X-Baton-* headers of the MCP request
    // count as on REST (here the callback origin).
    let with_callback = {
        let mut headers = std::collections::HashMap::new();
        headers.insert(
            "x-baton-callback-url".parse().unwrap(),
            origin.parse().unwrap(),
        );
        let config = StreamableHttpClientTransportConfig::with_uri(s.app.url("/api/v1/mcp"))
            .auth_header(s.key.clone())
            .custom_headers(headers);
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("baton-tests", "0"),
        )
        .serve(StreamableHttpClientTransport::with_client(
            reqwest::Client::new(),
            config,
        ))
        .await
        .unwrap()
    };
    s.mock.push(calls(&[("c1", "lookup", json!({}))]));
    s.mock.push(Reply::text("Hello, Ada."));
    let run = ok(
        &with_callback,
        "run_flow",
        json!({"flowId": flow, "parameters": {"name": "Ada"}, "tags": ["Team:mcp"],
               "customerId": "cust-mcp", "environment": "production"}),
    )
    .await;
    assert_eq!(run["status"], "Succeeded", "{run}");
    assert_eq!(run["output"]["text"], "Hello, Ada.");
    assert_eq!(run["flowName"], flow);
    assert_eq!(run["servedModel"], "openai/gpt-4o-mini");
    assert!(run["usage"]["totalCreditsUsed"].as_i64().unwrap() > 0);
    assert_eq!(run["toolCalls"][0]["originSource"], "callback");
    let system = &s.mock.received()[0].body["messages"][0]["content"];
    assert_eq!(system, "Greet Ada.");

    // get_run: the same record as GET /api/v1/runs/{runId}.
    let run_id = run["id"].as_str().unwrap().to_string();
    let logged = wait_for_run(&s.app, &run_id).await;
    assert_eq!(logged.tags, ["Team:mcp"]);
    assert_eq!(logged.customer_external_id.as_deref(), Some("cust-mcp"));
    let record = ok(&client, "get_run", json!({"runId": run_id})).await;
    let rest = s
        .ok(Method::GET, &format!("/api/v1/runs/{run_id}"), None)
        .await;
    assert_eq!(record, rest);
    assert_eq!(record["callbackOrigin"], origin);
    let call = &record["toolCalls"][0];
    assert_eq!(call["targetUrl"], format!("{origin}/echo"));
    assert_eq!(call["originSource"], "callback");

    // Errors name their cause.
    let missing = tool_error(
        &client,
        "get_run",
        json!({"runId": "no-such-run"}),
        "NOT_FOUND",
    )
    .await;
    assert!(missing["message"].as_str().unwrap().contains("no-such-run"));
    tool_error(
        &client,
        "run_flow",
        json!({"flowId": "no-such-flow"}),
        "NOT_FOUND",
    )
    .await;
    let invalid = tool_error(
        &client,
        "run_flow",
        json!({"flowId": flow, "tags": [":no-key"]}),
        "VALIDATION_ERROR",
    )
    .await;
    assert_eq!(invalid["param"], "tags");
    let finished = tool_error(&client, "cancel_run", json!({"runId": run_id}), "CONFLICT").await;
    assert!(finished["message"].as_str().unwrap().contains("finished"));
    // Malformed arguments are refused before the tool runs, naming the field.
    let unknown = client
        .call_tool(
            CallToolRequestParams::new("get_run")
                .with_arguments(json!({"run": "x"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(unknown.is_error, Some(true));
    let told = format!("{:?}", unknown.content);
    assert!(told.contains("runId"), "{told}");
    // Operations without arguments refuse any (a typo is told, not ignored).
    for tool in ["list_flows", "cancel_all_runs"] {
        let extra = client
            .call_tool(
                CallToolRequestParams::new(tool)
                    .with_arguments(json!({"flowId": "x"}).as_object().unwrap().clone()),
            )
            .await
            .unwrap();
        assert_eq!(extra.is_error, Some(true), "{tool}");
        let told = format!("{:?}", extra.content);
        assert!(told.contains("flowId"), "{tool}: {told}");
    }
    let bare = client
        .call_tool(CallToolRequestParams::new("list_flows"))
        .await
        .unwrap();
    assert_ne!(bare.is_error, Some(true), "no arguments at all: {bare:?}");
    assert_eq!(s.mock.received().len(), 2, "failed calls reached no model");
}

#[tokio::test]
async fn another_tenants_runs_are_not_found_and_never_cancelled() {
    let s = setup().await;
    let flow = s
        .flow(
            "Private",
            json!({"template": "t", "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(Reply::text("secret answer"));
    let run = s.run(&flow, json!({}), &[]).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    wait_for_run(&s.app, &run_id).await;

    let other = s.app.create_tenant("other").await;
    let client = connect(&s.app, &other.api_key).await;
    for tool in ["get_run", "cancel_run"] {
        let error = tool_error(&client, tool, json!({"runId": run_id}), "NOT_FOUND").await;
        assert!(!error.to_string().contains("secret answer"));
    }
    let listed = ok(&client, "list_flows", json!({})).await;
    assert_eq!(listed["flows"], json!([]));
    tool_error(&client, "run_flow", json!({"flowId": flow}), "NOT_FOUND").await;
    let none = ok(&client, "cancel_all_runs", json!({})).await;
    assert_eq!(none, json!({"count": 0, "runIds": []}));
    assert!(
        s.tenant_run(&run_id)
            .await
            .unwrap()
            .cancel_requested_at
            .is_none()
    );
}

/// SPEC.md "Run": cancel_run mid-tree stops the children, lets the in-flight call complete
/// and bills it; the stream ends with `error` RUN_CANCELLED, then `requestCompleted`.
#[tokio::test]
async fn cancel_run_stops_a_whole_tree_and_keeps_what_was_produced() {
    let s = setup().await;
    let child = s.sleeper("Sleeper", 1500).await;
    let worker = s
        .tool(
            json!({"name": "worker", "toolType": "Agent", "agentTemplateId": child,
                     "description": "Ask the worker"}),
        )
        .await;
    let root = s
        .flow(
            "Manager",
            json!({"template": "t", "toolIds": [worker], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock
        .push(calls(&[("w", "worker", json!({"input": "sleep"}))]));
    s.mock.push(calls(&[("n", "nap_sleeper", json!({}))]));
    s.mock.push(Reply::text("never asked"));
    let client = connect(&s.app, &s.key).await;
    let (response, run_id) = s.start_run_stream(&root, json!({"stream": true})).await;
    // Cancel while the child's tool call is in flight.
    eventually("the child's tool call started", async || {
        s.host.requests().len() == 1
    })
    .await;
    eventually("the root run is logged as running", async || {
        s.tenant_run(&run_id).await.is_some()
    })
    .await;
    let cancelled = ok(&client, "cancel_run", json!({"runId": run_id})).await;
    assert_eq!(cancelled["id"], run_id);
    assert!(cancelled["cancelRequestedAt"].is_string(), "{cancelled}");
    assert!(
        cancelled["cancelRequestedBy"]
            .as_str()
            .unwrap()
            .starts_with("apiKey:")
    );

    let events = events_of(&response.text().await.unwrap());
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let error = types
        .iter()
        .position(|t| *t == "error")
        .expect("an error event");
    assert_eq!(events[error]["data"]["code"], "RUN_CANCELLED");
    assert_eq!(types.last(), Some(&"requestCompleted"), "{types:?}");
    assert!(error < types.len() - 1);
    // The in-flight tool call finished; no model call was made after the cancel.
    assert_eq!(s.mock.received().len(), 2);
    assert_eq!(s.host.requests().len(), 1);

    let root_run = wait_for_run(&s.app, &run_id).await;
    assert!(root_run.cancel_requested_at.is_some());
    assert!(root_run.cancelled_at.is_some());
    assert_eq!(root_run.status, baton_domain::run::RunStatus::Succeeded);
    assert!(root_run.warnings.iter().any(|w| w.code == "Cancelled"));
    assert!(root_run.cost_credits > 0, "what was produced is billed");
    let child_id = root_run.tool_calls[0].child_request_id.clone().unwrap();
    let child_run = wait_for_run(&s.app, &child_id).await;
    assert!(
        child_run.cancelled_at.is_some(),
        "the sub-agent stopped too"
    );
    assert!(
        child_run.cost_credits > 0,
        "the child's model call is billed"
    );

    // get_run shows the flags; a finished run cannot be cancelled again.
    let record = ok(&client, "get_run", json!({"runId": run_id})).await;
    assert!(record["cancelledAt"].is_string(), "{record}");
    assert_eq!(record["cancelRequestedBy"], cancelled["cancelRequestedBy"]);
    tool_error(&client, "cancel_run", json!({"runId": run_id}), "CONFLICT").await;
}

#[tokio::test]
async fn cancel_all_runs_stops_every_running_root_of_the_tenant() {
    let s = setup().await;
    let flow = s.sleeper("Napper", 1500).await;
    s.mock.push(calls(&[("a", "nap_napper", json!({}))]));
    s.mock.push(calls(&[("b", "nap_napper", json!({}))]));
    let client = connect(&s.app, &s.key).await;
    let start = || {
        s.app
            .client
            .post(format!("{}/api/v1/flows/{flow}/runs", s.app.address))
            .bearer_auth(&s.key)
            .json(&json!({"stream": true, "parameters": {"input": "x"}}))
            .send()
    };
    let (first, second) = tokio::join!(start(), start());
    let streams = [first.unwrap(), second.unwrap()];
    let mut ids: Vec<String> = streams
        .iter()
        .map(|r| r.headers()["x-request-id"].to_str().unwrap().to_string())
        .collect();
    ids.sort();
    eventually("both tool calls started", async || {
        s.host.requests().len() == 2
    })
    .await;
    for id in &ids {
        eventually("the run is logged as running", async || {
            s.tenant_run(id).await.is_some()
        })
        .await;
    }

    let cancelled = ok(&client, "cancel_all_runs", json!({})).await;
    assert_eq!(cancelled["count"], 2, "{cancelled}");
    let mut listed: Vec<String> = cancelled["runIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, ids);

    for stream in streams {
        let events = events_of(&stream.text().await.unwrap());
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "error" && e["data"]["code"] == "RUN_CANCELLED"),
            "{events:?}"
        );
    }
    for id in &ids {
        let run = wait_for_run(&s.app, id).await;
        assert!(run.cancelled_at.is_some());
        assert!(
            run.cancel_requested_by
                .as_deref()
                .unwrap()
                .starts_with("apiKey:")
        );
    }
    assert_eq!(s.mock.received().len(), 2);
    // Nothing is running any more.
    let none = ok(&client, "cancel_all_runs", json!({})).await;
    assert_eq!(none["count"], 0);
}

/// A raw MCP `initialize` POST with the given extra headers.
async fn initialize(
    app: &TestApp,
    key: Option<&str>,
    headers: &[(&str, &str)],
) -> crate::helpers::Response {
    let mut request = app
        .client
        .post(app.url("/api/v1/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        );
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    crate::helpers::send(request).await
}

#[tokio::test]
async fn the_transport_needs_a_key_and_checks_host_and_origin() {
    let app = crate::helpers::spawn_app().await;
    let key = app.default_tenant.api_key.clone();

    let accepted = initialize(&app, Some(&key), &[]).await;
    assert_eq!(accepted.status, 200, "{}", accepted.text);
    assert_eq!(accepted.json()["result"]["serverInfo"]["name"], "baton");
    // Stateless: no session to keep, so any instance answers the next request.
    assert!(accepted.headers.get("mcp-session-id").is_none());

    // A single tools/call needs no handshake first (README's curl example).
    let direct = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/mcp"))
            .bearer_auth(&key)
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                          "params": {"name": "list_flows", "arguments": {}}})),
    )
    .await;
    assert_eq!(direct.status, 200, "{}", direct.text);
    assert_eq!(
        direct.json()["result"]["structuredContent"],
        json!({"flows": []})
    );

    initialize(&app, None, &[]).await.error(401, "UNAUTHORIZED");
    initialize(
        &app,
        Some("baton_not-a-real-key-not-a-real-key-123456"),
        &[],
    )
    .await
    .error(401, "UNAUTHORIZED");

    // DNS rebinding: a name the operator did not list is refused, even with a valid key.
    let host = initialize(&app, Some(&key), &[("host", "evil.example.com")]).await;
    host.error(403, "FORBIDDEN");
    assert!(host.text.contains("Host"), "{}", host.text);
    let origin = initialize(&app, Some(&key), &[("origin", "https://evil.example.com")]).await;
    origin.error(403, "FORBIDDEN");
    assert!(origin.text.contains("Origin"), "{}", origin.text);
    let local = initialize(&app, Some(&key), &[("origin", "http://localhost:6274")]).await;
    assert_eq!(local.status, 200, "{}", local.text);

    // Transport refusals get the error shape too.
    let plain = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/mcp"))
            .bearer_auth(&key)
            .header("accept", "application/json")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
    )
    .await;
    assert_eq!(plain.status, 406, "{}", plain.text);
    assert_eq!(plain.json()["error"]["code"], "NOT_ACCEPTABLE");
    // `*/*` accepts both types the transport needs.
    let anything = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/mcp"))
            .bearer_auth(&key)
            .header("accept", "*/*")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
    )
    .await;
    assert_eq!(anything.status, 200, "{}", anything.text);
    assert!(anything.json()["result"]["tools"].is_array());
    // Params that do not parse are JSON-RPC's "invalid params", not "method not found".
    for message in [
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "get_run", "arguments": "s"}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": "x"}),
    ] {
        let answer = crate::helpers::send(
            app.client
                .post(app.url("/api/v1/mcp"))
                .bearer_auth(&key)
                .header("accept", "application/json, text/event-stream")
                .json(&message),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text);
        let body = answer.json();
        assert_eq!(body["id"], 7);
        assert_eq!(body["error"]["code"], -32602, "{message}: {body}");
    }
    // A body that is no JSON, or no JSON-RPC message, is a 400 as on every route.
    for (body, code) in [
        ("{bad", "INVALID_JSON"),
        ("{}", "VALIDATION_ERROR"),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "result": {}}"#,
            "VALIDATION_ERROR",
        ),
    ] {
        let refused = crate::helpers::send(
            app.client
                .post(app.url("/api/v1/mcp"))
                .bearer_auth(&key)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
        refused.error(400, code);
    }
    app.request(Method::GET, "/api/v1/mcp", Some(&key), None)
        .await
        .error(405, "METHOD_NOT_ALLOWED");
}

/// An operator serving Baton under its own name lists it.
#[tokio::test]
async fn configured_hosts_replace_the_defaults() {
    let app = crate::helpers::spawn_app_with(|config| {
        config.mcp.allowed_hosts = Some(vec!["baton.example.com".into()]);
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    let named = initialize(&app, Some(&key), &[("host", "baton.example.com")]).await;
    assert_eq!(named.status, 200, "{}", named.text);
    initialize(&app, Some(&key), &[])
        .await
        .error(403, "FORBIDDEN");
}

/// The official `mcp` Python SDK's client speaks to Baton's server (its own test of interop).
#[tokio::test]
async fn the_python_sdk_client_lists_runs_and_reads_back() {
    let python = tokio::task::spawn_blocking(|| {
        crate::python_sdk::python_with(crate::python_mcp::MCP_SDK, "py-mcp-sdk")
    })
    .await
    .unwrap();
    let s = setup().await;
    let flow = s
        .flow(
            "Python",
            json!({"template": "Greet [[name]].", "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(Reply::text("Hello, Py."));
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/mcp_client.py");
    let (url, key) = (s.app.url("/api/v1/mcp"), s.key.clone());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args([url, key, flow])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["server"], "baton");
    assert_eq!(
        seen["tools"],
        json!([
            "cancel_all_runs",
            "cancel_run",
            "get_run",
            "list_flows",
            "run_flow"
        ])
    );
    assert_eq!(seen["flows"]["flows"].as_array().unwrap().len(), 1);
    assert_eq!(seen["runIsError"], false);
    assert_eq!(seen["run"]["output"]["text"], "Hello, Py.");
    assert_eq!(seen["record"]["id"], seen["run"]["id"]);
    assert_eq!(seen["record"]["status"], "Succeeded");
    assert_eq!(seen["cancelIsError"], true);
    assert_eq!(seen["cancel"]["error"]["code"], "CONFLICT");
}
