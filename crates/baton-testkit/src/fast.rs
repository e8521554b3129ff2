//! The mock provider's fast mode for load benchmarks: one fixed OpenAI chat completion,
//! serialised once at start, with no scripting and no recording, so the mock costs far less per
//! request than the gateway in front of it.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::{Value, json};

/// What every request gets.
#[derive(Debug, Clone, Copy, Default)]
pub struct FastMockOptions {
    /// Waited before answering (models the provider's own latency; 0 for overhead figures).
    pub delay: Duration,
    /// Content chunks of a streamed answer (the role, finish and usage chunks come on top).
    pub stream_chunks: usize,
    /// Waited before each content chunk of a streamed answer.
    pub chunk_gap: Duration,
}

#[derive(Clone)]
struct Prepared {
    options: FastMockOptions,
    completion: Bytes,
    stream_head: Bytes,
    stream_chunk: Bytes,
    stream_tail: Bytes,
}

/// A running fast mock. Dropping it does not stop the server; the runtime does.
pub struct FastMock {
    address: SocketAddr,
}

impl FastMock {
    /// Binds `127.0.0.1:0` and serves `/v1/chat/completions` (and `/chat/completions`).
    pub async fn start(options: FastMockOptions) -> std::io::Result<FastMock> {
        let address = crate::serve::serve_loopback(router(options)).await?;
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
pub fn router(options: FastMockOptions) -> Router {
    let prepared = prepare(options);
    Router::new()
        .route("/v1/chat/completions", post(complete))
        .route("/chat/completions", post(complete))
        .route(
            "/shape/{chunks}/{gap_ms}/v1/chat/completions",
            post(complete_shaped),
        )
        .with_state(prepared)
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

/// Only `stream` is read from the body; anything else in it is ignored.
async fn complete(State(prepared): State<Prepared>, body: Bytes) -> Response {
    if !prepared.options.delay.is_zero() {
        tokio::time::sleep(prepared.options.delay).await;
    }
    let streamed = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|request| request.get("stream").and_then(Value::as_bool))
        .unwrap_or(false);
    if !streamed {
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
    let content = futures::stream::unfold(prepared.options.stream_chunks, move |remaining| {
        let chunk = chunk.clone();
        async move {
            if remaining == 0 {
                return None;
            }
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            Some((chunk, remaining - 1))
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
}
