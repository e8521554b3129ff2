//! Server-made secrets (the JWT signing key) shared by every instance over the database.

use baton_domain::Timestamp;
use sea_orm::{EntityTrait, Set};

use crate::entity::server_secrets;
use crate::time::to_millis;
use crate::{Store, StoreError, StoreResult};

impl Store {
    /// Returns the secret called `name`, storing `candidate` first if there is none yet. When
    /// instances start together, the first insert wins and all of them read the same value.
    pub async fn get_or_init_secret(&self, name: &str, candidate: &str) -> StoreResult<String> {
        let row = server_secrets::ActiveModel {
            name: Set(name.to_string()),
            value: Set(candidate.to_string()),
            created_at: Set(to_millis(Timestamp::now())),
        };
        server_secrets::Entity::insert(row)
            .on_conflict_do_nothing()
            .exec(self.conn())
            .await?;
        let stored = server_secrets::Entity::find_by_id(name)
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("server secret", name))?;
        Ok(stored.value)
    }
}
