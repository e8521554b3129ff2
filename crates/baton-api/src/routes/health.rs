//! Liveness and readiness probes (no authentication).

use std::time::Duration;

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct HealthStatus {
    /// `ok` or `ready`.
    pub status: &'static str,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "Alive", body = HealthStatus)))]
pub async fn healthz() -> axum::Json<HealthStatus> {
    axum::Json(HealthStatus { status: "ok" })
}

/// The process can serve: the database answers.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Ready", body = HealthStatus),
        (status = 503, description = "The database does not answer", body = ErrorResponse),
    ))]
pub async fn readyz(State(state): State<AppState>) -> ApiResult<axum::Json<HealthStatus>> {
    match tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await {
        Ok(Ok(())) => Ok(axum::Json(HealthStatus { status: "ready" })),
        _ => Err(ApiError::Unavailable),
    }
}
