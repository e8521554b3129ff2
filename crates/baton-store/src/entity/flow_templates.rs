use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "flow_templates")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub version_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub name: String,
    pub tenant_id: String,
    /// Keeps templates in the order they were first saved.
    pub position: i32,
    pub description: Option<String>,
    pub template: String,
    pub user_template: Option<String>,
    pub llm: Option<String>,
    pub temperature: Option<f64>,
    pub max_tool_calls: Option<i32>,
    /// JSON array of strings.
    pub tool_ids: String,
    /// JSON array of strings.
    pub fallbacks: String,
    /// JSON Schema text.
    pub response_schema: Option<String>,
    pub updated_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
