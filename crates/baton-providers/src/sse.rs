//! Reading upstream Server-Sent Events: `sseer` does the parsing (an event's fields are slices
//! of the network chunk, found with `memchr`, where `eventsource-stream` re-allocated the rest
//! of its buffer after every line: `docs/performance.md`, round 28); this module bounds how much
//! one event may buffer, since the parser has no limit of its own.

use std::collections::VecDeque;
use std::task::{Poll, ready};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sseer::errors::EventStreamError;
use sseer::{EventStream, event::Event};

use baton_domain::chat::{StreamDelta, Usage};

use crate::error::{ProviderError, ProviderResult};
use crate::provider::DeltaStream;

/// A provider event larger than this is an error rather than unbounded buffering.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Parses `bytes` as SSE, failing if an event grows beyond `max_event_bytes`.
pub fn events<S, E>(
    provider: &str,
    bytes: S,
    max_event_bytes: usize,
) -> impl Stream<Item = Result<Event, ProviderError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let provider = provider.to_string();
    raw_events(bytes, max_event_bytes).map(move |item| item.map_err(|e| unreadable(&provider, &e)))
}

/// Why the body could not be read as events: the transport failed, or an event grew too large.
#[derive(Debug)]
enum BodyError {
    Broken(String),
    TooLarge(usize),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Broken(message) => f.write_str(message),
            BodyError::TooLarge(max) => write!(f, "an event exceeded {max} bytes"),
        }
    }
}

type ReadError = EventStreamError<BodyError>;

/// [`events`] with the reason a read failed kept, so a broken transport can be told from
/// a body that cannot be read.
fn raw_events<S, E>(
    bytes: S,
    max_event_bytes: usize,
) -> impl Stream<Item = Result<Event, ReadError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let mut event_bytes = SinceBoundary::default();
    let bounded = bytes.map(move |chunk| {
        let chunk = chunk.map_err(|e| BodyError::Broken(e.to_string()))?;
        if event_bytes.feed(&chunk) > max_event_bytes {
            return Err(BodyError::TooLarge(max_event_bytes));
        }
        Ok(chunk)
    });
    EventStream::new(bounded)
}

fn unreadable(provider: &str, err: &ReadError) -> ProviderError {
    ProviderError::InvalidResponse {
        provider: provider.to_string(),
        message: format!("broken event stream: {err}"),
    }
}

/// A read failure as the stream reports it. A connection that breaks before the stream
/// yielded anything is retryable, as a refused one is: nothing reached the client, so the
/// chain can still try the next model. Later, or for a body that cannot be read, it is not.
fn read_error(provider: &str, err: &ReadError, yielded: bool) -> ProviderError {
    match err {
        EventStreamError::Transport(BodyError::Broken(message)) if !yielded => {
            ProviderError::Connection {
                provider: provider.to_string(),
                message: format!("the response broke off before the answer began: {message}"),
            }
        }
        _ => unreadable(provider, err),
    }
}

/// How many bytes (other than `\r`) have arrived since the last blank line, the end of an
/// event ("\n\n"; a `\r` before a `\n` is part of the line end), across chunks.
#[derive(Debug, Default)]
struct SinceBoundary {
    count: usize,
    /// The last byte other than `\r` seen so far.
    last: u8,
}

impl SinceBoundary {
    /// Takes in the next chunk; returns the count after it. Only the part after the chunk's
    /// last blank line counts, so it is found from the end: a provider's chunk usually holds
    /// whole events and ends on one, where a byte-by-byte walk cost ~2k instructions an event.
    fn feed(&mut self, chunk: &[u8]) -> usize {
        let not_cr = |b: &u8| *b != b'\r';
        let mut end = chunk.len();
        let mut boundary = None;
        while let Some(newline) = chunk[..end].iter().rposition(|&b| b == b'\n') {
            let before = chunk[..newline]
                .iter()
                .rposition(not_cr)
                .map_or(self.last, |at| chunk[at]);
            if before == b'\n' {
                boundary = Some(newline + 1);
                break;
            }
            end = newline;
        }
        let counted = chunk[boundary.unwrap_or(0)..]
            .iter()
            .filter(|b| not_cr(b))
            .count();
        self.count = if boundary.is_some() {
            counted
        } else {
            self.count + counted
        };
        if let Some(at) = chunk.iter().rposition(not_cr) {
            self.last = chunk[at];
        }
        self.count
    }
}

/// What one event stands for, in order: deltas, or an error. A format's mapping pushes into it
/// and [`deltas`] hands the items out before it reads the next event, so one queue serves a
/// whole stream (a `Vec` returned for each event, flattened, was two allocations a chunk).
pub type Deltas = VecDeque<ProviderResult<StreamDelta>>;

/// What a stream reports before its answer begins (the model it serves, usage so far), held
/// back and sent just before its first other delta, model first. A stream is committed to its
/// model at its first delta (`routing::execute`): one that only names the model must not
/// commit it, or an error event or a stall right after it would reach the client instead of
/// the next model or the first-token timeout.
#[derive(Debug, Default)]
pub(crate) struct HeldUntilContent {
    started: bool,
    model: Option<String>,
    usage: Option<Usage>,
}

impl HeldUntilContent {
    /// Settles the deltas one event pushed into `out` from `from` on: before the answer
    /// begins, models and usage are taken out and held; at its first other delta they go back
    /// in front of it. An error before it ends the stream, so what was held is dropped.
    pub(crate) fn settle(&mut self, out: &mut Deltas, from: usize) {
        if self.started {
            return;
        }
        // Held deltas are removed, so the next one to look at is always at `at`.
        let at = from;
        while at < out.len() {
            match &out[at] {
                Ok(StreamDelta::Model(_) | StreamDelta::Usage(_)) => match out.remove(at) {
                    Some(Ok(StreamDelta::Model(model))) => {
                        self.model.get_or_insert(model);
                    }
                    Some(Ok(StreamDelta::Usage(usage))) => {
                        // Folded as the accumulator folds a run of usage deltas.
                        self.usage.get_or_insert_with(Usage::default).merge(usage);
                    }
                    _ => {}
                },
                Ok(_) => {
                    self.started = true;
                    if let Some(usage) = self.usage.take() {
                        out.insert(at, Ok(StreamDelta::Usage(usage)));
                    }
                    if let Some(model) = self.model.take() {
                        out.insert(at, Ok(StreamDelta::Model(model)));
                    }
                    return;
                }
                Err(_) => return,
            }
        }
    }
}

/// The skeleton every SSE wire format shares: `bytes` parsed as events (bounded by
/// [`MAX_EVENT_BYTES`]), events without data skipped, and each event's data handed to the
/// format's `map`, which pushes the deltas (or the error) it stands for, keeping whatever state
/// the format needs between events.
pub fn deltas<S, E, F>(provider: &str, bytes: S, mut map: F) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
    F: FnMut(&str, &mut Deltas) + Send + 'static,
{
    let provider = provider.to_string();
    let mut events = Box::pin(raw_events(bytes, MAX_EVENT_BYTES));
    let mut pending = Deltas::new();
    // Whether a delta went out: the stream is committed to its model from then on.
    let mut yielded = false;
    Box::pin(futures::stream::poll_fn(move |cx| {
        loop {
            if let Some(item) = pending.pop_front() {
                yielded |= item.is_ok();
                return Poll::Ready(Some(item));
            }
            match ready!(events.as_mut().poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Err(err)) => {
                    return Poll::Ready(Some(Err(read_error(&provider, &err, yielded))));
                }
                Some(Ok(event)) if event.data.trim().is_empty() => {}
                Some(Ok(event)) => map(&event.data, &mut pending),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(chunks: Vec<Vec<u8>>) -> Vec<(String, String)> {
        let stream = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
        );
        events("p", stream, MAX_EVENT_BYTES)
            .map(|e| {
                let e = e.unwrap();
                (e.event.to_string(), e.data.to_string())
            })
            .collect()
            .await
    }

    /// The same stream split at every byte boundary (inside UTF-8 characters and `\r\n`) parses
    /// to the same events.
    #[tokio::test]
    async fn every_split_gives_the_same_events() {
        let raw = "event: message\r\ndata: {\"t\":\"héllo ✓\"}\r\n\r\ndata: line1\ndata: line2\n\n: comment\n\ndata: [DONE]\n\n"
            .as_bytes()
            .to_vec();
        let whole = parse(vec![raw.clone()]).await;
        assert_eq!(whole.len(), 3);
        assert_eq!(
            whole[0],
            ("message".to_string(), "{\"t\":\"héllo ✓\"}".to_string())
        );
        assert_eq!(whole[1].1, "line1\nline2");
        for i in 1..raw.len() {
            let split = parse(vec![raw[..i].to_vec(), raw[i..].to_vec()]).await;
            assert_eq!(split, whole, "split at {i}");
        }
        let bytewise = parse(raw.iter().map(|b| vec![*b]).collect()).await;
        assert_eq!(bytewise, whole);
    }

    /// The byte-by-byte count `SinceBoundary` replaced, as the reference.
    fn walk(chunks: &[Vec<u8>]) -> Vec<usize> {
        let (mut count, mut last) = (0usize, 0u8);
        chunks
            .iter()
            .map(|chunk| {
                for &b in chunk {
                    if b == b'\n' && last == b'\n' {
                        count = 0;
                    } else if b != b'\r' {
                        count += 1;
                    }
                    if b != b'\r' {
                        last = b;
                    }
                }
                count
            })
            .collect()
    }

    proptest::proptest! {
        /// Counted from the chunk's end, the bytes since the last blank line are what walking
        /// every byte gives, however the stream is cut and whatever mix of line ends it holds.
        #[test]
        fn since_boundary_counts_as_a_walk_does(
            chunks in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(b"a\r\n:".to_vec()), 0..24),
                0..12,
            )
        ) {
            let mut since = SinceBoundary::default();
            let fed: Vec<usize> = chunks.iter().map(|chunk| since.feed(chunk)).collect();
            proptest::prop_assert_eq!(fed, walk(&chunks));
        }
    }

    #[tokio::test]
    async fn an_endless_event_is_an_error_not_unbounded_memory() {
        let chunks = (0..100).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 1024])));
        let mut stream = Box::pin(events("p", futures::stream::iter(chunks), 10 * 1024));
        let mut failed = false;
        while let Some(item) = stream.next().await {
            if item.is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }
}
