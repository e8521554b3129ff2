//! The events stream format (DESIGN.md "Streams") as SSE: the engine's envelopes, each with its
//! `id:`, then `[DONE]`. The envelopes themselves come from `baton_executor::stream` (one
//! streamed call) or a flow run's live events.

use std::convert::Infallible;

use axum::response::sse::Event;
use futures::{Stream, StreamExt};
use serde_json::Value;

pub use baton_executor::events::{EventOptions, wants_events};
pub use baton_executor::stream::{EventStream, StreamEnd};

/// The SSE events of one streamed call in the events format, ending with `[DONE]`.
pub fn event_stream(stream: EventStream) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    sse_envelopes(baton_executor::stream::envelopes(stream))
}

/// Envelopes as SSE events, then `[DONE]` (which, like every event, has an id).
pub fn sse_envelopes(
    envelopes: impl Stream<Item = Value> + Send,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let events = envelopes.map(|envelope| {
        let id = envelope
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Ok(Event::default().id(id).data(envelope.to_string()))
    });
    let done = futures::stream::once(async {
        Ok(Event::default()
            .id(uuid::Uuid::now_v7().to_string())
            .data("[DONE]"))
    });
    events.chain(done)
}
