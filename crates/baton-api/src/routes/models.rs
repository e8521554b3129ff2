//! `/api/v1/models/descriptors` and `/api/v1/providers`.

use axum::extract::State;
use baton_domain::model::ModelDescriptor;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiResult, ErrorResponse};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSummary {
    /// The key used in model names (`openai/...`).
    pub key: String,
    /// Credentials are set, so calls can be made.
    pub configured: bool,
    /// One of the seven built-in providers, rather than an operator-declared compatible one.
    pub built_in: bool,
    /// Models known to be served, as `<provider>/<model>`; others are still passed on.
    pub models: Vec<String>,
}

/// Every model of the catalogue with limits, prices (credits per million tokens) and capabilities.
#[utoipa::path(get, path = "/api/v1/models/descriptors", tag = "models",
    responses(
        (status = 200, description = "The catalogue", body = [ModelDescriptor]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_descriptors(
    State(state): State<AppState>,
    _principal: Principal,
) -> ApiResult<axum::Json<Vec<ModelDescriptor>>> {
    Ok(axum::Json(state.providers.catalogue().models().to_vec()))
}

#[utoipa::path(get, path = "/api/v1/providers", tag = "models",
    responses(
        (status = 200, description = "Providers and whether they are configured", body = [ProviderSummary]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_providers(
    State(state): State<AppState>,
    _principal: Principal,
) -> ApiResult<axum::Json<Vec<ProviderSummary>>> {
    let providers = &state.providers;
    Ok(axum::Json(
        providers
            .list()
            .into_iter()
            .map(|p| ProviderSummary {
                models: providers.models_of(&p.key),
                key: p.key,
                configured: p.configured,
                built_in: p.built_in,
            })
            .collect(),
    ))
}
