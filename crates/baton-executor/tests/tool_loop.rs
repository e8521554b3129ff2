//! The loop against a real tool host on loopback, with a scripted model.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton_domain::Timestamp;
use baton_domain::chat::{InferenceRequest, InferenceResponse, Role, ToolCall, Usage};
use baton_domain::run::ToolCallRecord;
use baton_domain::tool::{McpServer, Tool, ToolInput};
use baton_executor::{Dispatcher, McpDirectory, ModelTurns, ToolEvents, ToolSet, run_tool_loop};
use baton_testkit::tool_host::ToolHost;
use baton_tools::external::CallContext;
use baton_tools::{GuardPolicy, GuardedClient};
use serde_json::{Map, Value, json};

struct Script {
    replies: VecDeque<InferenceResponse>,
    seen: Vec<InferenceRequest>,
}

#[async_trait]
impl ModelTurns for Script {
    type Error = String;
    async fn call(&mut self, request: &mut InferenceRequest) -> Result<InferenceResponse, String> {
        self.seen.push(request.clone());
        self.replies
            .pop_front()
            .ok_or_else(|| "script ran out".to_string())
    }
}

fn answer(text: &str, calls: &[(&str, &str, Value)]) -> InferenceResponse {
    InferenceResponse {
        text: text.into(),
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall {
                id: (*id).into(),
                name: (*name).into(),
                arguments: args.to_string(),
            })
            .collect(),
        usage: Usage {
            tokens_in: 10,
            tokens_out: 2,
            ..Usage::default()
        },
        ..InferenceResponse::default()
    }
}

#[derive(Default)]
struct Recorder {
    started: Vec<String>,
    finished: Vec<ToolCallRecord>,
}

impl ToolEvents for Recorder {
    fn tool_started(&mut self, call: &ToolCall, _: &Map<String, Value>, _: &ToolCallRecord) {
        self.started.push(call.id.clone());
    }
    fn tool_finished(&mut self, record: &ToolCallRecord, _: &str) {
        self.finished.push(record.clone());
    }
}

struct NoMcp;

#[async_trait]
impl McpDirectory for NoMcp {
    async fn server(&self, _: &str) -> Option<McpServer> {
        None
    }
}

fn tool(body: Value) -> Tool {
    let input: ToolInput = serde_json::from_value(body).unwrap();
    input
        .validate()
        .unwrap()
        .into_tool("t".into(), Timestamp::now(), Timestamp::now())
}

#[tokio::test]
async fn calls_of_one_turn_run_in_parallel() {
    let host = ToolHost::start().await.unwrap();
    let client = GuardedClient::new(
        GuardPolicy::strict().allowing(host.addr()),
        Duration::from_secs(5),
    )
    .unwrap();
    let tools = ToolSet::new([tool(json!({
        "name": "nap", "toolType": "External", "webUrl": format!("{}/sleep", host.origin()),
        "parameters": {"properties": [{"name": "ms", "type": "Integer", "required": true}]}
    }))]);
    let parameters = HashMap::new();
    let dispatcher = Dispatcher {
        client: &client,
        context: CallContext {
            environment: None,
            parameters: &parameters,
            callback_url: None,
            callback_token: None,
            callback_origins: &[],
        },
        mcp: &NoMcp,
        agents: None,
        agent_context: None,
        deadline: None,
        timeout: Duration::from_secs(5),
        max_result_bytes: 1024 * 1024,
        max_agent_calls_per_turn: 8,
    };
    let mut model = Script {
        replies: VecDeque::from([
            answer(
                "",
                &[
                    ("a", "nap", json!({"ms": 300})),
                    ("b", "nap", json!({"ms": 300})),
                ],
            ),
            answer("rested", &[]),
        ]),
        seen: Vec::new(),
    };
    let mut events = Recorder::default();
    let mut request = InferenceRequest::default();
    let started = Instant::now();
    let outcome = run_tool_loop(
        &mut model,
        &mut request,
        &tools,
        &dispatcher,
        &mut events,
        5,
    )
    .await
    .unwrap();
    let elapsed = started.elapsed();
    // Two 300 ms calls one after the other would take 600 ms.
    assert!(elapsed < Duration::from_millis(550), "took {elapsed:?}");
    assert_eq!(outcome.response.text, "rested");
    assert_eq!(outcome.response.usage.tokens_in, 20);
    assert_eq!(outcome.inferences, 2);
    assert_eq!(events.started, ["a", "b"]);
    assert!(events.finished.iter().all(|r| r.status == "succeeded"));
    assert!(events.finished.iter().all(|r| r.duration_ms >= 300));
    // Results go back in call order, each under its call id.
    let second = &model.seen[1].messages;
    let results: Vec<&str> = second
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.tool_call_id.as_deref().unwrap())
        .collect();
    assert_eq!(results, ["a", "b"]);
    assert_eq!(host.requests().len(), 2);
}

#[tokio::test]
async fn a_model_failure_keeps_what_was_spent() {
    let client = GuardedClient::new(GuardPolicy::strict(), Duration::from_secs(1)).unwrap();
    let tools = ToolSet::new([tool(
        json!({"name": "t", "toolType": "External", "webUrl": "/x"}),
    )]);
    let parameters = HashMap::new();
    let dispatcher = Dispatcher {
        client: &client,
        context: CallContext {
            environment: None,
            parameters: &parameters,
            callback_url: None,
            callback_token: None,
            callback_origins: &[],
        },
        mcp: &NoMcp,
        agents: None,
        agent_context: None,
        deadline: None,
        timeout: Duration::from_secs(1),
        max_result_bytes: 1024 * 1024,
        max_agent_calls_per_turn: 8,
    };
    let mut model = Script {
        replies: VecDeque::from([answer("", &[("a", "t", json!({}))])]),
        seen: Vec::new(),
    };
    let mut events = Recorder::default();
    let failure = run_tool_loop(
        &mut model,
        &mut InferenceRequest::default(),
        &tools,
        &dispatcher,
        &mut events,
        5,
    )
    .await
    .unwrap_err();
    assert_eq!(failure.error, "script ran out");
    assert_eq!(failure.usage.tokens_in, 10);
    assert_eq!(failure.tool_calls.len(), 1);
    assert_eq!(failure.tool_calls[0].status, "failed");
    assert!(events.started.is_empty(), "an unbound call does not start");
}
