//! Statistics queries: tenant-scoped aggregates and narrow rows for `baton-ledger::stats`.
//!
//! Plain SQL that means the same on SQLite and PostgreSQL: `?` placeholders (numbered for
//! PostgreSQL by [`statement`]), integer division of BIGINT epoch milliseconds for time buckets,
//! sums cast to BIGINT (PostgreSQL sums BIGINT as NUMERIC), `substr` rather than `LIKE` for tag
//! prefixes (SQLite's `LIKE` ignores case, PostgreSQL's does not). Only finished runs count:
//! `Pending` rows are excluded everywhere.

use baton_domain::TenantId;
use sea_orm::{DbBackend, FromQueryResult, Statement, Value};

use crate::{Store, StoreResult};

/// A half-open time range `[from_ms, to_ms)` of run creation times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from_ms: i64,
    pub to_ms: i64,
}

/// Which flow a run's spend is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowGrouping {
    /// The flow the run itself ran (`split`).
    Own,
    /// The flow of the request's root run, so sub-agent spend folds into the entry point
    /// (`rollup`).
    Root,
}

/// What to aggregate over, and what to group by.
#[derive(Debug, Clone, Default)]
pub struct AggregateQuery {
    pub window: Option<Window>,
    /// Only runs of this flow.
    pub flow: Option<String>,
    /// Only runs carrying exactly this tag.
    pub tag: Option<String>,
    /// Leave out requests whose root is tagged `Panel` (tag reports).
    pub exclude_panel: bool,
    pub by_flow: Option<FlowGrouping>,
    pub by_model: bool,
    /// `(origin, width)`: bucket index `(created_at - origin) / width`.
    pub by_bucket: Option<(i64, i64)>,
}

/// Sums over a group of runs. Group keys not asked for are `None`.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct Aggregate {
    pub flow: Option<String>,
    pub model: Option<String>,
    pub bucket: Option<i64>,
    /// Run rows (model-calling requests and sub-agent requests).
    pub calls: i64,
    /// Distinct requests (root runs) the rows belong to.
    pub requests: i64,
    pub failed: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    /// 1 when any run of the group was priced without a catalogue entry.
    pub pricing_uncertain: i64,
}

/// One run of a flow, as the per-inference statistics need it.
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct FlowRun {
    pub id: String,
    pub root_id: String,
    pub depth: i64,
    pub served_model: Option<String>,
    pub status: String,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    pub duration_ms: i64,
    pub created_at: i64,
}

/// A root request of a flow with the totals of its agent tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRequest {
    pub id: String,
    pub served_model: Option<String>,
    pub status: String,
    pub duration_ms: i64,
    pub created_at: i64,
    /// Tool calls the root run made.
    pub tool_calls: i64,
    /// Runs in the tree, the root included.
    pub tree_runs: i64,
    /// Deepest agent of the tree (the root is depth 0).
    pub max_depth: i64,
    pub tree_cost_credits: i64,
    pub tree_raw_cost_credits: i64,
}

#[derive(FromQueryResult)]
struct FlowRequestRow {
    id: String,
    served_model: Option<String>,
    status: String,
    duration_ms: i64,
    created_at: i64,
    tool_calls: String,
    tree_runs: i64,
    max_depth: i64,
    tree_cost_credits: i64,
    tree_raw_cost_credits: i64,
}

/// Spend under one tag (the by-key report).
#[derive(Debug, Clone, PartialEq, Eq, FromQueryResult)]
pub struct TagTotal {
    pub tag: String,
    pub calls: i64,
    pub requests: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_credits: i64,
    pub raw_cost_credits: i64,
    pub pricing_uncertain: i64,
}

#[derive(FromQueryResult)]
struct Exists {
    found: i64,
}

const SUMS: &str = "COUNT(*) AS calls, COUNT(DISTINCT r.root_id) AS requests, \
    CAST(COALESCE(SUM(CASE WHEN r.status = 'Failed' THEN 1 ELSE 0 END), 0) AS BIGINT) AS failed, \
    CAST(COALESCE(SUM(r.tokens_in), 0) AS BIGINT) AS tokens_in, \
    CAST(COALESCE(SUM(r.tokens_out), 0) AS BIGINT) AS tokens_out, \
    CAST(COALESCE(SUM(r.cost_credits), 0) AS BIGINT) AS cost_credits, \
    CAST(COALESCE(SUM(r.raw_cost_credits), 0) AS BIGINT) AS raw_cost_credits, \
    CAST(COALESCE(MAX(CASE WHEN r.pricing_uncertain THEN 1 ELSE 0 END), 0) AS BIGINT) AS pricing_uncertain";

/// Requests whose root carries the `Panel` marker (or a `Panel:` tag) are not the tenant's own
/// traffic for tag reports (SPEC.md "Statistics").
///
/// Looked up by the root's run id alone: run ids are unique across tenants and `r` is already
/// the tenant's, and with `p.tenant_id` in the condition SQLite chose the `(tenant_id, tag)`
/// index and scanned every tag of the tenant for every row (a report over 7,000 runs took 12 s;
/// found by the soak, `cargo xtask soak`).
const NOT_PANEL: &str = "NOT EXISTS (SELECT 1 FROM run_tags p WHERE p.run_id = r.root_id \
    AND (p.tag = 'Panel' OR substr(p.tag, 1, 6) = 'Panel:'))";

/// A statement for the connection's backend: `?` placeholders become `$1, $2, ...` on
/// PostgreSQL. The SQL given here never has `?` inside a literal.
fn statement(backend: DbBackend, sql: &str, values: Vec<Value>) -> Statement {
    let sql = if backend == DbBackend::Postgres {
        let mut numbered = String::with_capacity(sql.len() + 16);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                numbered.push('$');
                numbered.push_str(&n.to_string());
            } else {
                numbered.push(c);
            }
        }
        numbered
    } else {
        sql.to_string()
    };
    Statement::from_sql_and_values(backend, sql, values)
}

impl Store {
    fn backend_kind(&self) -> DbBackend {
        self.conn().get_database_backend()
    }

    /// Sums of the tenant's finished runs, grouped as asked.
    pub async fn stats_aggregate(
        &self,
        tenant: &TenantId,
        query: &AggregateQuery,
    ) -> StoreResult<Vec<Aggregate>> {
        let mut values: Vec<Value> = Vec::new();
        let mut groups: Vec<&str> = Vec::new();
        let flow_expr = match query.by_flow {
            Some(FlowGrouping::Own) => "r.flow_name",
            Some(FlowGrouping::Root) => "root.flow_name",
            None => "CAST(NULL AS TEXT)",
        };
        if query.by_flow.is_some() {
            groups.push(flow_expr);
        }
        let model_expr = if query.by_model {
            groups.push("r.served_model");
            "r.served_model"
        } else {
            "CAST(NULL AS TEXT)"
        };
        let bucket_expr = if let Some((origin, width)) = query.by_bucket {
            values.push(origin.into());
            values.push(width.max(1).into());
            groups.push("bucket_key");
            "(r.created_at - ?) / ?"
        } else {
            "CAST(NULL AS BIGINT)"
        };
        let join = if query.by_flow == Some(FlowGrouping::Root) {
            " JOIN runs root ON root.tenant_id = r.tenant_id AND root.id = r.root_id"
        } else {
            ""
        };
        let mut sql = format!(
            "SELECT {flow_expr} AS flow, {model_expr} AS model, {bucket_expr} AS bucket, {SUMS} \
             FROM runs r{join} WHERE r.tenant_id = ? AND r.status <> 'Pending'"
        );
        values.push(tenant.as_str().into());
        if let Some(window) = query.window {
            sql.push_str(" AND r.created_at >= ? AND r.created_at < ?");
            values.push(window.from_ms.into());
            values.push(window.to_ms.into());
        }
        if let Some(flow) = &query.flow {
            sql.push_str(" AND r.flow_name = ?");
            values.push(flow.clone().into());
        }
        if let Some(tag) = &query.tag {
            sql.push_str(
                " AND EXISTS (SELECT 1 FROM run_tags t WHERE t.tenant_id = r.tenant_id \
                 AND t.run_id = r.id AND t.tag = ?)",
            );
            values.push(tag.clone().into());
        }
        if query.exclude_panel {
            sql.push_str(" AND ");
            sql.push_str(NOT_PANEL);
        }
        if !groups.is_empty() {
            // Bucket expressions are grouped by their output position: a repeated `?` pair
            // would be a different parameter to PostgreSQL.
            let keys: Vec<&str> = groups
                .iter()
                .map(|g| if *g == "bucket_key" { "3" } else { g })
                .collect();
            sql.push_str(" GROUP BY ");
            sql.push_str(&keys.join(", "));
        }
        let stmt = statement(self.backend_kind(), &sql, values);
        Ok(Aggregate::find_by_statement(stmt).all(self.conn()).await?)
    }

    /// Every finished run of `flow` in the window (sub-agent runs of the flow included).
    pub async fn stats_flow_runs(
        &self,
        tenant: &TenantId,
        flow: &str,
        window: Window,
    ) -> StoreResult<Vec<FlowRun>> {
        let sql = "SELECT r.id AS id, r.root_id AS root_id, CAST(r.depth AS BIGINT) AS depth, \
            r.served_model AS served_model, r.status AS status, r.tokens_in AS tokens_in, \
            r.tokens_out AS tokens_out, r.cost_credits AS cost_credits, \
            r.raw_cost_credits AS raw_cost_credits, r.duration_ms AS duration_ms, \
            r.created_at AS created_at \
            FROM runs r WHERE r.tenant_id = ? AND r.flow_name = ? AND r.status <> 'Pending' \
            AND r.created_at >= ? AND r.created_at < ? ORDER BY r.created_at, r.id";
        let values = vec![
            tenant.as_str().into(),
            flow.into(),
            window.from_ms.into(),
            window.to_ms.into(),
        ];
        let stmt = statement(self.backend_kind(), sql, values);
        Ok(FlowRun::find_by_statement(stmt).all(self.conn()).await?)
    }

    /// The flow's finished root requests in the window, each with its agent tree's totals.
    pub async fn stats_flow_requests(
        &self,
        tenant: &TenantId,
        flow: &str,
        window: Window,
    ) -> StoreResult<Vec<FlowRequest>> {
        let sql = flow_requests_sql();
        let scope = |values: &mut Vec<Value>| {
            values.push(tenant.as_str().into());
            values.push(flow.into());
            values.push(window.from_ms.into());
            values.push(window.to_ms.into());
        };
        let mut values: Vec<Value> = vec![tenant.as_str().into()];
        scope(&mut values);
        scope(&mut values);
        let stmt = statement(self.backend_kind(), &sql, values);
        let rows = FlowRequestRow::find_by_statement(stmt)
            .all(self.conn())
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| FlowRequest {
                tool_calls: serde_json::from_str::<Vec<serde_json::Value>>(&row.tool_calls)
                    .map(|calls| calls.len() as i64)
                    .unwrap_or(0),
                id: row.id,
                served_model: row.served_model,
                status: row.status,
                duration_ms: row.duration_ms,
                created_at: row.created_at,
                tree_runs: row.tree_runs,
                max_depth: row.max_depth,
                tree_cost_credits: row.tree_cost_credits,
                tree_raw_cost_credits: row.tree_raw_cost_credits,
            })
            .collect())
    }

    /// Whether the tenant has any run of a flow of this name (a deleted flow keeps its stats).
    pub async fn stats_flow_has_runs(&self, tenant: &TenantId, flow: &str) -> StoreResult<bool> {
        let sql = "SELECT COUNT(*) AS found FROM (SELECT 1 AS one FROM runs \
            WHERE tenant_id = ? AND flow_name = ? LIMIT 1) x";
        let stmt = statement(
            self.backend_kind(),
            sql,
            vec![tenant.as_str().into(), flow.into()],
        );
        Ok(Exists::find_by_statement(stmt)
            .one(self.conn())
            .await?
            .is_some_and(|e| e.found > 0))
    }

    /// Spend per distinct tag starting with `prefix` (case-sensitive, anchored), highest billed
    /// cost first, then by tag; at most `limit` rows. Panel requests are left out.
    pub async fn stats_tag_totals(
        &self,
        tenant: &TenantId,
        prefix: &str,
        window: Window,
        limit: u64,
    ) -> StoreResult<Vec<TagTotal>> {
        let sql = tag_totals_sql();
        let values: Vec<Value> = vec![
            tenant.as_str().into(),
            (prefix.chars().count() as i64).into(),
            prefix.into(),
            window.from_ms.into(),
            window.to_ms.into(),
            i64::try_from(limit).unwrap_or(i64::MAX).into(),
        ];
        let stmt = statement(self.backend_kind(), &sql, values);
        Ok(TagTotal::find_by_statement(stmt).all(self.conn()).await?)
    }
}

/// The by-key report's statement: tenant, prefix length, prefix, from, to, limit.
fn tag_totals_sql() -> String {
    format!(
        "SELECT t.tag AS tag, COUNT(*) AS calls, COUNT(DISTINCT r.root_id) AS requests, \
             CAST(COALESCE(SUM(r.tokens_in), 0) AS BIGINT) AS tokens_in, \
             CAST(COALESCE(SUM(r.tokens_out), 0) AS BIGINT) AS tokens_out, \
             CAST(COALESCE(SUM(r.cost_credits), 0) AS BIGINT) AS cost_credits, \
             CAST(COALESCE(SUM(r.raw_cost_credits), 0) AS BIGINT) AS raw_cost_credits, \
             CAST(COALESCE(MAX(CASE WHEN r.pricing_uncertain THEN 1 ELSE 0 END), 0) AS BIGINT) AS pricing_uncertain \
             FROM run_tags t JOIN runs r ON r.tenant_id = t.tenant_id AND r.id = t.run_id \
             WHERE t.tenant_id = ? AND substr(t.tag, 1, CAST(? AS INTEGER)) = ? \
             AND r.status <> 'Pending' AND r.created_at >= ? AND r.created_at < ? AND {NOT_PANEL} \
             GROUP BY t.tag ORDER BY cost_credits DESC, t.tag ASC LIMIT ?"
    )
}

/// The flow's finished root requests in a window with their trees' totals (parameters: the
/// tenant, then tenant, flow, from, to for the roots, then again for the outer rows).
fn flow_requests_sql() -> String {
    let roots = "SELECT id FROM runs WHERE tenant_id = ? AND parent_id IS NULL \
        AND flow_name = ? AND created_at >= ? AND created_at < ?";
    // The tree's totals: the root's own row and its children's sums (the root index
    // covers child runs only, as a root is found by its key).
    format!(
        "SELECT r.id AS id, r.served_model AS served_model, r.status AS status, \
         r.duration_ms AS duration_ms, r.created_at AS created_at, r.tool_calls AS tool_calls, \
         CAST(1 + COALESCE(t.child_runs, 0) AS BIGINT) AS tree_runs, \
         CAST(CASE WHEN t.max_depth > r.depth THEN t.max_depth ELSE r.depth END AS BIGINT) \
           AS max_depth, \
         CAST(r.cost_credits + COALESCE(t.cost_credits, 0) AS BIGINT) AS tree_cost_credits, \
         CAST(r.raw_cost_credits + COALESCE(t.raw_cost_credits, 0) AS BIGINT) \
           AS tree_raw_cost_credits \
         FROM runs r LEFT JOIN (SELECT root_id, COUNT(*) AS child_runs, \
           MAX(depth) AS max_depth, SUM(cost_credits) AS cost_credits, \
           SUM(raw_cost_credits) AS raw_cost_credits \
           FROM runs WHERE tenant_id = ? AND parent_id IS NOT NULL \
           AND root_id IN ({roots}) GROUP BY root_id) t \
         ON t.root_id = r.id \
         WHERE r.tenant_id = ? AND r.parent_id IS NULL AND r.flow_name = ? \
         AND r.status <> 'Pending' AND r.created_at >= ? AND r.created_at < ? \
         ORDER BY r.created_at, r.id"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's plan for the by-key report: the Panel check must find the root's tags through
    /// the run id (the primary key), not scan the tenant's tags for every row (quadratic).
    #[tokio::test]
    async fn the_panel_check_finds_root_tags_by_run_id_on_sqlite() {
        let store = crate::test_db::memory_store().await;
        let values: Vec<Value> = vec![
            "t".into(),
            5i64.into(),
            "Team:".into(),
            0i64.into(),
            1i64.into(),
            50i64.into(),
        ];
        let plan = crate::test_db::sqlite_plan(
            &store,
            statement(DbBackend::Sqlite, &tag_totals_sql(), values),
        )
        .await;
        let panel_lookup = plan
            .iter()
            .find(|line| line.contains(" p "))
            .unwrap_or_else(|| panic!("no step for the Panel check in {plan:?}"));
        assert!(
            panel_lookup.contains("run_id=?"),
            "the Panel check does not search by run id: {plan:?}"
        );
    }

    /// The trees' totals read the children through the root index, which covers child runs
    /// only: the query must name `parent_id IS NOT NULL` for SQLite (and PostgreSQL) to use it.
    #[tokio::test]
    async fn flow_trees_find_their_children_through_the_partial_root_index_on_sqlite() {
        let store = crate::test_db::memory_store().await;
        let mut values: Vec<Value> = vec!["t".into()];
        for _ in 0..2 {
            values.extend(["t".into(), "flow".into(), 0i64.into(), 1i64.into()]);
        }
        let plan = crate::test_db::sqlite_plan(
            &store,
            statement(DbBackend::Sqlite, &flow_requests_sql(), values),
        )
        .await;
        assert!(
            plan.iter().any(|line| line.contains("ix_runs_tenant_root")),
            "the children are not read through the root index: {plan:?}"
        );
    }

    #[test]
    fn placeholders_are_numbered_for_postgres() {
        let pg = statement(DbBackend::Postgres, "a = ? AND b = ?", vec![]);
        assert_eq!(pg.sql, "a = $1 AND b = $2");
        let lite = statement(DbBackend::Sqlite, "a = ? AND b = ?", vec![]);
        assert_eq!(lite.sql, "a = ? AND b = ?");
    }
}
