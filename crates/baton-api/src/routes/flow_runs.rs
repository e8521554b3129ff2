//! `POST /api/v1/flows/{flowId}/runs` (SPEC.md "Flow execution"): the body and headers parsed
//! into a `baton_executor::FlowRunRequest`, run by the engine, and the DESIGN.md flow run
//! response (or, for `stream: true`, the events as SSE). `GET /api/v1/runs/{runId}` and
//! `POST /api/v1/runs/{runId}/cancel`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use baton_domain::chat::{Citation, VendorTool};
use baton_domain::run::{RunRecord, RunWarning, ToolCallRecord};
use baton_domain::tags::{merge_tags, validate_tags};
use baton_executor::{FlowRunOutcome, FlowRunRequest};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::context::RequestId;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, NoBody, PathParam};
use crate::gateway::RequestTimeouts;
use crate::routes::chat::{capture_level, customer_of, header_tags};
use crate::routes::chat_events::{EventOptions, sse_envelopes};
use crate::sse;
use crate::state::AppState;
use crate::streams::holding;
use crate::toolrun::{Callback, CallbackHeaders};
use tracing::Instrument;

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
    #[schema(minimum = 1, maximum = 100)]
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
    /// Why the model declined to answer (OpenAI's `refusal`), when it did; `text` is empty then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
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

impl From<FlowRunOutcome> for FlowRunResponse {
    fn from(outcome: FlowRunOutcome) -> Self {
        let credits = baton_domain::credits::Credits;
        let response = outcome.response;
        FlowRunResponse {
            id: outcome.id,
            flow_id: outcome.flow_id,
            flow_name: outcome.flow_name,
            version_id: outcome.version_id,
            environment: outcome.environment,
            template_name: outcome.template_name,
            status: "Succeeded",
            finish_reason: response.finish_reason.as_openai(),
            model: outcome.model,
            served_model: outcome.served_model,
            fallback_used: outcome.fallback_used,
            usage: RunUsage {
                tokens_in: response.usage.tokens_in,
                tokens_out: response.usage.tokens_out,
                reasoning_tokens: response.usage.reasoning_tokens,
                cost_credits: outcome.cost_credits,
                cost_usd: credits(outcome.cost_credits).to_usd(),
                total_credits_used: outcome.total_credits_used,
                total_cost_usd: credits(outcome.total_credits_used).to_usd(),
            },
            output: RunOutput {
                text: response.text,
                json: outcome.json,
                citations: response.citations,
                refusal: response.refusal,
            },
            tool_calls: outcome.tool_calls,
            warnings: outcome.warnings,
            duration_ms: outcome.duration_ms,
        }
    }
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
        (status = 413, description = "The body is larger than the configured limit", body = ErrorResponse),
        (status = 429, description = "Rate limited, or too many open streams (stream=true); see Retry-After", body = ErrorResponse),
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
    let tags = merge_tags(validate_tags(body.tags, "tags")?, header_tags(&headers)?)?;
    let callback = Callback::from_headers(&headers)?;
    let customer = customer_of(&headers, body.customer_id.as_deref(), "customerId")?;
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
        .map(EventOptions::parse_for_run)
        .transpose()?;
    let request = FlowRunRequest {
        parameters: body.parameters,
        environment: body.environment,
        customer,
        tags,
        response_schema: body.response_schema,
        vendor_tools,
        override_model: body.override_model,
        stream_options,
        is_debug: body.is_debug,
        timeouts,
        max_agent_depth: body.max_agent_depth,
        max_cost_per_request_credits: body.max_cost_per_request_credits,
        callback,
        ..FlowRunRequest::new(principal.tenant.clone(), request_id.0, flow_ref)
    };
    // Debug runs keep their internal log lines (`/llm-logs/{id}/log-entries`).
    let span = match capture_level(None, request.is_debug)? {
        Some(level) => baton_executor::capture::capture_span(&request.run_id, level),
        None => tracing::Span::none(),
    };
    // A provider's refusal names `vendorTools` when the body asked for vendor tools; what the
    // flow's own template asked for is no field of this body.
    let asked_vendor_tools = !request.vendor_tools.is_empty();
    let field = |error: baton_executor::ExecutorError| {
        ApiError::from(error).provider_field(|field| {
            (field == "vendor_tools" && asked_vendor_tools).then(|| "vendorTools".to_string())
        })
    };
    if body.stream {
        // Taken before the run starts: a refused stream runs and records nothing.
        let slot = state.streams.acquire(&principal.tenant)?;
        let envelopes = state
            .engine
            .run_flow_stream(request)
            .instrument(span)
            .await
            .map_err(field)?;
        return Ok(sse::response(holding(slot, sse_envelopes(envelopes))));
    }
    let outcome = state
        .engine
        .run_flow(request)
        .instrument(span)
        .await
        .map_err(field)?;
    Ok(axum::Json(FlowRunResponse::from(outcome)).into_response())
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
    Ok(axum::Json(find_run(&state, &principal.tenant, &run).await?))
}

/// Longest a read of a missing run waits for the log writer to write what it holds.
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A run by id. Runs are written in batches, so one answered a moment ago may still be queued
/// (for up to `invocation_log.batch_max_delay_ms`): a miss has the writer write what it holds
/// now, then looks once more, so a client reading back the run it was just given finds it.
pub(crate) async fn find_run(
    state: &AppState,
    tenant: &baton_domain::TenantId,
    id: &str,
) -> ApiResult<RunRecord> {
    match state.store.get_run(tenant, id).await {
        Err(baton_store::StoreError::NotFound { .. }) => {
            flush_log(state).await;
            Ok(state.store.get_run(tenant, id).await?)
        }
        found => Ok(found?),
    }
}

/// Has the log writer write what it holds now (bounded by [`FLUSH_WAIT`]).
pub(crate) async fn flush_log(state: &AppState) {
    let _ = tokio::time::timeout(FLUSH_WAIT, state.engine.runs().flush()).await;
}

/// Before reading what a run stored (its events, hierarchy, log lines): a run not found yet
/// may be waiting in the writer's batch, which is written first (as [`find_run`] does).
pub(crate) async fn written(
    state: &AppState,
    tenant: &baton_domain::TenantId,
    id: &str,
) -> ApiResult<()> {
    if let Err(baton_store::StoreError::NotFound { .. }) = state.store.run_summary(tenant, id).await
    {
        flush_log(state).await;
    }
    Ok(())
}

/// Asks a running run to stop (SPEC.md "Run"): it and every sub-agent stop at their next step;
/// a model call in flight finishes first and what was produced is kept and billed. The request
/// is stored, so the instance running the run sees it wherever it was made.
#[utoipa::path(post, path = "/api/v1/runs/{runId}/cancel", tag = "runs",
    params(("runId" = String, Path, description = "Run (request) id")),
    responses(
        (status = 400, description = "A body other than none, {} or null (the operation takes none)", body = ErrorResponse),
        (status = 202, description = "Cancel requested; the run as logged so far", body = Object),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
        (status = 409, description = "The run has already finished", body = ErrorResponse),
    ))]
pub async fn cancel_run(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(run): PathParam,
    _: NoBody,
) -> ApiResult<(axum::http::StatusCode, axum::Json<RunRecord>)> {
    let record = cancel(&state, &principal, &run).await?;
    Ok((axum::http::StatusCode::ACCEPTED, axum::Json(record)))
}

/// Records a cancel request for `run`; a run started a moment ago whose row is still queued in
/// the log writer is written first (as [`find_run`] does).
pub(crate) async fn cancel(
    state: &AppState,
    principal: &Principal,
    run: &str,
) -> ApiResult<RunRecord> {
    let actor = principal.actor();
    let record = match state
        .store
        .request_cancel(&principal.tenant, run, &actor)
        .await
    {
        Err(baton_store::StoreError::NotFound { .. }) => {
            flush_log(state).await;
            state
                .store
                .request_cancel(&principal.tenant, run, &actor)
                .await?
        }
        requested => requested?,
    };
    state.engine.note_cancel_request();
    Ok(record)
}
