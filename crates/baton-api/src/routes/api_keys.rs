//! `/api/v1/api-keys`: session tokens only (an API key cannot mint or revoke keys).

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::apikey::{ApiKeyInfo, generate_key};
use baton_store::api_keys::NewApiKey;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{PrincipalKind, SessionPrincipal};
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, PathParam};
use crate::state::AppState;

const MAX_NAME_LEN: usize = 200;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// A label to recognise the key by.
    #[serde(default)]
    pub name: Option<String>,
}

/// The new key. `apiKey` is shown here once and never again.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedApiKey {
    #[serde(flatten)]
    pub info: ApiKeyInfo,
    pub api_key: String,
}

#[utoipa::path(get, path = "/api/v1/api-keys", tag = "api-keys",
    responses(
        (status = 200, description = "The tenant's keys (never the secrets)", body = [ApiKeyInfo]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
    ))]
pub async fn list_api_keys(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
) -> ApiResult<axum::Json<Vec<ApiKeyInfo>>> {
    Ok(axum::Json(
        state.store.list_api_keys(&principal.tenant).await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/api-keys", tag = "api-keys", request_body = CreateApiKey,
    responses(
        (status = 201, description = "Created; the key is in `apiKey`, shown only now", body = CreatedApiKey),
        (status = 400, description = "Invalid name", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
    ))]
pub async fn create_api_key(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    Json(body): Json<CreateApiKey>,
) -> ApiResult<(StatusCode, axum::Json<CreatedApiKey>)> {
    let name = body.name.map(|n| n.trim().to_string()).unwrap_or_default();
    if name.chars().count() > MAX_NAME_LEN || name.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "name",
            format!("name must be at most {MAX_NAME_LEN} printable characters"),
        ));
    }
    let name = if name.is_empty() {
        "API key".to_string()
    } else {
        name
    };
    let key = generate_key().map_err(|e| ApiError::Internal(e.to_string()))?;
    let created_by = match &principal.kind {
        PrincipalKind::Session { user_id } => Some(user_id.as_str()),
        PrincipalKind::ApiKey { .. } => None,
    };
    let info = state
        .store
        .create_api_key(
            &principal.tenant,
            NewApiKey {
                name: &name,
                key_hash: &key.hash,
                prefix: &key.prefix,
                created_by,
            },
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(CreatedApiKey {
            info,
            api_key: key.secret,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/api-keys/{id}", tag = "api-keys",
    params(("id" = String, Path, description = "Key id")),
    responses(
        (status = 200, description = "The key (never the secret)", body = ApiKeyInfo),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
        (status = 404, description = "No such key", body = ErrorResponse),
    ))]
pub async fn get_api_key(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<ApiKeyInfo>> {
    Ok(axum::Json(
        state.store.get_api_key(&principal.tenant, &id).await?,
    ))
}

/// Revokes the key; requests made with it get 401 from then on.
#[utoipa::path(delete, path = "/api/v1/api-keys/{id}", tag = "api-keys",
    params(("id" = String, Path, description = "Key id")),
    responses(
        (status = 200, description = "The revoked key", body = ApiKeyInfo),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
        (status = 404, description = "No such key", body = ErrorResponse),
    ))]
pub async fn revoke_api_key(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<ApiKeyInfo>> {
    let (info, hash) = state.store.revoke_api_key(&principal.tenant, &id).await?;
    state.auth.forget_key(&hash).await;
    Ok(axum::Json(info))
}
