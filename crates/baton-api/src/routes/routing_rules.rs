//! `/api/v1/routing-rules`: tenant aliases over model chains (SPEC.md "Routing rule"). An alias
//! works wherever a model name is accepted; see `baton_providers::routing` for resolution.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::routing::{RoutingRule, RoutingRuleInput, ValidRule};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, PathParam};
use crate::state::AppState;

/// Every model must be one Baton can send to: its provider known, and the model in the catalogue,
/// in an extra provider's list, or served by a configured provider (which may know newer models
/// than the catalogue).
fn check_models(state: &AppState, rule: &ValidRule) -> ApiResult<()> {
    let registry = &state.providers;
    for (i, model) in rule.models.iter().enumerate() {
        let param = format!("models[{i}]");
        if !registry.is_known(&model.provider) {
            return Err(ApiError::validation(
                param,
                format!(
                    "unknown provider '{}' in '{model}' (an alias cannot name another alias)",
                    model.provider
                ),
            ));
        }
        let known = match &model.model {
            None => registry
                .catalogue()
                .default_model(&model.provider)
                .is_some(),
            Some(name) => {
                registry.catalogue().get(&model.provider, name).is_some()
                    || registry.is_configured(&model.provider)
                    || registry
                        .models_of(&model.provider)
                        .iter()
                        .any(|m| *m == model.to_string())
            }
        };
        if !known {
            return Err(ApiError::validation(
                param,
                format!(
                    "'{model}' is not in the model catalogue and provider '{}' is not configured",
                    model.provider
                ),
            ));
        }
    }
    Ok(())
}

fn validate(state: &AppState, body: RoutingRuleInput) -> ApiResult<ValidRule> {
    let rule = body.validate()?;
    check_models(state, &rule)?;
    Ok(rule)
}

#[utoipa::path(get, path = "/api/v1/routing-rules", tag = "routing",
    responses(
        (status = 200, description = "The tenant's rules by alias", body = [RoutingRule]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_routing_rules(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<RoutingRule>>> {
    Ok(axum::Json(
        state.store.list_routing_rules(&principal.tenant).await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/routing-rules", tag = "routing", request_body = RoutingRuleInput,
    responses(
        (status = 201, description = "Created", body = RoutingRule),
        (status = 400, description = "Invalid field or unknown model", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 409, description = "The alias is taken", body = ErrorResponse),
    ))]
pub async fn create_routing_rule(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<RoutingRuleInput>,
) -> ApiResult<(StatusCode, axum::Json<RoutingRule>)> {
    let rule = validate(&state, body)?;
    let created = state
        .store
        .create_routing_rule(&principal.tenant, &rule)
        .await?;
    state.forget_routing_rules(&principal.tenant).await;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

#[utoipa::path(get, path = "/api/v1/routing-rules/{id}", tag = "routing",
    params(("id" = String, Path, description = "Rule id")),
    responses(
        (status = 200, description = "The rule", body = RoutingRule),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such rule", body = ErrorResponse),
    ))]
pub async fn get_routing_rule(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<RoutingRule>> {
    Ok(axum::Json(
        state.store.get_routing_rule(&principal.tenant, &id).await?,
    ))
}

/// Replaces the rule: every field as in a create.
#[utoipa::path(put, path = "/api/v1/routing-rules/{id}", tag = "routing", request_body = RoutingRuleInput,
    params(("id" = String, Path, description = "Rule id")),
    responses(
        (status = 200, description = "The rule after the change", body = RoutingRule),
        (status = 400, description = "Invalid field or unknown model", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such rule", body = ErrorResponse),
        (status = 409, description = "The alias is taken (ALREADY_EXISTS), or the renamed alias is the tenant's defaultModel (IN_USE)", body = ErrorResponse),
    ))]
pub async fn update_routing_rule(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Json(body): Json<RoutingRuleInput>,
) -> ApiResult<axum::Json<RoutingRule>> {
    let rule = validate(&state, body)?;
    let current = state.store.get_routing_rule(&principal.tenant, &id).await?;
    if current.alias != rule.alias {
        not_the_default_model(&state, &principal, &current).await?;
    }
    let updated = state
        .store
        .update_routing_rule(&principal.tenant, &id, &rule)
        .await?;
    state.forget_routing_rules(&principal.tenant).await;
    Ok(axum::Json(updated))
}

/// An alias the tenant's `defaultModel` names stays while it does: removing it (or renaming it)
/// would fail every run that falls back on the default, as an unknown name saved there would.
async fn not_the_default_model(
    state: &AppState,
    principal: &Principal,
    rule: &RoutingRule,
) -> ApiResult<()> {
    let settings = state.store.tenant_settings(&principal.tenant).await?;
    if settings.settings.default_model.as_deref() == Some(rule.alias.as_str()) {
        return Err(ApiError::Conflict {
            code: "IN_USE",
            message: format!(
                "routing alias '{}' is the tenant's defaultModel: change the setting first",
                rule.alias
            ),
        });
    }
    Ok(())
}

#[utoipa::path(delete, path = "/api/v1/routing-rules/{id}", tag = "routing",
    params(("id" = String, Path, description = "Rule id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such rule", body = ErrorResponse),
        (status = 409, description = "The tenant's defaultModel names it (IN_USE)", body = ErrorResponse),
    ))]
pub async fn delete_routing_rule(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<StatusCode> {
    let current = state.store.get_routing_rule(&principal.tenant, &id).await?;
    not_the_default_model(&state, &principal, &current).await?;
    state
        .store
        .delete_routing_rule(&principal.tenant, &id)
        .await?;
    state.forget_routing_rules(&principal.tenant).await;
    Ok(StatusCode::NO_CONTENT)
}
