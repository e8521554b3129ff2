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
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
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

use crate::context::RequestId;

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
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(|request: &axum::http::Request<_>| {
                        let request_id = request
                            .extensions()
                            .get::<RequestId>()
                            .map(|r| r.0.as_str())
                            .unwrap_or("");
                        // `&str` fields, recorded as they are; `%` would format each through `Display`.
                        tracing::info_span!(
                            "request",
                            method = request.method().as_str(),
                            path = request.uri().path(),
                            request_id
                        )
                    })
                    .on_failure(body_failed),
            )
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

/// tower-http's failure hook, for what the request context cannot see: a response body that
/// failed after its head was sent. An error status is logged once, by the request context,
/// with its code (tower-http's default logged it a second time).
fn body_failed(failure: ServerErrorsFailureClass, latency: std::time::Duration, _: &tracing::Span) {
    if let ServerErrorsFailureClass::Error(error) = failure {
        tracing::error!(%error, latency_ms = latency.as_millis(), "response body failed");
    }
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

    /// Counts ERROR events.
    struct ErrorCount(Arc<std::sync::atomic::AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ErrorCount {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if *event.metadata().level() == tracing::Level::ERROR {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_error_is_logged_once() {
        use tracing_subscriber::layer::SubscriberExt;
        let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(ErrorCount(errors.clone()));
        let _guard = tracing::subscriber::set_default(subscriber);
        let (status, _, _) = call(app(), "/panic").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(errors.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_request_over_the_deadline_is_a_504_in_the_error_shape() {
        let (status, body, _) = call(app(), "/slow").await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body["error"]["code"], "TIMEOUT");
    }
}
