//! `/api/v1/llm-logs`: the invocation log (SPEC.md "Invocation log"): a filtered, cursor-paged
//! listing, one run in full, its place in the agent tree, its stored events and its internal log
//! lines.

use std::collections::BTreeMap;

use axum::extract::State;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use baton_domain::Timestamp;
use baton_domain::logs::{
    DEFAULT_PAGE_SIZE, LogFilter, LogPosition, MAX_PAGE_SIZE, RunLogEntry, RunSummary,
};
use baton_domain::run::{RawJson, RunRecord, RunStatus, RunWarning, ToolCallRecord};
use baton_domain::{TenantId, credits::Credits};
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::events::EventFilter;
use crate::extract::{PathParam, Query};
use crate::routes::flow_runs::{find_run, written};
use crate::state::AppState;

/// The query of `GET /llm-logs` (documentation; parsed by [`parse_list_query`], since arrays
/// come as repeated parameters or comma lists).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct LlmLogsQuery {
    /// `nextCursor` of the previous page.
    cursor: Option<String>,
    /// Rows per page, 1 to 200 (default 50).
    page_size: Option<u32>,
    /// Created at or after (ISO 8601, or a date meaning its midnight UTC).
    from: Option<String>,
    /// Created before (ISO 8601, or a date).
    to: Option<String>,
    /// Environment names (repeat the parameter or separate with commas).
    environments: Option<Vec<String>>,
    /// Flow names.
    flows: Option<Vec<String>>,
    /// `Pending`, `Succeeded`, `Failed` (any case).
    statuses: Option<Vec<String>>,
    /// Runs carrying any of these tags.
    tags: Option<Vec<String>>,
    /// End customer's external id.
    customer_id: Option<String>,
    /// Only requests that are not sub-agents.
    root_only: Option<bool>,
    /// Only the children of this request.
    parent_request_id: Option<String>,
    /// `true`: runs a cancel was requested for; `false`: the others.
    cancelled: Option<bool>,
}

/// What a list request asked for, checked.
#[derive(Debug, PartialEq)]
struct ListRequest {
    filter: LogFilter,
    after: Option<LogPosition>,
    page_size: u32,
}

/// Query pairs as sent: `?tags=a&tags=b,c`.
type Pairs = Vec<(String, String)>;

fn list_values(raw: &str) -> impl Iterator<Item = String> + '_ {
    raw.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

fn parse_bool(param: &str, raw: &str) -> Result<bool, ApiError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ApiError::validation(
            param,
            format!("{param} must be true or false"),
        )),
    }
}

fn parse_time(param: &str, raw: &str) -> Result<Timestamp, ApiError> {
    Timestamp::parse_input(raw).ok_or_else(|| {
        ApiError::validation(
            param,
            format!("{param} must be an ISO 8601 date-time such as 2026-11-22T10:00:00Z"),
        )
    })
}

fn encode_cursor(position: &LogPosition) -> String {
    URL_SAFE_NO_PAD.encode(format!(
        "{}.{}",
        position.created_at.0.timestamp_millis(),
        position.id
    ))
}

fn decode_cursor(raw: &str) -> Result<LogPosition, ApiError> {
    let invalid = || ApiError::validation("cursor", "cursor is not one this API returned");
    let bytes = URL_SAFE_NO_PAD.decode(raw.trim()).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let (millis, id) = text.split_once('.').ok_or_else(invalid)?;
    let millis: i64 = millis.parse().map_err(|_| invalid())?;
    let created_at = DateTime::from_timestamp_millis(millis).ok_or_else(invalid)?;
    if id.is_empty() || id.len() > 64 {
        return Err(invalid());
    }
    Ok(LogPosition {
        created_at: Timestamp(created_at),
        id: id.to_string(),
    })
}

fn parse_list_query(pairs: Pairs) -> Result<ListRequest, ApiError> {
    let mut filter = LogFilter::default();
    let mut after = None;
    let mut page_size = None;
    let mut seen: Vec<String> = Vec::new();
    for (name, value) in pairs {
        let scalar = !matches!(
            name.as_str(),
            "environments" | "flows" | "statuses" | "tags"
        );
        if scalar && seen.contains(&name) {
            return Err(ApiError::validation(
                name.as_str(),
                format!("{name} is given more than once"),
            ));
        }
        seen.push(name.clone());
        match name.as_str() {
            "cursor" => after = Some(decode_cursor(&value)?),
            "pageSize" => {
                let size: u32 = value.trim().parse().map_err(|_| {
                    ApiError::validation("pageSize", "pageSize must be a whole number")
                })?;
                if !(1..=MAX_PAGE_SIZE).contains(&size) {
                    return Err(ApiError::validation(
                        "pageSize",
                        format!("pageSize must be between 1 and {MAX_PAGE_SIZE}"),
                    ));
                }
                page_size = Some(size);
            }
            "from" => filter.from = Some(parse_time("from", &value)?),
            "to" => filter.to = Some(parse_time("to", &value)?),
            "environments" => filter.environments.extend(list_values(&value)),
            "flows" => filter.flows.extend(list_values(&value)),
            "statuses" => {
                for raw in list_values(&value) {
                    let status = RunStatus::parse(&raw).ok_or_else(|| {
                        ApiError::validation(
                            "statuses",
                            format!("unknown status '{raw}': use Pending, Succeeded or Failed"),
                        )
                    })?;
                    if !filter.statuses.contains(&status) {
                        filter.statuses.push(status);
                    }
                }
            }
            "tags" => filter.tags.extend(list_values(&value)),
            "customerId" => filter.customer_external_id = Some(value.trim().to_string()),
            "rootOnly" => filter.root_only = parse_bool("rootOnly", &value)?,
            "parentRequestId" => filter.parent_id = Some(value.trim().to_string()),
            "cancelled" => filter.cancelled = Some(parse_bool("cancelled", &value)?),
            other => {
                return Err(ApiError::validation(
                    other,
                    format!("unknown query parameter '{other}'"),
                ));
            }
        }
    }
    if let (Some(from), Some(to)) = (filter.from, filter.to)
        && from > to
    {
        return Err(ApiError::validation("from", "from must not be after to"));
    }
    Ok(ListRequest {
        filter,
        after,
        page_size: page_size.unwrap_or(DEFAULT_PAGE_SIZE),
    })
}

/// One page of the log.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogPage {
    /// Newest first.
    pub items: Vec<RunSummary>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// Runs of the tenant, newest first, filtered and cursor-paged.
///
/// Paging is keyset over `(createdAt, id)`: following `nextCursor` never repeats a row and
/// never skips one that was in the log when the listing started, however many rows are written
/// meanwhile (see docs/decisions.md for rows written late).
#[utoipa::path(get, path = "/api/v1/llm-logs", tag = "llm-logs", params(LlmLogsQuery),
    responses(
        (status = 200, description = "One page of the log", body = LogPage),
        (status = 400, description = "Invalid filter, cursor or page size", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn list_llm_logs(
    State(state): State<AppState>,
    principal: Principal,
    Query(pairs): Query<Pairs>,
) -> ApiResult<axum::Json<LogPage>> {
    let request = parse_list_query(pairs)?;
    let mut items = state
        .store
        .list_log(
            &principal.tenant,
            &request.filter,
            request.after.as_ref(),
            u64::from(request.page_size) + 1,
        )
        .await?;
    let page = usize::try_from(request.page_size).unwrap_or(usize::MAX);
    let next_cursor = if items.len() > page {
        items.truncate(page);
        items.last().map(|last| {
            encode_cursor(&LogPosition {
                created_at: last.created_at,
                id: last.id.clone(),
            })
        })
    } else {
        None
    };
    Ok(axum::Json(LogPage { items, next_cursor }))
}

/// Request details (SPEC.md "Invocation log entry").
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogRequest {
    /// The model the client asked for.
    pub model: String,
    pub environment: Option<String>,
    pub flow_name: Option<String>,
    pub tags: Vec<String>,
    /// The request as sent (messages, parameters); null when retention dropped it.
    #[schema(value_type = Option<Object>)]
    pub body: Option<RawJson>,
}

/// Response details.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogResponse {
    /// Text, tool calls, citations as the run produced them; null when retention dropped it.
    #[schema(value_type = Option<Object>)]
    pub body: Option<RawJson>,
    pub finish_reason: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogUsage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub reasoning_tokens: u64,
    pub cached_tokens: u64,
    pub web_search_calls: u64,
    /// Billed (with the tenant's markup).
    pub cost_credits: i64,
    pub cost_usd: f64,
    /// Catalogue price.
    pub raw_cost_credits: i64,
    pub pricing_uncertain: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogHierarchy {
    pub parent_request_id: Option<String>,
    pub root_request_id: String,
    pub depth: u32,
    pub agent_role: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogCustomer {
    pub id: Option<String>,
    pub external_id: Option<String>,
}

/// One model call tried for the run.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogAttempt {
    pub model: String,
    /// `succeeded`, or the error code that ended the attempt.
    pub outcome: String,
    pub duration_ms: u64,
}

/// A run in full (SPEC.md "Invocation log entry").
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogEntryDetail {
    pub id: String,
    /// `chat`, `inference` or `flow`.
    pub kind: String,
    /// `Pending`, `Succeeded` or `Failed`.
    pub status: String,
    pub request: LogRequest,
    pub response: LogResponse,
    /// Each with the endpoint actually used (`targetUrl`) and where it came from (`originSource`).
    pub tool_calls: Vec<ToolCallRecord>,
    pub usage: LogUsage,
    pub duration_ms: u64,
    pub hierarchy: LogHierarchy,
    pub customer: LogCustomer,
    /// Feedback is not collected yet: always null.
    #[schema(value_type = Option<f64>)]
    pub feedback_score: Option<f64>,
    pub detail_dropped: bool,
    pub cancelled: bool,
    pub cancel_requested_at: Option<Timestamp>,
    pub cancelled_at: Option<Timestamp>,
    pub cancel_requested_by: Option<String>,
    pub served_model: Option<String>,
    pub provider: Option<String>,
    pub fallback_used: bool,
    pub was_cached: bool,
    pub attempts: Vec<LogAttempt>,
    pub warnings: Vec<RunWarning>,
    pub environment: Option<String>,
    pub flow_name: Option<String>,
    pub tags: Vec<String>,
    pub is_debug: bool,
    pub callback_origin: Option<String>,
    pub created_at: Timestamp,
    pub completed_at: Option<Timestamp>,
    // progressScore, progressCertainty and minProgressScore are present only for runs that
    // opted into verification; nothing scores runs yet, so they are never written.
}

impl LogEntryDetail {
    fn of(run: RunRecord) -> LogEntryDetail {
        LogEntryDetail {
            kind: run.kind.as_str().to_string(),
            status: run.status.as_str().to_string(),
            request: LogRequest {
                model: run.requested_model,
                environment: run.environment.clone(),
                flow_name: run.flow_name.clone(),
                tags: run.tags.clone(),
                body: run.request,
            },
            response: LogResponse {
                body: run.response,
                finish_reason: run.finish_reason,
                error_code: run.error_code,
                error_message: run.error_message,
            },
            tool_calls: run.tool_calls,
            usage: LogUsage {
                tokens_in: run.usage.tokens_in,
                tokens_out: run.usage.tokens_out,
                reasoning_tokens: run.usage.reasoning_tokens,
                cached_tokens: run.usage.cached_tokens,
                web_search_calls: run.usage.web_search_calls,
                cost_credits: run.cost_credits,
                cost_usd: Credits(run.cost_credits).to_usd(),
                raw_cost_credits: run.raw_cost_credits,
                pricing_uncertain: run.pricing_uncertain,
            },
            duration_ms: run.duration_ms,
            hierarchy: LogHierarchy {
                parent_request_id: run.parent_id,
                root_request_id: run.root_id,
                depth: run.depth,
                agent_role: run.agent_role,
            },
            customer: LogCustomer {
                id: run.customer_id,
                external_id: run.customer_external_id,
            },
            feedback_score: None,
            detail_dropped: run.detail_dropped,
            // Asked to stop, or stopped because a run above it was.
            cancelled: run.cancel_requested_at.is_some() || run.cancelled_at.is_some(),
            cancel_requested_at: run.cancel_requested_at,
            cancelled_at: run.cancelled_at,
            cancel_requested_by: run.cancel_requested_by,
            served_model: run.served_model,
            provider: run.provider,
            fallback_used: run.fallback_used,
            was_cached: run.was_cached,
            attempts: run
                .attempts
                .into_iter()
                .map(|a| LogAttempt {
                    model: a.model,
                    outcome: a.outcome,
                    duration_ms: a.duration_ms,
                })
                .collect(),
            warnings: run.warnings,
            environment: run.environment,
            flow_name: run.flow_name,
            tags: run.tags,
            is_debug: run.is_debug,
            callback_origin: run.callback_origin,
            created_at: run.created_at,
            completed_at: run.completed_at,
            id: run.id,
        }
    }
}

#[utoipa::path(get, path = "/api/v1/llm-logs/{id}", tag = "llm-logs",
    params(("id" = String, Path, description = "Run (request) id")),
    responses(
        (status = 200, description = "The run in full", body = LogEntryDetail),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
    ))]
pub async fn get_llm_log(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<LogEntryDetail>> {
    let run = find_run(&state, &principal.tenant, &id).await?;
    Ok(axum::Json(LogEntryDetail::of(run)))
}

/// Where a run sits in its agent tree.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogHierarchyView {
    /// The root first, the run itself last.
    pub breadcrumb: Vec<RunSummary>,
    /// Null for a root request.
    pub parent: Option<RunSummary>,
    /// Direct children, oldest first.
    pub children: Vec<RunSummary>,
}

#[utoipa::path(get, path = "/api/v1/llm-logs/{id}/hierarchy", tag = "llm-logs",
    params(("id" = String, Path, description = "Run (request) id")),
    responses(
        (status = 200, description = "Ancestors, parent and children", body = LogHierarchyView),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
    ))]
pub async fn get_llm_log_hierarchy(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<LogHierarchyView>> {
    written(&state, &principal.tenant, &id).await?;
    let breadcrumb = state.store.run_breadcrumb(&principal.tenant, &id).await?;
    let children = state.store.run_children(&principal.tenant, &id).await?;
    let parent = breadcrumb
        .len()
        .checked_sub(2)
        .and_then(|i| breadcrumb.get(i))
        .filter(|p| breadcrumb.last().and_then(|r| r.parent_request_id.as_ref()) == Some(&p.id))
        .cloned();
    Ok(axum::Json(LogHierarchyView {
        breadcrumb,
        parent,
        children,
    }))
}

/// The stored event envelopes of a run, in the order they were emitted.
///
/// A request tree's events are stored under its root request, each envelope naming the agent
/// (`agentPath`) that emitted it; a sub-agent's events are the root's whose `agentPath` starts
/// with the sub-agent's own path.
async fn events_of(
    state: &AppState,
    tenant: &TenantId,
    id: &str,
) -> ApiResult<Vec<baton_domain::run::StoredEvent>> {
    written(state, tenant, id).await?;
    let breadcrumb = state.store.run_breadcrumb(tenant, id).await?;
    let own = state.store.run_events(tenant, id).await?;
    let Some(root) = breadcrumb.first().filter(|root| root.id != id) else {
        return Ok(own);
    };
    if !own.is_empty() {
        return Ok(own);
    }
    let path: Vec<String> = breadcrumb
        .iter()
        .skip(1)
        .map(|run| run.agent_role.clone().unwrap_or_default())
        .collect();
    let under = |event: &baton_domain::run::StoredEvent| {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Placed {
            agent_path: Vec<String>,
        }
        let Ok(Placed { agent_path }) = serde_json::from_str::<Placed>(event.payload.as_str())
        else {
            return false;
        };
        agent_path.len() >= path.len() && agent_path.iter().zip(&path).all(|(a, b)| a == b)
    };
    Ok(state
        .store
        .run_events(tenant, &root.id)
        .await?
        .into_iter()
        .filter(under)
        .collect())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct EventsQuery {
    /// Event types to keep, comma-separated or repeated: camelCase (`toolStarted`), dotted
    /// (`tool.started`) or with a trailing wildcard (`tool*`, `agent.*`).
    types: Option<Vec<String>>,
}

fn parse_types(pairs: Pairs) -> Result<EventFilter, ApiError> {
    let mut patterns = Vec::new();
    for (name, value) in pairs {
        if name != "types" {
            return Err(ApiError::validation(
                name.as_str(),
                format!("unknown query parameter '{name}'"),
            ));
        }
        for pattern in list_values(&value) {
            EventFilter::check_pattern(&pattern)
                .map_err(|message| ApiError::validation("types", message))?;
            patterns.push(pattern);
        }
    }
    Ok(EventFilter::new(&patterns))
}

#[utoipa::path(get, path = "/api/v1/llm-logs/{id}/events", tag = "llm-logs",
    params(("id" = String, Path, description = "Run (request) id"), EventsQuery),
    responses(
        (status = 200, description = "Stored event envelopes, in order", body = [Object]),
        (status = 400, description = "Invalid types filter", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
    ))]
pub async fn get_llm_log_events(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Query(pairs): Query<Pairs>,
) -> ApiResult<axum::Json<Vec<RawJson>>> {
    let filter = parse_types(pairs)?;
    let events = events_of(&state, &principal.tenant, &id).await?;
    Ok(axum::Json(
        events
            .into_iter()
            .filter(|e| filter.allows(&e.event_type))
            .map(|e| e.payload)
            .collect(),
    ))
}

/// How many events of each type a run stored.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventStats {
    pub total: u64,
    /// Event type -> count.
    pub counts: BTreeMap<String, u64>,
}

/// Over the same events as `/events`, the same `types` filter included.
#[utoipa::path(get, path = "/api/v1/llm-logs/{id}/events/stats", tag = "llm-logs",
    params(("id" = String, Path, description = "Run (request) id"), EventsQuery),
    responses(
        (status = 200, description = "Event counts per type", body = EventStats),
        (status = 400, description = "Invalid types filter, or an unknown parameter", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
    ))]
pub async fn get_llm_log_event_stats(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
    Query(pairs): Query<Pairs>,
) -> ApiResult<axum::Json<EventStats>> {
    let filter = parse_types(pairs)?;
    let events = events_of(&state, &principal.tenant, &id).await?;
    let mut counts = BTreeMap::new();
    let mut total = 0u64;
    for event in events.iter().filter(|e| filter.allows(&e.event_type)) {
        *counts.entry(event.event_type.clone()).or_insert(0u64) += 1;
        total += 1;
    }
    Ok(axum::Json(EventStats { total, counts }))
}

/// Internal log lines kept for a run made with `x_log_level` or `is_debug` (empty otherwise).
#[utoipa::path(get, path = "/api/v1/llm-logs/{id}/log-entries", tag = "llm-logs",
    params(("id" = String, Path, description = "Run (request) id")),
    responses(
        (status = 200, description = "Log lines in order", body = [RunLogEntry]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such run", body = ErrorResponse),
    ))]
pub async fn get_llm_log_entries(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<Vec<RunLogEntry>>> {
    // The run itself decides 404 versus an empty list.
    written(&state, &principal.tenant, &id).await?;
    state.store.run_summary(&principal.tenant, &id).await?;
    Ok(axum::Json(
        state.store.run_log_entries(&principal.tenant, &id).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &str) -> Pairs {
        serde_urlencoded::from_str(query).unwrap()
    }

    fn param_of(query: &str) -> Option<String> {
        match parse_list_query(pairs(query)).unwrap_err() {
            ApiError::Invalid { param, .. } => param,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn arrays_accept_repeats_and_comma_lists() {
        let request =
            parse_list_query(pairs("tags=a,b&tags=c&statuses=failed,SUCCEEDED&flows=x")).unwrap();
        assert_eq!(request.filter.tags, ["a", "b", "c"]);
        assert_eq!(
            request.filter.statuses,
            [RunStatus::Failed, RunStatus::Succeeded]
        );
        assert_eq!(request.filter.flows, ["x"]);
        assert_eq!(request.page_size, DEFAULT_PAGE_SIZE);
    }

    #[test]
    fn bad_input_names_the_field() {
        assert_eq!(param_of("statuses=Done"), Some("statuses".into()));
        assert_eq!(param_of("pageSize=201"), Some("pageSize".into()));
        assert_eq!(param_of("pageSize=0"), Some("pageSize".into()));
        assert_eq!(param_of("pageSize=x"), Some("pageSize".into()));
        assert_eq!(param_of("cursor=%%%"), Some("cursor".into()));
        assert_eq!(param_of("cursor=bm9wZQ"), Some("cursor".into()));
        assert_eq!(param_of("from=yesterday"), Some("from".into()));
        assert_eq!(param_of("cancelled=maybe"), Some("cancelled".into()));
        assert_eq!(param_of("rootOnly=2"), Some("rootOnly".into()));
        assert_eq!(param_of("colour=red"), Some("colour".into()));
        assert_eq!(param_of("cursor=a&cursor=b"), Some("cursor".into()));
        assert_eq!(
            param_of("from=2026-11-22&to=2026-11-21"),
            Some("from".into())
        );
    }

    #[test]
    fn cursors_round_trip() {
        let position = LogPosition {
            created_at: Timestamp(DateTime::from_timestamp_millis(1_763_800_000_123).unwrap()),
            id: uuid::Uuid::now_v7().to_string(),
        };
        let cursor = encode_cursor(&position);
        assert_eq!(decode_cursor(&cursor).unwrap(), position);
        let request = parse_list_query(pairs(&format!("cursor={cursor}&pageSize=200"))).unwrap();
        assert_eq!(request.after, Some(position));
        assert_eq!(request.page_size, 200);
    }

    #[test]
    fn dates_and_booleans() {
        let request = parse_list_query(pairs(
            "from=2026-11-22&to=2026-11-23T10:00:00.5Z&rootOnly=TRUE&cancelled=false",
        ))
        .unwrap();
        assert_eq!(
            request.filter.from.unwrap().to_string(),
            "2026-11-22T00:00:00.000Z"
        );
        assert_eq!(
            request.filter.to.unwrap().to_string(),
            "2026-11-23T10:00:00.500Z"
        );
        assert!(request.filter.root_only);
        assert_eq!(request.filter.cancelled, Some(false));
    }

    #[test]
    fn event_type_patterns() {
        assert!(
            parse_types(pairs("types=tool*"))
                .unwrap()
                .allows("toolStarted")
        );
        assert!(
            !parse_types(pairs("types=tool.started"))
                .unwrap()
                .allows("toolCompleted")
        );
        assert!(
            parse_types(pairs("types=tool.started,usage.update"))
                .unwrap()
                .allows("usageUpdate")
        );
        assert!(parse_types(pairs("types=bad-type")).is_err());
        assert!(parse_types(pairs("kinds=x")).is_err());
    }
}
