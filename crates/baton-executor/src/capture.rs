//! Internal log lines of requests run for debugging (`x_log_level`, `is_debug`), kept with the
//! run for `/llm-logs/{id}/log-entries`. A request opts in by running inside a
//! [`capture_span`]; the [`CaptureLayer`] (installed in the process's `tracing` subscriber)
//! collects the events of that span and its children at or above the requested level; the run's
//! log takes them when the root run is written ([`take`]). Nothing is collected for requests
//! that did not ask, and the layer's filter keeps other requests' debug lines disabled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use baton_domain::Timestamp;
use baton_domain::logs::RunLogEntry;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The span that marks a captured request.
pub const SPAN_NAME: &str = "baton_capture";
/// Lines kept per run, and runs buffered at once: a runaway loop cannot exhaust memory.
const MAX_LINES: usize = 5_000;
const MAX_RUNS: usize = 1_000;

/// Capture spans open now, in every subscriber. While none is, the filter refuses events with
/// this one load instead of walking the event's span scope: the common case, as debug runs are
/// rare and every `debug!`/`trace!` of every request asks the filter.
static OPEN_CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// How many capture spans are open (tests).
pub fn open_captures() -> usize {
    OPEN_CAPTURES.load(Ordering::Relaxed)
}

/// The span a request runs in to have its log lines kept, at `level` and above.
pub fn capture_span(run_id: &str, level: Level) -> tracing::Span {
    tracing::span!(
        target: "baton_capture",
        Level::ERROR,
        "baton_capture",
        run_id = run_id,
        level = level.as_str()
    )
}

/// `Trace`, `Debug`, `Information`, `Warning`, `Error`, `Critical` (SPEC.md `x_log_level`), or
/// the `tracing` names; any case.
pub fn parse_level(raw: &str) -> Option<Level> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "trace" => Some(Level::TRACE),
        "debug" => Some(Level::DEBUG),
        "information" | "info" => Some(Level::INFO),
        "warning" | "warn" => Some(Level::WARN),
        "error" | "critical" => Some(Level::ERROR),
        _ => None,
    }
}

/// Lines of one run, and since when its capture span is closed (a stream's run is written after
/// its handler returned, so lines wait a while for it).
#[derive(Default)]
struct Buffer {
    lines: Vec<RunLogEntry>,
    closed: Option<Instant>,
}

type Buffers = HashMap<String, Buffer>;

/// How long lines of a closed capture wait to be taken.
const CLOSED_GRACE: Duration = Duration::from_secs(120);

fn buffers() -> MutexGuard<'static, Buffers> {
    static BUFFERS: OnceLock<Mutex<Buffers>> = OnceLock::new();
    BUFFERS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The lines collected for `run_id` so far (none when it was not captured).
pub fn take(run_id: &str) -> Vec<RunLogEntry> {
    buffers()
        .remove(run_id)
        .map(|buffer| buffer.lines)
        .unwrap_or_default()
}

/// What a capture span asked for, kept in the span's extensions.
struct Capture {
    run_id: String,
    level: Level,
}

#[derive(Default)]
struct CaptureFields {
    run_id: Option<String>,
    level: Option<String>,
}

impl Visit for CaptureFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "run_id" => self.run_id = Some(value.to_string()),
            "level" => self.level = Some(value.to_string()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

#[derive(Default)]
struct EventFields {
    message: String,
    fields: Map<String, Value>,
}

impl Visit for EventFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields
                .insert(field.name().to_string(), Value::from(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields
            .insert(field.name().to_string(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields
            .insert(field.name().to_string(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields
            .insert(field.name().to_string(), Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields
            .insert(field.name().to_string(), Value::from(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

/// Collects the events of capture spans. Install it in the subscriber with its own filter
/// ([`CaptureLayer::filter`]) beside the console output's.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureLayer;

impl CaptureLayer {
    /// Lets an event through only inside a capture span, so debug lines of other requests stay
    /// disabled; spans all pass (the capture span must be seen to be found).
    pub fn filter<S>() -> impl Filter<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_subscriber::filter::dynamic_filter_fn(|metadata: &Metadata<'_>, cx| {
            if metadata.is_span() {
                return true;
            }
            if OPEN_CAPTURES.load(Ordering::Relaxed) == 0 {
                return false;
            }
            cx.lookup_current().is_some_and(|span| {
                span.scope()
                    .any(|s| s.extensions().get::<Capture>().is_some())
            })
        })
    }
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != SPAN_NAME {
            return;
        }
        let mut fields = CaptureFields::default();
        attrs.record(&mut fields);
        let (Some(run_id), Some(level)) = (fields.run_id, fields.level) else {
            return;
        };
        let Some(level) = parse_level(&level) else {
            return;
        };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Capture { run_id, level });
            OPEN_CAPTURES.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some((run_id, level)) = scope.into_iter().find_map(|span| {
            span.extensions()
                .get::<Capture>()
                .map(|c| (c.run_id.clone(), c.level))
        }) else {
            return;
        };
        let metadata = event.metadata();
        // `Level` orders TRACE highest: "at or above the asked level" is `<=`.
        if *metadata.level() > level {
            return;
        }
        let mut fields = EventFields::default();
        event.record(&mut fields);
        let mut buffers = buffers();
        if !buffers.contains_key(&run_id) {
            // Runs that ended without their lines being taken make room after a while.
            buffers.retain(|_, b| b.closed.is_none_or(|at| at.elapsed() < CLOSED_GRACE));
            if buffers.len() >= MAX_RUNS {
                return;
            }
        }
        let lines = &mut buffers.entry(run_id.clone()).or_default().lines;
        if lines.len() >= MAX_LINES {
            return;
        }
        lines.push(RunLogEntry {
            id: uuid::Uuid::now_v7().to_string(),
            seq: u32::try_from(lines.len()).unwrap_or(u32::MAX),
            run_id,
            level: metadata.level().as_str().to_ascii_lowercase(),
            target: metadata.target().to_string(),
            message: fields.message,
            fields: Value::Object(fields.fields),
            timestamp: Timestamp::now(),
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let extensions = span.extensions();
        let Some(capture) = extensions.get::<Capture>() else {
            return;
        };
        OPEN_CAPTURES.fetch_sub(1, Ordering::Relaxed);
        // Lines nobody takes (the request ended before its run was written) go after a grace.
        if let Some(buffer) = buffers().get_mut(&capture.run_id) {
            buffer.closed = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn only_lines_of_captured_spans_at_their_level_are_kept() {
        let subscriber =
            tracing_subscriber::registry().with(CaptureLayer.with_filter(CaptureLayer::filter()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!("outside any capture");
            let span = capture_span("run-a", Level::DEBUG);
            assert_eq!(open_captures(), 1);
            span.in_scope(|| {
                tracing::info!(model = "m", tokens = 3u64, "calling the model");
                tracing::trace!("too fine for debug");
                tracing::debug_span!("inner").in_scope(|| tracing::warn!("nested"));
            });
            drop(span);
            assert_eq!(open_captures(), 0, "the span is closed");
            let lines = take("run-a");
            assert_eq!(
                lines.iter().map(|l| l.message.as_str()).collect::<Vec<_>>(),
                ["calling the model", "nested"]
            );
            assert_eq!(lines[0].level, "info");
            assert_eq!(lines[0].fields["tokens"], 3);
            assert_eq!(lines[1].seq, 1);
            assert!(take("run-a").is_empty(), "taken once");
        });
        assert_eq!(parse_level("Information"), Some(Level::INFO));
        assert_eq!(parse_level("Critical"), Some(Level::ERROR));
        assert_eq!(parse_level("loud"), None);
    }
}
