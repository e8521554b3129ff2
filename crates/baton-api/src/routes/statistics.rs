//! `/api/v1/statistics`: cost, volume and latency reports over the invocation log (SPEC.md
//! "Statistics"). The store sums and fetches; `baton_ledger::stats` does the maths. Shapes are
//! documented in `docs/decisions.md` ("Statistics").

use std::collections::BTreeMap;

use axum::extract::State;
use baton_domain::Timestamp;
use baton_domain::credits::Credits;
use baton_domain::time::{MS_PER_DAY, parse_span};
use baton_ledger::stats::{
    Buckets, Distribution, HistogramBucket, LATENCY_EDGES_MS, Resolution, ValueCount,
    change_percent, histogram, mean, share_percent, value_counts,
};
use baton_store::StoreError;
use baton_store::stats::{Aggregate, AggregateQuery, FlowGrouping, FlowRequest, FlowRun, Window};
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{PathParam, Query};
use crate::state::AppState;

/// Reports without a period cover this span.
const DEFAULT_REPORT_DAYS: i64 = 30;
/// `/statistics` and `/model-costs` without a period.
const DEFAULT_PERIOD_DAYS: i64 = 7;
/// Tag reports: the default window and the by-key cap (SPEC.md "Limits").
const TAG_WINDOW_DAYS: i64 = 90;
const BY_KEY_MAX_DAYS: i64 = 365;
const BY_KEY_DEFAULT_LIMIT: u64 = 50;
const BY_KEY_MAX_LIMIT: u64 = 200;
const TOP_FLOWS: usize = 10;
const PANEL_TAG: &str = "Panel";

fn usd(credits: i64) -> f64 {
    Credits(credits).to_usd()
}

fn timestamp(ms: i64) -> Timestamp {
    Timestamp(DateTime::from_timestamp_millis(ms).unwrap_or_default())
}

fn now_ms() -> i64 {
    Timestamp::now().0.timestamp_millis()
}

/// The period ending now (exclusive bound just after now, so a run logged this millisecond
/// counts).
fn period_window(raw: Option<&str>, default_days: i64) -> ApiResult<(Window, i64)> {
    let period = match raw {
        Some(raw) => parse_span(raw, "period")?,
        None => default_days * MS_PER_DAY,
    };
    let to_ms = now_ms() + 1;
    Ok((
        Window {
            from_ms: to_ms - period,
            to_ms,
        },
        period,
    ))
}

fn parse_time(raw: Option<&str>, param: &str) -> ApiResult<Option<i64>> {
    raw.map(|raw| {
        Timestamp::parse_input(raw)
            .map(|t| t.0.timestamp_millis())
            .ok_or_else(|| {
                ApiError::validation(
                    param,
                    format!("'{raw}' is not an ISO 8601 time such as 2026-11-22T10:00:00Z or a date such as 2026-11-22"),
                )
            })
    })
    .transpose()
}

/// `from`/`to` with defaults (`to` now, `from` `default_days` before `to`); `from` is moved up
/// to `cap_days` before `to` when a cap is given.
fn range_window(
    from: Option<&str>,
    to: Option<&str>,
    default_days: i64,
    cap_days: Option<i64>,
) -> ApiResult<Window> {
    let to_ms = parse_time(to, "to")?.unwrap_or_else(|| now_ms() + 1);
    let mut from_ms = parse_time(from, "from")?.unwrap_or(to_ms - default_days * MS_PER_DAY);
    if from_ms >= to_ms {
        return Err(ApiError::validation("from", "from must be before to"));
    }
    if let Some(cap) = cap_days {
        from_ms = from_ms.max(to_ms - cap * MS_PER_DAY);
    }
    Ok(Window { from_ms, to_ms })
}

fn resolution_of(raw: Option<&str>, period_ms: i64) -> ApiResult<Resolution> {
    match raw {
        None => Ok(Resolution::for_period(period_ms)),
        Some(raw) => Resolution::parse(raw).ok_or_else(|| {
            ApiError::validation(
                "resolution",
                format!("'{raw}' is not a resolution: use Minutes5, Minutes15, Hour, Day or Week"),
            )
        }),
    }
}

fn buckets_of(window: Window, resolution: Resolution) -> ApiResult<Buckets> {
    Buckets::new(window.from_ms, window.to_ms, resolution).ok_or_else(|| {
        ApiError::validation(
            "resolution",
            format!(
                "{} buckets over this period would be more than {}: choose a coarser resolution",
                resolution.as_str(),
                baton_ledger::stats::MAX_BUCKETS
            ),
        )
    })
}

/// The flow's name when the tenant has the flow (by name or id) or runs of it; else 404.
async fn known_flow(state: &AppState, principal: &Principal, name: &str) -> ApiResult<String> {
    match state.store.get_flow(&principal.tenant, name).await {
        Ok(found) => return Ok(found.flow.name),
        Err(StoreError::NotFound { .. }) => {}
        Err(err) => return Err(err.into()),
    }
    // A deleted flow's runs are still reported, named by its id as by its slug.
    if let Some(slug) = state.store.flow_name_by_id(&principal.tenant, name).await? {
        return Ok(slug);
    }
    if state
        .store
        .stats_flow_has_runs(&principal.tenant, name)
        .await?
    {
        Ok(name.to_string())
    } else {
        Err(ApiError::NotFound(format!("flow '{name}' not found")))
    }
}

// ---------------------------------------------------------------------------------------------
// Per-flow reports

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FlowStatsQuery {
    /// Time span ending now (`7.00:00:00`, `7d`, `24h`); default 30 days.
    pub period: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FlowExtendedQuery {
    /// Time span ending now (`7.00:00:00`, `7d`, `24h`); default 30 days.
    pub period: Option<String>,
    /// Series bucket: `Minutes5`, `Minutes15`, `Hour`, `Day`, `Week` (any case); default from
    /// the period (hour up to 2 days, day up to 90 days, else week).
    pub resolution: Option<String>,
}

/// Per-inference statistics of one served model.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelInferenceStats {
    /// The served model; null for runs that never reached a model.
    pub model: Option<String>,
    pub calls: i64,
    pub failed: i64,
    pub avg_tokens_in: f64,
    pub avg_tokens_out: f64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub raw_cost_credits: i64,
    pub raw_cost_usd: f64,
    pub avg_cost_credits: f64,
    pub avg_cost_usd: f64,
    pub latency_ms: Distribution,
    /// Fixed edges: 0, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000 ms.
    pub latency_histogram: Vec<HistogramBucket>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowInferenceStats {
    pub flow_name: String,
    pub from: Timestamp,
    pub to: Timestamp,
    /// Every run of the flow (sub-agent runs of it included).
    pub calls: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub models: Vec<ModelInferenceStats>,
}

fn inference_stats(flow_name: &str, window: Window, runs: &[FlowRun]) -> FlowInferenceStats {
    let mut by_model: BTreeMap<Option<&str>, Vec<&FlowRun>> = BTreeMap::new();
    for run in runs {
        by_model
            .entry(run.served_model.as_deref())
            .or_default()
            .push(run);
    }
    let models = by_model
        .into_iter()
        .map(|(model, runs)| {
            let n = runs.len() as u64;
            let sum = |f: fn(&FlowRun) -> i64| runs.iter().map(|r| i128::from(f(r))).sum::<i128>();
            let cost = runs.iter().map(|r| r.cost_credits).sum::<i64>();
            let latencies: Vec<i64> = runs.iter().map(|r| r.duration_ms).collect();
            ModelInferenceStats {
                model: model.map(str::to_string),
                calls: runs.len() as i64,
                failed: runs.iter().filter(|r| r.status == "Failed").count() as i64,
                avg_tokens_in: mean(sum(|r| r.tokens_in), n),
                avg_tokens_out: mean(sum(|r| r.tokens_out), n),
                cost_credits: cost,
                cost_usd: usd(cost),
                raw_cost_credits: runs.iter().map(|r| r.raw_cost_credits).sum(),
                raw_cost_usd: usd(runs.iter().map(|r| r.raw_cost_credits).sum()),
                avg_cost_credits: mean(i128::from(cost), n),
                avg_cost_usd: mean(i128::from(cost), n) / 1_000_000.0,
                latency_histogram: histogram(&latencies, &LATENCY_EDGES_MS),
                latency_ms: Distribution::of(latencies),
            }
        })
        .collect();
    let cost = runs.iter().map(|r| r.cost_credits).sum();
    FlowInferenceStats {
        flow_name: flow_name.to_string(),
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        calls: runs.len() as i64,
        cost_credits: cost,
        cost_usd: usd(cost),
        models,
    }
}

/// Request-level statistics of the requests one primary model (the root's served model) served.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrimaryModelStats {
    pub model: Option<String>,
    pub requests: i64,
    pub failed: i64,
    /// Tree totals.
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub avg_cost_credits: f64,
    pub function_calls: i64,
    pub latency_ms: Distribution,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowRequestStats {
    pub flow_name: String,
    pub from: Timestamp,
    pub to: Timestamp,
    /// Root requests of the flow.
    pub requests: i64,
    pub failed: i64,
    /// Whole-tree spend of those requests.
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub raw_cost_credits: i64,
    pub raw_cost_usd: f64,
    /// Tree cost per request, in credits.
    pub cost_per_request: Distribution,
    /// Tool (function) calls the root runs made.
    pub function_calls: i64,
    pub function_calls_per_request: Distribution,
    /// Root run duration.
    pub latency_ms: Distribution,
    pub latency_histogram: Vec<HistogramBucket>,
    pub by_primary_model: Vec<PrimaryModelStats>,
}

fn request_stats(flow_name: &str, window: Window, requests: &[FlowRequest]) -> FlowRequestStats {
    let mut by_model: BTreeMap<Option<&str>, Vec<&FlowRequest>> = BTreeMap::new();
    for request in requests {
        by_model
            .entry(request.served_model.as_deref())
            .or_default()
            .push(request);
    }
    let by_primary_model = by_model
        .into_iter()
        .map(|(model, list)| {
            let cost: i64 = list.iter().map(|r| r.tree_cost_credits).sum();
            PrimaryModelStats {
                model: model.map(str::to_string),
                requests: list.len() as i64,
                failed: list.iter().filter(|r| r.status == "Failed").count() as i64,
                cost_credits: cost,
                cost_usd: usd(cost),
                avg_cost_credits: mean(i128::from(cost), list.len() as u64),
                function_calls: list.iter().map(|r| r.tool_calls).sum(),
                latency_ms: Distribution::of(list.iter().map(|r| r.duration_ms).collect()),
            }
        })
        .collect();
    let cost: i64 = requests.iter().map(|r| r.tree_cost_credits).sum();
    let raw: i64 = requests.iter().map(|r| r.tree_raw_cost_credits).sum();
    let latencies: Vec<i64> = requests.iter().map(|r| r.duration_ms).collect();
    FlowRequestStats {
        flow_name: flow_name.to_string(),
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        requests: requests.len() as i64,
        failed: requests.iter().filter(|r| r.status == "Failed").count() as i64,
        cost_credits: cost,
        cost_usd: usd(cost),
        raw_cost_credits: raw,
        raw_cost_usd: usd(raw),
        cost_per_request: Distribution::of(requests.iter().map(|r| r.tree_cost_credits).collect()),
        function_calls: requests.iter().map(|r| r.tool_calls).sum(),
        function_calls_per_request: Distribution::of(
            requests.iter().map(|r| r.tool_calls).collect(),
        ),
        latency_histogram: histogram(&latencies, &LATENCY_EDGES_MS),
        latency_ms: Distribution::of(latencies),
        by_primary_model,
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowTreeStats {
    pub flow_name: String,
    pub from: Timestamp,
    pub to: Timestamp,
    /// Agent trees rooted in the flow.
    pub trees: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub raw_cost_credits: i64,
    pub raw_cost_usd: f64,
    pub cost_per_tree: Distribution,
    /// Agents (runs) per tree, the root included.
    pub agent_count: Distribution,
    /// Deepest agent per tree (the root is depth 0).
    pub max_depth: Distribution,
    pub max_depth_distribution: Vec<ValueCount>,
    pub agent_count_distribution: Vec<ValueCount>,
}

fn tree_stats(flow_name: &str, window: Window, requests: &[FlowRequest]) -> FlowTreeStats {
    let cost: i64 = requests.iter().map(|r| r.tree_cost_credits).sum();
    let raw: i64 = requests.iter().map(|r| r.tree_raw_cost_credits).sum();
    let agents: Vec<i64> = requests.iter().map(|r| r.tree_runs).collect();
    let depths: Vec<i64> = requests.iter().map(|r| r.max_depth).collect();
    FlowTreeStats {
        flow_name: flow_name.to_string(),
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        trees: requests.len() as i64,
        cost_credits: cost,
        cost_usd: usd(cost),
        raw_cost_credits: raw,
        raw_cost_usd: usd(raw),
        cost_per_tree: Distribution::of(requests.iter().map(|r| r.tree_cost_credits).collect()),
        max_depth_distribution: value_counts(&depths),
        agent_count_distribution: value_counts(&agents),
        agent_count: Distribution::of(agents),
        max_depth: Distribution::of(depths),
    }
}

#[utoipa::path(get, path = "/api/v1/statistics/flow/{flowName}", tag = "statistics",
    params(("flowName" = String, Path, description = "The flow's name (slug) or id"), FlowStatsQuery),
    responses(
        (status = 200, description = "Per-inference statistics per served model", body = FlowInferenceStats),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn flow_stats(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    Query(query): Query<FlowStatsQuery>,
) -> ApiResult<axum::Json<FlowInferenceStats>> {
    let (window, _) = period_window(query.period.as_deref(), DEFAULT_REPORT_DAYS)?;
    let flow = known_flow(&state, &principal, &flow).await?;
    let runs = state
        .store
        .stats_flow_runs(&principal.tenant, &flow, window)
        .await?;
    Ok(axum::Json(inference_stats(&flow, window, &runs)))
}

#[utoipa::path(get, path = "/api/v1/statistics/flow/{flowName}/request", tag = "statistics",
    params(("flowName" = String, Path, description = "The flow's name (slug) or id"), FlowStatsQuery),
    responses(
        (status = 200, description = "Per-request statistics of the flow's root requests", body = FlowRequestStats),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn flow_request_stats(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    Query(query): Query<FlowStatsQuery>,
) -> ApiResult<axum::Json<FlowRequestStats>> {
    let (window, _) = period_window(query.period.as_deref(), DEFAULT_REPORT_DAYS)?;
    let flow = known_flow(&state, &principal, &flow).await?;
    let requests = state
        .store
        .stats_flow_requests(&principal.tenant, &flow, window)
        .await?;
    Ok(axum::Json(request_stats(&flow, window, &requests)))
}

#[utoipa::path(get, path = "/api/v1/statistics/flow/{flowName}/tree", tag = "statistics",
    params(("flowName" = String, Path, description = "The flow's name (slug) or id"), FlowStatsQuery),
    responses(
        (status = 200, description = "Per-tree statistics of the flow's agent trees", body = FlowTreeStats),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn flow_tree_stats(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    Query(query): Query<FlowStatsQuery>,
) -> ApiResult<axum::Json<FlowTreeStats>> {
    let (window, _) = period_window(query.period.as_deref(), DEFAULT_REPORT_DAYS)?;
    let flow = known_flow(&state, &principal, &flow).await?;
    let requests = state
        .store
        .stats_flow_requests(&principal.tenant, &flow, window)
        .await?;
    Ok(axum::Json(tree_stats(&flow, window, &requests)))
}

/// One bucket of a series.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeriesPoint {
    pub start: Timestamp,
    pub invocations: i64,
    pub failed: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
}

impl SeriesPoint {
    fn empty(start: i64) -> SeriesPoint {
        SeriesPoint {
            start: timestamp(start),
            invocations: 0,
            failed: 0,
            tokens_in: 0,
            tokens_out: 0,
            cost_credits: 0,
            cost_usd: 0.0,
        }
    }

    fn add(&mut self, calls: i64, failed: i64, tokens_in: i64, tokens_out: i64, cost: i64) {
        self.invocations += calls;
        self.failed += failed;
        self.tokens_in += tokens_in;
        self.tokens_out += tokens_out;
        self.cost_credits += cost;
        self.cost_usd = usd(self.cost_credits);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowExtendedStats {
    pub inference: FlowInferenceStats,
    pub request: FlowRequestStats,
    pub tree: FlowTreeStats,
    pub resolution: Resolution,
    /// Every bucket of the period, empty ones included; counts the flow's runs.
    pub series: Vec<SeriesPoint>,
}

#[utoipa::path(get, path = "/api/v1/statistics/flow/{flowName}/extended", tag = "statistics",
    params(("flowName" = String, Path, description = "The flow's name (slug) or id"), FlowExtendedQuery),
    responses(
        (status = 200, description = "All three levels plus invocation and cost series", body = FlowExtendedStats),
        (status = 400, description = "Invalid period or resolution", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 404, description = "No such flow", body = ErrorResponse),
    ))]
pub async fn flow_extended_stats(
    State(state): State<AppState>,
    principal: Principal,
    PathParam(flow): PathParam,
    Query(query): Query<FlowExtendedQuery>,
) -> ApiResult<axum::Json<FlowExtendedStats>> {
    let (window, period) = period_window(query.period.as_deref(), DEFAULT_REPORT_DAYS)?;
    let resolution = resolution_of(query.resolution.as_deref(), period)?;
    let buckets = buckets_of(window, resolution)?;
    let flow = known_flow(&state, &principal, &flow).await?;
    let runs = state
        .store
        .stats_flow_runs(&principal.tenant, &flow, window)
        .await?;
    let requests = state
        .store
        .stats_flow_requests(&principal.tenant, &flow, window)
        .await?;
    let mut series: Vec<SeriesPoint> = buckets.starts().map(SeriesPoint::empty).collect();
    for run in &runs {
        if let Some(point) = buckets
            .index_of(run.created_at)
            .and_then(|i| series.get_mut(i))
        {
            point.add(
                1,
                i64::from(run.status == "Failed"),
                run.tokens_in,
                run.tokens_out,
                run.cost_credits,
            );
        }
    }
    Ok(axum::Json(FlowExtendedStats {
        inference: inference_stats(&flow, window, &runs),
        request: request_stats(&flow, window, &requests),
        tree: tree_stats(&flow, window, &requests),
        resolution,
        series,
    }))
}

// ---------------------------------------------------------------------------------------------
// Tenant-wide reports

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StatisticsQuery {
    /// Time span ending now (`7.00:00:00`, `7d`, `24h`); default 7 days. The previous period is
    /// the same span before it.
    pub period: Option<String>,
    /// `Minutes5`, `Minutes15`, `Hour`, `Day`, `Week` (any case); default from the period.
    pub resolution: Option<String>,
}

/// A figure for the current period beside the previous one.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    pub current: i64,
    pub previous: i64,
    /// Null when the previous period had none.
    pub change_percent: Option<f64>,
}

impl Comparison {
    fn of(current: i64, previous: i64) -> Comparison {
        Comparison {
            current,
            previous,
            change_percent: change_percent(current, previous),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreditComparison {
    pub current_credits: i64,
    pub previous_credits: i64,
    pub current_usd: f64,
    pub previous_usd: f64,
    pub change_percent: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowCountPoint {
    pub start: Timestamp,
    pub invocations: i64,
    pub cost_credits: i64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowSeries {
    /// Null for requests made without a flow (`/chat/completions`, `/inference`).
    pub flow_name: Option<String>,
    pub series: Vec<FlowCountPoint>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowTotal {
    pub flow_name: Option<String>,
    pub invocations: i64,
    pub requests: i64,
    pub failed: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
}

impl FlowTotal {
    fn of(a: &Aggregate) -> FlowTotal {
        FlowTotal {
            flow_name: a.flow.clone(),
            invocations: a.calls,
            requests: a.requests,
            failed: a.failed,
            cost_credits: a.cost_credits,
            cost_usd: usd(a.cost_credits),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatisticsReport {
    pub from: Timestamp,
    pub to: Timestamp,
    pub previous_from: Timestamp,
    pub resolution: Resolution,
    /// Runs (requests and sub-agent requests).
    pub invocations: Comparison,
    /// Root requests.
    pub requests: Comparison,
    pub failed: Comparison,
    pub credits: CreditComparison,
    /// Cost and token series over every bucket of the period.
    pub series: Vec<SeriesPoint>,
    /// Invocation series per flow, every bucket included.
    pub flows: Vec<FlowSeries>,
    /// Most invoked flows (up to 10), most invocations first.
    pub top_flows: Vec<FlowTotal>,
}

#[utoipa::path(get, path = "/api/v1/statistics", tag = "statistics", params(StatisticsQuery),
    responses(
        (status = 200, description = "Counts and series of the period beside the previous period", body = StatisticsReport),
        (status = 400, description = "Invalid period or resolution", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn statistics(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<StatisticsQuery>,
) -> ApiResult<axum::Json<StatisticsReport>> {
    let (window, period) = period_window(query.period.as_deref(), DEFAULT_PERIOD_DAYS)?;
    let resolution = resolution_of(query.resolution.as_deref(), period)?;
    let buckets = buckets_of(window, resolution)?;
    let previous = Window {
        from_ms: window.from_ms - period,
        to_ms: window.from_ms,
    };
    let tenant = &principal.tenant;
    let total_of = |w: Window| AggregateQuery {
        window: Some(w),
        ..AggregateQuery::default()
    };
    let zero = || Aggregate {
        flow: None,
        model: None,
        bucket: None,
        calls: 0,
        requests: 0,
        failed: 0,
        tokens_in: 0,
        tokens_out: 0,
        cost_credits: 0,
        raw_cost_credits: 0,
        pricing_uncertain: 0,
    };
    let current = state
        .store
        .stats_aggregate(tenant, &total_of(window))
        .await?
        .pop()
        .unwrap_or_else(zero);
    let before = state
        .store
        .stats_aggregate(tenant, &total_of(previous))
        .await?
        .pop()
        .unwrap_or_else(zero);
    let mut by_flow = state
        .store
        .stats_aggregate(
            tenant,
            &AggregateQuery {
                window: Some(window),
                by_flow: Some(FlowGrouping::Own),
                ..AggregateQuery::default()
            },
        )
        .await?;
    let cells = state
        .store
        .stats_aggregate(
            tenant,
            &AggregateQuery {
                window: Some(window),
                by_flow: Some(FlowGrouping::Own),
                by_bucket: Some((buckets.origin, buckets.width)),
                ..AggregateQuery::default()
            },
        )
        .await?;
    let mut series: Vec<SeriesPoint> = buckets.starts().map(SeriesPoint::empty).collect();
    let mut flows: BTreeMap<Option<String>, Vec<FlowCountPoint>> = BTreeMap::new();
    for cell in &cells {
        let Some(index) = cell
            .bucket
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&i| i < buckets.count)
        else {
            continue;
        };
        if let Some(point) = series.get_mut(index) {
            point.add(
                cell.calls,
                cell.failed,
                cell.tokens_in,
                cell.tokens_out,
                cell.cost_credits,
            );
        }
        let flow_series = flows.entry(cell.flow.clone()).or_insert_with(|| {
            buckets
                .starts()
                .map(|start| FlowCountPoint {
                    start: timestamp(start),
                    invocations: 0,
                    cost_credits: 0,
                })
                .collect()
        });
        if let Some(point) = flow_series.get_mut(index) {
            point.invocations += cell.calls;
            point.cost_credits += cell.cost_credits;
        }
    }
    by_flow.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.flow.cmp(&b.flow)));
    Ok(axum::Json(StatisticsReport {
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        previous_from: timestamp(previous.from_ms),
        resolution,
        invocations: Comparison::of(current.calls, before.calls),
        requests: Comparison::of(current.requests, before.requests),
        failed: Comparison::of(current.failed, before.failed),
        credits: CreditComparison {
            current_credits: current.cost_credits,
            previous_credits: before.cost_credits,
            current_usd: usd(current.cost_credits),
            previous_usd: usd(before.cost_credits),
            change_percent: change_percent(current.cost_credits, before.cost_credits),
        },
        series,
        flows: flows
            .into_iter()
            .map(|(flow_name, series)| FlowSeries { flow_name, series })
            .collect(),
        top_flows: by_flow.iter().take(TOP_FLOWS).map(FlowTotal::of).collect(),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OverviewQuery {
    /// Time span ending now (`7.00:00:00`, `7d`, `24h`); default 30 days.
    pub period: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareRow {
    /// The served model (`byModel`) or flow name (`byFlow`); null when there is none.
    pub name: Option<String>,
    pub calls: i64,
    pub requests: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    /// Share of all calls of the period, percent.
    pub calls_percent: f64,
    /// Share of all billed cost of the period, percent.
    pub cost_percent: f64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    pub from: Timestamp,
    pub to: Timestamp,
    pub calls: i64,
    pub requests: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    /// Highest cost first.
    pub by_model: Vec<ShareRow>,
    pub by_flow: Vec<ShareRow>,
}

fn share_rows(
    mut rows: Vec<Aggregate>,
    total_calls: i64,
    total_cost: i64,
    name: fn(&Aggregate) -> Option<String>,
) -> Vec<ShareRow> {
    rows.sort_by(|a, b| {
        b.cost_credits
            .cmp(&a.cost_credits)
            .then_with(|| b.calls.cmp(&a.calls))
            .then_with(|| name(a).cmp(&name(b)))
    });
    rows.iter()
        .map(|a| ShareRow {
            name: name(a),
            calls: a.calls,
            requests: a.requests,
            cost_credits: a.cost_credits,
            cost_usd: usd(a.cost_credits),
            calls_percent: share_percent(a.calls, total_calls),
            cost_percent: share_percent(a.cost_credits, total_cost),
        })
        .collect()
}

#[utoipa::path(get, path = "/api/v1/statistics/overview", tag = "statistics", params(OverviewQuery),
    responses(
        (status = 200, description = "Cost and counts by model and by flow, with shares", body = Overview),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn overview(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<OverviewQuery>,
) -> ApiResult<axum::Json<Overview>> {
    let (window, _) = period_window(query.period.as_deref(), DEFAULT_REPORT_DAYS)?;
    let tenant = &principal.tenant;
    let base = AggregateQuery {
        window: Some(window),
        ..AggregateQuery::default()
    };
    let total = state.store.stats_aggregate(tenant, &base).await?.pop();
    let (calls, requests, cost) = total
        .map(|t| (t.calls, t.requests, t.cost_credits))
        .unwrap_or_default();
    let by_model = state
        .store
        .stats_aggregate(
            tenant,
            &AggregateQuery {
                by_model: true,
                ..base.clone()
            },
        )
        .await?;
    let by_flow = state
        .store
        .stats_aggregate(
            tenant,
            &AggregateQuery {
                by_flow: Some(FlowGrouping::Own),
                ..base
            },
        )
        .await?;
    Ok(axum::Json(Overview {
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        calls,
        requests,
        cost_credits: cost,
        cost_usd: usd(cost),
        by_model: share_rows(by_model, calls, cost, |a| a.model.clone()),
        by_flow: share_rows(by_flow, calls, cost, |a| a.flow.clone()),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ModelCostsQuery {
    /// Time span ending now (`7.00:00:00`, `7d`, `24h`); default 7 days. It chooses the bucket:
    /// hour up to 2 days, day up to 90 days, week beyond.
    pub period: Option<String>,
    /// Only runs of this flow.
    pub flow_name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCostCell {
    pub bucket_start: Timestamp,
    pub model: Option<String>,
    pub calls: i64,
    pub cost_credits: i64,
    pub cost_usd: f64,
    pub raw_cost_credits: i64,
    pub raw_cost_usd: f64,
    pub avg_cost_credits: f64,
    pub avg_cost_usd: f64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCosts {
    pub from: Timestamp,
    pub to: Timestamp,
    /// `Hour`, `Day` or `Week`.
    pub bucket: Resolution,
    pub flow_name: Option<String>,
    /// Non-empty cells only, by bucket then model.
    pub cells: Vec<ModelCostCell>,
}

#[utoipa::path(get, path = "/api/v1/statistics/model-costs", tag = "statistics", params(ModelCostsQuery),
    responses(
        (status = 200, description = "Time bucket by served model cells", body = ModelCosts),
        (status = 400, description = "Invalid period", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn model_costs(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<ModelCostsQuery>,
) -> ApiResult<axum::Json<ModelCosts>> {
    let (window, period) = period_window(query.period.as_deref(), DEFAULT_PERIOD_DAYS)?;
    let resolution = Resolution::for_period(period);
    let buckets = buckets_of(window, resolution)?;
    let mut cells = state
        .store
        .stats_aggregate(
            &principal.tenant,
            &AggregateQuery {
                window: Some(window),
                flow: query.flow_name.clone(),
                by_model: true,
                by_bucket: Some((buckets.origin, buckets.width)),
                ..AggregateQuery::default()
            },
        )
        .await?;
    cells.sort_by(|a, b| a.bucket.cmp(&b.bucket).then_with(|| a.model.cmp(&b.model)));
    let cells = cells
        .into_iter()
        .filter_map(|c| {
            let index = usize::try_from(c.bucket?).ok()?;
            let avg = mean(i128::from(c.cost_credits), u64::try_from(c.calls).ok()?);
            Some(ModelCostCell {
                bucket_start: timestamp(buckets.start(index)),
                model: c.model,
                calls: c.calls,
                cost_credits: c.cost_credits,
                cost_usd: usd(c.cost_credits),
                raw_cost_credits: c.raw_cost_credits,
                raw_cost_usd: usd(c.raw_cost_credits),
                avg_cost_credits: avg,
                avg_cost_usd: avg / 1_000_000.0,
            })
        })
        .collect();
    Ok(axum::Json(ModelCosts {
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        bucket: resolution,
        flow_name: query.flow_name,
        cells,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TagCostsQuery {
    /// The tag, matched exactly (`Team:search`).
    pub tag: Option<String>,
    /// `split` (default): each run's own flow; `rollup`: the request's entry-point flow.
    pub grouping: Option<String>,
    /// ISO 8601; default 90 days before `to`.
    pub from: Option<String>,
    /// ISO 8601, exclusive; default now.
    pub to: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagCostCell {
    pub flow_name: Option<String>,
    pub model: Option<String>,
    pub cost_usd: f64,
    pub raw_cost_usd: f64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    /// Run rows.
    pub calls: i64,
    /// Distinct requests (agent trees) with runs in the cell.
    pub requests: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    /// The served model is not in the catalogue, so its cost is not known.
    pub pricing_uncertain: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagCostTotals {
    pub cost_usd: f64,
    pub raw_cost_usd: f64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    pub calls: i64,
    pub requests: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub pricing_uncertain: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagCosts {
    pub tag: String,
    /// `split` or `rollup`.
    pub grouping: String,
    pub from: Timestamp,
    pub to: Timestamp,
    /// Flow by model, highest cost first.
    pub cells: Vec<TagCostCell>,
    /// The same for both groupings.
    pub totals: TagCostTotals,
}

#[utoipa::path(get, path = "/api/v1/statistics/tag-costs", tag = "statistics", params(TagCostsQuery),
    responses(
        (status = 200, description = "Flow by model cost matrix of one tag", body = TagCosts),
        (status = 400, description = "Missing tag, invalid grouping or time", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn tag_costs(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<TagCostsQuery>,
) -> ApiResult<axum::Json<TagCosts>> {
    let tag = match query.tag.as_deref().map(str::trim) {
        Some(tag) if !tag.is_empty() => tag.to_string(),
        _ => return Err(ApiError::validation("tag", "tag is required")),
    };
    let grouping = match query.grouping.as_deref().map(str::trim) {
        None => FlowGrouping::Own,
        Some(g) if g.eq_ignore_ascii_case("split") => FlowGrouping::Own,
        Some(g) if g.eq_ignore_ascii_case("rollup") => FlowGrouping::Root,
        Some(other) => {
            return Err(ApiError::validation(
                "grouping",
                format!("'{other}' is not a grouping: use split or rollup"),
            ));
        }
    };
    let window = range_window(
        query.from.as_deref(),
        query.to.as_deref(),
        TAG_WINDOW_DAYS,
        None,
    )?;
    let base = AggregateQuery {
        window: Some(window),
        tag: Some(tag.clone()),
        exclude_panel: tag != PANEL_TAG,
        ..AggregateQuery::default()
    };
    let mut cells = state
        .store
        .stats_aggregate(
            &principal.tenant,
            &AggregateQuery {
                by_flow: Some(grouping),
                by_model: true,
                ..base.clone()
            },
        )
        .await?;
    cells.sort_by(|a, b| {
        b.cost_credits
            .cmp(&a.cost_credits)
            .then_with(|| a.flow.cmp(&b.flow))
            .then_with(|| a.model.cmp(&b.model))
    });
    let total = state
        .store
        .stats_aggregate(&principal.tenant, &base)
        .await?
        .pop();
    let totals = total.map_or(
        TagCostTotals {
            cost_usd: 0.0,
            raw_cost_usd: 0.0,
            cost_credits: 0,
            raw_cost_credits: 0,
            calls: 0,
            requests: 0,
            tokens_in: 0,
            tokens_out: 0,
            pricing_uncertain: false,
        },
        |t| TagCostTotals {
            cost_usd: usd(t.cost_credits),
            raw_cost_usd: usd(t.raw_cost_credits),
            cost_credits: t.cost_credits,
            raw_cost_credits: t.raw_cost_credits,
            calls: t.calls,
            requests: t.requests,
            tokens_in: t.tokens_in,
            tokens_out: t.tokens_out,
            pricing_uncertain: t.pricing_uncertain != 0,
        },
    );
    Ok(axum::Json(TagCosts {
        tag,
        grouping: match grouping {
            FlowGrouping::Own => "split",
            FlowGrouping::Root => "rollup",
        }
        .to_string(),
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        cells: cells
            .into_iter()
            .map(|c| TagCostCell {
                flow_name: c.flow,
                model: c.model,
                cost_usd: usd(c.cost_credits),
                raw_cost_usd: usd(c.raw_cost_credits),
                cost_credits: c.cost_credits,
                raw_cost_credits: c.raw_cost_credits,
                calls: c.calls,
                requests: c.requests,
                tokens_in: c.tokens_in,
                tokens_out: c.tokens_out,
                pricing_uncertain: c.pricing_uncertain != 0,
            })
            .collect(),
        totals,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TagKeyQuery {
    /// Tags starting with this text (anchored, case-sensitive; `%` and `_` are plain text).
    pub prefix: Option<String>,
    /// ISO 8601; default 90 days before `to`, and at most 365 days before it.
    pub from: Option<String>,
    /// ISO 8601, exclusive; default now.
    pub to: Option<String>,
    /// Rows, 1 to 200 (default 50).
    pub limit: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagKeyRow {
    pub tag: String,
    pub cost_usd: f64,
    pub raw_cost_usd: f64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    pub calls: i64,
    pub requests: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub pricing_uncertain: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagKeyReport {
    pub prefix: String,
    /// The window used (after the 365-day cap).
    pub from: Timestamp,
    pub to: Timestamp,
    pub limit: u64,
    /// Highest billed cost first, then by tag.
    pub rows: Vec<TagKeyRow>,
    /// More tags matched than `limit`.
    pub truncated: bool,
}

#[utoipa::path(get, path = "/api/v1/statistics/tag-costs/by-key", tag = "statistics", params(TagKeyQuery),
    responses(
        (status = 200, description = "Spend per tag under the prefix, ranked", body = TagKeyReport),
        (status = 400, description = "Missing prefix, invalid limit or time", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
    ))]
pub async fn tag_costs_by_key(
    State(state): State<AppState>,
    principal: Principal,
    Query(query): Query<TagKeyQuery>,
) -> ApiResult<axum::Json<TagKeyReport>> {
    let prefix = match query.prefix.as_deref() {
        Some(prefix) if !prefix.trim().is_empty() => prefix.to_string(),
        _ => return Err(ApiError::validation("prefix", "prefix is required")),
    };
    let limit = match query.limit.as_deref() {
        None => BY_KEY_DEFAULT_LIMIT,
        Some(raw) => raw
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|l| (1..=BY_KEY_MAX_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::validation(
                    "limit",
                    format!("limit must be an integer from 1 to {BY_KEY_MAX_LIMIT}"),
                )
            })?,
    };
    let window = range_window(
        query.from.as_deref(),
        query.to.as_deref(),
        TAG_WINDOW_DAYS,
        Some(BY_KEY_MAX_DAYS),
    )?;
    let mut rows = state
        .store
        .stats_tag_totals(&principal.tenant, &prefix, window, limit + 1)
        .await?;
    let truncated = rows.len() as u64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(axum::Json(TagKeyReport {
        prefix,
        from: timestamp(window.from_ms),
        to: timestamp(window.to_ms),
        limit,
        rows: rows
            .into_iter()
            .map(|r| TagKeyRow {
                tag: r.tag,
                cost_usd: usd(r.cost_credits),
                raw_cost_usd: usd(r.raw_cost_credits),
                cost_credits: r.cost_credits,
                raw_cost_credits: r.raw_cost_credits,
                calls: r.calls,
                requests: r.requests,
                tokens_in: r.tokens_in,
                tokens_out: r.tokens_out,
                pricing_uncertain: r.pricing_uncertain != 0,
            })
            .collect(),
        truncated,
    }))
}
