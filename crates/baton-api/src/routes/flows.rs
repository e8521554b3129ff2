//! `/api/v1/flows`: flows, versions, templates and activation (SPEC.md "Flows and versions",
//! DESIGN.md "Paths the spec does not show"). `{flowId}` is the id or the slug.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::flow::{
    ActivateVersion, ExecutionMode, Flow, FlowPatch, NewFlow, Template, TemplateInput, Version,
    validate_title,
};
use baton_template::{Field, Library, Parameter, ParameterSource};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, NoBody, PathParam, PathParams, Query};
use crate::state::AppState;

#[utoipa::path(get, path = "/api/v1/flows", tag = "flows",
    responses(
        (status = 200, description = "The tenant's flows, oldest first", body = [Flow]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_flows(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<Flow>>> {
    Ok(axum::Json(state.store.list_flows(&principal.tenant).await?))
}

/// Creates the flow (slug from the title) with a first version holding the `main` template.
#[utoipa::path(post, path = "/api/v1/flows", tag = "flows", request_body = NewFlow,
    responses(
        (status = 201, description = "Created", body = Flow),
        (status = 400, description = "Invalid title", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn create_flow(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<NewFlow>,
) -> ApiResult<(StatusCode, axum::Json<Flow>)> {
    let title = validate_title(&body.title)?;
    let flow = state.store.create_flow(&principal.tenant, &title).await?;
    Ok((StatusCode::CREATED, axum::Json(flow)))
}

#[utoipa::path(get, path = "/api/v1/flows/{flowId}", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug")),
    responses(
        (status = 200, description = "The flow", body = Flow),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn get_flow(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
) -> ApiResult<axum::Json<Flow>> {
    Ok(axum::Json(
        state.store.get_flow(&principal.tenant, &flow).await?.flow,
    ))
}

/// Changes `title`, `executionMode` and `classifierModel`; absent fields stay.
#[utoipa::path(put, path = "/api/v1/flows/{flowId}", tag = "flows", request_body = FlowPatch,
    params(("flowId" = String, Path, description = "Flow id or slug")),
    responses(
        (status = 200, description = "The flow after the change", body = Flow),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn update_flow(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    Json(patch): Json<FlowPatch>,
) -> ApiResult<axum::Json<Flow>> {
    let patch = patch.validate()?;
    if let Some(Some(model)) = &patch.classifier_model {
        check_model_name(&state, &principal.tenant, model, "classifierModel").await?;
    }
    let updated = state
        .store
        .update_flow(&principal.tenant, &flow, &patch)
        .await;
    // Runs resolve flows through the engine's cache (a rename changes the name it is found by).
    state.engine.forget_flows(&principal.tenant);
    Ok(axum::Json(updated?))
}

/// Soft delete: the flow leaves lists and can no longer run; its id and slug answer 404.
#[utoipa::path(delete, path = "/api/v1/flows/{flowId}", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn delete_flow(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
) -> ApiResult<StatusCode> {
    let deleted = state.store.delete_flow(&principal.tenant, &flow).await;
    state.engine.forget_flows(&principal.tenant);
    deleted?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/flows/{flowId}/versions", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug")),
    responses(
        (status = 200, description = "Versions with their templates, oldest first", body = [Version]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn list_versions(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
) -> ApiResult<axum::Json<Vec<Version>>> {
    Ok(axum::Json(
        state.store.list_versions(&principal.tenant, &flow).await?,
    ))
}

/// A new, empty draft.
#[utoipa::path(post, path = "/api/v1/flows/{flowId}/versions", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug")),
    responses(
        (status = 400, description = "A body other than none, {} or null (the operation takes none)", body = ErrorResponse),
        (status = 201, description = "The new draft", body = Version),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn create_version(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    _: NoBody,
) -> ApiResult<(StatusCode, axum::Json<Version>)> {
    let version = state
        .store
        .create_version(&principal.tenant, &flow, None)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(version)))
}

#[utoipa::path(get, path = "/api/v1/flows/{flowId}/versions/{versionId}", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug"), ("versionId" = String, Path, description = "Version id")),
    responses(
        (status = 200, description = "The version with its templates and activations", body = Version),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow or version", body = ErrorResponse),
    ))]
pub async fn get_version(
    State(state): State<AppState>,
    principal: Principal,
    PathParams((flow, version)): PathParams<(String, String)>,
) -> ApiResult<axum::Json<Version>> {
    Ok(axum::Json(
        state
            .store
            .get_version(&principal.tenant, &flow, &version)
            .await?,
    ))
}

/// A new draft holding a copy of the version's templates; the source is unchanged.
#[utoipa::path(post, path = "/api/v1/flows/{flowId}/versions/{versionId}/fork", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug"), ("versionId" = String, Path, description = "Version to copy")),
    responses(
        (status = 400, description = "A body other than none, {} or null (the operation takes none)", body = ErrorResponse),
        (status = 201, description = "The new draft", body = Version),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow or version", body = ErrorResponse),
    ))]
pub async fn fork_version(
    State(state): State<AppState>,
    principal: Principal,
    PathParams((flow, version)): PathParams<(String, String)>,
    _: NoBody,
) -> ApiResult<(StatusCode, axum::Json<Version>)> {
    let forked = state
        .store
        .create_version(&principal.tenant, &flow, Some(&version))
        .await?;
    Ok((StatusCode::CREATED, axum::Json(forked)))
}

/// Pins the version to an environment; the version becomes read-only.
#[utoipa::path(post, path = "/api/v1/flows/{flowId}/versions/{versionId}/environments", tag = "flows",
    request_body = ActivateVersion,
    params(("flowId" = String, Path, description = "Flow id or slug"), ("versionId" = String, Path, description = "Version id")),
    responses(
        (status = 200, description = "The version, now activated", body = Version),
        (status = 400, description = "Unknown environment or an invalid template", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow or version", body = ErrorResponse),
    ))]
pub async fn activate_version(
    State(state): State<AppState>,
    principal: Principal,
    PathParams((flow, version)): PathParams<(String, String)>,
    Json(body): Json<ActivateVersion>,
) -> ApiResult<axum::Json<Version>> {
    let environment = known_environment(&state, &principal, &body.environment).await?;
    let draft = state
        .store
        .get_version(&principal.tenant, &flow, &version)
        .await?;
    // What runs must compile: the entrypoint exists and no template includes itself.
    if draft.template(&draft.entrypoint).is_none() {
        return Err(ApiError::validation(
            "versionId",
            format!(
                "the version has no '{}' template (its entrypoint) to run",
                draft.entrypoint
            ),
        ));
    }
    let flow_record = state.store.get_flow(&principal.tenant, &flow).await?.flow;
    check_runnable(
        &draft.templates,
        &draft.entrypoint,
        flow_record.execution_mode,
        "versionId",
    )?;
    // A model a template names may have gone since it was saved (a routing alias deleted):
    // refused here rather than failing every run of the environment.
    for template in &draft.templates {
        let fallbacks = template.fallbacks.iter().enumerate();
        let named = template.llm.iter().map(|name| ("llm".to_string(), name));
        let named = named.chain(fallbacks.map(|(i, name)| (format!("fallbacks[{i}]"), name)));
        for (field, name) in named {
            if let Err(error) = check_model_name(&state, &principal.tenant, name, &field).await {
                return Err(match error {
                    ApiError::Invalid { code, message, .. } => ApiError::Invalid {
                        code,
                        message: format!("template '{}' {field}: {message}", template.name),
                        param: Some("versionId".into()),
                    },
                    other => other,
                });
            }
        }
    }
    let comment = activation_comment(body.comment.as_deref())?;
    let activated = state
        .store
        .activate_version(
            &principal.tenant,
            &flow,
            &version,
            &environment,
            comment,
            &principal.actor(),
        )
        .await;
    state.engine.forget_flows(&principal.tenant);
    Ok(axum::Json(activated?))
}

/// A version about to be activated must be able to run: its templates compile, and its
/// entrypoint renders to something with no parameters given (it would fail every run), unless a
/// Route classifier picks among described templates (the entrypoint then runs only when it
/// names none). Errors name `param`.
pub(crate) fn check_runnable(
    templates: &[Template],
    entrypoint: &str,
    mode: baton_domain::flow::ExecutionMode,
    param: &str,
) -> ApiResult<()> {
    let library = compile(templates)?;
    let routed = mode == baton_domain::flow::ExecutionMode::Route
        && templates.iter().filter(|t| t.description.is_some()).count() >= 2;
    let rendered = library
        .render(entrypoint, &std::collections::HashMap::new())
        .map_err(|e| ApiError::validation(param, e.to_string()))?;
    if !routed
        && rendered.system.trim().is_empty()
        && rendered.user.as_deref().is_none_or(|u| u.trim().is_empty())
    {
        return Err(ApiError::validation(
            param,
            format!(
                "the entrypoint '{entrypoint}' renders to nothing to send: give it a template or userTemplate first"
            ),
        ));
    }
    Ok(())
}

/// Longest activation or promotion comment.
const MAX_COMMENT_CHARS: usize = 2_000;

/// An activation's or promotion's comment, trimmed; blank is none.
pub(crate) fn activation_comment(raw: Option<&str>) -> ApiResult<Option<&str>> {
    let comment = raw.map(str::trim).filter(|c| !c.is_empty());
    if let Some(comment) = comment
        && comment.chars().count() > MAX_COMMENT_CHARS
    {
        return Err(ApiError::validation(
            "comment",
            format!("comment is longer than {MAX_COMMENT_CHARS} characters"),
        ));
    }
    Ok(comment)
}

/// The environment must exist (`POST /api/v1/environments`); its stored spelling is returned.
pub(crate) async fn known_environment(
    state: &AppState,
    principal: &Principal,
    name: &str,
) -> ApiResult<String> {
    let name = baton_domain::environment::validate_environment_name(name, "environment")?;
    match state
        .store
        .find_environment(&principal.tenant, &name)
        .await?
    {
        Some(environment) => Ok(environment.name),
        None => Err(ApiError::validation(
            "environment",
            format!(
                "environment '{name}' does not exist: create it with POST /api/v1/environments"
            ),
        )),
    }
}

/// Compiles a version's templates; a syntax error or a cycle is a 400 naming the template.
pub(crate) fn compile(templates: &[Template]) -> ApiResult<Library> {
    Ok(baton_executor::engine::compile(templates)?)
}

#[utoipa::path(get, path = "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug"), ("versionId" = String, Path, description = "Version id"), ("name" = String, Path, description = "Template name")),
    responses(
        (status = 200, description = "The template", body = Template),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow, version or template", body = ErrorResponse),
    ))]
pub async fn get_template(
    State(state): State<AppState>,
    principal: Principal,
    PathParams((flow, version, name)): PathParams<(String, String, String)>,
) -> ApiResult<axum::Json<Template>> {
    let version = state
        .store
        .get_version(&principal.tenant, &flow, &version)
        .await?;
    version
        .templates
        .into_iter()
        .find(|t| t.name == name)
        .map(axum::Json)
        .ok_or_else(|| ApiError::NotFound(format!("template '{name}' not found")))
}

/// Every id in `toolIds` must name a tool of the same tenant.
/// What saving a template checks but its tool ids (which an import maps first): every field,
/// the texts' syntax, the response schema, and its models. Errors name `{prefix}{field}`.
pub(crate) async fn check_template(
    state: &AppState,
    tenant: &baton_domain::TenantId,
    input: TemplateInput,
    name: &str,
    prefix: &str,
) -> ApiResult<Template> {
    let at = |field: &str| format!("{prefix}{field}");
    let template = input.validate(name).map_err(|e| {
        let baton_domain::DomainError::Validation { param, message } = e;
        ApiError::validation(at(&param), message)
    })?;
    baton_template::validate_text(&template.template, Field::Template)
        .map_err(|e| ApiError::validation(at("template"), e.to_string()))?;
    if let Some(user) = &template.user_template {
        baton_template::validate_text(user, Field::UserTemplate)
            .map_err(|e| ApiError::validation(at("userTemplate"), e.to_string()))?;
    }
    if let Some(schema) = &template.response_schema {
        baton_providers::structured::OutputSchema::compile(schema)
            .map_err(|e| ApiError::validation(at("responseSchema"), e))?;
    }
    if let Some(llm) = &template.llm {
        check_model_name(state, tenant, llm, &at("llm")).await?;
    }
    for (i, fallback) in template.fallbacks.iter().enumerate() {
        check_model_name(state, tenant, fallback, &at(&format!("fallbacks[{i}]"))).await?;
    }
    Ok(template)
}

async fn check_tool_ids(
    state: &AppState,
    tenant: &baton_domain::TenantId,
    ids: &[String],
) -> ApiResult<()> {
    let found = state.store.tools_by_ids(tenant, ids).await?;
    if let Some((i, id)) = ids
        .iter()
        .enumerate()
        .find(|(_, id)| !found.iter().any(|t| &t.id == *id))
    {
        return Err(ApiError::validation(
            format!("toolIds[{i}]"),
            format!("toolIds[{i}] names no tool of this tenant: '{id}'"),
        ));
    }
    Ok(())
}

/// Creates or replaces a template of a draft (409 `VERSION_ACTIVATED` once activated). The text
/// is checked: `[[Bad-Name]]` and templates including themselves are refused.
#[utoipa::path(put, path = "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}", tag = "flows",
    request_body = TemplateInput,
    params(("flowId" = String, Path, description = "Flow id or slug"), ("versionId" = String, Path, description = "Version id"), ("name" = String, Path, description = "Template name")),
    responses(
        (status = 200, description = "Replaced", body = Template),
        (status = 201, description = "Created", body = Template),
        (status = 400, description = "Invalid field or template text", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow or version", body = ErrorResponse),
        (status = 409, description = "The version is activated", body = ErrorResponse),
    ))]
pub async fn put_template(
    State(state): State<AppState>,
    principal: Principal,
    PathParams((flow, version, name)): PathParams<(String, String, String)>,
    Json(body): Json<TemplateInput>,
) -> ApiResult<(StatusCode, axum::Json<Template>)> {
    let template = check_template(&state, &principal.tenant, body, &name, "").await?;
    check_tool_ids(&state, &principal.tenant, &template.tool_ids).await?;
    // The version with this template in place must still compose without a cycle.
    let current = state
        .store
        .get_version(&principal.tenant, &flow, &version)
        .await?;
    let mut templates: Vec<Template> = current
        .templates
        .into_iter()
        .filter(|t| t.name != name)
        .collect();
    templates.push(template.clone());
    compile(&templates)?;
    let created = state
        .store
        .upsert_template(&principal.tenant, &flow, &version, &template)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(template)))
}

/// Longest model name or alias a template or flow may name (provider ids run to ~100).
const MAX_MODEL_NAME_LEN: usize = 200;

/// A model a template or flow names must be one a run can resolve: a routing alias of the
/// tenant (an alias must exist before it is named), a provider key, or `<provider>/<model>` of a
/// known provider. A typo in a fallback otherwise failed every run at its first call, however
/// healthy the primary model.
pub(crate) async fn check_model_name(
    state: &AppState,
    tenant: &baton_domain::TenantId,
    name: &str,
    param: &str,
) -> ApiResult<()> {
    let name = name.trim();
    if name.is_empty() {
        return Ok(());
    }
    if name.len() > MAX_MODEL_NAME_LEN {
        return Err(ApiError::validation(
            param,
            format!("{param} is longer than {MAX_MODEL_NAME_LEN} bytes"),
        ));
    }
    if state
        .engine
        .routing_rules(tenant)
        .await?
        .get(name)
        .is_some()
    {
        return Ok(());
    }
    baton_providers::routing::resolve::concrete(name, param, &state.providers)
        .map(|_| ())
        .map_err(|e| {
            ApiError::validation(
                param,
                format!("'{name}' is neither a routing alias of this tenant nor a model of a known provider ({e})"),
            )
        })
}

#[utoipa::path(delete, path = "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}", tag = "flows",
    params(("flowId" = String, Path, description = "Flow id or slug"), ("versionId" = String, Path, description = "Version id"), ("name" = String, Path, description = "Template name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow, version or template", body = ErrorResponse),
        (status = 409, description = "The version is activated", body = ErrorResponse),
    ))]
pub async fn delete_template(
    State(state): State<AppState>,
    principal: Principal,
    PathParams((flow, version, name)): PathParams<(String, String, String)>,
) -> ApiResult<StatusCode> {
    state
        .store
        .delete_template(&principal.tenant, &flow, &version, &name)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ParametersQuery {
    /// The environment whose version is read; default: the first activated one, else the
    /// newest version.
    pub environment: Option<String>,
}

/// The parameters a caller can supply: `[[name]]` placeholders of the template that runs (all
/// templates in Route mode), with their source and, for sub-templates, `promptTemplate`.
#[utoipa::path(get, path = "/api/v1/flows/{flowId}/parameters", tag = "flows", params(("flowId" = String, Path, description = "Flow id or slug"), ParametersQuery),
    responses(
        (status = 200, description = "Parameter discovery items", body = [Object]),
        (status = 400, description = "No version is active in that environment", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn flow_parameters(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    Query(query): Query<ParametersQuery>,
) -> ApiResult<axum::Json<Vec<DiscoveredParameter>>> {
    let found = state.store.get_flow(&principal.tenant, &flow).await?;
    // Environment names are stored trimmed (activation trims what it is given).
    let version_id = match query.environment.as_deref().map(str::trim) {
        Some(environment) => Some(
            found
                .flow
                .active_versions
                .get(environment)
                .cloned()
                .ok_or_else(|| {
                    ApiError::validation(
                        "environment",
                        format!("flow '{flow}' has no version active in '{environment}'"),
                    )
                })?,
        ),
        None => found
            .environments
            .first()
            .and_then(|e| found.flow.active_versions.get(e).cloned()),
    };
    let version = match version_id {
        Some(id) => {
            state
                .store
                .get_version(&principal.tenant, &flow, &id)
                .await?
        }
        None => state
            .store
            .list_versions(&principal.tenant, &flow)
            .await?
            .pop()
            .ok_or_else(|| ApiError::NotFound(format!("flow '{flow}' has no version")))?,
    };
    let library = compile(&version.templates)?;
    let names: Vec<&str> = match found.flow.execution_mode {
        ExecutionMode::Route => version.templates.iter().map(|t| t.name.as_str()).collect(),
        ExecutionMode::Direct => vec![version.entrypoint.as_str()],
    };
    let mut parameters: Vec<Parameter> = Vec::new();
    for name in &names {
        if version.template(name).is_none() {
            continue;
        }
        for parameter in library
            .parameters(name)
            .map_err(|e| ApiError::validation("template", e.to_string()))?
        {
            if !parameters.contains(&parameter) {
                parameters.push(parameter);
            }
        }
    }
    // External tools' URLs take `[[name]]` from the same request parameters.
    let tool_ids: Vec<String> = names
        .iter()
        .filter_map(|name| version.template(name))
        .flat_map(|t| t.tool_ids.iter().cloned())
        .collect();
    for tool in state
        .store
        .tools_by_ids(&principal.tenant, &tool_ids)
        .await?
    {
        let config = &tool.config;
        let urls = config
            .web_url
            .iter()
            .chain(config.web_urls.values())
            .chain(config.environment_overrides.values().map(|o| &o.web_url));
        for url in urls {
            let found = baton_template::discover(url, ParameterSource::ToolUrl)
                .map_err(|e| ApiError::validation("webUrl", e.to_string()))?;
            for parameter in found {
                if !parameters.iter().any(|p| p.token == parameter.token) {
                    parameters.push(parameter);
                }
            }
        }
    }
    let items = parameters
        .into_iter()
        .map(|parameter| DiscoveredParameter {
            prompt_template: parameter
                .prompt_template
                .as_deref()
                .and_then(|name| version.template(name))
                .map(|template| PromptTemplate {
                    name: template.name.clone(),
                    description: template.description.clone(),
                    template: template.template.clone(),
                    user_template: template.user_template.clone(),
                }),
            token: parameter.token,
            source: parameter.source,
        })
        .collect();
    Ok(axum::Json(items))
}

/// A parameter discovery item (SPEC.md "Parameter discovery item").
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredParameter {
    token: String,
    source: ParameterSource,
    /// The sub-template the token includes when the caller supplies no value for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_template: Option<PromptTemplate>,
}

/// The sub-template a parameter names: what a run includes in its place.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptTemplate {
    name: String,
    description: Option<String>,
    template: String,
    user_template: Option<String>,
}
