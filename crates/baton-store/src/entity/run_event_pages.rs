use sea_orm::entity::prelude::*;

/// Stored events of one run, one row per write (`crate::event_pages`).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "run_event_pages")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub tenant_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub first_seq: i32,
    /// JSON array of the page's events, in `seq` order; empty when the page is `packed`.
    pub events: String,
    pub created_at: i64,
    /// The JSON packed (`baton_migrations::packed_pages`): every page written since that
    /// migration.
    #[sea_orm(column_type = "Blob", nullable)]
    pub packed: Option<Vec<u8>>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
