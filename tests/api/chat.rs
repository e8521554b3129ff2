//! The OpenAI-compatible endpoint against the testkit mock speaking each wire format.

use baton_providers::ProviderConfig;
use baton_testkit::{MockProvider, Reply};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};

const OPENAI_CANARY: &str = "sk-canary-openai-5f1e0c";
const ANTHROPIC_CANARY: &str = "sk-ant-canary-9d2b7a";

async fn app_with_mock() -> (TestApp, MockProvider) {
    let mock = MockProvider::start().await.unwrap();
    let (openai_base, root) = (mock.openai_base(), mock.root());
    let app = spawn_app_with(move |config| {
        config.providers.insert(
            "openai".into(),
            ProviderConfig {
                base_url: Some(openai_base),
                api_key: Some(OPENAI_CANARY.into()),
                ..Default::default()
            },
        );
        config.providers.insert(
            "anthropic".into(),
            ProviderConfig {
                base_url: Some(root.clone()),
                api_key: Some(ANTHROPIC_CANARY.into()),
                ..Default::default()
            },
        );
        config.providers.insert(
            "azure".into(),
            ProviderConfig {
                base_url: Some(root.clone()),
                api_key: Some("azure-canary-key".into()),
                ..Default::default()
            },
        );
        config.providers.insert(
            "local".into(),
            ProviderConfig {
                base_url: Some(format!("{root}/v1")),
                models: vec!["llama-3".into()],
                ..Default::default()
            },
        );
        // Conventional variables of the test machine must not configure the rest.
        for key in ["google", "bedrock", "mistral", "deepseek"] {
            config
                .providers
                .insert(key.into(), ProviderConfig::default());
        }
    })
    .await;
    (app, mock)
}

fn chat(model: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Reads an SSE body into its `data:` payloads, checking every event has an id.
fn sse_data(text: &str) -> Vec<String> {
    let mut data = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let lines: Vec<&str> = event.lines().collect();
        assert!(
            lines.iter().any(|l| l.starts_with("id:")),
            "event without id: {event:?}"
        );
        data.extend(
            lines
                .iter()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.trim().to_string()),
        );
    }
    data
}

#[tokio::test]
async fn sync_completion_through_each_wire_format() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    for (model, path, auth_header, auth_value) in [
        (
            "openai/gpt-4o-mini",
            "/v1/chat/completions",
            "authorization",
            format!("Bearer {OPENAI_CANARY}"),
        ),
        (
            "anthropic/claude-haiku-4-5",
            "/v1/messages",
            "x-api-key",
            ANTHROPIC_CANARY.to_string(),
        ),
        (
            "azure/my-deployment",
            "/openai/deployments/my-deployment/chat/completions",
            "api-key",
            "azure-canary-key".to_string(),
        ),
        ("local/llama-3", "/v1/chat/completions", "", String::new()),
    ] {
        mock.push(Reply::text("Hi there! ✓").with_usage(12, 4));
        let response = app
            .post(
                "/api/v1/chat/completions",
                &key,
                chat(model, json!({"temperature": 0.2, "x_nonce": "nonce-123"})),
            )
            .await;
        assert_eq!(response.status, 200, "{model}: {}", response.text);
        let body = response.json();
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(
            body["choices"][0]["message"]["content"], "Hi there! ✓",
            "{model}"
        );
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["prompt_tokens"], 12);
        assert_eq!(body["usage"]["completion_tokens"], 4);
        assert_eq!(body["usage"]["total_tokens"], 16);
        assert_eq!(
            body["id"],
            response.headers["x-request-id"].to_str().unwrap()
        );

        let received = mock.received().pop().unwrap();
        assert!(
            received.path.starts_with(path),
            "{model} went to {}",
            received.path
        );
        if !auth_header.is_empty() {
            assert_eq!(
                received.headers[auth_header],
                auth_value.as_str(),
                "{model}"
            );
        }
        assert!(
            !received.body.to_string().contains("nonce-123"),
            "x_nonce reached the provider"
        );
        assert_eq!(received.body["temperature"], 0.2);
    }
    // Anthropic got the system prompt in `system` and a max_tokens.
    let anthropic = mock
        .received()
        .into_iter()
        .find(|r| r.path == "/v1/messages")
        .unwrap();
    assert_eq!(anthropic.body["system"], "be brief");
    assert!(anthropic.body["max_tokens"].as_u64().unwrap() > 0);
    assert_eq!(anthropic.body["model"], "claude-haiku-4-5");
}

#[tokio::test]
async fn streams_relay_chunks_usage_and_done() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let text = "Streaming héllo, wörld ✓ — in pieces.";
    for model in ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"] {
        mock.push(Reply::text(text).with_usage(20, 9));
        let response = app
            .post(
                "/api/v1/chat/completions",
                &key,
                chat(model, json!({"stream": true})),
            )
            .await;
        assert_eq!(response.status, 200, "{}", response.text);
        assert!(
            response.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let data = sse_data(&response.text);
        assert_eq!(data.last().unwrap(), "[DONE]", "{model}");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let assembled: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(assembled, text, "{model}");
        let finish: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&json!("stop")], "{model}");
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(
            (
                usage["prompt_tokens"].as_u64(),
                usage["completion_tokens"].as_u64()
            ),
            (Some(20), Some(9)),
            "{model}"
        );
        assert_eq!(mock.received().last().unwrap().body["stream"], true);
    }
}

#[tokio::test]
async fn tool_calls_round_trip_sync_and_streamed() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let tools = json!({"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}], "tool_choice": "required"});
    for model in ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"] {
        mock.push(Reply::tool_call("get_weather", json!({"city": "Paris"})));
        let sync = app
            .post("/api/v1/chat/completions", &key, chat(model, tools.clone()))
            .await
            .json();
        let call = &sync["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{model}: {sync}");
        assert_eq!(
            serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
            json!({"city": "Paris"})
        );
        assert_eq!(sync["choices"][0]["finish_reason"], "tool_calls");

        mock.push(Reply::tool_call("get_weather", json!({"city": "Paris"})));
        let mut body = chat(model, tools.clone());
        body["stream"] = json!(true);
        let streamed = app.post("/api/v1/chat/completions", &key, body).await;
        let mut arguments = String::new();
        let mut name = None;
        for data in sse_data(&streamed.text).iter().filter(|d| *d != "[DONE]") {
            let chunk: Value = serde_json::from_str(data).unwrap();
            if let Some(call) = chunk["choices"][0]["delta"]["tool_calls"].get(0) {
                if let Some(n) = call["function"]["name"].as_str() {
                    name = Some(n.to_string());
                }
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(name.as_deref(), Some("get_weather"), "{model}");
        assert_eq!(
            serde_json::from_str::<Value>(&arguments).unwrap(),
            json!({"city": "Paris"}),
            "{model}"
        );
    }
    // The second turn sends the tool result back in each format.
    mock.push(Reply::text("It is sunny."));
    let second_turn = json!({"model": "anthropic/claude-haiku-4-5", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]});
    assert_eq!(
        app.post("/api/v1/chat/completions", &key, second_turn)
            .await
            .json()["choices"][0]["message"]["content"],
        "It is sunny."
    );
    let sent = mock.received().pop().unwrap().body;
    assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(sent["messages"][2]["content"][0]["type"], "tool_result");
    assert_eq!(sent["messages"][2]["content"][0]["tool_use_id"], "call_1");
}

#[tokio::test]
async fn provider_failures_and_bad_input_get_clear_errors_without_keys() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let post = |body: Value| app.post("/api/v1/chat/completions", &key, body);

    post(chat("nope/model", json!({})))
        .await
        .error(404, "MODEL_NOT_FOUND");
    post(chat("google/gemini-2.5-flash", json!({})))
        .await
        .error(400, "PROVIDER_NOT_CONFIGURED");
    assert_eq!(
        post(chat("openai/gpt-4o-mini", json!({"temperature": 2.5})))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "temperature"
    );
    assert_eq!(
        post(json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user"}]}))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "messages[0].content"
    );
    assert_eq!(
        post(json!({"model": "openai/gpt-4o-mini"}))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "messages"
    );
    let tags: Vec<String> = (0..21).map(|i| format!("T:{i}")).collect();
    let too_many = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-baton-tags", tags.join(","))
            .json(&chat("openai/gpt-4o-mini", json!({}))),
    )
    .await;
    assert_eq!(
        too_many.error(400, "VALIDATION_ERROR")["param"],
        "X-Baton-Tags"
    );
    let calls_before = mock.received().len();

    mock.push(Reply::status(500, "upstream exploded"));
    let failed = post(chat("openai/gpt-4o-mini", json!({}))).await;
    failed.error(502, "PROVIDER_ERROR");
    assert!(
        failed.text.contains("upstream exploded"),
        "the provider's message is kept: {}",
        failed.text
    );
    mock.push(Reply::status(400, "bad parameter"));
    post(chat("openai/gpt-4o-mini", json!({})))
        .await
        .error(400, "PROVIDER_REJECTED");
    mock.push(Reply::status(404, "The model `gpt-9` does not exist"));
    post(chat("openai/gpt-9", json!({})))
        .await
        .error(404, "MODEL_NOT_FOUND");
    mock.push(Reply::status(401, "invalid x-api-key"));
    let unauthorised = post(chat("anthropic/claude-haiku-4-5", json!({}))).await;
    unauthorised.error(502, "PROVIDER_ERROR");
    // Bad input never reached the provider; each provider failure was one call.
    assert_eq!(mock.received().len(), calls_before + 4);

    // A stream that breaks after its first bytes ends with an error chunk and [DONE].
    mock.push(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
        "this will be cut off somewhere",
    ))));
    let broken = post(chat("openai/gpt-4o-mini", json!({"stream": true}))).await;
    assert_eq!(broken.status, 200);
    let data = sse_data(&broken.text);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "PROVIDER_ERROR", "{}", broken.text);

    for response in [failed, unauthorised, broken] {
        for canary in [OPENAI_CANARY, ANTHROPIC_CANARY, "azure-canary-key"] {
            assert!(
                !response.text.contains(canary),
                "a provider key leaked: {}",
                response.text
            );
        }
    }
}

#[tokio::test]
async fn catalogue_and_providers_are_listed() {
    let (app, _mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let descriptors = app.get("/api/v1/models/descriptors", &key).await.json();
    let descriptors = descriptors.as_array().unwrap();
    for provider in baton_providers::BUILT_IN {
        assert!(
            descriptors
                .iter()
                .filter(|d| d["provider"] == *provider)
                .count()
                >= 4,
            "{provider}"
        );
    }
    let first = &descriptors[0];
    for field in [
        "id",
        "contextWindow",
        "maxOutputTokens",
        "inputCreditsPerMillion",
        "outputCreditsPerMillion",
        "supportsStructuredOutput",
        "supportsTools",
        "supportsVision",
        "supportsStreaming",
    ] {
        assert!(
            first.get(field).is_some(),
            "descriptor lacks {field}: {first}"
        );
    }

    let providers = app.get("/api/v1/providers", &key).await.json();
    let configured = |k: &str| {
        providers
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["key"] == k)
            .unwrap()["configured"]
            .clone()
    };
    assert_eq!(configured("openai"), true);
    assert_eq!(configured("anthropic"), true);
    assert_eq!(configured("google"), false);
    assert_eq!(configured("local"), true);
    let local = providers
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["key"] == "local")
        .unwrap();
    assert_eq!(local["models"], json!(["local/llama-3"]));
    assert_eq!(local["builtIn"], false);
    // Without credentials the routes still need auth.
    assert_eq!(
        app.request(Method::GET, "/api/v1/providers", None, None)
            .await
            .status,
        401
    );
}
