//! API keys: only the SHA-256 of a key and its visible prefix are stored.

use baton_domain::apikey::ApiKeyInfo;
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set};

use crate::entity::api_keys;
use crate::error::on_unique;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

/// What to store for a new key; the secret itself never reaches the store.
#[derive(Debug, Clone)]
pub struct NewApiKey<'a> {
    pub name: &'a str,
    pub key_hash: &'a str,
    pub prefix: &'a str,
    pub created_by: Option<&'a str>,
}

/// Who a presented key belongs to, if it is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    pub key_id: String,
    pub tenant_id: TenantId,
    /// Compared again in constant time by the caller.
    pub key_hash: String,
}

fn to_info(model: api_keys::Model) -> ApiKeyInfo {
    ApiKeyInfo {
        id: model.id,
        name: model.name,
        prefix: model.prefix,
        created_at: from_millis(model.created_at),
        last_used_at: model.last_used_at.map(from_millis),
        revoked_at: model.revoked_at.map(from_millis),
    }
}

impl Store {
    pub async fn create_api_key(
        &self,
        tenant: &TenantId,
        key: NewApiKey<'_>,
    ) -> StoreResult<ApiKeyInfo> {
        let model = api_keys::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(key.name.to_string()),
            key_hash: Set(key.key_hash.to_string()),
            prefix: Set(key.prefix.to_string()),
            created_by: Set(key.created_by.map(str::to_string)),
            created_at: Set(to_millis(Timestamp::now())),
            last_used_at: Set(None),
            revoked_at: Set(None),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("api key", key.prefix))?;
        Ok(to_info(model))
    }

    pub async fn list_api_keys(&self, tenant: &TenantId) -> StoreResult<Vec<ApiKeyInfo>> {
        let rows = api_keys::Entity::find()
            .filter(api_keys::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(api_keys::Column::Id)
            .all(self.conn())
            .await?;
        Ok(rows.into_iter().map(to_info).collect())
    }

    pub async fn get_api_key(&self, tenant: &TenantId, id: &str) -> StoreResult<ApiKeyInfo> {
        api_keys::Entity::find_by_id(id)
            .filter(api_keys::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .map(to_info)
            .ok_or_else(|| StoreError::not_found("api key", id))
    }

    /// Revokes the key (idempotent: revoking twice keeps the first time). Returns the key and its
    /// hash, so caches keyed by hash can drop it.
    pub async fn revoke_api_key(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<(ApiKeyInfo, String)> {
        api_keys::Entity::update_many()
            .col_expr(
                api_keys::Column::RevokedAt,
                Expr::value(to_millis(Timestamp::now())),
            )
            .filter(api_keys::Column::Id.eq(id))
            .filter(api_keys::Column::TenantId.eq(tenant.as_str()))
            .filter(api_keys::Column::RevokedAt.is_null())
            .exec(self.conn())
            .await?;
        let model = api_keys::Entity::find_by_id(id)
            .filter(api_keys::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("api key", id))?;
        let hash = model.key_hash.clone();
        Ok((to_info(model), hash))
    }

    /// Authentication lookup by hash; revoked keys are not found.
    pub async fn find_key_owner(&self, key_hash: &str) -> StoreResult<Option<KeyOwner>> {
        let found = api_keys::Entity::find()
            .filter(api_keys::Column::KeyHash.eq(key_hash))
            .filter(api_keys::Column::RevokedAt.is_null())
            .one(self.conn())
            .await?;
        Ok(found.map(|m| KeyOwner {
            key_id: m.id,
            tenant_id: TenantId::new(m.tenant_id),
            key_hash: m.key_hash,
        }))
    }

    /// Records when a key was last used (called off the request path, at most once a minute).
    pub async fn touch_api_key(&self, key_id: &str, at: Timestamp) -> StoreResult<()> {
        api_keys::Entity::update_many()
            .col_expr(api_keys::Column::LastUsedAt, Expr::value(to_millis(at)))
            .filter(api_keys::Column::Id.eq(key_id))
            .exec(self.conn())
            .await?;
        Ok(())
    }
}
