//! The invocation log: runs, their tags and stored events, written in batches by [`RunWriter`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use baton_domain::chat::Usage;
use baton_domain::logs::RunLogEntry;
use baton_domain::run::{RawJson, RunKind, RunRecord, RunStatus, StoredEvent};
use baton_domain::{TenantId, Timestamp};
use baton_executor::{PromisedRuns, RunPromise};
use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use sea_orm::sea_query::{Expr, Query};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, EntityTrait, IdenStatic, Iterable, QueryFilter,
    QueryOrder, QuerySelect, Value,
};

use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::budgets::BudgetAlert;
use crate::bulk::{BulkInsert, OnConflict};
use crate::entity::{run_tags, runs};
use crate::event_pages::{PAGE_INSERT, pack_pages, page_rows};
use crate::retention::TextSampling;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn json_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

/// Appends `record`'s row to `out`, one value per column in the entity's order (the order of
/// [`RUN_INSERT`]'s columns). The `match` names every column: a column added to the entity
/// does not compile until it is written here.
fn push_run_row(
    record: &RunRecord,
    tenant: &str,
    customer_id: Option<&String>,
    mut event_page: Option<Vec<u8>>,
    out: &mut Vec<Value>,
) {
    use runs::Column as C;
    for column in C::iter() {
        out.push(match column {
            C::Id => record.id.clone().into(),
            C::TenantId => tenant.to_string().into(),
            C::RootId => record.root_id.clone().into(),
            C::ParentId => record.parent_id.clone().into(),
            C::Depth => i32::try_from(record.depth).unwrap_or(i32::MAX).into(),
            C::AgentRole => record.agent_role.clone().into(),
            C::Kind => record.kind.as_str().to_string().into(),
            C::Environment => record.environment.clone().into(),
            C::FlowName => record.flow_name.clone().into(),
            C::RequestedModel => record.requested_model.clone().into(),
            C::ServedModel => record.served_model.clone().into(),
            C::Provider => record.provider.clone().into(),
            C::Status => record.status.as_str().to_string().into(),
            C::FinishReason => record.finish_reason.clone().into(),
            C::TokensIn => to_i64(record.usage.tokens_in).into(),
            C::TokensOut => to_i64(record.usage.tokens_out).into(),
            C::ReasoningTokens => to_i64(record.usage.reasoning_tokens).into(),
            C::CachedTokens => to_i64(record.usage.cached_tokens).into(),
            C::WebSearchCalls => to_i64(record.usage.web_search_calls).into(),
            C::InferenceCount => i64::from(record.inference_count).into(),
            C::CostCredits => record.cost_credits.into(),
            C::RawCostCredits => record.raw_cost_credits.into(),
            C::PricingUncertain => record.pricing_uncertain.into(),
            C::DurationMs => to_i64(record.duration_ms).into(),
            C::CustomerId => customer_id.or(record.customer_id.as_ref()).cloned().into(),
            C::CustomerExternalId => record.customer_external_id.clone().into(),
            C::Tags => json_text(&record.tags).into(),
            C::RequestText => record
                .request
                .as_ref()
                .map(|r| r.as_str().to_string())
                .into(),
            C::ResponseText => record
                .response
                .as_ref()
                .map(|r| r.as_str().to_string())
                .into(),
            C::ErrorCode => record.error_code.clone().into(),
            C::ErrorMessage => record.error_message.clone().into(),
            C::DetailDropped => record.detail_dropped.into(),
            C::FallbackUsed => record.fallback_used.into(),
            C::WasCached => record.was_cached.into(),
            C::Attempts => json_text(&record.attempts).into(),
            C::ToolCalls => json_text(&record.tool_calls).into(),
            C::Warnings => json_text(&record.warnings).into(),
            C::CallbackOrigin => record.callback_origin.clone().into(),
            C::IsDebug => record.is_debug.into(),
            C::CancelRequestedAt => record.cancel_requested_at.map(to_millis).into(),
            C::CancelledAt => record.cancelled_at.map(to_millis).into(),
            C::CancelRequestedBy => record.cancel_requested_by.clone().into(),
            C::CreatedAt => to_millis(record.created_at).into(),
            C::CompletedAt => record.completed_at.map(to_millis).into(),
            C::BudgetHolds => json_text(&record.budget_holds).into(),
            // Each column comes once: the bytes move into their value.
            C::EventPage => event_page.take().into(),
        });
    }
}

/// Runs: inserted, or what a later write of the same run can change replaced.
static RUN_INSERT: LazyLock<BulkInsert> = LazyLock::new(|| {
    use runs::Column as C;
    let updated = [
        C::ServedModel,
        C::Provider,
        C::Status,
        C::FinishReason,
        C::TokensIn,
        C::TokensOut,
        C::ReasoningTokens,
        C::CachedTokens,
        C::WebSearchCalls,
        C::InferenceCount,
        C::CostCredits,
        C::RawCostCredits,
        C::PricingUncertain,
        C::DurationMs,
        C::ResponseText,
        C::ErrorCode,
        C::ErrorMessage,
        C::FallbackUsed,
        C::WasCached,
        C::Attempts,
        C::ToolCalls,
        C::Warnings,
        C::CallbackOrigin,
        C::CancelledAt,
        C::CompletedAt,
    ];
    BulkInsert::of::<runs::Entity>(OnConflict::Update {
        key: C::Id.as_str(),
        columns: updated.iter().map(|c| c.as_str()).collect(),
        // A retried write keeps the page stored with the run, as `run_event_pages` does.
        kept: vec![C::EventPage.as_str()],
    })
});
static TAG_INSERT: LazyLock<BulkInsert> =
    LazyLock::new(|| BulkInsert::of::<run_tags::Entity>(OnConflict::IgnoreKey(&["run_id", "tag"])));

/// A batch's runs without the pending rows a later write of the same run in the batch
/// replaces: a tool loop's run is queued pending when it starts and written again when it ends,
/// mostly within one batch, where the pending row would only be inserted and replaced in the
/// same transaction (and the repeated id would start another statement).
fn latest_writes(records: &[RunRecord]) -> Vec<&RunRecord> {
    fn key(r: &RunRecord) -> (Option<&str>, &str) {
        (r.tenant.as_ref().map(TenantId::as_str), r.id.as_str())
    }
    let mut last: HashMap<_, usize> = HashMap::with_capacity(records.len());
    for (at, record) in records.iter().enumerate() {
        last.insert(key(record), at);
    }
    records
        .iter()
        .enumerate()
        .filter(|(at, record)| {
            record.status != RunStatus::Pending || last.get(&key(record)) == Some(at)
        })
        .map(|(_, record)| record)
        .collect()
}

fn from_model(m: runs::Model) -> RunRecord {
    // Stored by this crate as JSON; text that is not reads as absent.
    let raw = |text: Option<String>| text.and_then(|t| RawJson::from_text(t).ok());
    let to_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
    RunRecord {
        tenant: Some(TenantId::new(m.tenant_id.clone())),
        root_id: m.root_id,
        parent_id: m.parent_id,
        depth: u32::try_from(m.depth).unwrap_or(0),
        agent_role: m.agent_role,
        kind: match m.kind.as_str() {
            "inference" => RunKind::Inference,
            "flow" => RunKind::Flow,
            _ => RunKind::Chat,
        },
        environment: m.environment,
        flow_name: m.flow_name,
        requested_model: m.requested_model,
        served_model: m.served_model,
        provider: m.provider,
        status: RunStatus::parse(&m.status).unwrap_or(RunStatus::Failed),
        finish_reason: m.finish_reason,
        usage: Usage {
            tokens_in: to_u64(m.tokens_in),
            tokens_out: to_u64(m.tokens_out),
            reasoning_tokens: to_u64(m.reasoning_tokens),
            cached_tokens: to_u64(m.cached_tokens),
            web_search_calls: to_u64(m.web_search_calls),
        },
        inference_count: u32::try_from(m.inference_count).unwrap_or(u32::MAX),
        cost_credits: m.cost_credits,
        raw_cost_credits: m.raw_cost_credits,
        pricing_uncertain: m.pricing_uncertain,
        duration_ms: to_u64(m.duration_ms),
        customer_id: m.customer_id,
        customer_external_id: m.customer_external_id,
        tags: serde_json::from_str(&m.tags).unwrap_or_default(),
        request: raw(m.request_text),
        response: raw(m.response_text),
        error_code: m.error_code,
        error_message: m.error_message,
        detail_dropped: m.detail_dropped,
        fallback_used: m.fallback_used,
        was_cached: m.was_cached,
        attempts: serde_json::from_str(&m.attempts).unwrap_or_default(),
        tool_calls: serde_json::from_str(&m.tool_calls).unwrap_or_default(),
        warnings: serde_json::from_str(&m.warnings).unwrap_or_default(),
        callback_origin: m.callback_origin,
        cancel_requested_at: m.cancel_requested_at.map(from_millis),
        cancel_requested_by: m.cancel_requested_by,
        cancelled_at: m.cancelled_at.map(from_millis),
        is_debug: m.is_debug,
        created_at: from_millis(m.created_at),
        completed_at: m.completed_at.map(from_millis),
        budget_holds: Vec::new(),
        lifecycle: None,
        id: m.id,
    }
}

impl Store {
    /// Writes runs (insert, or replace a run written before) with their tags and events, in one
    /// transaction, in multi-row statements of at most [`crate::bulk::ROWS_PER_STATEMENT`] rows. Customers
    /// named by external id are created on first use.
    pub async fn write_runs(
        &self,
        records: &[RunRecord],
        events: &[(TenantId, StoredEvent)],
    ) -> StoreResult<Vec<BudgetAlert>> {
        let mut customers: HashMap<(String, String), String> = HashMap::new();
        for record in records {
            if let (Some(tenant), Some(external)) = (&record.tenant, &record.customer_external_id)
                && record.customer_id.is_none()
            {
                let key = (tenant.as_str().to_string(), external.clone());
                if let std::collections::hash_map::Entry::Vacant(slot) = customers.entry(key) {
                    slot.insert(self.ensure_customer(tenant, external).await?.id);
                }
            }
        }
        let txn = self.begin_write().await?;
        // Finished runs whose stored row is already finished (a retried write, or a run the
        // abandoned-run sweep finished while this row waited) gave their holds back then.
        let holders: Vec<&str> = records
            .iter()
            .filter(|r| r.status != RunStatus::Pending && !r.budget_holds.is_empty())
            .map(|r| r.id.as_str())
            .collect();
        let settled: HashSet<String> = if holders.is_empty() {
            HashSet::new()
        } else {
            runs::Entity::find()
                .select_only()
                .column(runs::Column::Id)
                .filter(runs::Column::Id.is_in(holders))
                .filter(runs::Column::Status.ne(RunStatus::Pending.as_str()))
                .into_tuple::<String>()
                .all(&txn)
                .await?
                .into_iter()
                .collect()
        };
        // The page from a run's first event rides in its row when this batch writes the run
        // finished (a one-call request: its one page); every other page is a page row.
        let mut finished: HashSet<(&str, &str)> = HashSet::with_capacity(records.len());
        finished.extend(
            records
                .iter()
                .filter(|r| r.status != RunStatus::Pending && r.lifecycle.is_none())
                .filter_map(|r| Some((r.tenant.as_ref()?.as_str(), r.id.as_str()))),
        );
        let mut pages = pack_pages(events);
        let mut in_rows: HashMap<(&str, &str), Vec<u8>> = HashMap::with_capacity(finished.len());
        pages.retain_mut(|page| {
            let run = (page.tenant.as_str(), page.run_id);
            if page.first_seq != 0 || !finished.contains(&run) || in_rows.contains_key(&run) {
                return true;
            }
            in_rows.insert(run, std::mem::take(&mut page.packed));
            false
        });
        let mut rows: Vec<Value> = Vec::with_capacity(records.len() * RUN_INSERT.width());
        let mut ids: HashSet<&str> = HashSet::with_capacity(records.len());
        let mut tags: Vec<Value> = Vec::new();
        for record in latest_writes(records) {
            let tenant = record.tenant.as_ref().ok_or_else(|| {
                StoreError::Corrupt("run", format!("run {} has no tenant", record.id))
            })?;
            // PostgreSQL refuses to update one row twice in one statement, and the later write
            // of a run must win: a repeated id starts the next statement.
            if ids.contains(record.id.as_str()) {
                RUN_INSERT
                    .insert(&txn, std::mem::take(&mut rows), self.array_rows)
                    .await?;
                ids.clear();
            }
            let customer_id = record.customer_external_id.as_ref().and_then(|external| {
                customers.get(&(tenant.as_str().to_string(), external.clone()))
            });
            let event_page = if record.status == RunStatus::Pending {
                None
            } else if let Some(lifecycle) = &record.lifecycle {
                Some(crate::event_pages::lifecycle_page(lifecycle))
            } else {
                in_rows.remove(&(tenant.as_str(), record.id.as_str()))
            };
            push_run_row(record, tenant.as_str(), customer_id, event_page, &mut rows);
            ids.insert(record.id.as_str());
            for tag in &record.tags {
                for column in run_tags::Column::iter() {
                    tags.push(match column {
                        run_tags::Column::RunId => record.id.clone().into(),
                        run_tags::Column::Tag => tag.clone().into(),
                        run_tags::Column::TenantId => tenant.as_str().to_string().into(),
                        run_tags::Column::CreatedAt => to_millis(record.created_at).into(),
                    });
                }
            }
        }
        RUN_INSERT.insert(&txn, rows, self.array_rows).await?;
        // Tags and events after every run row: they refer to their run.
        TAG_INSERT.insert(&txn, tags, self.array_rows).await?;
        PAGE_INSERT
            .insert(&txn, page_rows(pages), self.array_rows)
            .await?;
        // Spend counts against budgets in the same transaction as the rows: never twice, never
        // lost.
        let alerts = self.charge_budgets(&txn, records, &settled).await?;
        txn.commit().await?;
        Ok(alerts)
    }

    pub async fn get_run(&self, tenant: &TenantId, id: &str) -> StoreResult<RunRecord> {
        runs::Entity::find_by_id(id)
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .map(from_model)
            .ok_or_else(|| StoreError::not_found("run", id))
    }

    /// Records a cancel request for a run that has not finished (SPEC.md "Run"): the run and
    /// its sub-agents see it at their next step. A finished run cannot be cancelled (409).
    pub async fn request_cancel(
        &self,
        tenant: &TenantId,
        id: &str,
        by: &str,
    ) -> StoreResult<RunRecord> {
        let run = self.get_run(tenant, id).await?;
        if run.completed_at.is_some() {
            return Err(StoreError::RunFinished(run.id));
        }
        if run.cancel_requested_at.is_none() {
            runs::Entity::update_many()
                .col_expr(
                    runs::Column::CancelRequestedAt,
                    Expr::value(to_millis(Timestamp::now())),
                )
                .col_expr(runs::Column::CancelRequestedBy, Expr::value(by.to_string()))
                .filter(runs::Column::TenantId.eq(tenant.as_str()))
                .filter(runs::Column::Id.eq(id))
                .filter(runs::Column::CancelRequestedAt.is_null())
                .exec(self.conn())
                .await?;
        }
        self.get_run(tenant, id).await
    }

    /// Records a cancel request for every root run of the tenant that is still running (MCP
    /// `cancel_all_runs`); sub-agents stop with their root. Returns the ids of the running root
    /// runs, each now carrying a cancel request (an earlier request keeps its time and actor).
    pub async fn request_cancel_all(
        &self,
        tenant: &TenantId,
        by: &str,
    ) -> StoreResult<Vec<String>> {
        let running_roots = || {
            Condition::all()
                .add(runs::Column::TenantId.eq(tenant.as_str()))
                .add(runs::Column::ParentId.is_null())
                // The literal, so the planner can use the pending runs' partial index (it plans
                // without looking at bound values: docs/performance.md, "Statements compiled
                // at every execution").
                .add(Expr::cust(crate::abandoned::PENDING_CONDITION))
                .add(runs::Column::CompletedAt.is_null())
        };
        runs::Entity::update_many()
            .col_expr(
                runs::Column::CancelRequestedAt,
                Expr::value(to_millis(Timestamp::now())),
            )
            .col_expr(runs::Column::CancelRequestedBy, Expr::value(by.to_string()))
            .filter(running_roots())
            .filter(runs::Column::CancelRequestedAt.is_null())
            .exec(self.conn())
            .await?;
        Ok(runs::Entity::find()
            .select_only()
            .column(runs::Column::Id)
            .filter(running_roots())
            .filter(runs::Column::CancelRequestedAt.is_not_null())
            .order_by_asc(runs::Column::CreatedAt)
            .order_by_asc(runs::Column::Id)
            .into_tuple::<String>()
            .all(self.conn())
            .await?)
    }

    /// Whether a cancel was requested for any of `ids` (a run and its ancestors).
    pub async fn cancel_requested(&self, tenant: &TenantId, ids: &[String]) -> StoreResult<bool> {
        // Asked before every model call of a tool loop: one keyed lookup of one column that
        // stops at the first match, built without an entity select (`runs::Entity::find()`
        // lists all ~45 columns first: more work than the lookup).
        let query = Query::select()
            .column(runs::Column::Id)
            .from(runs::Entity)
            .and_where(runs::Column::TenantId.eq(tenant.as_str()))
            .and_where(runs::Column::Id.is_in(ids.iter().map(String::as_str)))
            .and_where(runs::Column::CancelRequestedAt.is_not_null())
            .limit(1)
            .to_owned();
        let found = self.conn().query_one(&query).await?;
        Ok(found.is_some())
    }

    /// Every run of the tenant, oldest first (tests and exports; the paged log comes later).
    pub async fn list_runs(&self, tenant: &TenantId) -> StoreResult<Vec<RunRecord>> {
        Ok(runs::Entity::find()
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(runs::Column::CreatedAt)
            .order_by_asc(runs::Column::Id)
            .all(self.conn())
            .await?
            .into_iter()
            .map(from_model)
            .collect())
    }
}

/// What the writer is given.
#[derive(Debug)]
pub enum LogItem {
    Run(Box<RunRecord>),
    Events(TenantId, Vec<StoredEvent>),
    /// Internal log lines of a run made for debugging.
    LogEntries(TenantId, Vec<RunLogEntry>),
}

enum Message {
    Item(LogItem),
    /// Write everything queued before this now (not when the batch fills), then answer.
    Flush(oneshot::Sender<()>),
    /// Flush everything queued before this, then stop.
    Close(oneshot::Sender<()>),
}

/// Told about every batch once it is written (metrics), on the writer's task.
pub trait WrittenRuns: Send + Sync {
    fn written(&self, records: &[RunRecord]);
}

/// Writes the invocation log off the request path: callers queue items (waiting for room when
/// the queue is full: back-pressure, never loss); a task writes them in batches.
#[derive(Clone)]
pub struct RunWriter {
    tx: mpsc::Sender<Message>,
    capacity: usize,
    /// Set by [`RunWriter::close`] at once, so a batch retrying against an unreachable
    /// database (ahead of the close message in the queue) stops retrying without end.
    closing: Arc<watch::Sender<bool>>,
    /// Set when the service starts dropping requests at shutdown ([`RunWriter::stopping`]).
    stopping: Arc<AtomicBool>,
    /// Callers waiting for room in a full queue (load shedding reads the longest wait).
    waiters: Arc<Waiters>,
    /// Wakes the writer early from its wait for a batch to fill: the batch is full, or a close
    /// is queued.
    batch_ready: Arc<BatchReady>,
    lane_counters: Arc<LaneCounters>,
    /// Runs that tasks will queue after their replies: the engine's flush waits for them.
    promised: Arc<PromisedRuns>,
}

/// How the writer, waiting for its batch to fill, is woken when the queue holds the rest.
struct BatchReady {
    notify: Notify,
    /// Items the writer's batch lacks (`usize::MAX` while it is not waiting).
    missing: AtomicUsize,
}

impl Default for BatchReady {
    fn default() -> Self {
        BatchReady {
            notify: Notify::new(),
            missing: AtomicUsize::new(usize::MAX),
        }
    }
}

/// When each caller now waiting for room started waiting (with an id to leave by), oldest first.
#[derive(Default)]
struct Waiters {
    next_id: AtomicU64,
    waiting: Mutex<VecDeque<(u64, Instant)>>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(u64, Instant)>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One caller's place among the waiters; leaves on drop (sent, or the request went away).
struct Waiting<'a> {
    waiters: &'a Waiters,
    id: u64,
}

impl<'a> Waiting<'a> {
    fn start(waiters: &'a Waiters) -> Waiting<'a> {
        let id = waiters.next_id.fetch_add(1, Ordering::Relaxed);
        waiters.lock().push_back((id, Instant::now()));
        Waiting { waiters, id }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.waiters.lock();
        if let Some(index) = waiting.iter().position(|(id, _)| *id == self.id) {
            waiting.remove(index);
        }
    }
}

#[derive(Clone)]
pub struct WriterOptions {
    pub capacity: usize,
    pub batch: usize,
    /// Longest a queued item waits for its batch to fill.
    pub max_delay: Duration,
    /// Where budget alerts reached by written runs go (to be delivered to webhooks).
    pub alerts: Option<mpsc::UnboundedSender<BudgetAlert>>,
    /// Told about every written batch.
    pub observer: Option<Arc<dyn WrittenRuns>>,
    /// Where batches are written while the writer keeps up (see [`IdleLane`]).
    pub idle_lane: Option<IdleLane>,
}

/// A second place to write batches: another runtime with a connection of its own, which the
/// server runs on a thread at idle scheduling priority, so a batch being written never keeps a
/// request waiting for a CPU. Used while the writer keeps up; when it falls behind (a queue
/// holding more than a batch, or a batch starved for CPU on a saturated machine) batches are
/// written on the writer's own runtime for a while (`LanePolicy`), so a busy machine cannot
/// starve the log and stall requests on a full queue.
#[derive(Clone)]
pub struct IdleLane {
    runtime: tokio::runtime::Handle,
    store: Store,
    /// Dropped with the lane's last holder: the lane's thread may then end.
    _alive: Arc<dyn Send + Sync>,
}

impl IdleLane {
    /// `alive` is held as long as the lane is used (a thread's stop signal, say).
    pub fn new(
        runtime: tokio::runtime::Handle,
        store: Store,
        alive: impl Send + Sync + 'static,
    ) -> Self {
        IdleLane {
            runtime,
            store,
            _alive: Arc::new(alive),
        }
    }

    /// The store the lane writes with.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl std::fmt::Debug for WriterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterOptions")
            .field("capacity", &self.capacity)
            .field("batch", &self.batch)
            .field("max_delay", &self.max_delay)
            .field("idle_lane", &self.idle_lane.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            capacity: 10_000,
            batch: 256,
            // A commit rewrites every page it touched (each index's too): at 1,000 requests
            // a second, 20 ms batches of 20 runs cost 84 us of CPU per request on SQLite,
            // 100 ms batches of 100 about a third of that (docs/performance.md, "Batch delay").
            max_delay: Duration::from_millis(100),
            alerts: None,
            observer: None,
            idle_lane: None,
        }
    }
}

impl RunWriter {
    pub fn spawn(store: Store, options: WriterOptions) -> RunWriter {
        let (tx, rx) = mpsc::channel(options.capacity.max(1));
        let (closing, closing_rx) = watch::channel(false);
        let batch_ready = Arc::new(BatchReady::default());
        let lane_counters = Arc::new(LaneCounters::default());
        tokio::spawn(run_writer(
            store,
            rx,
            closing_rx,
            batch_ready.clone(),
            lane_counters.clone(),
            options.clone(),
        ));
        RunWriter {
            tx,
            capacity: options.capacity.max(1),
            closing: Arc::new(closing),
            stopping: Arc::default(),
            waiters: Arc::default(),
            batch_ready,
            lane_counters,
            promised: Arc::default(),
        }
    }

    /// Batches written so far on each lane, and how many idle-lane batches were starved.
    pub fn lane_counts(&self) -> LaneCounts {
        let counters = &self.lane_counters;
        LaneCounts {
            idle_batches: counters.idle.load(Ordering::Relaxed),
            own_batches: counters.own.load(Ordering::Relaxed),
            starved_batches: counters.starved.load(Ordering::Relaxed),
        }
    }

    /// Queues an item, waiting while the queue is full.
    pub async fn write(&self, item: LogItem) -> StoreResult<()> {
        let stopped = || StoreError::Unavailable("the invocation log writer has stopped".into());
        match self.tx.try_send(Message::Item(item)) {
            Ok(()) => {
                if self.queue_depth() >= self.batch_ready.missing.load(Ordering::SeqCst) {
                    self.batch_ready.notify.notify_one();
                }
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(stopped()),
            Err(mpsc::error::TrySendError::Full(message)) => {
                let _waiting = Waiting::start(&self.waiters);
                self.tx.send(message).await.map_err(|_| stopped())
            }
        }
    }

    /// How long the caller that has waited longest for room in the full queue has waited
    /// (zero when none waits).
    pub fn longest_wait(&self) -> Duration {
        self.waiters
            .lock()
            .front()
            .map_or(Duration::ZERO, |(_, since)| since.elapsed())
    }

    /// Items waiting to be written.
    pub fn queue_depth(&self) -> usize {
        self.capacity - self.tx.capacity()
    }

    /// Whether the queue is at most half full: the writer keeps up, and a run queued now will
    /// not wait for room.
    pub fn has_room(&self) -> bool {
        self.tx.capacity() * 2 >= self.capacity
    }

    /// A run a task will queue after its reply, while there is room
    /// ([`baton_executor::RunSink::promise_run`]).
    pub fn promise_run(&self) -> Option<RunPromise> {
        self.has_room().then(|| self.promised.promise())
    }

    /// Returns once every run promised after its reply has been queued.
    pub async fn promised_runs_queued(&self) {
        self.promised.kept().await;
    }

    /// Writes everything queued so far, then stops the writer. A database that stays
    /// unreachable is given a few attempts per batch, not more, so shutdown ends.
    /// Writes what is queued now, without waiting for the batch to fill: a run just answered
    /// is then found by id (a client reading back a run it was given the id of).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Message::Flush(ack)).await.is_ok() {
            self.batch_ready.notify.notify_one();
            let _ = done.await;
        }
    }

    /// The service is about to drop the requests still running (its shutdown grace is over):
    /// their runs are logged as cut by it, not by their clients.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    pub fn service_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    pub async fn close(&self) {
        self.closing.send_replace(true);
        let (ack, done) = oneshot::channel();
        if self.tx.send(Message::Close(ack)).await.is_ok() {
            self.batch_ready.notify.notify_one();
            let _ = done.await;
        }
    }
}

async fn run_writer(
    store: Store,
    mut rx: mpsc::Receiver<Message>,
    closing: watch::Receiver<bool>,
    batch_ready: Arc<BatchReady>,
    counters: Arc<LaneCounters>,
    mut options: WriterOptions,
) {
    let mut buffer: Vec<Message> = Vec::with_capacity(options.batch);
    let mut sampling = TextSampling::default();
    let mut lanes = Lanes {
        store,
        idle: options.idle_lane.take(),
        policy: LanePolicy::new(Instant::now()),
        counters,
    };
    let options = Arc::new(options);
    // A close or a flush is written at once, without waiting for the batch to fill.
    let is_close = |m: &Message| matches!(m, Message::Close(_) | Message::Flush(_));
    loop {
        if rx.recv_many(&mut buffer, options.batch).await == 0 {
            return;
        }
        // Give a batch a moment to fill when the first item arrives alone: one wake-up at
        // the deadline (or when the queue holds a full batch, or a close), not one per item,
        // which at a modest rate cost a task wake-up per request.
        if buffer.len() < options.batch && !buffer.iter().any(is_close) {
            batch_ready
                .missing
                .store(options.batch - buffer.len(), Ordering::SeqCst);
            // Queued between the store and here: the senders may not have seen the need.
            if rx.len() < options.batch - buffer.len() {
                tokio::select! {
                    () = tokio::time::sleep(options.max_delay) => {}
                    () = batch_ready.notify.notified() => {}
                }
            }
            batch_ready.missing.store(usize::MAX, Ordering::SeqCst);
            while buffer.len() < options.batch {
                let Ok(message) = rx.try_recv() else { break };
                let close = is_close(&message);
                buffer.push(message);
                if close {
                    break;
                }
            }
        }
        let mut batch = Batch::default();
        let mut close = None;
        let mut flushed = Vec::new();
        for message in buffer.drain(..) {
            match message {
                Message::Item(item) => batch.add(item),
                Message::Flush(ack) => flushed.push(ack),
                Message::Close(ack) => close = Some(ack),
            }
        }
        // More than a batch still queued: the writer is behind.
        let behind = rx.len() >= options.batch;
        sampling = lanes
            .write(batch, sampling, behind, &closing, &options)
            .await;
        for ack in flushed {
            let _ = ack.send(());
        }
        if let Some(ack) = close {
            // Anything queued after the close request is written too before stopping.
            let mut rest = Batch::default();
            let mut answered = Vec::new();
            while let Ok(message) = rx.try_recv() {
                match message {
                    Message::Item(item) => rest.add(item),
                    Message::Flush(other) | Message::Close(other) => answered.push(other),
                }
            }
            // On the writer's own runtime: the close must not wait for idle CPU.
            lanes.write_own(rest, sampling, &closing, &options).await;
            for other in answered {
                let _ = other.send(());
            }
            let _ = ack.send(());
            return;
        }
    }
}

/// How long batches first stay on the writer's own runtime once it has fallen behind.
const MIN_HOLD: Duration = Duration::from_secs(1);
/// The longest stay: each time the idle lane fails to keep up again, the stay doubles.
const MAX_HOLD: Duration = Duration::from_secs(64);
/// The idle lane used this long without falling behind: the next stay starts short again.
const SETTLED: Duration = Duration::from_secs(10);
/// A batch on the idle lane taking longer than this was starved of CPU: the machine is busy.
const STARVED: Duration = Duration::from_millis(50);

/// When batches go to the idle lane. The writer falls back to its own runtime when it falls
/// behind, for a stay that doubles each time the lane fails again (a machine near saturation
/// would otherwise starve the lane, and fill the queue, once per stay) and starts short again
/// once the lane has kept up for a while.
#[derive(Debug)]
struct LanePolicy {
    /// Batches stay on the writer's own runtime until then.
    own_until: Instant,
    hold: Duration,
    /// Since when batches have gone to the idle lane without falling behind.
    on_lane_since: Option<Instant>,
}

impl LanePolicy {
    fn new(now: Instant) -> Self {
        LanePolicy {
            own_until: now,
            hold: MIN_HOLD,
            on_lane_since: None,
        }
    }

    /// Whether the batch taken at `now` goes to the idle lane; `behind`: more than a batch was
    /// still queued when it was taken.
    fn use_lane(&mut self, behind: bool, now: Instant) -> bool {
        if behind {
            self.fell_behind(now);
            return false;
        }
        if now < self.own_until {
            return false;
        }
        let since = *self.on_lane_since.get_or_insert(now);
        if now.duration_since(since) >= SETTLED {
            self.hold = MIN_HOLD;
        }
        true
    }

    /// A batch on the idle lane, started at `started`, has been written at `now`; whether it
    /// was starved of CPU.
    fn lane_batch_written(&mut self, started: Instant, now: Instant) -> bool {
        let starved = now.duration_since(started) > STARVED;
        if starved {
            self.fell_behind(now);
        }
        starved
    }

    fn fell_behind(&mut self, now: Instant) {
        let on_lane = self.on_lane_since.take().is_some() && now >= self.own_until;
        self.own_until = now + self.hold;
        // Failing on the lane doubles the next stay; falling behind again while off the lane
        // only renews this one.
        if on_lane {
            self.hold = (self.hold * 2).min(MAX_HOLD);
        }
    }
}

/// Where the next batch is written: the idle lane while the writer keeps up, else the
/// writer's own runtime (at normal priority).
struct Lanes {
    store: Store,
    idle: Option<IdleLane>,
    policy: LanePolicy,
    counters: Arc<LaneCounters>,
}

/// Shared between the writer's task, which counts, and [`RunWriter::lane_counts`].
#[derive(Debug, Default)]
struct LaneCounters {
    idle: AtomicU64,
    own: AtomicU64,
    starved: AtomicU64,
}

/// What the writer's lanes have done since it started (for metrics: a machine that keeps
/// starving the idle lane shows as `starved_batches` and batches moving to `own_batches`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneCounts {
    /// Batches sent to the idle lane (counted as they are taken, before they are written).
    pub idle_batches: u64,
    /// Batches written on the writer's own runtime (no lane, or the writer fell behind).
    pub own_batches: u64,
    /// Idle-lane batches that took longer than `STARVED` (50 ms): the machine was busy.
    pub starved_batches: u64,
}

impl Lanes {
    async fn write(
        &mut self,
        batch: Batch,
        mut sampling: TextSampling,
        behind: bool,
        closing: &watch::Receiver<bool>,
        options: &Arc<WriterOptions>,
    ) -> TextSampling {
        if batch.is_empty() {
            // Only a close was taken: nothing to write, nothing to count.
            return sampling;
        }
        let started = Instant::now();
        let lane = match &self.idle {
            Some(lane) if self.policy.use_lane(behind, started) => lane,
            _ => return self.write_own(batch, sampling, closing, options).await,
        };
        // Counted when taken, so a reader who has seen the batch's runs sees it counted.
        self.counters.idle.fetch_add(1, Ordering::Relaxed);
        let (store, closing, options) = (lane.store.clone(), closing.clone(), options.clone());
        let job = lane.runtime.spawn(async move {
            batch.write(&store, &mut sampling, &closing, &options).await;
            sampling
        });
        let result = job.await;
        if self.policy.lane_batch_written(started, Instant::now()) {
            self.counters.starved.fetch_add(1, Ordering::Relaxed);
        }
        result.unwrap_or_else(|error| {
            // The batch panicked, or the lane's runtime is gone: that batch is lost, and the
            // writer goes on alone.
            tracing::error!(%error, "the invocation log's idle lane lost a batch; writing on the writer's runtime from now on");
            self.idle = None;
            TextSampling::default()
        })
    }

    /// Writes `batch` on the writer's own runtime.
    async fn write_own(
        &mut self,
        batch: Batch,
        mut sampling: TextSampling,
        closing: &watch::Receiver<bool>,
        options: &Arc<WriterOptions>,
    ) -> TextSampling {
        if batch.is_empty() {
            return sampling;
        }
        self.counters.own.fetch_add(1, Ordering::Relaxed);
        batch
            .write(&self.store, &mut sampling, closing, options)
            .await;
        sampling
    }
}

/// The items of one write.
#[derive(Default)]
struct Batch {
    records: Vec<RunRecord>,
    events: Vec<(TenantId, StoredEvent)>,
    lines: Vec<(TenantId, Vec<RunLogEntry>)>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.events.is_empty() && self.lines.is_empty()
    }

    fn add(&mut self, item: LogItem) {
        match item {
            LogItem::Run(record) => self.records.push(*record),
            LogItem::Events(tenant, list) => self
                .events
                .extend(list.into_iter().map(|e| (tenant.clone(), e))),
            LogItem::LogEntries(tenant, lines) => self.lines.push((tenant, lines)),
        }
    }

    async fn write(
        mut self,
        store: &Store,
        sampling: &mut TextSampling,
        closing: &watch::Receiver<bool>,
        options: &WriterOptions,
    ) {
        sampling
            .apply(store, &mut self.records, &mut self.events)
            .await;
        write_with_retry(store, &self.records, &self.events, closing.clone(), options).await;
        // Debugging aid, not billing data: one attempt, failures reported. One transaction, so
        // a reader sees all of a run's lines or none (a run's lines take several statements).
        if let Err(error) = store
            .write_log_entry_sets(
                self.lines
                    .iter()
                    .map(|(tenant, lines)| (tenant, lines.as_slice())),
            )
            .await
        {
            tracing::warn!(%error, "could not write captured log lines");
        }
    }
}

/// Attempts at a batch after which a writer that is shutting down gives it up.
const CLOSING_ATTEMPTS: u32 = 5;

/// Retries a failed batch with backoff: the log is not dropped because the database blinked.
/// Once shutting down (`closing`, which also cuts a backoff short), gives up after a few
/// attempts so the process can exit.
async fn write_with_retry(
    store: &Store,
    records: &[RunRecord],
    events: &[(TenantId, StoredEvent)],
    mut closing: watch::Receiver<bool>,
    options: &WriterOptions,
) {
    if records.is_empty() && events.is_empty() {
        return;
    }
    let mut delay = Duration::from_millis(100);
    let mut attempt = 0u32;
    loop {
        match store.write_runs(records, events).await {
            Ok(alerts) => {
                if let Some(observer) = &options.observer {
                    observer.written(records);
                }
                if let Some(sink) = &options.alerts {
                    for alert in alerts {
                        // No deliverer (shutting down): the alert stays recorded, undelivered.
                        let _ = sink.send(alert);
                    }
                }
                return;
            }
            Err(err) => {
                attempt += 1;
                tracing::error!(error = %err, attempt, runs = records.len(), "could not write the invocation log; retrying");
                if *closing.borrow() && attempt >= CLOSING_ATTEMPTS {
                    tracing::error!(
                        runs = records.len(),
                        "giving up on invocation log rows at shutdown"
                    );
                    return;
                }
                // A close request ends the wait early (then the attempts left are few).
                let was_closing = *closing.borrow();
                let close_requested = async {
                    if was_closing || closing.wait_for(|c| *c).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = close_requested => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// A fresh run record with every counter at zero.
pub fn new_record(
    id: String,
    tenant: TenantId,
    kind: RunKind,
    requested_model: String,
) -> RunRecord {
    RunRecord::pending(id, tenant, kind, requested_model)
}

/// Writers for tests of back-pressure and load shedding (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
#[allow(
    clippy::expect_used,
    reason = "test set-up: a failure here is a broken test, reported at once"
)]
pub mod test_support {
    use baton_domain::TenantId;
    use baton_domain::run::RunKind;

    use super::{LogItem, RunWriter, WriterOptions, new_record};
    use crate::{Store, StoreOptions};

    /// A writer whose database is gone: it has taken one item and retries it without end, so
    /// its queue of `capacity` places fills and callers then wait for room.
    pub async fn stuck_writer(capacity: usize) -> RunWriter {
        let mut options = StoreOptions::new("sqlite::memory:");
        options.max_connections = 1;
        let store = Store::connect(&options).await.expect("in-memory SQLite");
        store.clone().close().await.expect("close");
        let writer = RunWriter::spawn(
            store,
            WriterOptions {
                capacity,
                batch: 1,
                max_delay: std::time::Duration::ZERO,
                ..WriterOptions::default()
            },
        );
        writer.write(run_item(0)).await.expect("queued");
        while writer.queue_depth() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        writer
    }

    /// A pending run of tenant `t` to queue.
    pub fn run_item(n: usize) -> LogItem {
        run_item_of(&TenantId::new("t"), n)
    }

    /// A pending run of `tenant` to queue.
    pub fn run_item_of(tenant: &TenantId, n: usize) -> LogItem {
        LogItem::Run(Box::new(new_record(
            format!("run-{n}"),
            tenant.clone(),
            RunKind::Chat,
            "m".into(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{run_item, run_item_of, stuck_writer};
    use super::*;

    #[test]
    fn a_pending_row_replaced_later_in_its_batch_is_not_written() {
        let run = |id: &str, status| {
            let mut record = new_record(id.into(), TenantId::new("t"), RunKind::Flow, "m".into());
            record.status = status;
            record
        };
        let mut other_tenant = run("a", RunStatus::Pending);
        other_tenant.tenant = Some(TenantId::new("u"));
        let batch = [
            run("a", RunStatus::Pending),
            run("b", RunStatus::Pending),
            other_tenant,
            run("a", RunStatus::Succeeded),
            // A finished write followed by a pending one (not how runs are queued): both kept,
            // in order, as before.
            run("c", RunStatus::Failed),
            run("c", RunStatus::Pending),
        ];
        let kept: Vec<(&str, &str, RunStatus)> = latest_writes(&batch)
            .iter()
            .map(|r| (r.tenant.as_ref().unwrap().as_str(), r.id.as_str(), r.status))
            .collect();
        assert_eq!(
            kept,
            [
                ("t", "b", RunStatus::Pending),
                ("u", "a", RunStatus::Pending),
                ("t", "a", RunStatus::Succeeded),
                ("t", "c", RunStatus::Failed),
                ("t", "c", RunStatus::Pending),
            ]
        );
    }

    #[tokio::test]
    async fn the_queue_has_room_while_at_most_half_full() {
        let writer = stuck_writer(4).await;
        assert!(writer.has_room());
        writer.write(run_item(1)).await.unwrap();
        writer.write(run_item(2)).await.unwrap();
        assert!(writer.has_room(), "half full: the writer keeps up");
        writer.write(run_item(3)).await.unwrap();
        assert!(
            !writer.has_room(),
            "more than half: requests queue before replying"
        );
    }

    #[tokio::test]
    async fn callers_waiting_for_room_are_timed_from_the_oldest() {
        let writer = stuck_writer(2).await;
        writer.write(run_item(1)).await.unwrap();
        writer.write(run_item(2)).await.unwrap();
        assert_eq!(writer.longest_wait(), Duration::ZERO, "nobody waits yet");

        let first = tokio::spawn({
            let writer = writer.clone();
            async move { writer.write(run_item(3)).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let before_second = Instant::now();
        let second = tokio::spawn({
            let writer = writer.clone();
            async move { writer.write(run_item(4)).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(writer.longest_wait() >= Duration::from_millis(30));
        // A caller that gives up leaves; the next oldest is timed.
        first.abort();
        let _ = first.await;
        assert!(writer.longest_wait() <= before_second.elapsed());
        second.abort();
        let _ = second.await;
        assert_eq!(writer.longest_wait(), Duration::ZERO);
    }

    /// Reports each written batch's size.
    struct Batches(mpsc::UnboundedSender<usize>);

    impl WrittenRuns for Batches {
        fn written(&self, records: &[RunRecord]) {
            let _ = self.0.send(records.len());
        }
    }

    async fn writer(
        batch: usize,
        max_delay: Duration,
    ) -> (RunWriter, TenantId, mpsc::UnboundedReceiver<usize>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (writer, tenant) = writer_with(|_| WriterOptions {
            batch,
            max_delay,
            observer: Some(Arc::new(Batches(tx))),
            ..WriterOptions::default()
        })
        .await;
        (writer, tenant, rx)
    }

    /// A writer on a fresh in-memory store with one tenant, given options built for that store.
    async fn writer_with(options: impl FnOnce(&Store) -> WriterOptions) -> (RunWriter, TenantId) {
        let store = crate::test_db::memory_store().await;
        let tenant = store.create_tenant("t").await.unwrap().id;
        let options = options(&store);
        (RunWriter::spawn(store, options), tenant)
    }

    #[tokio::test]
    async fn a_full_batch_is_written_without_waiting_for_the_deadline() {
        let (writer, tenant, mut written) = writer(4, Duration::from_secs(3600)).await;
        writer.write(run_item_of(&tenant, 0)).await.unwrap();
        // The writer takes the first item and waits for its batch to fill (for an hour)...
        tokio::time::sleep(Duration::from_millis(20)).await;
        // ...until the queue holds a full batch.
        for n in 1..5 {
            writer.write(run_item_of(&tenant, n)).await.unwrap();
        }
        let mut total = 0;
        while total < 4 {
            total += tokio::time::timeout(Duration::from_secs(30), written.recv())
                .await
                .expect("a full batch is written before its deadline")
                .unwrap();
        }
        writer.close().await;
        while let Ok(count) = written.try_recv() {
            total += count;
        }
        assert_eq!(total, 5, "close writes the rest");
    }

    /// Reports the thread each batch was written on.
    struct Threads(mpsc::UnboundedSender<Option<String>>);

    impl WrittenRuns for Threads {
        fn written(&self, _: &[RunRecord]) {
            let _ = self
                .0
                .send(std::thread::current().name().map(str::to_owned));
        }
    }

    /// A writer on the test's runtime with an idle lane on a thread named `lane` (its own
    /// runtime, at normal priority).
    struct LaneWriter {
        writer: RunWriter,
        tenant: TenantId,
        /// The thread each batch was written on.
        threads: mpsc::UnboundedReceiver<Option<String>>,
        /// The lane's runtime.
        lane: tokio::runtime::Handle,
        /// Resolves once the lane's thread has ended.
        lane_ended: oneshot::Receiver<()>,
    }

    async fn writer_with_lane(batch: usize, max_delay: Duration) -> LaneWriter {
        let (handle_tx, handle_rx) = oneshot::channel();
        let (alive, dropped) = oneshot::channel::<()>();
        let (ended_tx, ended) = oneshot::channel();
        std::thread::Builder::new()
            .name("lane".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                handle_tx.send(runtime.handle().clone()).unwrap();
                runtime.block_on(async {
                    let _ = dropped.await;
                });
                let _ = ended_tx.send(());
            })
            .unwrap();
        let handle = handle_rx.await.unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let (writer, tenant) = writer_with(|store| WriterOptions {
            batch,
            max_delay,
            observer: Some(Arc::new(Threads(tx))),
            idle_lane: Some(IdleLane::new(handle.clone(), store.clone(), alive)),
            ..WriterOptions::default()
        })
        .await;
        LaneWriter {
            writer,
            tenant,
            threads: rx,
            lane: handle,
            lane_ended: ended,
        }
    }

    #[tokio::test]
    async fn batches_go_to_the_idle_lane_while_the_writer_keeps_up() {
        let LaneWriter {
            writer,
            tenant,
            mut threads,
            lane_ended,
            ..
        } = writer_with_lane(256, Duration::from_millis(10)).await;
        let here = std::thread::current().name().map(str::to_owned);
        for n in 0..3 {
            writer.write(run_item_of(&tenant, n)).await.unwrap();
            let thread = tokio::time::timeout(Duration::from_secs(30), threads.recv())
                .await
                .expect("the batch is written")
                .unwrap();
            assert_eq!(thread.as_deref(), Some("lane"), "batch {n}");
        }
        assert_ne!(here.as_deref(), Some("lane"));
        writer.close().await;
        let counts = writer.lane_counts();
        assert_eq!((counts.idle_batches, counts.own_batches), (3, 0));
        drop(writer);
        tokio::time::timeout(Duration::from_secs(30), lane_ended)
            .await
            .expect("the lane's thread ends once the writer has stopped")
            .unwrap();
    }

    #[tokio::test]
    async fn a_writer_behind_writes_on_its_own_runtime() {
        let LaneWriter {
            writer,
            tenant,
            mut threads,
            ..
        } = writer_with_lane(2, Duration::ZERO).await;
        // The test's runtime has one thread: the writer cannot take anything until the test
        // yields, so it finds more than a batch queued.
        for n in 0..10 {
            writer.write(run_item_of(&tenant, n)).await.unwrap();
        }
        writer.close().await;
        let here = std::thread::current().name().map(str::to_owned);
        let mut batches = 0;
        while let Ok(thread) = threads.try_recv() {
            // Once behind, the writer stays on its own runtime for a while (`BEHIND_HOLD`).
            assert_eq!(thread, here, "batch {batches}");
            batches += 1;
        }
        assert_eq!(batches, 5, "ten runs in batches of two");
        let counts = writer.lane_counts();
        assert_eq!((counts.idle_batches, counts.own_batches), (0, 5));
    }

    #[tokio::test]
    async fn a_starved_lane_batch_is_counted_and_the_next_batch_written_on_the_writers_runtime() {
        let LaneWriter {
            writer,
            tenant,
            mut threads,
            lane,
            ..
        } = writer_with_lane(1, Duration::ZERO).await;
        // The lane's thread is busy for longer than `STARVED`: the batch waits for it.
        lane.spawn(async { std::thread::sleep(STARVED * 2) });
        let here = std::thread::current().name().map(str::to_owned);
        let mut written_on = Vec::new();
        for n in 0..2 {
            writer.write(run_item_of(&tenant, n)).await.unwrap();
            let thread = tokio::time::timeout(Duration::from_secs(30), threads.recv())
                .await
                .expect("the batch is written")
                .unwrap();
            written_on.push(thread);
        }
        writer.close().await;
        let lane_thread = Some("lane".to_owned());
        // The next is written off the lane: a stay (1 s) follows the starved batch.
        assert_eq!(written_on, [lane_thread, here]);
        assert_eq!(
            writer.lane_counts(),
            LaneCounts {
                idle_batches: 1,
                own_batches: 1,
                starved_batches: 1
            }
        );
    }

    #[test]
    fn the_stay_off_the_lane_doubles_while_the_lane_keeps_failing_and_resets_once_settled() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut policy = LanePolicy::new(start);
        assert!(policy.use_lane(false, at(0)));
        // Starved on the lane: off it for 1 s; the next stay will be 2 s.
        policy.lane_batch_written(at(0), at(100));
        assert!(!policy.use_lane(false, at(1_000)));
        // Behind while off the lane: the stay is renewed (2 s), not doubled.
        assert!(!policy.use_lane(true, at(1_050)));
        assert!(!policy.use_lane(false, at(3_000)));
        assert!(policy.use_lane(false, at(3_100)));
        // Behind again on the lane: 2 s, and then 4 s.
        assert!(!policy.use_lane(true, at(3_200)));
        assert!(!policy.use_lane(false, at(5_100)));
        assert!(policy.use_lane(false, at(5_300)));
        policy.lane_batch_written(at(5_300), at(5_400));
        assert!(!policy.use_lane(false, at(9_300)));
        assert!(policy.use_lane(false, at(9_500)));
        // Kept up for 10 s: the next stay is short again.
        assert!(policy.use_lane(false, at(19_500)));
        policy.lane_batch_written(at(19_500), at(19_510));
        assert!(
            policy.use_lane(false, at(19_520)),
            "a fast batch changes nothing"
        );
        assert!(!policy.use_lane(true, at(19_600)));
        assert!(!policy.use_lane(false, at(20_500)));
        assert!(policy.use_lane(false, at(20_700)));
    }

    #[test]
    fn the_stay_off_the_lane_is_bounded() {
        let start = Instant::now();
        let mut policy = LanePolicy::new(start);
        let mut now = start;
        for _ in 0..20 {
            assert!(policy.use_lane(false, now));
            assert!(!policy.use_lane(true, now));
            now = policy.own_until;
        }
        assert_eq!(policy.hold, MAX_HOLD);
    }

    #[tokio::test]
    async fn a_lone_item_is_written_at_the_deadline() {
        let (writer, tenant, mut written) = writer(256, Duration::from_millis(50)).await;
        let queued = Instant::now();
        writer.write(run_item_of(&tenant, 0)).await.unwrap();
        let count = tokio::time::timeout(Duration::from_secs(30), written.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(count, 1);
        assert!(
            queued.elapsed() >= Duration::from_millis(50),
            "written before its batch had its moment to fill"
        );
        writer.close().await;
    }
}
