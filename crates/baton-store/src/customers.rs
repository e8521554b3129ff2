//! End customers, keyed within a tenant by their external id.

use baton_domain::customer::{Customer, CustomerPatch, NewCustomer};
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use serde_json::Value;

use crate::entity::customers;
use crate::error::on_unique;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

pub(crate) fn to_customer(model: customers::Model) -> StoreResult<Customer> {
    let metadata = serde_json::from_str(&model.metadata)
        .map_err(|e| StoreError::Corrupt("customer metadata", e.to_string()))?;
    Ok(Customer {
        id: model.id,
        external_id: model.external_id,
        name: model.name,
        email: model.email,
        metadata,
        is_active: model.is_active,
        created_at: from_millis(model.created_at),
        updated_at: from_millis(model.updated_at),
    })
}

fn metadata_text(metadata: Option<&Value>) -> String {
    metadata.map_or_else(|| "{}".to_string(), Value::to_string)
}

impl Store {
    /// `customer` must already be validated.
    pub async fn create_customer(
        &self,
        tenant: &TenantId,
        customer: &NewCustomer,
    ) -> StoreResult<Customer> {
        let now = to_millis(Timestamp::now());
        let model = customers::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            external_id: Set(customer.external_id.clone()),
            name: Set(customer.name.clone()),
            email: Set(customer.email.clone()),
            metadata: Set(metadata_text(customer.metadata.as_ref())),
            is_active: Set(customer.is_active.unwrap_or(true)),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("customer", &customer.external_id))?;
        to_customer(model)
    }

    /// Returns the customer, creating it on first use of an unknown external id. Safe under
    /// concurrent first uses: the unique index decides, and everyone reads the winner.
    pub async fn ensure_customer(
        &self,
        tenant: &TenantId,
        external_id: &str,
    ) -> StoreResult<Customer> {
        if let Some(found) = self.find_customer(tenant, external_id).await? {
            return Ok(found);
        }
        let now = to_millis(Timestamp::now());
        let row = customers::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            external_id: Set(external_id.to_string()),
            name: Set(None),
            email: Set(None),
            metadata: Set("{}".to_string()),
            is_active: Set(true),
            created_at: Set(now),
            updated_at: Set(now),
        };
        customers::Entity::insert(row)
            .on_conflict_do_nothing_on([customers::Column::TenantId, customers::Column::ExternalId])
            .exec(self.conn())
            .await?;
        self.get_customer(tenant, external_id).await
    }

    pub async fn find_customer(
        &self,
        tenant: &TenantId,
        external_id: &str,
    ) -> StoreResult<Option<Customer>> {
        customers::Entity::find()
            .filter(customers::Column::TenantId.eq(tenant.as_str()))
            .filter(customers::Column::ExternalId.eq(external_id))
            .one(self.conn())
            .await?
            .map(to_customer)
            .transpose()
    }

    pub async fn get_customer(
        &self,
        tenant: &TenantId,
        external_id: &str,
    ) -> StoreResult<Customer> {
        self.find_customer(tenant, external_id)
            .await?
            .ok_or_else(|| StoreError::not_found("customer", external_id))
    }

    /// Customers in creation order, `limit` at a time after `offset`.
    pub async fn list_customers(
        &self,
        tenant: &TenantId,
        limit: u64,
        offset: u64,
    ) -> StoreResult<Vec<Customer>> {
        customers::Entity::find()
            .filter(customers::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(customers::Column::Id)
            .limit(limit)
            .offset(offset)
            .all(self.conn())
            .await?
            .into_iter()
            .map(to_customer)
            .collect()
    }

    /// Changes only the fields the patch gives (`patch` must already be validated).
    pub async fn update_customer(
        &self,
        tenant: &TenantId,
        external_id: &str,
        patch: &CustomerPatch,
    ) -> StoreResult<Customer> {
        let model = customers::Entity::find()
            .filter(customers::Column::TenantId.eq(tenant.as_str()))
            .filter(customers::Column::ExternalId.eq(external_id))
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("customer", external_id))?;
        let mut active = model.into_active_model();
        if let Some(name) = &patch.name {
            active.name = Set(Some(name.clone()));
        }
        if let Some(email) = &patch.email {
            active.email = Set(Some(email.clone()));
        }
        if let Some(metadata) = &patch.metadata {
            active.metadata = Set(metadata_text(Some(metadata)));
        }
        if let Some(is_active) = patch.is_active {
            active.is_active = Set(is_active);
        }
        active.updated_at = Set(to_millis(Timestamp::now()));
        to_customer(active.update(self.conn()).await?)
    }

    pub async fn delete_customer(&self, tenant: &TenantId, external_id: &str) -> StoreResult<()> {
        let result = customers::Entity::delete_many()
            .filter(customers::Column::TenantId.eq(tenant.as_str()))
            .filter(customers::Column::ExternalId.eq(external_id))
            .exec(self.conn())
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::not_found("customer", external_id));
        }
        Ok(())
    }
}
