//! Agent tools (SPEC.md "Agent tool"): the model calls the tool, and the target flow's active
//! version runs as a child request of the caller, with its own tool loop; its text is the tool
//! result. Depth limits and cycles are refused as failed tool calls (DESIGN.md "Agents, tools,
//! safety"); the parent run goes on.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use baton_domain::TenantId;
use baton_domain::chat::{InferenceRequest, Message, Role};
use baton_domain::run::RunKind;
use baton_domain::settings::DEFAULT_MAX_AGENT_DEPTH;
use baton_domain::tool::Tool;
use baton_providers::routing::{ModelSelection, Named};
use baton_providers::structured::OutputSchema;
use serde_json::{Map, Value, json};

use crate::dispatch::{AgentOutcome, AgentRunner};
use crate::engine::Engine;
use crate::error::ExecutorError;
use crate::flow_run::{ClassifierParent, parameter_values, unresolved_warnings};
use crate::gateway::{RequestTimeouts, plan_chain};
use crate::runlog::{Pricing, RunLog};
use crate::tool_loop::DEFAULT_MAX_TOOL_ITERATIONS;
use crate::toolrun::{
    self, AgentScope, CANCELLED_WARNING, Callback, SharedEvents, ToolRunInput, preview,
};
use crate::toolset::ToolSet;

/// Starts sub-agents for the run whose scope it holds.
pub struct TreeRunner {
    pub engine: Engine,
    pub tenant: TenantId,
    pub scope: AgentScope,
    pub environment: String,
    pub callback: Callback,
    pub events: SharedEvents,
}

fn failed(message: String) -> AgentOutcome {
    AgentOutcome {
        result: Err(message),
        child_request_id: None,
        child_credits: 0,
    }
}

impl TreeRunner {
    pub fn max_depth_reached(&self) -> u32 {
        self.scope.deepest.load(Ordering::Relaxed)
    }

    /// Everything before the child's first model call; `Err` is the message for the parent.
    async fn prepare(
        &self,
        sub: &SubRun<'_>,
        arguments: Map<String, Value>,
    ) -> Result<Child, String> {
        let engine = &self.engine;
        let target = sub.flow;
        let found = engine.found_flow(&self.tenant, target).await.map_err(|_| {
            format!(
                "AGENT_NOT_FOUND: the flow '{target}' of agent '{}' does not exist",
                sub.name
            )
        })?;
        let flow = &found.flow;
        if self.scope.ancestors.contains(&flow.id) {
            return Err(format!(
                "AGENT_CYCLE: agent '{}' would run flow '{}', which is already running above it in this agent chain; an agent cannot call itself, directly or indirectly",
                sub.name, flow.name
            ));
        }
        let settings = engine
            .tenant_settings(&self.tenant)
            .await
            .map_err(|e| e.to_string())?;
        let limit = self.scope.max_depth.or(sub.max_depth).unwrap_or(
            if settings.default_max_agent_depth == 0 {
                DEFAULT_MAX_AGENT_DEPTH
            } else {
                settings.default_max_agent_depth
            },
        );
        let depth = self.scope.depth + 1;
        if depth > limit {
            return Err(format!(
                "AGENT_DEPTH_EXCEEDED: agent '{}' would run at depth {depth}, past the limit of {limit}",
                sub.name
            ));
        }
        // The parent's environment when the flow is active there, else its first.
        let environment = if flow.active_versions.contains_key(&self.environment) {
            self.environment.clone()
        } else {
            found.environments.first().cloned().ok_or_else(|| {
                format!(
                    "the flow '{}' of agent '{}' has no active version",
                    flow.name, sub.name
                )
            })?
        };
        let version_id = flow
            .active_versions
            .get(&environment)
            .cloned()
            .ok_or_else(|| format!("the flow '{}' has no active version", flow.name))?;
        let compiled = engine
            .compiled_version(&self.tenant, &flow.id, &version_id)
            .await
            .map_err(|e| e.to_string())?;
        let values = parameter_values(Some(arguments));
        let id = uuid::Uuid::now_v7().to_string();
        let pricing = Pricing::new(engine.providers().catalogue().clone(), &settings);
        // Route mode picks the template as for a flow run; the classifier's call is a child of
        // this sub-agent's run.
        let parent = ClassifierParent {
            root_id: &self.scope.root_id,
            run_id: &id,
            depth,
            tags: &self.scope.tags,
            customer: self.scope.customer.as_deref(),
            deadline: self.scope.deadline,
            holds_budget: false,
        };
        let (template_name, classifier, classifier_warning) = engine
            .choose_template(&self.tenant, flow, &compiled, &values, parent, &pricing)
            .await
            .map_err(|e| format!("the flow '{}' could not pick a template: {e}", flow.name))?
            .resolve(&compiled.version.entrypoint);
        let classifier_credits = classifier.map_or(0, |c| c.credits);
        // In the tree's tally, so the request's cost ceiling counts it, and in its totals (a
        // call, its tokens, a run one level below this sub-agent).
        self.scope.charge(classifier_credits);
        if let Some(classifier) = classifier {
            self.events
                .add_tree_tokens(classifier.usage.tokens_in, classifier.usage.tokens_out);
            self.scope
                .deepest
                .fetch_max(depth + 1, std::sync::atomic::Ordering::Relaxed);
        }
        let template = compiled
            .version
            .template(&template_name)
            .ok_or_else(|| format!("the flow '{}' has no '{template_name}' template", flow.name))?
            .clone();
        let rendered = compiled
            .library
            .render(&template_name, &values)
            .map_err(|e| e.to_string())?;
        let mut warnings = unresolved_warnings(&rendered.unresolved);
        warnings.extend(classifier_warning);
        let mut messages = Vec::with_capacity(2);
        if !rendered.system.trim().is_empty() {
            messages.push(Message::text(Role::System, rendered.system));
        }
        match rendered.user.filter(|u| !u.trim().is_empty()) {
            Some(user) => messages.push(Message::text(Role::User, user)),
            // A template without a user message still gets the caller's input.
            None => {
                if let Some(input) = values.get("input") {
                    messages.push(Message::text(Role::User, input.clone()));
                }
            }
        }
        if messages.is_empty() {
            return Err(format!(
                "the flow '{}' renders to nothing to send",
                flow.name
            ));
        }
        let schema = template
            .response_schema
            .as_ref()
            .map(OutputSchema::compile)
            .transpose()
            .map_err(|e| {
                format!(
                    "the flow '{}' has an invalid responseSchema: {e}",
                    flow.name
                )
            })?;
        let request = InferenceRequest {
            messages,
            temperature: sub.temperature.or(template.temperature),
            response_format: template.response_schema.clone().map(|schema| {
                baton_domain::chat::ResponseFormat::JsonSchema {
                    name: "response".into(),
                    schema,
                    strict: None,
                }
            }),
            stream_usage: true,
            ..InferenceRequest::default()
        };
        let selection = ModelSelection {
            configured: template
                .llm
                .as_deref()
                .map(|name| Named { name, param: "llm" }),
            fallbacks: &template.fallbacks,
            fallbacks_param: "fallbacks",
            ..ModelSelection::default()
        };
        // Part of the root request: not counted against the rate limit again.
        let mut plan = plan_chain(
            engine,
            &self.tenant,
            &settings,
            selection,
            &request,
            None,
            RequestTimeouts::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
        if let Some(deadline) = self.scope.deadline {
            plan.deadline = plan.deadline.min(deadline);
        }
        let tools = engine
            .tools(&self.tenant, &template.tool_ids)
            .await
            .map_err(|e| e.to_string())?
            .set_with_context_tools();
        let mut ancestors = self.scope.ancestors.clone();
        ancestors.push(flow.id.clone());
        Ok(Child {
            id,
            classifier_credits,
            flow_id: flow.id.clone(),
            flow_name: flow.name.clone(),
            template_name,
            environment,
            values,
            request,
            schema,
            plan,
            tools,
            max_iterations: template
                .max_tool_calls
                .unwrap_or(DEFAULT_MAX_TOOL_ITERATIONS),
            depth,
            ancestors,
            pricing,
            callback_origins: settings.callback_origins.clone(),
            warnings,
        })
    }
}

struct Child {
    id: String,
    /// What a Route-mode classifier call cost before the child's own calls.
    classifier_credits: i64,
    flow_id: String,
    flow_name: String,
    template_name: String,
    environment: String,
    values: std::collections::HashMap<String, String>,
    request: InferenceRequest,
    schema: Option<OutputSchema>,
    plan: crate::gateway::CallPlan,
    tools: Arc<ToolSet>,
    max_iterations: u32,
    depth: u32,
    ancestors: Vec<String>,
    pricing: Pricing,
    callback_origins: Vec<baton_domain::origin::CallbackOrigin>,
    /// Parameters its template left unresolved, as a root run reports them.
    warnings: Vec<baton_domain::run::RunWarning>,
}

/// One child request: which flow, in which role, with what overrides.
pub(crate) struct SubRun<'a> {
    /// The agent role (the tool's name; `name.producer#2` inside a critique loop).
    pub name: String,
    pub flow: &'a str,
    pub max_depth: Option<u32>,
    /// The critic always runs at temperature 0.
    pub temperature: Option<f64>,
}

impl TreeRunner {
    /// Whether a run above the sub-agents this runner starts (the spawning run or one of its
    /// ancestors) was asked to stop. A failed lookup counts as no.
    async fn ancestor_cancelled(&self) -> bool {
        self.engine
            .flows()
            .cancel_requested(&self.tenant, &self.scope.run_chain)
            .await
            .unwrap_or(false)
    }

    pub(crate) async fn run_child(
        &self,
        sub: SubRun<'_>,
        arguments: Map<String, Value>,
    ) -> AgentOutcome {
        let child = match self.prepare(&sub, arguments).await {
            Ok(child) => child,
            Err(message) => return failed(message),
        };
        let role = sub.name.clone();
        let events = self.events.child(&role);
        self.events.emit(
            "agentStarted",
            json!({"agentRole": role, "templateId": child.flow_id, "templateName": child.template_name,
                   "parentRequestId": self.scope.run_id, "childRequestId": child.id,
                   "parameters": child.values}),
        );
        self.scope.deepest.fetch_max(child.depth, Ordering::Relaxed);
        self.scope.spawns.fetch_add(1, Ordering::Relaxed);
        self.events.agent_running(true);
        let started = std::time::Instant::now();
        let mut log = RunLog::start(
            self.engine.runs().clone(),
            child.pricing.clone(),
            child.id.clone(),
            self.tenant.clone(),
            RunKind::Flow,
            child.plan.chain.requested.clone(),
        );
        if let Some(record) = log.record_mut() {
            record.root_id = self.scope.root_id.clone();
            record.parent_id = Some(self.scope.run_id.clone());
            record.depth = child.depth;
            record.agent_role = Some(role.clone());
            record.environment = Some(child.environment.clone());
            record.flow_name = Some(child.flow_name.clone());
            record.tags = self.scope.tags.clone();
            record.customer_external_id = self.scope.customer.clone();
            record.callback_origin = self.callback.origin();
            record.warnings = child.warnings;
        }
        log.set_request(&json!({
            "flowId": child.flow_id, "templateName": child.template_name,
            "parameters": child.values, "request": child.request,
        }));
        let scope = AgentScope {
            root_id: self.scope.root_id.clone(),
            run_id: child.id.clone(),
            depth: child.depth,
            ancestors: child.ancestors,
            max_depth: self.scope.max_depth,
            tags: self.scope.tags.clone(),
            customer: self.scope.customer.clone(),
            deepest: self.scope.deepest.clone(),
            spawns: self.scope.spawns.clone(),
            agent_path: {
                let mut path = self.scope.agent_path.clone();
                path.push(role.clone());
                path
            },
            run_chain: {
                let mut chain = self.scope.run_chain.clone();
                chain.push(child.id.clone());
                chain
            },
            state: self.scope.state.child(),
            original_input: self.scope.original_input.clone(),
            spent: self.scope.spent.clone(),
            budget: self.scope.budget,
            deadline: self.scope.deadline,
            cancel_look: self.scope.child_cancel_look(),
        };
        let input = ToolRunInput {
            engine: self.engine.clone(),
            tenant: self.tenant.clone(),
            plan: child.plan,
            request: child.request,
            schema: child.schema,
            log,
            pricing: child.pricing,
            tools: child.tools,
            max_iterations: child.max_iterations,
            environment: child.environment,
            parameters: child.values,
            callback: self.callback.clone(),
            callback_origins: child.callback_origins,
            events: events.clone(),
            earlier_credits: 0,
            flow_name: child.flow_name,
            scope,
        };
        let duration_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let outcome = toolrun::run(input).await;
        self.events.agent_running(false);
        // A sub-agent stopped by a cancel request ends its call as a failure (status
        // `cancelled`): the parent model is told, and goes on when the request was for the
        // sub-agent alone; a run above it that was cancelled stops too and reports itself, so
        // only a cancel of the sub-agent alone is reported here (`error` RUN_CANCELLED).
        let cancelled = match &outcome {
            Ok(result) => result.warnings.iter().any(|w| w.code == CANCELLED_WARNING),
            Err(failure) => matches!(failure.error, ExecutorError::Cancelled),
        };
        if cancelled {
            let alone = !self.ancestor_cancelled().await;
            let (message, partial, mut data) = match &outcome {
                Ok(result) => {
                    let spawned = result
                        .tool_calls
                        .iter()
                        .filter(|c| c.child_request_id.is_some())
                        .count();
                    (
                        result
                            .warnings
                            .iter()
                            .find(|w| w.code == CANCELLED_WARNING)
                            .map_or_else(String::new, |w| w.message.clone()),
                        result.response.text.clone(),
                        json!({"totalCreditsUsed": result.tree_credits.saturating_add(child.classifier_credits),
                               "directCreditsUsed": result.cost.billed.0,
                               "inferenceCount": result.inferences,
                               "toolCallCount": result.tool_calls.len(),
                               "childAgentCount": spawned}),
                    )
                }
                Err(failure) => (
                    failure.error.to_string(),
                    String::new(),
                    json!({"totalCreditsUsed": failure.tree_credits.saturating_add(child.classifier_credits),
                           "directCreditsUsed": 0, "inferenceCount": 0,
                           "toolCallCount": 0, "childAgentCount": 0}),
                ),
            };
            let tree_credits = data["totalCreditsUsed"].as_i64().unwrap_or(0);
            if alone {
                self.events.emit(
                    "error",
                    json!({"code": "RUN_CANCELLED", "message": message, "agentRole": role,
                           "recoverable": true}),
                );
            }
            data["childRequestId"] = json!(child.id);
            data["agentRole"] = json!(role);
            data["durationMs"] = json!(duration_ms());
            data["status"] = json!("cancelled");
            data["resultPreview"] = json!(preview(&partial));
            self.events.emit("agentCompleted", data);
            let told = if partial.is_empty() {
                format!("agent '{role}' was cancelled: {message}")
            } else {
                format!("agent '{role}' was cancelled: {message}; what it had produced: {partial}")
            };
            return AgentOutcome {
                result: Err(told),
                child_request_id: Some(child.id),
                child_credits: tree_credits,
            };
        }
        match outcome {
            Ok(result) => {
                let tree_credits = result.tree_credits.saturating_add(child.classifier_credits);
                let spawned = result
                    .tool_calls
                    .iter()
                    .filter(|c| c.child_request_id.is_some())
                    .count();
                let mut data = json!({"childRequestId": child.id, "agentRole": role, "durationMs": duration_ms(),
                           "totalCreditsUsed": tree_credits, "directCreditsUsed": result.cost.billed.0,
                           "inferenceCount": result.inferences, "toolCallCount": result.tool_calls.len(),
                           "childAgentCount": spawned, "status": "completed",
                           "resultPreview": preview(&result.response.text)});
                if self.events.include_agent_results() {
                    data["result"] = json!(result.response.text);
                }
                self.events.emit("agentCompleted", data);
                AgentOutcome {
                    result: Ok(result.response.text),
                    child_request_id: Some(child.id),
                    child_credits: tree_credits,
                }
            }
            Err(failure) => {
                let error = failure.error;
                // What the child's subtree spent before failing is billed on its rows: the
                // parent's totals include it, as they would had it answered.
                let tree_credits = failure
                    .tree_credits
                    .saturating_add(child.classifier_credits);
                self.events.emit(
                    "agentFailed",
                    json!({"childRequestId": child.id, "agentRole": role, "durationMs": duration_ms(),
                           "code": error.code(), "message": error.to_string(), "status": "failed",
                           "totalCreditsUsed": tree_credits}),
                );
                AgentOutcome {
                    result: Err(format!("agent '{role}' failed: {error}")),
                    child_request_id: Some(child.id),
                    child_credits: tree_credits,
                }
            }
        }
    }
}

#[async_trait]
impl AgentRunner for TreeRunner {
    async fn run_agent(&self, tool: &Tool, arguments: Map<String, Value>) -> AgentOutcome {
        let Some(flow) = tool.config.agent_template_id.as_deref() else {
            return failed(format!("Agent tool '{}' names no flow", tool.name));
        };
        let sub = SubRun {
            name: tool.name.clone(),
            flow,
            max_depth: tool.config.max_agent_depth,
            temperature: None,
        };
        self.run_child(sub, arguments).await
    }

    async fn run_critique(&self, tool: &Tool, arguments: Map<String, Value>) -> AgentOutcome {
        crate::critique::run(self, tool, arguments).await
    }
}
