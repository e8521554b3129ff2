//! `/api/v1/mcp-servers` (SPEC.md "MCP servers"): register a server, discover its tools, import
//! them into the tool library. Header values are secrets: responses show them redacted.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::tool::{
    DiscoveredTool, McpImportInput, McpServer, McpServerInput, REDACTED, Tool, ToolInput, ToolType,
    ValidMcpServer, mcp_local_name, stored_header,
};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, NoBody, PathParam};
use crate::routes::tools::check_input_schema;
use crate::state::AppState;

#[utoipa::path(get, path = "/api/v1/mcp-servers", tag = "mcp-servers",
    responses(
        (status = 200, description = "The tenant's MCP servers by name", body = [McpServer]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_mcp_servers(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<McpServer>>> {
    let servers = state.store.list_mcp_servers(&principal.tenant).await?;
    Ok(axum::Json(
        servers.into_iter().map(McpServer::redacted).collect(),
    ))
}

#[utoipa::path(post, path = "/api/v1/mcp-servers", tag = "mcp-servers", request_body = McpServerInput,
    responses(
        (status = 201, description = "Registered", body = McpServer),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn create_mcp_server(
    State(state): State<AppState>,
    principal: Principal,
    Json(body): Json<McpServerInput>,
) -> ApiResult<(StatusCode, axum::Json<McpServer>)> {
    let server = body.validate()?;
    // `********` means "keep the stored value" on update; a new server has none to keep.
    if let Some(name) = kept_header(&server) {
        return Err(ApiError::validation(
            format!("headers.{name}"),
            format!("'{REDACTED}' keeps a stored value on update; a new server has none"),
        ));
    }
    let created = state
        .store
        .create_mcp_server(&principal.tenant, &server)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(created.redacted())))
}

#[utoipa::path(get, path = "/api/v1/mcp-servers/{id}", tag = "mcp-servers",
    params(("id" = String, Path, description = "MCP server id")),
    responses(
        (status = 200, description = "The server", body = McpServer),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such server", body = ErrorResponse),
    ))]
pub async fn get_mcp_server(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<McpServer>> {
    let server = state.store.get_mcp_server(&principal.tenant, &id).await?;
    Ok(axum::Json(server.redacted()))
}

/// Replaces name, URL and headers. A header sent with the redacted value `********` keeps its
/// stored value; a header left out is removed.
#[utoipa::path(put, path = "/api/v1/mcp-servers/{id}", tag = "mcp-servers", request_body = McpServerInput,
    params(("id" = String, Path, description = "MCP server id")),
    responses(
        (status = 200, description = "The server after the change", body = McpServer),
        (status = 400, description = "Invalid field", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such server", body = ErrorResponse),
    ))]
pub async fn update_mcp_server(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Json(body): Json<McpServerInput>,
) -> ApiResult<axum::Json<McpServer>> {
    let server = body.validate()?;
    // A kept secret does not follow the record to another host: whoever can edit it could
    // otherwise point it at their own server and collect the credential.
    let current = state.store.get_mcp_server(&principal.tenant, &id).await?;
    let moved = url::Url::parse(&current.url)
        .map(|before| before.origin() != server.url.origin())
        .unwrap_or(true);
    // `********` keeps a value only where there is one to keep.
    if let Some(name) = server.headers.iter().find_map(|(name, value)| {
        (value == REDACTED && stored_header(&current.headers, name).is_none()).then_some(name)
    }) {
        return Err(ApiError::validation(
            format!("headers.{name}"),
            format!(
                "'{REDACTED}' keeps a stored value, and header '{name}' has none: send its value"
            ),
        ));
    }
    if moved && let Some(name) = kept_header(&server) {
        return Err(ApiError::validation(
            format!("headers.{name}"),
            "the url now points at another server: send the header's value again rather than \
             keeping the stored one",
        ));
    }
    let updated = state
        .store
        .update_mcp_server(&principal.tenant, &id, &server)
        .await?;
    Ok(axum::Json(updated.redacted()))
}

#[utoipa::path(delete, path = "/api/v1/mcp-servers/{id}", tag = "mcp-servers",
    params(("id" = String, Path, description = "MCP server id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such server", body = ErrorResponse),
        (status = 409, description = "Imported tools still point at it (IN_USE)", body = ErrorResponse),
    ))]
pub async fn delete_mcp_server(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<StatusCode> {
    state
        .store
        .delete_mcp_server(&principal.tenant, &id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The server's tools, fetched now: `(server with real headers, its tools)`. A successful
/// connection is recorded (`discoveredToolCount`, `lastConnectedAt`).
/// Lists the server's tools. The successful connection is recorded by the caller, once the
/// request has passed its checks (a refused import writes nothing).
async fn fetch_tools(
    state: &AppState,
    tenant: &baton_domain::TenantId,
    id: &str,
) -> ApiResult<Vec<baton_tools::DiscoveredTool>> {
    let server = state.store.get_mcp_server(tenant, id).await?;
    let url = url::Url::parse(&server.url)
        .map_err(|e| ApiError::Internal(format!("stored MCP server URL: {e}")))?;
    let endpoint = baton_tools::McpEndpoint {
        url: &url,
        headers: &server.headers,
    };
    let tools =
        baton_tools::mcp::discover(&state.outbound, endpoint, state.config.tool_call_timeout)
            .await
            .map_err(|e| ApiError::Status {
                status: axum::http::StatusCode::BAD_GATEWAY,
                code: "MCP_SERVER_ERROR",
                message: format!("MCP server '{}' could not be listed: {e}", server.name),
            })?;
    Ok(tools)
}

/// Connects to the server (through the outbound guard, with its headers) and lists its tools.
#[utoipa::path(post, path = "/api/v1/mcp-servers/{id}/discover", tag = "mcp-servers",
    params(("id" = String, Path, description = "MCP server id")),
    responses(
        (status = 400, description = "A body other than none, {} or null (the operation takes none)", body = ErrorResponse),
        (status = 200, description = "The server's tools, each marked when already imported", body = [DiscoveredTool]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such server", body = ErrorResponse),
        (status = 502, description = "The server could not be reached or refused (MCP_SERVER_ERROR)", body = ErrorResponse),
    ))]
pub async fn discover_mcp_tools(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    _: NoBody,
) -> ApiResult<axum::Json<Vec<DiscoveredTool>>> {
    let tools = fetch_tools(&state, &principal.tenant, &id).await?;
    state
        .store
        .record_mcp_discovery(&principal.tenant, &id, tools.len())
        .await?;
    let library = state.store.list_tools(&principal.tenant).await?;
    let imported = |name: &str| library.iter().any(|t| is_import_of(t, &id, name));
    Ok(axum::Json(
        tools
            .into_iter()
            .map(|t| DiscoveredTool {
                already_imported: imported(&t.name),
                name: t.name,
                description: t.description,
                input_schema: t.input_schema,
            })
            .collect(),
    ))
}

/// The first header sent as `********` (asking to keep its stored value).
fn kept_header(server: &ValidMcpServer) -> Option<&String> {
    server
        .headers
        .iter()
        .find(|(_, value)| *value == REDACTED)
        .map(|(name, _)| name)
}

/// Whether `tool` is server `server`'s tool `remote`, imported (its name here may differ).
fn is_import_of(tool: &Tool, server: &str, remote: &str) -> bool {
    tool.config.mcp_server_id.as_deref() == Some(server)
        && tool.config.mcp_tool_name.as_deref().unwrap_or(&tool.name) == remote
}

/// Imports the named tools into the library as `Mcp` tools (`mcpServerId`, `rawInputSchema`,
/// converted `parameters`). A tool imported before from this server is refreshed.
#[utoipa::path(post, path = "/api/v1/mcp-servers/{id}/import", tag = "mcp-servers",
    request_body = McpImportInput,
    params(("id" = String, Path, description = "MCP server id")),
    responses(
        (status = 200, description = "The imported tools", body = [Tool]),
        (status = 400, description = "A name the server does not offer, or not usable as a tool name", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such server", body = ErrorResponse),
        (status = 409, description = "A tool of that name exists that is not from this server", body = ErrorResponse),
        (status = 502, description = "The server could not be reached (MCP_SERVER_ERROR)", body = ErrorResponse),
    ))]
pub async fn import_mcp_tools(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Json(body): Json<McpImportInput>,
) -> ApiResult<axum::Json<Vec<Tool>>> {
    let tenant = &principal.tenant;
    if body.tool_names.is_empty() {
        return Err(ApiError::validation(
            "toolNames",
            "toolNames must name at least one tool",
        ));
    }
    // Load before connecting: an unknown server is a 404 without a network call.
    state.store.get_mcp_server(tenant, &id).await?;
    let offered = fetch_tools(&state, tenant, &id).await?;
    let mut chosen = Vec::with_capacity(body.tool_names.len());
    for (i, name) in body.tool_names.iter().enumerate() {
        let param = format!("toolNames[{i}]");
        if body.tool_names[..i].contains(name) {
            return Err(ApiError::validation(
                param,
                format!("'{name}' is named twice"),
            ));
        }
        let tool = offered.iter().find(|t| &t.name == name).ok_or_else(|| {
            ApiError::validation(
                param.clone(),
                format!("the MCP server offers no tool named '{name}'"),
            )
        })?;
        // A name function names cannot carry (`files.read`) gets one that can; the server's
        // is kept for the calls.
        let local = mcp_local_name(name);
        let input = ToolInput {
            mcp_tool_name: (&local != name).then(|| name.clone()),
            name: local,
            description: tool.description.clone(),
            tool_type: Some(ToolType::Mcp.as_str().to_string()),
            mcp_server_id: Some(id.clone()),
            raw_input_schema: Some(tool.input_schema.clone()),
            ..ToolInput::default()
        };
        let valid = input.validate().map_err(|e| {
            let baton_domain::DomainError::Validation { message, .. } = e;
            ApiError::validation(param.clone(), message)
        })?;
        if let Some(schema) = &valid.config.raw_input_schema {
            check_input_schema(schema).map_err(|e| {
                ApiError::validation(
                    param.clone(),
                    format!("the server's input schema of '{name}' does not compile: {e}"),
                )
            })?;
        }
        chosen.push(valid);
    }
    // Every name is checked before the first write: a conflict imports none of them.
    let _planning = state.mcp_imports.lock().await;
    let library = state.store.list_tools(tenant).await?;
    let mut plan = Vec::with_capacity(chosen.len());
    for (remote, mut tool) in body.tool_names.iter().zip(chosen) {
        // Imported before (under its name here, which may have been changed): refreshed.
        if let Some(existing) = library.iter().find(|t| is_import_of(t, &id, remote)) {
            if existing.name != tool.name {
                tool.name.clone_from(&existing.name);
                tool.config.mcp_tool_name = Some(remote.clone());
            }
            plan.push((Some(existing.id.clone()), tool));
            continue;
        }
        match library.iter().find(|t| t.name == tool.name) {
            Some(_) => {
                return Err(ApiError::Conflict {
                    code: "ALREADY_EXISTS",
                    message: format!(
                        "a tool named '{}' already exists and does not come from this server",
                        tool.name
                    ),
                });
            }
            None => plan.push((None, tool)),
        }
    }
    state
        .store
        .record_mcp_discovery(tenant, &id, offered.len())
        .await?;
    let mut imported = Vec::with_capacity(plan.len());
    let mut saved = Ok(());
    for (existing, tool) in plan {
        let written = match existing {
            Some(existing) => state.store.update_tool(tenant, &existing, &tool).await,
            None => state.store.create_tool(tenant, &tool).await,
        };
        match written {
            Ok(tool) => imported.push(tool),
            Err(error) => {
                saved = Err(error);
                break;
            }
        }
    }
    // Whatever was written is seen by the next run, also when a write failed.
    state.engine.forget_tools(tenant);
    saved?;
    Ok(axum::Json(imported))
}
