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
        (status = 409, description = "The alias is taken (ALREADY_EXISTS), or the renamed alias is named by the tenant's defaultModel, a flow's classifierModel or a template of an active version (IN_USE)", body = ErrorResponse),
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
        not_in_use(&state, &principal, &current).await?;
    }
    let updated = state
        .store
        .update_routing_rule(&principal.tenant, &id, &rule)
        .await?;
    state.forget_routing_rules(&principal.tenant).await;
    Ok(axum::Json(updated))
}

/// An alias something of the tenant names stays while it does: removing it (or renaming it)
/// would fail every run that reaches that name, as an unknown name saved there would. What
/// counts: the tenant's `defaultModel`, a flow's `classifierModel`, and the `llm` or a
/// fallback of a template in a version active in some environment (a draft is checked again
/// when it is activated; an old version when it is activated again).
async fn not_in_use(state: &AppState, principal: &Principal, rule: &RoutingRule) -> ApiResult<()> {
    let alias = rule.alias.as_str();
    let in_use = |user: String| ApiError::Conflict {
        code: "IN_USE",
        message: format!("routing alias '{alias}' is {user}: change that first"),
    };
    let settings = state.store.tenant_settings(&principal.tenant).await?;
    if settings.settings.default_model.as_deref() == Some(alias) {
        return Err(in_use("the tenant's defaultModel".into()));
    }
    for flow in state.store.list_flows(&principal.tenant).await? {
        if flow.classifier_model.as_deref().map(str::trim) == Some(alias) {
            return Err(in_use(format!(
                "the classifierModel of flow '{}'",
                flow.name
            )));
        }
        let mut active: Vec<(&String, &String)> = flow.active_versions.iter().collect();
        active.sort_by_key(|(_, version)| *version);
        active.dedup_by_key(|(_, version)| *version);
        for (environment, version_id) in active {
            let version = state
                .store
                .get_version(&principal.tenant, &flow.id, version_id)
                .await?;
            for template in &version.templates {
                let names = template.llm.iter().chain(&template.fallbacks);
                if names.into_iter().any(|name| name.trim() == alias) {
                    return Err(in_use(format!(
                        "named by template '{}' of flow '{}' version {} (active in '{environment}')",
                        template.name, flow.name, version.number
                    )));
                }
            }
        }
    }
    Ok(())
}

#[utoipa::path(delete, path = "/api/v1/routing-rules/{id}", tag = "routing",
    params(("id" = String, Path, description = "Rule id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such rule", body = ErrorResponse),
        (status = 409, description = "The tenant's defaultModel, a flow's classifierModel or a template of an active version names it (IN_USE)", body = ErrorResponse),
    ))]
pub async fn delete_routing_rule(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<StatusCode> {
    let current = state.store.get_routing_rule(&principal.tenant, &id).await?;
    not_in_use(&state, &principal, &current).await?;
    state
        .store
        .delete_routing_rule(&principal.tenant, &id)
        .await?;
    state.forget_routing_rules(&principal.tenant).await;
    Ok(StatusCode::NO_CONTENT)
}
