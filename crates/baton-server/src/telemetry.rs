//! Logging: human-readable or JSON lines, written by a background thread so a slow terminal or
//! pipe never stalls a request; and the capture of debug runs' log lines
//! (`baton_executor::capture`), which has its own filter so other requests' debug lines stay off.

use baton_api::capture::CaptureLayer;
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, fmt};

use crate::config::LogFormat;

const DEFAULT_FILTER: &str = "info,sqlx=warn,sea_orm=warn,sea_orm_migration=warn,tower_http=warn";

/// Installs the global subscriber. Keep the guard alive until exit so buffered lines flush.
pub fn init(format: LogFormat) -> WorkerGuard {
    let filter = EnvFilter::try_from_env("BATON_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let console = match format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(writer)
            .boxed(),
        LogFormat::Text => fmt::layer().with_writer(writer).boxed(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(console.with_filter(filter))
        .with(CaptureLayer.with_filter(CaptureLayer::filter()))
        .try_init();
    guard
}
