//! Users who log in with email and password.

use baton_domain::user::User;
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set};

use crate::entity::users;
use crate::error::on_unique;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

/// A user with the stored password hash, for login only.
#[derive(Debug, Clone)]
pub struct UserCredentials {
    pub user: User,
    pub password_hash: String,
}

fn to_user(model: &users::Model) -> User {
    User {
        id: model.id.clone(),
        tenant_id: model.tenant_id.clone(),
        email: model.email.clone(),
        created_at: from_millis(model.created_at),
    }
}

impl Store {
    /// `email` must already be normalised; `password_hash` is a PHC string.
    pub async fn create_user(
        &self,
        tenant: &TenantId,
        email: &str,
        password_hash: &str,
    ) -> StoreResult<User> {
        let model = users::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            email: Set(email.to_string()),
            password_hash: Set(password_hash.to_string()),
            created_at: Set(to_millis(Timestamp::now())),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("user", email))?;
        Ok(to_user(&model))
    }

    /// Authentication lookup: the email identifies the tenant, so it is not tenant-scoped.
    pub async fn find_user_for_login(&self, email: &str) -> StoreResult<Option<UserCredentials>> {
        let found = users::Entity::find()
            .filter(users::Column::Email.eq(email))
            .one(self.conn())
            .await?;
        Ok(found.map(|m| UserCredentials {
            user: to_user(&m),
            password_hash: m.password_hash,
        }))
    }

    pub async fn find_user(&self, tenant: &TenantId, id: &str) -> StoreResult<Option<User>> {
        let found = users::Entity::find_by_id(id)
            .filter(users::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?;
        Ok(found.as_ref().map(to_user))
    }
}
