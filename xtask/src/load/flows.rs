//! Flow runs as benchmark and training targets: a plain flow (its template rendered with the
//! request's parameters, the version pinned to an environment, one model call) and an agent
//! tree (a flow whose Agent tool runs a second flow: three model calls, two runs), set up
//! through Baton's API against the fast mock, which calls the first tool offered until a tool
//! result is the last message.

use std::sync::Arc;

use serde_json::{Value, json};

use super::BENCH_MODEL as MODEL;
use super::driver::{self, Target};
use super::procs;

const ENVIRONMENT: &str = "production";

/// The run targets of a plain flow and of an agent tree.
pub struct FlowTargets {
    pub plain: Target,
    pub agent_tree: Target,
}

/// What a run of each leaves in the invocation log: one row, or two for the agent tree (its
/// root and its sub-agent's run).
impl FlowTargets {
    pub const PLAIN_ROWS: u64 = 1;
    pub const AGENT_TREE_ROWS: u64 = 2;
}

/// Creates the environment, the flows and the Agent tool on the Baton at `address` (the bench
/// key's tenant): the two flows' run targets, synchronous (`body`) and streamed
/// (`stream_body`, the events format).
pub async fn set_up(client: &reqwest::Client, address: &str) -> anyhow::Result<FlowTargets> {
    let base = format!("http://{address}/api/v1");
    let key = procs::BOOTSTRAP_KEY;
    driver::ensure_environment(client, &base, key, ENVIRONMENT).await?;
    let flow = |title: &'static str, template: Value| {
        driver::pinned_flow(client, &base, key, title, template, ENVIRONMENT)
    };
    let plain = flow(
        "Bench plain",
        json!({"template": "You answer questions about [[topic]] in one sentence.",
               "userTemplate": "[[question]]", "llm": MODEL}),
    )
    .await?;
    let researcher = flow(
        "Bench researcher",
        json!({"template": "Research the question.", "userTemplate": "[[input]]", "llm": MODEL}),
    )
    .await?;
    let agent_tool = driver::agent_tool(client, &base, key, "researcher", &researcher).await?;
    let delegating = flow(
        "Bench agent",
        json!({"template": "Delegate to the researcher.", "userTemplate": "[[question]]",
               "toolIds": [agent_tool], "llm": MODEL}),
    )
    .await?;
    let target = |flow: &str| {
        let url = format!("{base}/flows/{flow}/runs");
        let run = |stream: bool| {
            Arc::new(
                json!({"environment": ENVIRONMENT, "stream": stream,
                       "parameters": {"topic": "geography", "question": "Where is Lyon?"}})
                .to_string(),
            )
        };
        Target {
            long_url: url.clone(),
            url,
            key: Some(key.to_string()),
            body: run(false),
            stream_body: run(true),
            long_stream_body: run(true),
        }
    };
    Ok(FlowTargets {
        plain: target(&plain),
        agent_tree: target(&delegating),
    })
}
