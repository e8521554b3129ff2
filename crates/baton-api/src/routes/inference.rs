//! `POST /api/v1/inference`: one model call in Baton's own format (snake_case fields, as the
//! spec names them), without the compatible wrapping.

use axum::extract::State;
use axum::http::HeaderMap;
use baton_domain::chat::{Citation, InferenceRequest, ResponseFormat, ToolCall, VendorTool};
use baton_domain::run::RunKind;
use baton_domain::tags::{merge_tags, validate_tags};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use baton_providers::routing::{ModelSelection, Named};
use baton_providers::structured::OutputSchema;

use crate::auth::Principal;
use crate::compat::request::{WireMessage, message};
use crate::context::RequestId;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::events::{CallInfo, record_call_outcome, record_call_started};
use crate::extract::Json;
use crate::gateway::{RequestTimeouts, answer, plan_call};
use crate::routes::chat::{callback_origin, capture_level, customer_of, header_tags};
use crate::runlog::{Pricing, RunLog, finish_answered_call};
use crate::state::AppState;
use baton_executor::budgets::estimate_credits;
use tracing::Instrument;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferenceBody {
    /// Chat messages: `role` and `content` (a string or an array of text / image_url parts).
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<WireMessage>,
    /// `<provider>/<model-name>` or a routing alias.
    pub model: String,
    /// Used only for logging and analytics.
    #[serde(default)]
    pub environment: Option<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub seed: Option<i64>,
    /// Extended-thinking budget for reasoning models.
    #[serde(default)]
    pub max_thinking_tokens: Option<u32>,
    /// JSON Schema the answer must follow.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_schema: Option<Value>,
    /// Provider-native tools: `web_search`, `code_interpreter`, `web_search_20250305`.
    #[serde(default)]
    pub vendor_tools: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub is_debug: bool,
    #[serde(default, rename = "customerId")]
    pub customer_id: Option<String>,
    /// Cache-bust string: part of the response-cache key, never sent to providers.
    #[serde(default)]
    pub nonce: Option<String>,
    /// Per model attempt time limits; override the tenant's settings.
    #[serde(default)]
    pub timeouts: Option<RequestTimeouts>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct InferenceUsage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub reasoning_tokens: u64,
    pub cached_tokens: u64,
    pub cost_credits: i64,
    pub cost_usd: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct InferenceResult {
    /// The request id (also `X-Request-Id`).
    pub id: String,
    pub model: String,
    /// `<provider>/<model>` that answered.
    pub served_model: String,
    pub fallback_used: bool,
    /// Served from the response cache (no provider call, no cost).
    pub was_cached: bool,
    pub text: String,
    /// The answer parsed as JSON, when a `response_schema` was given.
    #[schema(value_type = Option<Object>)]
    pub json: Option<Value>,
    #[schema(value_type = Vec<Object>)]
    pub tool_calls: Vec<ToolCall>,
    #[schema(value_type = Vec<Object>)]
    pub citations: Vec<Citation>,
    /// Why the model declined to answer (OpenAI's `refusal`), when it did; `text` is empty then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    pub finish_reason: &'static str,
    pub usage: InferenceUsage,
}

fn range(param: &str, value: Option<f64>, low: f64, high: f64) -> ApiResult<()> {
    match value {
        Some(v) if !(low..=high).contains(&v) => Err(ApiError::validation(
            param,
            format!("{param} must be between {low} and {high}"),
        )),
        _ => Ok(()),
    }
}

#[utoipa::path(post, path = "/api/v1/inference", tag = "chat", request_body = InferenceBody,
    params(
        ("X-Baton-Customer-Id" = Option<String>, Header, description = "End customer to attribute usage to"),
        ("X-Baton-Tags" = Option<String>, Header, description = "Comma-separated Key:value tags, merged with body tags"),
    ),
    responses(
        (status = 200, description = "The model's answer with usage and cost", body = InferenceResult),
        (status = 400, description = "Invalid request", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "Unknown provider or model", body = ErrorResponse),
        (status = 502, description = "The provider failed", body = ErrorResponse),
        (status = 504, description = "The provider timed out", body = ErrorResponse),
    ))]
pub async fn inference(
    State(state): State<AppState>,
    principal: Principal,
    axum::Extension(request_id): axum::Extension<RequestId>,
    headers: HeaderMap,
    Json(body): Json<InferenceBody>,
) -> ApiResult<axum::Json<InferenceResult>> {
    match capture_level(None, body.is_debug)? {
        Some(level) => {
            let span = baton_executor::capture::capture_span(&request_id.0, level);
            serve_inference(state, principal, request_id, headers, body)
                .instrument(span)
                .await
        }
        None => serve_inference(state, principal, request_id, headers, body).await,
    }
}

async fn serve_inference(
    state: AppState,
    principal: Principal,
    request_id: RequestId,
    headers: HeaderMap,
    body: InferenceBody,
) -> ApiResult<axum::Json<InferenceResult>> {
    let mut tags = merge_tags(validate_tags(body.tags, "tags")?, header_tags(&headers)?)?;
    let origin = callback_origin(&headers, &mut tags)?;
    let customer = customer_of(&headers, body.customer_id.as_deref(), "customerId")?;
    range("temperature", body.temperature, 0.0, 2.0)?;
    range("top_p", body.top_p, 0.0, 1.0)?;
    if body.max_tokens == Some(0) {
        return Err(ApiError::validation(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    if body.messages.is_empty() {
        return Err(ApiError::validation(
            "messages",
            "messages must contain at least one message",
        ));
    }
    state
        .config
        .limits
        .check_messages(body.messages.len())
        .map_err(|message| ApiError::validation("messages", message))?;
    let messages = body
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(m, i))
        .collect::<Result<Vec<_>, _>>()?;
    let vendor_tools = body
        .vendor_tools
        .iter()
        .enumerate()
        .map(|(i, name)| VendorTool::parse(name, &format!("vendor_tools[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = match &body.response_schema {
        None => None,
        Some(schema) if schema.is_object() => Some(
            OutputSchema::compile(schema)
                .map_err(|e| ApiError::validation("response_schema", e))?,
        ),
        Some(_) => {
            return Err(ApiError::validation(
                "response_schema",
                "response_schema must be a JSON Schema object",
            ));
        }
    };
    let response_format = body
        .response_schema
        .filter(|_| schema.is_some())
        .map(|schema| ResponseFormat::JsonSchema {
            name: "response".into(),
            schema,
            strict: None,
        });
    let settings = state.tenant_settings(&principal.tenant).await?;
    let mut request = InferenceRequest {
        messages,
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        max_tokens: body.max_tokens,
        seed: body.seed,
        response_format,
        thinking_budget: body.max_thinking_tokens,
        vendor_tools,
        ..InferenceRequest::default()
    };
    let selection = ModelSelection {
        configured: Some(Named {
            name: &body.model,
            param: "model",
        }),
        ..ModelSelection::default()
    };
    let timeouts = body.timeouts.unwrap_or_default().validated("timeouts")?;
    let plan = plan_call(
        &state.engine,
        &principal.tenant,
        &settings,
        selection,
        &request,
        body.nonce.as_deref(),
        timeouts,
    )
    .await?;

    let pricing = Pricing::new(state.providers.catalogue().clone(), &settings);
    let holds = state
        .engine
        .admit(
            &principal.tenant,
            customer.as_deref(),
            &tags,
            estimate_credits(&pricing, &plan, &request),
        )
        .await?;
    let mut log = RunLog::start(
        state.engine.runs().clone(),
        pricing.clone(),
        request_id.0.clone(),
        principal.tenant.clone(),
        RunKind::Inference,
        body.model.clone(),
    );
    holds.attach(log.record_mut());
    if let Some(record) = log.record_mut() {
        record.environment = body.environment.filter(|e| !e.trim().is_empty());
        record.tags = tags;
        record.customer_external_id = customer;
        record.is_debug = body.is_debug;
        record.callback_origin = origin;
    }
    log.set_request(&request);
    log.queue_pending_if_holding().await;

    // The lifecycle is stored with the run, as for every request (DESIGN.md "Streams").
    let mut call = CallInfo::for_chain(
        &plan.chain,
        body.model.clone(),
        request.messages.len(),
        request.tools.len(),
    );
    let mut events = state.engine.event_log(request_id.0.clone());
    record_call_started(&mut events, &call);
    let answer = match answer(
        &state.engine,
        &principal.tenant,
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
            return Err(failure.log(log).await.into());
        }
    };
    call.served_by(&answer.model, answer.fallback_used, answer.cached);
    let pricing = answer.pricing(pricing);
    let response = answer.value;
    let (provider, model) = (&answer.model.provider, &answer.model.model);
    let served = if response.model.is_empty() {
        model.clone()
    } else {
        response.model.clone()
    };
    let cost = pricing.cost_of_answer(provider, &served, model, &response);
    // The log keeps its own copy of the answer: the reply takes the original's text and tool
    // calls.
    finish_answered_call(log, events, call, response.clone(), cost.billed).await;
    let json = if request.response_format.is_some() {
        serde_json::from_str(&response.text).ok()
    } else {
        None
    };
    Ok(axum::Json(InferenceResult {
        id: request_id.0,
        model: body.model,
        served_model: format!("{provider}/{served}"),
        fallback_used: answer.fallback_used,
        was_cached: answer.cached,
        json,
        citations: response.citations,
        refusal: response.refusal,
        finish_reason: response.finish_reason.as_openai(),
        usage: InferenceUsage {
            tokens_in: response.usage.tokens_in,
            tokens_out: response.usage.tokens_out,
            reasoning_tokens: response.usage.reasoning_tokens,
            cached_tokens: response.usage.cached_tokens,
            cost_credits: cost.billed.0,
            cost_usd: cost.billed.to_usd(),
        },
        text: response.text,
        tool_calls: response.tool_calls,
    }))
}
