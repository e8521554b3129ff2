//! The tool library and registered MCP servers.

use std::collections::{BTreeMap, HashMap};

use baton_domain::tool::{
    McpServer, REDACTED, Tool, ToolUsage, ValidMcpServer, ValidTool, stored_header,
};
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set};

use crate::entity::{flow_activations, flow_templates, flow_versions, flows, mcp_servers, tools};
use crate::error::{StoreError, on_unique};
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

fn corrupt(what: &str, e: impl ToString) -> StoreError {
    StoreError::Corrupt("tool", format!("{what}: {}", e.to_string()))
}

fn to_tool(m: tools::Model) -> StoreResult<Tool> {
    let tool_type = baton_domain::tool::ToolType::parse(&m.tool_type, "toolType")
        .map_err(|e| corrupt("type", e))?;
    Ok(Tool {
        parameters: serde_json::from_str(&m.parameters).map_err(|e| corrupt("parameters", e))?,
        config: serde_json::from_str(&m.config).map_err(|e| corrupt("config", e))?,
        id: m.id,
        name: m.name,
        description: m.description,
        tool_type,
        type_alias: tool_type,
        created_at: from_millis(m.created_at),
        updated_at: from_millis(m.updated_at),
    })
}

fn json_text<T: serde::Serialize>(value: &T) -> StoreResult<String> {
    serde_json::to_string(value).map_err(|e| corrupt("encoding", e))
}

fn to_server(m: mcp_servers::Model) -> StoreResult<McpServer> {
    Ok(McpServer {
        headers: serde_json::from_str(&m.headers)
            .map_err(|e| StoreError::Corrupt("mcp server", format!("headers: {e}")))?,
        id: m.id,
        name: m.name,
        url: m.url,
        discovered_tool_count: m.discovered_tool_count.and_then(|c| u32::try_from(c).ok()),
        last_connected_at: m.last_connected_at.map(from_millis),
        created_at: from_millis(m.created_at),
        updated_at: from_millis(m.updated_at),
    })
}

/// `true` when the JSON array text of a template's `tool_ids` names `id`.
fn lists_tool(tool_ids: &str, id: &str) -> bool {
    serde_json::from_str::<Vec<String>>(tool_ids).is_ok_and(|ids| ids.iter().any(|t| t == id))
}

impl Store {
    pub async fn create_tool(&self, tenant: &TenantId, tool: &ValidTool) -> StoreResult<Tool> {
        let now = to_millis(Timestamp::now());
        let model = tools::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(tool.name.clone()),
            tool_type: Set(tool.tool_type.as_str().to_string()),
            description: Set(tool.description.clone()),
            parameters: Set(json_text(&tool.parameters)?),
            config: Set(json_text(&tool.config)?),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("tool", &tool.name))?;
        to_tool(model)
    }

    pub async fn list_tools(&self, tenant: &TenantId) -> StoreResult<Vec<Tool>> {
        tools::Entity::find()
            .filter(tools::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(tools::Column::Name)
            .all(self.conn())
            .await?
            .into_iter()
            .map(to_tool)
            .collect()
    }

    async fn find_tool_row(&self, tenant: &TenantId, id: &str) -> StoreResult<tools::Model> {
        tools::Entity::find_by_id(id)
            .filter(tools::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("tool", id))
    }

    pub async fn get_tool(&self, tenant: &TenantId, id: &str) -> StoreResult<Tool> {
        to_tool(self.find_tool_row(tenant, id).await?)
    }

    /// The tenant's tools among `ids`, in the order of `ids`; ids with no tool are left out.
    pub async fn tools_by_ids(&self, tenant: &TenantId, ids: &[String]) -> StoreResult<Vec<Tool>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut found: HashMap<String, Tool> = tools::Entity::find()
            .filter(tools::Column::TenantId.eq(tenant.as_str()))
            .filter(tools::Column::Id.is_in(ids.iter().map(String::as_str)))
            .all(self.conn())
            .await?
            .into_iter()
            .map(|m| to_tool(m).map(|t| (t.id.clone(), t)))
            .collect::<StoreResult<_>>()?;
        Ok(ids.iter().filter_map(|id| found.remove(id)).collect())
    }

    /// Replaces every field of the tool.
    pub async fn update_tool(
        &self,
        tenant: &TenantId,
        id: &str,
        tool: &ValidTool,
    ) -> StoreResult<Tool> {
        let mut active: tools::ActiveModel = self.find_tool_row(tenant, id).await?.into();
        active.name = Set(tool.name.clone());
        active.tool_type = Set(tool.tool_type.as_str().to_string());
        active.description = Set(tool.description.clone());
        active.parameters = Set(json_text(&tool.parameters)?);
        active.config = Set(json_text(&tool.config)?);
        active.updated_at = Set(to_millis(Timestamp::now()));
        let model = active
            .update(self.conn())
            .await
            .map_err(on_unique("tool", &tool.name))?;
        to_tool(model)
    }

    /// Deletes a tool no template of a live flow lists (409 `IN_USE` otherwise: an activated
    /// version cannot drop it, so its runs would lose the tool).
    pub async fn delete_tool(&self, tenant: &TenantId, id: &str) -> StoreResult<()> {
        self.find_tool_row(tenant, id).await?;
        let usage = self.tool_usage(tenant, id).await?;
        if !usage.is_empty() {
            let flows: Vec<&str> = usage.iter().map(|u| u.flow_name.as_str()).collect();
            return Err(StoreError::InUse {
                resource: "tool",
                id: id.to_string(),
                by: format!("flows {} (see /tools/{id}/usage)", flows.join(", ")),
            });
        }
        tools::Entity::delete_many()
            .filter(tools::Column::TenantId.eq(tenant.as_str()))
            .filter(tools::Column::Id.eq(id))
            .exec(self.conn())
            .await?;
        Ok(())
    }

    /// The versions of live flows whose templates list the tool, newest version first per flow.
    pub async fn tool_usage(&self, tenant: &TenantId, id: &str) -> StoreResult<Vec<ToolUsage>> {
        // The LIKE narrows the scan; the JSON check below makes it exact.
        let templates = flow_templates::Entity::find()
            .filter(flow_templates::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_templates::Column::ToolIds.contains(format!("\"{id}\"")))
            .all(self.conn())
            .await?;
        let mut by_version: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in templates
            .into_iter()
            .filter(|t| lists_tool(&t.tool_ids, id))
        {
            by_version.entry(t.version_id).or_default().push(t.name);
        }
        if by_version.is_empty() {
            return Ok(Vec::new());
        }
        let versions = flow_versions::Entity::find()
            .filter(flow_versions::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_versions::Column::Id.is_in(by_version.keys().map(String::as_str)))
            .all(self.conn())
            .await?;
        let flow_rows: HashMap<String, flows::Model> = flows::Entity::find()
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::DeletedAt.is_null())
            .filter(flows::Column::Id.is_in(versions.iter().map(|v| v.flow_id.as_str())))
            .all(self.conn())
            .await?
            .into_iter()
            .map(|f| (f.id.clone(), f))
            .collect();
        let activations = flow_activations::Entity::find()
            .filter(flow_activations::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_activations::Column::FlowId.is_in(flow_rows.keys().map(String::as_str)))
            .order_by_asc(flow_activations::Column::ActivatedAt)
            .order_by_asc(flow_activations::Column::Id)
            .all(self.conn())
            .await?;
        // Latest activation per (flow, environment) wins.
        let mut active: BTreeMap<(String, String), String> = BTreeMap::new();
        for a in activations {
            active.insert((a.flow_id, a.environment), a.version_id);
        }
        let mut usage: Vec<ToolUsage> = versions
            .into_iter()
            .filter_map(|v| {
                let flow = flow_rows.get(&v.flow_id)?;
                let environments = active
                    .iter()
                    .filter(|((flow_id, _), version)| *flow_id == v.flow_id && **version == v.id)
                    .map(|((_, env), _)| env.clone())
                    .collect();
                Some(ToolUsage {
                    flow_id: flow.id.clone(),
                    flow_name: flow.name.clone(),
                    flow_title: flow.title.clone(),
                    template_names: by_version.get(&v.id).cloned().unwrap_or_default(),
                    version_id: v.id,
                    version_number: u32::try_from(v.number).unwrap_or(0),
                    environments,
                })
            })
            .collect();
        usage.sort_by(|a, b| {
            (a.flow_name.as_str(), std::cmp::Reverse(a.version_number))
                .cmp(&(b.flow_name.as_str(), std::cmp::Reverse(b.version_number)))
        });
        Ok(usage)
    }

    pub async fn create_mcp_server(
        &self,
        tenant: &TenantId,
        server: &ValidMcpServer,
    ) -> StoreResult<McpServer> {
        let now = to_millis(Timestamp::now());
        let model = mcp_servers::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(server.name.clone()),
            url: Set(server.url.to_string()),
            headers: Set(json_text(&server.headers)?),
            discovered_tool_count: Set(None),
            last_connected_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.conn())
        .await?;
        to_server(model)
    }

    pub async fn list_mcp_servers(&self, tenant: &TenantId) -> StoreResult<Vec<McpServer>> {
        mcp_servers::Entity::find()
            .filter(mcp_servers::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(mcp_servers::Column::Name)
            .order_by_asc(mcp_servers::Column::Id)
            .all(self.conn())
            .await?
            .into_iter()
            .map(to_server)
            .collect()
    }

    async fn find_server_row(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<mcp_servers::Model> {
        mcp_servers::Entity::find_by_id(id)
            .filter(mcp_servers::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("mcp server", id))
    }

    /// The server with its real header values (for connecting; responses redact them).
    pub async fn get_mcp_server(&self, tenant: &TenantId, id: &str) -> StoreResult<McpServer> {
        to_server(self.find_server_row(tenant, id).await?)
    }

    /// Replaces name, URL and headers; a header sent back as [`REDACTED`] keeps its value.
    pub async fn update_mcp_server(
        &self,
        tenant: &TenantId,
        id: &str,
        server: &ValidMcpServer,
    ) -> StoreResult<McpServer> {
        let row = self.find_server_row(tenant, id).await?;
        let stored: BTreeMap<String, String> = serde_json::from_str(&row.headers)
            .map_err(|e| StoreError::Corrupt("mcp server", format!("headers: {e}")))?;
        let headers: BTreeMap<String, String> = server
            .headers
            .iter()
            .filter_map(|(name, value)| {
                if value == REDACTED {
                    stored_header(&stored, name).map(|kept| (name.clone(), kept.clone()))
                } else {
                    Some((name.clone(), value.clone()))
                }
            })
            .collect();
        let mut active: mcp_servers::ActiveModel = row.into();
        active.name = Set(server.name.clone());
        active.url = Set(server.url.to_string());
        active.headers = Set(json_text(&headers)?);
        active.updated_at = Set(to_millis(Timestamp::now()));
        to_server(active.update(self.conn()).await?)
    }

    /// Records a successful discovery.
    pub async fn record_mcp_discovery(
        &self,
        tenant: &TenantId,
        id: &str,
        tool_count: usize,
    ) -> StoreResult<McpServer> {
        let mut active: mcp_servers::ActiveModel = self.find_server_row(tenant, id).await?.into();
        active.discovered_tool_count = Set(Some(i32::try_from(tool_count).unwrap_or(i32::MAX)));
        active.last_connected_at = Set(Some(to_millis(Timestamp::now())));
        to_server(active.update(self.conn()).await?)
    }

    /// Deletes a server no imported tool still points at (409 `IN_USE` otherwise).
    pub async fn delete_mcp_server(&self, tenant: &TenantId, id: &str) -> StoreResult<()> {
        self.find_server_row(tenant, id).await?;
        let imported: Vec<String> = self
            .list_tools(tenant)
            .await?
            .into_iter()
            .filter(|t| t.config.mcp_server_id.as_deref() == Some(id))
            .map(|t| t.name)
            .collect();
        if !imported.is_empty() {
            return Err(StoreError::InUse {
                resource: "mcp server",
                id: id.to_string(),
                by: format!("imported tools {}", imported.join(", ")),
            });
        }
        mcp_servers::Entity::delete_many()
            .filter(mcp_servers::Column::TenantId.eq(tenant.as_str()))
            .filter(mcp_servers::Column::Id.eq(id))
            .exec(self.conn())
            .await?;
        Ok(())
    }
}
