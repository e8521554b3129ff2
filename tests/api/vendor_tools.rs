//! Vendor tools on OpenAI and Azure: requests with `web_search` / `code_interpreter` go to the
//! Responses API, and the searches it reports are logged and billed.
//!
//! `/api/v1/inference` takes them as `vendor_tools`, `/chat/completions` as tools of their own
//! type (`{"type": "web_search"}`); the provider-level stream cases drive the OpenAI provider
//! itself against the mock at awkward byte boundaries.

use std::time::Duration;

use baton_domain::chat::{InferenceRequest, Message, ResponseAccumulator, Role, VendorTool};
use baton_providers::openai::{Flavor, OpenAiProvider};
use baton_providers::{Provider, ProviderError};
use baton_testkit::{MockProvider, Reply, ToolCallReply};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::chat::{app_with_mock, wait_for_run};

/// The catalogue's OpenAI web search fee (`webSearchCreditsPerCall.openai`).
const OPENAI_SEARCH_FEE: i64 = 10_000;

fn has_tool(body: &Value, kind: &str) -> bool {
    body["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["type"] == kind))
}

fn inference(model: &str, tools: &[&str]) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "system", "content": "cite sources"},
                     {"role": "user", "content": "When did Rust 1.0 ship?"}],
        "max_tokens": 200,
        "vendor_tools": tools,
    })
}

#[tokio::test]
async fn openai_web_search_goes_to_the_responses_api_and_is_billed() {
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

    mock.push(
        Reply::text("Rust 1.0 shipped on 15 May 2015.")
            .with_usage(1200, 300)
            .with_web_search(
                2,
                &[
                    (
                        "https://blog.rust-lang.org/2015/05/15/Rust-1.0.html",
                        "Rust 1.0",
                    ),
                    (
                        "https://en.wikipedia.org/wiki/Rust_(programming_language)",
                        "Rust",
                    ),
                ],
            ),
    );
    let response = app
        .post(
            "/api/v1/inference",
            &key,
            inference("openai/gpt-4o-mini", &["web_search"]),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let body = response.json();
    assert_eq!(body["text"], "Rust 1.0 shipped on 15 May 2015.");
    assert_eq!(body["finish_reason"], "stop");
    assert_eq!(
        body["citations"],
        json!([
            {"url": "https://blog.rust-lang.org/2015/05/15/Rust-1.0.html", "title": "Rust 1.0"},
            {"url": "https://en.wikipedia.org/wiki/Rust_(programming_language)", "title": "Rust"},
        ])
    );
    assert_eq!(body["usage"]["tokens_in"], 1200);

    let sent = mock.received().pop().unwrap();
    assert_eq!(sent.path, "/v1/responses");
    assert_eq!(
        sent.headers["authorization"],
        "Bearer sk-canary-openai-5f1e0c"
    );
    assert!(has_tool(&sent.body, "web_search"), "{}", sent.body);
    assert_eq!(sent.body["model"], "gpt-4o-mini");
    assert_eq!(sent.body["instructions"], "cite sources");
    assert_eq!(sent.body["max_output_tokens"], 200);
    assert_eq!(
        sent.body["input"][0]["content"][0],
        json!({"type": "input_text", "text": "When did Rust 1.0 ship?"})
    );
    assert!(sent.body.get("messages").is_none());

    let run = wait_for_run(&app, body["id"].as_str().unwrap()).await;
    assert_eq!(run.usage.web_search_calls, 2);
    assert_eq!((run.usage.tokens_in, run.usage.tokens_out), (1200, 300));
    let micro = 1200 * mini["inputCreditsPerMillion"].as_i64().unwrap() as i128
        + 300 * mini["outputCreditsPerMillion"].as_i64().unwrap() as i128;
    let tokens = ((micro + 500_000) / 1_000_000) as i64;
    assert_eq!(
        run.raw_cost_credits,
        tokens + 2 * OPENAI_SEARCH_FEE,
        "each search is priced from the catalogue"
    );
    assert_eq!(body["usage"]["cost_credits"], run.cost_credits);

    // Without vendor tools the same model stays on Chat Completions.
    let plain = app
        .post(
            "/api/v1/inference",
            &key,
            inference("openai/gpt-4o-mini", &[]),
        )
        .await;
    assert_eq!(plain.status, 200, "{}", plain.text);
    assert_eq!(mock.received().pop().unwrap().path, "/v1/chat/completions");
}

#[tokio::test]
async fn azure_vendor_tools_use_the_v1_responses_path() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(
        Reply::text("Computed and searched.")
            .with_usage(50, 10)
            .with_web_search(1, &[("https://learn.microsoft.com/azure", "Azure docs")]),
    );
    let response = app
        .post(
            "/api/v1/inference",
            &key,
            inference("azure/my-deployment", &["web_search", "code_interpreter"]),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let body = response.json();
    assert_eq!(body["text"], "Computed and searched.");
    assert_eq!(
        body["citations"][0]["url"],
        "https://learn.microsoft.com/azure"
    );

    let sent = mock.received().pop().unwrap();
    assert_eq!(sent.path, "/openai/v1/responses");
    assert_eq!(sent.headers["api-key"], "azure-canary-key");
    assert!(sent.headers.get("authorization").is_none());
    assert_eq!(
        sent.body["model"], "my-deployment",
        "the deployment is the model"
    );
    assert!(has_tool(&sent.body, "web_search"));
    assert_eq!(
        sent.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "code_interpreter")
            .unwrap()["container"],
        json!({"type": "auto"})
    );
    let run = wait_for_run(&app, body["id"].as_str().unwrap()).await;
    assert_eq!(run.usage.web_search_calls, 1);
}

#[tokio::test]
async fn responses_api_failures_are_classified_and_other_servers_refuse_vendor_tools() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::status(429, "Rate limit reached for web search"));
    let failed = app
        .post(
            "/api/v1/inference",
            &key,
            inference("openai/gpt-4o-mini", &["web_search"]),
        )
        .await;
    let error = failed.error(502, "PROVIDER_ERROR");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("Rate limit reached"), "{message}");
    assert!(!failed.text.contains("sk-canary-openai"), "the key leaked");
    assert_eq!(mock.received().pop().unwrap().path, "/v1/responses");

    // An operator-declared compatible server has no Responses API: refused before sending.
    let before = mock.received().len();
    let refused = app
        .post(
            "/api/v1/inference",
            &key,
            inference("local/llama-3", &["web_search"]),
        )
        .await;
    assert_eq!(refused.error(400, "UNSUPPORTED")["param"], "vendor_tools");
    assert_eq!(mock.received().len(), before, "nothing reached the server");
}

fn provider(flavor: Flavor, base: String) -> OpenAiProvider {
    OpenAiProvider::new(
        "openai",
        flavor,
        base,
        Some("sk-stream-canary".into()),
        baton_providers::http::ProviderClient::new(None).unwrap(),
        None,
    )
}

fn stream_request(tools: Vec<VendorTool>) -> InferenceRequest {
    InferenceRequest {
        model: "gpt-4o-mini".into(),
        messages: vec![Message::text(Role::User, "Search, then look up.")],
        vendor_tools: tools,
        stream_usage: true,
        ..InferenceRequest::default()
    }
}

#[tokio::test]
async fn web_search_streams_text_citations_calls_and_search_count() {
    let mock = MockProvider::start().await.unwrap();
    // 3-byte pieces: events and UTF-8 characters split across reads.
    mock.set_stream_chunking(3, Duration::ZERO);
    let openai = provider(Flavor::OpenAi, mock.openai_base());
    mock.push(
        Reply::Answer {
            text: "Grüße — found it ✓".into(),
            tool_calls: vec![ToolCallReply {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: json!({"q": "héllo ✓"}),
            }],
            tokens_in: 40,
            tokens_out: 12,
            model: None,
            web_searches: 0,
            citations: Vec::new(),
        }
        .with_web_search(3, &[("https://a.example/ü", "A")]),
    );
    let mut stream = openai
        .infer_stream(&stream_request(vec![VendorTool::WebSearch]))
        .await
        .unwrap();
    let mut acc = ResponseAccumulator::new("gpt-4o-mini");
    while let Some(delta) = stream.next().await {
        acc.push(&delta.unwrap());
    }
    assert!(acc.is_finished());
    let r = acc.finish();
    assert_eq!(r.text, "Grüße — found it ✓");
    assert_eq!(r.citations.len(), 1);
    assert_eq!(r.citations[0].url, "https://a.example/ü");
    assert_eq!(r.citations[0].title.as_deref(), Some("A"));
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].id, "call_1");
    assert_eq!(
        serde_json::from_str::<Value>(&r.tool_calls[0].arguments).unwrap(),
        json!({"q": "héllo ✓"})
    );
    assert_eq!(r.usage.web_search_calls, 3);
    assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (40, 12));
    assert_eq!(r.finish_reason.as_openai(), "tool_calls");

    let sent = mock.received().pop().unwrap();
    assert_eq!(sent.path, "/v1/responses");
    assert_eq!(sent.body["stream"], true);
    assert!(has_tool(&sent.body, "web_search"));
    assert_eq!(sent.headers["authorization"], "Bearer sk-stream-canary");

    // Azure streams from its v1 path with its header.
    let azure = provider(
        Flavor::Azure {
            api_version: "2024-10-21".into(),
        },
        mock.root(),
    );
    mock.push(Reply::text("Azure stream").with_web_search(1, &[]));
    let mut stream = azure
        .infer_stream(&stream_request(vec![
            VendorTool::CodeInterpreter,
            VendorTool::WebSearch,
        ]))
        .await
        .unwrap();
    let mut acc = ResponseAccumulator::new("gpt-4o-mini");
    while let Some(delta) = stream.next().await {
        acc.push(&delta.unwrap());
    }
    let r = acc.finish();
    assert_eq!(
        (r.text.as_str(), r.usage.web_search_calls),
        ("Azure stream", 1)
    );
    let sent = mock.received().pop().unwrap();
    assert_eq!(sent.path, "/openai/v1/responses");
    assert_eq!(sent.headers["api-key"], "sk-stream-canary");

    // A stream that breaks mid-way ends in an error, not a silent short answer.
    mock.push(Reply::BreakAfterFirstChunk(Box::new(
        Reply::text("never finished").with_web_search(1, &[]),
    )));
    let mut stream = openai
        .infer_stream(&stream_request(vec![VendorTool::WebSearch]))
        .await
        .unwrap();
    let mut failure = None;
    while let Some(delta) = stream.next().await {
        if let Err(err) = delta {
            failure = Some(err);
            break;
        }
    }
    let failure = failure.expect("the broken stream reports an error");
    assert!(
        matches!(
            failure,
            ProviderError::Connection { .. } | ProviderError::InvalidResponse { .. }
        ),
        "{failure:?}"
    );
    assert!(!failure.to_string().contains("sk-stream-canary"));
}

#[tokio::test]
async fn the_compatible_endpoint_takes_vendor_tools_as_typed_tools() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let body = json!({
        "model": "openai/gpt-4o-mini",
        "messages": [{"role": "user", "content": "When did Rust 1.0 ship?"}],
        "tools": [{"type": "web_search"}],
    });
    let reply = || {
        Reply::text("On 15 May 2015.").with_web_search(
            1,
            &[(
                "https://blog.rust-lang.org/2015/05/15/Rust-1.0.html",
                "Rust 1.0",
            )],
        )
    };

    mock.push(reply());
    let response = app
        .post("/api/v1/chat/completions", &key, body.clone())
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let completion = response.json();
    let message = &completion["choices"][0]["message"];
    assert_eq!(message["content"], "On 15 May 2015.");
    assert_eq!(
        message["annotations"][0]["url_citation"]["url"],
        "https://blog.rust-lang.org/2015/05/15/Rust-1.0.html"
    );
    let sent = mock.received().pop().unwrap();
    assert_eq!(sent.path, "/v1/responses");
    assert!(has_tool(&sent.body, "web_search"), "{}", sent.body);
    let run = wait_for_run(&app, completion["id"].as_str().unwrap()).await;
    assert_eq!(run.usage.web_search_calls, 1);

    mock.push(reply());
    let mut streamed_body = body;
    streamed_body["stream"] = json!(true);
    let streamed = app
        .post("/api/v1/chat/completions", &key, streamed_body)
        .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text);
    let text: String = streamed
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "On 15 May 2015.");
    assert_eq!(mock.received().pop().unwrap().path, "/v1/responses");
    let id = streamed.headers["x-request-id"].to_str().unwrap();
    assert_eq!(wait_for_run(&app, id).await.usage.web_search_calls, 1);

    // Anthropic's own search tool name is refused by OpenAI before any call.
    let calls = mock.received().len();
    let refused = app
        .post(
            "/api/v1/chat/completions",
            &key,
            json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "web_search_20250305"}]}),
        )
        .await;
    assert_eq!(
        refused.error(400, "UNSUPPORTED")["param"],
        "tools",
        "OpenAI's format carries it in tools"
    );
    assert_eq!(mock.received().len(), calls);
}
