//! Users who log in with email and password. Emails are unique platform-wide (login names a
//! user by email alone), so a taken email is `AlreadyExists` whichever tenant holds it.

use baton_domain::user::User;
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect,
    Set,
};

use crate::entity::users;
use crate::error::on_unique;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

/// A user with the stored password hash, for login only.
#[derive(Debug, Clone)]
pub struct UserCredentials {
    pub user: User,
    pub password_hash: String,
    /// Goes into the session token; a token with another version is refused.
    pub session_version: i64,
}

fn to_user(model: &users::Model) -> User {
    User {
        id: model.id.clone(),
        tenant_id: model.tenant_id.clone(),
        email: model.email.clone(),
        created_at: from_millis(model.created_at),
        password_changed_at: model.password_changed_at.map(from_millis),
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
            session_version: Set(0),
            password_changed_at: Set(None),
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
            session_version: m.session_version,
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

    pub async fn get_user(&self, tenant: &TenantId, id: &str) -> StoreResult<User> {
        self.find_user(tenant, id)
            .await?
            .ok_or_else(|| StoreError::not_found("user", id))
    }

    /// The tenant's users, oldest first.
    pub async fn list_users(&self, tenant: &TenantId) -> StoreResult<Vec<User>> {
        let rows = users::Entity::find()
            .filter(users::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(users::Column::CreatedAt)
            .order_by_asc(users::Column::Id)
            .all(self.conn())
            .await?;
        Ok(rows.iter().map(to_user).collect())
    }

    /// The session version of a user of `tenant`; `None` when there is no such user (deleted).
    /// Read for every session-authenticated request that misses the authenticator's cache.
    pub async fn user_session_version(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<Option<i64>> {
        Ok(users::Entity::find_by_id(id)
            .filter(users::Column::TenantId.eq(tenant.as_str()))
            .select_only()
            .column(users::Column::SessionVersion)
            .into_tuple::<i64>()
            .one(self.conn())
            .await?)
    }

    /// Replaces the password hash and bumps the session version in one statement, so every
    /// session issued before is refused from then on.
    pub async fn set_user_password(
        &self,
        tenant: &TenantId,
        id: &str,
        password_hash: &str,
    ) -> StoreResult<()> {
        let result = users::Entity::update_many()
            .col_expr(users::Column::PasswordHash, Expr::value(password_hash))
            .col_expr(
                users::Column::SessionVersion,
                Expr::col(users::Column::SessionVersion).add(1),
            )
            .col_expr(
                users::Column::PasswordChangedAt,
                Expr::value(to_millis(Timestamp::now())),
            )
            .filter(users::Column::Id.eq(id))
            .filter(users::Column::TenantId.eq(tenant.as_str()))
            .exec(self.conn())
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::not_found("user", id));
        }
        Ok(())
    }

    pub async fn delete_user(&self, tenant: &TenantId, id: &str) -> StoreResult<()> {
        let result = users::Entity::delete_many()
            .filter(users::Column::Id.eq(id))
            .filter(users::Column::TenantId.eq(tenant.as_str()))
            .exec(self.conn())
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::not_found("user", id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::test_db::memory_store;

    #[tokio::test]
    async fn users_are_tenant_scoped_and_a_password_change_bumps_the_session_version() {
        let store = memory_store().await;
        let a = store.create_tenant("a").await.unwrap().id;
        let b = store.create_tenant("b").await.unwrap().id;
        let user = store.create_user(&a, "u@a.io", "hash-1").await.unwrap();
        assert_eq!(user.password_changed_at, None);

        // Emails are unique across tenants.
        assert!(matches!(
            store.create_user(&b, "u@a.io", "hash").await,
            Err(StoreError::AlreadyExists { .. })
        ));

        // Tenant b sees nothing of a's user.
        assert!(store.list_users(&b).await.unwrap().is_empty());
        assert_eq!(
            store.user_session_version(&b, &user.id).await.unwrap(),
            None
        );
        assert!(matches!(
            store.set_user_password(&b, &user.id, "x").await,
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            store.delete_user(&b, &user.id).await,
            Err(StoreError::NotFound { .. })
        ));

        assert_eq!(
            store.user_session_version(&a, &user.id).await.unwrap(),
            Some(0)
        );
        store
            .set_user_password(&a, &user.id, "hash-2")
            .await
            .unwrap();
        assert_eq!(
            store.user_session_version(&a, &user.id).await.unwrap(),
            Some(1)
        );
        let login = store.find_user_for_login("u@a.io").await.unwrap().unwrap();
        assert_eq!(
            (login.password_hash.as_str(), login.session_version),
            ("hash-2", 1)
        );
        assert!(login.user.password_changed_at.is_some());
        assert_eq!(store.list_users(&a).await.unwrap(), vec![login.user]);

        store.delete_user(&a, &user.id).await.unwrap();
        assert_eq!(
            store.user_session_version(&a, &user.id).await.unwrap(),
            None
        );
        assert!(store.list_users(&a).await.unwrap().is_empty());
        // The email is free again.
        store.create_user(&b, "u@a.io", "hash").await.unwrap();
    }
}
