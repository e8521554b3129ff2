//! `POST /api/v1/chat/completions`: the OpenAI-compatible endpoint, synchronous and streamed
//! (chunks format, DESIGN.md "Streams").

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use baton_domain::chat::{InferenceRequest, InferenceResponse, ResponseAccumulator};
use baton_domain::customer::validate_external_id;
use baton_domain::run::{COMPATIBLE_ENVIRONMENT, RunKind};
use baton_domain::tags::parse_tag_header;
use baton_providers::DeltaStream;
use baton_providers::routing::{ModelSelection, Named};
use baton_providers::structured::OutputSchema;
use futures::{Stream, StreamExt};
use serde_json::Value;

use baton_executor::ExecutorError;
use baton_executor::stream::{Deadline, past, structured_output_problem};

use crate::auth::Principal;
use crate::cache::CacheFill;
use crate::compat::request::{ChatCompletionRequest, parse};
use crate::compat::response::{ChatCompletion, ChunkWriter, completion};
use crate::context::RequestId;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::events::{
    CallInfo, EventLog, record_call_end, record_call_outcome, record_call_started,
};
use crate::extract::Json;
use crate::gateway::{answer, open_stream, opening, plan_call};
use crate::routes::chat_events::{self, EventOptions, EventStream, event_stream};
use crate::runlog::{Pricing, RunLog, finish_answered_call};
use crate::sse::{self, SseWriter};
use crate::state::AppState;
use crate::streams::holding;
use baton_executor::budgets::estimate_credits;
use baton_executor::capture;
use tracing::Instrument;

/// The callback origin a request names (`X-Baton-Callback-Url`, or the deprecated
/// `X-Baton-Debug-Url`), recorded with its run; the deprecated header also tags the run
/// `DebugUrl:<origin>` (SPEC.md "Custom request headers", on every endpoint), added to `tags`.
pub(crate) fn callback_origin(
    headers: &HeaderMap,
    tags: &mut Vec<String>,
) -> ApiResult<Option<String>> {
    use crate::toolrun::{Callback, CallbackHeaders};
    let callback = Callback::from_headers(headers)?;
    if let Some(origin) = &callback.debug_origin {
        tags.push(format!("DebugUrl:{origin}"));
    }
    Ok(callback.origin())
}

pub(crate) fn header_tags(headers: &HeaderMap) -> ApiResult<Vec<String>> {
    match headers.get("x-baton-tags") {
        None => Ok(Vec::new()),
        Some(value) => {
            let text = value.to_str().map_err(|_| {
                ApiError::validation("X-Baton-Tags", "X-Baton-Tags must be ASCII text")
            })?;
            Ok(parse_tag_header(text)?)
        }
    }
}

fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

#[utoipa::path(post, path = "/api/v1/chat/completions", tag = "chat", request_body = ChatCompletionRequest,
    params(
        ("X-Baton-Customer-Id" = Option<String>, Header, description = "End customer to attribute usage to"),
        ("X-Baton-Tags" = Option<String>, Header, description = "Comma-separated Key:value tags, at most 20"),
    ),
    responses(
        (status = 200, description = "A chat.completion, or with stream=true an SSE stream of chat.completion.chunk objects ending in [DONE]", body = ChatCompletion),
        (status = 400, description = "Invalid request", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "Unknown provider or model", body = ErrorResponse),
        (status = 413, description = "The body is larger than the configured limit", body = ErrorResponse),
        (status = 429, description = "Rate limited, or too many open streams (stream=true); see Retry-After", body = ErrorResponse),
        (status = 502, description = "The provider failed", body = ErrorResponse),
        (status = 504, description = "The provider timed out", body = ErrorResponse),
    ))]
pub async fn chat_completions(
    State(state): State<AppState>,
    principal: Principal,
    axum::Extension(request_id): axum::Extension<RequestId>,
    headers: HeaderMap,
    Json(body): Json<ChatCompletionRequest>,
) -> ApiResult<Response> {
    let served = match capture_level(body.x_log_level.as_deref(), false)? {
        Some(level) => {
            let span = capture::capture_span(&request_id.0, level);
            serve_chat(state, principal, request_id, headers, body)
                .instrument(span)
                .await
        }
        None => serve_chat(state, principal, request_id, headers, body).await,
    };
    // OpenAI's format carries vendor tools in `tools`: a refusal of one names that field.
    served.map_err(|error| {
        error.provider_field(|field| {
            Some(match field {
                "vendor_tools" => "tools".to_string(),
                other => other.to_string(),
            })
        })
    })
}

/// The level a request asked its log lines to be kept at (`x_log_level`, or debug for
/// `is_debug`), for `/llm-logs/{id}/log-entries`.
pub(crate) fn capture_level(
    x_log_level: Option<&str>,
    is_debug: bool,
) -> ApiResult<Option<tracing::Level>> {
    match x_log_level.map(str::trim).filter(|l| !l.is_empty()) {
        Some(raw) => capture::parse_level(raw).map(Some).ok_or_else(|| {
            ApiError::validation(
                "x_log_level",
                format!(
                    "unknown x_log_level '{raw}': use Trace, Debug, Information, Warning, Error or Critical"
                ),
            )
        }),
        None => Ok(is_debug.then_some(tracing::Level::DEBUG)),
    }
}

async fn serve_chat(
    state: AppState,
    principal: Principal,
    request_id: RequestId,
    headers: HeaderMap,
    body: ChatCompletionRequest,
) -> ApiResult<Response> {
    let mut tags = header_tags(&headers)?;
    let origin = callback_origin(&headers, &mut tags)?;
    state
        .config
        .limits
        .check_messages(body.messages.len())
        .map_err(|message| ApiError::validation("messages", message))?;
    let parsed = parse(body)?;
    let customer = customer_of(&headers, parsed.customer.as_deref(), parsed.customer_param)?;
    let settings = state.tenant_settings(&principal.tenant).await?;
    // Taken before anything runs: a refused stream calls and records nothing.
    let slot = parsed
        .stream
        .then(|| state.streams.acquire(&principal.tenant))
        .transpose()?;
    let event_options = (parsed.stream && chat_events::wants_events(&parsed.stream_options)?)
        .then(|| EventOptions::parse(&parsed.stream_options))
        .transpose()?;
    let mut inference: InferenceRequest = parsed.inference;
    let schema = OutputSchema::of(&inference)
        .map_err(|e| ApiError::validation("response_format.json_schema.schema", e))?;
    let selection = ModelSelection {
        configured: Some(Named {
            name: &parsed.model,
            param: "model",
        }),
        ..ModelSelection::default()
    };
    let plan = plan_call(
        &state.engine,
        &principal.tenant,
        &settings,
        selection,
        &inference,
        parsed.nonce.as_deref(),
        parsed.timeouts,
    )
    .await?;
    let pricing = Pricing::new(state.providers.catalogue().clone(), &settings);
    let holds = state
        .engine
        .admit(
            &principal.tenant,
            customer.as_deref(),
            &tags,
            estimate_credits(&pricing, &plan, &inference),
        )
        .await?;

    let mut log = RunLog::start(
        state.engine.runs().clone(),
        pricing.clone(),
        request_id.0.clone(),
        principal.tenant.clone(),
        RunKind::Chat,
        parsed.model.clone(),
    );
    holds.attach(log.record_mut());
    if let Some(record) = log.record_mut() {
        record.environment = Some(COMPATIBLE_ENVIRONMENT.to_string());
        record.tags = tags;
        record.customer_external_id = customer;
        record.callback_origin = origin;
    }
    log.set_request(&inference);
    log.queue_pending_if_holding().await;
    let created = now_secs();
    let mut call = CallInfo::for_chain(
        &plan.chain,
        parsed.model.clone(),
        inference.messages.len(),
        inference.tools.len(),
    );
    // The events format emits as it goes; the other formats keep the lifecycle for the log.
    let mut events = state.engine.event_log(request_id.0.clone());
    if event_options.is_none() {
        record_call_started(&mut events, &call);
    }

    if !parsed.stream {
        let answer = match answer(
            &state.engine,
            &principal.tenant,
            &plan,
            &mut inference,
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
        let credits = pricing
            .cost_of_answer(
                &call.provider_key,
                response.model_or(&call.model),
                &call.model,
                &response,
            )
            .billed;
        let served = format!("{}/{}", call.provider_key, response.model_or(&call.model));
        let mut reply =
            axum::Json(completion(&request_id.0, created, served, &response)).into_response();
        mark_fallback(&mut reply, answer.fallback_used);
        // The log's part is not the client's wait. The run's budget holds stay until the
        // writer commits it, so a later request still sees this one's spend.
        finish_answered_call(log, events, call, response, credits).await;
        return Ok(reply);
    }

    let limits = state.config.limits;
    let Some(slot) = slot else {
        return Err(ApiError::Internal("a stream without a stream slot".into()));
    };
    // The events format starts at once and tells the provider call's outcome, failure included,
    // as events (DESIGN.md: stream errors are `error` events); a fallback is told by
    // `agentInferenceCompleted.wasFallback`, since the headers are gone by then.
    if let Some(options) = event_options {
        let opening = opening(
            state.engine.clone(),
            principal.tenant.clone(),
            plan,
            inference,
        );
        let stream = EventStream::new(opening, events, options, log, pricing, call, schema)
            .with_deadline(
                limits.max_stream_duration,
                limits.stream_duration_exceeded(),
            );
        return Ok(sse::response(holding(slot, event_stream(stream))));
    }

    // Errors before the first byte are ordinary error responses; later ones are error chunks.
    let answer = match open_stream(
        &state.engine,
        &principal.tenant,
        &plan,
        &mut inference,
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
    let fill = answer.cache_fill(&state.engine, &plan);
    let upstream = answer.value;
    let writer = ChunkWriter::new(
        request_id.0.clone(),
        created,
        format!("{}/{}", call.provider_key, call.model),
    );
    let state = ChunkStream {
        upstream,
        events,
        pricing,
        writer,
        accumulator: ResponseAccumulator::new(call.model.clone()),
        include_usage: inference.stream_usage,
        request_id: request_id.0,
        sse: SseWriter::new(),
        phase: Phase::Start,
        log: Some(log),
        fill,
        schema,
        call,
        deadline: Deadline::after(
            limits.max_stream_duration,
            limits.stream_duration_exceeded(),
        ),
    };
    let mut reply = sse::response(holding(slot, chunk_events(state)));
    mark_fallback(&mut reply, answer.fallback_used);
    Ok(reply)
}

/// `X-Baton-Fallback-Used: true` when a model other than the first planned one answered.
fn mark_fallback(response: &mut Response, fallback_used: bool) {
    if fallback_used {
        response.headers_mut().insert(
            "x-baton-fallback-used",
            axum::http::HeaderValue::from_static("true"),
        );
    }
}

/// Customer attribution: `X-Baton-Customer-Id`, else body `customerId`, else `user`.
/// The customer of a request: the header, else the body's field (named `param` in errors).
pub(crate) fn customer_of(
    headers: &HeaderMap,
    body: Option<&str>,
    param: &str,
) -> ApiResult<Option<String>> {
    let header = match headers.get("x-baton-customer-id") {
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::validation(
                "X-Baton-Customer-Id",
                "X-Baton-Customer-Id must be ASCII text",
            )
        })?),
        None => None,
    };
    match header {
        Some(id) => Ok(Some(validate_external_id(id, "X-Baton-Customer-Id")?)),
        None => body
            .map(|id| validate_external_id(id, param))
            .transpose()
            .map_err(Into::into),
    }
}

trait ServedModel {
    fn model_or<'a>(&'a self, fallback: &'a str) -> &'a str;
}

impl ServedModel for baton_domain::chat::InferenceResponse {
    fn model_or<'a>(&'a self, fallback: &'a str) -> &'a str {
        if self.model.is_empty() {
            fallback
        } else {
            &self.model
        }
    }
}

enum Phase {
    Start,
    /// The role chunk is out; the upstream's first item, read before it, comes next.
    First(Option<Result<baton_domain::chat::StreamDelta, ExecutorError>>),
    Relay,
    Done,
}

struct ChunkStream {
    upstream: DeltaStream,
    /// Lifecycle events kept for the log (the chunks format does not stream them).
    events: EventLog,
    /// The call as served (provider and model that answered).
    call: CallInfo,
    pricing: Pricing,
    writer: ChunkWriter,
    accumulator: ResponseAccumulator,
    include_usage: bool,
    request_id: String,
    /// Where the next frame's events are written (and numbered).
    sse: SseWriter,
    phase: Phase,
    /// Taken when the stream ends; still here on drop means the client went away.
    log: Option<RunLog>,
    /// Where a complete answer is cached.
    fill: Option<CacheFill>,
    /// The requested response schema, checked when the stream ends.
    schema: Option<OutputSchema>,
    /// Past it the stream ends with an error chunk (`limits.max_stream_duration`).
    deadline: Deadline,
}

impl ChunkStream {
    fn partial(&self) -> InferenceResponse {
        self.accumulator.snapshot()
    }

    /// Finishes the run as failed with `code` on what it produced, `partial`, and ends its stored
    /// lifecycle with the usage it is billed (an estimate when the provider reported none).
    fn fail(
        &mut self,
        log: &mut RunLog,
        mut partial: InferenceResponse,
        code: &str,
        message: &str,
    ) {
        partial.usage = log.finish_partial(
            &self.call.provider_key,
            &self.call.model,
            &partial,
            self.accumulator.is_finished(),
            code,
            message,
        );
        self.close_events(log, &partial, Some((code, message)));
    }

    /// Ends the stored lifecycle with `partial` (its usage as billed) and hands it to the log
    /// (an answer's as its compact lifecycle). `failure`: the code and message it ended with,
    /// if it did not end well.
    fn close_events(
        &mut self,
        log: &mut RunLog,
        partial: &InferenceResponse,
        failure: Option<(&str, &str)>,
    ) {
        let credits = self
            .pricing
            .cost(
                &self.call.provider_key,
                &self.call.model,
                &self.call.model,
                &partial.usage,
            )
            .billed;
        let finished = self.accumulator.is_finished();
        if failure.is_none()
            && let Some(lifecycle) = self
                .events
                .answered_call_lifecycle(&self.call, partial, credits, finished)
        {
            log.keep_lifecycle(lifecycle);
            return;
        }
        record_call_end(
            &mut self.events,
            &self.call,
            partial,
            credits,
            finished,
            failure,
        );
        log.attach_events(self.events.take_stored());
    }
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        if let Some(mut log) = self.log.take() {
            // The client disconnected mid-stream: dropping `upstream` cancels the provider call;
            // what was produced so far is still logged and billed, and its lifecycle stored.
            let partial = self.partial();
            let (code, message) = log.cut_short("the client closed the stream");
            self.fail(&mut log, partial, code, message);
            log.flush_in_background();
        }
    }
}

/// The next upstream delta, or the stream's expiry once its deadline passes.
async fn next_or_expired(
    state: &mut ChunkStream,
) -> Option<Result<baton_domain::chat::StreamDelta, ExecutorError>> {
    tokio::select! {
        item = state.upstream.next() => item.map(|item| item.map_err(ExecutorError::from)),
        error = past(Some(&mut state.deadline)) => Some(Err(error)),
    }
}

/// Relays upstream deltas as chunks: role chunk, content chunks, final usage chunk, `[DONE]`.
/// Each item is a body frame holding the events written by one step (never empty). The state
/// is boxed: `unfold` moves it out of the step's future and into the next one for every item,
/// which for the whole struct was a `memcpy` of ~1 KB twice a chunk.
fn chunk_events(state: ChunkStream) -> impl Stream<Item = Bytes> + Send {
    futures::stream::unfold(Box::new(state), |mut state| async move {
        while state.sse.is_empty() {
            relay_step(&mut state).await?;
        }
        Some((state.sse.take(), state))
    })
}

/// Writes the events of one step of the relay; `None` once the stream is over.
async fn relay_step(state: &mut ChunkStream) -> Option<()> {
    let item = match std::mem::replace(&mut state.phase, Phase::Relay) {
        Phase::Start => {
            // Providers name the model they serve in their first event: the chunks carry that
            // name, as a synchronous answer's `model` does (a dated name, say).
            let first = next_or_expired(state).await;
            if let Some(Ok(baton_domain::chat::StreamDelta::Model(model))) = &first {
                state.writer = state
                    .writer
                    .serving(format!("{}/{model}", state.call.provider_key));
            }
            let writer = &state.writer;
            state.sse.json_from(|out| writer.write_role(out));
            state.phase = Phase::First(first);
            return Some(());
        }
        Phase::First(first) => first,
        Phase::Relay => next_or_expired(state).await,
        Phase::Done => {
            state.phase = Phase::Done;
            return None;
        }
    };
    match item {
        Some(Ok(delta)) => {
            state.accumulator.push(&delta);
            let writer = &state.writer;
            state.sse.json_from(|out| writer.write_delta(&delta, out));
        }
        Some(Err(error)) => {
            let body = error_chunk(&error, &state.request_id);
            state.sse.json(&body);
            state.sse.done();
            state.phase = Phase::Done;
            if let Some(mut log) = state.log.take() {
                let partial = state.partial();
                state.fail(&mut log, partial, error.code(), &error.to_string());
                log.flush().await;
            }
        }
        None => {
            let mut response = state.partial();
            // An answer its provider reported no usage for is billed an estimate, and the usage
            // chunk says so.
            if let Some(log) = state.log.as_mut() {
                log.estimate_unreported(&mut response);
            }
            // A refusal is the model's final word, not an answer that failed the schema.
            let invalid = structured_output_problem(state.schema.as_ref(), &response)
                .filter(|_| response.refusal.is_none());
            if let Some(error) = &invalid {
                let body = error_chunk(error, &state.request_id);
                state.sse.json(&body);
            }
            if state.include_usage {
                let usage = state.writer.usage(&response.usage);
                state.sse.json(&usage);
            }
            state.sse.done();
            state.phase = Phase::Done;
            if let Some(mut log) = state.log.take() {
                match invalid {
                    None => {
                        state.close_events(&mut log, &response, None);
                        log.succeed(&state.call.provider_key, &state.call.model, &response)
                            .await;
                        if let Some(fill) = state.fill.take() {
                            fill.fill(response).await;
                        }
                    }
                    Some(error) => {
                        state.fail(&mut log, response, error.code(), &error.to_string());
                        log.flush().await;
                    }
                }
            }
        }
    }
    Some(())
}

/// The DESIGN.md error body, sent as the last chunk of a stream that failed after its first byte.
fn error_chunk(error: &ExecutorError, request_id: &str) -> Value {
    serde_json::json!({"error": {
        "code": error.code(), "message": error.to_string(), "type": "api_error",
        "param": Value::Null, "requestId": request_id,
    }})
}
