//! The OpenAI-compatible endpoint against the testkit mock speaking each wire format.

use baton_providers::ProviderConfig;
use baton_testkit::{MockProvider, Reply};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};

const OPENAI_CANARY: &str = "sk-canary-openai-5f1e0c";
const ANTHROPIC_CANARY: &str = "sk-ant-canary-9d2b7a";
const GOOGLE_CANARY: &str = "AIza-canary-google-31c4";
const AWS_SECRET_CANARY: &str = "aws-secret-canary-77e0f1";

pub async fn app_with_mock() -> (TestApp, MockProvider) {
    app_with_mock_and(|_| {}).await
}

/// [`app_with_mock`] with more configuration (e.g. addresses the outbound guard lets through).
pub async fn app_with_mock_and(
    extra: impl FnOnce(&mut baton_server::config::Config) + Send + 'static,
) -> (TestApp, MockProvider) {
    let mock = MockProvider::start().await.unwrap();
    let (openai_base, root) = (mock.openai_base(), mock.root());
    let app = spawn_app_with(move |config| {
        extra(config);
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
        config.providers.insert(
            "google".into(),
            ProviderConfig {
                base_url: Some(root.clone()),
                api_key: Some(GOOGLE_CANARY.into()),
                ..Default::default()
            },
        );
        config.providers.insert(
            "bedrock".into(),
            ProviderConfig {
                base_url: Some(root.clone()),
                region: Some("us-east-1".into()),
                access_key_id: Some("AKIACANARY0000000000".into()),
                secret_access_key: Some(AWS_SECRET_CANARY.into()),
                ..Default::default()
            },
        );
        // Conventional variables of the test machine must not configure the rest.
        for key in ["mistral", "deepseek"] {
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
    for model in [
        "openai/gpt-4o-mini",
        "anthropic/claude-haiku-4-5",
        "google/gemini-2.5-flash",
        "bedrock/amazon.nova-lite-v1:0",
    ] {
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
        let received = mock.received().pop().unwrap();
        let asked_to_stream = received.body["stream"] == true
            || received.path.ends_with(":streamGenerateContent")
            || received.path.ends_with("/converse-stream");
        assert!(
            asked_to_stream,
            "{model} was not asked to stream: {}",
            received.path
        );
    }
}

/// Statistics group by served model: a stream must name it as the synchronous call does, by
/// the name the provider reports (Bedrock reports none: the requested name stands).
#[tokio::test]
async fn a_stream_logs_the_model_the_provider_reports_as_a_call_does() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    for (model, served) in [
        ("openai/gpt-4o-mini", "openai/gpt-4o-mini-2024-07-18"),
        (
            "anthropic/claude-haiku-4-5",
            "anthropic/claude-haiku-4-5-20251001",
        ),
        ("google/gemini-2.5-flash", "google/gemini-2.5-flash-001"),
    ] {
        let reported = served.split_once('/').unwrap().1;
        for stream in [false, true] {
            mock.push(Reply::text("hi").served_as(reported));
            let response = app
                .post(
                    "/api/v1/chat/completions",
                    &key,
                    chat(model, json!({"stream": stream})),
                )
                .await;
            assert_eq!(response.status, 200, "{}", response.text);
            // What the client reads names it too: the answer's, or every chunk's, `model`.
            let named: Vec<Value> = if stream {
                sse_data(&response.text)
                    .iter()
                    .filter(|d| *d != "[DONE]")
                    .map(|d| serde_json::from_str::<Value>(d).unwrap()["model"].clone())
                    .collect()
            } else {
                vec![response.json()["model"].clone()]
            };
            assert!(
                named.iter().all(|m| *m == served),
                "{model}, stream: {stream}: {named:?}"
            );
            let id = response.headers["x-request-id"]
                .to_str()
                .unwrap()
                .to_string();
            let run = wait_for_run(&app, &id).await;
            assert_eq!(
                run.served_model.as_deref(),
                Some(served),
                "{model}, stream: {stream}"
            );
        }
    }
}

#[tokio::test]
async fn tool_calls_round_trip_sync_and_streamed() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let tools = json!({"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}], "tool_choice": "required"});
    for model in [
        "openai/gpt-4o-mini",
        "anthropic/claude-haiku-4-5",
        "google/gemini-2.5-flash",
        "bedrock/amazon.nova-lite-v1:0",
    ] {
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
    // The events format delivers the calls too, in the request's result.
    mock.push(Reply::tool_call("get_weather", json!({"city": "Paris"})));
    let mut body = chat("openai/gpt-4o-mini", tools.clone());
    body["stream"] = json!(true);
    body["stream_options"] = json!({"format": "events"});
    let streamed = app.post("/api/v1/chat/completions", &key, body).await;
    let completed = envelopes(&streamed.text)
        .into_iter()
        .find(|e| e["type"] == "requestCompleted")
        .unwrap();
    let call = &completed["data"]["result"]["toolCalls"][0];
    assert_eq!(call["name"], "get_weather", "{completed}");
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );
    assert!(call["id"].is_string());
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
    post(chat("mistral/mistral-small-latest", json!({})))
        .await
        .error(400, "PROVIDER_NOT_CONFIGURED");
    assert_eq!(
        post(chat("openai/gpt-4o-mini", json!({"temperature": 2.5})))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "temperature"
    );
    // A zero token budget is refused here, not sent to be refused by the provider.
    let calls_before = mock.received().len();
    assert_eq!(
        post(chat("openai/gpt-4o-mini", json!({"max_tokens": 0})))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "max_tokens"
    );
    assert_eq!(
        app.post(
            "/api/v1/inference",
            &key,
            json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
        )
        .await
        .error(400, "VALIDATION_ERROR")["param"],
        "max_tokens"
    );
    assert_eq!(
        mock.received().len(),
        calls_before,
        "nothing reached the provider"
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
    // The customer's field is named as sent: OpenAI's `user`, or `customerId`.
    for field in ["user", "customerId"] {
        assert_eq!(
            post(chat("openai/gpt-4o-mini", json!({field: "u".repeat(300)})))
                .await
                .error(400, "VALIDATION_ERROR")["param"],
            field
        );
    }
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

    // A provider's redirect is not followed: the key and the prompt would go where it points.
    let elsewhere = MockProvider::start().await.unwrap();
    mock.push(Reply::Redirect(format!("{}/v1/messages", elsewhere.root())));
    let redirected = post(chat("anthropic/claude-haiku-4-5", json!({}))).await;
    let error = redirected.error(502, "PROVIDER_ERROR");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains(&format!("redirected to {}/v1/messages", elsewhere.root())),
        "{}",
        redirected.text
    );
    assert!(elsewhere.received().is_empty(), "the redirect was followed");
    assert_eq!(mock.received().len(), calls_before + 5);

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
    // Its stored lifecycle ends with what the run is billed (an estimate), not nothing.
    let id = broken.headers["x-request-id"].to_str().unwrap().to_string();
    let (run, events) = run_and_events(&app, &key, &id).await;
    assert!(run.cost_credits > 0);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "requestCompleted");
    assert_eq!(last["data"]["totalCreditsUsed"], run.cost_credits);

    for response in [failed, unauthorised, broken] {
        for canary in [
            OPENAI_CANARY,
            ANTHROPIC_CANARY,
            "azure-canary-key",
            GOOGLE_CANARY,
            AWS_SECRET_CANARY,
        ] {
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
    assert_eq!(configured("google"), true);
    assert_eq!(configured("bedrock"), true);
    assert_eq!(configured("mistral"), false);
    assert_eq!(configured("local"), true);
    let local = providers
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["key"] == "local")
        .unwrap();
    assert_eq!(local["models"], json!(["local/llama-3"]));
    assert_eq!(local["builtIn"], false);

    // OpenAI's model list: configured providers' models, as requests name them.
    let models = app.get("/api/v1/models", &key).await.json();
    assert_eq!(models["object"], "list");
    let listed: Vec<(&str, &str)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model");
            (m["id"].as_str().unwrap(), m["owned_by"].as_str().unwrap())
        })
        .collect();
    assert!(
        listed.contains(&("openai/gpt-4o-mini", "openai")),
        "{models}"
    );
    assert!(listed.contains(&("local/llama-3", "local")));
    assert!(
        listed.iter().all(|(_, owner)| *owner != "mistral"),
        "an unconfigured provider's models are not offered"
    );
    // One model, as OpenAI's SDK asks for it (the id's `/` encoded) and as written.
    for path in [
        "/api/v1/models/openai%2Fgpt-4o-mini",
        "/api/v1/models/openai/gpt-4o-mini",
    ] {
        let model = app.get(path, &key).await.json();
        assert_eq!(model["id"], "openai/gpt-4o-mini", "{path}: {model}");
        assert_eq!(model["object"], "model");
        assert_eq!(model["owned_by"], "openai");
    }
    let unconfigured = app.get("/api/v1/models/mistral/mistral-large-2512", &key);
    unconfigured.await.error(404, "MODEL_NOT_FOUND");
    app.get("/api/v1/models/openai%2Fno-such-model", &key)
        .await
        .error(404, "MODEL_NOT_FOUND");
    // Web search is priced per call beside the tokens: the descriptors say how much.
    let descriptors = app.get("/api/v1/models/descriptors", &key).await.json();
    let searching = descriptors
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["supportsWebSearch"] == true)
        .expect("a model with web search");
    assert!(
        searching["webSearchCreditsPerCall"].as_i64().unwrap() > 0,
        "{searching}"
    );
    // Without credentials the routes still need auth.
    assert_eq!(
        app.request(Method::GET, "/api/v1/providers", None, None)
            .await
            .status,
        401
    );
}

/// Log rows are written off the request path: poll briefly for one.
pub async fn wait_for_run(app: &TestApp, id: &str) -> baton_domain::run::RunRecord {
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    for _ in 0..100 {
        // Tool runs are queued as Pending first: wait for the finished row.
        if let Ok(run) = app.store.get_run(&tenant, id).await
            && run.completed_at.is_some()
        {
            return run;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("run {id} was never logged");
}

fn credits(tokens_in: u64, tokens_out: u64, descriptor: &Value) -> i64 {
    let micro = tokens_in as i128 * descriptor["inputCreditsPerMillion"].as_i64().unwrap() as i128
        + tokens_out as i128 * descriptor["outputCreditsPerMillion"].as_i64().unwrap() as i128;
    ((micro + 500_000) / 1_000_000) as i64
}

#[tokio::test]
async fn every_call_is_logged_with_usage_cost_customer_and_tags() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let descriptors = app.get("/api/v1/models/descriptors", &key).await.json();
    let mini = descriptors
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == "openai/gpt-4o-mini")
        .expect("gpt-4o-mini is catalogued")
        .clone();

    mock.push(Reply::text("logged answer").with_usage(1200, 300));
    let response = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-baton-customer-id", "cust-42")
            .header("x-baton-tags", "Team:search, Feature:chat")
            .json(&chat(
                "openai/gpt-4o-mini",
                json!({"user": "ignored-because-header-wins"}),
            )),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let run = wait_for_run(&app, &id).await;
    assert_eq!(run.status, baton_domain::run::RunStatus::Succeeded);
    assert_eq!(run.environment.as_deref(), Some("openai-compatible"));
    assert_eq!(run.requested_model, "openai/gpt-4o-mini");
    assert_eq!(run.served_model.as_deref(), Some("openai/gpt-4o-mini"));
    assert_eq!((run.usage.tokens_in, run.usage.tokens_out), (1200, 300));
    assert_eq!(run.raw_cost_credits, credits(1200, 300, &mini));
    assert_eq!(run.cost_credits, run.raw_cost_credits, "no markup set");
    assert!(!run.pricing_uncertain);
    assert_eq!(run.customer_external_id.as_deref(), Some("cust-42"));
    assert!(run.customer_id.is_some());
    assert_eq!(run.tags, ["Team:search", "Feature:chat"]);
    assert_eq!(
        run.response.as_ref().unwrap().to_value()["text"],
        "logged answer"
    );
    assert_eq!(
        run.request.as_ref().unwrap().to_value()["messages"][1]["content"][0]["text"],
        "Say hi"
    );
    // The lifecycle is stored whatever the format.
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    let stored: Vec<String> = app
        .store
        .run_events(&tenant, &id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(
        stored,
        [
            "requestStarted",
            "agentInferenceStarted",
            "agentInferenceCompleted",
            "requestCompleted"
        ]
    );
    // The customer was created on first use.
    assert_eq!(app.get("/api/v1/customers/cust-42", &key).await.status, 200);

    // Markup applies to billed cost only; a model missing from the catalogue is flagged.
    app.put("/api/v1/settings", &key, json!({"markupPercent": 10}))
        .await;
    mock.push(Reply::text("x").with_usage(1200, 300));
    let marked = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/gpt-4o-mini", json!({})),
        )
        .await;
    let run = wait_for_run(&app, marked.headers["x-request-id"].to_str().unwrap()).await;
    assert_eq!(run.cost_credits, (run.raw_cost_credits * 110 + 50) / 100);

    // The deprecated debug header tags the run on every endpoint, and its origin is recorded.
    for (path, body) in [
        (
            "/api/v1/chat/completions",
            chat("openai/gpt-4o-mini", json!({})),
        ),
        (
            "/api/v1/inference",
            json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        mock.push(Reply::text("x"));
        let response = crate::helpers::send(
            app.client
                .post(app.url(path))
                .bearer_auth(&key)
                .header("x-baton-debug-url", "https://dev.example.com/some/path")
                .json(&body),
        )
        .await;
        assert_eq!(response.status, 200, "{path}: {}", response.text);
        let run = wait_for_run(&app, response.headers["x-request-id"].to_str().unwrap()).await;
        assert_eq!(run.tags, ["DebugUrl:https://dev.example.com"], "{path}");
        assert_eq!(
            run.callback_origin.as_deref(),
            Some("https://dev.example.com")
        );
    }
    // Sent beside X-Baton-Callback-Url, which wins as the callback, it still tags the run.
    mock.push(Reply::text("x"));
    let both = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .header("x-baton-debug-url", "https://dev.example.com/some/path")
            .header("x-baton-callback-url", "https://app.example.com")
            .json(&chat("openai/gpt-4o-mini", json!({}))),
    )
    .await;
    assert_eq!(both.status, 200, "{}", both.text);
    let run = wait_for_run(&app, both.headers["x-request-id"].to_str().unwrap()).await;
    assert_eq!(run.tags, ["DebugUrl:https://dev.example.com"]);
    assert_eq!(
        run.callback_origin.as_deref(),
        Some("https://app.example.com")
    );
    let unknown = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/not-in-catalogue", json!({})),
        )
        .await;
    let run = wait_for_run(&app, unknown.headers["x-request-id"].to_str().unwrap()).await;
    assert!(run.pricing_uncertain);
    assert_eq!(run.cost_credits, 0);

    // Failures are logged as Failed; rejected input is not logged at all.
    mock.push(Reply::status(503, "overloaded"));
    let failed = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/gpt-4o-mini", json!({})),
        )
        .await;
    let run = wait_for_run(&app, failed.headers["x-request-id"].to_str().unwrap()).await;
    assert_eq!(run.status, baton_domain::run::RunStatus::Failed);
    assert_eq!(run.error_code.as_deref(), Some("PROVIDER_ERROR"));
    let stored: Vec<String> = app
        .store
        .run_events(&tenant, &run.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(
        stored,
        [
            "requestStarted",
            "agentInferenceStarted",
            "error",
            "requestFailed"
        ]
    );
    let rejected = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/gpt-4o-mini", json!({"temperature": 9})),
        )
        .await;
    assert_eq!(rejected.status, 400);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    assert!(
        app.store
            .get_run(&tenant, rejected.headers["x-request-id"].to_str().unwrap())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn streams_are_logged_and_a_client_that_leaves_still_gets_its_partial_usage_logged() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::text("streamed and logged").with_usage(30, 6));
    let streamed = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("anthropic/claude-haiku-4-5", json!({"stream": true})),
        )
        .await;
    let run = wait_for_run(&app, streamed.headers["x-request-id"].to_str().unwrap()).await;
    assert_eq!(run.status, baton_domain::run::RunStatus::Succeeded);
    assert_eq!((run.usage.tokens_in, run.usage.tokens_out), (30, 6));
    assert_eq!(
        run.response.as_ref().unwrap().to_value()["text"],
        "streamed and logged"
    );

    // A slow stream the client abandons after the first bytes.
    mock.set_stream_chunking(16, std::time::Duration::from_millis(40));
    mock.push(
        Reply::text("a long answer that the client will not wait for, ".repeat(20))
            .with_usage(50, 200),
    );
    let run = stream_and_leave(&app, &key, "anthropic/claude-haiku-4-5").await;
    assert_eq!(run.error_code.as_deref(), Some("CLIENT_DISCONNECTED"));
    assert_eq!(run.usage.tokens_in, 50, "the partial usage is kept");
    assert!(run.cost_credits > 0, "what was produced is billed");
}

/// Streams a long answer from `model` and hangs up after its first bytes; the logged run.
async fn stream_and_leave(app: &TestApp, key: &str, model: &str) -> baton_domain::run::RunRecord {
    stream_and_leave_with(app, key, model, json!({"stream": true})).await
}

/// [`stream_and_leave`] with more of the body (`extra`: the stream's format and options).
async fn stream_and_leave_with(
    app: &TestApp,
    key: &str,
    model: &str,
    extra: Value,
) -> baton_domain::run::RunRecord {
    let mut response = app
        .client
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat(model, extra))
        .send()
        .await
        .unwrap();
    let id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut received = String::new();
    while !received.contains("\"content\":\"a l") && !received.contains("\"text\":\"a l") {
        received.push_str(&String::from_utf8_lossy(
            &response.chunk().await.unwrap().unwrap(),
        ));
    }
    drop(response);
    wait_for_run(app, &id).await
}

/// OpenAI reports usage only in the stream's last chunk: a client that leaves before it is
/// billed an estimate of what was streamed and of its prompt, flagged with a warning.
#[tokio::test]
async fn a_stream_left_before_its_usage_is_billed_an_estimate() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.set_stream_chunking(16, std::time::Duration::from_millis(40));
    mock.push(
        Reply::text("a long answer that the client will not wait for, ".repeat(20))
            .with_usage(50, 200),
    );
    let run = stream_and_leave(&app, &key, "openai/gpt-4o-mini").await;
    assert_eq!(run.error_code.as_deref(), Some("CLIENT_DISCONNECTED"));
    // The answer never finished: no finish reason is invented for it.
    assert_eq!(run.finish_reason, None);
    assert_eq!(
        run.response.as_ref().unwrap().to_value()["finishReason"],
        Value::Null
    );
    // "be brief" + "Say hi": 14 characters, 4 tokens; the streamed part, at least one.
    assert_eq!(run.usage.tokens_in, 4, "{:?}", run.usage);
    assert!(run.usage.tokens_out >= 1, "{:?}", run.usage);
    assert!(run.cost_credits > 0, "what was streamed is billed");
    assert!(
        run.warnings.iter().any(|w| w.code == "USAGE_ESTIMATED"),
        "{:?}",
        run.warnings
    );
    // The lifecycle is stored too: the client's leaving, then what was billed.
    let (_, events) = run_and_events(&app, &key, &run.id).await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types[types.len() - 3..],
        ["error", "agentInferenceCompleted", "requestCompleted"]
    );
    assert_eq!(
        events[types.len() - 3]["data"]["code"],
        "CLIENT_DISCONNECTED"
    );
    assert_eq!(
        events.last().unwrap()["data"]["totalCreditsUsed"],
        run.cost_credits
    );

    // The events format stores the same ending when its client leaves.
    mock.push(
        Reply::text("a long answer that the client will not wait for, ".repeat(20))
            .with_usage(50, 200),
    );
    let run = stream_and_leave_with(
        &app,
        &key,
        "openai/gpt-4o-mini",
        json!({"stream": true, "stream_options": {"format": "events"}}),
    )
    .await;
    assert_eq!(run.error_code.as_deref(), Some("CLIENT_DISCONNECTED"));
    assert!(run.warnings.iter().any(|w| w.code == "USAGE_ESTIMATED"));
    let (_, events) = run_and_events(&app, &key, &run.id).await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        [
            "requestStarted",
            "agentInferenceStarted",
            "error",
            "agentInferenceCompleted",
            "requestCompleted"
        ]
    );
    assert_eq!(events[2]["data"]["code"], "CLIENT_DISCONNECTED");
    assert_eq!(
        events[3]["data"]["finishReason"],
        Value::Null,
        "never finished"
    );
    assert_eq!(
        events.last().unwrap()["data"]["totalCreditsUsed"],
        run.cost_credits
    );
}

/// The logged run `id` and its stored events.
async fn run_and_events(
    app: &TestApp,
    key: &str,
    id: &str,
) -> (baton_domain::run::RunRecord, Vec<Value>) {
    let run = wait_for_run(app, id).await;
    let events = app
        .get(&format!("/api/v1/llm-logs/{id}/events"), key)
        .await
        .json();
    (run, events.as_array().unwrap().clone())
}

#[tokio::test]
async fn direct_inference_in_the_service_format() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::text(r#"{"answer": 42}"#).with_usage(100, 20));
    let response = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/inference"))
            .bearer_auth(&key)
            .header("x-baton-tags", "Source:header")
            .json(&json!({
                "model": "anthropic/claude-haiku-4-5",
                "messages": [{"role": "user", "content": "The answer?"}],
                "environment": "staging",
                "temperature": 0.1, "top_k": 40, "max_tokens": 4000, "max_thinking_tokens": 2048,
                "response_schema": {"type": "object", "properties": {"answer": {"type": "integer"}}},
                "vendor_tools": ["web_search_20250305"],
                "tags": ["Source:body"], "is_debug": true, "customerId": "cust-inf"
            })),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let body = response.json();
    assert_eq!(body["json"], json!({"answer": 42}));
    assert_eq!(body["served_model"], "anthropic/claude-haiku-4-5");
    assert_eq!(body["usage"]["tokens_in"], 100);
    assert_eq!(body["finish_reason"], "stop");
    let sent = mock.received().pop().unwrap().body;
    // Anthropic refuses temperature and top_k beside a thinking budget: neither is sent.
    assert!(
        sent.get("top_k").is_none() && sent.get("temperature").is_none(),
        "{sent}"
    );
    assert_eq!(sent["thinking"]["budget_tokens"], 2048);
    assert!(
        sent["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["type"] == "web_search_20250305")
    );

    let run = wait_for_run(&app, body["id"].as_str().unwrap()).await;
    assert_eq!(run.kind, baton_domain::run::RunKind::Inference);
    assert_eq!(run.environment.as_deref(), Some("staging"));
    assert_eq!(run.tags, ["Source:body", "Source:header"]);
    assert!(run.is_debug);
    assert_eq!(run.customer_external_id.as_deref(), Some("cust-inf"));
    assert_eq!(body["usage"]["cost_credits"], run.cost_credits);

    // Field errors are named; a vendor tool the provider cannot run is refused before sending.
    let post = |b: Value| app.post("/api/v1/inference", &key, b);
    let msgs = json!([{"role": "user", "content": "x"}]);
    assert_eq!(
        post(
            json!({"model": "openai/gpt-4o-mini", "messages": msgs, "vendor_tools": ["teleport"]})
        )
        .await
        .error(400, "VALIDATION_ERROR")["param"],
        "vendor_tools[0]"
    );
    assert_eq!(
        post(json!({"model": "openai/gpt-4o-mini", "messages": msgs, "top_p": 3}))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "top_p"
    );
    assert_eq!(
        post(json!({"model": "openai/gpt-4o-mini", "messages": msgs, "response_schema": 5}))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "response_schema"
    );
    assert_eq!(
        post(json!({"model": "openai/gpt-4o-mini", "messages": msgs, "colour": 1}))
            .await
            .error(400, "VALIDATION_ERROR")["param"],
        "colour"
    );
    // The refusal names the field that asked for the tool.
    assert_eq!(
        post(json!({"model": "anthropic/claude-haiku-4-5", "messages": msgs, "vendor_tools": ["code_interpreter"]}))
            .await
            .error(400, "UNSUPPORTED")["param"],
        "vendor_tools"
    );
}

#[tokio::test]
async fn structured_output_is_validated_retried_once_then_refused() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let format = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {
        "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}}});
    for model in [
        "openai/gpt-4o-mini",
        "anthropic/claude-haiku-4-5",
        "google/gemini-2.5-flash",
        "bedrock/amazon.nova-lite-v1:0",
    ] {
        let before = mock.received().len();
        mock.push(Reply::text(r#"{"age": "old"}"#).with_usage(10, 5));
        mock.push(Reply::text(r#"{"age": 42}"#).with_usage(10, 5));
        let ok = app
            .post(
                "/api/v1/chat/completions",
                &key,
                chat(model, format.clone()),
            )
            .await;
        assert_eq!(ok.status, 200, "{model}: {}", ok.text);
        let body = ok.json();
        assert_eq!(
            body["choices"][0]["message"]["content"], r#"{"age": 42}"#,
            "{model}"
        );
        assert_eq!(
            body["usage"]["prompt_tokens"], 20,
            "{model}: both attempts are counted"
        );
        assert_eq!(mock.received().len(), before + 2);

        mock.push(Reply::text("not json"));
        mock.push(Reply::text(r#"{"name": "x"}"#));
        let refused = app
            .post(
                "/api/v1/chat/completions",
                &key,
                chat(model, format.clone()),
            )
            .await;
        let error = refused.error(502, "STRUCTURED_OUTPUT_INVALID");
        assert!(
            error["message"].as_str().unwrap().contains("age"),
            "{error}"
        );
        // The two refused answers still cost tokens: the failed run carries and bills them.
        let run = wait_for_run(&app, error["requestId"].as_str().unwrap()).await;
        assert_eq!(run.usage.tokens_in, 20, "{model}");
        assert_eq!(run.usage.tokens_out, 10, "{model}");
        assert!(run.cost_credits > 0 || run.pricing_uncertain, "{model}");
    }
    // The retry is a second model call: counted, and priced on its own (DESIGN.md rounds per
    // inference: 1,234 in and 567 out cost 525.3 credits a call, so 1,050, not 1,051).
    mock.push(Reply::text(r#"{"age": "old"}"#).with_usage(1234, 567));
    mock.push(Reply::text(r#"{"age": 42}"#).with_usage(1234, 567));
    let retried = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/gpt-4o-mini", format.clone()),
        )
        .await;
    assert_eq!(retried.status, 200, "{}", retried.text);
    let id = retried.headers["x-request-id"].to_str().unwrap();
    let (run, events) = run_and_events(&app, &key, id).await;
    assert_eq!(run.inference_count, 2);
    assert_eq!((run.usage.tokens_in, run.usage.tokens_out), (2468, 1134));
    assert_eq!(run.raw_cost_credits, 1050);
    let completed = events
        .iter()
        .find(|e| e["type"] == "requestCompleted")
        .expect("requestCompleted");
    assert_eq!(completed["data"]["totalCreditsUsed"], 1050, "{completed}");
    assert_eq!(completed["data"]["totalInferenceCount"], 2, "{completed}");
    // The same through /inference, whose answer states its cost.
    mock.push(Reply::text(r#"{"age": "old"}"#).with_usage(1234, 567));
    mock.push(Reply::text(r#"{"age": 42}"#).with_usage(1234, 567));
    let inferred = app
        .post(
            "/api/v1/inference",
            &key,
            json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
                   "response_schema": {"type": "object", "properties": {"age": {"type": "integer"}},
                                       "required": ["age"]}}),
        )
        .await;
    assert_eq!(inferred.status, 200, "{}", inferred.text);
    assert_eq!(
        inferred.json()["usage"]["cost_credits"],
        1050,
        "{}",
        inferred.text
    );

    // Streams are checked once complete: no retry (the text is with the client), an error chunk.
    let mut streamed = chat("openai/gpt-4o-mini", format.clone());
    streamed["stream"] = json!(true);
    mock.push(Reply::text(r#"{"age": "unknown"}"#));
    let response = app
        .post("/api/v1/chat/completions", &key, streamed.clone())
        .await;
    assert_eq!(response.status, 200);
    let data = sse_data(&response.text);
    let error = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|c| c.get("error").is_some())
        .expect("an error chunk");
    assert_eq!(error["error"]["code"], "STRUCTURED_OUTPUT_INVALID");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let id = response.headers["x-request-id"].to_str().unwrap();
    let run = wait_for_run(&app, id).await;
    assert_eq!(run.error_code.as_deref(), Some("STRUCTURED_OUTPUT_INVALID"));
    mock.push(Reply::text(r#"{"age": 7}"#));
    let fine = app.post("/api/v1/chat/completions", &key, streamed).await;
    assert!(!fine.text.contains("\"error\""), "{}", fine.text);

    let before = mock.received().len();
    let bad_schema = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": 7}}}});
    let err = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/gpt-4o-mini", bad_schema),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(err["param"], "response_format.json_schema.schema");
    assert_eq!(
        mock.received().len(),
        before,
        "an invalid schema never reaches the provider"
    );
}

fn envelopes(text: &str) -> Vec<Value> {
    let data = sse_data(text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The events format starts before the provider answers: a model that takes its time before
/// its first token (a reasoning model thinking) leaves the client with `requestStarted`, then
/// heartbeats, not a silent connection; one that fails before its first token ends the stream
/// with `error` and `requestFailed`, and a wait past the stream's maximum duration too, each
/// logged with its own cause.
#[tokio::test]
async fn the_events_format_starts_before_the_provider_answers() {
    let (app, mock) = app_with_mock_and(|config| config.limits.max_stream_duration_secs = 1).await;
    let key = app.default_tenant.api_key.clone();
    let events_chat = || {
        chat(
            "openai/gpt-4o-mini",
            json!({"stream": true, "stream_options": {"heartbeat_interval_ms": 100, "include_usage": false}}),
        )
    };
    mock.push(Reply::Delayed(
        std::time::Duration::from_millis(600),
        Box::new(Reply::text("Thought it over.")),
    ));
    let slow = app
        .post("/api/v1/chat/completions", &key, events_chat())
        .await;
    assert_eq!(slow.status, 200, "{}", slow.text);
    let events = envelopes(&slow.text);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &types[..3],
        ["requestStarted", "agentInferenceStarted", "heartbeat"],
        "{types:?}"
    );
    let first_text = types.iter().position(|t| *t == "contentDelta").unwrap();
    assert!(
        types[2..first_text].iter().all(|t| *t == "heartbeat"),
        "{types:?}"
    );
    assert_eq!(types.last(), Some(&"requestCompleted"));
    assert!(!types.contains(&"usageUpdate"), "include_usage: false");

    // Usage is periodic during the wait too, each tick once (not a burst of copies after it).
    mock.push(Reply::Delayed(
        std::time::Duration::from_millis(600),
        Box::new(Reply::text("Thought it over.")),
    ));
    let ticking = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat(
                "openai/gpt-4o-mini",
                json!({"stream": true, "stream_options": {"usage_interval_ms": 100}}),
            ),
        )
        .await;
    let events = envelopes(&ticking.text);
    let first_text = events
        .iter()
        .position(|e| e["type"] == "contentDelta")
        .unwrap();
    let waiting: Vec<u64> = events[..first_text]
        .iter()
        .filter(|e| e["type"] == "usageUpdate")
        .map(|e| e["data"]["elapsedMs"].as_u64().unwrap())
        .collect();
    assert!(!waiting.is_empty());
    assert!(waiting.windows(2).all(|w| w[0] < w[1]), "{waiting:?}");
    let after: Vec<u64> = events[first_text..]
        .iter()
        .filter(|e| e["type"] == "usageUpdate")
        .map(|e| e["data"]["elapsedMs"].as_u64().unwrap())
        .collect();
    assert!(after.len() <= 2, "no burst of missed ticks: {after:?}");
    // A provider error before the first token: the stream tells it, the log keeps it.
    mock.push(Reply::status(400, "this request is not for me"));
    let failed = app
        .post("/api/v1/chat/completions", &key, events_chat())
        .await;
    assert_eq!(failed.status, 200);
    let events = envelopes(&failed.text);
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
    assert_eq!(events[2]["data"]["code"], "PROVIDER_REJECTED");
    let id = failed.headers["x-request-id"].to_str().unwrap().to_string();
    let run = wait_for_run(&app, &id).await;
    assert_eq!(run.error_code.as_deref(), Some("PROVIDER_REJECTED"));
    assert_eq!(run.attempts.len(), 1, "the chain's attempt is logged");
    let (_, stored) = run_and_events(&app, &key, &id).await;
    let stored: Vec<&str> = stored.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(stored, types);

    // Waiting past the stream's maximum duration ends it, logged as that.
    mock.push(Reply::Delayed(
        std::time::Duration::from_secs(3),
        Box::new(Reply::text("too late")),
    ));
    let expired = app
        .post("/api/v1/chat/completions", &key, events_chat())
        .await;
    let events = envelopes(&expired.text);
    let last_two: Vec<&str> = events[events.len() - 2..]
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(last_two, ["error", "requestFailed"]);
    assert_eq!(
        events[events.len() - 2]["data"]["code"],
        "STREAM_DURATION_EXCEEDED"
    );
    let id = expired.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let run = wait_for_run(&app, &id).await;
    assert_eq!(run.error_code.as_deref(), Some("STREAM_DURATION_EXCEEDED"));
    assert_eq!(run.cost_credits, 0);
    // The model never answered: no served model, no call counted, nothing uncertain.
    assert_eq!(run.served_model, None);
    assert_eq!(run.inference_count, 0);
    assert!(!run.pricing_uncertain);
}

#[tokio::test]
async fn the_events_format_streams_the_lifecycle_and_stores_it() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.set_stream_chunking(24, std::time::Duration::from_millis(30));
    mock.push(Reply::text("Events arrive as they happen, piece by piece.").with_usage(40, 12));
    let response = app
        .post("/api/v1/chat/completions", &key, chat("openai/gpt-4o-mini", json!({"stream": true, "stream_options": {"usage_interval_ms": 100, "heartbeat_interval_ms": 150}})))
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let events = envelopes(&response.text);
    let request_id = response.headers["x-request-id"].to_str().unwrap();
    // The format is chunks or events; event options with chunks contradict each other;
    // `include_usage` is a boolean, in either format.
    let calls_before = mock.received().len();
    for (options, param) in [
        (json!({"format": "bogus"}), "stream_options.format"),
        (
            json!({"format": "chunks", "event_types": ["tool*"]}),
            "stream_options.format",
        ),
        (
            json!({"include_usage": "false"}),
            "stream_options.include_usage",
        ),
        (
            json!({"format": "events", "include_usage": 0}),
            "stream_options.include_usage",
        ),
    ] {
        let refused = app
            .post(
                "/api/v1/chat/completions",
                &key,
                chat(
                    "openai/gpt-4o-mini",
                    json!({"stream": true, "stream_options": options}),
                ),
            )
            .await;
        let error = refused.error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param, "{options}");
    }
    assert_eq!(mock.received().len(), calls_before);
    for event in &events {
        assert_eq!(event["requestId"], request_id);
        assert_eq!(event["depth"], 0);
        assert!(event["timestamp"].as_str().unwrap().ends_with('Z'));
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..2], ["requestStarted", "agentInferenceStarted"]);
    assert_eq!(types.last(), Some(&"requestCompleted"));
    assert!(
        types.contains(&"usageUpdate") && types.contains(&"heartbeat"),
        "{types:?}"
    );
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "contentDelta")
        .map(|e| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Events arrive as they happen, piece by piece.");
    let completed = events
        .iter()
        .find(|e| e["type"] == "agentInferenceCompleted")
        .unwrap();
    assert_eq!(completed["data"]["usage"]["tokensIn"], 40);
    assert_eq!(completed["data"]["wasFallback"], false);
    let done = &events.last().unwrap()["data"];
    assert_eq!(done["totalTokensOut"], 12);
    assert_eq!(done["result"]["textResponse"], text);

    // Stored for the log: the lifecycle, not the deltas.
    let run = wait_for_run(&app, request_id).await;
    assert_eq!(done["totalCreditsUsed"], run.cost_credits);
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    let stored: Vec<String> = app
        .store
        .run_events(&tenant, request_id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert!(
        stored.starts_with(&[
            "requestStarted".to_string(),
            "agentInferenceStarted".to_string()
        ]),
        "{stored:?}"
    );
    assert!(
        stored.contains(&"requestCompleted".to_string())
            && !stored.contains(&"contentDelta".to_string()),
        "{stored:?}"
    );

    // Filters: camelCase, dotted and wildcards; [DONE] always ends the stream.
    mock.set_stream_chunking(7, std::time::Duration::ZERO);
    mock.push(Reply::text("filtered"));
    let filtered = app
        .post("/api/v1/chat/completions", &key, chat("openai/gpt-4o-mini", json!({"stream": true, "stream_options": {"event_types": ["request.*", "agentInferenceCompleted"]}})))
        .await;
    let types: Vec<String> = envelopes(&filtered.text)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        types,
        [
            "requestStarted",
            "agentInferenceCompleted",
            "requestCompleted"
        ]
    );

    // A stream that breaks: error, then requestCompleted (something was produced).
    mock.push(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
        "cut off early in the answer",
    ))));
    let broken = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat(
                "openai/gpt-4o-mini",
                json!({"stream": true, "stream_options": {"format": "events"}}),
            ),
        )
        .await;
    let events = envelopes(&broken.text);
    let error = events
        .iter()
        .find(|e| e["type"] == "error")
        .expect("an error event");
    assert_eq!(error["data"]["recoverable"], false);
    assert_eq!(error["data"]["code"], "PROVIDER_ERROR");
    // Something was produced: the call and the request complete with what the run is billed
    // (an estimate: the provider reported no usage), not with nothing.
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types[types.len() - 2..],
        ["agentInferenceCompleted", "requestCompleted"]
    );
    let id = broken.headers["x-request-id"].to_str().unwrap().to_string();
    let run = wait_for_run(&app, &id).await;
    assert!(run.cost_credits > 0);
    let completed = &events.last().unwrap()["data"];
    assert_eq!(completed["totalCreditsUsed"], run.cost_credits);
    assert_eq!(completed["totalTokensOut"], run.usage.tokens_out);

    let bad = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat(
                "openai/gpt-4o-mini",
                json!({"stream": true, "stream_options": {"heartbeat_interval_ms": 5}}),
            ),
        )
        .await;
    assert_eq!(
        bad.error(400, "VALIDATION_ERROR")["param"],
        "stream_options.heartbeat_interval_ms"
    );
}

#[tokio::test]
async fn no_secret_is_stored_in_clear() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::text("one"));
    mock.push(Reply::status(401, "bad key"));
    mock.push(Reply::text("streamed"));
    let mut ids = Vec::new();
    for (model, stream) in [
        ("openai/gpt-4o-mini", false),
        ("anthropic/claude-haiku-4-5", false),
        ("google/gemini-2.5-flash", true),
    ] {
        let response = app
            .post(
                "/api/v1/chat/completions",
                &key,
                chat(model, json!({"stream": stream})),
            )
            .await;
        ids.push(
            response.headers["x-request-id"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    for id in &ids {
        wait_for_run(&app, id).await;
    }
    let dump = app.db.dump();
    assert!(
        dump.contains(&ids[0]),
        "the dump does not hold the runs, so it proves nothing"
    );
    for secret in [
        OPENAI_CANARY,
        ANTHROPIC_CANARY,
        GOOGLE_CANARY,
        AWS_SECRET_CANARY,
        "azure-canary-key",
        key.as_str(),
        crate::helpers::TEST_JWT_SECRET,
    ] {
        assert!(
            !dump.contains(secret),
            "a secret is stored in clear: {secret}"
        );
    }
}

/// Images reach every wire format in its own shape: data URLs as base64 with their media type,
/// https URLs by reference where the format has one (Converse has none: the next test).
#[tokio::test]
async fn images_reach_each_wire_format_in_its_own_shape() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let data_url = format!("data:image/png;base64,{PNG}");
    let https_url = "https://img.example.com/cat.jpg";
    let body = |model: &str, url: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]})
    };
    let ask = |model: &'static str, url: String| {
        let (app, key, mock) = (&app, key.clone(), &mock);
        async move {
            mock.push(Reply::text("a cat"));
            let response = app
                .post("/api/v1/chat/completions", &key, body(model, &url))
                .await;
            assert_eq!(response.status, 200, "{model}: {}", response.text);
            assert_eq!(response.json()["choices"][0]["message"]["content"], "a cat");
            mock.received().pop().unwrap().body
        }
    };

    let sent = ask("openai/gpt-4o-mini", data_url.clone()).await;
    assert_eq!(
        sent["messages"][0]["content"][1],
        json!({"type": "image_url", "image_url": {"url": data_url}})
    );
    let sent = ask("openai/gpt-4o-mini", https_url.into()).await;
    assert_eq!(
        sent["messages"][0]["content"][1]["image_url"]["url"],
        https_url
    );

    let sent = ask("anthropic/claude-haiku-4-5", data_url.clone()).await;
    assert_eq!(
        sent["messages"][0]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}})
    );
    let sent = ask("anthropic/claude-haiku-4-5", https_url.into()).await;
    assert_eq!(
        sent["messages"][0]["content"][1]["source"],
        json!({"type": "url", "url": https_url})
    );

    let sent = ask("google/gemini-2.5-flash", data_url.clone()).await;
    assert_eq!(
        sent["contents"][0]["parts"][1],
        json!({"inlineData": {"mimeType": "image/png", "data": PNG}})
    );
    let sent = ask("google/gemini-2.5-flash", https_url.into()).await;
    assert_eq!(
        sent["contents"][0]["parts"][1]["fileData"],
        json!({"mimeType": "image/jpeg", "fileUri": https_url})
    );

    let sent = ask("bedrock/amazon.nova-lite-v1:0", data_url.clone()).await;
    assert_eq!(
        sent["messages"][0]["content"][1],
        json!({"image": {"format": "png", "source": {"bytes": PNG}}})
    );
    // Converse takes inline images only: URLs are fetched for it (the next test).

    // Something that is neither: refused, naming the field.
    let error = app
        .post(
            "/api/v1/chat/completions",
            &key,
            body("openai/gpt-4o-mini", "ftp://img.example.com/cat.jpg"),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "messages[0].content[1].image_url.url");
}

/// Converse takes images only as bytes: an image URL sent to a Bedrock model is fetched through
/// the outbound guard and sent inline, typed by its bytes (whatever the server's content-type
/// says); providers that take URLs still get the URL. One that cannot be fetched, is not an
/// image, is too large, or is a private address is refused naming the part, before any call.
#[tokio::test]
async fn image_urls_are_fetched_and_sent_inline_to_providers_that_take_only_bytes() {
    use base64::Engine as _;
    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let png = base64::engine::general_purpose::STANDARD
        .decode(PNG)
        .unwrap();
    let mut huge = png.clone();
    huge.resize(3_750_001, 0);
    let host = baton_testkit::FileHost::start(&[
        ("/cat.png", "application/octet-stream", &png),
        ("/page.html", "text/html", b"<html>not an image</html>"),
        ("/huge.png", "image/png", &huge),
    ])
    .await
    .unwrap();
    let address = host.addr();
    let (app, mock) = app_with_mock_and(move |config| config.outbound_allowed.push(address)).await;
    let key = app.default_tenant.api_key.clone();
    let body = |model: &str, url: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]}]})
    };
    let bedrock = "bedrock/amazon.nova-lite-v1:0";

    mock.push(Reply::text("a cat"));
    let response = app
        .post(
            "/api/v1/chat/completions",
            &key,
            body(bedrock, &host.url("/cat.png")),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    assert_eq!(response.json()["choices"][0]["message"]["content"], "a cat");
    let sent = mock.received().pop().unwrap().body;
    assert_eq!(
        sent["messages"][0]["content"][1],
        json!({"image": {"format": "png", "source": {"bytes": PNG}}})
    );
    assert_eq!(host.requests(), 1, "fetched once");

    // Streamed, the same.
    mock.push(Reply::text("a cat"));
    let mut streamed = body(bedrock, &host.url("/cat.png"));
    streamed["stream"] = json!(true);
    let response = app.post("/api/v1/chat/completions", &key, streamed).await;
    assert_eq!(response.status, 200, "{}", response.text);
    assert!(
        response.text.contains("\"finish_reason\":\"stop\""),
        "{}",
        response.text
    );
    let sent = mock.received().pop().unwrap().body;
    assert_eq!(
        sent["messages"][0]["content"][1],
        json!({"image": {"format": "png", "source": {"bytes": PNG}}})
    );
    assert_eq!(host.requests(), 2);

    // A provider that takes URLs gets the URL; nothing is fetched.
    mock.push(Reply::text("a cat"));
    let url = host.url("/cat.png");
    let response = app
        .post(
            "/api/v1/chat/completions",
            &key,
            body("openai/gpt-4o-mini", &url),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let sent = mock.received().pop().unwrap().body;
    assert_eq!(sent["messages"][0]["content"][1]["image_url"]["url"], url);
    assert_eq!(host.requests(), 2);

    let calls = mock.received().len();
    for (url, why) in [
        (
            host.url("/page.html"),
            "is not a PNG, JPEG, GIF or WebP image",
        ),
        (host.url("/missing.png"), "answered 404"),
        (host.url("/huge.png"), "larger than 3750000 bytes"),
        // Loopback, but not the host let through: the guard refuses it unfetched.
        (
            "http://127.0.0.1:9/cat.png".to_string(),
            "could not be fetched",
        ),
    ] {
        let error = app
            .post("/api/v1/chat/completions", &key, body(bedrock, &url))
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], "messages[0].content[1].image_url.url");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(why), "{url}: {message}");
    }
    assert_eq!(mock.received().len(), calls, "no model was called");
}

/// OpenAI fields an SDK sends reach the providers in their own terms.
#[tokio::test]
async fn reasoning_effort_one_call_a_turn_and_penalties_reach_the_providers() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let extra = json!({"reasoning_effort": "high", "parallel_tool_calls": false,
                       "frequency_penalty": 0.5, "tools": tools, "service_tier": "flex",
                       "prompt_cache_key": "pck-1", "metadata": {"team": "search"},
                       "logit_bias": {"42": 1}});
    mock.push(Reply::text("ok"));
    let response = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("openai/gpt-4o-mini", extra.clone()),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let sent = mock.received().pop().unwrap().body;
    assert_eq!(sent["reasoning_effort"], "high");
    assert_eq!(sent["parallel_tool_calls"], false);
    assert_eq!(sent["frequency_penalty"], 0.5);
    // OpenAI's own options go to OpenAI as sent; fields Baton ignores do not.
    assert_eq!(sent["service_tier"], "flex");
    assert_eq!(sent["prompt_cache_key"], "pck-1");
    assert_eq!(sent["metadata"], json!({"team": "search"}));
    assert!(sent.get("logit_bias").is_none(), "{sent}");

    mock.push(Reply::text("ok"));
    let response = app
        .post(
            "/api/v1/chat/completions",
            &key,
            chat("anthropic/claude-haiku-4-5", extra),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let sent = mock.received().pop().unwrap().body;
    assert_eq!(sent["thinking"]["budget_tokens"], 24_576);
    assert_eq!(sent["tool_choice"]["disable_parallel_tool_use"], true);
    assert!(
        sent.get("frequency_penalty").is_none(),
        "Anthropic has none"
    );
    assert!(sent.get("service_tier").is_none(), "{sent}");
}
