//! A flow run (SPEC.md "Flow execution"): the version pinned to an environment, its compiled
//! templates (cached per activated version since those never change), Route mode's classifier
//! (its own logged, billed child run), the template rendered into messages, then either one
//! model call or, when the template has tools, the tool loop with its agent tree.
//!
//! [`Engine::run_flow`] answers once the run is done; [`Engine::run_flow_stream`] returns the
//! event envelopes as they happen. A streamed run with tools goes on to the end on its own task
//! (and is logged) even if the consumer stops reading; a streamed single call stops with the
//! stream and logs what it produced.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use baton_domain::chat::VendorTool;
use baton_domain::chat::{InferenceRequest, InferenceResponse, Message, ResponseFormat, Role};
use baton_domain::flow::{ExecutionMode, Flow, Template};
use baton_domain::run::{RunKind, RunRecord, RunWarning, ToolCallRecord};
use baton_domain::{TenantId, Timestamp};
use baton_providers::routing::{ChainModel, ModelSelection, Named};
use baton_providers::structured::OutputSchema;
use futures::Stream;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use tracing::Instrument;

use crate::engine::{CompiledVersion, Engine};
use crate::error::{ExecutorError, ExecutorResult};
use crate::events::{
    CallInfo, EarlierCall, EventLog, EventOptions, record_call_outcome, record_call_started,
    request_error,
};
use crate::gateway::{
    Failure, RequestTimeouts, answer, check_model, check_rate_limit, opening, plan_chain, refused,
};
use crate::runlog::{Pricing, RunLog, finish_answered_call};
use crate::stream::{EventStream, envelopes};
use crate::tool_loop::DEFAULT_MAX_TOOL_ITERATIONS;
use crate::toolrun::{self, AgentScope, Callback, SharedEvents, ToolRunInput};

/// Event envelopes of a streamed run, in order (SPEC.md "Events"), filtered by its options.
pub type EnvelopeStream = Pin<Box<dyn Stream<Item = Value> + Send>>;

/// One flow run, as validated input. Field errors name the HTTP body's camelCase fields.
#[derive(Debug, Clone)]
pub struct FlowRunRequest {
    pub tenant: TenantId,
    /// The run's id (the request id over HTTP): the log row and the events' `requestId`.
    pub run_id: String,
    /// Flow id or slug.
    pub flow: String,
    /// Values for `[[name]]` placeholders; non-string values are inserted as JSON text.
    pub parameters: Option<Map<String, Value>>,
    /// The environment whose pinned version runs; default: the first activated.
    pub environment: Option<String>,
    /// The end customer (an external id, already validated).
    pub customer: Option<String>,
    /// Validated tags (`baton_domain::tags`).
    pub tags: Vec<String>,
    /// Overrides the template's response schema.
    pub response_schema: Option<Value>,
    pub vendor_tools: Vec<VendorTool>,
    /// Model or routing alias instead of the template's `llm`.
    pub override_model: Option<String>,
    /// Events options of a stream (filter, full tool and agent results).
    pub stream_options: Option<EventOptions>,
    pub is_debug: bool,
    pub timeouts: RequestTimeouts,
    /// Deepest sub-agent nesting (wins over tools' and the tenant's limits).
    pub max_agent_depth: Option<u32>,
    /// Cost ceiling of the whole agent tree; it can only lower the tenant's.
    pub max_cost_per_request_credits: Option<i64>,
    /// Where caller-hosted tools are called back.
    pub callback: Callback,
}

impl FlowRunRequest {
    /// A run of `flow` (id or slug) with no parameters and every option at its default.
    pub fn new(tenant: TenantId, run_id: impl Into<String>, flow: impl Into<String>) -> Self {
        FlowRunRequest {
            tenant,
            run_id: run_id.into(),
            flow: flow.into(),
            parameters: None,
            environment: None,
            customer: None,
            tags: Vec::new(),
            response_schema: None,
            vendor_tools: Vec::new(),
            override_model: None,
            stream_options: None,
            is_debug: false,
            timeouts: RequestTimeouts::default(),
            max_agent_depth: None,
            max_cost_per_request_credits: None,
            callback: Callback::default(),
        }
    }

    fn validate(&self) -> ExecutorResult<()> {
        if self.max_cost_per_request_credits.is_some_and(|c| c < 1) {
            return Err(ExecutorError::validation(
                "maxCostPerRequestCredits",
                "maxCostPerRequestCredits must be at least 1",
            ));
        }
        if let Some(depth) = self.max_agent_depth
            && !(1..=baton_domain::tool::MAX_AGENT_DEPTH).contains(&depth)
        {
            return Err(ExecutorError::validation(
                "maxAgentDepth",
                format!(
                    "maxAgentDepth must be between 1 and {}",
                    baton_domain::tool::MAX_AGENT_DEPTH
                ),
            ));
        }
        Ok(())
    }
}

/// A finished run: what the DESIGN.md flow run response says.
#[derive(Debug, Clone)]
pub struct FlowRunOutcome {
    pub id: String,
    pub flow_id: String,
    pub flow_name: String,
    pub version_id: String,
    pub environment: String,
    pub template_name: String,
    /// The answer (text, citations, usage of this run, finish reason).
    pub response: InferenceResponse,
    /// The answer parsed as JSON when a response schema applied.
    pub json: Option<Value>,
    /// The model or alias the run asked for.
    pub model: String,
    /// `<provider>/<model>` that answered.
    pub served_model: String,
    pub fallback_used: bool,
    /// This run's own model calls, in credits.
    pub cost_credits: i64,
    /// The whole request (classifier and sub-agents included), in credits.
    pub total_credits_used: i64,
    pub tool_calls: Vec<ToolCallRecord>,
    pub warnings: Vec<RunWarning>,
    pub duration_ms: u64,
}

/// Placeholder values as text: strings as they are, anything else as JSON.
pub fn parameter_values(parameters: Option<Map<String, Value>>) -> HashMap<String, String> {
    parameters
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| {
            let text = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            (name, text)
        })
        .collect()
}

enum Started {
    Done(Box<FlowRunOutcome>),
    Stream(EnvelopeStream),
}

impl Engine {
    /// Runs a flow to its end.
    pub async fn run_flow(&self, request: FlowRunRequest) -> ExecutorResult<FlowRunOutcome> {
        match self.start_flow(request, false).await? {
            Started::Done(outcome) => Ok(*outcome),
            Started::Stream(_) => Err(ExecutorError::Internal(
                "a synchronous run produced a stream".into(),
            )),
        }
    }

    /// Runs a flow, returning its event envelopes as they happen. Errors before the first
    /// model call are returned here; later ones are `error` and `requestFailed` events.
    pub async fn run_flow_stream(&self, request: FlowRunRequest) -> ExecutorResult<EnvelopeStream> {
        match self.start_flow(request, true).await? {
            Started::Stream(stream) => Ok(stream),
            Started::Done(_) => Err(ExecutorError::Internal(
                "a streamed run produced no stream".into(),
            )),
        }
    }

    async fn start_flow(&self, body: FlowRunRequest, stream: bool) -> ExecutorResult<Started> {
        body.validate()?;
        let mut tags = body.tags;
        let callback = body.callback;
        if let Some(origin) = &callback.debug_origin {
            // The deprecated header marks the run (internal marker tag, not counted in the 20).
            tags.push(format!("DebugUrl:{origin}"));
        }
        let customer = body.customer;
        let tenant = body.tenant;
        let run_id = body.run_id;
        let found = self.found_flow(&tenant, &body.flow).await?;
        let flow = &found.flow;
        // Environment names are stored trimmed (activation trims what it is given).
        let environment = match body.environment {
            Some(name) => name.trim().to_string(),
            None => found.environments.first().cloned().ok_or_else(|| {
                ExecutorError::validation(
                    "environment",
                    format!(
                        "flow '{}' has no active version: activate one for an environment first",
                        flow.name
                    ),
                )
            })?,
        };
        let version_id = flow
            .active_versions
            .get(&environment)
            .cloned()
            .ok_or_else(|| {
                ExecutorError::validation(
                    "environment",
                    format!(
                        "flow '{}' has no version active in '{environment}'",
                        flow.name
                    ),
                )
            })?;
        let compiled = self
            .compiled_version(&tenant, &flow.id, &version_id)
            .await?;
        let settings = self.tenant_settings(&tenant).await?;
        // One request from the rate limit, before anything (the classifier included) is called.
        check_rate_limit(self, &tenant, &settings).await?;
        let values = parameter_values(body.parameters);
        let pricing = Pricing::new(self.providers().catalogue().clone(), &settings);
        let started = Instant::now();

        // Input that does not depend on the template is checked before a Route classifier is
        // called: a refused request makes no (billed) call.
        let requested_schema = body
            .response_schema
            .as_ref()
            .map(|s| {
                OutputSchema::compile(s).map_err(|e| ExecutorError::validation("responseSchema", e))
            })
            .transpose()?;
        if let Some(name) = body.override_model.as_deref() {
            check_model(
                self,
                &tenant,
                Named {
                    name,
                    param: "overrideModel",
                },
            )
            .await?;
        }

        // Route mode: a classifier call picks the template (its own logged, billed child run).
        let parent = ClassifierParent {
            root_id: &run_id,
            run_id: &run_id,
            depth: 0,
            tags: &tags,
            customer: customer.as_deref(),
            deadline: None,
            holds_budget: true,
        };
        let (template_name, classifier, classifier_warning) = self
            .choose_template(&tenant, flow, &compiled, &values, parent, &pricing)
            .await?
            .resolve(&compiled.version.entrypoint);
        let classifier_credits = classifier.map_or(0, |c| c.credits);
        let template = compiled.version.template(&template_name).ok_or_else(|| {
            ExecutorError::validation(
                "environment",
                format!("the active version has no '{template_name}' template"),
            )
        })?;
        let rendered = compiled
            .library
            .render(&template_name, &values)
            .map_err(|e| ExecutorError::validation("parameters", e.to_string()))?;
        let mut warnings = unresolved_warnings(&rendered.unresolved);
        warnings.extend(classifier_warning);

        let template_tools = self.tools(&tenant, &template.tool_ids).await?;
        for id in &template.tool_ids {
            if !template_tools.found().iter().any(|t| &t.id == id) {
                warnings.push(RunWarning {
                    code: "TOOL_NOT_FOUND".into(),
                    message: format!(
                        "tool '{id}' listed in toolIds no longer exists; the run went on without it"
                    ),
                    parameter: Some("toolIds".into()),
                });
            }
        }
        let tools = template_tools.set();

        let schema = match requested_schema {
            Some(schema) => Some(schema),
            None => template
                .response_schema
                .as_ref()
                .map(|s| {
                    OutputSchema::compile(s)
                        .map_err(|e| ExecutorError::validation("responseSchema", e))
                })
                .transpose()?,
        };
        let schema_value = body
            .response_schema
            .or_else(|| template.response_schema.clone());
        let mut messages = Vec::with_capacity(2);
        if !rendered.system.trim().is_empty() {
            messages.push(Message::text(Role::System, rendered.system));
        }
        if let Some(user) = rendered.user.filter(|u| !u.trim().is_empty()) {
            messages.push(Message::text(Role::User, user));
        }
        if messages.is_empty() {
            // Activation made sure the template renders to something on its own, so the
            // parameters' values emptied it: they are what the caller can change.
            return Err(ExecutorError::validation(
                "parameters",
                format!(
                    "template '{template_name}' renders to nothing to send with these parameters"
                ),
            ));
        }
        let has_schema = schema_value.is_some();
        let mut request = InferenceRequest {
            messages,
            temperature: template.temperature,
            response_format: schema_value.map(|schema| ResponseFormat::JsonSchema {
                name: "response".into(),
                schema,
                strict: None,
            }),
            vendor_tools: body.vendor_tools,
            stream_usage: true,
            ..InferenceRequest::default()
        };
        let selection = ModelSelection {
            override_model: body.override_model.as_deref().map(|name| Named {
                name,
                param: "overrideModel",
            }),
            configured: template
                .llm
                .as_deref()
                .map(|name| Named { name, param: "llm" }),
            fallbacks: &template.fallbacks,
            fallbacks_param: "fallbacks",
            tenant_default: None,
        };
        let mut plan = plan_chain(
            self,
            &tenant,
            &settings,
            selection,
            &request,
            None,
            body.timeouts,
        )
        .await?;
        if !tools.is_empty() {
            // Each turn's request differs: a whole tool conversation is not a cacheable answer.
            plan.cache = None;
        }
        let holds = self
            .admit(
                &tenant,
                customer.as_deref(),
                &tags,
                crate::budgets::estimate_credits(&pricing, &plan, &request),
            )
            .await?;

        let mut log = RunLog::start(
            self.runs().clone(),
            pricing.clone(),
            run_id.clone(),
            tenant.clone(),
            RunKind::Flow,
            plan.chain.requested.clone(),
        );
        holds.attach(log.record_mut());
        if let Some(record) = log.record_mut() {
            record.environment = Some(environment.clone());
            record.flow_name = Some(flow.name.clone());
            record.tags = tags.clone();
            record.customer_external_id = customer.clone();
            record.is_debug = body.is_debug;
            record.callback_origin = callback.origin();
            record.warnings = warnings.clone();
        }
        log.set_request(&json!({
            "flowId": flow.id, "versionId": version_id, "templateName": template_name,
            "parameters": values, "request": request,
        }));

        let identity = RunIdentity {
            id: run_id.clone(),
            flow_id: flow.id.clone(),
            flow_name: flow.name.clone(),
            version_id: version_id.clone(),
            environment: environment.clone(),
            template_name: template_name.clone(),
        };
        // A request may lower the tenant's ceiling, never raise it.
        let budget = match (
            settings.max_cost_per_request_credits,
            body.max_cost_per_request_credits,
        ) {
            (Some(tenant), Some(request)) => Some(tenant.min(request)),
            (tenant, request) => tenant.or(request),
        };
        if !tools.is_empty() {
            let original_input: Vec<String> = request
                .messages
                .iter()
                .filter(|m| m.role == Role::User)
                .map(Message::joined_text)
                .collect();
            let live = stream.then(mpsc::unbounded_channel);
            let shows_errors = body
                .stream_options
                .as_ref()
                .is_none_or(|options| options.filter.allows("error"));
            // Sent while nothing else is (a long model or tool call), so idle proxies keep
            // the stream open; unless the client's filter leaves heartbeats out.
            let options = body.stream_options.clone().unwrap_or_default();
            let heartbeat = options
                .filter
                .allows("heartbeat")
                .then_some(options.heartbeat_interval);
            // And usage every `usage_interval_ms`, between the updates each model call sends.
            let usage_every = (options.include_usage && options.filter.allows("usageUpdate"))
                .then_some(options.usage_interval);
            let (sender, receiver) = match live {
                Some((sender, receiver)) => (Some(sender), Some(receiver)),
                None => (None, None),
            };
            let deadline = plan.deadline;
            let input = ToolRunInput {
                engine: self.clone(),
                tenant: tenant.clone(),
                plan,
                request,
                schema,
                log,
                pricing,
                tools,
                max_iterations: template
                    .max_tool_calls
                    .unwrap_or(DEFAULT_MAX_TOOL_ITERATIONS),
                environment: environment.clone(),
                parameters: values,
                callback,
                callback_origins: settings.callback_origins.clone(),
                events: SharedEvents::new(
                    self.event_log(run_id.clone()),
                    sender,
                    body.stream_options,
                ),
                earlier_credits: classifier_credits,
                flow_name: flow.name.clone(),
                scope: AgentScope::root(
                    &run_id,
                    &flow.id,
                    body.max_agent_depth,
                    tags,
                    customer,
                    original_input,
                    budget,
                )
                .with_deadline(deadline),
            };
            // The classifier's call counts against the request's cost ceiling too, and in the
            // tree's totals (a call, its tokens, a run one level down).
            input.scope.charge(classifier_credits);
            if let Some(classifier) = classifier {
                input
                    .events
                    .add_tree_tokens(classifier.usage.tokens_in, classifier.usage.tokens_out);
                input
                    .scope
                    .deepest
                    .fetch_max(1, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(receiver) = receiver {
                let usage = usage_every.map(|every| UsageTicks {
                    every,
                    events: input.events.clone(),
                    spent: input.scope.spent.clone(),
                });
                // The run goes on to the end (and is logged) even if the consumer leaves; in the
                // request's span, so a debug run's log lines are still captured.
                tokio::spawn(
                    async move {
                        let _ = toolrun::run(input).await;
                    }
                    .in_current_span(),
                );
                return Ok(Started::Stream(Box::pin(live_envelopes(
                    receiver,
                    run_id.clone(),
                    &self.config().limits,
                    shows_errors,
                    heartbeat,
                    usage,
                ))));
            }
            let requested = input.plan.chain.requested.clone();
            // On its own task, as a streamed run: a client that leaves does not cut the run (and
            // its tool calls) off half way; it finishes and is logged and billed.
            let result = tokio::spawn(toolrun::run(input).in_current_span())
                .await
                .map_err(|e| ExecutorError::Internal(format!("the tool run stopped: {e}")))??;
            warnings.extend(result.warnings);
            let answered = Answered {
                requested,
                served: result.served,
                fallback_used: result.fallback_used,
                direct_credits: result.cost.billed.0,
                total_credits: result.tree_credits.saturating_add(classifier_credits),
                tool_calls: result.tool_calls,
                warnings,
                has_schema,
                started,
            };
            return Ok(Started::Done(Box::new(
                answered.into_outcome(identity, result.response),
            )));
        }
        // A tool run queues its `Pending` row itself; a single call only when it holds budget.
        log.queue_pending_if_holding().await;

        let mut call = CallInfo {
            flow_name: Some(flow.name.clone()),
            warnings: warnings.clone(),
            earlier_call: classifier,
            ..CallInfo::for_chain(
                &plan.chain,
                plan.chain.requested.clone(),
                request.messages.len(),
                0,
            )
        };
        // The request's cost ceiling is checked before its model call, as before every call
        // of a run with tools: a classifier may have spent it already.
        let over_budget = budget
            .filter(|budget| classifier_credits >= *budget)
            .map(|budget| ExecutorError::CostLimitExceeded { budget });

        if stream {
            let options = body.stream_options.unwrap_or_default();
            let events = self.event_log(run_id.clone());
            let opening = match over_budget {
                Some(error) => refused(error),
                None => opening(self.clone(), tenant.clone(), plan, request),
            };
            let limits = &self.config().limits;
            let stream = EventStream::new(opening, events, options, log, pricing, call, schema)
                .with_deadline(
                    limits.max_stream_duration,
                    limits.stream_duration_exceeded(),
                );
            return Ok(Started::Stream(Box::pin(envelopes(stream))));
        }

        // The lifecycle is stored with the run, as for every request (DESIGN.md "Streams").
        let mut events = self.event_log(run_id.clone());
        record_call_started(&mut events, &call);
        if let Some(error) = over_budget {
            record_call_outcome(&mut events, &call, Err(&error));
            log.attach_events(events.take_stored());
            return Err(Failure::from(error).log(log).await);
        }
        let answer = match answer(
            self,
            &tenant,
            &plan,
            &mut request,
            schema.as_ref(),
            &mut log,
        )
        .await
        {
            Ok(answer) => answer,
            Err(failure) => {
                record_call_outcome(&mut events, &call, Err(&failure.error));
                log.attach_events(events.take_stored());
                return Err(failure.log(log).await);
            }
        };
        call.served_by(&answer.model, answer.fallback_used, answer.cached);
        let pricing = answer.pricing(pricing);
        let response: InferenceResponse = answer.value;
        let (provider, model) = (answer.model.provider.as_str(), answer.model.model.as_str());
        let served = if response.model.is_empty() {
            model
        } else {
            response.model.as_str()
        };
        let cost = pricing.cost_of_answer(provider, served, model, &response);
        // The log keeps its own copy of the answer: the outcome takes the original.
        finish_answered_call(log, events, call, response.clone(), cost.billed).await;
        let answered = Answered {
            requested: plan.chain.requested,
            served: answer.model,
            fallback_used: answer.fallback_used,
            direct_credits: cost.billed.0,
            total_credits: cost.billed.0.saturating_add(classifier_credits),
            tool_calls: Vec::new(),
            warnings,
            has_schema,
            started,
        };
        Ok(Started::Done(Box::new(
            answered.into_outcome(identity, response),
        )))
    }

    /// Route mode with at least two described templates asks the classifier model; otherwise
    /// (and when the classifier's answer names no template) the entrypoint runs. The
    /// classifier's call is logged as a child run of `parent` (a flow run or a sub-agent).
    pub(crate) async fn choose_template(
        &self,
        tenant: &TenantId,
        flow: &Flow,
        compiled: &CompiledVersion,
        values: &HashMap<String, String>,
        parent: ClassifierParent<'_>,
        pricing: &Pricing,
    ) -> ExecutorResult<Choice> {
        let described: Vec<&Template> = compiled
            .version
            .templates
            .iter()
            .filter(|t| t.description.is_some())
            .collect();
        if flow.execution_mode != ExecutionMode::Route || described.len() < 2 {
            return Ok(Choice::Entrypoint);
        }
        let mut menu = String::from(
            "You route a request to the one template that fits it best. Answer with the template's name only.\n\nTemplates:\n",
        );
        for template in &described {
            menu.push_str(&format!(
                "- {}: {}\n",
                template.name,
                template.description.as_deref().unwrap_or_default()
            ));
        }
        // The input is what the caller sent: the entrypoint's rendered user message, else the
        // values.
        let input = compiled
            .library
            .render(&compiled.version.entrypoint, values)
            .ok()
            .and_then(|r| r.user)
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| {
                let mut pairs: Vec<_> = values.iter().collect();
                pairs.sort();
                pairs
                    .into_iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        let mut request = InferenceRequest {
            messages: vec![
                Message::text(Role::System, menu),
                Message::text(Role::User, input),
            ],
            temperature: Some(0.0),
            max_tokens: Some(64),
            ..InferenceRequest::default()
        };
        let settings = self.tenant_settings(tenant).await?;
        let selection = ModelSelection {
            configured: flow.classifier_model.as_deref().map(|name| Named {
                name,
                param: "classifierModel",
            }),
            ..ModelSelection::default()
        };
        let mut plan = plan_chain(
            self,
            tenant,
            &settings,
            selection,
            &request,
            None,
            RequestTimeouts::default(),
        )
        .await?;
        if let Some(deadline) = parent.deadline {
            plan.deadline = plan.deadline.min(deadline);
        }
        let holds = if parent.holds_budget {
            Some(
                self.admit(
                    tenant,
                    parent.customer,
                    parent.tags,
                    crate::budgets::estimate_credits(pricing, &plan, &request),
                )
                .await?,
            )
        } else {
            None
        };
        let child_id = uuid::Uuid::now_v7().to_string();
        let mut log = RunLog::start(
            self.runs().clone(),
            pricing.clone(),
            child_id,
            tenant.clone(),
            RunKind::Inference,
            plan.chain.requested.clone(),
        );
        if let Some(holds) = holds {
            holds.attach(log.record_mut());
        }
        if let Some(record) = log.record_mut() {
            parent.link(record);
            record.flow_name = Some(flow.name.clone());
        }
        let answer = match answer(self, tenant, &plan, &mut request, None, &mut log).await {
            Ok(answer) => answer,
            Err(failure) => {
                // Every model of the classifier's chain failed upstream: rather than fail the
                // request, its entrypoint runs (the classifier's failure is logged on its run).
                let upstream =
                    matches!(failure.error.code(), "PROVIDER_ERROR" | "PROVIDER_TIMEOUT");
                let error = failure.log(log).await;
                if upstream {
                    return Ok(Choice::Unclassified(RunWarning {
                        code: "CLASSIFIER_FAILED".into(),
                        message: format!(
                            "the classifier could not pick a template ({error}): the entrypoint ran"
                        ),
                        parameter: None,
                    }));
                }
                return Err(error);
            }
        };
        let response = answer.value;
        let cost = pricing.cost_of_answer(
            &answer.model.provider,
            &answer.model.model,
            &answer.model.model,
            &response,
        );
        log.succeed(&answer.model.provider, &answer.model.model, &response)
            .await;
        // Template names are lower case; models often capitalise their answer ("Beta.").
        let reply = response
            .text
            .trim()
            .trim_matches(|c| c == '"' || c == '`' || c == '.' || c == '*')
            .to_ascii_lowercase();
        let chosen = described
            .iter()
            .find(|t| t.name == reply)
            .or_else(|| described.iter().find(|t| reply.contains(t.name.as_str())));
        let spend = EarlierCall {
            credits: cost.billed.0,
            usage: response.usage,
        };
        Ok(match chosen {
            Some(template) => Choice::Classified {
                name: template.name.clone(),
                spend,
            },
            None => {
                tracing::debug!(
                    reply,
                    "classifier named no template; running the entrypoint"
                );
                Choice::Classified {
                    name: compiled.version.entrypoint.clone(),
                    spend,
                }
            }
        })
    }
}

/// Which run answered: the ids and names every flow run outcome starts with.
struct RunIdentity {
    id: String,
    flow_id: String,
    flow_name: String,
    version_id: String,
    environment: String,
    template_name: String,
}

/// How a run's answer came about: the model, its costs and what happened on the way.
struct Answered {
    requested: String,
    served: ChainModel,
    fallback_used: bool,
    direct_credits: i64,
    total_credits: i64,
    tool_calls: Vec<ToolCallRecord>,
    warnings: Vec<RunWarning>,
    has_schema: bool,
    started: Instant,
}

impl Answered {
    fn into_outcome(self, identity: RunIdentity, response: InferenceResponse) -> FlowRunOutcome {
        let served = if response.model.is_empty() {
            self.served.model.as_str()
        } else {
            response.model.as_str()
        };
        let json = self
            .has_schema
            .then(|| serde_json::from_str(&response.text).ok())
            .flatten();
        FlowRunOutcome {
            id: identity.id,
            flow_id: identity.flow_id,
            flow_name: identity.flow_name,
            version_id: identity.version_id,
            environment: identity.environment,
            template_name: identity.template_name,
            model: self.requested,
            served_model: format!("{}/{served}", self.served.provider),
            fallback_used: self.fallback_used,
            cost_credits: self.direct_credits,
            total_credits_used: self.total_credits,
            json,
            tool_calls: self.tool_calls,
            warnings: self.warnings,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            response,
        }
    }
}

/// Which template a run executes.
pub(crate) enum Choice {
    Entrypoint,
    /// The classifier's pick and what its call spent.
    Classified {
        name: String,
        spend: EarlierCall,
    },
    /// The classifier's model failed upstream: the entrypoint runs, with this warning.
    Unclassified(RunWarning),
}

impl Choice {
    /// The template to run, what the classifier spent (if it answered), and a warning if it
    /// could not choose.
    pub(crate) fn resolve(
        self,
        entrypoint: &str,
    ) -> (String, Option<EarlierCall>, Option<RunWarning>) {
        match self {
            Choice::Entrypoint => (entrypoint.to_string(), None, None),
            Choice::Classified { name, spend } => (name, Some(spend), None),
            Choice::Unclassified(warning) => (entrypoint.to_string(), None, Some(warning)),
        }
    }
}

/// The run a Route-mode classifier call belongs to: a flow run (its own root, depth 0) or a
/// sub-agent inside a tree. Tags and customer are the run's, so budgets and statistics count
/// the classifier's cost with it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClassifierParent<'a> {
    pub root_id: &'a str,
    pub run_id: &'a str,
    pub depth: u32,
    pub tags: &'a [String],
    pub customer: Option<&'a str>,
    /// The tree's deadline, for a sub-agent (a flow run's classifier is its first call).
    pub deadline: Option<Instant>,
    /// A flow run's classifier is the request's first call, so it takes the hard budgets'
    /// holds itself; a sub-agent's is inside a tree admitted at its root.
    pub holds_budget: bool,
}

impl ClassifierParent<'_> {
    /// The classifier's call belongs to the parent's tree: same root, the run as parent.
    fn link(&self, record: &mut RunRecord) {
        record.root_id = self.root_id.to_string();
        record.parent_id = Some(self.run_id.to_string());
        record.depth = self.depth + 1;
        record.agent_role = Some("classifier".to_string());
        record.tags = self.tags.to_vec();
        record.customer_external_id = self.customer.map(str::to_string);
        record.created_at = Timestamp::now();
    }
}

/// SPEC.md: an unresolved parameter is sent as written and "the response carries a warning".
pub(crate) fn unresolved_warnings(unresolved: &[String]) -> Vec<RunWarning> {
    unresolved
        .iter()
        .map(|name| RunWarning {
            code: "UNRESOLVED_PARAMETER".into(),
            message: format!(
                "[[{name}]] has no value and names no template: it was sent as written"
            ),
            parameter: Some(name.clone()),
        })
        .collect()
}

/// What a streamed run with tools needs for its periodic `usageUpdate`s.
struct UsageTicks {
    every: Duration,
    events: SharedEvents,
    /// The tree's billed credits so far.
    spent: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

/// The live events of a run with tools, until the run ends or the stream reaches
/// `limits.max_stream_duration`: then an `error` event (not stored: the run is not affected) ends
/// the stream, and the run goes on to the end and is logged, as when a client leaves.
fn live_envelopes(
    receiver: mpsc::UnboundedReceiver<Value>,
    run_id: String,
    limits: &crate::bounds::Limits,
    shows_errors: bool,
    heartbeat: Option<Duration>,
    usage: Option<UsageTicks>,
) -> impl futures::Stream<Item = Value> + Send + 'static {
    /// What the stream holds between envelopes.
    struct Live {
        /// `None` once the stream has ended (past its deadline).
        receiver: Option<mpsc::UnboundedReceiver<Value>>,
        deadline: Option<crate::stream::Deadline>,
        /// The request the `error` and `heartbeat` envelopes name.
        run_id: String,
        heartbeat: Option<tokio::time::Interval>,
        /// Periodic `usageUpdate`s and where their figures come from.
        usage: Option<(tokio::time::Interval, UsageTicks)>,
        started: Instant,
        sent: u64,
    }
    let ticks = |every: Duration| {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    };
    let live = Live {
        receiver: Some(receiver),
        deadline: Some(crate::stream::Deadline::after(
            limits.max_stream_duration,
            limits.stream_duration_exceeded(),
        )),
        run_id,
        heartbeat: heartbeat.map(ticks),
        usage: usage.map(|usage| (ticks(usage.every), usage)),
        started: Instant::now(),
        sent: 0,
    };
    let stream = futures::stream::unfold(live, move |mut live| async move {
        let receiver = live.receiver.as_mut()?;
        let envelope = tokio::select! {
            envelope = receiver.recv() => Some(envelope?),
            _ = async { live.heartbeat.as_mut()?.tick().await; Some(()) }, if live.heartbeat.is_some() => {
                let elapsed = u64::try_from(live.started.elapsed().as_millis()).unwrap_or(u64::MAX);
                Some(EventLog::new(live.run_id.clone()).emit(
                    "heartbeat",
                    json!({"elapsedMs": elapsed, "eventCount": live.sent}),
                ))
            }
            _ = async { live.usage.as_mut()?.0.tick().await; Some(()) }, if live.usage.is_some() => {
                live.usage.as_ref().map(|(_, usage)| {
                    let spent = usage.spent.load(std::sync::atomic::Ordering::Relaxed);
                    // Streamed only: the stored log keeps the updates of the model calls.
                    EventLog::new(live.run_id.clone())
                        .emit("usageUpdate", usage.events.usage_data(spent))
                })
            }
            error = crate::stream::past(live.deadline.as_mut()) => {
                // Dropping the receiver: the run's further events go to its log only.
                live.receiver = None;
                live.deadline = None;
                shows_errors.then(|| {
                    EventLog::new(live.run_id.clone()).emit(
                        "error",
                        request_error(error.code(), &error.to_string()),
                    )
                })
            }
        };
        live.sent += u64::from(envelope.is_some());
        Some((envelope, live))
    });
    futures::StreamExt::filter_map(stream, futures::future::ready)
}
