//! Server-sent events written straight into the response body (both stream formats of
//! DESIGN.md "Streams").
//!
//! Every event Baton sends is `id: <id>\ndata: <one line of JSON or [DONE]>\n\n`. axum's
//! `Sse`/`Event` would build each event in a buffer of its own from a `String` the caller
//! serialised first, scanning it for newlines; here the JSON is serialised into a scratch
//! `Vec` kept for the whole stream (serde_json's writes into a `Vec` are inlined; into a
//! `BytesMut` each is a call), copied once into a buffer whose allocation successive events
//! share, and the events ready together (the usage chunk and `[DONE]`, say) leave as one body
//! frame. Compact JSON never holds a raw newline, so one `data:` line is always the whole event.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde::Serialize;

/// Room reserved when the buffer runs out: a few typical chunks, so most events of a stream
/// are written without an allocation of their own.
const RESERVE: usize = 4096;

/// Encodes events into a shared buffer; `take` hands out what was written as one frame.
/// Numbered events (the chunks format) take their ids from the writer's counter, from 0.
#[derive(Debug, Default)]
pub struct SseWriter {
    buffer: BytesMut,
    /// One event's JSON, serialised here first (reused, so it allocates once a stream).
    scratch: Vec<u8>,
    next_id: u64,
}

impl SseWriter {
    pub fn new() -> SseWriter {
        SseWriter::default()
    }

    /// The next numbered event, `data` as compact JSON.
    pub fn json(&mut self, data: &impl Serialize) {
        self.json_from(|out| {
            // Writing into memory cannot fail, and these values serialise (string keys only);
            // an error would leave a truncated line, which the blank line after it still ends.
            let _ = serde_json::to_writer(out, data);
        });
    }

    /// The next numbered event, its data what `write` puts into the scratch buffer (one line
    /// of compact JSON); nothing, and no id taken, when `write` writes nothing.
    pub fn json_from(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        self.scratch.clear();
        write(&mut self.scratch);
        if self.scratch.is_empty() {
            return;
        }
        self.id_line();
        self.data_line();
    }

    /// An event with a string id (an envelope's own id) and `data` as compact JSON.
    pub fn json_with_id(&mut self, id: &str, data: &impl Serialize) {
        self.scratch.clear();
        // As in `json`: writing into memory cannot fail.
        let _ = serde_json::to_writer(&mut self.scratch, data);
        self.reserve();
        self.field("id", id);
        self.data_line();
    }

    /// The stream's closing `data: [DONE]` event, numbered like the rest.
    pub fn done(&mut self) {
        self.id_line();
        self.buffer.put_slice(b"data: [DONE]\n\n");
    }

    /// The closing `data: [DONE]` event with a string id.
    pub fn done_with_id(&mut self, id: &str) {
        self.reserve();
        self.field("id", id);
        self.buffer.put_slice(b"data: [DONE]\n\n");
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// What was written since the last `take`, as one frame; the buffer's spare room stays for
    /// the next events.
    pub fn take(&mut self) -> Bytes {
        self.buffer.split().freeze()
    }

    /// `id: N` with the counter's next id.
    fn id_line(&mut self) {
        self.reserve();
        self.buffer.put_slice(b"id: ");
        self.buffer
            .put_slice(itoa::Buffer::new().format(self.next_id).as_bytes());
        self.buffer.put_u8(b'\n');
        self.next_id += 1;
    }

    fn data_line(&mut self) {
        self.buffer.put_slice(b"data: ");
        self.buffer.put_slice(&self.scratch);
        self.buffer.put_slice(b"\n\n");
    }

    /// `name: value\n`; a value holding a line break or NUL would end the field early or be
    /// ignored by clients, so such characters are dropped (ids here are UUIDs or numbers).
    fn field(&mut self, name: &str, value: &str) {
        self.buffer.put_slice(name.as_bytes());
        self.buffer.put_slice(b": ");
        if value.bytes().any(|byte| matches!(byte, b'\n' | b'\r' | 0)) {
            for byte in value
                .bytes()
                .filter(|byte| !matches!(byte, b'\n' | b'\r' | 0))
            {
                self.buffer.put_u8(byte);
            }
        } else {
            self.buffer.put_slice(value.as_bytes());
        }
        self.buffer.put_u8(b'\n');
    }

    fn reserve(&mut self) {
        if self.buffer.capacity() - self.buffer.len() < RESERVE / 4 + self.scratch.len() {
            self.buffer.reserve(RESERVE + self.scratch.len());
        }
    }
}

/// A `text/event-stream` response whose body is `frames`, each one or more encoded events.
pub fn response<S>(frames: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let mut response = Response::new(Body::from_stream(
        frames.map(Ok::<_, std::convert::Infallible>),
    ));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_numbered_json_lines_and_taken_together() {
        let mut writer = SseWriter::new();
        writer.json(&serde_json::json!({"n": 1, "text": "line\nbreak"}));
        assert_eq!(
            writer.take(),
            "id: 0\ndata: {\"n\":1,\"text\":\"line\\nbreak\"}\n\n"
        );
        assert!(writer.is_empty());
        writer.json(&serde_json::json!({"usage": null}));
        writer.done();
        assert_eq!(
            writer.take(),
            "id: 1\ndata: {\"usage\":null}\n\nid: 2\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn events_written_by_a_closure_take_an_id_only_when_they_have_data() {
        let mut writer = SseWriter::new();
        writer.json_from(|_| {});
        assert!(writer.is_empty());
        writer.json_from(|out| out.extend_from_slice(b"{}"));
        writer.json_from(|_| {});
        writer.done();
        assert_eq!(writer.take(), "id: 0\ndata: {}\n\nid: 1\ndata: [DONE]\n\n");
    }

    #[test]
    fn string_ids_lose_line_breaks_and_nul() {
        let mut writer = SseWriter::new();
        writer.json_with_id("a\nb\r\0c", &1);
        writer.done_with_id("d");
        assert_eq!(writer.take(), "id: abc\ndata: 1\n\nid: d\ndata: [DONE]\n\n");
    }

    #[test]
    fn many_events_share_one_allocation_until_it_runs_out() {
        let mut writer = SseWriter::new();
        writer.json(&"x");
        let first = writer.take();
        writer.json(&"y");
        let second = writer.take();
        // The second event was written right after the first, in the same allocation.
        assert_eq!(
            first.as_ptr().wrapping_add(first.len()),
            second.as_ptr(),
            "successive events are written into the buffer's spare room"
        );
    }
}
