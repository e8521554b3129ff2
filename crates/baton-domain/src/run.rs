//! Runs: one row of the invocation log per request (and per sub-agent request).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::Usage;
use crate::{TenantId, Timestamp};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RunStatus {
    Pending,
    Succeeded,
    Failed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "Pending",
            RunStatus::Succeeded => "Succeeded",
            RunStatus::Failed => "Failed",
        }
    }

    pub fn parse(raw: &str) -> Option<RunStatus> {
        match raw.to_ascii_lowercase().as_str() {
            "pending" => Some(RunStatus::Pending),
            "succeeded" => Some(RunStatus::Succeeded),
            "failed" => Some(RunStatus::Failed),
            _ => None,
        }
    }
}

/// What kind of request made the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunKind {
    /// `/chat/completions`.
    Chat,
    /// `/inference`.
    Inference,
    /// A flow run.
    Flow,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Chat => "chat",
            RunKind::Inference => "inference",
            RunKind::Flow => "flow",
        }
    }
}

/// The environment label of requests made through the compatible endpoint.
pub const COMPATIBLE_ENVIRONMENT: &str = "openai-compatible";

/// One model call tried for the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub model: String,
    /// `succeeded`, or the error code that ended the attempt.
    pub outcome: String,
    pub duration_ms: u64,
}

/// One tool call of a run, as the log keeps it (SPEC.md "Caller-hosted tools": the endpoint
/// actually used and where it came from).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolCallRecord {
    pub call_id: String,
    pub tool_name: String,
    /// `External`, `Virtual`, `Agent`, `CritiqueLoop`, `Mcp`; empty for a tool the model made up.
    pub tool_type: String,
    /// `succeeded` or `failed`.
    pub status: String,
    /// The endpoint called, without query or credentials.
    pub target_url: Option<String>,
    /// `tool`, `environment` or `callback`.
    pub origin_source: Option<String>,
    pub duration_ms: u64,
    /// Why the call failed, as the model was told.
    pub error: Option<String>,
    /// The model turn (0-based) that asked for the call.
    pub turn: u32,
    /// Agent tools: the child request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_request_id: Option<String>,
    /// Agent tools: what the child's whole subtree cost, in credits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_credits_used: Option<i64>,
}

/// Something the caller should know about a run that did not fail it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunWarning {
    /// `UNRESOLVED_PARAMETER`, `MAX_TOOL_CALLS_REACHED`, ...
    pub code: String,
    pub message: String,
    pub parameter: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub id: String,
    #[serde(skip)]
    pub tenant: Option<TenantId>,
    pub root_id: String,
    pub parent_id: Option<String>,
    pub depth: u32,
    pub agent_role: Option<String>,
    pub kind: RunKind,
    pub environment: Option<String>,
    pub flow_name: Option<String>,
    pub requested_model: String,
    pub served_model: Option<String>,
    pub provider: Option<String>,
    pub status: RunStatus,
    pub finish_reason: Option<String>,
    pub usage: Usage,
    /// Model calls that answered (a run with tools makes one a turn; sub-agents' are theirs).
    #[serde(default)]
    pub inference_count: u32,
    /// Billed cost (with the tenant's markup), in credits.
    pub cost_credits: i64,
    /// Catalogue price, in credits.
    pub raw_cost_credits: i64,
    pub pricing_uncertain: bool,
    pub duration_ms: u64,
    pub customer_id: Option<String>,
    pub customer_external_id: Option<String>,
    pub tags: Vec<String>,
    /// The request as sent (messages, model, parameters), JSON; absent when retention dropped it.
    pub request: Option<RawJson>,
    /// The response (text, tool calls, citations, finish reason), JSON.
    pub response: Option<RawJson>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub detail_dropped: bool,
    pub fallback_used: bool,
    /// Served from the response cache: no provider call, no cost.
    pub was_cached: bool,
    pub attempts: Vec<Attempt>,
    pub tool_calls: Vec<ToolCallRecord>,
    pub warnings: Vec<RunWarning>,
    /// The origin of `X-Baton-Callback-Url` (never its token), when the request sent one.
    pub callback_origin: Option<String>,
    /// Set by `POST /runs/{runId}/cancel`; the run stops at its next step.
    pub cancel_requested_at: Option<Timestamp>,
    pub cancel_requested_by: Option<String>,
    /// When the run stopped because of a cancellation.
    pub cancelled_at: Option<Timestamp>,
    pub is_debug: bool,
    pub created_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    /// Budget holds taken for this request, released when it is logged as finished (stored
    /// with its row, so that the abandoned-run sweep can release them if it never is).
    #[serde(skip)]
    pub budget_holds: Vec<crate::budget::BudgetHold>,
    /// An answered one-call request's lifecycle events, kept in this compact form instead of
    /// as stored events (the store keeps it with the row and rebuilds the events when read).
    #[serde(skip)]
    pub lifecycle: Option<Box<crate::lifecycle::CallLifecycle>>,
}

impl RunRecord {
    /// A fresh, pending run record with every counter at zero.
    pub fn pending(
        id: String,
        tenant: TenantId,
        kind: RunKind,
        requested_model: String,
    ) -> RunRecord {
        RunRecord {
            root_id: id.clone(),
            id,
            tenant: Some(tenant),
            parent_id: None,
            depth: 0,
            agent_role: None,
            kind,
            environment: None,
            flow_name: None,
            requested_model,
            served_model: None,
            provider: None,
            status: RunStatus::Pending,
            finish_reason: None,
            usage: Usage::default(),
            inference_count: 0,
            cost_credits: 0,
            raw_cost_credits: 0,
            pricing_uncertain: false,
            duration_ms: 0,
            customer_id: None,
            customer_external_id: None,
            tags: Vec::new(),
            request: None,
            response: None,
            error_code: None,
            error_message: None,
            detail_dropped: false,
            fallback_used: false,
            was_cached: false,
            attempts: Vec::new(),
            tool_calls: Vec::new(),
            warnings: Vec::new(),
            callback_origin: None,
            cancel_requested_at: None,
            cancel_requested_by: None,
            cancelled_at: None,
            is_debug: false,
            created_at: Timestamp::now(),
            completed_at: None,
            budget_holds: Vec::new(),
            lifecycle: None,
        }
    }
}

/// A stream event kept for `/llm-logs/{id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEvent {
    pub id: String,
    pub run_id: String,
    pub seq: u32,
    pub event_type: String,
    pub payload: RawJson,
    pub created_at: Timestamp,
}

/// JSON serialised once, when it is produced (a stored event's envelope, a run's request and
/// response): the log writer stores the text as it is and `/llm-logs` sends it as it is, with
/// no `Value` tree built, copied or dropped in between.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(Box<serde_json::value::RawValue>);

impl RawJson {
    /// What `value` serialises to (`null` if it cannot be serialised, which the request,
    /// response and event types never fail to).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Self {
        RawJson(
            serde_json::value::to_raw_value(value)
                .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned()),
        )
    }

    /// Stored text, checked to be JSON.
    pub fn from_text(text: String) -> Result<Self, serde_json::Error> {
        serde_json::value::RawValue::from_string(text).map(RawJson)
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Parsed, for the few readers that look inside.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}
