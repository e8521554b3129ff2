//! The training load's second half: the product's paths beyond one chat call. A profile-guided
//! build treats code the training never ran as cold (laid out apart, optimised for size), so
//! without these a PGO build would run flows and agent trees slower than a plain release
//! build. Trained here: flow runs (template rendering, the environment's pinned version),
//! streamed flow runs (the events format), an agent tree (an Agent tool's sub-run, the tool
//! loop around it) and chat requests offering tools the caller runs (the call, then the
//! answer to its result; plain and streamed).
//!
//! External HTTP and MCP tools are not trained: a release build refuses loopback hosts (the
//! outbound guard, DESIGN.md "Agents, tools, safety"), and the mock is on loopback.

use anyhow::ensure;
use serde_json::{Value, json};

use crate::load::driver::{self, Target};
use crate::load::flows::{self, FlowTargets};
use crate::load::procs;
// The fast mock calls the first tool offered until a tool result is the last message.
use crate::load::BENCH_MODEL as MODEL;

/// Sets up flows and an Agent tool on a fresh Baton at `address`, then sends a mix of about
/// `requests / 2` flow runs, agent trees and tool-offering chat requests one at a time.
/// Returns the log rows they leave.
pub(super) async fn flows_and_tools(
    client: &reqwest::Client,
    address: &str,
    requests: u64,
) -> anyhow::Result<u64> {
    let flows = flows::set_up(client, address).await?;
    let chat = format!("http://{address}/api/v1/chat/completions");
    let tool_chat = |stream, answered| (chat.clone(), tool_chat(stream, answered).to_string());
    let flow_run = |target: &Target, stream: bool| {
        let body = if stream {
            &target.stream_body
        } else {
            &target.body
        };
        (target.url.clone(), body.to_string())
    };
    // (url, body, count, log rows each)
    let mix = [
        (
            flow_run(&flows.plain, false),
            requests / 4,
            FlowTargets::PLAIN_ROWS,
        ),
        (
            flow_run(&flows.plain, true),
            requests / 20,
            FlowTargets::PLAIN_ROWS,
        ),
        (
            flow_run(&flows.agent_tree, false),
            requests / 20,
            FlowTargets::AGENT_TREE_ROWS,
        ),
        (tool_chat(false, false), requests / 20, 1),
        (tool_chat(true, false), requests / 20, 1),
        (tool_chat(false, true), requests / 20, 1),
        (tool_chat(true, true), requests / 40, 1),
    ];
    let mut rows = 0;
    for ((url, body), count, rows_each) in &mix {
        for _ in 0..*count {
            send(client, url, body).await?;
        }
        rows += count * rows_each;
    }
    Ok(rows)
}

/// A chat request offering a tool the caller runs: the model's call of it, or (`answered`) the
/// model's answer once the call's result is in the conversation.
fn tool_chat(stream: bool, answered: bool) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "What is the weather in Lyon?"})];
    if answered {
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Lyon\"}"}}]}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}));
    }
    json!({
        "model": MODEL,
        "stream": stream,
        "messages": messages,
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}],
    })
}

/// One request read to its end; a streamed one must end with `[DONE]`.
async fn send(client: &reqwest::Client, url: &str, body: &str) -> anyhow::Result<()> {
    let response = client
        .post(url)
        .bearer_auth(procs::BOOTSTRAP_KEY)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await?;
    let status = response.status();
    let streamed = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let text = response.text().await?;
    if let Err(error) = driver::answered(status, text.as_bytes()) {
        anyhow::bail!("training request to {url} failed: {error}");
    }
    ensure!(
        !streamed || text.trim_end().ends_with("data: [DONE]"),
        "training stream from {url} ended without [DONE]"
    );
    Ok(())
}
