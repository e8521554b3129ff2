//! `GET /api/v1/export` and `POST /api/v1/export/import` (SPEC.md "Export and import"): one JSON
//! document with every flow (all versions, templates and activations) and the tools.

use std::collections::HashMap;

use axum::extract::State;
use baton_domain::Timestamp;
use baton_domain::flow::{ExportDocument, ImportReport, slugify, validate_title};
use baton_domain::tool::ToolInput;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::Json;
use crate::routes::flows::{
    activation_comment, check_model_name, check_runnable, check_template, compile,
};
use crate::routes::tools::is_tenant_flow;
use crate::state::AppState;

const FORMAT: u32 = 1;

#[utoipa::path(get, path = "/api/v1/export", tag = "flows",
    responses(
        (status = 200, description = "Every flow with its versions, templates and activations", body = ExportDocument),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn export(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<ExportDocument>> {
    Ok(axum::Json(ExportDocument {
        format: FORMAT,
        exported_at: Timestamp::now(),
        flows: state.store.export_flows(&principal.tenant).await?,
        tools: state
            .store
            .list_tools(&principal.tenant)
            .await?
            .into_iter()
            // Header values are credentials: an import gets the redacted value to replace.
            .map(|tool| serde_json::to_value(tool.redacted()).unwrap_or_default())
            .collect(),
    }))
}

/// Imports a document from `GET /export` (any tenant's). Flows whose slug exists are skipped;
/// environments the activations name are created. Tools are matched by name: an existing tool of
/// that name is used instead; an MCP tool whose server this tenant lacks is skipped. Templates'
/// `toolIds` are rewritten to this tenant's tool ids. The whole document is checked first.
#[utoipa::path(post, path = "/api/v1/export/import", tag = "flows", request_body = ExportDocument,
    responses(
        (status = 200, description = "What was created and what was skipped", body = ImportReport),
        (status = 400, description = "An invalid flow or template in the document", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn import(
    State(state): State<AppState>,
    principal: Principal,
    Json(document): Json<ExportDocument>,
) -> ApiResult<axum::Json<ImportReport>> {
    if document.format != FORMAT {
        return Err(ApiError::validation(
            "format",
            format!(
                "unsupported export format {}: this server reads {FORMAT}",
                document.format
            ),
        ));
    }
    // Tools the document brings, by the id they had where it was exported.
    let document_tools: Vec<&str> = document
        .tools
        .iter()
        .filter_map(|t| t.get("id").and_then(|v| v.as_str()))
        .collect();
    // The tenant's tools, read once: template tool ids are checked against them, and the
    // document's tools matched by name.
    let existing = state.store.list_tools(&principal.tenant).await?;
    // The document is checked whole before anything is written, as saving each part would be.
    let mut flows = document.flows.clone();
    for (i, flow) in flows.iter_mut().enumerate() {
        let param = |field: &str| format!("flows[{i}].{field}");
        if slugify(&flow.name) != flow.name {
            return Err(ApiError::validation(
                param("name"),
                format!("'{}' is not a flow slug", flow.name),
            ));
        }
        // A slug that is another flow's id would answer to that flow, not this one.
        if let Ok(existing) = state.store.get_flow(&principal.tenant, &flow.name).await
            && existing.flow.id == flow.name
        {
            return Err(ApiError::validation(
                param("name"),
                format!("'{}' is the id of another flow of this tenant", flow.name),
            ));
        }
        validate_title(&flow.title)
            .map_err(|e| ApiError::validation(param("title"), e.to_string()))?;
        let mut numbers = std::collections::HashSet::new();
        for (j, version) in flow.versions.iter_mut().enumerate() {
            let at_version = |field: &str| param(&format!("versions[{j}].{field}"));
            if version.number == 0 || !numbers.insert(version.number) {
                return Err(ApiError::validation(
                    at_version("number"),
                    format!(
                        "version numbers are 1, 2, ... and unique within a flow: {} is not",
                        version.number
                    ),
                ));
            }
            let mut checked = Vec::with_capacity(version.templates.len());
            for (k, template) in std::mem::take(&mut version.templates)
                .into_iter()
                .enumerate()
            {
                let prefix = at_version(&format!("templates[{k}]."));
                let name = template.name.clone();
                let template =
                    check_template(&state, &principal.tenant, template.into(), &name, &prefix)
                        .await?;
                for (t, id) in template.tool_ids.iter().enumerate() {
                    let known = document_tools.contains(&id.as_str())
                        || existing.iter().any(|tool| &tool.id == id);
                    if !known {
                        return Err(ApiError::validation(
                            format!("{prefix}toolIds[{t}]"),
                            format!("'{id}' names no tool of this document or of this tenant"),
                        ));
                    }
                }
                checked.push(template);
            }
            version.templates = checked;
            compile(&version.templates).map_err(|e| match e {
                ApiError::Invalid { message, .. } => {
                    ApiError::validation(at_version("templates"), message)
                }
                other => other,
            })?;
            for (a, activation) in version.activations.iter().enumerate() {
                activation_comment(activation.comment.as_deref()).map_err(|e| match e {
                    ApiError::Invalid { message, .. } => ApiError::validation(
                        at_version(&format!("activations[{a}].comment")),
                        message,
                    ),
                    other => other,
                })?;
                baton_domain::environment::validate_environment_name(
                    &activation.environment,
                    &at_version(&format!("activations[{a}].environment")),
                )?;
            }
            if !version.activations.is_empty() {
                check_runnable(
                    &version.templates,
                    &version.entrypoint,
                    flow.execution_mode,
                    &param(&format!("versions[{j}]")),
                )?;
            }
        }
        if let Some(model) = &flow.classifier_model {
            check_model_name(&state, &principal.tenant, model, &param("classifierModel")).await?;
        }
    }

    // A tool's reference to a flow of the document (by its exporting tenant's id, or by slug)
    // becomes the slug, which the imported flow keeps; any other must be a flow of this tenant.
    let document_flows: HashMap<&str, &str> = document
        .flows
        .iter()
        .flat_map(|f| {
            f.id.as_deref()
                .into_iter()
                .chain([f.name.as_str()])
                .map(|key| (key, f.name.as_str()))
        })
        .collect();
    let mut tools = Vec::with_capacity(document.tools.len());
    for (i, raw) in document.tools.iter().enumerate() {
        let input: ToolInput = serde_json::from_value(raw.clone()).map_err(|e| {
            ApiError::validation(format!("tools[{i}]"), format!("not a tool record: {e}"))
        })?;
        let old_id = raw.get("id").and_then(|v| v.as_str()).map(str::to_string);
        let mut tool = input.validate().map_err(|e| {
            let baton_domain::DomainError::Validation { param, message } = e;
            ApiError::validation(format!("tools[{i}].{param}"), message)
        })?;
        let config = &mut tool.config;
        for (param, flow) in [
            ("agentTemplateId", &mut config.agent_template_id),
            ("producerFlowId", &mut config.producer_flow_id),
            ("criticFlowId", &mut config.critic_flow_id),
        ] {
            let Some(reference) = flow.as_mut() else {
                continue;
            };
            if let Some(slug) = document_flows.get(reference.as_str()) {
                *reference = (*slug).to_string();
                continue;
            }
            if !is_tenant_flow(&state, &principal.tenant, reference).await? {
                return Err(ApiError::validation(
                    format!("tools[{i}].{param}"),
                    format!(
                        "{param} names no flow of this document or of this tenant: '{reference}'"
                    ),
                ));
            }
        }
        tools.push((old_id, tool));
    }

    let mut report = ImportReport::default();
    // Old tool id -> this tenant's tool id.
    let mut tool_ids: HashMap<String, String> = HashMap::new();
    for (old_id, tool) in tools {
        let id = if let Some(found) = existing.iter().find(|t| t.name == tool.name) {
            report.tools_skipped.push(tool.name.clone());
            Some(found.id.clone())
        } else if let Some(server) = &tool.config.mcp_server_id
            && state
                .store
                .get_mcp_server(&principal.tenant, server)
                .await
                .is_err()
        {
            report.tools_skipped.push(tool.name.clone());
            None
        } else {
            let created = state.store.create_tool(&principal.tenant, &tool).await?;
            state.engine.forget_tools(&principal.tenant);
            report.tools_created.push(created.name);
            Some(created.id)
        };
        if let (Some(old), Some(new)) = (old_id, id) {
            tool_ids.insert(old, new);
        }
    }
    let mut environments: Vec<String> = flows
        .iter()
        .flat_map(|f| f.versions.iter())
        .flat_map(|v| v.activations.iter().map(|a| a.environment.clone()))
        .collect();
    environments.sort();
    environments.dedup();
    for name in environments {
        let name = baton_domain::environment::validate_environment_name(&name, "environment")?;
        if state
            .store
            .find_environment(&principal.tenant, &name)
            .await?
            .is_none()
        {
            state
                .store
                .create_environment(&principal.tenant, &name)
                .await?;
            report.environments_created.push(name);
        }
    }
    let actor = principal.actor();
    for mut flow in flows {
        // A tool of the document was created or matched by name (or skipped: an MCP tool whose
        // server this tenant lacks); a tool id of this tenant stays as it is.
        for template in flow
            .versions
            .iter_mut()
            .flat_map(|v| v.templates.iter_mut())
        {
            template.tool_ids = template
                .tool_ids
                .iter()
                .filter_map(|id| match tool_ids.get(id) {
                    Some(mapped) => Some(mapped.clone()),
                    None if document_tools.contains(&id.as_str()) => None,
                    None => Some(id.clone()),
                })
                .collect();
        }
        let imported = state
            .store
            .import_flow(&principal.tenant, &flow, &actor)
            .await;
        // Runs resolve flows through the engine's cache.
        state.engine.forget_flows(&principal.tenant);
        if imported? {
            report.flows_created.push(flow.name.clone());
        } else {
            report.flows_skipped.push(flow.name.clone());
        }
    }
    Ok(axum::Json(report))
}
