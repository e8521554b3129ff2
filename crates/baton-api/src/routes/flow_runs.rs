//! `POST /api/v1/flows/{flowId}/runs` (SPEC.md "Flow execution"): the version pinned to an
//! environment, its template rendered into messages, the model chain of the template (or the
//! request's `overrideModel`), and the DESIGN.md flow run response. `GET /api/v1/runs/{runId}`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use baton_domain::chat::{
    Citation, InferenceRequest, InferenceResponse, Message, ResponseFormat, Role, VendorTool,
};
use baton_domain::flow::{ExecutionMode, Flow, Template, Version};
use baton_domain::run::{RunKind, RunRecord, RunWarning, ToolCallRecord};
use baton_domain::tags::{merge_tags, validate_tags};
use baton_domain::{TenantId, Timestamp};
use baton_executor::{DEFAULT_MAX_TOOL_ITERATIONS, ToolSet};
use baton_providers::routing::{ModelSelection, Named};
use baton_providers::structured::OutputSchema;
use baton_template::Library;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::context::RequestId;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::events::{CallInfo, EventLog};
use crate::extract::{Json, PathParam};
use crate::gateway::{RequestTimeouts, answer, open_stream, plan_call};
use crate::routes::chat::{customer_of, header_tags};
use crate::routes::chat_events::{EventOptions, EventStream, StreamEnd, event_stream};
use crate::routes::flows::compile;
use crate::runlog::{Pricing, RunLog};
use crate::state::AppState;
use crate::toolrun::{self, AgentScope, Callback, SharedEvents, ToolRunInput};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowRunBody {
    /// Values for `[[name]]` placeholders; non-string values are inserted as JSON text.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Map<String, Value>>,
    /// The environment whose pinned version runs; default: the first activated.
    #[serde(default)]
    pub environment: Option<String>,
    #[serde(default)]
    pub customer_id: Option<String>,
    /// Overrides the template's response schema for this run.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_schema: Option<Value>,
    /// Provider-native tools: `web_search`, `code_interpreter`, `web_search_20250305`.
    #[serde(default)]
    pub vendor_tools: Vec<String>,
    /// Model or routing alias, instead of the template's `llm`.
    #[serde(default)]
    pub override_model: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Streams the events format.
    #[serde(default)]
    pub stream: bool,
    /// Events-format options of SPEC.md "Stream options" (`event_types`,
    /// `include_tool_results`, `include_agent_results`, ...), with their snake_case keys.
    #[serde(default, alias = "stream_options")]
    #[schema(value_type = Option<Object>)]
    pub stream_options: Option<Map<String, Value>>,
    #[serde(default)]
    pub is_debug: bool,
    /// Per model attempt time limits.
    #[serde(default)]
    pub timeouts: Option<RequestTimeouts>,
    /// Deepest sub-agent nesting for this request (wins over tools' and the tenant's limits).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    pub max_agent_depth: Option<u32>,
    /// Cost ceiling of the whole agent tree, in credits; it can only lower the tenant's.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_cost_per_request_credits: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunOutput {
    pub text: String,
    /// The answer parsed as JSON when a response schema applied.
    #[schema(value_type = Option<Object>)]
    pub json: Option<Value>,
    /// Sources the model cited (provider-run web search, grounding).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub citations: Vec<Citation>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunUsage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub reasoning_tokens: u64,
    /// This run's own model call.
    pub cost_credits: i64,
    pub cost_usd: f64,
    /// The whole request: the run plus its classifier call (and, later, its agent tree).
    pub total_credits_used: i64,
    pub total_cost_usd: f64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowRunResponse {
    pub id: String,
    pub flow_id: String,
    pub flow_name: String,
    pub version_id: String,
    pub environment: String,
    pub template_name: String,
    /// `Succeeded` (failures are error responses).
    pub status: &'static str,
    pub output: RunOutput,
    pub finish_reason: &'static str,
    /// The model or alias the run asked for.
    pub model: String,
    /// `<provider>/<model>` that answered.
    pub served_model: String,
    pub fallback_used: bool,
    pub usage: RunUsage,
    /// Tool calls of the run, with the endpoint used and where it came from.
    pub tool_calls: Vec<ToolCallRecord>,
    pub warnings: Vec<RunWarning>,
    pub duration_ms: u64,
}

/// A flow's version ready to run: the record and its compiled templates.
pub(crate) struct CompiledVersion {
    pub version: Version,
    pub library: Library,
}

/// Activated versions never change, so compiled ones are cached by id.
pub(crate) async fn compiled_version(
    state: &AppState,
    tenant: &TenantId,
    flow: &Flow,
    version_id: &str,
) -> ApiResult<Arc<CompiledVersion>> {
    let key = format!("{}\u{1f}{version_id}", tenant.as_str());
    if let Some(hit) = state.versions.get(&key).await {
        return Ok(hit);
    }
    let version = state
        .store
        .get_version(tenant, &flow.id, version_id)
        .await?;
    let library = compile(&version.templates)?;
    let compiled = Arc::new(CompiledVersion { version, library });
    state.versions.insert(key, compiled.clone()).await;
    Ok(compiled)
}

pub(crate) fn parameter_values(parameters: Option<Map<String, Value>>) -> HashMap<String, String> {
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

#[utoipa::path(post, path = "/api/v1/flows/{flowId}/runs", tag = "flows", request_body = FlowRunBody,
    params(
        ("flowId" = String, Path, description = "Flow id or slug"),
        ("X-Baton-Customer-Id" = Option<String>, Header, description = "End customer to attribute usage to"),
        ("X-Baton-Tags" = Option<String>, Header, description = "Comma-separated Key:value tags, merged with body tags"),
    ),
    responses(
        (status = 200, description = "The run's answer; with stream=true an SSE stream in the events format", body = FlowRunResponse),
        (status = 400, description = "Invalid request, or no version active", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow, or unknown model", body = ErrorResponse),
        (status = 502, description = "Every model failed", body = ErrorResponse),
        (status = 504, description = "The provider timed out", body = ErrorResponse),
    ))]
pub async fn run_flow(
    State(state): State<AppState>,
    principal: Principal,
    axum::Extension(request_id): axum::Extension<RequestId>,
    headers: HeaderMap,
    PathParam(flow_ref): PathParam,
    Json(body): Json<FlowRunBody>,
) -> ApiResult<Response> {
    let mut tags = merge_tags(validate_tags(body.tags, "tags")?, header_tags(&headers)?)?;
    let callback = Callback::from_headers(&headers)?;
    if callback.from_debug_header
        && let Some(origin) = callback.origin()
    {
        // The deprecated header marks the run (internal marker tag, not counted in the 20).
        tags.push(format!("DebugUrl:{origin}"));
    }
    let customer = customer_of(&headers, body.customer_id.as_deref())?;
    let vendor_tools = body
        .vendor_tools
        .iter()
        .enumerate()
        .map(|(i, name)| VendorTool::parse(name, &format!("vendorTools[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let timeouts = body.timeouts.unwrap_or_default().validated("timeouts")?;
    let stream_options = body
        .stream_options
        .as_ref()
        .map(EventOptions::parse)
        .transpose()?;
    if body.max_cost_per_request_credits.is_some_and(|c| c < 1) {
        return Err(ApiError::validation(
            "maxCostPerRequestCredits",
            "maxCostPerRequestCredits must be at least 1",
        ));
    }
    if let Some(depth) = body.max_agent_depth
        && !(1..=baton_domain::tool::MAX_AGENT_DEPTH).contains(&depth)
    {
        return Err(ApiError::validation(
            "maxAgentDepth",
            format!(
                "maxAgentDepth must be between 1 and {}",
                baton_domain::tool::MAX_AGENT_DEPTH
            ),
        ));
    }
    let tenant = principal.tenant.clone();
    let found = state.store.get_flow(&tenant, &flow_ref).await?;
    let flow = found.flow;
    let environment = match body.environment {
        Some(name) => name,
        None => found.environments.first().cloned().ok_or_else(|| {
            ApiError::validation(
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
            ApiError::validation(
                "environment",
                format!(
                    "flow '{}' has no version active in '{environment}'",
                    flow.name
                ),
            )
        })?;
    let compiled = compiled_version(&state, &tenant, &flow, &version_id).await?;
    let settings = state.tenant_settings(&tenant).await?;
    let values = parameter_values(body.parameters);
    let pricing = Pricing::new(state.providers.catalogue().clone(), &settings);
    let started = std::time::Instant::now();

    // Route mode: a classifier call picks the template (its own logged, billed child run).
    let mut classifier_credits = 0;
    let template_name = match choose_template(
        &state,
        &tenant,
        &flow,
        &compiled,
        &values,
        &request_id.0,
        &pricing,
    )
    .await?
    {
        Choice::Entrypoint => compiled.version.entrypoint.clone(),
        Choice::Classified { name, credits } => {
            classifier_credits = credits;
            name
        }
    };
    let template = compiled.version.template(&template_name).ok_or_else(|| {
        ApiError::validation(
            "environment",
            format!("the active version has no '{template_name}' template"),
        )
    })?;
    let rendered = compiled
        .library
        .render(&template_name, &values)
        .map_err(|e| ApiError::validation("parameters", e.to_string()))?;
    let mut warnings: Vec<RunWarning> = rendered
        .unresolved
        .iter()
        .map(|name| RunWarning {
            code: "UNRESOLVED_PARAMETER".into(),
            message: format!(
                "[[{name}]] has no value and names no template: it was sent as written"
            ),
            parameter: Some(name.clone()),
        })
        .collect();

    let tool_list = state
        .store
        .tools_by_ids(&tenant, &template.tool_ids)
        .await?;
    for id in &template.tool_ids {
        if !tool_list.iter().any(|t| &t.id == id) {
            warnings.push(RunWarning {
                code: "TOOL_NOT_FOUND".into(),
                message: format!(
                    "tool '{id}' listed in toolIds no longer exists; the run went on without it"
                ),
                parameter: Some("toolIds".into()),
            });
        }
    }
    let tools = ToolSet::new(tool_list);

    let schema_value = body
        .response_schema
        .or_else(|| template.response_schema.clone());
    let schema = schema_value
        .as_ref()
        .map(|s| OutputSchema::compile(s).map_err(|e| ApiError::validation("responseSchema", e)))
        .transpose()?;
    let mut messages = Vec::with_capacity(2);
    if !rendered.system.trim().is_empty() {
        messages.push(Message::text(Role::System, rendered.system));
    }
    if let Some(user) = rendered.user.filter(|u| !u.trim().is_empty()) {
        messages.push(Message::text(Role::User, user));
    }
    if messages.is_empty() {
        return Err(ApiError::validation(
            "template",
            format!("template '{template_name}' renders to nothing to send"),
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
        vendor_tools,
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
    let mut plan = plan_call(
        &state, &tenant, &settings, selection, &request, None, timeouts,
    )
    .await?;
    if !tools.is_empty() {
        // Each turn's request differs: a whole tool conversation is not a cacheable answer.
        plan.cache = None;
    }

    let holds = crate::budgets::admit(
        &state,
        &tenant,
        customer.as_deref(),
        &tags,
        crate::budgets::estimate_credits(&pricing, &plan, &request),
    )
    .await?;
    let mut log = RunLog::start(
        state.runs.clone(),
        pricing.clone(),
        request_id.0.clone(),
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
    log.set_request(json!({
        "flowId": flow.id, "versionId": version_id, "templateName": template_name,
        "parameters": values, "request": request,
    }));

    let identity = RunIdentity {
        id: request_id.0.clone(),
        flow_id: flow.id.clone(),
        flow_name: flow.name.clone(),
        version_id: version_id.clone(),
        environment: environment.clone(),
        template_name: template_name.clone(),
    };
    if !tools.is_empty() {
        let original_input: Vec<String> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .map(Message::joined_text)
            .collect();
        // A request may lower the tenant's ceiling, never raise it.
        let budget = match (
            settings.max_cost_per_request_credits,
            body.max_cost_per_request_credits,
        ) {
            (Some(tenant), Some(request)) => Some(tenant.min(request)),
            (tenant, request) => tenant.or(request),
        };
        let live = body.stream.then(mpsc::unbounded_channel);
        let (sender, receiver) = match live {
            Some((sender, receiver)) => (Some(sender), Some(receiver)),
            None => (None, None),
        };
        let input = ToolRunInput {
            state: state.clone(),
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
            events: SharedEvents::new(request_id.0.clone(), sender, stream_options),
            earlier_credits: classifier_credits,
            flow_name: flow.name.clone(),
            scope: AgentScope::root(
                &request_id.0,
                &flow.id,
                body.max_agent_depth,
                tags,
                customer,
                original_input,
                budget,
            ),
        };
        if let Some(receiver) = receiver {
            // The run goes on to the end (and is logged) even if the client leaves.
            tokio::spawn(async move {
                let _ = toolrun::run(input).await;
            });
            return Ok(Sse::new(live_events(receiver)).into_response());
        }
        let requested = input.plan.chain.requested.clone();
        let result = toolrun::run(input).await?;
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
        return Ok(axum::Json(answered.into_response(identity, result.response)).into_response());
    }

    let primary = plan.chain.primary().cloned();
    let mut call = CallInfo {
        provider_key: primary
            .as_ref()
            .map(|m| m.provider.clone())
            .unwrap_or_default(),
        model: primary
            .as_ref()
            .map(|m| m.model.clone())
            .unwrap_or_default(),
        requested_model: plan.chain.requested.clone(),
        message_count: request.messages.len(),
        tool_count: 0,
        inference_id: uuid::Uuid::now_v7().to_string(),
        was_cached: false,
        was_fallback: false,
    };

    if body.stream {
        let options = match stream_options {
            Some(options) => options,
            None => EventOptions::parse(&Map::new())?,
        };
        let mut events = EventLog::new(request_id.0.clone());
        let answer = match open_stream(&state, &tenant, &plan, &mut request, &mut log).await {
            Ok(answer) => answer,
            Err(failure) => {
                crate::events::emit_failure(
                    &mut events,
                    failure.error.code(),
                    &failure.error.to_string(),
                );
                log.attach_events(events.take_stored());
                return Err(failure.log(log).await);
            }
        };
        call.served_by(&answer.model, answer.fallback_used, answer.cached);
        let pricing = answer.pricing(pricing);
        let fill = answer.cache_fill(&state, &plan);
        let end = StreamEnd { fill, schema };
        let stream = EventStream::new(answer.value, events, options, log, pricing, call, end);
        return Ok(Sse::new(event_stream(stream)).into_response());
    }

    let answer = match answer(
        &state,
        &tenant,
        &plan,
        &mut request,
        schema.as_ref(),
        &mut log,
    )
    .await
    {
        Ok(answer) => answer,
        Err(failure) => return Err(failure.log(log).await),
    };
    let pricing = answer.pricing(pricing);
    let response: InferenceResponse = answer.value;
    let (provider, model) = (answer.model.provider.as_str(), answer.model.model.as_str());
    let served = if response.model.is_empty() {
        model
    } else {
        response.model.as_str()
    };
    let cost = pricing.cost(provider, served, model, &response.usage);
    log.succeed(provider, model, &response).await;
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
    Ok(axum::Json(answered.into_response(identity, response)).into_response())
}

/// Which run answered: the ids and names every flow run response starts with.
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
    served: baton_providers::routing::ChainModel,
    fallback_used: bool,
    /// This run's own model calls.
    direct_credits: i64,
    /// The whole request (classifier and sub-agents included).
    total_credits: i64,
    tool_calls: Vec<ToolCallRecord>,
    warnings: Vec<RunWarning>,
    has_schema: bool,
    started: std::time::Instant,
}

impl Answered {
    fn into_response(self, identity: RunIdentity, response: InferenceResponse) -> FlowRunResponse {
        let served = if response.model.is_empty() {
            self.served.model.as_str()
        } else {
            response.model.as_str()
        };
        let json = self
            .has_schema
            .then(|| serde_json::from_str(&response.text).ok())
            .flatten();
        let credits = baton_domain::credits::Credits;
        FlowRunResponse {
            id: identity.id,
            flow_id: identity.flow_id,
            flow_name: identity.flow_name,
            version_id: identity.version_id,
            environment: identity.environment,
            template_name: identity.template_name,
            status: "Succeeded",
            finish_reason: response.finish_reason.as_openai(),
            model: self.requested,
            served_model: format!("{}/{served}", self.served.provider),
            fallback_used: self.fallback_used,
            usage: RunUsage {
                tokens_in: response.usage.tokens_in,
                tokens_out: response.usage.tokens_out,
                reasoning_tokens: response.usage.reasoning_tokens,
                cost_credits: self.direct_credits,
                cost_usd: credits(self.direct_credits).to_usd(),
                total_credits_used: self.total_credits,
                total_cost_usd: credits(self.total_credits).to_usd(),
            },
            output: RunOutput {
                text: response.text,
                json,
                citations: response.citations,
            },
            tool_calls: self.tool_calls,
            warnings: self.warnings,
            duration_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

enum Choice {
    Entrypoint,
    Classified { name: String, credits: i64 },
}

/// Route mode with at least two described templates asks the classifier model; otherwise (and
/// when the classifier's answer names no template) the entrypoint runs.
async fn choose_template(
    state: &AppState,
    tenant: &TenantId,
    flow: &Flow,
    compiled: &CompiledVersion,
    values: &HashMap<String, String>,
    run_id: &str,
    pricing: &Pricing,
) -> ApiResult<Choice> {
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
    // The input is what the caller sent: the entrypoint's rendered user message, else the values.
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
    let settings = state.tenant_settings(tenant).await?;
    let selection = ModelSelection {
        configured: flow.classifier_model.as_deref().map(|name| Named {
            name,
            param: "classifierModel",
        }),
        ..ModelSelection::default()
    };
    let plan = plan_call(
        state,
        tenant,
        &settings,
        selection,
        &request,
        None,
        RequestTimeouts::default(),
    )
    .await?;
    let child_id = uuid::Uuid::now_v7().to_string();
    let mut log = RunLog::start(
        state.runs.clone(),
        pricing.clone(),
        child_id,
        tenant.clone(),
        RunKind::Inference,
        plan.chain.requested.clone(),
    );
    if let Some(record) = log.record_mut() {
        link_to_parent(record, run_id);
        record.flow_name = Some(flow.name.clone());
    }
    let answer = match answer(state, tenant, &plan, &mut request, None, &mut log).await {
        Ok(answer) => answer,
        Err(failure) => return Err(failure.log(log).await),
    };
    let response = answer.value;
    let cost = pricing.cost(
        &answer.model.provider,
        &answer.model.model,
        &answer.model.model,
        &response.usage,
    );
    log.succeed(&answer.model.provider, &answer.model.model, &response)
        .await;
    let reply = response
        .text
        .trim()
        .trim_matches(|c| c == '"' || c == '`' || c == '.');
    let chosen = described
        .iter()
        .find(|t| t.name == reply)
        .or_else(|| described.iter().find(|t| reply.contains(t.name.as_str())));
    Ok(match chosen {
        Some(template) => Choice::Classified {
            name: template.name.clone(),
            credits: cost.billed.0,
        },
        None => {
            tracing::debug!(
                reply,
                "classifier named no template; running the entrypoint"
            );
            Choice::Classified {
                name: compiled.version.entrypoint.clone(),
                credits: cost.billed.0,
            }
        }
    })
}

/// The classifier's call belongs to the run's tree: same root, the run as parent.
fn link_to_parent(record: &mut RunRecord, parent: &str) {
    record.root_id = parent.to_string();
    record.parent_id = Some(parent.to_string());
    record.depth = 1;
    record.agent_role = Some("classifier".to_string());
    record.created_at = Timestamp::now();
}

#[utoipa::path(get, path = "/api/v1/runs/{runId}", tag = "runs",
    params(("runId" = String, Path, description = "Run (request) id")),
    responses(
        (status = 200, description = "The run as logged", body = Object),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
    ))]
pub async fn get_run(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(run): PathParam,
) -> ApiResult<axum::Json<RunRecord>> {
    Ok(axum::Json(
        state.store.get_run(&principal.tenant, &run).await?,
    ))
}

/// A live events stream: envelopes as the run emits them, then `[DONE]`.
fn live_events(
    receiver: mpsc::UnboundedReceiver<Value>,
) -> impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>> + Send
{
    use axum::response::sse::Event;
    let envelopes = futures::stream::unfold(receiver, |mut receiver| async move {
        let envelope = receiver.recv().await?;
        let id = envelope
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Some((
            Ok(Event::default().id(id).data(envelope.to_string())),
            receiver,
        ))
    });
    let done = futures::stream::once(async {
        Ok(Event::default()
            .id(uuid::Uuid::now_v7().to_string())
            .data("[DONE]"))
    });
    futures::StreamExt::chain(envelopes, done)
}

/// Asks a running run to stop (SPEC.md "Run"): it and every sub-agent stop at their next step;
/// a model call in flight finishes first and what was produced is kept and billed. The request
/// is stored, so the instance running the run sees it wherever it was made.
#[utoipa::path(post, path = "/api/v1/runs/{runId}/cancel", tag = "runs",
    params(("runId" = String, Path, description = "Run (request) id")),
    responses(
        (status = 202, description = "Cancel requested; the run as logged so far", body = Object),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
        (status = 409, description = "The run has already finished", body = ErrorResponse),
    ))]
pub async fn cancel_run(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(run): PathParam,
) -> ApiResult<(axum::http::StatusCode, axum::Json<RunRecord>)> {
    let record = state
        .store
        .request_cancel(&principal.tenant, &run, &principal.actor())
        .await?;
    Ok((axum::http::StatusCode::ACCEPTED, axum::Json(record)))
}
