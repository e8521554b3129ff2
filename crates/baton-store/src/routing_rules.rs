//! Tenant routing rules: aliases over model chains.

use baton_domain::routing::{RoutingRule, Strategy, ValidRule};
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set};

use crate::entity::routing_rules;
use crate::error::{StoreError, on_unique};
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

fn to_rule(model: routing_rules::Model) -> StoreResult<RoutingRule> {
    let corrupt =
        |what: &str, e: String| StoreError::Corrupt("routing rule", format!("{what}: {e}"));
    Ok(RoutingRule {
        models: serde_json::from_str(&model.models)
            .map_err(|e| corrupt("models", e.to_string()))?,
        strategy: Strategy::parse(&model.strategy, "strategy")
            .map_err(|e| corrupt("strategy", e.to_string()))?,
        weights: model
            .weights
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| corrupt("weights", e.to_string()))?,
        id: model.id,
        alias: model.alias,
        description: model.description,
        created_at: from_millis(model.created_at),
        updated_at: from_millis(model.updated_at),
    })
}

fn models_text(rule: &ValidRule) -> String {
    let names: Vec<String> = rule.models.iter().map(ToString::to_string).collect();
    serde_json::Value::from(names).to_string()
}

fn weights_text(rule: &ValidRule) -> Option<String> {
    rule.weights
        .as_ref()
        .map(|w| serde_json::Value::from(w.clone()).to_string())
}

impl Store {
    pub async fn create_routing_rule(
        &self,
        tenant: &TenantId,
        rule: &ValidRule,
    ) -> StoreResult<RoutingRule> {
        let now = to_millis(Timestamp::now());
        let model = routing_rules::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            alias: Set(rule.alias.clone()),
            models: Set(models_text(rule)),
            strategy: Set(rule.strategy.as_str().to_string()),
            weights: Set(weights_text(rule)),
            description: Set(rule.description.clone()),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("routing rule", &rule.alias))?;
        to_rule(model)
    }

    pub async fn list_routing_rules(&self, tenant: &TenantId) -> StoreResult<Vec<RoutingRule>> {
        routing_rules::Entity::find()
            .filter(routing_rules::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(routing_rules::Column::Alias)
            .all(self.conn())
            .await?
            .into_iter()
            .map(to_rule)
            .collect()
    }

    async fn find_rule_row(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<routing_rules::Model> {
        routing_rules::Entity::find_by_id(id)
            .filter(routing_rules::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("routing rule", id))
    }

    pub async fn get_routing_rule(&self, tenant: &TenantId, id: &str) -> StoreResult<RoutingRule> {
        to_rule(self.find_rule_row(tenant, id).await?)
    }

    /// Replaces every field of the rule.
    pub async fn update_routing_rule(
        &self,
        tenant: &TenantId,
        id: &str,
        rule: &ValidRule,
    ) -> StoreResult<RoutingRule> {
        let mut active: routing_rules::ActiveModel = self.find_rule_row(tenant, id).await?.into();
        active.alias = Set(rule.alias.clone());
        active.models = Set(models_text(rule));
        active.strategy = Set(rule.strategy.as_str().to_string());
        active.weights = Set(weights_text(rule));
        active.description = Set(rule.description.clone());
        active.updated_at = Set(to_millis(Timestamp::now()));
        let model = active
            .update(self.conn())
            .await
            .map_err(on_unique("routing rule", &rule.alias))?;
        to_rule(model)
    }

    pub async fn delete_routing_rule(&self, tenant: &TenantId, id: &str) -> StoreResult<()> {
        let result = routing_rules::Entity::delete_many()
            .filter(routing_rules::Column::TenantId.eq(tenant.as_str()))
            .filter(routing_rules::Column::Id.eq(id))
            .exec(self.conn())
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::not_found("routing rule", id));
        }
        Ok(())
    }
}
