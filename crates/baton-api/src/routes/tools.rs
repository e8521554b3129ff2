//! `/api/v1/tools`: the tenant's tool library (SPEC.md "Tool", "Tools"), and which flows use a
//! tool.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::TenantId;
use baton_domain::tool::{
    REDACTED, Tool, ToolInput, ToolType, ToolUsage, ValidTool, stored_header,
};
use baton_store::StoreError;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, PathParam};
use crate::state::AppState;

/// Whether `flow` (id or slug) names a flow of `tenant`.
pub(crate) async fn is_tenant_flow(
    state: &AppState,
    tenant: &TenantId,
    flow: &str,
) -> ApiResult<bool> {
    match state.store.get_flow(tenant, flow).await {
        Ok(_) => Ok(true),
        Err(StoreError::NotFound { .. }) => Ok(false),
        Err(other) => Err(other.into()),
    }
}

/// The fields that name other records must name the tenant's own.
async fn check_references(state: &AppState, tenant: &TenantId, tool: &ValidTool) -> ApiResult<()> {
    let config = &tool.config;
    let flows = [
        ("agentTemplateId", &config.agent_template_id),
        ("producerFlowId", &config.producer_flow_id),
        ("criticFlowId", &config.critic_flow_id),
    ];
    for (param, flow) in flows {
        if let Some(flow) = flow
            && !is_tenant_flow(state, tenant, flow).await?
        {
            return Err(ApiError::validation(
                param,
                format!("{param} names no flow of this tenant: '{flow}'"),
            ));
        }
    }
    if let Some(server) = &config.mcp_server_id {
        match state.store.get_mcp_server(tenant, server).await {
            Ok(_) => {}
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::validation(
                    "mcpServerId",
                    format!("mcpServerId names no MCP server of this tenant: '{server}'"),
                ));
            }
            Err(other) => return Err(other.into()),
        }
    }
    Ok(())
}

async fn validate(state: &AppState, tenant: &TenantId, body: ToolInput) -> ApiResult<ValidTool> {
    let tool = body.validate()?;
    if let Some(schema) = &tool.config.raw_input_schema {
        check_input_schema(schema).map_err(|e| ApiError::validation("rawInputSchema", e))?;
    }
    let config = &tool.config;
    let urls = config
        .web_url
        .iter()
        .map(|u| ("webUrl".to_string(), u))
        .chain(
            config
                .web_urls
                .iter()
                .map(|(e, u)| (format!("webUrls.{e}"), u)),
        )
        .chain(
            config
                .environment_overrides
                .iter()
                .map(|(e, o)| (format!("environmentOverrides.{e}.webUrl"), &o.web_url)),
        );
    for (param, url) in urls {
        baton_template::discover(url, baton_template::ParameterSource::ToolUrl)
            .map_err(|e| ApiError::validation(param, e.to_string()))?;
    }
    check_references(state, tenant, &tool).await?;
    Ok(tool)
}

#[utoipa::path(get, path = "/api/v1/tools", tag = "tools",
    responses(
        (status = 200, description = "The tenant's tools by name", body = [Tool]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_tools(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<Tool>>> {
    Ok(axum::Json(
        state
            .store
            .list_tools(&principal.tenant)
            .await?
            .into_iter()
            .map(Tool::redacted)
            .collect(),
    ))
}

#[utoipa::path(post, path = "/api/v1/tools", tag = "tools", request_body = ToolInput,
    responses(
        (status = 201, description = "Created", body = Tool),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 409, description = "The name is taken", body = ErrorResponse),
    ))]
pub async fn create_tool(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<ToolInput>,
) -> ApiResult<(StatusCode, axum::Json<Tool>)> {
    let tool = validate(&state, &principal.tenant, body).await?;
    let created = state.store.create_tool(&principal.tenant, &tool).await?;
    state.engine.forget_tools(&principal.tenant);
    Ok((StatusCode::CREATED, axum::Json(created.redacted())))
}

#[utoipa::path(get, path = "/api/v1/tools/{id}", tag = "tools",
    params(("id" = String, Path, description = "Tool id")),
    responses(
        (status = 200, description = "The tool", body = Tool),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such tool", body = ErrorResponse),
    ))]
pub async fn get_tool(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<Tool>> {
    Ok(axum::Json(
        state
            .store
            .get_tool(&principal.tenant, &id)
            .await?
            .redacted(),
    ))
}

/// Replaces the tool: every field as in a create.
#[utoipa::path(put, path = "/api/v1/tools/{id}", tag = "tools", request_body = ToolInput,
    params(("id" = String, Path, description = "Tool id")),
    responses(
        (status = 200, description = "The tool after the change", body = Tool),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such tool", body = ErrorResponse),
        (status = 409, description = "The name is taken", body = ErrorResponse),
    ))]
pub async fn update_tool(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Json(mut body): Json<ToolInput>,
) -> ApiResult<axum::Json<Tool>> {
    let stored = state.store.get_tool(&principal.tenant, &id).await?;
    // A header sent back with the redacted value keeps its stored value, but only for the
    // hosts it was given for: pointed at a new one, it must be sent again.
    let stored_endpoints: Vec<&str> = endpoints(
        stored.config.web_url.as_deref(),
        stored.config.web_urls.values(),
        stored
            .config
            .environment_overrides
            .values()
            .map(|o| &o.web_url),
    );
    let known: Vec<url::Origin> = stored_endpoints
        .iter()
        .filter_map(|raw| fixed_origin(raw))
        .collect();
    // An endpoint whose host is fixed must be one of those the secret was given for; any other
    // (relative, or a host from a `[[parameter]]`, which a run chooses) must be one it had.
    let new_host = endpoints(
        body.web_url.as_deref(),
        body.web_urls.iter().flat_map(|urls| urls.values()),
        body.environment_overrides
            .iter()
            .flat_map(|overrides| overrides.values().map(|o| &o.web_url)),
    )
    .into_iter()
    .any(|raw| match fixed_origin(raw) {
        Some(origin) => !known.contains(&origin),
        None => !stored_endpoints.contains(&raw),
    });
    if let Some(headers) = body.headers.as_mut() {
        for (name, value) in headers.iter_mut() {
            if value == REDACTED && new_host {
                return Err(ApiError::validation(
                    format!("headers.{name}"),
                    "the tool now points at another host: send the header's value again rather \
                     than keeping the stored one",
                ));
            }
            if value == REDACTED
                && let Some(kept) = stored_header(&stored.config.headers, name)
            {
                value.clone_from(kept);
            }
        }
    }
    let mut tool = validate(&state, &principal.tenant, body).await?;
    // An imported MCP tool renamed here is still called by its server's name.
    if tool.tool_type == ToolType::Mcp
        && tool.config.mcp_tool_name.is_none()
        && tool.config.mcp_server_id == stored.config.mcp_server_id
    {
        tool.config.mcp_tool_name = stored
            .config
            .mcp_tool_name
            .clone()
            .or_else(|| (stored.name != tool.name).then(|| stored.name.clone()));
    }
    let updated = state
        .store
        .update_tool(&principal.tenant, &id, &tool)
        .await?;
    state.engine.forget_tools(&principal.tenant);
    Ok(axum::Json(updated.redacted()))
}

/// An MCP tool's input schema compiles: arguments are checked against it before each call
/// (an invalid one would leave them unchecked and reach the provider as it is).
pub(crate) fn check_input_schema(schema: &serde_json::Value) -> Result<(), String> {
    baton_providers::structured::OutputSchema::compile(schema).map(|_| ())
}

/// A tool's endpoints, trimmed.
fn endpoints<'a>(
    web_url: Option<&'a str>,
    web_urls: impl Iterator<Item = &'a String>,
    overrides: impl Iterator<Item = &'a String>,
) -> Vec<&'a str> {
    web_url
        .into_iter()
        .chain(web_urls.map(String::as_str))
        .chain(overrides.map(String::as_str))
        .map(str::trim)
        .collect()
}

/// The origin of an absolute endpoint whose host no parameter fills in.
fn fixed_origin(raw: &str) -> Option<url::Origin> {
    let url = url::Url::parse(raw).ok()?;
    // A `[[parameter]]` in the host is filled in by each run.
    let authority = raw.split_once("://")?.1.split('/').next()?;
    (!authority.contains("[[")).then(|| url.origin())
}

#[utoipa::path(delete, path = "/api/v1/tools/{id}", tag = "tools",
    params(("id" = String, Path, description = "Tool id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such tool", body = ErrorResponse),
        (status = 409, description = "Templates of live flows still list the tool (IN_USE)", body = ErrorResponse),
    ))]
pub async fn delete_tool(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<StatusCode> {
    state.store.delete_tool(&principal.tenant, &id).await?;
    state.engine.forget_tools(&principal.tenant);
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/tools/{id}/usage", tag = "tools",
    params(("id" = String, Path, description = "Tool id")),
    responses(
        (status = 200, description = "Flow versions whose templates list the tool", body = [ToolUsage]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such tool", body = ErrorResponse),
    ))]
pub async fn tool_usage(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<Vec<ToolUsage>>> {
    state.store.get_tool(&principal.tenant, &id).await?;
    Ok(axum::Json(
        state.store.tool_usage(&principal.tenant, &id).await?,
    ))
}
