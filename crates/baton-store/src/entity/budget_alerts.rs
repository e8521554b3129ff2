use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "budget_alerts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub budget_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub window_start: i64,
    #[sea_orm(primary_key, auto_increment = false)]
    pub threshold: i32,
    pub tenant_id: String,
    pub spent_credits: i64,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Epoch milliseconds until which a sender holds the alert (0: nobody).
    pub leased_until: i64,
    /// Epoch milliseconds when the next delivery round is due (NULL: none is).
    pub retry_at: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
