use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "budget_windows")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub budget_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub window_start: i64,
    pub tenant_id: String,
    pub spent_credits: i64,
    pub reserved_credits: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
