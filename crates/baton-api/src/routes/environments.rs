//! `/api/v1/environments`: tenant-level named environments.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::environment::{Environment, validate_environment_name};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, Query};
use crate::routes::flows::{activation_comment, known_environment};
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

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    pub source_environment: String,
    pub target_environment: String,
}

/// One flow's versions in the two environments.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowDiff {
    pub flow_id: String,
    pub flow_name: String,
    pub title: String,
    pub source_version_id: Option<String>,
    pub target_version_id: Option<String>,
    /// Both environments run the same version.
    pub same: bool,
}

/// Flows active in either environment, with their current version in each.
#[utoipa::path(get, path = "/api/v1/environments/diff", tag = "environments", params(DiffQuery),
    responses(
        (status = 200, description = "One row per flow active in either environment", body = [FlowDiff]),
        (status = 400, description = "Unknown environment", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn diff_environments(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<DiffQuery>,
) -> ApiResult<axum::Json<Vec<FlowDiff>>> {
    let source = known_environment(&state, &principal, &query.source_environment)
        .await
        .map_err(|e| rename_param(e, "sourceEnvironment"))?;
    let target = known_environment(&state, &principal, &query.target_environment)
        .await
        .map_err(|e| rename_param(e, "targetEnvironment"))?;
    let flows = state.store.list_flows(&principal.tenant).await?;
    Ok(axum::Json(
        flows
            .into_iter()
            .filter_map(|flow| {
                let source_version_id = flow.active_versions.get(&source).cloned();
                let target_version_id = flow.active_versions.get(&target).cloned();
                (source_version_id.is_some() || target_version_id.is_some()).then(|| FlowDiff {
                    same: source_version_id == target_version_id,
                    flow_id: flow.id,
                    flow_name: flow.name,
                    title: flow.title,
                    source_version_id,
                    target_version_id,
                })
            })
            .collect(),
    ))
}

fn rename_param(error: ApiError, param: &str) -> ApiError {
    match error {
        ApiError::Invalid { code, message, .. } => ApiError::Invalid {
            code,
            message,
            param: Some(param.to_string()),
        },
        other => other,
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromoteBody {
    pub source_environment: String,
    pub target_environment: String,
    /// Flows (ids or slugs) to promote; default: every flow active in the source.
    #[serde(default)]
    pub flow_ids: Option<Vec<String>>,
    #[serde(default)]
    pub comment: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Promoted {
    pub flow_id: String,
    pub flow_name: String,
    pub version_id: String,
}

/// Activates, in the target environment, each flow's version of the source environment. Every
/// named flow is checked before any is changed.
#[utoipa::path(post, path = "/api/v1/environments/promote", tag = "environments", request_body = PromoteBody,
    responses(
        (status = 200, description = "The flows promoted", body = [Promoted]),
        (status = 400, description = "Unknown environment, or a flow not active in the source", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "A named flow does not exist", body = ErrorResponse),
    ))]
pub async fn promote_environment(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<PromoteBody>,
) -> ApiResult<axum::Json<Vec<Promoted>>> {
    let source = known_environment(&state, &principal, &body.source_environment)
        .await
        .map_err(|e| rename_param(e, "sourceEnvironment"))?;
    let target = known_environment(&state, &principal, &body.target_environment)
        .await
        .map_err(|e| rename_param(e, "targetEnvironment"))?;
    if source == target {
        return Err(ApiError::validation(
            "targetEnvironment",
            "source and target environments are the same",
        ));
    }
    let comment = activation_comment(body.comment.as_deref())?;
    let flows = match &body.flow_ids {
        None => state
            .store
            .list_flows(&principal.tenant)
            .await?
            .into_iter()
            .filter(|f| f.active_versions.contains_key(&source))
            .collect::<Vec<_>>(),
        Some(ids) => {
            let mut named: Vec<baton_domain::flow::Flow> = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                let flow = state.store.get_flow(&principal.tenant, id).await?.flow;
                if !flow.active_versions.contains_key(&source) {
                    return Err(ApiError::validation(
                        format!("flowIds[{i}]"),
                        format!("flow '{}' has no version active in '{source}'", flow.name),
                    ));
                }
                // Named twice (by id and slug, say): promoted once.
                if named.iter().any(|f| f.id == flow.id) {
                    continue;
                }
                named.push(flow);
            }
            named
        }
    };
    let mut promoted = Vec::with_capacity(flows.len());
    for flow in flows {
        let Some(version_id) = flow.active_versions.get(&source).cloned() else {
            continue;
        };
        let activated = state
            .store
            .activate_version(
                &principal.tenant,
                &flow.id,
                &version_id,
                &target,
                comment,
                &principal.actor(),
            )
            .await;
        // Runs resolve flows through the engine's cache.
        state.engine.forget_flows(&principal.tenant);
        activated?;
        promoted.push(Promoted {
            flow_id: flow.id,
            flow_name: flow.name,
            version_id,
        });
    }
    Ok(axum::Json(promoted))
}
