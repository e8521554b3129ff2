use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "runs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub tenant_id: String,
    pub root_id: String,
    pub parent_id: Option<String>,
    pub depth: i32,
    pub agent_role: Option<String>,
    pub kind: String,
    pub environment: Option<String>,
    pub flow_name: Option<String>,
    pub requested_model: String,
    pub served_model: Option<String>,
    pub provider: Option<String>,
    pub status: String,
    pub finish_reason: Option<String>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub reasoning_tokens: i64,
    pub cached_tokens: i64,
    pub web_search_calls: i64,
    pub inference_count: i64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    pub pricing_uncertain: bool,
    pub duration_ms: i64,
    pub customer_id: Option<String>,
    pub customer_external_id: Option<String>,
    /// JSON array of strings.
    pub tags: String,
    pub request_text: Option<String>,
    pub response_text: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub detail_dropped: bool,
    pub fallback_used: bool,
    pub was_cached: bool,
    /// JSON array of attempts.
    pub attempts: String,
    /// JSON array of tool call records.
    pub tool_calls: String,
    /// JSON array of warnings.
    pub warnings: String,
    pub callback_origin: Option<String>,
    pub is_debug: bool,
    pub cancel_requested_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub cancel_requested_by: Option<String>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    /// JSON array of the budget holds the run carries until it is finished.
    pub budget_holds: String,
    /// The packed page of the run's events written with its finished row, from its first
    /// event (`crate::event_pages`); other pages are `run_event_pages` rows.
    #[sea_orm(column_type = "Blob", nullable)]
    pub event_page: Option<Vec<u8>>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
