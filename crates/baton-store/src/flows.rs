//! Flows, versions, templates and activations. A flow is named by id or slug wherever a path
//! takes `{flowId}`; a soft-deleted flow is gone from every lookup.

use std::collections::BTreeMap;

use baton_domain::flow::{
    Activation, ENTRYPOINT, ExecutionMode, ExportedFlow, ExportedVersion, Flow, Template,
    ValidFlowPatch, Version, VersionStatus,
};
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, EntityTrait, QueryFilter,
    QueryOrder, Set,
};
use serde_json::Value;

use crate::entity::{flow_activations, flow_templates, flow_versions, flows};
use crate::error::StoreError;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

/// How many numbered slugs (`name-2`, `name-3`, ...) are tried before giving up.
const MAX_SLUG_SUFFIX: u32 = 1000;

fn json_list(values: &[String]) -> String {
    Value::from(values.to_vec()).to_string()
}

fn parse_list(text: &str) -> StoreResult<Vec<String>> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt("template list", e.to_string()))
}

fn to_template(m: flow_templates::Model) -> StoreResult<Template> {
    Ok(Template {
        tool_ids: parse_list(&m.tool_ids)?,
        fallbacks: parse_list(&m.fallbacks)?,
        response_schema: m
            .response_schema
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Corrupt("response schema", e.to_string()))?,
        name: m.name,
        description: m.description,
        template: m.template,
        user_template: m.user_template,
        llm: m.llm,
        temperature: m.temperature,
        max_tool_calls: m.max_tool_calls.and_then(|v| u32::try_from(v).ok()),
    })
}

fn template_row(
    tenant: &TenantId,
    version_id: &str,
    position: i32,
    template: &Template,
) -> flow_templates::ActiveModel {
    flow_templates::ActiveModel {
        version_id: Set(version_id.to_string()),
        tenant_id: Set(tenant.as_str().to_string()),
        name: Set(template.name.clone()),
        position: Set(position),
        description: Set(template.description.clone()),
        template: Set(template.template.clone()),
        user_template: Set(template.user_template.clone()),
        llm: Set(template.llm.clone()),
        temperature: Set(template.temperature),
        max_tool_calls: Set(template
            .max_tool_calls
            .map(|v| i32::try_from(v).unwrap_or(i32::MAX))),
        tool_ids: Set(json_list(&template.tool_ids)),
        fallbacks: Set(json_list(&template.fallbacks)),
        response_schema: Set(template.response_schema.as_ref().map(Value::to_string)),
        updated_at: Set(to_millis(Timestamp::now())),
    }
}

fn to_activation(m: &flow_activations::Model) -> Activation {
    Activation {
        environment: m.environment.clone(),
        comment: m.comment.clone(),
        activated_at: from_millis(m.activated_at),
        activated_by: m.activated_by.clone(),
    }
}

/// The version active per environment (latest activation wins), and the environments in the
/// order they were first activated (the first is a run's default).
fn active_versions(
    activations: &[flow_activations::Model],
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut active = BTreeMap::new();
    let mut order = Vec::new();
    // `activations` is oldest first, so later rows overwrite earlier ones.
    for a in activations {
        if !order.contains(&a.environment) {
            order.push(a.environment.clone());
        }
        active.insert(a.environment.clone(), a.version_id.clone());
    }
    (active, order)
}

/// A flow with where each environment points.
pub struct FlowState {
    pub flow: Flow,
    /// Environments by first activation, oldest first.
    pub environments: Vec<String>,
}

impl Store {
    async fn find_flow_row<C: ConnectionTrait>(
        conn: &C,
        tenant: &TenantId,
        id_or_slug: &str,
    ) -> StoreResult<flows::Model> {
        flows::Entity::find()
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::DeletedAt.is_null())
            .filter(
                Condition::any()
                    .add(flows::Column::Id.eq(id_or_slug))
                    .add(flows::Column::Name.eq(id_or_slug)),
            )
            .one(conn)
            .await?
            .ok_or_else(|| StoreError::not_found("flow", id_or_slug))
    }

    async fn activations_of<C: ConnectionTrait>(
        conn: &C,
        tenant: &TenantId,
        flow_id: &str,
    ) -> StoreResult<Vec<flow_activations::Model>> {
        Ok(flow_activations::Entity::find()
            .filter(flow_activations::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_activations::Column::FlowId.eq(flow_id))
            .order_by_asc(flow_activations::Column::ActivatedAt)
            .order_by_asc(flow_activations::Column::Id)
            .all(conn)
            .await?)
    }

    fn to_flow(row: flows::Model, activations: &[flow_activations::Model]) -> FlowState {
        let (active, environments) = active_versions(activations);
        FlowState {
            flow: Flow {
                execution_mode: ExecutionMode::parse(&row.execution_mode, "executionMode")
                    .unwrap_or_default(),
                id: row.id,
                name: row.name,
                title: row.title,
                active_versions: active,
                classifier_model: row.classifier_model,
                created_at: from_millis(row.created_at),
                updated_at: from_millis(row.updated_at),
            },
            environments,
        }
    }

    /// Creates the flow with its first version holding an empty `main` template.
    pub async fn create_flow(&self, tenant: &TenantId, title: &str) -> StoreResult<Flow> {
        let base = baton_domain::flow::slugify(title);
        let txn = self.begin_write().await?;
        // Flows are found by id or slug: a slug may not spell another flow's id either.
        let taken: Vec<String> = flows::Entity::find()
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(
                Condition::any()
                    .add(flows::Column::Name.starts_with(&base))
                    .add(flows::Column::Id.starts_with(&base)),
            )
            .all(&txn)
            .await?
            .into_iter()
            .flat_map(|f| [f.name, f.id])
            .collect();
        let slug = std::iter::once(base.clone())
            .chain((2..=MAX_SLUG_SUFFIX).map(|n| format!("{base}-{n}")))
            .find(|candidate| !taken.contains(candidate))
            .ok_or_else(|| StoreError::AlreadyExists {
                resource: "flow",
                key: base.clone(),
            })?;
        let now = to_millis(Timestamp::now());
        let flow = flows::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(slug.clone()),
            title: Set(title.to_string()),
            execution_mode: Set(ExecutionMode::Direct.as_str().to_string()),
            classifier_model: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            deleted_at: Set(None),
        }
        .insert(&txn)
        .await
        .map_err(crate::error::on_unique("flow", &slug))?;
        let version_id = new_id();
        flow_versions::ActiveModel {
            id: Set(version_id.clone()),
            tenant_id: Set(tenant.as_str().to_string()),
            flow_id: Set(flow.id.clone()),
            number: Set(1),
            entrypoint: Set(ENTRYPOINT.to_string()),
            created_at: Set(now),
        }
        .insert(&txn)
        .await?;
        let main = Template {
            name: ENTRYPOINT.to_string(),
            description: None,
            template: String::new(),
            user_template: None,
            llm: None,
            temperature: None,
            max_tool_calls: None,
            tool_ids: Vec::new(),
            fallbacks: Vec::new(),
            response_schema: None,
        };
        template_row(tenant, &version_id, 0, &main)
            .insert(&txn)
            .await?;
        txn.commit().await?;
        Ok(Self::to_flow(flow, &[]).flow)
    }

    pub async fn list_flows(&self, tenant: &TenantId) -> StoreResult<Vec<Flow>> {
        let rows = flows::Entity::find()
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::DeletedAt.is_null())
            .order_by_asc(flows::Column::CreatedAt)
            .order_by_asc(flows::Column::Id)
            .all(self.conn())
            .await?;
        let activations = flow_activations::Entity::find()
            .filter(flow_activations::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(flow_activations::Column::ActivatedAt)
            .order_by_asc(flow_activations::Column::Id)
            .all(self.conn())
            .await?;
        let mut by_flow: BTreeMap<&str, Vec<flow_activations::Model>> = BTreeMap::new();
        for a in &activations {
            by_flow
                .entry(a.flow_id.as_str())
                .or_default()
                .push(a.clone());
        }
        Ok(rows
            .into_iter()
            .map(|row| {
                let own = by_flow.get(row.id.as_str()).cloned().unwrap_or_default();
                Self::to_flow(row, &own).flow
            })
            .collect())
    }

    /// The flow (by id or slug) and its environments in activation order.
    /// The slug of the tenant's flow with id `id`, deleted or not (a deleted flow keeps its
    /// statistics, which its id still names).
    pub async fn flow_name_by_id(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<Option<String>> {
        Ok(flows::Entity::find()
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::Id.eq(id))
            .one(self.conn())
            .await?
            .map(|row| row.name))
    }

    pub async fn get_flow(&self, tenant: &TenantId, id_or_slug: &str) -> StoreResult<FlowState> {
        let row = Self::find_flow_row(self.conn(), tenant, id_or_slug).await?;
        let activations = Self::activations_of(self.conn(), tenant, &row.id).await?;
        Ok(Self::to_flow(row, &activations))
    }

    pub async fn update_flow(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
        patch: &ValidFlowPatch,
    ) -> StoreResult<Flow> {
        let row = Self::find_flow_row(self.conn(), tenant, id_or_slug).await?;
        let mut active: flows::ActiveModel = row.into();
        if let Some(title) = &patch.title {
            active.title = Set(title.clone());
        }
        if let Some(mode) = patch.execution_mode {
            active.execution_mode = Set(mode.as_str().to_string());
        }
        if let Some(model) = &patch.classifier_model {
            active.classifier_model = Set(model.clone());
        }
        active.updated_at = Set(to_millis(Timestamp::now()));
        let row = active.update(self.conn()).await?;
        let activations = Self::activations_of(self.conn(), tenant, &row.id).await?;
        Ok(Self::to_flow(row, &activations).flow)
    }

    /// Soft delete: the flow disappears from lists, lookups and runs; its rows stay.
    pub async fn delete_flow(&self, tenant: &TenantId, id_or_slug: &str) -> StoreResult<()> {
        let row = Self::find_flow_row(self.conn(), tenant, id_or_slug).await?;
        flows::Entity::update_many()
            .col_expr(
                flows::Column::DeletedAt,
                Expr::value(to_millis(Timestamp::now())),
            )
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::Id.eq(row.id))
            .exec(self.conn())
            .await?;
        Ok(())
    }

    async fn load_versions<C: ConnectionTrait>(
        conn: &C,
        tenant: &TenantId,
        flow_id: &str,
        only: Option<&str>,
    ) -> StoreResult<Vec<Version>> {
        let mut query = flow_versions::Entity::find()
            .filter(flow_versions::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_versions::Column::FlowId.eq(flow_id));
        if let Some(id) = only {
            query = query.filter(flow_versions::Column::Id.eq(id));
        }
        let versions = query
            .order_by_asc(flow_versions::Column::Number)
            .all(conn)
            .await?;
        let ids: Vec<String> = versions.iter().map(|v| v.id.clone()).collect();
        let templates = flow_templates::Entity::find()
            .filter(flow_templates::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_templates::Column::VersionId.is_in(ids))
            .order_by_asc(flow_templates::Column::Position)
            .all(conn)
            .await?;
        let activations = Self::activations_of(conn, tenant, flow_id).await?;
        let mut out = Vec::with_capacity(versions.len());
        for v in versions {
            let own: Vec<Template> = templates
                .iter()
                .filter(|t| t.version_id == v.id)
                .cloned()
                .map(to_template)
                .collect::<StoreResult<_>>()?;
            let activated: Vec<Activation> = activations
                .iter()
                .filter(|a| a.version_id == v.id)
                .map(to_activation)
                .collect();
            out.push(Version {
                status: if activated.is_empty() {
                    VersionStatus::Draft
                } else {
                    VersionStatus::Activated
                },
                id: v.id,
                flow_id: v.flow_id,
                number: u32::try_from(v.number).unwrap_or(0),
                entrypoint: v.entrypoint,
                templates: own,
                activations: activated,
                created_at: from_millis(v.created_at),
            });
        }
        Ok(out)
    }

    pub async fn list_versions(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
    ) -> StoreResult<Vec<Version>> {
        let flow = Self::find_flow_row(self.conn(), tenant, id_or_slug).await?;
        Self::load_versions(self.conn(), tenant, &flow.id, None).await
    }

    pub async fn get_version(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
        version_id: &str,
    ) -> StoreResult<Version> {
        let flow = Self::find_flow_row(self.conn(), tenant, id_or_slug).await?;
        Self::load_versions(self.conn(), tenant, &flow.id, Some(version_id))
            .await?
            .pop()
            .ok_or_else(|| StoreError::not_found("version", version_id))
    }

    /// A new draft: empty, or (`source`) a copy of another version's templates.
    pub async fn create_version(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
        source: Option<&str>,
    ) -> StoreResult<Version> {
        let txn = self.begin_write().await?;
        let flow = Self::find_flow_row(&txn, tenant, id_or_slug).await?;
        let copied = match source {
            Some(id) => Some(
                Self::load_versions(&txn, tenant, &flow.id, Some(id))
                    .await?
                    .pop()
                    .ok_or_else(|| StoreError::not_found("version", id))?,
            ),
            None => None,
        };
        let last = flow_versions::Entity::find()
            .filter(flow_versions::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_versions::Column::FlowId.eq(&flow.id))
            .order_by_desc(flow_versions::Column::Number)
            .one(&txn)
            .await?
            .map_or(0, |v| v.number);
        let id = new_id();
        flow_versions::ActiveModel {
            id: Set(id.clone()),
            tenant_id: Set(tenant.as_str().to_string()),
            flow_id: Set(flow.id.clone()),
            number: Set(last.saturating_add(1)),
            entrypoint: Set(copied
                .as_ref()
                .map_or_else(|| ENTRYPOINT.to_string(), |v| v.entrypoint.clone())),
            created_at: Set(to_millis(Timestamp::now())),
        }
        .insert(&txn)
        .await
        // Two drafts created at once may pick the same number; the loser retries.
        .map_err(|e| match crate::error::on_unique("version", &id)(e) {
            StoreError::AlreadyExists { .. } => StoreError::Conflict {
                resource: "version",
            },
            other => other,
        })?;
        if let Some(source) = &copied {
            for (position, template) in source.templates.iter().enumerate() {
                let position = i32::try_from(position).unwrap_or(i32::MAX);
                template_row(tenant, &id, position, template)
                    .insert(&txn)
                    .await?;
            }
        }
        let version = Self::load_versions(&txn, tenant, &flow.id, Some(&id))
            .await?
            .pop()
            .ok_or_else(|| StoreError::not_found("version", &id))?;
        txn.commit().await?;
        Ok(version)
    }

    /// Checks the version exists in the flow and is still a draft.
    async fn draft<C: ConnectionTrait>(
        conn: &C,
        tenant: &TenantId,
        flow_id: &str,
        version_id: &str,
    ) -> StoreResult<()> {
        let exists = flow_versions::Entity::find()
            .filter(flow_versions::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_versions::Column::FlowId.eq(flow_id))
            .filter(flow_versions::Column::Id.eq(version_id))
            .one(conn)
            .await?
            .is_some();
        if !exists {
            return Err(StoreError::not_found("version", version_id));
        }
        let activated = flow_activations::Entity::find()
            .filter(flow_activations::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_activations::Column::VersionId.eq(version_id))
            .one(conn)
            .await?
            .is_some();
        if activated {
            return Err(StoreError::VersionActivated(version_id.to_string()));
        }
        Ok(())
    }

    /// Inserts or replaces a template of a draft; `true` when it was created.
    pub async fn upsert_template(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
        version_id: &str,
        template: &Template,
    ) -> StoreResult<bool> {
        let txn = self.begin_write().await?;
        let flow = Self::find_flow_row(&txn, tenant, id_or_slug).await?;
        Self::draft(&txn, tenant, &flow.id, version_id).await?;
        let existing = flow_templates::Entity::find()
            .filter(flow_templates::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_templates::Column::VersionId.eq(version_id))
            .order_by_asc(flow_templates::Column::Position)
            .all(&txn)
            .await?;
        let created = match existing.iter().find(|t| t.name == template.name) {
            Some(row) => {
                template_row(tenant, version_id, row.position, template)
                    .update(&txn)
                    .await?;
                false
            }
            None => {
                let position = existing.last().map_or(0, |t| t.position.saturating_add(1));
                template_row(tenant, version_id, position, template)
                    .insert(&txn)
                    .await?;
                true
            }
        };
        txn.commit().await?;
        Ok(created)
    }

    pub async fn delete_template(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
        version_id: &str,
        name: &str,
    ) -> StoreResult<()> {
        let txn = self.begin_write().await?;
        let flow = Self::find_flow_row(&txn, tenant, id_or_slug).await?;
        Self::draft(&txn, tenant, &flow.id, version_id).await?;
        let result = flow_templates::Entity::delete_many()
            .filter(flow_templates::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_templates::Column::VersionId.eq(version_id))
            .filter(flow_templates::Column::Name.eq(name))
            .exec(&txn)
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::not_found("template", name));
        }
        txn.commit().await?;
        Ok(())
    }

    /// Points `environment` at the version (which becomes read-only) and records who and why.
    pub async fn activate_version(
        &self,
        tenant: &TenantId,
        id_or_slug: &str,
        version_id: &str,
        environment: &str,
        comment: Option<&str>,
        activated_by: &str,
    ) -> StoreResult<Version> {
        let txn = self.begin_write().await?;
        let flow = Self::find_flow_row(&txn, tenant, id_or_slug).await?;
        let exists = flow_versions::Entity::find()
            .filter(flow_versions::Column::TenantId.eq(tenant.as_str()))
            .filter(flow_versions::Column::FlowId.eq(&flow.id))
            .filter(flow_versions::Column::Id.eq(version_id))
            .one(&txn)
            .await?
            .is_some();
        if !exists {
            return Err(StoreError::not_found("version", version_id));
        }
        let now = to_millis(Timestamp::now());
        flow_activations::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            flow_id: Set(flow.id.clone()),
            version_id: Set(version_id.to_string()),
            environment: Set(environment.to_string()),
            comment: Set(comment.map(str::to_string)),
            activated_by: Set(activated_by.to_string()),
            activated_at: Set(now),
        }
        .insert(&txn)
        .await?;
        // The flow's `activeVersions` changed: so did the flow.
        flows::Entity::update_many()
            .col_expr(flows::Column::UpdatedAt, Expr::value(now))
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::Id.eq(&flow.id))
            .exec(&txn)
            .await?;
        let version = Self::load_versions(&txn, tenant, &flow.id, Some(version_id))
            .await?
            .pop()
            .ok_or_else(|| StoreError::not_found("version", version_id))?;
        txn.commit().await?;
        Ok(version)
    }

    /// Every live flow with all its versions, for `GET /export`.
    pub async fn export_flows(&self, tenant: &TenantId) -> StoreResult<Vec<ExportedFlow>> {
        let flows = self.list_flows(tenant).await?;
        let mut out = Vec::with_capacity(flows.len());
        for flow in flows {
            let versions = Self::load_versions(self.conn(), tenant, &flow.id, None).await?;
            out.push(ExportedFlow {
                id: Some(flow.id),
                name: flow.name,
                title: flow.title,
                execution_mode: flow.execution_mode,
                classifier_model: flow.classifier_model,
                versions: versions
                    .into_iter()
                    .map(|v| ExportedVersion {
                        number: v.number,
                        entrypoint: v.entrypoint,
                        templates: v.templates,
                        activations: v.activations,
                    })
                    .collect(),
            });
        }
        Ok(out)
    }

    /// Recreates an exported flow under its own slug; `false` (nothing written) when the tenant
    /// already has that slug. Activations are replayed with their times, so every environment
    /// ends on the version it had.
    pub async fn import_flow(
        &self,
        tenant: &TenantId,
        flow: &ExportedFlow,
        imported_by: &str,
    ) -> StoreResult<bool> {
        let txn = self.begin_write().await?;
        let taken = flows::Entity::find()
            .filter(flows::Column::TenantId.eq(tenant.as_str()))
            .filter(flows::Column::Name.eq(&flow.name))
            .one(&txn)
            .await?
            .is_some();
        if taken {
            return Ok(false);
        }
        let now = to_millis(Timestamp::now());
        let flow_id = new_id();
        flows::ActiveModel {
            id: Set(flow_id.clone()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(flow.name.clone()),
            title: Set(flow.title.clone()),
            execution_mode: Set(flow.execution_mode.as_str().to_string()),
            classifier_model: Set(flow.classifier_model.clone()),
            created_at: Set(now),
            updated_at: Set(now),
            deleted_at: Set(None),
        }
        .insert(&txn)
        .await
        .map_err(crate::error::on_unique("flow", &flow.name))?;
        for version in &flow.versions {
            let version_id = new_id();
            flow_versions::ActiveModel {
                id: Set(version_id.clone()),
                tenant_id: Set(tenant.as_str().to_string()),
                flow_id: Set(flow_id.clone()),
                number: Set(i32::try_from(version.number).unwrap_or(i32::MAX)),
                entrypoint: Set(version.entrypoint.clone()),
                created_at: Set(now),
            }
            .insert(&txn)
            .await?;
            for (position, template) in version.templates.iter().enumerate() {
                let position = i32::try_from(position).unwrap_or(i32::MAX);
                template_row(tenant, &version_id, position, template)
                    .insert(&txn)
                    .await?;
            }
            for activation in &version.activations {
                flow_activations::ActiveModel {
                    id: Set(new_id()),
                    tenant_id: Set(tenant.as_str().to_string()),
                    flow_id: Set(flow_id.clone()),
                    version_id: Set(version_id.clone()),
                    environment: Set(activation.environment.clone()),
                    comment: Set(activation.comment.clone()),
                    // The importer, in the one `apiKey:<id>`/`user:<id>` form: the exporting
                    // tenant's actors mean nothing here (and are not this tenant's to show).
                    activated_by: Set(imported_by.to_string()),
                    activated_at: Set(to_millis(activation.activated_at)),
                }
                .insert(&txn)
                .await?;
            }
        }
        txn.commit().await?;
        Ok(true)
    }
}
