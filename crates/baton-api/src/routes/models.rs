//! `/api/v1/models/descriptors` and `/api/v1/providers`.

use axum::extract::State;
use baton_domain::model::ModelDescriptor;
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{PathParam, PathParams};
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

/// One entry of OpenAI's model list.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompatibleModel {
    /// `<provider>/<model>`, as requests name it.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Always 0: the catalogue keeps no release dates.
    pub created: i64,
    /// The provider key.
    pub owned_by: String,
}

/// OpenAI's `{object: "list", data}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompatibleModelList {
    /// Always `list`.
    pub object: &'static str,
    pub data: Vec<CompatibleModel>,
}

/// The models requests can name, in OpenAI's list format, so an OpenAI client's
/// `models.list()` works: the catalogue's and the operator's extra providers' models, of
/// configured providers only (a call to the others would be refused).
#[utoipa::path(get, path = "/api/v1/models", tag = "models",
    responses(
        (status = 200, description = "The models of the configured providers", body = CompatibleModelList),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_models(
    State(state): State<AppState>,
    _principal: Principal,
) -> ApiResult<axum::Json<CompatibleModelList>> {
    let providers = &state.providers;
    let data = providers
        .list()
        .into_iter()
        .filter(|p| p.configured)
        .flat_map(|p| {
            providers
                .models_of(&p.key)
                .into_iter()
                .map(move |id| CompatibleModel {
                    id,
                    object: "model",
                    created: 0,
                    owned_by: p.key.clone(),
                })
        })
        .collect();
    Ok(axum::Json(CompatibleModelList {
        object: "list",
        data,
    }))
}

/// One model of [`list_models`], so an OpenAI client's `models.retrieve()` works. The SDK
/// sends the id's `/` percent-encoded (`openai%2Fgpt-4o-mini`); the unencoded form is served by
/// [`retrieve_provider_model`].
#[utoipa::path(get, path = "/api/v1/models/{model}", tag = "models",
    params(("model" = String, Path, pattern = "^[a-z0-9-]+%2F[A-Za-z0-9._:-]+$", description = "`<provider>/<model>`, its `/` percent-encoded")),
    responses(
        (status = 200, description = "The model", body = CompatibleModel),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "Not a model of a configured provider (MODEL_NOT_FOUND)", body = ErrorResponse),
    ))]
pub async fn retrieve_model(
    State(state): State<AppState>,
    _principal: Principal,
    PathParam(model): PathParam,
) -> ApiResult<axum::Json<CompatibleModel>> {
    compatible_model(&state, &model).map(axum::Json)
}

/// [`retrieve_model`] with the id's `/` as it is.
#[utoipa::path(get, path = "/api/v1/models/{provider}/{model}", tag = "models",
    params(
        ("provider" = String, Path, description = "Provider key"),
        ("model" = String, Path, description = "Model name"),
    ),
    responses(
        (status = 200, description = "The model", body = CompatibleModel),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "Not a model of a configured provider (MODEL_NOT_FOUND)", body = ErrorResponse),
    ))]
pub async fn retrieve_provider_model(
    State(state): State<AppState>,
    _principal: Principal,
    PathParams((provider, model)): PathParams<(String, String)>,
) -> ApiResult<axum::Json<CompatibleModel>> {
    compatible_model(&state, &format!("{provider}/{model}")).map(axum::Json)
}

fn compatible_model(state: &AppState, id: &str) -> ApiResult<CompatibleModel> {
    let providers = &state.providers;
    let provider = id.split_once('/').map(|(provider, _)| provider);
    let listed = provider.is_some_and(|key| {
        providers
            .list()
            .iter()
            .any(|p| p.key == key && p.configured)
            && providers.models_of(key).iter().any(|m| m == id)
    });
    match (listed, provider) {
        (true, Some(key)) => Ok(CompatibleModel {
            id: id.to_string(),
            object: "model",
            created: 0,
            owned_by: key.to_string(),
        }),
        _ => Err(ApiError::Status {
            status: axum::http::StatusCode::NOT_FOUND,
            code: "MODEL_NOT_FOUND",
            message: format!("model '{id}' is not one of the configured providers' models"),
        }),
    }
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
