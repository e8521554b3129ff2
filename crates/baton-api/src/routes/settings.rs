//! `/api/v1/settings`: the tenant's settings document.

use axum::extract::State;
use baton_domain::settings::{SettingsPatch, TenantSettings};
use baton_store::StoreError;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::Json;
use crate::routes::flows::check_model_name;
use crate::state::AppState;

/// Optimistic writes retried this often before giving up with 409.
const WRITE_ATTEMPTS: usize = 5;

#[utoipa::path(get, path = "/api/v1/settings", tag = "settings",
    responses(
        (status = 200, description = "Current settings, defaults filled in", body = TenantSettings),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn get_settings(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<TenantSettings>> {
    Ok(axum::Json(
        state
            .store
            .tenant_settings(&principal.tenant)
            .await?
            .settings,
    ))
}

/// Changes the fields given; absent fields keep their value, `null` resets a nullable one.
/// `callbackOrigins` takes an array or one text with an origin per line.
#[utoipa::path(put, path = "/api/v1/settings", tag = "settings", request_body = SettingsPatch,
    responses(
        (status = 200, description = "The settings after the change", body = TenantSettings),
        (status = 400, description = "A field is invalid; nothing was changed", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn update_settings(
    State(state): State<AppState>,
    principal: Principal,
    Json(patch): Json<SettingsPatch>,
) -> ApiResult<axum::Json<TenantSettings>> {
    // As a template's `llm` is when saved: a name no run could resolve is refused now, not by
    // every run that falls back on it.
    if let Some(Some(model)) = &patch.default_model {
        check_model_name(&state, &principal.tenant, model, "defaultModel").await?;
    }
    for _ in 0..WRITE_ATTEMPTS {
        let current = state.store.tenant_settings(&principal.tenant).await?;
        let next = current.settings.apply(patch.clone())?;
        match state
            .store
            .replace_tenant_settings(&principal.tenant, current.version, &next)
            .await
        {
            Ok(saved) => {
                state.forget_settings(&principal.tenant).await;
                return Ok(axum::Json(saved.settings));
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(other) => return Err(other.into()),
        }
    }
    Err(ApiError::Conflict {
        code: "CONFLICT",
        message: "the settings kept changing concurrently; try again".into(),
    })
}
