//! Reading the invocation log: list filters, keyset positions, run summaries and the internal
//! log lines kept for debug runs.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Timestamp;
use crate::run::{RunRecord, RunStatus};

/// Default and largest page of `GET /llm-logs`.
pub const DEFAULT_PAGE_SIZE: u32 = 50;
pub const MAX_PAGE_SIZE: u32 = 200;

/// Which runs a log listing returns. Every condition given must hold; an empty list means "any".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogFilter {
    /// Created at or after.
    pub from: Option<Timestamp>,
    /// Created before.
    pub to: Option<Timestamp>,
    pub environments: Vec<String>,
    pub flows: Vec<String>,
    pub statuses: Vec<RunStatus>,
    /// Runs carrying any of these tags.
    pub tags: Vec<String>,
    pub customer_external_id: Option<String>,
    /// Only requests without a parent (no sub-agents, no classifier calls).
    pub root_only: bool,
    pub parent_id: Option<String>,
    /// `Some(true)`: runs a cancel was requested for; `Some(false)`: the others.
    pub cancelled: Option<bool>,
}

/// Where a page of the log ends: the listing is ordered newest first by `(created_at, id)`, and
/// the next page holds the rows strictly after this one in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPosition {
    pub created_at: Timestamp,
    pub id: String,
}

/// One run as a log listing shows it: everything but the request and response bodies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub id: String,
    pub root_request_id: String,
    pub parent_request_id: Option<String>,
    pub depth: u32,
    pub agent_role: Option<String>,
    /// `chat`, `inference` or `flow`.
    pub kind: String,
    pub environment: Option<String>,
    pub flow_name: Option<String>,
    pub requested_model: String,
    pub served_model: Option<String>,
    pub provider: Option<String>,
    /// `Pending`, `Succeeded` or `Failed`.
    pub status: String,
    pub finish_reason: Option<String>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub reasoning_tokens: u64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub duration_ms: u64,
    pub customer_id: Option<String>,
    pub customer_external_id: Option<String>,
    pub tags: Vec<String>,
    pub error_code: Option<String>,
    pub fallback_used: bool,
    pub was_cached: bool,
    pub detail_dropped: bool,
    /// A cancel was requested for the run (it stops, or stopped, at its next step).
    pub cancelled: bool,
    pub cancel_requested_at: Option<Timestamp>,
    pub cancelled_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub completed_at: Option<Timestamp>,
}

impl RunSummary {
    pub fn of(record: &RunRecord) -> RunSummary {
        RunSummary {
            id: record.id.clone(),
            root_request_id: record.root_id.clone(),
            parent_request_id: record.parent_id.clone(),
            depth: record.depth,
            agent_role: record.agent_role.clone(),
            kind: record.kind.as_str().to_string(),
            environment: record.environment.clone(),
            flow_name: record.flow_name.clone(),
            requested_model: record.requested_model.clone(),
            served_model: record.served_model.clone(),
            provider: record.provider.clone(),
            status: record.status.as_str().to_string(),
            finish_reason: record.finish_reason.clone(),
            tokens_in: record.usage.tokens_in,
            tokens_out: record.usage.tokens_out,
            reasoning_tokens: record.usage.reasoning_tokens,
            cost_credits: record.cost_credits,
            cost_usd: crate::credits::Credits(record.cost_credits).to_usd(),
            duration_ms: record.duration_ms,
            customer_id: record.customer_id.clone(),
            customer_external_id: record.customer_external_id.clone(),
            tags: record.tags.clone(),
            error_code: record.error_code.clone(),
            fallback_used: record.fallback_used,
            was_cached: record.was_cached,
            detail_dropped: record.detail_dropped,
            cancelled: record.cancel_requested_at.is_some(),
            cancel_requested_at: record.cancel_requested_at,
            cancelled_at: record.cancelled_at,
            created_at: record.created_at,
            completed_at: record.completed_at,
        }
    }
}

/// One internal log line kept with a run made with `x_log_level` or `is_debug`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunLogEntry {
    pub id: String,
    pub run_id: String,
    /// Order within the run.
    pub seq: u32,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub level: String,
    /// The module that logged the line.
    pub target: String,
    pub message: String,
    /// Structured fields of the line.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub fields: Value,
    pub timestamp: Timestamp,
}
