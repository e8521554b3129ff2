//! The events stream format (DESIGN.md "Streams") as SSE: the engine's envelopes, each with its
//! `id:`, then `[DONE]`. The envelopes themselves come from `baton_executor::stream` (one
//! streamed call) or a flow run's live events.

use axum::body::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::sse::SseWriter;

pub use baton_executor::events::{EventOptions, wants_events};
pub use baton_executor::stream::EventStream;

/// The SSE frames of one streamed call in the events format, ending with `[DONE]`.
pub fn event_stream(stream: EventStream) -> impl Stream<Item = Bytes> + Send {
    sse_envelopes(baton_executor::stream::envelopes(stream))
}

/// Envelopes as SSE events (each with the envelope's id), then `[DONE]` (which, like every
/// event, has an id).
pub fn sse_envelopes(
    envelopes: impl Stream<Item = Value> + Send,
) -> impl Stream<Item = Bytes> + Send {
    let mut writer = SseWriter::new();
    envelopes
        .map(Some)
        .chain(futures::stream::once(async { None }))
        .map(move |envelope| {
            match envelope {
                Some(envelope) => {
                    let id = envelope
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    writer.json_with_id(id, &envelope);
                }
                None => writer.done_with_id(&uuid::Uuid::now_v7().to_string()),
            }
            writer.take()
        })
}
