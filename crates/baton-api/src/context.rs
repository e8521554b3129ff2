//! Per-request context: the request id, error rendering and the one log line per error.

use std::any::Any;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use tracing::Instrument as _;

use crate::error::ApiError;
use crate::metrics::{Metrics, RequestTimer};

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The id of the current request, as returned in `X-Request-Id`.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Outermost middleware: gives every request an id, returns it in `X-Request-Id`, counts and
/// times it in `metrics`, runs its handler inside the `request` span, renders any error into the
/// DESIGN.md body and logs it once, and logs a response body that fails after its head was sent.
pub async fn request_context(
    State(metrics): State<Arc<Metrics>>,
    mut request: Request,
    next: Next,
) -> Response {
    let timer = RequestTimer::start(&request);
    let started = timer.started();
    // Ids are always made here: a client-chosen id could collide with a stored run's id.
    let request_id = uuid::Uuid::now_v7().to_string();
    request
        .extensions_mut()
        .insert(RequestId(request_id.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_string();

    // The span covers the handler, not the response body: a stream's body is polled a few
    // times a chunk, and entering a span costs the subscriber ~400 instructions each time
    // (tower-http's `TraceLayer` entered it on every poll: ~62k instructions a streamed
    // request, `docs/performance.md`, round 30).
    let span = tracing::info_span!(
        "request",
        method = method.as_str(),
        path = path.as_str(),
        request_id = request_id.as_str()
    );
    let mut response = next.run(request).instrument(span).await;
    timer.finish(&metrics, &response);

    if let Some(error) = response.extensions_mut().remove::<ApiError>() {
        log_error(&error, &method, &path, &request_id);
        response = error.render(&request_id);
    } else if (response.status().is_client_error() || response.status().is_server_error())
        && !is_json(&response)
    {
        // An error made below our handlers (router 404/405, body limit, timeout).
        let error = ApiError::from_status(response.status());
        log_error(&error, &method, &path, &request_id);
        response = error.render(&request_id);
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(X_REQUEST_ID.clone(), value);
    }
    response.map(move |body| {
        Body::new(body.map_err(move |error| {
            // The head is sent, so the client sees a cut connection; the operator sees why.
            let latency_ms = started.elapsed().as_millis();
            tracing::error!(%request_id, %method, path, %error, latency_ms, "response body failed");
            error
        }))
    })
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

fn log_error(error: &ApiError, method: &axum::http::Method, path: &str, request_id: &str) {
    let status = error.status().as_u16();
    if status >= 500 {
        tracing::error!(%request_id, %method, path, status, code = error.code(), error = %error, "request failed");
    } else {
        tracing::debug!(%request_id, %method, path, status, code = error.code(), error = %error, "request rejected");
    }
}

/// Turns a handler panic into a 500 in the error shape (the panic message is logged, not sent).
pub fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
    let detail = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".to_string());
    ApiError::Internal(format!("handler panicked: {detail}")).into_response()
}
