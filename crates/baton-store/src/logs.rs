//! Reading the invocation log: filtered keyset pages, the agent tree around a run, and the
//! internal log lines of debug runs. Every query is scoped to one tenant.

use baton_domain::TenantId;
use baton_domain::logs::{LogFilter, LogPosition, RunLogEntry, RunSummary};
use baton_domain::run::RunStatus;
use sea_orm::sea_query::Query;
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter, QueryOrder,
    QuerySelect, Set,
};

use crate::entity::{run_log_entries, run_tags, runs};
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreError, StoreResult};

/// Longest parent chain `run_breadcrumb` follows; agent trees are bounded far below this, so
/// hitting it means a corrupt (cyclic) chain.
const MAX_BREADCRUMB: usize = 256;

/// Most children `run_children` returns.
const MAX_CHILDREN: u64 = 1000;

/// The columns of a summary: the row without its request and response bodies.
#[derive(Debug, FromQueryResult)]
struct SummaryRow {
    id: String,
    root_id: String,
    parent_id: Option<String>,
    depth: i32,
    agent_role: Option<String>,
    kind: String,
    environment: Option<String>,
    flow_name: Option<String>,
    requested_model: String,
    served_model: Option<String>,
    provider: Option<String>,
    status: String,
    finish_reason: Option<String>,
    tokens_in: i64,
    tokens_out: i64,
    reasoning_tokens: i64,
    cost_credits: i64,
    duration_ms: i64,
    customer_id: Option<String>,
    customer_external_id: Option<String>,
    tags: String,
    error_code: Option<String>,
    fallback_used: bool,
    was_cached: bool,
    detail_dropped: bool,
    cancel_requested_at: Option<i64>,
    cancelled_at: Option<i64>,
    created_at: i64,
    completed_at: Option<i64>,
}

const SUMMARY_COLUMNS: [runs::Column; 29] = [
    runs::Column::Id,
    runs::Column::RootId,
    runs::Column::ParentId,
    runs::Column::Depth,
    runs::Column::AgentRole,
    runs::Column::Kind,
    runs::Column::Environment,
    runs::Column::FlowName,
    runs::Column::RequestedModel,
    runs::Column::ServedModel,
    runs::Column::Provider,
    runs::Column::Status,
    runs::Column::FinishReason,
    runs::Column::TokensIn,
    runs::Column::TokensOut,
    runs::Column::ReasoningTokens,
    runs::Column::CostCredits,
    runs::Column::DurationMs,
    runs::Column::CustomerId,
    runs::Column::CustomerExternalId,
    runs::Column::Tags,
    runs::Column::ErrorCode,
    runs::Column::FallbackUsed,
    runs::Column::WasCached,
    runs::Column::DetailDropped,
    runs::Column::CancelRequestedAt,
    runs::Column::CancelledAt,
    runs::Column::CreatedAt,
    runs::Column::CompletedAt,
];

impl From<SummaryRow> for RunSummary {
    fn from(r: SummaryRow) -> Self {
        let to_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
        let status = RunStatus::parse(&r.status).unwrap_or(RunStatus::Failed);
        RunSummary {
            id: r.id,
            root_request_id: r.root_id,
            parent_request_id: r.parent_id,
            depth: u32::try_from(r.depth).unwrap_or(0),
            agent_role: r.agent_role,
            kind: r.kind,
            environment: r.environment,
            flow_name: r.flow_name,
            requested_model: r.requested_model,
            served_model: r.served_model,
            provider: r.provider,
            status: status.as_str().to_string(),
            finish_reason: r.finish_reason,
            tokens_in: to_u64(r.tokens_in),
            tokens_out: to_u64(r.tokens_out),
            reasoning_tokens: to_u64(r.reasoning_tokens),
            cost_credits: r.cost_credits,
            cost_usd: baton_domain::credits::Credits(r.cost_credits).to_usd(),
            duration_ms: to_u64(r.duration_ms),
            customer_id: r.customer_id,
            customer_external_id: r.customer_external_id,
            tags: serde_json::from_str(&r.tags).unwrap_or_default(),
            error_code: r.error_code,
            fallback_used: r.fallback_used,
            was_cached: r.was_cached,
            detail_dropped: r.detail_dropped,
            // Asked to stop, or stopped because a run above it was.
            cancelled: r.cancel_requested_at.is_some() || r.cancelled_at.is_some(),
            cancel_requested_at: r.cancel_requested_at.map(from_millis),
            cancelled_at: r.cancelled_at.map(from_millis),
            created_at: from_millis(r.created_at),
            completed_at: r.completed_at.map(from_millis),
        }
    }
}

fn summaries() -> sea_orm::Select<runs::Entity> {
    runs::Entity::find().select_only().columns(SUMMARY_COLUMNS)
}

fn filter_condition(tenant: &TenantId, filter: &LogFilter) -> Condition {
    let mut condition = Condition::all().add(runs::Column::TenantId.eq(tenant.as_str()));
    if let Some(from) = filter.from {
        condition = condition.add(runs::Column::CreatedAt.gte(to_millis(from)));
    }
    if let Some(to) = filter.to {
        condition = condition.add(runs::Column::CreatedAt.lt(to_millis(to)));
    }
    if !filter.environments.is_empty() {
        condition = condition.add(runs::Column::Environment.is_in(filter.environments.clone()));
    }
    if !filter.flows.is_empty() {
        condition = condition.add(runs::Column::FlowName.is_in(filter.flows.clone()));
    }
    if !filter.statuses.is_empty() {
        condition = condition.add(
            runs::Column::Status.is_in(filter.statuses.iter().map(|s| s.as_str().to_string())),
        );
    }
    if !filter.tags.is_empty() {
        let tagged = Query::select()
            .column(run_tags::Column::RunId)
            .from(run_tags::Entity)
            .and_where(run_tags::Column::TenantId.eq(tenant.as_str()))
            .and_where(run_tags::Column::Tag.is_in(filter.tags.clone()))
            .to_owned();
        condition = condition.add(runs::Column::Id.in_subquery(tagged));
    }
    if let Some(customer) = &filter.customer_external_id {
        condition = condition.add(runs::Column::CustomerExternalId.eq(customer.as_str()));
    }
    if filter.root_only {
        condition = condition.add(runs::Column::ParentId.is_null());
    }
    if let Some(parent) = &filter.parent_id {
        condition = condition.add(runs::Column::ParentId.eq(parent.as_str()));
    }
    match filter.cancelled {
        Some(true) => {
            condition = condition.add(
                Condition::any()
                    .add(runs::Column::CancelRequestedAt.is_not_null())
                    .add(runs::Column::CancelledAt.is_not_null()),
            );
        }
        Some(false) => {
            condition = condition
                .add(runs::Column::CancelRequestedAt.is_null())
                .add(runs::Column::CancelledAt.is_null());
        }
        None => {}
    }
    condition
}

impl Store {
    /// One page of the log, newest first by `(created_at, id)`, starting strictly after `after`.
    /// Returns up to `limit` summaries; the caller asks for one more to learn whether a next
    /// page exists.
    pub async fn list_log(
        &self,
        tenant: &TenantId,
        filter: &LogFilter,
        after: Option<&LogPosition>,
        limit: u64,
    ) -> StoreResult<Vec<RunSummary>> {
        let mut condition = filter_condition(tenant, filter);
        if let Some(after) = after {
            let at = to_millis(after.created_at);
            condition = condition.add(
                Condition::any().add(runs::Column::CreatedAt.lt(at)).add(
                    Condition::all()
                        .add(runs::Column::CreatedAt.eq(at))
                        .add(runs::Column::Id.lt(after.id.as_str())),
                ),
            );
        }
        Ok(summaries()
            .filter(condition)
            .order_by_desc(runs::Column::CreatedAt)
            .order_by_desc(runs::Column::Id)
            .limit(limit)
            .into_model::<SummaryRow>()
            .all(self.conn())
            .await?
            .into_iter()
            .map(RunSummary::from)
            .collect())
    }

    pub async fn run_summary(&self, tenant: &TenantId, id: &str) -> StoreResult<RunSummary> {
        summaries()
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .filter(runs::Column::Id.eq(id))
            .into_model::<SummaryRow>()
            .one(self.conn())
            .await?
            .map(RunSummary::from)
            .ok_or_else(|| StoreError::not_found("run", id))
    }

    /// The run and its ancestors, root first.
    pub async fn run_breadcrumb(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<Vec<RunSummary>> {
        let mut chain = vec![self.run_summary(tenant, id).await?];
        while let Some(parent) = chain.last().and_then(|r| r.parent_request_id.clone()) {
            if chain.len() >= MAX_BREADCRUMB || chain.iter().any(|r| r.id == parent) {
                return Err(StoreError::Corrupt(
                    "run",
                    format!("the parent chain of run {id} does not end"),
                ));
            }
            match self.run_summary(tenant, &parent).await {
                Ok(summary) => chain.push(summary),
                // A parent not yet written (the log is batched) ends the chain here.
                Err(StoreError::NotFound { .. }) => break,
                Err(err) => return Err(err),
            }
        }
        chain.reverse();
        Ok(chain)
    }

    /// Direct children of a run, oldest first.
    pub async fn run_children(&self, tenant: &TenantId, id: &str) -> StoreResult<Vec<RunSummary>> {
        Ok(summaries()
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .filter(runs::Column::ParentId.eq(id))
            .order_by_asc(runs::Column::CreatedAt)
            .order_by_asc(runs::Column::Id)
            .limit(MAX_CHILDREN)
            .into_model::<SummaryRow>()
            .all(self.conn())
            .await?
            .into_iter()
            .map(RunSummary::from)
            .collect())
    }

    /// Stores internal log lines of a debug run, all or none: a reader never sees part of them.
    pub async fn write_log_entries(
        &self,
        tenant: &TenantId,
        entries: &[RunLogEntry],
    ) -> StoreResult<()> {
        self.write_log_entry_sets([(tenant, entries)]).await
    }

    /// Stores the log lines of several debug runs (a log writer's batch) in one transaction.
    pub async fn write_log_entry_sets<'a>(
        &self,
        sets: impl IntoIterator<Item = (&'a TenantId, &'a [RunLogEntry])>,
    ) -> StoreResult<()> {
        let sets: Vec<_> = sets
            .into_iter()
            .filter(|(_, entries)| !entries.is_empty())
            .collect();
        if sets.is_empty() {
            return Ok(());
        }
        let txn = self.begin_write().await?;
        for (tenant, entries) in sets {
            insert_log_entries(&txn, tenant, entries).await?;
        }
        Ok(txn.commit().await?)
    }

    /// The internal log lines kept for a run, in order (none for a run not made for debugging).
    pub async fn run_log_entries(
        &self,
        tenant: &TenantId,
        run_id: &str,
    ) -> StoreResult<Vec<RunLogEntry>> {
        Ok(run_log_entries::Entity::find()
            .filter(run_log_entries::Column::TenantId.eq(tenant.as_str()))
            .filter(run_log_entries::Column::RunId.eq(run_id))
            .order_by_asc(run_log_entries::Column::Seq)
            .all(self.conn())
            .await?
            .into_iter()
            .map(|m| RunLogEntry {
                id: m.id,
                run_id: m.run_id,
                seq: u32::try_from(m.seq).unwrap_or(0),
                level: m.level,
                target: m.target,
                message: m.message,
                fields: serde_json::from_str(&m.fields).unwrap_or_default(),
                timestamp: from_millis(m.created_at),
            })
            .collect())
    }
}

/// The `target` column's width.
const TARGET_MAX_CHARS: usize = 256;

/// `text` as a column takes it: PostgreSQL refuses NUL in text, and one refused line would lose
/// its whole batch's lines (they are one transaction).
fn storable(text: &str, max_chars: usize) -> String {
    let text = match text.char_indices().nth(max_chars) {
        Some((end, _)) => &text[..end],
        None => text,
    };
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text.to_string()
    }
}

/// Inserts a run's lines (up to 5,000) in statements SQLite's parameter bound always allows;
/// the caller's transaction makes the statements one write.
async fn insert_log_entries(
    conn: &impl ConnectionTrait,
    tenant: &TenantId,
    entries: &[RunLogEntry],
) -> StoreResult<()> {
    let rows = entries.iter().map(|e| run_log_entries::ActiveModel {
        id: Set(e.id.clone()),
        tenant_id: Set(tenant.as_str().to_string()),
        run_id: Set(e.run_id.clone()),
        seq: Set(i32::try_from(e.seq).unwrap_or(i32::MAX)),
        level: Set(e.level.clone()),
        target: Set(storable(&e.target, TARGET_MAX_CHARS)),
        message: Set(storable(&e.message, usize::MAX)),
        fields: Set(serde_json::to_string(&e.fields).unwrap_or_else(|_| "{}".into())),
        created_at: Set(to_millis(e.timestamp)),
    });
    for chunk in crate::bulk::chunks(rows.collect()) {
        run_log_entries::Entity::insert_many(chunk)
            .on_conflict_do_nothing()
            .exec_without_returning(conn)
            .await?;
    }
    Ok(())
}
