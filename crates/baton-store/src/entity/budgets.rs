use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "budgets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub period: String,
    pub limit_credits: i64,
    /// JSON array of percentages.
    pub alert_thresholds: String,
    pub webhook_url: Option<String>,
    /// HMAC key of the webhook's signature.
    pub webhook_secret: String,
    pub hard_limit: bool,
    pub customer_external_id: Option<String>,
    pub tag: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
