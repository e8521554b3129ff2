//! A flow run whose template has tools: the executor's loop (`baton_executor`) with the model
//! calls going through the gateway (routing, logging, pricing per call) and every step reported
//! as events, stored with the run and, for a stream, sent as they happen.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton_domain::TenantId;
use baton_domain::chat::{InferenceRequest, InferenceResponse, ToolCall, Usage};
use baton_domain::credits::Credits;
use baton_domain::origin::CallbackOrigin;
use baton_domain::run::{RunWarning, ToolCallRecord};
use baton_domain::tool::McpServer;
use baton_ledger::Cost;
use baton_providers::routing::ChainModel;
use baton_providers::structured::OutputSchema;
use baton_tools::external::CallContext;
use serde_json::{Map, Value, json};
use std::sync::atomic::AtomicI64;
use tokio::sync::mpsc;
use url::Url;

use crate::context::{AgentContext, StateScope};
use crate::dispatch::{Dispatcher, McpDirectory};
use crate::engine::Engine;
use crate::error::{ExecutorError, ExecutorResult};
use crate::events::{EventFilter, EventLog, EventOptions, request_error};
use crate::gateway::{CallPlan, answer, relayed_answer};
use crate::runlog::{Pricing, RunLog};
use crate::tool_loop::{LoopFailure, ModelTurns, ToolEvents};
use crate::toolset::ToolSet;

/// Characters of a tool result shown in `resultPreview`.
const PREVIEW_CHARS: usize = 200;

/// What the caller sent for caller-hosted tools (SPEC.md "Custom request headers").
#[derive(Clone, Default)]
pub struct Callback {
    pub url: Option<Url>,
    /// Held for the run only: never stored, never logged.
    pub token: Option<String>,
    /// The origin of the deprecated `X-Baton-Debug-Url` when it was sent (the run is tagged
    /// `DebugUrl:<origin>`, whether or not `X-Baton-Callback-Url` took precedence as the URL).
    pub debug_origin: Option<String>,
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callback")
            .field("url", &self.url.as_ref().map(Url::as_str))
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("debug_origin", &self.debug_origin)
            .finish()
    }
}

impl Callback {
    /// The callback of a request: `X-Baton-Callback-Url` (else the deprecated
    /// `X-Baton-Debug-Url`) and `X-Baton-Callback-Token`, as trimmed text. Each URL sent must
    /// be an absolute http(s) URL; an error names the header it came from.
    pub fn from_values(
        callback_url: Option<String>,
        debug_url: Option<String>,
        token: Option<String>,
    ) -> ExecutorResult<Callback> {
        let parse = |raw: Option<String>, param: &str| {
            raw.filter(|u| !u.is_empty())
                .map(|raw| {
                    Url::parse(&raw)
                        .ok()
                        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
                        .ok_or_else(|| {
                            ExecutorError::validation(
                                param,
                                format!("{param} must be an absolute http(s) URL"),
                            )
                        })
                })
                .transpose()
        };
        let callback = parse(callback_url, "X-Baton-Callback-Url")?;
        let debug = parse(debug_url, "X-Baton-Debug-Url")?;
        let debug_origin = debug.as_ref().map(|u| u.origin().ascii_serialization());
        Ok(Callback {
            url: callback.or(debug),
            token: token.filter(|t| !t.is_empty()),
            debug_origin,
        })
    }

    /// `scheme://host[:port]`, what the log keeps of the callback URL.
    pub fn origin(&self) -> Option<String> {
        self.url.as_ref().map(|u| u.origin().ascii_serialization())
    }
}

/// The tenant's MCP servers, read when a call needs one.
struct TenantMcp {
    engine: Engine,
    tenant: TenantId,
}

#[async_trait]
impl McpDirectory for TenantMcp {
    async fn server(&self, id: &str) -> Option<McpServer> {
        self.engine.flows().mcp_server(&self.tenant, id).await.ok()
    }
}

/// The run's events: kept for the log, and sent live to a stream when there is one.
struct RunEvents {
    log: EventLog,
    live: Option<mpsc::UnboundedSender<Value>>,
    /// Which types the live stream wants (stored events are all kept).
    filter: EventFilter,
    /// `include_usage: false`: no `usageUpdate` on the live stream.
    include_usage: bool,
    include_tool_results: bool,
    include_agent_results: bool,
    /// Agents of the tree running now and finished (`usageUpdate`).
    active_agents: u32,
    completed_agents: u32,
    /// Tokens of every model call of the tree so far (`usageUpdate`).
    tree_tokens: (u64, u64),
    /// Model calls and tool calls of the whole tree so far (`requestCompleted`).
    tree_inferences: u64,
    tree_tool_calls: u64,
}

/// What a whole agent tree did, as `requestCompleted` reports it.
struct TreeTotals {
    tokens_in: u64,
    tokens_out: u64,
    inferences: u64,
    tool_calls: u64,
}

/// The events of a whole agent tree (one log, one stream), as seen by one agent: its envelopes
/// carry its `agentPath` and `depth`.
#[derive(Clone)]
pub struct SharedEvents {
    inner: Arc<Mutex<RunEvents>>,
    path: Arc<Vec<String>>,
    depth: u32,
}

impl SharedEvents {
    /// `log`: the run's event log ([`crate::Engine::event_log`]).
    pub fn new(
        log: EventLog,
        live: Option<mpsc::UnboundedSender<Value>>,
        options: Option<EventOptions>,
    ) -> SharedEvents {
        let (filter, include_usage, include_tool_results, include_agent_results) = match options {
            Some(o) => (
                o.filter,
                o.include_usage,
                o.include_tool_results,
                o.include_agent_results,
            ),
            None => (EventFilter::default(), true, false, false),
        };
        SharedEvents {
            inner: Arc::new(Mutex::new(RunEvents {
                log,
                live,
                filter,
                include_usage,
                include_tool_results,
                include_agent_results,
                active_agents: 1,
                completed_agents: 0,
                tree_tokens: (0, 0),
                tree_inferences: 0,
                tree_tool_calls: 0,
            })),
            path: Arc::new(Vec::new()),
            depth: 0,
        }
    }

    /// The same tree, as seen by a sub-agent in role `role`.
    pub fn child(&self, role: &str) -> SharedEvents {
        let mut path = self.path.as_ref().clone();
        path.push(role.to_string());
        SharedEvents {
            inner: self.inner.clone(),
            path: Arc::new(path),
            depth: self.depth + 1,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunEvents> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn emit(&self, event_type: &str, data: Value) {
        let mut events = self.lock();
        let streamed = events.live.is_some()
            && events.filter.allows(event_type)
            && (events.include_usage || event_type != "usageUpdate");
        if !streamed {
            events
                .log
                .record_in(event_type, data, &self.path, self.depth);
            return;
        }
        let envelope = events.log.emit_in(event_type, data, &self.path, self.depth);
        if let Some(live) = &events.live {
            // A gone client must not stop the run: it is finished and logged anyway.
            let _ = live.send(envelope);
        }
    }

    /// Whether an event of `event_type` would reach a live stream now.
    pub fn streams(&self, event_type: &str) -> bool {
        let events = self.lock();
        events.live.is_some() && events.filter.allows(event_type)
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.lock().log.elapsed_ms()
    }

    pub fn take_stored(&self) -> Vec<baton_domain::run::StoredEvent> {
        self.lock().log.take_stored()
    }

    pub fn include_tool_results(&self) -> bool {
        self.lock().include_tool_results
    }

    pub fn include_agent_results(&self) -> bool {
        self.lock().include_agent_results
    }

    /// A sub-agent started (`true`) or finished (`false`).
    pub fn agent_running(&self, started: bool) {
        let mut events = self.lock();
        if started {
            events.active_agents += 1;
        } else {
            events.active_agents = events.active_agents.saturating_sub(1);
            events.completed_agents += 1;
        }
    }

    /// `(activeAgents, completedAgents)` of the tree.
    /// Adds a model call's tokens to the tree's; returns the tree's `(in, out)` so far.
    /// Counts one model call of the tree and its tokens; returns the tree's tokens so far.
    pub fn add_tree_tokens(&self, tokens_in: u64, tokens_out: u64) -> (u64, u64) {
        let mut events = self.lock();
        events.tree_inferences += 1;
        let (total_in, total_out) = events.tree_tokens;
        events.tree_tokens = (
            total_in.saturating_add(tokens_in),
            total_out.saturating_add(tokens_out),
        );
        events.tree_tokens
    }

    /// The whole tree's totals so far, for `requestCompleted`.
    fn tree_totals(&self) -> TreeTotals {
        let events = self.lock();
        TreeTotals {
            tokens_in: events.tree_tokens.0,
            tokens_out: events.tree_tokens.1,
            inferences: events.tree_inferences,
            tool_calls: events.tree_tool_calls,
        }
    }

    pub fn agent_counts(&self) -> (u32, u32) {
        let events = self.lock();
        (events.active_agents, events.completed_agents)
    }

    /// `usageUpdate`'s data: the whole tree's spend (`tree_credits`) and tokens so far, its
    /// agents, the time since the request began.
    pub(crate) fn usage_data(&self, tree_credits: i64) -> Value {
        let events = self.lock();
        json!({"cumulativeCreditsUsed": tree_credits,
               "cumulativeCostUsd": Credits(tree_credits).to_usd(),
               "cumulativeTokensIn": events.tree_tokens.0,
               "cumulativeTokensOut": events.tree_tokens.1,
               "activeAgents": events.active_agents, "completedAgents": events.completed_agents,
               "elapsedMs": events.log.elapsed_ms()})
    }

    /// Ends the live stream (the sender is dropped).
    pub fn close(&self) {
        self.lock().live = None;
    }
}

/// The start of a result or answer, for `resultPreview`.
pub fn preview(text: &str) -> String {
    match text.char_indices().nth(PREVIEW_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

impl ToolEvents for SharedEvents {
    fn tool_started(
        &mut self,
        call: &ToolCall,
        arguments: &Map<String, Value>,
        record: &ToolCallRecord,
    ) {
        tracing::debug!(tool = %call.name, tool_type = %record.tool_type, target = ?record.target_url, "tool call");
        self.emit(
            "toolStarted",
            json!({"toolName": call.name, "toolType": record.tool_type, "callId": call.id,
                   "arguments": arguments, "targetUrl": record.target_url,
                   "originSource": record.origin_source}),
        );
    }

    fn tool_finished(&mut self, record: &ToolCallRecord, output: &str) {
        // Every call ends here, one refused before it started included.
        self.lock().tree_tool_calls += 1;
        tracing::debug!(
            tool = %record.tool_name,
            status = %record.status,
            duration_ms = record.duration_ms,
            result_bytes = output.len(),
            error = ?record.error,
            "tool call finished"
        );
        let event = if record.status == "succeeded" {
            "toolCompleted"
        } else {
            "toolFailed"
        };
        let mut data = json!({"toolName": record.tool_name, "toolType": record.tool_type,
                   "callId": record.call_id, "durationMs": record.duration_ms,
                   "status": record.status, "resultPreview": preview(output),
                   "resultSize": output.len(), "targetUrl": record.target_url,
                   "originSource": record.origin_source});
        if let Some(child) = &record.child_request_id {
            data["childRequestId"] = json!(child);
            data["childCreditsUsed"] = json!(record.child_credits_used.unwrap_or(0));
        }
        // A refusal that has a code (`AGENT_DEPTH_EXCEEDED: ...`) carries it apart too.
        if let Some(code) = record.error.as_deref().and_then(error_code_of) {
            data["code"] = json!(code);
        }
        if self.include_tool_results() {
            data["result"] = json!(output);
        }
        self.emit(event, data);
    }
}

/// The code a failure message starts with (`AGENT_CYCLE: ...`), if it does.
fn error_code_of(message: &str) -> Option<&str> {
    let (code, _) = message.split_once(':')?;
    (code.len() >= 3 && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')).then_some(code)
}

/// Model calls of the loop: each through the gateway, priced by the model that served it.
struct GatewayTurns<'a> {
    engine: &'a Engine,
    tenant: &'a TenantId,
    plan: &'a CallPlan,
    schema: Option<&'a OutputSchema>,
    log: &'a mut RunLog,
    pricing: &'a Pricing,
    events: SharedEvents,
    tool_count: usize,
    cost: Cost,
    usage: Usage,
    served: Option<ChainModel>,
    failed_model: Option<ChainModel>,
    /// Calls that failed after answering part way (billed), beside the loop's answered ones.
    billed_failures: u32,
    /// Answers thrown away and asked again (structured-output retries), beside the loop's
    /// answered ones.
    discarded_calls: u32,
    /// The tree's spend and ceiling.
    spent: Arc<AtomicI64>,
    budget: Option<i64>,
    /// This run and its ancestors, whose cancel requests stop it.
    run_chain: &'a [String],
    /// The loop's [`CancelLook`], in its scope so that the sub-agents it starts inherit it.
    cancel_look: &'a Mutex<CancelLook>,
}

/// How stale a tool loop's knowledge of cancel requests made on other instances may be.
const CANCEL_LOOK_INTERVAL: Duration = Duration::from_millis(250);

/// When a tool loop last asked the store for a cancel request (or started: a run's own id is new,
/// so nothing can be stored for it before its loop starts, and a sub-agent starts from its
/// parent's last look, which covered every ancestor), and this instance's count of cancel
/// requests then.
#[derive(Clone, Copy, Default)]
pub(crate) struct CancelLook {
    last: Option<(Instant, u64)>,
}

impl CancelLook {
    /// Counts a loop's start as a look, unless it inherited one.
    fn start(&mut self, requests: u64, now: Instant) {
        if self.last.is_none() {
            self.last = Some((now, requests));
        }
    }

    /// Whether to ask the store now (noting the look if so): after a cancel request made
    /// through this instance (`requests` changed), and otherwise once the last look is
    /// [`CANCEL_LOOK_INTERVAL`] old.
    fn due(&mut self, requests: u64, now: Instant) -> bool {
        if let Some((at, seen)) = self.last
            && seen == requests
            && now.saturating_duration_since(at) < CANCEL_LOOK_INTERVAL
        {
            return false;
        }
        self.last = Some((now, requests));
        true
    }
}

/// A model call that was billed, as its `agentInferenceCompleted` tells it.
struct BilledCall<'a> {
    inference_id: &'a str,
    started: Instant,
    model: &'a ChainModel,
    usage: Usage,
    credits: Credits,
}

impl GatewayTurns<'_> {
    /// Tells the stream a call was billed: `agentInferenceCompleted` (with `answer`'s finish
    /// reason and tool calls, and whether a fallback gave it; none for a call cut short), then
    /// its tokens in the tree's totals and the tree's `usageUpdate`.
    fn tell_billed(&self, call: &BilledCall<'_>, answer: Option<(&InferenceResponse, bool)>) {
        let (finish_reason, tool_calls, was_fallback) = answer
            .map_or((None, 0, false), |(r, f)| {
                (Some(r.finish_reason.as_openai()), r.tool_calls.len(), f)
            });
        let usage = call.usage;
        self.events.emit(
            "agentInferenceCompleted",
            json!({"inferenceRequestId": call.inference_id, "model": call.model.model,
                   "provider": call.model.provider,
                   "durationMs": u64::try_from(call.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                   "usage": {"tokensIn": usage.tokens_in, "tokensOut": usage.tokens_out,
                             "reasoningTokens": usage.reasoning_tokens,
                             "costCredits": call.credits.0, "costUsd": call.credits.to_usd()},
                   "finishReason": finish_reason, "toolCallCount": tool_calls,
                   "wasCached": false, "wasFallback": was_fallback}),
        );
        // Cumulative across the whole tree, like the agent counts beside them.
        self.events
            .add_tree_tokens(usage.tokens_in, usage.tokens_out);
        let tree_credits = self.spent.load(std::sync::atomic::Ordering::Relaxed);
        self.events
            .emit("usageUpdate", self.events.usage_data(tree_credits));
    }

    /// Whether model turns are streamed so their text reaches a live events stream as it
    /// arrives (`contentDelta`): the top agent's turns only, when its client wants them. A sub-agent's
    /// answer is its result (`agentCompleted`), so a client that joins the deltas gets the
    /// root's words alone; and a turn with a response schema stays synchronous, so an answer
    /// off the schema can still be retried before anyone saw it.
    fn relays_text(&self) -> bool {
        self.schema.is_none() && self.events.depth == 0 && self.events.streams("contentDelta")
    }

    /// A cancel request stored for this run or an ancestor stops it here. The store is asked as
    /// [`CancelLook::due`] says: a request made on another instance is seen up to
    /// [`CANCEL_LOOK_INTERVAL`] later, one made here at once, and a fast loop does not read the
    /// store at every step.
    async fn check_cancelled(&mut self) -> ExecutorResult<()> {
        let due = self
            .cancel_look
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .due(self.engine.cancel_requests(), Instant::now());
        if !due {
            return Ok(());
        }
        match self
            .engine
            .flows()
            .cancel_requested(self.tenant, self.run_chain)
            .await
        {
            Ok(true) => Err(ExecutorError::Cancelled),
            Ok(false) => Ok(()),
            Err(error) => {
                // The database is briefly unreachable: carry on rather than fail the run.
                tracing::warn!(%error, "could not check for a cancel request");
                Ok(())
            }
        }
    }
}

#[async_trait]
impl ModelTurns for GatewayTurns<'_> {
    type Error = ExecutorError;

    async fn proceed(&mut self) -> ExecutorResult<()> {
        self.check_cancelled().await
    }

    async fn call(&mut self, request: &mut InferenceRequest) -> ExecutorResult<InferenceResponse> {
        self.check_cancelled().await?;
        // The ceiling is checked before every model call of the tree.
        if let Some(budget) = self.budget
            && self.spent.load(std::sync::atomic::Ordering::Relaxed) >= budget
        {
            return Err(ExecutorError::CostLimitExceeded { budget });
        }
        let inference_id = uuid::Uuid::now_v7().to_string();
        let planned = self.plan.chain.primary();
        self.events.emit(
            "agentInferenceStarted",
            json!({"inferenceRequestId": inference_id,
                   "model": planned.map(|m| m.model.as_str()), "provider": planned.map(|m| m.provider.as_str()),
                   "messageCount": request.messages.len(), "hasTools": self.tool_count > 0,
                   "toolCount": self.tool_count}),
        );
        tracing::debug!(
            model = %self.plan.chain.requested,
            messages = request.messages.len(),
            tools = self.tool_count,
            depth = self.events.depth,
            "model call"
        );
        let started = Instant::now();
        let answered = if self.relays_text() {
            let events = &self.events;
            relayed_answer(
                self.engine,
                self.tenant,
                self.plan,
                request,
                self.log,
                |text| {
                    events.emit("contentDelta", json!({"text": text}));
                },
            )
            .await
        } else {
            answer(
                self.engine,
                self.tenant,
                self.plan,
                request,
                self.schema,
                self.log,
            )
            .await
        };
        match answered {
            Ok(answer) => {
                let response = answer.value;
                let served = if response.model.is_empty() {
                    answer.model.model.as_str()
                } else {
                    response.model.as_str()
                };
                let cost = self.pricing.cost_of_answer(
                    &answer.model.provider,
                    served,
                    &answer.model.model,
                    &response,
                );
                self.discarded_calls += response.calls() - 1;
                self.cost = self.cost.plus(cost);
                self.spent
                    .fetch_add(cost.billed.0, std::sync::atomic::Ordering::Relaxed);
                self.usage.add(response.usage);
                let billed = BilledCall {
                    inference_id: &inference_id,
                    started,
                    model: &answer.model,
                    usage: response.usage,
                    credits: cost.billed,
                };
                self.tell_billed(&billed, Some((&response, answer.fallback_used)));
                tracing::debug!(
                    model = %answer.model.model,
                    tokens_in = response.usage.tokens_in,
                    tokens_out = response.usage.tokens_out,
                    credits = cost.billed.0,
                    tool_calls = response.tool_calls.len(),
                    fallback = answer.fallback_used,
                    "model answered"
                );
                self.served = Some(answer.model);
                Ok(response)
            }
            Err(failure) => {
                tracing::info!(code = failure.error.code(), error = %failure.error, "model call failed");
                if let Some(model) = &failure.model {
                    let cost = self.pricing.cost(
                        &model.provider,
                        &model.model,
                        &model.model,
                        &failure.spent,
                    );
                    self.cost = self.cost.plus(cost);
                    self.spent
                        .fetch_add(cost.billed.0, std::sync::atomic::Ordering::Relaxed);
                    // A call that answered part way (its stream cut) is billed: the stream and
                    // the tree's totals say what it cost, as for a call that finished.
                    if failure.spent != Usage::default() {
                        self.billed_failures += 1;
                        let billed = BilledCall {
                            inference_id: &inference_id,
                            started,
                            model,
                            usage: failure.spent,
                            credits: cost.billed,
                        };
                        self.tell_billed(&billed, None);
                    }
                }
                self.usage.add(failure.spent);
                self.failed_model = failure.model;
                Err(failure.error)
            }
        }
    }
}

/// What a flow run with tools needs, owned so a stream can run it on its own task.
pub struct ToolRunInput {
    pub engine: Engine,
    pub tenant: TenantId,
    pub plan: CallPlan,
    pub request: InferenceRequest,
    pub schema: Option<OutputSchema>,
    pub log: RunLog,
    pub pricing: Pricing,
    pub tools: Arc<ToolSet>,
    pub max_iterations: u32,
    pub environment: String,
    pub parameters: std::collections::HashMap<String, String>,
    pub callback: Callback,
    pub callback_origins: Vec<CallbackOrigin>,
    pub events: SharedEvents,
    /// Credits spent before the loop (the Route classifier), part of the request's total.
    pub earlier_credits: i64,
    pub flow_name: String,
    /// Where this run sits in its agent tree.
    pub scope: AgentScope,
}

/// A run's place in its agent tree.
#[derive(Clone)]
pub struct AgentScope {
    pub root_id: String,
    /// This run's request id (the parent of the sub-agents it starts).
    pub run_id: String,
    pub depth: u32,
    /// Flow ids from the root to this run: a sub-agent may not run one of them again.
    pub ancestors: Vec<String>,
    /// The request's own depth limit (it wins over the tool's and the tenant's).
    pub max_depth: Option<u32>,
    /// Inherited by sub-agents.
    pub tags: Vec<String>,
    pub customer: Option<String>,
    /// The deepest depth any agent of the tree reached (shared by the whole tree).
    pub deepest: Arc<std::sync::atomic::AtomicU32>,
    /// Sub-agents started anywhere in the tree (shared by the whole tree).
    pub spawns: Arc<std::sync::atomic::AtomicU32>,
    /// Agent roles from the root to this run.
    pub agent_path: Vec<String>,
    /// Request ids from the root to this run: a cancel of any of them stops this run.
    pub run_chain: Vec<String>,
    /// This agent's state frame (context tools).
    pub state: StateScope,
    /// The root request's user messages (`get_original_input`).
    pub original_input: Arc<Vec<String>>,
    /// Credits the whole tree has spent (shared by the whole tree).
    pub spent: Arc<AtomicI64>,
    /// The request's cost ceiling across the tree, in credits.
    pub budget: Option<i64>,
    /// The root request's deadline: no sub-agent (nor its tool calls) runs past it.
    pub deadline: Option<Instant>,
    /// This run's loop's last look for cancel requests (shared with the clones of this scope,
    /// so a sub-agent's scope starts from it: [`AgentScope::child_cancel_look`]).
    pub(crate) cancel_look: Arc<Mutex<CancelLook>>,
}

impl AgentScope {
    /// The scope of a root request.
    pub fn root(
        run_id: &str,
        flow_id: &str,
        max_depth: Option<u32>,
        tags: Vec<String>,
        customer: Option<String>,
        original_input: Vec<String>,
        budget: Option<i64>,
    ) -> AgentScope {
        AgentScope {
            deadline: None,
            agent_path: Vec::new(),
            run_chain: vec![run_id.to_string()],
            state: StateScope::default(),
            original_input: Arc::new(original_input),
            spent: Arc::new(AtomicI64::new(0)),
            budget,
            root_id: run_id.to_string(),
            run_id: run_id.to_string(),
            depth: 0,
            ancestors: vec![flow_id.to_string()],
            max_depth,
            tags,
            customer,
            deepest: Arc::new(std::sync::atomic::AtomicU32::new(0)),
            spawns: Arc::new(std::sync::atomic::AtomicU32::new(0)),
            cancel_look: Arc::default(),
        }
    }

    /// Counts credits spent outside the tool loop (a Route-mode classifier's call) in the
    /// tree's tally: the cost ceiling and the usage updates include them.
    pub(crate) fn charge(&self, credits: i64) {
        self.spent
            .fetch_add(credits, std::sync::atomic::Ordering::Relaxed);
    }

    /// A sub-agent's cancel look: a copy of this run's last one.
    pub(crate) fn child_cancel_look(&self) -> Arc<Mutex<CancelLook>> {
        let look = *self
            .cancel_look
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::new(Mutex::new(look))
    }

    /// Bounds the tree by the root request's deadline.
    pub fn with_deadline(mut self, deadline: Instant) -> AgentScope {
        self.deadline = Some(deadline);
        self
    }
}

/// A finished tool run, for the flow run response.
/// The warning code of a run stopped by a cancel request (SPEC.md: "a `Cancelled` warning").
pub(crate) const CANCELLED_WARNING: &str = "Cancelled";

pub struct ToolRunResult {
    pub response: InferenceResponse,
    pub served: ChainModel,
    pub fallback_used: bool,
    pub cost: Cost,
    pub tool_calls: Vec<ToolCallRecord>,
    pub warnings: Vec<RunWarning>,
    /// This run's cost plus every sub-agent's subtree, in credits.
    pub tree_credits: i64,
    pub inferences: u32,
}

/// A run that failed, with what its subtree had spent by then (its own calls and its
/// sub-agents'), which its parent's totals include: the spend is billed on the logged rows.
#[derive(Debug)]
pub struct RunFailure {
    pub error: ExecutorError,
    pub tree_credits: i64,
}

impl From<RunFailure> for ExecutorError {
    fn from(failure: RunFailure) -> ExecutorError {
        failure.error
    }
}

/// A run's own cost plus what each sub-agent it called spent across its subtree.
fn subtree_credits(cost: Cost, calls: &[ToolCallRecord]) -> i64 {
    calls
        .iter()
        .filter_map(|c| c.child_credits_used)
        .fold(cost.billed.0, i64::saturating_add)
}

/// Runs the loop, logs the run (with its tool calls and events) and emits the closing events.
pub async fn run(input: ToolRunInput) -> Result<ToolRunResult, RunFailure> {
    let ToolRunInput {
        engine,
        tenant,
        plan,
        mut request,
        schema,
        mut log,
        pricing,
        tools,
        max_iterations,
        environment,
        parameters,
        callback,
        callback_origins,
        events,
        earlier_credits,
        flow_name,
        scope,
    } = input;
    // Findable (and cancellable) while it runs.
    log.queue_pending().await;
    // A sub-agent's start and end are `agentStarted`/`agentCompleted`, sent by its parent.
    let is_root = scope.depth == 0;
    if is_root {
        let mut data = json!({"flowName": flow_name, "contextId": Value::Null, "model": plan.chain.requested,
                              "hasTools": !tools.is_empty(),
                              "toolCount": tools.definitions().len() + tools.vendor_tools().len()});
        // Unresolved parameters, as the synchronous response reports them.
        if let Some(warnings) = log.warnings().filter(|w| !w.is_empty()) {
            data["warnings"] = json!(warnings);
        }
        events.emit("requestStarted", data);
    }
    // Sub-agents answer the context tools (the root has none).
    let agent_context = (!is_root).then(|| AgentContext {
        depth: scope.depth,
        agent_path: scope.agent_path.clone(),
        original_input: scope.original_input.clone(),
        state: scope.state.clone(),
        spent: scope.spent.clone(),
        budget: scope.budget,
    });
    let agents = crate::agents::TreeRunner {
        engine: engine.clone(),
        tenant: tenant.clone(),
        scope: scope.clone(),
        environment: environment.clone(),
        callback: callback.clone(),
        events: events.clone(),
    };
    let mcp = TenantMcp {
        engine: engine.clone(),
        tenant: tenant.clone(),
    };
    let dispatcher = Dispatcher {
        client: engine.outbound(),
        context: CallContext {
            environment: Some(environment.as_str()),
            parameters: &parameters,
            callback_url: callback.url.as_ref(),
            callback_token: callback.token.as_deref(),
            callback_origins: &callback_origins,
        },
        mcp: &mcp,
        agents: Some(&agents),
        agent_context: agent_context.as_ref(),
        timeout: engine.config().tool_call_timeout,
        deadline: Some(plan.deadline),
        max_result_bytes: engine.config().limits.max_tool_result_bytes,
        max_agent_calls_per_turn: engine.config().limits.max_agent_calls_per_turn,
    };
    let mut observer = events.clone();
    scope
        .cancel_look
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .start(engine.cancel_requests(), Instant::now());
    let mut turns = GatewayTurns {
        engine: &engine,
        tenant: &tenant,
        plan: &plan,
        schema: schema.as_ref(),
        log: &mut log,
        pricing: &pricing,
        events: events.clone(),
        tool_count: tools.definitions().len(),
        cost: Cost::default(),
        usage: Usage::default(),
        served: None,
        failed_model: None,
        billed_failures: 0,
        discarded_calls: 0,
        spent: scope.spent.clone(),
        budget: scope.budget,
        run_chain: &scope.run_chain,
        cancel_look: &scope.cancel_look,
    };
    let outcome = crate::tool_loop::run_tool_loop(
        &mut turns,
        &mut request,
        &tools,
        &dispatcher,
        &mut observer,
        max_iterations,
    )
    .await;
    let (cost, served) = (turns.cost, turns.served.take());
    // Every model call's usage, a failed call's spend included (the loop's own count stops at
    // the last answer), as `cost` prices it.
    let usage = turns.usage;
    let failed_model = turns.failed_model.take();
    // Calls the loop's own count (one a turn) leaves out.
    let (billed_failures, discarded_calls) = (turns.billed_failures, turns.discarded_calls);
    let fallback_used = log.record_mut().is_some_and(|r| r.fallback_used);
    match outcome {
        Ok(outcome) => {
            let tree_credits = subtree_credits(cost, &outcome.tool_calls);
            if is_root {
                let total = tree_credits.saturating_add(earlier_credits);
                let spawns = scope.spawns.load(std::sync::atomic::Ordering::Relaxed);
                // Like the credits, the whole tree's (SPEC.md: "whole request, all agents").
                let tree = events.tree_totals();
                let mut data = json!({"durationMs": events.elapsed_ms(), "totalCreditsUsed": total,
                           "totalCostUsd": Credits(total).to_usd(),
                           "totalTokensIn": tree.tokens_in,
                           "totalTokensOut": tree.tokens_out,
                           "totalInferenceCount": tree.inferences,
                           "totalToolCalls": tree.tool_calls, "totalAgentSpawns": spawns,
                           "maxDepthReached": agents.max_depth_reached(),
                           "result": {"textResponse": outcome.response.text}});
                // What the run learnt on the way (`MAX_TOOL_CALLS_REACHED`), as the synchronous
                // response's `warnings` say; the ones known at the start were in `requestStarted`.
                if !outcome.warnings.is_empty() {
                    data["warnings"] = json!(outcome.warnings);
                }
                events.emit("requestCompleted", data);
            }
            let served = served
                .or_else(|| plan.chain.primary().cloned())
                .unwrap_or_else(|| ChainModel {
                    provider: String::new(),
                    model: String::new(),
                });
            if let Some(record) = log.record_mut() {
                record.tool_calls = outcome.tool_calls.clone();
                record.warnings.extend(outcome.warnings.iter().cloned());
                record.inference_count = outcome.inferences + discarded_calls;
            }
            if is_root {
                log.attach_events(events.take_stored());
            }
            log.succeed_priced(&served.provider, &served.model, &outcome.response, cost)
                .await;
            if is_root {
                events.close();
            }
            Ok(ToolRunResult {
                response: outcome.response,
                served,
                fallback_used,
                cost,
                tool_calls: outcome.tool_calls,
                warnings: outcome.warnings,
                tree_credits,
                inferences: outcome.inferences,
            })
        }
        Err(LoopFailure {
            error,
            tool_calls,
            inferences,
            last_text,
            unanswered,
            ..
        }) if matches!(error, ExecutorError::Cancelled) => {
            let warning = RunWarning {
                code: CANCELLED_WARNING.into(),
                message: format!(
                    "the run was cancelled after {inferences} model call(s) and {} tool call(s)",
                    tool_calls.len()
                ),
                parameter: None,
            };
            if is_root {
                events.emit("error", request_error("RUN_CANCELLED", &warning.message));
            }
            if let Some(record) = log.record_mut() {
                record.tool_calls = tool_calls.clone();
                record.warnings.push(warning.clone());
                record.cancelled_at = Some(baton_domain::Timestamp::now());
                record.inference_count = inferences + discarded_calls;
            }
            let tree_credits = subtree_credits(cost, &tool_calls);
            if inferences == 0 {
                if is_root {
                    events.emit(
                        "requestFailed",
                        json!({"code": "RUN_CANCELLED", "message": warning.message}),
                    );
                    log.attach_events(events.take_stored());
                }
                log.fail_priced(None, &error, usage, cost).await;
                if is_root {
                    events.close();
                }
                return Err(RunFailure {
                    error,
                    tree_credits,
                });
            }
            // Output so far is kept and billed: the run succeeded, with a warning.
            let served = served
                .or(failed_model)
                .or_else(|| plan.chain.primary().cloned())
                .unwrap_or_else(|| ChainModel {
                    provider: String::new(),
                    model: String::new(),
                });
            // The answer as it stood: the last one in full when its tool calls never ran.
            let response = match unanswered {
                Some(last) => InferenceResponse { usage, ..last },
                None => InferenceResponse {
                    text: last_text,
                    usage,
                    ..InferenceResponse::default()
                },
            };
            if is_root {
                let total = tree_credits.saturating_add(earlier_credits);
                let tree = events.tree_totals();
                events.emit(
                    "requestCompleted",
                    json!({"durationMs": events.elapsed_ms(), "totalCreditsUsed": total,
                           "totalCostUsd": Credits(total).to_usd(),
                           "totalTokensIn": tree.tokens_in, "totalTokensOut": tree.tokens_out,
                           "totalInferenceCount": tree.inferences, "totalToolCalls": tree.tool_calls,
                           "totalAgentSpawns": scope.spawns.load(std::sync::atomic::Ordering::Relaxed),
                           "maxDepthReached": agents.max_depth_reached(),
                           "result": {"textResponse": response.text}}),
                );
                log.attach_events(events.take_stored());
            }
            log.succeed_priced(&served.provider, &served.model, &response, cost)
                .await;
            if is_root {
                events.close();
            }
            Ok(ToolRunResult {
                response,
                served,
                fallback_used,
                cost,
                tool_calls,
                warnings: vec![warning],
                tree_credits,
                inferences,
            })
        }
        Err(LoopFailure {
            error,
            tool_calls,
            inferences,
            ..
        }) => {
            let tree_credits = subtree_credits(cost, &tool_calls);
            if is_root {
                let (code, message) = (error.code(), error.to_string());
                events.emit("error", request_error(code, &message));
                events.emit("requestFailed", json!({"code": code, "message": message}));
            }
            if let Some(record) = log.record_mut() {
                record.tool_calls = tool_calls;
                record.inference_count = inferences + billed_failures + discarded_calls;
                if let Some(model) = &failed_model {
                    record.provider = Some(model.provider.clone());
                }
            }
            if is_root {
                log.attach_events(events.take_stored());
            }
            // The model whose answers were billed: the last that answered, else the one whose
            // failed call still spent (a stream cut short).
            let billed = served
                .as_ref()
                .or(failed_model
                    .as_ref()
                    .filter(|_| cost.billed.0 > 0 || usage != Usage::default()))
                .map(|m| (m.provider.as_str(), m.model.as_str()));
            log.fail_priced(billed, &error, usage, cost).await;
            if is_root {
                events.close();
            }
            Err(RunFailure {
                error,
                tree_credits,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_looks_for_cancels_after_one_here_and_then_every_interval() {
        let start = Instant::now();
        let mut look = CancelLook::default();
        look.start(0, start);
        assert!(!look.due(0, start), "the start counts as a look");
        assert!(!look.due(0, start + Duration::from_millis(10)));
        // A cancel requested through this instance: the next step looks at once.
        assert!(look.due(1, start + Duration::from_millis(20)));
        assert!(!look.due(1, start + Duration::from_millis(30)));
        // Requests elsewhere are only seen by looking: at most an interval after the last look.
        let later = start + Duration::from_millis(20) + CANCEL_LOOK_INTERVAL;
        assert!(!look.due(1, later - Duration::from_millis(1)));
        assert!(look.due(1, later));
        assert!(!look.due(1, later));
        // A sub-agent starting now inherits the look, and starting does not reset it.
        let mut child = look;
        child.start(1, later + Duration::from_millis(100));
        assert!(child.due(1, later + CANCEL_LOOK_INTERVAL));
        // Without a start, the first step looks.
        assert!(CancelLook::default().due(0, start));
    }
}
