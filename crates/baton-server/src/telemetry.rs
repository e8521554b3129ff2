//! Logging: human-readable or JSON lines, written by a background thread so a slow terminal or
//! pipe never stalls a request; and the capture of debug runs' log lines
//! (`baton_executor::capture`), which has its own filter so other requests' debug lines stay off.

use std::fmt::Write as _;

use baton_api::capture::CaptureLayer;
use tracing::field::{Field, Visit};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, fmt};

use crate::config::LogFormat;

const DEFAULT_FILTER: &str = "info,sqlx=warn,sea_orm=warn,sea_orm_migration=warn";

/// Installs the global subscriber. Keep the guard alive until exit so buffered lines flush.
pub fn init(format: LogFormat) -> WorkerGuard {
    let filter = EnvFilter::try_from_env("BATON_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let console = match format {
        LogFormat::Json => json_console(writer).boxed(),
        // Colours only for a terminal: a file or journald gets plain text.
        LogFormat::Text => fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(writer)
            .boxed(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(console.with_filter(filter))
        .with(CaptureLayer.with_filter(CaptureLayer::filter()))
        .try_init();
    guard
}

/// One JSON object per line: the event's fields at the top level, its span's fields under
/// `span`, all open spans under `spans`.
fn json_console<S, W>(
    writer: W,
) -> fmt::Layer<S, JsonSpanFields, fmt::format::Format<fmt::format::Json>, W>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> fmt::MakeWriter<'w> + 'static,
{
    fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .fmt_fields(JsonSpanFields)
        .with_writer(writer)
}

/// Span fields as a JSON object, written straight into the span's buffer. The JSON format's
/// own `JsonFields` collects them into a map of `serde_json::Value`s and serialises that, ~7.5k
/// instructions for each request's span (method, path, request id) whether or not anything is
/// logged inside it; this writes the same object directly. The JSON event formatter parses the
/// buffer when an event inside the span is written, so it must stay one valid object: a key
/// recorded again is appended, and the parse keeps the last value, as the map did.
struct JsonSpanFields;

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        writer.write_char('{')?;
        close_with_fields(&mut writer, true, fields)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        if current.fields.is_empty() {
            return self.format_fields(current.as_writer(), fields);
        }
        // Reopen the object, add the fields, close it again.
        current.fields.pop();
        let first = current.fields.len() <= 1;
        close_with_fields(&mut current.as_writer(), first, fields)
    }
}

/// Writes `fields` as pairs into an open JSON object (`first`: none written yet), then closes it.
fn close_with_fields<R: RecordFields>(
    writer: &mut Writer<'_>,
    first: bool,
    fields: R,
) -> std::fmt::Result {
    let mut visitor = JsonFieldWriter {
        writer,
        first,
        result: Ok(()),
    };
    fields.record(&mut visitor);
    visitor.result?;
    writer.write_char('}')
}

/// Writes `"name":value` pairs, commas between them.
struct JsonFieldWriter<'a, 'writer> {
    writer: &'a mut Writer<'writer>,
    first: bool,
    result: std::fmt::Result,
}

impl JsonFieldWriter<'_, '_> {
    fn pair(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> std::fmt::Result) {
        let name = field.name();
        // As the JSON format does: `log.*` fields repeat the event's metadata, and a raw
        // identifier is written without its `r#`.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = (|| {
            if !self.first {
                self.writer.write_char(',')?;
            }
            self.first = false;
            write_json_str(self.writer, name)?;
            self.writer.write_char(':')?;
            value(self.writer)
        })();
    }
}

impl Visit for JsonFieldWriter<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.pair(field, |w| write_json_str(w, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.pair(field, |w| write_json_string(w, format_args!("{value:?}")));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.pair(field, |w| write!(w, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.pair(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.pair(field, |w| write!(w, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity; the map wrote `null` for them too.
        if value.is_finite() {
            self.pair(field, |w| write!(w, "{value}"));
        } else {
            self.pair(field, |w| w.write_str("null"));
        }
    }
}

/// `text` as a JSON string, escaped as it is formatted (no intermediate `String`).
fn write_json_string(writer: &mut Writer<'_>, text: std::fmt::Arguments<'_>) -> std::fmt::Result {
    writer.write_char('"')?;
    Escaping(writer).write_fmt(text)?;
    writer.write_char('"')
}

/// `text` as a JSON string: the span's fields are `&str`s, escaped without the formatting
/// machinery `write_json_string` goes through.
fn write_json_str(writer: &mut Writer<'_>, text: &str) -> std::fmt::Result {
    writer.write_char('"')?;
    Escaping(writer).write_str(text)?;
    writer.write_char('"')
}

/// Writes what it is given JSON-escaped.
struct Escaping<'a, 'writer>(&'a mut Writer<'writer>);

impl std::fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let mut plain = 0;
        for (at, byte) in text.bytes().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&text[plain..at])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = at + 1;
        }
        self.0.write_str(&text[plain..])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The JSON lines logged by `body` through the console layer `BATON_LOG_FORMAT=json` uses.
    fn json_lines(body: impl FnOnce()) -> Vec<Value> {
        let lines = Lines::default();
        let writer = lines.clone();
        let layer = json_console(move || writer.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), body);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn span_fields_are_one_json_object_of_every_field() {
        let lines = json_lines(|| {
            let span = tracing::info_span!(
                "request",
                method = %"POST",
                path = "/api/v1/chat/\"quoted\"\\path\n",
                r#type = "raw",
                attempts = 3u64,
                delta = -2i64,
                ok = true,
                ratio = 0.5f64,
                nan = f64::NAN,
                control = "a\u{1}b",
                later = tracing::field::Empty,
            );
            span.in_scope(|| tracing::warn!("inside"));
            span.record("later", "recorded");
            span.record("attempts", 4u64);
            span.in_scope(|| tracing::warn!("after a record"));
        });
        let first = &lines[0]["span"];
        assert_eq!(
            *first,
            json!({"name": "request", "method": "POST", "path": "/api/v1/chat/\"quoted\"\\path\n",
                   "type": "raw", "attempts": 3, "delta": -2, "ok": true, "ratio": 0.5,
                   "nan": null, "control": "a\u{1}b"})
        );
        assert_eq!(lines[1]["span"]["later"], "recorded");
        assert_eq!(
            lines[1]["span"]["attempts"], 4,
            "a field recorded again: its last value"
        );
        assert_eq!(lines[1]["message"], "after a record");
    }

    #[test]
    fn a_span_without_fields_and_one_given_them_later_stay_objects() {
        let lines = json_lines(|| {
            let span = tracing::info_span!("bare", late = tracing::field::Empty);
            span.in_scope(|| tracing::warn!("no fields"));
            span.record("late", 1u64);
            span.in_scope(|| tracing::warn!("one field"));
        });
        assert_eq!(lines[0]["span"], json!({"name": "bare"}));
        assert_eq!(lines[1]["span"], json!({"name": "bare", "late": 1}));
    }
}
