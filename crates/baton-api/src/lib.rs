//! Baton's HTTP surface: the axum router, handlers, authentication and the OpenAPI document.
//! The only crate that knows axum; handlers parse and authorise, the store persists.

pub mod auth;
pub mod budgets;
pub mod compat;
pub mod context;
pub mod error;
pub mod extract;
pub mod mcp;
pub mod metrics;
pub mod overload;
pub mod routes;
pub mod serve;
pub mod sse;
pub mod state;
pub mod streams;
pub mod toolrun;

// The engine lives in `baton-executor`; its modules keep their old paths here.
pub use baton_executor::{cache, capture, events, gateway, limits, runlog};

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, StatusCode, header};
use axum::{Extension, middleware};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use axum::Router;
pub use baton_executor::Limits;
pub use error::{ApiError, ApiResult};
pub use mcp::McpConfig;
pub use overload::OverloadConfig;
pub use routes::openapi;
pub use serve::{ServeOptions, serve};
pub use state::{ApiConfig, AppState};

/// How long past the request deadline the outer timeout waits for the handler to answer.
const DEADLINE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
use crate::routes::openapi::{ApiDoc, OpenApiJson};

/// Builds the whole application: routes, auth, and the layers every request passes through.
pub fn build_router(state: AppState) -> Router {
    // Sheds load, then authenticates.
    let protected = routes::protected_routes().route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_auth,
    ));
    let (router, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(routes::public_routes())
        .merge(protected)
        .split_for_parts();
    let doc: Arc<str> = api.to_json().unwrap_or_default().into();

    let config = state.config.clone();
    let metrics = state.metrics.clone();
    with_request_layers(
        router.with_state(state).layer(Extension(OpenApiJson(doc))),
        &config,
        metrics,
    )
}

/// The layers every request passes through, outermost first: sensitive-header marking, request
/// context (id, metrics, error rendering, logging), tracing, panic catching, timeout, body limit.
pub(crate) fn with_request_layers(
    router: Router,
    config: &ApiConfig,
    metrics: Arc<metrics::Metrics>,
) -> Router {
    router.layer(
        ServiceBuilder::new()
            .layer(SetSensitiveRequestHeadersLayer::new([
                header::AUTHORIZATION,
                header::COOKIE,
                HeaderName::from_static("x-baton-callback-token"),
            ]))
            .layer(middleware::from_fn_with_state(
                metrics,
                context::request_context,
            ))
            .layer(CatchPanicLayer::custom(context::panic_response))
            // A backstop only: the executor ends its calls at `request_timeout` itself (504
            // `PROVIDER_TIMEOUT`, the run logged). Firing at the same instant, this layer won the
            // race and dropped the handler: a bare `TIMEOUT` and no invocation-log row.
            .layer(TimeoutLayer::with_status_code(
                StatusCode::GATEWAY_TIMEOUT,
                config.request_timeout + DEADLINE_GRACE,
            ))
            .layer(DefaultBodyLimit::max(config.max_body_bytes))
            .layer(Extension(extract::BodyLimit(config.max_body_bytes))),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    async fn call(router: Router, path: &str) -> (StatusCode, serde_json::Value, Option<String>) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let id = response
            .headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap(), id)
    }

    async fn boom() -> &'static str {
        panic!("boom with a secret")
    }

    fn app() -> Router {
        let config = ApiConfig {
            request_timeout: Duration::from_millis(50),
            ..ApiConfig::default()
        };
        let router = Router::new().route("/panic", get(boom)).route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
        with_request_layers(router, &config, Arc::new(metrics::Metrics::new()))
    }

    #[tokio::test]
    async fn a_panicking_handler_becomes_a_500_in_the_error_shape() {
        let (status, body, id) = call(app(), "/panic").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["code"], "INTERNAL_ERROR");
        assert_eq!(body["error"]["requestId"].as_str(), id.as_deref());
        assert!(
            !body.to_string().contains("secret"),
            "panic details leaked: {body}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_error_is_logged_once() {
        let (recorder, _guard) = recording();
        let (status, _, _) = call(app(), "/panic").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        let events = recorder.events.lock().unwrap().clone();
        let errors = events
            .iter()
            .filter(|(level, _, _)| *level == tracing::Level::ERROR)
            .count();
        assert_eq!(errors, 1, "{events:?}");
    }

    /// An event's level, message and request id.
    type Recorded = (tracing::Level, String, Option<String>);

    /// What a test's subscriber saw: each event's level, message and the `request_id` of the
    /// `request` span it was inside (or its own); and how often that span was entered.
    #[derive(Clone, Default)]
    struct Recorder {
        events: Arc<std::sync::Mutex<Vec<Recorded>>>,
        request_span_enters: Arc<std::sync::atomic::AtomicUsize>,
    }

    struct RequestIdField(String);

    #[derive(Default)]
    struct Fields {
        message: String,
        request_id: Option<String>,
    }

    impl tracing::field::Visit for Fields {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            if field.name() == "request_id" {
                self.request_id = Some(value.to_string());
            }
        }

        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            match field.name() {
                "message" => self.message = format!("{value:?}"),
                "request_id" => self.request_id = Some(format!("{value:?}")),
                _ => {}
            }
        }
    }

    impl<S> tracing_subscriber::Layer<S> for Recorder
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            id: &tracing::span::Id,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            if let (Some(span), Some(request_id)) = (ctx.span(id), fields.request_id) {
                span.extensions_mut().insert(RequestIdField(request_id));
            }
        }

        fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
            if ctx.span(id).is_some_and(|span| span.name() == "request") {
                self.request_span_enters
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }

        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            let span_request_id = ctx.event_scope(event).and_then(|scope| {
                scope
                    .filter(|span| span.name() == "request")
                    .find_map(|span| {
                        span.extensions()
                            .get::<RequestIdField>()
                            .map(|f| f.0.clone())
                    })
            });
            let request_id = span_request_id.or(fields.request_id);
            let entry = (*event.metadata().level(), fields.message, request_id);
            self.events.lock().unwrap().push(entry);
        }
    }

    /// Routes whose handler logs, and whose bodies stream many chunks or fail half-way.
    fn streaming_app() -> Router {
        let chunks = |n: usize, fail: bool| {
            futures::stream::unfold(0, move |sent| async move {
                tokio::task::yield_now().await;
                match sent {
                    _ if sent < n => Some((Ok(bytes::Bytes::from("chunk ")), sent + 1)),
                    _ if sent == n && fail => {
                        Some((Err(std::io::Error::other("upstream cut")), sent + 1))
                    }
                    _ => None,
                }
            })
        };
        let router = Router::new()
            .route(
                "/many",
                get(move || async move {
                    tracing::info!("handler ran");
                    Body::from_stream(chunks(50, false))
                }),
            )
            .route(
                "/cut",
                get(move || async move { Body::from_stream(chunks(2, true)) }),
            );
        with_request_layers(
            router,
            &ApiConfig::default(),
            Arc::new(metrics::Metrics::new()),
        )
    }

    async fn send(router: Router, path: &str) -> (String, Result<bytes::Bytes, axum::Error>) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        (
            id,
            axum::body::to_bytes(response.into_body(), 1 << 20).await,
        )
    }

    /// A recorder, this thread's subscriber until the guard drops.
    fn recording() -> (Recorder, tracing::subscriber::DefaultGuard) {
        use tracing_subscriber::layer::SubscriberExt;
        let recorder = Recorder::default();
        let subscriber = tracing_subscriber::registry().with(recorder.clone());
        (recorder, tracing::subscriber::set_default(subscriber))
    }

    /// The handler's log lines carry the request's span (its id), but a streamed body's polls do
    /// not enter it: entering costs the subscriber on every poll of every chunk.
    #[tokio::test(flavor = "current_thread")]
    async fn the_request_span_covers_the_handler_not_each_poll_of_the_body() {
        let (recorder, _guard) = recording();
        let (id, body) = send(streaming_app(), "/many").await;
        assert_eq!(body.unwrap().len(), 50 * "chunk ".len());
        let events = recorder.events.lock().unwrap().clone();
        let handler_line = events
            .iter()
            .find(|(_, message, _)| message == "handler ran");
        assert_eq!(
            handler_line.and_then(|(_, _, id)| id.as_deref()),
            Some(id.as_str())
        );
        let enters = recorder
            .request_span_enters
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            (1..10).contains(&enters),
            "the request span was entered {enters} times"
        );
    }

    /// A body that fails after its head was sent is logged once, as an error, with the request's
    /// id and the error.
    #[tokio::test(flavor = "current_thread")]
    async fn a_body_failing_after_the_head_is_logged_with_the_request_id() {
        let (recorder, _guard) = recording();
        let (id, body) = send(streaming_app(), "/cut").await;
        assert!(body.unwrap_err().to_string().contains("upstream cut"));
        let events = recorder.events.lock().unwrap().clone();
        let failures: Vec<_> = events
            .iter()
            .filter(|(_, message, _)| message == "response body failed")
            .collect();
        assert_eq!(failures.len(), 1, "{events:?}");
        assert_eq!(failures[0].0, tracing::Level::ERROR);
        assert_eq!(failures[0].2.as_deref(), Some(id.as_str()));
    }

    #[tokio::test]
    async fn a_request_over_the_deadline_is_a_504_in_the_error_shape() {
        let (status, body, _) = call(app(), "/slow").await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body["error"]["code"], "TIMEOUT");
    }
}
