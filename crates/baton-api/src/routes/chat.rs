//! `POST /api/v1/chat/completions`: the OpenAI-compatible endpoint, synchronous and streamed
//! (chunks format, DESIGN.md "Streams").

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use baton_domain::chat::{InferenceRequest, Usage};
use baton_domain::model::ModelRef;
use baton_domain::tags::parse_tag_header;
use baton_providers::{DeltaStream, Provider};
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::auth::Principal;
use crate::compat::request::{ChatCompletionRequest, parse};
use crate::compat::response::{ChatCompletion, ChunkWriter, completion};
use crate::context::RequestId;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::Json;
use crate::state::AppState;

/// A model resolved to the provider that serves it.
pub(crate) struct Target {
    pub provider: Arc<dyn Provider>,
    pub provider_key: String,
    pub model: String,
}

/// Resolves `<provider>/<model>` (or a bare provider key, meaning its default model).
pub(crate) fn resolve(state: &AppState, model: &str, param: &str) -> ApiResult<Target> {
    let reference = ModelRef::parse(model, param)?;
    let providers = &state.providers;
    if !providers.is_known(&reference.provider) {
        return Err(ApiError::Status {
            status: axum::http::StatusCode::NOT_FOUND,
            code: "MODEL_NOT_FOUND",
            message: format!(
                "unknown provider '{}' in model '{model}'",
                reference.provider
            ),
        });
    }
    let model = match reference.model {
        Some(model) => model,
        None => providers
            .catalogue()
            .default_model(&reference.provider)
            .map(str::to_string)
            .ok_or_else(|| {
                ApiError::validation(
                    param,
                    format!(
                        "provider '{}' has no default model: name one",
                        reference.provider
                    ),
                )
            })?,
    };
    let provider = providers.get(&reference.provider)?.clone();
    Ok(Target {
        provider,
        provider_key: reference.provider,
        model,
    })
}

fn header_tags(headers: &HeaderMap) -> ApiResult<Vec<String>> {
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
        (status = 502, description = "The provider failed", body = ErrorResponse),
        (status = 504, description = "The provider timed out", body = ErrorResponse),
    ))]
pub async fn chat_completions(
    State(state): State<AppState>,
    _principal: Principal,
    axum::Extension(request_id): axum::Extension<RequestId>,
    headers: HeaderMap,
    Json(body): Json<ChatCompletionRequest>,
) -> ApiResult<Response> {
    let _tags = header_tags(&headers)?;
    let parsed = parse(body)?;
    let target = resolve(&state, &parsed.model, "model")?;
    let mut inference: InferenceRequest = parsed.inference;
    inference.model = target.model.clone();
    let created = now_secs();

    if !parsed.stream {
        let response = target.provider.infer(&inference).await?;
        let served = format!(
            "{}/{}",
            target.provider_key,
            response.model_or(&target.model)
        );
        return Ok(
            axum::Json(completion(&request_id.0, created, served, &response)).into_response(),
        );
    }

    // Errors before the first byte are ordinary error responses; later ones are error chunks.
    let upstream = target.provider.infer_stream(&inference).await?;
    let writer = ChunkWriter::new(
        request_id.0.clone(),
        created,
        format!("{}/{}", target.provider_key, target.model),
    );
    let events = chunk_events(upstream, writer, inference.stream_usage, request_id.0);
    Ok(Sse::new(events).into_response())
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
    Relay,
    Done,
}

struct ChunkStream {
    upstream: DeltaStream,
    writer: ChunkWriter,
    usage: Usage,
    include_usage: bool,
    request_id: String,
    next_id: u64,
    phase: Phase,
}

impl ChunkStream {
    fn event(&mut self, data: &Value) -> Event {
        let id = self.next_id;
        self.next_id += 1;
        Event::default().id(id.to_string()).data(data.to_string())
    }

    fn done(&mut self) -> Event {
        let id = self.next_id;
        self.next_id += 1;
        Event::default().id(id.to_string()).data("[DONE]")
    }
}

/// Relays upstream deltas as chunks: role chunk, content chunks, final usage chunk, `[DONE]`.
fn chunk_events(
    upstream: DeltaStream,
    writer: ChunkWriter,
    include_usage: bool,
    request_id: String,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let state = ChunkStream {
        upstream,
        writer,
        usage: Usage::default(),
        include_usage,
        request_id,
        next_id: 0,
        phase: Phase::Start,
    };
    futures::stream::unfold(state, |mut state| async move {
        let mut batch = Vec::new();
        match state.phase {
            Phase::Start => {
                state.phase = Phase::Relay;
                let role = state.writer.role();
                batch.push(state.event(&role));
            }
            Phase::Relay => match state.upstream.next().await {
                Some(Ok(delta)) => {
                    if let baton_domain::chat::StreamDelta::Usage(usage) = &delta {
                        state.usage.merge(*usage);
                    }
                    if let Some(chunk) = state.writer.delta(&delta) {
                        batch.push(state.event(&chunk));
                    }
                }
                Some(Err(err)) => {
                    let error = ApiError::from(err);
                    let body = serde_json::json!({"error": {
                        "code": error.code(), "message": error.to_string(), "type": "api_error",
                        "param": Value::Null, "requestId": state.request_id,
                    }});
                    batch.push(state.event(&body));
                    batch.push(state.done());
                    state.phase = Phase::Done;
                }
                None => {
                    if state.include_usage {
                        let usage = state.writer.usage(&state.usage);
                        batch.push(state.event(&usage));
                    }
                    batch.push(state.done());
                    state.phase = Phase::Done;
                }
            },
            Phase::Done => return None,
        }
        Some((futures::stream::iter(batch.into_iter().map(Ok)), state))
    })
    .flatten()
}
