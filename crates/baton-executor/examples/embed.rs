//! Embeds Baton's engine without the HTTP server: an in-memory store, one OpenAI-compatible
//! provider, a flow whose template has an Agent tool calling a second flow, run streamed.
//!
//! ```text
//! cargo run -p baton-executor --example embed                      # offline, against the testkit mock
//! cargo run -p baton-executor --example embed -- --base-url https://api.openai.com/v1 \
//!     --api-key "$OPENAI_API_KEY" --model gpt-4o-mini
//! ```
//!
//! `BATON_EMBED_BASE_URL`, `BATON_EMBED_API_KEY` and `BATON_EMBED_MODEL` work too. Prints each
//! event envelope as a JSON line, then the final answer.
#![allow(clippy::print_stdout)]

use std::sync::Arc;

use baton_domain::TenantId;
use baton_executor::memory::{agent_tool, template};
use baton_executor::{Engine, EngineConfig, FlowRunRequest, MemoryStore};
use baton_providers::{Catalogue, ProviderConfig, ProvidersConfig, Registry};
use baton_testkit::{MockProvider, Reply};
use futures::StreamExt;
use serde_json::json;

/// `--name value`, else the environment variable.
fn option(args: &[String], name: &str, env: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
        .filter(|v| !v.is_empty())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = option(&args, "--model", "BATON_EMBED_MODEL").unwrap_or("gpt-4o-mini".into());
    // Without a base URL the example answers itself: the testkit mock, scripted.
    let mut _mock = None;
    let base_url = match option(&args, "--base-url", "BATON_EMBED_BASE_URL") {
        Some(url) => url,
        None => {
            let mock = MockProvider::start().await?;
            mock.push(Reply::tool_call(
                "researcher",
                json!({"input": "why the sea has tides"}),
            ));
            mock.push(Reply::text("The moon's gravity pulls the oceans."));
            mock.push(Reply::text(
                "Tides come from the moon's pull on the oceans (per the researcher).",
            ));
            let url = mock.openai_base();
            _mock = Some(mock);
            url
        }
    };
    let api_key = option(&args, "--api-key", "BATON_EMBED_API_KEY").unwrap_or("offline".into());

    let providers = ProvidersConfig::from([(
        "openai".to_string(),
        ProviderConfig {
            base_url: Some(base_url),
            api_key: Some(api_key.into()),
            ..ProviderConfig::default()
        },
    )]);
    let registry = Registry::from_config(&providers, Arc::new(Catalogue::shipped()?))?;
    let store = MemoryStore::new();
    let engine = Engine::new(
        EngineConfig::default(),
        Arc::new(registry),
        Arc::new(store.clone()),
        Arc::new(store.clone()),
    )?;

    let tenant = TenantId::new("example");
    let llm = format!("openai/{model}");
    store.add_flow(
        &tenant,
        "researcher",
        "production",
        "main",
        vec![template(
            "main",
            "You research a topic and answer in one sentence.",
            &llm,
        )],
    );
    store.add_tool(
        &tenant,
        agent_tool("researcher", "Researches a topic", "researcher"),
    );
    let mut writer = template(
        "main",
        "Answer the question. Ask the researcher tool first.",
        &llm,
    );
    writer.user_template = Some("[[question]]".into());
    writer.tool_ids = vec!["researcher".into()];
    store.add_flow(&tenant, "writer", "production", "main", vec![writer]);

    let mut request =
        FlowRunRequest::new(tenant.clone(), uuid::Uuid::now_v7().to_string(), "writer");
    request.parameters = json!({"question": "Why does the sea have tides?"})
        .as_object()
        .cloned();
    let mut events = engine.run_flow_stream(request).await?;
    let mut answer = None;
    while let Some(envelope) = events.next().await {
        println!("{envelope}");
        if envelope["type"] == "requestCompleted" {
            answer = envelope["data"]["result"]["textResponse"]
                .as_str()
                .map(str::to_string);
        }
    }
    println!();
    match answer {
        Some(text) => println!("answer: {text}"),
        None => println!("the run failed: see the error event above"),
    }
    println!("runs logged: {}", store.runs(&tenant).len());
    Ok(())
}
