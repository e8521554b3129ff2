//! Tenant-level named environments.

use baton_domain::environment::Environment;
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set};

use crate::entity::environments;
use crate::error::on_unique;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

fn to_environment(model: environments::Model) -> Environment {
    Environment {
        id: model.id,
        name: model.name,
        created_at: from_millis(model.created_at),
    }
}

impl Store {
    /// `name` must already be validated.
    pub async fn create_environment(
        &self,
        tenant: &TenantId,
        name: &str,
    ) -> StoreResult<Environment> {
        let model = environments::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(name.to_string()),
            created_at: Set(to_millis(Timestamp::now())),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("environment", name))?;
        Ok(to_environment(model))
    }

    pub async fn list_environments(&self, tenant: &TenantId) -> StoreResult<Vec<Environment>> {
        let rows = environments::Entity::find()
            .filter(environments::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(environments::Column::CreatedAt)
            .order_by_asc(environments::Column::Id)
            .all(self.conn())
            .await?;
        Ok(rows.into_iter().map(to_environment).collect())
    }

    pub async fn find_environment(
        &self,
        tenant: &TenantId,
        name: &str,
    ) -> StoreResult<Option<Environment>> {
        let found = environments::Entity::find()
            .filter(environments::Column::TenantId.eq(tenant.as_str()))
            .filter(environments::Column::Name.eq(name))
            .one(self.conn())
            .await?;
        Ok(found.map(to_environment))
    }
}
