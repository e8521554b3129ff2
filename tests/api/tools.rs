//! The tool library and tool-calling flow runs over HTTP: External tools (fixed host and
//! caller-hosted), endpoint selection, argument checks, `maxToolCalls`, MCP servers.

use baton_testkit::tool_host::ToolHost;
use baton_testkit::{MockMcpServer, MockProvider, Reply, ToolCallReply};
use reqwest::Method;
use serde_json::{Value, json};

use crate::chat::{app_with_mock_and, wait_for_run};
use crate::helpers::TestApp;

pub struct Setup {
    pub app: TestApp,
    pub mock: MockProvider,
    pub host: ToolHost,
    pub key: String,
}

pub async fn setup() -> Setup {
    setup_with(|_| {}).await
}

/// [`setup`] with more configuration (`extra` runs after the tool host is allowed).
pub async fn setup_with(
    extra: impl FnOnce(&mut baton_server::config::Config) + Send + 'static,
) -> Setup {
    let host = ToolHost::start().await.unwrap();
    let allowed = host.addr();
    let (app, mock) = app_with_mock_and(move |config| {
        config.outbound_allowed.push(allowed);
        extra(config);
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    Setup {
        app,
        mock,
        host,
        key,
    }
}

impl Setup {
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> crate::helpers::Response {
        self.app.request(method, path, Some(&self.key), body).await
    }

    pub async fn ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let response = self.call(method.clone(), path, body).await;
        assert!(
            response.status.is_success(),
            "{method} {path}: {} {}",
            response.status,
            response.text
        );
        if response.text.is_empty() {
            Value::Null
        } else {
            response.json()
        }
    }

    pub async fn tool(&self, body: Value) -> String {
        let tool = self.ok(Method::POST, "/api/v1/tools", Some(body)).await;
        tool["id"].as_str().unwrap().to_string()
    }

    /// An External tool at `url` (the tool host's `/big` routes) whose one required integer
    /// parameter `bytes` says how large an answer to send.
    pub async fn sized_tool(&self, name: &str, url: &str) -> String {
        self.tool(json!({"name": name, "toolType": "External", "webUrl": url,
                         "parameters": {"type": "Object", "properties": [
                             {"name": "bytes", "type": "Integer", "required": true}]}}))
            .await
    }

    /// A flow whose `main` template lists `tool_ids`, active in `production`.
    pub async fn flow(&self, title: &str, template: Value) -> String {
        let flow = self
            .ok(Method::POST, "/api/v1/flows", Some(json!({"title": title})))
            .await;
        let slug = flow["name"].as_str().unwrap().to_string();
        let versions = self
            .ok(Method::GET, &format!("/api/v1/flows/{slug}/versions"), None)
            .await;
        let v1 = versions[0]["id"].as_str().unwrap().to_string();
        self.ok(
            Method::PUT,
            &format!("/api/v1/flows/{slug}/versions/{v1}/templates/main"),
            Some(template),
        )
        .await;
        let _ = self
            .call(
                Method::POST,
                "/api/v1/environments",
                Some(json!({"name": "production"})),
            )
            .await;
        self.ok(
            Method::POST,
            &format!("/api/v1/flows/{slug}/versions/{v1}/environments"),
            Some(json!({"environment": "production"})),
        )
        .await;
        slug
    }

    pub async fn run(&self, flow: &str, body: Value, headers: &[(&str, &str)]) -> Value {
        let mut request = self
            .app
            .client
            .post(format!("{}/api/v1/flows/{flow}/runs", self.app.address))
            .bearer_auth(&self.key)
            .json(&body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "run {flow}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Registers an MCP server (`body`: name, url, headers) and imports `tools` from it; returns
    /// the server's id and the imported tools' (id, name) as the import answered them.
    pub async fn import_mcp(&self, body: Value, tools: &[&str]) -> (String, Vec<(String, String)>) {
        let server = self
            .ok(Method::POST, "/api/v1/mcp-servers", Some(body))
            .await;
        let sid = server["id"].as_str().unwrap().to_string();
        let imported = self
            .ok(
                Method::POST,
                &format!("/api/v1/mcp-servers/{sid}/import"),
                Some(json!({"toolNames": tools})),
            )
            .await;
        let imported = imported
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let field = |name: &str| t[name].as_str().unwrap().to_string();
                (field("id"), field("name"))
            })
            .collect();
        (sid, imported)
    }

    /// An External tool `name` answered by the tool host's `/echo`; its id.
    pub async fn echo_tool(&self, name: &str) -> String {
        self.tool(json!({"name": name, "toolType": "External",
                         "webUrl": format!("{}/echo", self.host.origin())}))
            .await
    }

    /// A flow titled `title` whose `main` template on gpt-4o-mini lists `tool`, active in
    /// `production`; its slug.
    pub async fn flow_with_tool(&self, title: &str, tool: &str) -> String {
        self.flow(
            title,
            json!({"template": "t", "toolIds": [tool], "llm": "openai/gpt-4o-mini"}),
        )
        .await
    }

    /// `POST /mcp-servers/{sid}/discover`: the tools the server offers.
    pub async fn discover(&self, sid: &str) -> Vec<Value> {
        let found = self
            .ok(
                Method::POST,
                &format!("/api/v1/mcp-servers/{sid}/discover"),
                None,
            )
            .await;
        found.as_array().unwrap().clone()
    }

    pub async fn set_origins(&self, origins: Value) {
        self.ok(
            Method::PUT,
            "/api/v1/settings",
            Some(json!({"callbackOrigins": origins})),
        )
        .await;
    }
}

pub fn calls(replies: &[(&str, &str, Value)]) -> Reply {
    Reply::Answer {
        text: String::new(),
        tool_calls: replies
            .iter()
            .map(|(id, name, arguments)| ToolCallReply {
                id: (*id).to_string(),
                name: (*name).to_string(),
                arguments: arguments.clone(),
            })
            .collect(),
        tokens_in: 10,
        tokens_out: 5,
        model: None,
        web_searches: 0,
        citations: Vec::new(),
    }
}

/// The tool messages the model received on its `n`th call (OpenAI wire format).
pub fn tool_messages(mock: &MockProvider, n: usize) -> Vec<Value> {
    let received = mock.received();
    received[n].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

#[tokio::test]
async fn tool_records_are_validated_listed_and_tracked_by_usage() {
    let s = setup().await;
    let bad = s
        .call(
            Method::POST,
            "/api/v1/tools",
            Some(json!({"name": "w", "toolType": "External"})),
        )
        .await;
    bad.error(400, "VALIDATION_ERROR");
    assert_eq!(bad.json()["error"]["param"], "webUrl");
    let bad_param = s
        .call(
            Method::POST,
            "/api/v1/tools",
            Some(json!({"name": "w", "type": "external", "webUrl": "https://x.example/[[Bad-Name]]"})),
        )
        .await;
    bad_param.error(400, "VALIDATION_ERROR");
    let bad_agent = s
        .call(
            Method::POST,
            "/api/v1/tools",
            Some(json!({"name": "a", "type": "AGENT", "agentTemplateId": "no-such-flow"})),
        )
        .await;
    assert_eq!(bad_agent.json()["error"]["param"], "agentTemplateId");

    let id = s
        .tool(json!({
            "name": "weather", "toolType": "external", "description": "Weather by city",
            "webUrl": "https://weather.example.com/v1?city=[[city]]",
            "parameters": {"type": "Object", "properties": [
                {"name": "days", "type": "Number", "required": true},
                {"name": "unit", "type": "String", "enum": ["c", "f"]}]}
        }))
        .await;
    let tool = s
        .ok(Method::GET, &format!("/api/v1/tools/{id}"), None)
        .await;
    assert_eq!(tool["toolType"], "External");
    assert_eq!(tool["type"], "External");
    assert_eq!(
        tool["parameters"]["properties"][1]["enum"],
        json!(["c", "f"])
    );
    let dup = s
        .call(
            Method::POST,
            "/api/v1/tools",
            Some(json!({"name": "weather", "toolType": "Virtual", "virtualToolId": "web_search"})),
        )
        .await;
    dup.error(409, "ALREADY_EXISTS");

    // Templates may only list the tenant's own tools.
    let other = s.app.create_tenant("other").await;
    let foreign = s
        .app
        .post(
            "/api/v1/tools",
            &other.api_key,
            json!({"name": "theirs", "toolType": "External", "webUrl": "https://t.example.com"}),
        )
        .await
        .json();
    let flow = s
        .ok(
            Method::POST,
            "/api/v1/flows",
            Some(json!({"title": "Forecast"})),
        )
        .await;
    let slug = flow["name"].as_str().unwrap();
    let versions = s
        .ok(Method::GET, &format!("/api/v1/flows/{slug}/versions"), None)
        .await;
    let v1 = versions[0]["id"].as_str().unwrap();
    let path = format!("/api/v1/flows/{slug}/versions/{v1}/templates/main");
    for ids in [json!(["nope"]), json!([foreign["id"]])] {
        let refused = s
            .call(
                Method::PUT,
                &path,
                Some(json!({"template": "t", "toolIds": ids})),
            )
            .await;
        refused.error(400, "VALIDATION_ERROR");
        assert_eq!(refused.json()["error"]["param"], "toolIds[0]");
    }
    s.ok(
        Method::PUT,
        &path,
        Some(json!({"template": "Forecast for [[city]]", "toolIds": [id]})),
    )
    .await;
    let usage = s
        .ok(Method::GET, &format!("/api/v1/tools/{id}/usage"), None)
        .await;
    assert_eq!(usage[0]["flowName"], slug);
    assert_eq!(usage[0]["templateNames"], json!(["main"]));
    // The URL's placeholder is a flow parameter too.
    let parameters = s
        .ok(
            Method::GET,
            &format!("/api/v1/flows/{slug}/parameters"),
            None,
        )
        .await;
    assert!(
        parameters
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["token"] == "city"),
        "{parameters}"
    );

    s.call(Method::DELETE, &format!("/api/v1/tools/{id}"), None)
        .await
        .error(409, "IN_USE");
    s.ok(Method::PUT, &path, Some(json!({"template": "t"})))
        .await;
    s.ok(Method::DELETE, &format!("/api/v1/tools/{id}"), None)
        .await;
    s.call(Method::GET, &format!("/api/v1/tools/{id}"), None)
        .await
        .error(404, "NOT_FOUND");
}

#[tokio::test]
async fn a_flow_run_calls_a_fixed_host_tool_and_feeds_the_result_back() {
    let s = setup().await;
    let id = s
        .tool(json!({
            "name": "lookup", "toolType": "External",
            "webUrl": format!("{}/echo?tenant=[[tenant]]", s.host.origin()),
            "headers": {"X-Api-Key": "stored-key"},
            "parameters": {"properties": [
                {"name": "q", "type": "String", "required": true},
                {"name": "tags", "type": "String", "isList": true}]}
        }))
        .await;
    let flow = s
        .flow(
            "Lookup",
            json!({"template": "Use the tool.", "userTemplate": "[[question]]", "toolIds": [id],
                   "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[(
        "call_a",
        "lookup",
        json!({"q": "rust", "tags": ["x", "y"]}),
    )]));
    s.mock.push(Reply::text("The answer is 42."));
    let run = s
        .run(
            &flow,
            json!({"parameters": {"question": "what?", "tenant": "acme co"}}),
            &[("X-Baton-Callback-Token", "never-sent-to-fixed-hosts")],
        )
        .await;
    assert_eq!(run["output"]["text"], "The answer is 42.");
    let seen = s.host.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/echo");
    assert_eq!(seen[0].query_values("tenant"), ["acme co"]);
    assert_eq!(seen[0].query_values("q"), ["rust"]);
    assert_eq!(seen[0].query_values("tags"), ["x", "y"]);
    assert_eq!(seen[0].header("x-api-key"), Some("stored-key"));
    assert_eq!(seen[0].header("x-tool-token"), None);

    let call = &run["toolCalls"][0];
    assert_eq!(call["status"], "succeeded");
    assert_eq!(call["originSource"], "tool");
    assert_eq!(call["targetUrl"], format!("{}/echo", s.host.origin()));
    // The second model call carried the tool's answer for the call id.
    let results = tool_messages(&s.mock, 1);
    assert_eq!(results[0]["tool_call_id"], "call_a");
    assert!(results[0]["content"].to_string().contains("rust"));
    // Usage of both turns.
    assert_eq!(run["usage"]["tokensIn"], 20);

    let logged = wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    assert_eq!(logged.tool_calls.len(), 1);
    assert_eq!(logged.tool_calls[0].origin_source.as_deref(), Some("tool"));
    assert_eq!(logged.usage.tokens_in, 20);
    let events = s
        .ok(
            Method::GET,
            &format!("/api/v1/runs/{}", run["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(events["toolCalls"][0]["toolName"], "lookup");
}

#[tokio::test]
async fn caller_hosted_tools_follow_the_callback_origin_rules() {
    let s = setup().await;
    let id = s
        .tool(json!({
            "name": "orders", "toolType": "External", "webUrl": "/status/200?shop=[[shop]]",
            "headers": {"X-Secret": "stored-value"}, "callbackTokenHeader": "X-Secret",
        }))
        .await;
    let flow = s
        .flow(
            "Orders",
            json!({"template": "t", "toolIds": [id], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    let run_once = |headers: Vec<(&'static str, String)>| {
        let s = &s;
        let flow = flow.clone();
        async move {
            s.mock.push(calls(&[("c1", "orders", json!({}))]));
            s.mock.push(Reply::text("done"));
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            s.run(&flow, json!({"parameters": {"shop": "s1"}}), &headers)
                .await
        }
    };

    // No callback URL: the call fails with the cause, the run still succeeds.
    let run = run_once(vec![]).await;
    assert_eq!(run["status"], "Succeeded");
    let call = &run["toolCalls"][0];
    assert_eq!(call["status"], "failed");
    assert_eq!(call["originSource"], "callback");
    let told = tool_messages(&s.mock, 1)[0]["content"].to_string();
    assert!(told.contains("X-Baton-Callback-Url"), "{told}");

    // No origins registered: refused.
    let origin = s.host.origin();
    let run = run_once(vec![(
        "X-Baton-Callback-Url",
        format!("{origin}/ignored/path"),
    )])
    .await;
    assert_eq!(run["toolCalls"][0]["status"], "failed");
    assert!(s.host.requests().is_empty());

    // A registered origin that does not match (other port): refused.
    let port = s.host.addr().port();
    s.set_origins(json!([format!(
        "http://127.0.0.1:{}",
        port.wrapping_add(1)
    )]))
    .await;
    let run = run_once(vec![("X-Baton-Callback-Url", origin.clone())]).await;
    assert_eq!(run["toolCalls"][0]["status"], "failed");
    assert!(s.host.requests().is_empty());

    // Matching: the path is the tool's, the token wins over the stored header.
    s.set_origins(json!([origin.clone()])).await;
    let run = run_once(vec![
        ("X-Baton-Callback-Url", format!("{origin}/ignored/path?x=1")),
        ("X-Baton-Callback-Token", "per-run-secret".into()),
    ])
    .await;
    let call = &run["toolCalls"][0];
    assert_eq!(call["status"], "succeeded", "{run}");
    assert_eq!(call["originSource"], "callback");
    assert_eq!(call["targetUrl"], format!("{origin}/status/200"));
    let seen = s.host.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/status/200");
    assert_eq!(seen[0].query_values("shop"), ["s1"]);
    assert_eq!(seen[0].header("x-secret"), Some("per-run-secret"));
    let logged = wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    assert_eq!(logged.callback_origin.as_deref(), Some(origin.as_str()));
    assert_eq!(
        logged.tool_calls[0].target_url,
        Some(format!("{origin}/status/200"))
    );

    // The deprecated header works and tags the run.
    let run = run_once(vec![("X-Baton-Debug-Url", origin.clone())]).await;
    assert_eq!(run["toolCalls"][0]["status"], "succeeded");
    let logged = wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    assert!(
        logged.tags.contains(&format!("DebugUrl:{origin}")),
        "{:?}",
        logged.tags
    );
    // The token is never stored (this host does not echo it back).
    assert!(!s.app.db.dump().contains("per-run-secret"));
}

#[tokio::test]
async fn bad_arguments_go_back_to_the_model_and_max_tool_calls_ends_the_loop() {
    let s = setup().await;
    let id = s
        .tool(json!({
            "name": "count", "toolType": "External", "webUrl": format!("{}/echo", s.host.origin()),
            "parameters": {"properties": [{"name": "n", "type": "Number", "required": true}]}
        }))
        .await;
    let flow = s
        .flow(
            "Counter",
            json!({"template": "t", "toolIds": [id], "maxToolCalls": 2, "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock
        .push(calls(&[("c1", "count", json!({"n": "seven"}))]));
    s.mock.push(calls(&[("c2", "count", json!({"n": 7}))]));
    s.mock.push(calls(&[("c3", "count", json!({"n": 8}))]));
    let run = s.run(&flow, json!({}), &[]).await;
    // The invalid call never reached the host; the model was told why.
    assert_eq!(s.host.requests().len(), 1);
    assert_eq!(s.host.requests()[0].query_values("n"), ["7"]);
    let told = tool_messages(&s.mock, 1)[0]["content"].to_string();
    assert!(told.contains("/n"), "{told}");
    assert_eq!(run["toolCalls"][0]["status"], "failed");
    assert_eq!(run["toolCalls"][1]["status"], "succeeded");
    // After two tool turns the model is asked to answer without tools, and the run warns.
    let received = s.mock.received();
    assert_eq!(received.len(), 3);
    assert_eq!(received[2].body["tool_choice"], "none");
    assert!(
        run["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["code"] == "MAX_TOOL_CALLS_REACHED"),
        "{run}"
    );
    // The model's last calls were not run: the answer does not claim them.
    assert_eq!(run["finishReason"], "stop");
    // A stream learns the warning at the end, as the response does.
    s.mock.push(calls(&[("c1", "count", json!({"n": 1}))]));
    s.mock.push(calls(&[("c2", "count", json!({"n": 2}))]));
    s.mock.push(calls(&[("c3", "count", json!({"n": 3}))]));
    let events = s.stream_run(&flow, json!({"stream": true})).await;
    let done = events.last().unwrap();
    assert_eq!(done["type"], "requestCompleted");
    assert_eq!(
        done["data"]["warnings"][0]["code"], "MAX_TOOL_CALLS_REACHED",
        "{done}"
    );
    // Its three model calls are counted on its run.
    let logged = crate::chat::wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    assert_eq!(logged.inference_count, 3);

    // maxToolCalls 0: no tool turn at all; the model is asked to answer without tools from its
    // first call, and a call it makes anyway is not run.
    let none = s
        .flow(
            "No tools",
            json!({"template": "t", "toolIds": [id], "maxToolCalls": 0, "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    let (calls_before, hits_before) = (s.mock.received().len(), s.host.requests().len());
    s.mock.push(calls(&[("c4", "count", json!({"n": 9}))]));
    let run = s.run(&none, json!({}), &[]).await;
    let received = s.mock.received();
    assert_eq!(received.len(), calls_before + 1);
    assert_eq!(received[calls_before].body["tool_choice"], "none");
    assert_eq!(s.host.requests().len(), hits_before);
    assert_eq!(run["finishReason"], "stop");
    assert_eq!(run["toolCalls"], json!([]));
    assert_eq!(
        run["warnings"][0]["code"], "MAX_TOOL_CALLS_REACHED",
        "{run}"
    );
    let said = run["warnings"][0]["message"].as_str().unwrap();
    assert!(said.contains("maxToolCalls is 0"), "{said}");
}

#[tokio::test]
async fn a_streamed_tool_run_reports_each_tool_call_with_its_endpoint() {
    let s = setup().await;
    let id = s
        .tool(json!({"name": "ping", "toolType": "External", "webUrl": format!("{}/echo", s.host.origin())}))
        .await;
    let broken = s
        .tool(json!({"name": "relative", "toolType": "External", "webUrl": "/hook"}))
        .await;
    let flow = s
        .flow(
            "Pinger",
            json!({"template": "t", "toolIds": [id, broken], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[
        ("c1", "ping", json!({})),
        ("c2", "relative", json!({})),
    ]));
    s.mock.push(Reply::text("pong"));
    let response = s
        .app
        .client
        .post(format!("{}/api/v1/flows/{flow}/runs", s.app.address))
        .bearer_auth(&s.key)
        .json(&json!({"stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    // A filter keeps only the types asked for (the stored log keeps them all).
    s.mock.push(calls(&[("c1", "ping", json!({}))]));
    s.mock.push(Reply::text("pong"));
    let filtered = s
        .app
        .client
        .post(format!("{}/api/v1/flows/{flow}/runs", s.app.address))
        .bearer_auth(&s.key)
        .json(&json!({"stream": true, "stream_options": {"event_types": ["tool.*"]}}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let kept: Vec<String> = filtered
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kept, ["toolStarted", "toolCompleted"]);
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(text.trim_end().ends_with("data: [DONE]"));
    let of = |t: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == t).collect() };
    assert_eq!(
        of("toolStarted").len(),
        1,
        "an unbound call has no toolStarted"
    );
    assert_eq!(of("toolStarted")[0]["data"]["originSource"], "tool");
    assert_eq!(
        of("toolCompleted")[0]["data"]["targetUrl"],
        format!("{}/echo", s.host.origin())
    );
    let failed = of("toolFailed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["data"]["originSource"], "callback");
    assert_eq!(failed[0]["data"]["status"], "failed");
    assert_eq!(of("agentInferenceCompleted").len(), 2);
    let completed = of("requestCompleted");
    assert_eq!(completed[0]["data"]["totalToolCalls"], 2);
    assert_eq!(completed[0]["data"]["result"]["textResponse"], "pong");
    // The same events are stored with the run.
    let request_id = events[0]["requestId"].as_str().unwrap();
    wait_for_run(&s.app, request_id).await;
}

/// The envelopes of an events stream's text.
pub(crate) fn events_of(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

impl Setup {
    /// Starts a streamed run of `flow` (`body` asks for the stream); the response, still to be
    /// read, and the run's id.
    pub(crate) async fn start_run_stream(
        &self,
        flow: &str,
        body: Value,
    ) -> (reqwest::Response, String) {
        let response = self
            .app
            .client
            .post(format!("{}/api/v1/flows/{flow}/runs", self.app.address))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let run_id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        (response, run_id)
    }

    /// A streamed run of `flow`, read to its end: its envelopes.
    pub(crate) async fn stream_run(&self, flow: &str, body: Value) -> Vec<Value> {
        let (response, _) = self.start_run_stream(flow, body).await;
        assert_eq!(response.status(), 200);
        events_of(&response.text().await.unwrap())
    }
}

/// A streamed run with tools shows each model turn's text as it arrives (`contentDelta`),
/// between the turn's `agentInferenceStarted` and `agentInferenceCompleted`, as a run without
/// tools does; a client that does not want the deltas gets the turns answered synchronously.
#[tokio::test]
async fn a_streamed_tool_run_relays_each_turns_text_as_it_arrives() {
    let s = setup().await;
    let id = s.echo_tool("ping").await;
    let flow = s.flow_with_tool("Talker", &id).await;
    let first_turn = Reply::Answer {
        text: "Let me check that first.".into(),
        tool_calls: vec![ToolCallReply {
            id: "c1".into(),
            name: "ping".into(),
            arguments: json!({}),
        }],
        tokens_in: 12,
        tokens_out: 7,
        model: None,
        web_searches: 0,
        citations: Vec::new(),
    };
    let answer = "The host answered, and everything looks fine from here.";
    s.mock.push(first_turn.clone());
    s.mock.push(Reply::text(answer).with_usage(30, 11));
    let before = s.mock.received().len();
    let events = s.stream_run(&flow, json!({"stream": true})).await;
    let received = s.mock.received();
    assert_eq!(received.len(), before + 2);
    for call in &received[before..] {
        assert_eq!(call.body["stream"], true, "{}", call.body);
    }
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let deltas_between = |from: usize| -> String {
        events[from..]
            .iter()
            .skip(1)
            .take_while(|e| e["type"] != "agentInferenceCompleted")
            .filter(|e| e["type"] == "contentDelta")
            .map(|e| e["data"]["text"].as_str().unwrap())
            .collect()
    };
    let turns: Vec<usize> = types
        .iter()
        .enumerate()
        .filter(|(_, t)| **t == "agentInferenceStarted")
        .map(|(at, _)| at)
        .collect();
    assert_eq!(turns.len(), 2, "{types:?}");
    assert_eq!(deltas_between(turns[0]), "Let me check that first.");
    assert_eq!(deltas_between(turns[1]), answer);
    let final_deltas = events[turns[1]..]
        .iter()
        .filter(|e| e["type"] == "contentDelta")
        .count();
    assert!(final_deltas > 1, "the answer arrives in pieces: {types:?}");
    let tool_done = types.iter().position(|t| *t == "toolCompleted").unwrap();
    assert!(turns[0] < tool_done && tool_done < turns[1], "{types:?}");
    // The turns' usage, read from the streams, is the run's.
    let completed = events
        .iter()
        .find(|e| e["type"] == "requestCompleted")
        .unwrap();
    assert_eq!(completed["data"]["result"]["textResponse"], answer);
    assert_eq!(completed["data"]["totalTokensIn"], 42);
    assert_eq!(completed["data"]["totalTokensOut"], 18);
    let request_id = events[0]["requestId"].as_str().unwrap();
    let run = wait_for_run(&s.app, request_id).await;
    assert_eq!(run.usage.tokens_in, 42);
    assert_eq!(run.usage.tokens_out, 18);
    assert_eq!(completed["data"]["totalCreditsUsed"], run.cost_credits);

    // A filter without `contentDelta`: the turns are synchronous calls.
    s.mock.push(first_turn);
    s.mock.push(Reply::text(answer));
    let before = s.mock.received().len();
    let events = s
        .stream_run(
            &flow,
            json!({"stream": true, "stream_options": {"event_types": ["request*", "tool*"]}}),
        )
        .await;
    assert!(events.iter().all(|e| e["type"] != "contentDelta"));
    assert_eq!(
        events.last().unwrap()["data"]["result"]["textResponse"],
        answer
    );
    for call in &s.mock.received()[before..] {
        assert_ne!(call.body["stream"], true, "{}", call.body);
    }
}

/// Every wire format's stream carries a turn's text and tool calls into the loop: the same
/// streamed run through each provider's format.
#[tokio::test]
async fn streamed_tool_runs_relay_turns_in_every_wire_format() {
    let s = setup().await;
    let id = s
        .tool(json!({"name": "ping", "toolType": "External", "webUrl": format!("{}/echo", s.host.origin())}))
        .await;
    for model in [
        "anthropic/claude-haiku-4-5",
        "google/gemini-2.5-flash",
        "bedrock/amazon.nova-lite-v1:0",
        "openai/gpt-4o-mini",
    ] {
        let flow = s
            .flow(
                &format!("Relay {}", model.replace(['/', '.', ':'], " ")),
                json!({"template": "t", "toolIds": [id], "llm": model}),
            )
            .await;
        s.mock.push(Reply::Answer {
            text: "Checking.".into(),
            tool_calls: vec![ToolCallReply {
                id: "c1".into(),
                name: "ping".into(),
                arguments: json!({"n": 1}),
            }],
            tokens_in: 12,
            tokens_out: 7,
            model: None,
            web_searches: 0,
            citations: Vec::new(),
        });
        s.mock
            .push(Reply::text("All fine over there.").with_usage(20, 6));
        let before = s.host.requests().len();
        let events = s.stream_run(&flow, json!({"stream": true})).await;
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "contentDelta")
            .map(|e| e["data"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Checking.All fine over there.", "{model}");
        assert_eq!(s.host.requests().len(), before + 1, "{model}: the tool ran");
        let done = events.last().unwrap();
        assert_eq!(done["type"], "requestCompleted", "{model}: {done}");
        assert_eq!(done["data"]["totalTokensIn"], 32, "{model}");
        assert_eq!(done["data"]["totalTokensOut"], 13, "{model}");
        assert_eq!(done["data"]["totalToolCalls"], 1, "{model}");
    }
}

/// A failed run that spent is reported under the model whose answers it was billed for (per
/// model statistics count it there); one whose model never answered names no served model and
/// has no price to be uncertain of.
#[tokio::test]
async fn failed_runs_name_the_model_they_were_billed_for() {
    let s = setup().await;
    let id = s.echo_tool("ping").await;
    let flow = s.flow_with_tool("Half way", &id).await;
    s.mock.push(calls(&[("c1", "ping", json!({}))]));
    s.mock
        .push(Reply::status(400, "the second turn is refused"));
    let failed = s
        .call(
            Method::POST,
            &format!("/api/v1/flows/{flow}/runs"),
            Some(json!({})),
        )
        .await;
    assert!(failed.status.is_client_error() || failed.status.is_server_error());
    let run_id = failed.headers["x-request-id"].to_str().unwrap();
    let run = wait_for_run(&s.app, run_id).await;
    assert!(run.cost_credits > 0, "the first turn is billed");
    assert_eq!(run.served_model.as_deref(), Some("openai/gpt-4o-mini"));

    s.mock.push(Reply::status(400, "no such model here"));
    let refused = s
        .call(
            Method::POST,
            "/api/v1/chat/completions",
            Some(json!({"model": "openai/not-in-the-catalogue",
                        "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await;
    assert!(refused.status.is_client_error() || refused.status.is_server_error());
    let run = wait_for_run(&s.app, refused.headers["x-request-id"].to_str().unwrap()).await;
    assert_eq!(run.served_model, None);
    assert_eq!(run.cost_credits, 0);
    assert!(!run.pricing_uncertain, "nothing was priced");
}

/// A turn's stream that breaks after its first text fails the run, as a broken single call's
/// stream does: the text already relayed stays relayed, and what it produced is billed.
#[tokio::test]
async fn a_tool_run_turn_whose_stream_breaks_fails_the_run_and_bills_what_it_produced() {
    let s = setup().await;
    let id = s.echo_tool("ping").await;
    let flow = s.flow_with_tool("Breaker", &id).await;
    s.mock.push(calls(&[("c1", "ping", json!({}))]));
    s.mock
        .push(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
            "the second turn starts to answer and is then cut off for good",
        ))));
    let events = s.stream_run(&flow, json!({"stream": true})).await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.contains(&"contentDelta"), "{types:?}");
    let error = events.iter().find(|e| e["type"] == "error").unwrap();
    assert_eq!(error["data"]["code"], "PROVIDER_ERROR", "{error}");
    let request_id = events[0]["requestId"].as_str().unwrap();
    let run = wait_for_run(&s.app, request_id).await;
    // The first turn's reported usage, and an estimate for the cut one's output.
    assert!(run.usage.tokens_out > 5, "{:?}", run.usage);
    assert!(run.cost_credits > 0);
    assert!(
        run.warnings.iter().any(|w| w.code == "USAGE_ESTIMATED"),
        "{:?}",
        run.warnings
    );
    // The stream says what the cut turn cost, and the run counts it as a call.
    assert_eq!(run.inference_count, 2);
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "agentInferenceCompleted")
        .collect();
    assert_eq!(completed.len(), 2, "{types:?}");
    assert_eq!(completed[1]["data"]["finishReason"], Value::Null);
    let last_usage = events
        .iter()
        .rev()
        .find(|e| e["type"] == "usageUpdate")
        .unwrap();
    assert_eq!(
        last_usage["data"]["cumulativeCreditsUsed"],
        run.cost_credits
    );
}

/// A stream that ends well without the usage its provider was asked for (a compatible server
/// that ignores `stream_options.include_usage`) is billed an estimate, not nothing.
#[tokio::test]
async fn a_streamed_turn_without_reported_usage_is_billed_an_estimate() {
    let s = setup().await;
    let id = s.echo_tool("ping").await;
    let flow = s.flow_with_tool("Quiet", &id).await;
    s.mock.push(calls(&[("c1", "ping", json!({}))]));
    s.mock
        .push(Reply::text("an answer whose usage the provider never reports").with_usage(0, 0));
    let events = s.stream_run(&flow, json!({"stream": true})).await;
    let done = events.last().unwrap();
    assert_eq!(done["type"], "requestCompleted", "{done}");
    let run = wait_for_run(&s.app, events[0]["requestId"].as_str().unwrap()).await;
    assert!(run.usage.tokens_out > 5, "{:?}", run.usage);
    assert!(run.warnings.iter().any(|w| w.code == "USAGE_ESTIMATED"));
    assert_eq!(done["data"]["totalCreditsUsed"], run.cost_credits);
}

#[tokio::test]
async fn mcp_servers_are_registered_discovered_imported_and_called() {
    let mcp = MockMcpServer::start_with_required_header("Authorization", "Bearer mcp-secret").await;
    let mcp_addr = mcp.address();
    let s = setup_with(move |config| config.outbound_allowed.push(mcp_addr)).await;
    let server = s
        .ok(
            Method::POST,
            "/api/v1/mcp-servers",
            Some(json!({"name": "calc", "url": mcp.url(), "headers": {"Authorization": "Bearer mcp-secret"}})),
        )
        .await;
    assert_eq!(
        server["headers"]["Authorization"], "********",
        "secrets are redacted"
    );
    let sid = server["id"].as_str().unwrap().to_string();
    let found = s.discover(&sid).await;
    let add = found.iter().find(|t| t["name"] == "add").unwrap();
    assert_eq!(add["alreadyImported"], false);
    assert!(add["inputSchema"]["properties"]["a"].is_object());
    let server = s
        .ok(Method::GET, &format!("/api/v1/mcp-servers/{sid}"), None)
        .await;
    assert_eq!(server["discoveredToolCount"], found.len());
    assert!(server["lastConnectedAt"].is_string());

    let unknown = s
        .call(
            Method::POST,
            &format!("/api/v1/mcp-servers/{sid}/import"),
            Some(json!({"toolNames": ["nope"]})),
        )
        .await;
    unknown.error(400, "VALIDATION_ERROR");
    // A refused import writes nothing: not the connection, not the names before the conflict.
    let after = s
        .ok(Method::GET, &format!("/api/v1/mcp-servers/{sid}"), None)
        .await;
    assert_eq!(after["lastConnectedAt"], server["lastConnectedAt"]);
    let squatter = s
        .ok(
            Method::POST,
            "/api/v1/tools",
            Some(json!({"name": "fail", "toolType": "External", "webUrl": "https://example.com/fail"})),
        )
        .await;
    s.call(
        Method::POST,
        &format!("/api/v1/mcp-servers/{sid}/import"),
        Some(json!({"toolNames": ["add", "fail"]})),
    )
    .await
    .error(409, "ALREADY_EXISTS");
    let twice = s
        .call(
            Method::POST,
            &format!("/api/v1/mcp-servers/{sid}/import"),
            Some(json!({"toolNames": ["add", "add"]})),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(twice["param"], "toolNames[1]");
    let library = s.ok(Method::GET, "/api/v1/tools", None).await;
    assert!(
        library
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["name"] != "add"),
        "{library}"
    );
    let squatter = format!("/api/v1/tools/{}", squatter["id"].as_str().unwrap());
    assert_eq!(s.app.delete(&squatter, &s.key).await.status, 204);
    let imported = s
        .ok(
            Method::POST,
            &format!("/api/v1/mcp-servers/{sid}/import"),
            Some(json!({"toolNames": ["add", "fail"]})),
        )
        .await;
    let add_tool = &imported[0];
    assert_eq!(add_tool["toolType"], "Mcp");
    assert_eq!(add_tool["mcpServerId"], sid);
    assert!(add_tool["rawInputSchema"].is_object());
    assert!(
        !add_tool["parameters"]["properties"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let found = s.discover(&sid).await;
    assert!(
        found
            .iter()
            .any(|t| t["name"] == "add" && t["alreadyImported"] == true)
    );
    // An update that sends the redacted value back keeps the secret.
    s.ok(
        Method::PUT,
        &format!("/api/v1/mcp-servers/{sid}"),
        Some(json!({"name": "calc", "url": mcp.url(), "headers": {"Authorization": "********"}})),
    )
    .await;

    let ids: Vec<Value> = imported
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].clone())
        .collect();
    let flow = s
        .flow(
            "Calculator",
            json!({"template": "t", "toolIds": ids, "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[
        ("c1", "add", json!({"a": 2, "b": 3})),
        ("c2", "fail", json!({})),
    ]));
    s.mock.push(Reply::text("2 + 3 = 5"));
    let run = s.run(&flow, json!({}), &[]).await;
    assert_eq!(run["output"]["text"], "2 + 3 = 5");
    assert!(
        mcp.calls()
            .iter()
            .any(|(name, args)| name == "add" && args == &json!({"a": 2, "b": 3}))
    );
    let results = tool_messages(&s.mock, 1);
    let add_result = results.iter().find(|m| m["tool_call_id"] == "c1").unwrap();
    assert!(
        add_result["content"].to_string().contains('5'),
        "{add_result}"
    );
    let statuses: Vec<&Value> = run["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["status"])
        .collect();
    assert!(statuses.contains(&&json!("succeeded")) && statuses.contains(&&json!("failed")));

    // A server in use cannot be removed.
    s.call(Method::DELETE, &format!("/api/v1/mcp-servers/{sid}"), None)
        .await
        .error(409, "IN_USE");
}

/// A server record's secrets stay with its host: `********` keeps a stored value whatever the
/// header name's case, never on create and never once the URL points elsewhere, and headers
/// the transport sets are refused at once. An imported tool is called by its server's name,
/// also when that name is no function name (`files.read`) or the tool was renamed here.
#[tokio::test]
async fn mcp_records_keep_secrets_to_their_host_and_tools_their_server_names() {
    let mcp = MockMcpServer::start_with_required_header("Authorization", "Bearer mcp-secret").await;
    let mcp_addr = mcp.address();
    let s = setup_with(move |config| config.outbound_allowed.push(mcp_addr)).await;
    for (headers, param) in [
        (
            json!({"Content-Type": "text/plain"}),
            "headers.Content-Type",
        ),
        (json!({"Mcp-Session-Id": "x"}), "headers.Mcp-Session-Id"),
        (json!({"X-Literal": "********"}), "headers.X-Literal"),
        (json!({"X-Key": "a", "x-key": "b"}), "headers.x-key"),
    ] {
        let refused = s
            .call(
                Method::POST,
                "/api/v1/mcp-servers",
                Some(json!({"name": "calc", "url": mcp.url(), "headers": headers})),
            )
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(refused["param"], param, "{headers}");
    }
    let (sid, imported) = s
        .import_mcp(
            json!({"name": "calc", "url": mcp.url(), "headers": {"Authorization": "Bearer mcp-secret"}}),
            &["files.read", "echo"],
        )
        .await;
    // Sent back under another case, the stored value is kept (the server still lets us in).
    s.ok(
        Method::PUT,
        &format!("/api/v1/mcp-servers/{sid}"),
        Some(json!({"name": "calc", "url": mcp.url(), "headers": {"authorization": "********"}})),
    )
    .await;
    s.discover(&sid).await;
    // It does not follow the record to another host.
    let moved = s
        .call(
            Method::PUT,
            &format!("/api/v1/mcp-servers/{sid}"),
            Some(json!({"name": "calc", "url": "http://127.0.0.1:9/mcp", "headers": {"authorization": "********"}})),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(moved["param"], "headers.authorization");
    let server = s
        .ok(Method::GET, &format!("/api/v1/mcp-servers/{sid}"), None)
        .await;
    assert_eq!(server["url"], mcp.url());

    // `files.read` is `files_read` here; `echo` is renamed.
    let names: Vec<&str> = imported.iter().map(|(_, name)| name.as_str()).collect();
    assert_eq!(names, ["files_read", "echo"]);
    let files = s
        .ok(
            Method::GET,
            &format!("/api/v1/tools/{}", imported[0].0),
            None,
        )
        .await;
    assert_eq!(files["mcpToolName"], "files.read");
    let mut echo = s
        .ok(
            Method::GET,
            &format!("/api/v1/tools/{}", imported[1].0),
            None,
        )
        .await;
    echo["name"] = json!("say_again");
    let renamed = s
        .ok(
            Method::PUT,
            &format!("/api/v1/tools/{}", imported[1].0),
            Some(echo),
        )
        .await;
    assert_eq!(renamed["name"], "say_again");
    assert_eq!(renamed["mcpToolName"], "echo");
    let flow = s
        .flow(
            "Reader",
            json!({"template": "t", "toolIds": [imported[0].0, imported[1].0], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[
        ("c1", "files_read", json!({"text": "notes.txt"})),
        ("c2", "say_again", json!({"text": "hi", "times": 2})),
    ]));
    s.mock.push(Reply::text("read it"));
    let run = s.run(&flow, json!({}), &[]).await;
    let statuses: Vec<&Value> = run["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["status"])
        .collect();
    assert_eq!(
        statuses,
        [&json!("succeeded"), &json!("succeeded")],
        "{run}"
    );
    let called: Vec<String> = mcp.calls().into_iter().map(|(name, _)| name).collect();
    assert!(called.contains(&"files.read".to_string()), "{called:?}");
    assert!(called.contains(&"echo".to_string()), "{called:?}");
    let results = tool_messages(&s.mock, 1);
    assert!(
        results
            .iter()
            .any(|m| m["content"].to_string().contains("contents of notes.txt"))
    );
    // The renamed tool is still this server's `echo`: discovered as imported, refreshed in place.
    let found = s.discover(&sid).await;
    let echo = found.iter().find(|t| t["name"] == "echo").unwrap();
    assert_eq!(echo["alreadyImported"], true);
    let again = s
        .ok(
            Method::POST,
            &format!("/api/v1/mcp-servers/{sid}/import"),
            Some(json!({"toolNames": ["echo"]})),
        )
        .await;
    assert_eq!(again[0]["id"], imported[1].0.as_str());
    assert_eq!(again[0]["name"], "say_again");

    // An MCP tool's input is an object, and a schema that compiles.
    for schema in [
        json!({"type": "array"}),
        json!({"type": "object", "properties": []}),
        json!({"type": "object", "properties": {"text": {"type": "nope"}}}),
    ] {
        let refused = s
            .call(
                Method::POST,
                "/api/v1/tools",
                Some(
                    json!({"name": "t_bad", "toolType": "Mcp", "mcpServerId": sid,
                            "rawInputSchema": schema}),
                ),
            )
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(refused["param"], "rawInputSchema", "{schema}");
    }
    let untyped = s
        .ok(
            Method::POST,
            "/api/v1/tools",
            Some(
                json!({"name": "t_untyped", "toolType": "Mcp", "mcpServerId": sid,
                        "rawInputSchema": {}}),
            ),
        )
        .await;
    assert_eq!(untyped["rawInputSchema"], json!({"type": "object"}));
    // `********` keeps a value only where there is one to keep.
    let nothing = s
        .call(
            Method::PUT,
            &format!("/api/v1/mcp-servers/{sid}"),
            Some(json!({"name": "calc", "url": mcp.url(),
                        "headers": {"Authorization": "********", "X-New": "********"}})),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(nothing["param"], "headers.X-New");
}

/// Imports of the same tools at once all succeed: the later ones refresh what the first wrote.
#[tokio::test]
async fn concurrent_imports_of_the_same_tools_all_succeed() {
    let mcp = MockMcpServer::start().await;
    let addr = mcp.address();
    let s = setup_with(move |config| config.outbound_allowed.push(addr)).await;
    let server = s
        .ok(
            Method::POST,
            "/api/v1/mcp-servers",
            Some(json!({"name": "calc", "url": mcp.url()})),
        )
        .await;
    let path = format!(
        "/api/v1/mcp-servers/{}/import",
        server["id"].as_str().unwrap()
    );
    let imports = (0..8).map(|_| {
        s.call(
            Method::POST,
            &path,
            Some(json!({"toolNames": ["add", "echo"]})),
        )
    });
    let answers = futures::future::join_all(imports).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text);
    }
    let library = s.ok(Method::GET, "/api/v1/tools", None).await;
    assert_eq!(library.as_array().unwrap().len(), 2, "{library}");
}

#[tokio::test]
async fn an_unreachable_mcp_server_fails_the_call_not_the_run() {
    let mcp = MockMcpServer::start().await;
    let addr = mcp.address();
    let s = setup_with(move |config| config.outbound_allowed.push(addr)).await;
    let (sid, imported) = s
        .import_mcp(json!({"name": "calc", "url": mcp.url()}), &["echo"])
        .await;
    // Point the server somewhere nothing listens (the guard allows only the mock's address).
    s.ok(
        Method::PUT,
        &format!("/api/v1/mcp-servers/{sid}"),
        Some(json!({"name": "calc", "url": "http://127.0.0.1:9/mcp"})),
    )
    .await;
    let flow = s
        .flow(
            "Echo",
            json!({"template": "t", "toolIds": [imported[0].0], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[("c1", "echo", json!({"text": "hi"}))]));
    s.mock.push(Reply::text("the tool is down"));
    let run = s.run(&flow, json!({}), &[]).await;
    assert_eq!(run["status"], "Succeeded");
    assert_eq!(run["toolCalls"][0]["status"], "failed");
    s.call(
        Method::POST,
        &format!("/api/v1/mcp-servers/{sid}/discover"),
        None,
    )
    .await
    .error(502, "MCP_SERVER_ERROR");
}

#[tokio::test]
async fn virtual_tools_run_at_the_provider_with_citations_and_are_refused_where_unsupported() {
    let s = setup().await;
    let search = s
        .tool(json!({"name": "search", "type": "virtual", "virtualToolId": "web_search"}))
        .await;
    let flow = s
        .flow(
            "Researcher",
            json!({"template": "Research.", "userTemplate": "[[q]]", "toolIds": [search],
                   "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(
        Reply::text("Rust 1.0 shipped in 2015.")
            .with_web_search(2, &[("https://blog.rust-lang.org/", "Rust blog")]),
    );
    let run = s
        .run(&flow, json!({"parameters": {"q": "when?"}}), &[])
        .await;
    assert_eq!(run["output"]["text"], "Rust 1.0 shipped in 2015.");
    assert_eq!(
        run["output"]["citations"][0]["url"],
        "https://blog.rust-lang.org/"
    );
    // The provider ran the search: the request went to the Responses API with the hosted tool.
    let sent = &s.mock.received()[0];
    assert!(sent.path.ends_with("/responses"), "{}", sent.path);
    assert!(sent.body["tools"].to_string().contains("web_search"));
    let logged = wait_for_run(&s.app, run["id"].as_str().unwrap()).await;
    assert_eq!(logged.usage.web_search_calls, 2);
    assert!(logged.cost_credits > 0);

    // A provider that cannot run it: 400, nothing sent.
    let local = s
        .flow(
            "Local researcher",
            json!({"template": "Research.", "toolIds": [search], "llm": "local/llama-3"}),
        )
        .await;
    let before = s.mock.received().len();
    let refused = s
        .app
        .post(&format!("/api/v1/flows/{local}/runs"), &s.key, json!({}))
        .await;
    assert!(
        refused.error(400, "UNSUPPORTED")["param"].is_null(),
        "the template's tool is no field of the run's body"
    );
    let refused = s
        .app
        .post(
            &format!("/api/v1/flows/{local}/runs"),
            &s.key,
            json!({"vendorTools": ["web_search"]}),
        )
        .await;
    assert_eq!(
        refused.error(400, "UNSUPPORTED")["param"],
        "vendorTools",
        "the body asked for a vendor tool too"
    );
    assert_eq!(s.mock.received().len(), before);
}

#[tokio::test]
async fn an_environment_pin_serves_a_caller_hosted_tool_without_a_callback() {
    let s = setup().await;
    let id = s
        .tool(json!({
            "name": "stock", "toolType": "External", "webUrl": "/stock",
            "environmentOverrides": {"production": {"webUrl": format!("{}/pinned", s.host.origin())}},
        }))
        .await;
    let flow = s
        .flow(
            "Stock",
            json!({"template": "t", "toolIds": [id], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    s.mock.push(calls(&[("c1", "stock", json!({"sku": "x"}))]));
    s.mock.push(Reply::text("in stock"));
    // A callback origin is sent but not registered: the pinned URL is used all the same.
    let run = s
        .run(
            &flow,
            json!({"environment": "production"}),
            &[("X-Baton-Callback-Url", "https://caller.example.com")],
        )
        .await;
    let call = &run["toolCalls"][0];
    assert_eq!(call["status"], "succeeded", "{run}");
    assert_eq!(call["originSource"], "environment");
    assert_eq!(call["targetUrl"], format!("{}/pinned", s.host.origin()));
    assert_eq!(s.host.requests()[0].path, "/pinned");
}

#[tokio::test]
async fn a_changed_tool_is_seen_by_the_next_run() {
    let s = setup().await;
    let body = |path: &str| {
        json!({"name": "lookup", "toolType": "External", "description": "Look up",
               "webUrl": format!("{}{path}", s.host.origin())})
    };
    let tool = s.tool(body("/first")).await;
    let flow = s
        .flow(
            "Cached tools",
            json!({"template": "t", "toolIds": [tool], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    let run_once = || async {
        s.mock.push(calls(&[("c", "lookup", json!({}))]));
        s.mock.push(Reply::text("ok"));
        s.run(&flow, json!({}), &[]).await
    };
    run_once().await;
    // The run's tools are cached; a change must reach the next run anyway.
    s.ok(
        Method::PUT,
        &format!("/api/v1/tools/{tool}"),
        Some(body("/second")),
    )
    .await;
    run_once().await;
    let paths: Vec<String> = s.host.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/first", "/second"]);
}

/// A streamed run with tools sends heartbeats while nothing else happens (a slow tool call),
/// at the interval asked for, usage at its interval, and its unresolved parameters in
/// `requestStarted`;
/// `include_usage: false` leaves `usageUpdate` off its stream; a malformed `event_types`
/// pattern is refused naming the item.
#[tokio::test]
async fn a_streamed_tool_run_sends_heartbeats_and_honours_its_stream_options() {
    let s = setup().await;
    let nap = s
        .tool(json!({"name": "nap", "toolType": "External",
                     "webUrl": format!("{}/sleep?ms=1000", s.host.origin())}))
        .await;
    let flow = s
        .flow(
            "Napper",
            json!({"template": "t [[mood]]", "toolIds": [nap], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    let runs = format!("/api/v1/flows/{flow}/runs");
    let stream = |options: Value| {
        let (s, runs) = (&s, &runs);
        async move {
            s.mock.push(calls(&[("n1", "nap", json!({}))]));
            s.mock.push(Reply::text("rested"));
            let body = json!({"stream": true, "stream_options": options});
            s.app.post_events(runs, &s.key, body).await
        }
    };
    let count = |events: &[Value], t: &str| events.iter().filter(|e| e["type"] == t).count();

    // The tool sleeps a second; heartbeats every 200 ms fill it.
    let events = stream(json!({"heartbeat_interval_ms": 200})).await;
    let beats: Vec<&Value> = events.iter().filter(|e| e["type"] == "heartbeat").collect();
    assert!(beats.len() >= 2, "{} heartbeats", beats.len());
    let run_id = events[0]["requestId"].clone();
    // The parameter left unresolved is reported at the start, as a synchronous run would.
    assert_eq!(events[0]["data"]["warnings"][0]["parameter"], "mood");
    assert!(beats.iter().all(|b| b["requestId"] == run_id));
    assert!(beats[0]["data"]["elapsedMs"].as_u64().is_some());
    assert!(count(&events, "usageUpdate") > 0, "usage is on by default");
    assert_eq!(count(&events, "requestCompleted"), 1);

    // Usage every 200 ms too, while the tool sleeps (not only after each model call).
    let events = stream(json!({"usage_interval_ms": 200})).await;
    let position = |t: &str| events.iter().position(|e| e["type"] == t).unwrap();
    let (started, finished) = (position("toolStarted"), position("toolCompleted"));
    let during = events[started..finished]
        .iter()
        .filter(|e| e["type"] == "usageUpdate")
        .count();
    assert!(during >= 2, "{during} usage updates during the tool call");
    let update = &events[started..finished]
        .iter()
        .find(|e| e["type"] == "usageUpdate")
        .unwrap()["data"];
    assert!(
        update["cumulativeCreditsUsed"].as_i64().unwrap() > 0,
        "{update}"
    );
    assert!(
        update["cumulativeTokensIn"].as_u64().unwrap() > 0,
        "{update}"
    );

    let events =
        stream(json!({"include_usage": false, "event_types": ["usage*", "request*"]})).await;
    assert_eq!(count(&events, "usageUpdate"), 0, "usage turned off");
    assert_eq!(count(&events, "heartbeat"), 0, "filtered out");
    assert_eq!(count(&events, "requestCompleted"), 1);

    let refused = s
        .call(
            Method::POST,
            &format!("/api/v1/flows/{flow}/runs"),
            Some(json!({"stream": true, "stream_options": {"event_types": ["tool?"]}})),
        )
        .await;
    let error = refused.error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "stream_options.event_types[0]");

    // The body is camelCase, so are its options' names; an unknown one (a misspelt filter would
    // stream everything), a non-boolean `include_usage` or another format is refused.
    let events = stream(json!({"includeUsage": false, "eventTypes": ["request*"]})).await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["requestStarted", "requestCompleted"]);
    let calls_before = s.mock.received().len();
    for (options, param) in [
        (json!({"eventType": ["tool*"]}), "stream_options.eventType"),
        (
            json!({"include_usage": "false"}),
            "stream_options.include_usage",
        ),
        (json!({"format": "chunks"}), "stream_options.format"),
        (
            json!({"eventTypes": ["tool*"], "event_types": ["tool*"]}),
            "stream_options.event_types",
        ),
    ] {
        let refused = s
            .call(
                Method::POST,
                &format!("/api/v1/flows/{flow}/runs"),
                Some(json!({"stream": true, "streamOptions": options})),
            )
            .await;
        let error = refused.error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param, "{options}");
    }
    assert_eq!(s.mock.received().len(), calls_before, "nothing ran");
}
