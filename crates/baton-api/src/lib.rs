//! Baton's HTTP surface: the axum router, handlers, authentication and the OpenAPI document.
//! The only crate that knows axum; handlers parse and authorise, the store persists.

pub mod auth;
pub mod context;
pub mod error;
pub mod extract;
pub mod routes;
pub mod state;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, StatusCode, header};
use axum::{Extension, middleware};
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use axum::Router;
pub use error::{ApiError, ApiResult};
pub use routes::openapi;
pub use state::{ApiConfig, AppState};

use crate::context::RequestId;
use crate::routes::openapi::{ApiDoc, OpenApiJson};

/// Builds the whole application: routes, auth, and the layers every request passes through.
pub fn build_router(state: AppState) -> Router {
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
    router
        .with_state(state)
        .layer(Extension(OpenApiJson(doc)))
        .layer(
            ServiceBuilder::new()
                .layer(SetSensitiveRequestHeadersLayer::new([
                    header::AUTHORIZATION,
                    header::COOKIE,
                    HeaderName::from_static("x-baton-callback-token"),
                ]))
                .layer(middleware::from_fn(context::request_context))
                .layer(TraceLayer::new_for_http().make_span_with(|request: &axum::http::Request<_>| {
                    let request_id = request.extensions().get::<RequestId>().map(|r| r.0.as_str()).unwrap_or("");
                    tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id)
                }))
                .layer(CatchPanicLayer::custom(context::panic_response))
                .layer(TimeoutLayer::with_status_code(StatusCode::GATEWAY_TIMEOUT, config.request_timeout))
                .layer(DefaultBodyLimit::max(config.max_body_bytes)),
        )
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
