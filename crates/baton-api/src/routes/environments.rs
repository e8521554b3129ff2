//! `/api/v1/environments`: tenant-level named environments.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::environment::{Environment, validate_environment_name};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiResult, ErrorResponse};
use crate::extract::Json;
use crate::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    /// Free-form, unique within the tenant (e.g. `production`).
    pub name: String,
}

#[utoipa::path(get, path = "/api/v1/environments", tag = "environments",
    responses(
        (status = 200, description = "The tenant's environments, oldest first", body = [Environment]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_environments(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<Environment>>> {
    Ok(axum::Json(
        state.store.list_environments(&principal.tenant).await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/environments", tag = "environments", request_body = CreateEnvironment,
    responses(
        (status = 201, description = "Created", body = Environment),
        (status = 400, description = "Invalid name", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 409, description = "An environment with this name exists", body = ErrorResponse),
    ))]
pub async fn create_environment(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<CreateEnvironment>,
) -> ApiResult<(StatusCode, axum::Json<Environment>)> {
    let name = validate_environment_name(&body.name, "name")?;
    let environment = state
        .store
        .create_environment(&principal.tenant, &name)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(environment)))
}
