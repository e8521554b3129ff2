//! The tool-calling loop (SPEC.md "Tool-calling loop"): send the conversation and the tools;
//! if the model asks for tools, run every call of that turn in parallel, append the results and
//! ask again; stop at a final answer, or after `maxToolCalls` tool turns, when the model is told
//! to answer without tools and the run gets a warning.

use std::time::Instant;

use async_trait::async_trait;
use baton_domain::chat::{
    ContentPart, FinishReason, InferenceRequest, InferenceResponse, Message, Role, ToolCall,
    ToolChoice, Usage,
};
use baton_domain::run::{RunWarning, ToolCallRecord};
use baton_domain::tool::ToolType;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::{Map, Value};

use crate::dispatch::{Dispatcher, ToolOutcome};
use crate::toolset::ToolSet;

/// Tool turns allowed when a template sets no `maxToolCalls`.
pub const DEFAULT_MAX_TOOL_ITERATIONS: u32 = 10;

/// The model side of the loop: one call per turn. The implementation routes, logs and prices
/// each call; the loop only needs the answer.
#[async_trait]
pub trait ModelTurns: Send {
    type Error: Send;
    async fn call(
        &mut self,
        request: &mut InferenceRequest,
    ) -> Result<InferenceResponse, Self::Error>;

    /// Asked before each turn of tool calls: an error (a cancellation) stops the loop there.
    async fn proceed(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Observers of tool calls (the events stream, the log). Calls of one turn finish in any order.
pub trait ToolEvents: Send {
    /// The call is bound and about to run.
    fn tool_started(
        &mut self,
        call: &ToolCall,
        arguments: &Map<String, Value>,
        record: &ToolCallRecord,
    );
    /// The call finished; `record.status` says how. `output` is what the model receives.
    fn tool_finished(&mut self, record: &ToolCallRecord, output: &str);
}

/// A loop that reached a final answer.
#[derive(Debug)]
pub struct LoopOutcome {
    /// The last model answer, with the whole loop's usage.
    pub response: InferenceResponse,
    pub tool_calls: Vec<ToolCallRecord>,
    pub warnings: Vec<RunWarning>,
    /// Model calls made.
    pub inferences: u32,
}

/// A model call failed mid-loop: what was spent and done before it still counts.
#[derive(Debug)]
pub struct LoopFailure<E> {
    pub error: E,
    pub usage: Usage,
    pub tool_calls: Vec<ToolCallRecord>,
    /// Model calls that answered before the failure.
    pub inferences: u32,
    /// The last answer's text (empty when none had text).
    pub last_text: String,
    /// The last answer, when the loop stopped before running the tool calls it asked for (a
    /// cancel noticed between the answer and its calls): the run's output as it stood.
    pub unanswered: Option<InferenceResponse>,
}

const LIMIT_NOTE: &str = "The tool call limit of this conversation has been reached. Answer now with the information you have; no more tools can be called.";

/// Runs the loop on `request` (its messages grow with every turn).
pub async fn run_tool_loop<M: ModelTurns>(
    model: &mut M,
    request: &mut InferenceRequest,
    tools: &ToolSet,
    dispatcher: &Dispatcher<'_>,
    events: &mut dyn ToolEvents,
    max_iterations: u32,
) -> Result<LoopOutcome, LoopFailure<M::Error>> {
    request.tools = tools.definitions().to_vec();
    for vendor in tools.vendor_tools() {
        if !request.vendor_tools.contains(vendor) {
            request.vendor_tools.push(*vendor);
        }
    }
    let mut usage = Usage::default();
    let mut records: Vec<ToolCallRecord> = Vec::new();
    let mut warnings = Vec::new();
    let mut turn: u32 = 0;
    let mut last_text = String::new();
    if max_iterations == 0 {
        // No tool turn allowed at all: the model is asked to answer without calling any.
        request.tool_choice = Some(ToolChoice::None);
    }
    loop {
        let mut response = match model.call(request).await {
            Ok(response) => response,
            Err(error) => {
                return Err(LoopFailure {
                    error,
                    usage,
                    tool_calls: records,
                    inferences: turn,
                    last_text,
                    unanswered: None,
                });
            }
        };
        if !response.text.is_empty() {
            last_text.clone_from(&response.text);
        }
        usage.add(response.usage);
        let limit_reached = turn >= max_iterations;
        if response.tool_calls.is_empty() || limit_reached {
            if limit_reached && !response.tool_calls.is_empty() {
                // Told to stop, it asked again: its calls are not run, and the answer is what
                // it said (a finish reason of `tool_calls` would promise calls that never come).
                response.tool_calls.clear();
                response.finish_reason = FinishReason::Stop;
                if max_iterations == 0 {
                    warnings.push(limit_warning(max_iterations));
                }
            }
            response.usage = usage;
            return Ok(LoopOutcome {
                response,
                tool_calls: records,
                warnings,
                inferences: turn + 1,
            });
        }
        if let Err(error) = model.proceed().await {
            return Err(LoopFailure {
                error,
                usage,
                tool_calls: records,
                inferences: turn + 1,
                last_text,
                unanswered: Some(response),
            });
        }
        let calls = response.tool_calls.clone();
        request.messages.push(Message {
            role: Role::Assistant,
            content: if response.text.is_empty() {
                Vec::new()
            } else {
                vec![ContentPart::Text {
                    text: response.text.clone(),
                }]
            },
            tool_calls: calls.clone(),
            tool_call_id: None,
            name: None,
        });
        let results = run_turn(&calls, turn, tools, dispatcher, events, &mut records).await;
        for (call, output) in calls.iter().zip(results) {
            request.messages.push(Message {
                role: Role::Tool,
                content: vec![ContentPart::Text { text: output }],
                tool_calls: Vec::new(),
                tool_call_id: Some(call.id.clone()),
                name: Some(call.name.clone()),
            });
        }
        turn += 1;
        if turn >= max_iterations {
            request.tool_choice = Some(ToolChoice::None);
            request.messages.push(Message::text(Role::User, LIMIT_NOTE));
            warnings.push(limit_warning(max_iterations));
        }
    }
}

fn limit_warning(max_iterations: u32) -> RunWarning {
    let message = if max_iterations == 0 {
        "the model asked for tools, but maxToolCalls is 0: its calls were not run and it was asked to answer without tools".to_string()
    } else {
        format!(
            "the model used all {max_iterations} tool turns (maxToolCalls); it was asked to answer without more tools"
        )
    };
    RunWarning {
        code: "MAX_TOOL_CALLS_REACHED".into(),
        message,
        parameter: Some("maxToolCalls".into()),
    }
}

/// Runs every call of one turn concurrently; returns the model's text per call, in call order.
async fn run_turn(
    calls: &[ToolCall],
    turn: u32,
    tools: &ToolSet,
    dispatcher: &Dispatcher<'_>,
    events: &mut dyn ToolEvents,
    records: &mut Vec<ToolCallRecord>,
) -> Vec<String> {
    let first_record = records.len();
    let mut outputs: Vec<String> = vec![String::new(); calls.len()];
    let mut running = FuturesUnordered::new();
    // Sub-agents this turn starts; past the bound, further ones fail (in call order).
    let mut agents_started: usize = 0;
    for (index, call) in calls.iter().enumerate() {
        let mut record = ToolCallRecord {
            call_id: call.id.clone(),
            tool_name: call.name.clone(),
            tool_type: String::new(),
            status: "failed".into(),
            target_url: None,
            origin_source: None,
            duration_ms: 0,
            error: None,
            turn,
            child_request_id: None,
            child_credits_used: None,
        };
        if tools.is_context_tool(&call.name) {
            record.tool_type = "Context".into();
            let answer = tools
                .check_arguments(&call.name, &call.arguments)
                .and_then(|arguments| {
                    events.tool_started(call, &arguments, &record);
                    dispatcher
                        .agent_context
                        .ok_or_else(|| "context tools answer only in sub-agents".to_string())
                        .and_then(|context| context.call(&call.name, &arguments))
                });
            outputs[index] = finish(record, answer, events, records);
            continue;
        }
        let Some(tool) = tools.get(&call.name) else {
            let message = format!(
                "there is no tool named '{}'; available tools: {}",
                call.name,
                tools
                    .definitions()
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            outputs[index] = finish_failed(&mut record, message, events, records);
            continue;
        };
        record.tool_type = tool.tool_type.as_str().to_string();
        let arguments = match tools.check_arguments(&call.name, &call.arguments) {
            Ok(arguments) => arguments,
            Err(message) => {
                outputs[index] = finish_failed(&mut record, message, events, records);
                continue;
            }
        };
        if matches!(tool.tool_type, ToolType::Agent | ToolType::CritiqueLoop) {
            if agents_started >= dispatcher.max_agent_calls_per_turn {
                let message = format!(
                    "AGENT_FANOUT_EXCEEDED: one turn may start at most {} sub-agents (Agent and CritiqueLoop calls); '{}' was not run. Call fewer at once.",
                    dispatcher.max_agent_calls_per_turn, call.name
                );
                outputs[index] = finish_failed(&mut record, message, events, records);
                continue;
            }
            agents_started += 1;
        }
        if let Some((target, source)) = dispatcher.target(tool).await {
            record.target_url = target;
            record.origin_source = source.map(|s| s.as_str().to_string());
            events.tool_started(call, &arguments, &record);
        }
        let tool = tool.clone();
        running.push(async move {
            let started = Instant::now();
            let outcome: ToolOutcome = dispatcher.call(&tool, arguments).await;
            (index, record, outcome, started.elapsed())
        });
    }
    while let Some((index, mut record, outcome, elapsed)) = running.next().await {
        record.duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if outcome.target_url.is_some() {
            record.target_url = outcome.target_url;
        }
        if let Some(source) = outcome.origin_source {
            record.origin_source = Some(source.as_str().to_string());
        }
        record.child_request_id = outcome.child_request_id;
        record.child_credits_used = outcome.child_credits;
        outputs[index] = finish(record, outcome.result, events, records);
    }
    // Calls finish in any order; the run reports them in the order the model made them.
    records[first_record..].sort_by_key(|r| calls.iter().position(|c| c.id == r.call_id));
    outputs
}

/// Records a finished call and returns what the model receives.
fn finish(
    mut record: ToolCallRecord,
    result: Result<String, String>,
    events: &mut dyn ToolEvents,
    records: &mut Vec<ToolCallRecord>,
) -> String {
    match result {
        Ok(text) => {
            record.status = "succeeded".into();
            events.tool_finished(&record, &text);
            records.push(record);
            text
        }
        Err(message) => finish_failed(&mut record, message, events, records),
    }
}

fn finish_failed(
    record: &mut ToolCallRecord,
    message: String,
    events: &mut dyn ToolEvents,
    records: &mut Vec<ToolCallRecord>,
) -> String {
    record.status = "failed".into();
    let output = format!("Error: {message}");
    record.error = Some(message);
    events.tool_finished(record, &output);
    records.push(record.clone());
    output
}
