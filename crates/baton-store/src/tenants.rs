//! Tenants and their settings document.

use baton_domain::settings::TenantSettings;
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, Set};

use crate::entity::tenants;
use crate::error::on_unique;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub created_at: Timestamp,
}

/// Settings plus the version token needed to write them back without losing a concurrent edit.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedSettings {
    pub settings: TenantSettings,
    pub version: i64,
}

fn to_tenant(model: tenants::Model) -> Tenant {
    Tenant {
        id: TenantId::new(model.id),
        name: model.name,
        created_at: from_millis(model.created_at),
    }
}

impl Store {
    pub async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        let now = to_millis(Timestamp::now());
        let settings = serde_json::to_string(&TenantSettings::default())
            .map_err(|e| StoreError::Corrupt("tenant settings", e.to_string()))?;
        let model = tenants::ActiveModel {
            id: Set(new_id()),
            name: Set(name.to_string()),
            settings: Set(settings),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("tenant", name))?;
        Ok(to_tenant(model))
    }

    pub async fn find_tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        let found = tenants::Entity::find()
            .filter(tenants::Column::Name.eq(name))
            .one(self.conn())
            .await?;
        Ok(found.map(to_tenant))
    }

    pub async fn count_tenants(&self) -> StoreResult<u64> {
        Ok(tenants::Entity::find().count(self.conn()).await?)
    }

    pub async fn tenant_settings(&self, tenant: &TenantId) -> StoreResult<VersionedSettings> {
        let model = tenants::Entity::find_by_id(tenant.as_str())
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("tenant", tenant.as_str()))?;
        let settings = serde_json::from_str(&model.settings)
            .map_err(|e| StoreError::Corrupt("tenant settings", e.to_string()))?;
        Ok(VersionedSettings {
            settings,
            version: model.updated_at,
        })
    }

    /// Writes the settings if nobody else did since `expected_version` was read; otherwise
    /// [`StoreError::Conflict`].
    pub async fn replace_tenant_settings(
        &self,
        tenant: &TenantId,
        expected_version: i64,
        settings: &TenantSettings,
    ) -> StoreResult<VersionedSettings> {
        let text = serde_json::to_string(settings)
            .map_err(|e| StoreError::Corrupt("tenant settings", e.to_string()))?;
        // Versions must move forward even when two writes land in the same millisecond.
        let version = to_millis(Timestamp::now()).max(expected_version + 1);
        let result = tenants::Entity::update_many()
            .col_expr(tenants::Column::Settings, Expr::value(text))
            .col_expr(tenants::Column::UpdatedAt, Expr::value(version))
            .filter(tenants::Column::Id.eq(tenant.as_str()))
            .filter(tenants::Column::UpdatedAt.eq(expected_version))
            .exec(self.conn())
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::Conflict {
                resource: "tenant settings",
            });
        }
        Ok(VersionedSettings {
            settings: settings.clone(),
            version,
        })
    }
}
