//! The mock provider's fast mode for load benchmarks and the soak: one fixed OpenAI chat
//! completion, serialised once at start, with no scripting and no recording, so the mock costs
//! far less per request than the gateway in front of it.
//!
//! For the soak (`cargo xtask soak`) it also plays a model that calls tools (a request offering
//! tools gets a call of the first one until a tool result is in the conversation), fails a set
//! share of requests on its `/fail/{percent}` route, and hosts an External tool
//! (`GET /tool/echo`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};

/// What every request gets.
#[derive(Debug, Clone, Copy, Default)]
pub struct FastMockOptions {
    /// Waited before answering (models the provider's own latency; 0 for overhead figures).
    pub delay: Duration,
    /// Content chunks of a streamed answer (the role, finish and usage chunks come on top).
    pub stream_chunks: usize,
    /// Waited between the content chunks of a streamed answer. The first comes at once: a
    /// wait before it would put the mock's timer in every TTFT, and tokio's millisecond timer
    /// rounds a 1 ms wait to 1-2 ms by where in the millisecond the request arrived, which a
    /// gateway in front shifts (`docs/benchmarks.md`, "Streaming TTFT and the mock's timer").
    pub chunk_gap: Duration,
}

#[derive(Clone)]
struct Prepared {
    options: FastMockOptions,
    completion: Bytes,
    stream_head: Bytes,
    stream_chunk: Bytes,
    stream_tail: Bytes,
    /// Requests seen by the `/fail` route, which decides by this count which ones fail.
    fail_counter: Arc<AtomicU64>,
}

/// A running fast mock. Dropping it does not stop the server; the runtime does.
pub struct FastMock {
    address: SocketAddr,
}

impl FastMock {
    /// Binds `127.0.0.1:0` and serves `/v1/chat/completions` (and `/chat/completions`).
    pub async fn start(options: FastMockOptions) -> std::io::Result<FastMock> {
        FastMock::serve(router(options)).await
    }

    /// Serves `router` (the fast mock's routes with others merged in) the same way.
    pub async fn serve(router: Router) -> std::io::Result<FastMock> {
        let address = crate::serve::serve_loopback(router).await?;
        Ok(FastMock { address })
    }

    /// Serves `router` on `threads` threads of its own, outside any runtime
    /// (`serve::serve_loopback_threads`): the `baton-mock` process's way, so a benchmark can
    /// give the mock as many cores as it gives it CPUs.
    pub fn serve_on_threads(router: Router, threads: usize) -> std::io::Result<FastMock> {
        let address = crate::serve::serve_loopback_threads(router, threads)?;
        Ok(FastMock { address })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Base URL for OpenAI-style configuration (`.../v1`).
    pub fn openai_base(&self) -> String {
        format!("http://{}/v1", self.address)
    }
}

/// The fast mock's routes, for callers that serve them on their own listener.
///
/// `/shape/{chunks}/{gap_ms}/v1/chat/completions` streams `chunks` content chunks `gap_ms`
/// apart instead of the configured shape, so one mock serves a gateway two stream shapes
/// through two base URLs (the load benchmark's short streams and its long concurrent ones).
///
/// `/fail/{percent}/v1/chat/completions` answers `percent` % of its requests with an error,
/// decided by a counter (requests whose number `n` moves `n * percent / 100`), so the failures
/// are spread evenly and their count is known from the request count; they alternate between
/// 500 and 429 (without `Retry-After`, so a gateway does not wait and retry).
///
/// `GET /tool/echo?...` is an External tool host: it answers `{"echo": "<query string>"}`.
pub fn router(options: FastMockOptions) -> Router {
    let prepared = prepare(options);
    Router::new()
        .route("/v1/chat/completions", post(complete))
        .route("/chat/completions", post(complete))
        .route(
            "/shape/{chunks}/{gap_ms}/v1/chat/completions",
            post(complete_shaped),
        )
        .route(
            "/fail/{percent}/v1/chat/completions",
            post(complete_failing),
        )
        .route("/tool/echo", get(tool_echo))
        .with_state(prepared)
}

/// How many of the first `requests` requests the `/fail/{percent}` route fails.
pub fn failures_among(requests: u64, percent: u64) -> u64 {
    requests.saturating_mul(percent.min(100)) / 100
}

async fn complete_failing(
    State(prepared): State<Prepared>,
    Path(percent): Path<u64>,
    body: Bytes,
) -> Response {
    let n = prepared.fail_counter.fetch_add(1, Ordering::Relaxed);
    let failures_before = failures_among(n, percent);
    if failures_among(n + 1, percent) == failures_before {
        return complete(State(prepared), body).await;
    }
    let (status, code) = if failures_before.is_multiple_of(2) {
        (StatusCode::INTERNAL_SERVER_ERROR, "server_error")
    } else {
        (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded")
    };
    let error = json!({"error": {"message": "injected failure", "type": code, "code": code}});
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        error.to_string(),
    )
        .into_response()
}

async fn tool_echo(RawQuery(query): RawQuery) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        json!({"echo": query.unwrap_or_default()}).to_string(),
    )
        .into_response()
}

/// Tools Baton adds to every sub-agent (SPEC.md "Context tools"); the mock never calls them, so
/// a template without tools of its own answers at once.
const CONTEXT_TOOLS: &[&str] = &[
    "get_context",
    "get_original_input",
    "get_state",
    "set_state",
];

/// The tool call a model would make for this request: the first tool offered, other than the
/// context tools, unless a tool result is already the last message.
fn tool_call_for(request: &Value) -> Option<Value> {
    let messages = request.get("messages")?.as_array()?;
    if messages.last()?.get("role").and_then(Value::as_str) == Some("tool") {
        return None;
    }
    let function = request
        .get("tools")?
        .as_array()?
        .iter()
        .filter_map(|tool| tool.get("function"))
        .find(|f| {
            f.get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| !CONTEXT_TOOLS.contains(&name))
        })?;
    let arguments = arguments_for(function.get("parameters").unwrap_or(&Value::Null));
    Some(json!({
        "id": "chatcmpl-fast", "object": "chat.completion", "created": 1, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{}", messages.len()), "type": "function",
            "function": {"name": function.get("name"), "arguments": arguments.to_string()}
        }]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}
    }))
}

/// Arguments satisfying a JSON Schema's required properties (first enum value, or a plain value
/// of the property's type).
fn arguments_for(schema: &Value) -> Value {
    let mut arguments = serde_json::Map::new();
    let properties = schema.get("properties");
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let property = properties.and_then(|p| p.get(name));
        let value = match property.and_then(|p| p.get("enum")).and_then(|e| e.get(0)) {
            Some(first) => first.clone(),
            None => match property.and_then(|p| p.get("type")).and_then(Value::as_str) {
                Some("number" | "integer") => json!(1),
                Some("boolean") => json!(true),
                Some("array") => json!([]),
                Some("object") => json!({}),
                _ => json!("soak"),
            },
        };
        arguments.insert(name.to_string(), value);
    }
    Value::Object(arguments)
}

/// Largest chunk count a shaped route accepts (a typo must not stream for hours).
const MAX_SHAPED_CHUNKS: usize = 10_000;

async fn complete_shaped(
    State(prepared): State<Prepared>,
    Path((chunks, gap_ms)): Path<(usize, u64)>,
    body: Bytes,
) -> Response {
    let options = FastMockOptions {
        stream_chunks: chunks.min(MAX_SHAPED_CHUNKS),
        chunk_gap: Duration::from_millis(gap_ms.min(60_000)),
        ..prepared.options
    };
    let shaped = Prepared {
        stream_tail: stream_tail(options.stream_chunks),
        options,
        ..prepared
    };
    complete(State(shaped), body).await
}

const MODEL: &str = "gpt-4o-mini";

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn sse(data: &str) -> String {
    format!("data: {data}\n\n")
}

fn prepare(options: FastMockOptions) -> Prepared {
    let completion = json!({
        "id": "chatcmpl-fast", "object": "chat.completion", "created": 1, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the fast mock."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}
    });
    Prepared {
        options,
        completion: Bytes::from(completion.to_string()),
        stream_head: Bytes::from(sse(&chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )
        .to_string())),
        stream_chunk: Bytes::from(sse(
            &chunk(json!({"content": "tok "}), Value::Null).to_string()
        )),
        stream_tail: stream_tail(options.stream_chunks),
        fail_counter: Arc::new(AtomicU64::new(0)),
    }
}

/// The finish chunk, the usage chunk (one completion token per content chunk) and `[DONE]`.
fn stream_tail(chunks: usize) -> Bytes {
    let usage = json!({"id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": 1, "model": MODEL, "choices": [],
                       "usage": {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks}});
    Bytes::from(
        [
            sse(&chunk(json!({}), Value::from("stop")).to_string()),
            sse(&usage.to_string()),
            sse("[DONE]"),
        ]
        .concat(),
    )
}

/// What the mock reads of a request before answering: whether it streams, and whether it
/// offers tools. The rest is skipped without being built into a tree, which the whole body as
/// a `Value` cost every request (the mock's CPU is part of every figure measured through it).
#[derive(Default, Deserialize)]
struct Peek {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<IgnoredAny>,
}

/// Only `stream`, `messages` and `tools` are read from the body; anything else is ignored.
async fn complete(State(prepared): State<Prepared>, body: Bytes) -> Response {
    if !prepared.options.delay.is_zero() {
        tokio::time::sleep(prepared.options.delay).await;
    }
    let peek = serde_json::from_slice::<Peek>(&body).unwrap_or_default();
    if peek.stream != Some(true) {
        // Only a request offering tools is read whole, for the call to make.
        let call = peek.tools.and_then(|_| {
            let request = serde_json::from_slice::<Value>(&body).ok()?;
            tool_call_for(&request)
        });
        if let Some(call) = call {
            return axum::Json(call).into_response();
        }
        return (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            prepared.completion.clone(),
        )
            .into_response();
    }
    let gap = prepared.options.chunk_gap;
    let head = futures::stream::once(std::future::ready(prepared.stream_head.clone()));
    let chunk = prepared.stream_chunk.clone();
    let chunks = prepared.options.stream_chunks;
    let content = futures::stream::unfold(0, move |sent| {
        let chunk = chunk.clone();
        async move {
            if sent == chunks {
                return None;
            }
            if sent > 0 && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            Some((chunk, sent + 1))
        }
    });
    let tail = futures::stream::once(std::future::ready(prepared.stream_tail.clone()));
    let events = futures::StreamExt::map(
        futures::StreamExt::chain(futures::StreamExt::chain(head, content), tail),
        Ok::<Bytes, std::convert::Infallible>,
    );
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(events),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_parts_are_sse_events_of_valid_json() {
        let prepared = prepare(FastMockOptions {
            stream_chunks: 3,
            ..FastMockOptions::default()
        });
        let text = [
            prepared.stream_head.as_ref(),
            prepared.stream_chunk.as_ref(),
            prepared.stream_tail.as_ref(),
        ]
        .concat();
        let text = String::from_utf8(text).unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 5);
        for event in &events[..4] {
            let data = event.strip_prefix("data: ").unwrap();
            serde_json::from_str::<Value>(data).unwrap();
        }
        assert_eq!(events[4], "data: [DONE]");
        let completion: Value = serde_json::from_slice(&prepared.completion).unwrap();
        assert_eq!(completion["object"], "chat.completion");
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_content_chunk_comes_at_once_and_the_rest_a_gap_apart() {
        use futures::StreamExt;

        let gap = Duration::from_millis(20);
        let prepared = prepare(FastMockOptions {
            stream_chunks: 3,
            chunk_gap: gap,
            ..FastMockOptions::default()
        });
        let request = Bytes::from_static(br#"{"stream": true, "messages": []}"#);
        let response = complete(State(prepared.clone()), request).await;
        let mut body = response.into_body().into_data_stream();
        let start = tokio::time::Instant::now();
        let mut arrivals = Vec::new();
        while let Some(frame) = body.next().await {
            arrivals.push((frame.unwrap(), start.elapsed()));
        }
        let chunk_times: Vec<Duration> = arrivals
            .iter()
            .filter(|(bytes, _)| *bytes == prepared.stream_chunk)
            .map(|(_, at)| *at)
            .collect();
        assert_eq!(chunk_times, [Duration::ZERO, gap, 2 * gap]);
        assert_eq!(arrivals[0].0, prepared.stream_head);
    }

    #[tokio::test]
    async fn the_answer_follows_the_stream_flag_and_the_tools_offered() {
        let prepared = prepare(FastMockOptions::default());
        let answer = |body: &'static str| {
            let prepared = prepared.clone();
            async move {
                let response = complete(State(prepared), Bytes::from_static(body.as_bytes())).await;
                let content_type = response.headers()[header::CONTENT_TYPE].clone();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .unwrap();
                (content_type, body)
            }
        };
        for plain in [
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
            r#"{"stream": null, "tools": null, "messages": []}"#,
            r#"{"stream": false, "extra": {"nested": [1, 2]}}"#,
            "not json",
        ] {
            let (content_type, body) = answer(plain).await;
            assert_eq!(content_type, "application/json", "{plain}");
            assert_eq!(body, prepared.completion, "{plain}");
        }
        let (content_type, _) = answer(r#"{"stream": true, "messages": []}"#).await;
        assert_eq!(content_type, "text/event-stream");
        let (_, body) = answer(
            r#"{"messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]}"#,
        )
        .await;
        let call: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(call["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn failures_are_the_set_share_of_any_request_count() {
        assert_eq!(failures_among(100, 10), 10);
        assert_eq!(failures_among(9, 10), 0);
        assert_eq!(failures_among(10, 10), 1);
        assert_eq!(failures_among(7, 100), 7);
        assert_eq!(failures_among(7, 0), 0);
        assert_eq!(failures_among(50, 250), 50);
    }

    #[test]
    fn a_request_offering_tools_gets_a_call_until_a_result_came_back() {
        let tools = json!([
            {"type": "function", "function": {"name": "get_context", "parameters": {}}},
            {"type": "function", "function": {"name": "lookup", "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}, "n": {"type": "number"},
                               "mode": {"type": "string", "enum": ["fast", "slow"]},
                               "optional": {"type": "string"}},
                "required": ["q", "n", "mode"]}}}
        ]);
        let asking = json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools});
        let call = tool_call_for(&asking).unwrap();
        let function = &call["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(function["name"], "lookup");
        let arguments: Value =
            serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({"q": "soak", "n": 1, "mode": "fast"}));
        assert_eq!(call["choices"][0]["finish_reason"], "tool_calls");

        let answered = json!({"messages": [{"role": "user", "content": "hi"},
                                           {"role": "tool", "content": "x"}], "tools": tools});
        assert!(tool_call_for(&answered).is_none());
        let context_only = json!({"messages": [{"role": "user", "content": "hi"}],
                                  "tools": [tools[0].clone()]});
        assert!(tool_call_for(&context_only).is_none());
        assert!(tool_call_for(&json!({"messages": [{"role": "user"}]})).is_none());
    }
}
