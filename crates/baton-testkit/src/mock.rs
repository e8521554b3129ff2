use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// One scripted answer. The same reply renders in each wire format.
#[derive(Debug, Clone)]
pub enum Reply {
    Answer {
        text: String,
        tool_calls: Vec<ToolCallReply>,
        tokens_in: u64,
        tokens_out: u64,
        /// Served model name; defaults to the requested one.
        model: Option<String>,
        /// Searches the provider ran itself (vendor `web_search`), and the sources it cited.
        /// Rendered by the Responses format; the other formats ignore them.
        web_searches: u64,
        citations: Vec<CitationReply>,
    },
    /// An HTTP error with the provider's error body.
    Status {
        status: u16,
        message: String,
        retry_after: Option<u64>,
    },
    /// Waits, then gives the inner reply (a timeout test's slow provider).
    Delayed(Duration, Box<Reply>),
    /// Streams the first part of the answer, then breaks the connection.
    BreakAfterFirstChunk(Box<Reply>),
    /// Streams the first part of the answer, then ends the body cleanly (no final event, no
    /// usage, no `[DONE]`): a truncated stream that no transport error announces.
    TruncatedStream(Box<Reply>),
    /// A 200 whose body is this text verbatim (malformed JSON, or an SSE body of garbage).
    Raw(String),
    /// A 307 to this URL (which keeps the method and body, were it followed).
    Redirect(String),
    /// The model declines: Chat Completions' `message.refusal` with content null (streamed as
    /// `delta.refusal`), finish reason `stop`. Formats without a refusal field send it as text.
    Refusal(String),
}

/// A source cited by a scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CitationReply {
    pub url: String,
    pub title: String,
}

#[derive(Debug, Clone)]
pub struct ToolCallReply {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

impl Reply {
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Answer {
            text: text.into(),
            tool_calls: Vec::new(),
            tokens_in: 10,
            tokens_out: 5,
            model: None,
            web_searches: 0,
            citations: Vec::new(),
        }
    }

    pub fn with_usage(self, tokens_in: u64, tokens_out: u64) -> Reply {
        match self {
            Reply::Answer {
                text,
                tool_calls,
                model,
                web_searches,
                citations,
                ..
            } => Reply::Answer {
                text,
                tool_calls,
                tokens_in,
                tokens_out,
                model,
                web_searches,
                citations,
            },
            other => other,
        }
    }

    /// The answer as served by `model` (a dated name, say) rather than the requested one.
    pub fn served_as(mut self, served: impl Into<String>) -> Reply {
        if let Reply::Answer { model, .. } = &mut self {
            *model = Some(served.into());
        }
        self
    }

    /// The answer as if the provider had searched the web `searches` times and cited
    /// `citations` (`(url, title)`), as OpenAI's hosted `web_search` tool reports it.
    pub fn with_web_search(self, searches: u64, citations: &[(&str, &str)]) -> Reply {
        match self {
            Reply::Answer {
                text,
                tool_calls,
                tokens_in,
                tokens_out,
                model,
                ..
            } => Reply::Answer {
                text,
                tool_calls,
                tokens_in,
                tokens_out,
                model,
                web_searches: searches,
                citations: citations
                    .iter()
                    .map(|(url, title)| CitationReply {
                        url: (*url).to_string(),
                        title: (*title).to_string(),
                    })
                    .collect(),
            },
            other => other,
        }
    }

    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Reply {
        Reply::Answer {
            text: String::new(),
            tool_calls: vec![ToolCallReply {
                id: "call_1".into(),
                name: name.into(),
                arguments,
            }],
            tokens_in: 10,
            tokens_out: 5,
            model: None,
            web_searches: 0,
            citations: Vec::new(),
        }
    }

    pub fn status(status: u16, message: impl Into<String>) -> Reply {
        Reply::Status {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// A 429 with `Retry-After: secs`.
    pub fn rate_limited(retry_after_secs: u64) -> Reply {
        Reply::Status {
            status: 429,
            message: "rate limited by the mock".into(),
            retry_after: Some(retry_after_secs),
        }
    }
}

/// A request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    received: Vec<Received>,
    /// Streams are cut into pieces of this many bytes (awkward boundaries on purpose).
    chunk_bytes: usize,
    chunk_gap: Duration,
}

#[derive(Clone)]
struct Shared(Arc<Mutex<Script>>);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        // A test that panicked while holding the lock already failed; keep serving.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The mock provider server. Dropping it does not stop the server; the test runtime does.
pub struct MockProvider {
    address: SocketAddr,
    shared: Shared,
    connections: Arc<AtomicUsize>,
}

impl MockProvider {
    pub async fn start() -> std::io::Result<MockProvider> {
        let shared = Shared(Arc::new(Mutex::new(Script {
            chunk_bytes: 7,
            ..Script::default()
        })));
        let router = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/chat/completions", post(openai))
            .route(
                "/openai/deployments/{deployment}/chat/completions",
                post(azure),
            )
            .route("/v1/responses", post(responses))
            .route("/openai/v1/responses", post(azure_responses))
            .route("/v1/messages", post(anthropic))
            .route("/v1beta/models/{call}", post(gemini))
            .route("/model/{model}/converse", post(bedrock))
            .route("/model/{model}/converse-stream", post(bedrock_stream))
            .with_state(shared.clone());
        let connections = Arc::new(AtomicUsize::new(0));
        let address = crate::serve::serve_loopback_counting(router, connections.clone()).await?;
        Ok(MockProvider {
            address,
            shared,
            connections,
        })
    }

    /// Base URL for OpenAI-style configuration (`.../v1`).
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Base URL without a path (Anthropic, Azure, Gemini, Bedrock conventions).
    pub fn root(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Queues replies, answered in order; with none queued the mock answers "mock reply".
    pub fn push(&self, reply: Reply) {
        self.shared.lock().replies.push_back(reply);
    }

    /// Drops the replies still queued (a request that ended early left them unused).
    pub fn clear(&self) {
        self.shared.lock().replies.clear();
    }

    /// TCP connections accepted so far (a client reusing keep-alive connections opens few).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().received.clone()
    }

    pub fn set_stream_chunking(&self, chunk_bytes: usize, gap: Duration) {
        let mut script = self.shared.lock();
        script.chunk_bytes = chunk_bytes.max(1);
        script.chunk_gap = gap;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenAi,
    Responses,
    Anthropic,
    Gemini,
    Bedrock,
}

/// How a request asks for a stream and names its model: in the body, or (Gemini, Bedrock) in
/// the path.
struct Call {
    format: Format,
    path: String,
    stream: Option<bool>,
    model: Option<String>,
}

fn in_body(format: Format, path: &str) -> Call {
    Call {
        format,
        path: path.to_string(),
        stream: None,
        model: None,
    }
}

async fn openai(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    handle(
        shared,
        in_body(Format::OpenAi, "/v1/chat/completions"),
        headers,
        body,
    )
    .await
}

async fn azure(
    State(shared): State<Shared>,
    Path(deployment): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = format!("/openai/deployments/{deployment}/chat/completions");
    handle(shared, in_body(Format::OpenAi, &path), headers, body).await
}

async fn responses(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    handle(
        shared,
        in_body(Format::Responses, "/v1/responses"),
        headers,
        body,
    )
    .await
}

/// Azure's v1 surface: the deployment is the body's `model`, not a path segment.
async fn azure_responses(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(
        shared,
        in_body(Format::Responses, "/openai/v1/responses"),
        headers,
        body,
    )
    .await
}

async fn anthropic(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    handle(
        shared,
        in_body(Format::Anthropic, "/v1/messages"),
        headers,
        body,
    )
    .await
}

/// `/v1beta/models/{model}:generateContent` and `:streamGenerateContent`.
async fn gemini(
    State(shared): State<Shared>,
    Path(call): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (model, action) = call
        .rsplit_once(':')
        .unwrap_or((call.as_str(), "generateContent"));
    let call = Call {
        format: Format::Gemini,
        path: format!("/v1beta/models/{call}"),
        stream: Some(action == "streamGenerateContent"),
        model: Some(model.to_string()),
    };
    handle(shared, call, headers, body).await
}

async fn bedrock(
    State(shared): State<Shared>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(shared, bedrock_call(model, false), headers, body).await
}

async fn bedrock_stream(
    State(shared): State<Shared>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(shared, bedrock_call(model, true), headers, body).await
}

/// Bedrock names the model and the streaming in the path (`/converse` or `/converse-stream`).
fn bedrock_call(model: String, stream: bool) -> Call {
    let action = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    Call {
        format: Format::Bedrock,
        path: format!("/model/{model}/{action}"),
        stream: Some(stream),
        model: Some(model),
    }
}

async fn handle(shared: Shared, call: Call, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let stream = call
        .stream
        .unwrap_or_else(|| body.get("stream").and_then(Value::as_bool).unwrap_or(false));
    let model = call.model.clone().unwrap_or_else(|| {
        body.get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock-model")
            .to_string()
    });
    let (format, path) = (call.format, call.path);
    let (reply, chunk_bytes, gap) = {
        let mut script = shared.lock();
        script.received.push(Received {
            path,
            headers,
            body,
        });
        (
            script
                .replies
                .pop_front()
                .unwrap_or_else(|| Reply::text("mock reply")),
            script.chunk_bytes,
            script.chunk_gap,
        )
    };
    respond(reply, format, &model, stream, chunk_bytes, gap).await
}

async fn respond(
    reply: Reply,
    format: Format,
    model: &str,
    stream: bool,
    chunk_bytes: usize,
    gap: Duration,
) -> Response {
    let mut reply = reply;
    let mut break_early = false;
    let mut truncate = false;
    loop {
        match reply {
            Reply::Delayed(delay, inner) => {
                tokio::time::sleep(delay).await;
                reply = *inner;
            }
            Reply::BreakAfterFirstChunk(inner) => {
                break_early = true;
                reply = *inner;
            }
            Reply::TruncatedStream(inner) => {
                truncate = true;
                reply = *inner;
            }
            _ => break,
        }
    }
    // Formats without a refusal field say it as text.
    if let Reply::Refusal(refusal) = &reply
        && format != Format::OpenAi
    {
        reply = Reply::text(refusal.clone());
    }
    let cut = match (break_early, truncate) {
        (true, _) => Cut::Break,
        (false, true) => Cut::Clean,
        _ => Cut::None,
    };
    match reply {
        Reply::Redirect(location) => Response::builder()
            .status(StatusCode::TEMPORARY_REDIRECT)
            .header("location", location)
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()),
        Reply::Raw(body) => {
            let content_type = if stream {
                "text/event-stream"
            } else {
                "application/json"
            };
            Response::builder()
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Reply::Status {
            status,
            message,
            retry_after,
        } => {
            let body = match format {
                Format::OpenAi | Format::Responses => {
                    json!({"error": {"message": message, "type": "mock_error", "code": Value::Null}})
                }
                Format::Anthropic => {
                    json!({"type": "error", "error": {"type": "mock_error", "message": message}})
                }
                Format::Gemini => crate::gemini::error_body(status, &message),
                Format::Bedrock => crate::bedrock::error_body(&message),
            };
            let mut response = (
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                axum::Json(body),
            )
                .into_response();
            if let Some(secs) = retry_after
                && let Ok(value) = secs.to_string().parse()
            {
                response.headers_mut().insert("retry-after", value);
            }
            response
        }
        Reply::Refusal(refusal) => {
            if stream {
                let bytes = openai_refusal_stream(model, &refusal);
                stream_body(bytes, "text/event-stream", chunk_bytes, gap, cut)
            } else {
                axum::Json(openai_refusal_body(model, &refusal)).into_response()
            }
        }
        Reply::Answer {
            text,
            tool_calls,
            tokens_in,
            tokens_out,
            model: served,
            web_searches,
            citations,
        } => {
            let served = served.unwrap_or_else(|| model.to_string());
            let answer = Answer {
                text,
                tool_calls,
                tokens_in,
                tokens_out,
                model: served,
                web_searches,
                citations,
            };
            if stream {
                let (bytes, content_type) = match format {
                    Format::OpenAi => (openai_stream(&answer), "text/event-stream"),
                    Format::Responses => (crate::responses::stream(&answer), "text/event-stream"),
                    Format::Anthropic => (anthropic_stream(&answer), "text/event-stream"),
                    Format::Gemini => (crate::gemini::stream(&answer), "text/event-stream"),
                    Format::Bedrock => (
                        crate::bedrock::stream(&answer),
                        crate::bedrock::STREAM_CONTENT_TYPE,
                    ),
                };
                stream_body(bytes, content_type, chunk_bytes, gap, cut)
            } else {
                let body = match format {
                    Format::OpenAi => openai_body(&answer),
                    Format::Responses => crate::responses::body(&answer),
                    Format::Anthropic => anthropic_body(&answer),
                    Format::Gemini => crate::gemini::body(&answer),
                    Format::Bedrock => crate::bedrock::body(&answer),
                };
                if cut != Cut::None {
                    let bytes = serde_json::to_vec(&body).unwrap_or_default();
                    return stream_body(bytes, "application/json", chunk_bytes, gap, cut);
                }
                axum::Json(body).into_response()
            }
        }
        Reply::Delayed(..) | Reply::BreakAfterFirstChunk(..) | Reply::TruncatedStream(..) => {
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A successful answer, rendered by each wire format's module.
#[derive(Debug, Clone)]
pub struct Answer {
    pub text: String,
    pub tool_calls: Vec<ToolCallReply>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// The served model name.
    pub model: String,
    pub web_searches: u64,
    pub citations: Vec<CitationReply>,
}

/// How a body ends early: not at all, with a broken connection, or with a clean end of body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    None,
    Break,
    Clean,
}

fn stream_body(
    bytes: Vec<u8>,
    content_type: &'static str,
    chunk_bytes: usize,
    gap: Duration,
    cut: Cut,
) -> Response {
    let break_early = cut == Cut::Break;
    let mut pieces: Vec<Bytes> = bytes
        .chunks(chunk_bytes)
        .map(Bytes::copy_from_slice)
        .collect();
    if cut != Cut::None {
        // Over half of the answer arrives (a stream has content by then), the rest never does.
        let mut kept = 0;
        let keep = pieces
            .iter()
            .take_while(|piece| {
                let before = kept;
                kept += piece.len();
                before < bytes.len() * 6 / 10
            })
            .count();
        pieces.truncate(keep.max(1));
    }
    let stream = futures::stream::unfold(
        (pieces.into_iter(), false),
        move |(mut rest, started)| async move {
            if started && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            match rest.next() {
                Some(piece) => Some((Ok::<_, std::io::Error>(piece), (rest, true))),
                None if break_early => {
                    // Let what was sent reach the client before the connection breaks.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((
                        Err(std::io::Error::other("mock broke the stream")),
                        (rest, true),
                    ))
                }
                None => None,
            }
        },
    );
    Response::builder()
        .header("content-type", content_type)
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Appends one SSE event (CRLF line ends, as some providers send).
pub fn sse(out: &mut Vec<u8>, event: Option<&str>, data: &str) {
    if let Some(event) = event {
        out.extend_from_slice(format!("event: {event}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("data: {data}\r\n\r\n").as_bytes());
}

/// A Chat Completions response.
pub fn openai_body(answer: &Answer) -> Value {
    let tool_calls: Vec<Value> = answer
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
        .collect();
    let mut message = json!({"role": "assistant", "content": if answer.text.is_empty() { Value::Null } else { Value::String(answer.text.clone()) }});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": answer.model,
        "choices": [{"index": 0, "message": message, "finish_reason": if answer.tool_calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": answer.tokens_in, "completion_tokens": answer.tokens_out, "total_tokens": answer.tokens_in + answer.tokens_out}
    })
}

/// A Chat Completions refusal: content null, the reason in `refusal`.
pub fn openai_refusal_body(model: &str, refusal: &str) -> Value {
    json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": refusal},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// A streamed refusal: the role chunk, `delta.refusal` in pieces, stop, usage.
pub fn openai_refusal_stream(model: &str, refusal: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    sse(
        &mut out,
        None,
        &chunk(
            json!({"role": "assistant", "content": null, "refusal": ""}),
            Value::Null,
        ),
    );
    for piece in split_text(refusal) {
        sse(
            &mut out,
            None,
            &chunk(json!({"refusal": piece}), Value::Null),
        );
    }
    sse(&mut out, None, &chunk(json!({}), Value::from("stop")));
    sse(
        &mut out,
        None,
        &json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
        .to_string(),
    );
    sse(&mut out, None, "[DONE]");
    out
}

/// Text in small pieces (split inside multi-byte characters by the chunking), then tool calls.
pub fn openai_stream(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": answer.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    sse(
        &mut out,
        None,
        &chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    );
    for piece in split_text(&answer.text) {
        sse(
            &mut out,
            None,
            &chunk(json!({"content": piece}), Value::Null),
        );
    }
    for (i, call) in answer.tool_calls.iter().enumerate() {
        sse(
            &mut out,
            None,
            &chunk(
                json!({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]}),
                Value::Null,
            ),
        );
        let args = call.arguments.to_string();
        let (head, tail) = args.split_at(args.floor_char_boundary(args.len() / 2));
        for part in [head, tail] {
            sse(
                &mut out,
                None,
                &chunk(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                    Value::Null,
                ),
            );
        }
    }
    let finish = if answer.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    sse(&mut out, None, &chunk(json!({}), Value::from(finish)));
    sse(
        &mut out,
        None,
        &json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": answer.model, "choices": [],
                "usage": {"prompt_tokens": answer.tokens_in, "completion_tokens": answer.tokens_out, "total_tokens": answer.tokens_in + answer.tokens_out}})
        .to_string(),
    );
    sse(&mut out, None, "[DONE]");
    out
}

/// A Messages response.
pub fn anthropic_body(answer: &Answer) -> Value {
    let mut content = Vec::new();
    if !answer.text.is_empty() {
        content.push(json!({"type": "text", "text": answer.text}));
    }
    for call in &answer.tool_calls {
        content.push(
            json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}),
        );
    }
    json!({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": answer.model, "content": content,
        "stop_reason": if answer.tool_calls.is_empty() { "end_turn" } else { "tool_use" },
        "usage": {"input_tokens": answer.tokens_in, "output_tokens": answer.tokens_out}
    })
}

/// Messages stream events: the text in small deltas, then each tool call with its input in two
/// fragments, then the stop reason and usage.
pub fn anthropic_stream(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    sse(&mut out, Some("message_start"), &json!({"type": "message_start", "message": {"id": "msg_mock", "model": answer.model, "usage": {"input_tokens": answer.tokens_in, "output_tokens": 1}}}).to_string());
    let mut index = 0;
    if !answer.text.is_empty() {
        sse(&mut out, Some("content_block_start"), &json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}).to_string());
        for piece in split_text(&answer.text) {
            sse(&mut out, Some("content_block_delta"), &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}).to_string());
        }
        sse(
            &mut out,
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}).to_string(),
        );
        index += 1;
    }
    sse(&mut out, Some("ping"), &json!({"type": "ping"}).to_string());
    for call in &answer.tool_calls {
        sse(&mut out, Some("content_block_start"), &json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}}).to_string());
        let args = call.arguments.to_string();
        let (head, tail) = args.split_at(args.floor_char_boundary(args.len() / 2));
        for part in [head, tail] {
            sse(&mut out, Some("content_block_delta"), &json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": part}}).to_string());
        }
        sse(
            &mut out,
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": index}).to_string(),
        );
        index += 1;
    }
    let stop = if answer.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    sse(&mut out, Some("message_delta"), &json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": answer.tokens_out}}).to_string());
    sse(
        &mut out,
        Some("message_stop"),
        &json!({"type": "message_stop"}).to_string(),
    );
    out
}

/// Splits text into pieces of about three characters (on char boundaries: the byte chunking of
/// the stream is what cuts inside characters).
pub fn split_text(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(3).map(|c| c.iter().collect()).collect()
}
