//! Runs whose process never finished them: a run's `Pending` row is written when it starts and
//! replaced when it ends, so a process killed mid-run (or stopped while the database was away,
//! giving its final rows up) leaves the row `Pending` and its budget holds reserved. A sweep
//! finishes every run still `Pending` past the longest a run can live on a live instance: status
//! `Failed`, error code [`RUN_ABANDONED`], `completedAt` set, and the holds stored with the row
//! given back, in bounded batches. Each row is finished by a conditional update (still
//! `Pending`), so several instances sweeping at once finish it, and release its holds, once.

use std::time::Duration;

use baton_domain::Timestamp;
use baton_domain::budget::BudgetHold;
use baton_domain::run::RunStatus;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::entity::runs;
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

/// The error code of a run finished by the sweep.
pub const RUN_ABANDONED: &str = "RUN_ABANDONED";
/// The condition of the partial index `ix_runs_status_created` (migration m20261124_000001).
pub(crate) const PENDING_CONDITION: &str = "\"status\" = 'Pending'";
const MESSAGE: &str = "the run was not finished by the process that started it (stopped, crashed, or unable to reach the database); its outcome is unknown";

/// The oldest `batch` runs still `Pending` that started before `cutoff`: id, tenant, holds.
fn pending_runs(cutoff: Timestamp, batch: u64) -> sea_orm::Select<runs::Entity> {
    runs::Entity::find()
        .select_only()
        .column(runs::Column::Id)
        .column(runs::Column::TenantId)
        .column(runs::Column::BudgetHolds)
        // A literal, not a bound value: it is the pending-run index's condition, which the
        // planners can only match against a literal.
        .filter(Expr::cust(PENDING_CONDITION))
        .filter(runs::Column::CreatedAt.lt(to_millis(cutoff)))
        .order_by_asc(runs::Column::CreatedAt)
        .limit(batch)
}

impl Store {
    /// Finishes up to `batch` runs still `Pending` that started before `cutoff`, oldest first.
    /// Returns `(finished, seen)`: call again while `seen == batch`.
    pub async fn finish_abandoned_runs_batch(
        &self,
        cutoff: Timestamp,
        batch: u64,
    ) -> StoreResult<(u64, u64)> {
        let pending: Vec<(String, String, String)> = pending_runs(cutoff, batch)
            .into_tuple()
            .all(self.conn())
            .await?;
        if pending.is_empty() {
            return Ok((0, 0));
        }
        let seen = pending.len() as u64;
        let now = to_millis(Timestamp::now());
        let txn = self.begin_write().await?;
        let mut finished = 0;
        for (id, tenant, holds) in pending {
            let updated = runs::Entity::update_many()
                .col_expr(
                    runs::Column::Status,
                    Expr::value(RunStatus::Failed.as_str()),
                )
                .col_expr(runs::Column::ErrorCode, Expr::value(RUN_ABANDONED))
                .col_expr(runs::Column::ErrorMessage, Expr::value(MESSAGE))
                .col_expr(runs::Column::CompletedAt, Expr::value(now))
                // Given back below: a late final row from the original process must not
                // release them again (`write_runs`).
                .col_expr(runs::Column::BudgetHolds, Expr::value("[]"))
                .filter(runs::Column::Id.eq(id.as_str()))
                .filter(runs::Column::Status.eq(RunStatus::Pending.as_str()))
                .exec(&txn)
                .await?;
            if updated.rows_affected == 0 {
                // Another instance (or the run's own final row) got there first.
                continue;
            }
            finished += 1;
            // A row whose holds cannot be read keeps its reservation rather than failing the
            // sweep for every other run.
            let holds: Vec<BudgetHold> = serde_json::from_str(&holds).unwrap_or_else(|error| {
                tracing::warn!(run = id.as_str(), %error, "abandoned run: unreadable budget holds");
                Vec::new()
            });
            for hold in &holds {
                crate::budgets::release(&txn, &tenant, hold).await?;
            }
        }
        txn.commit().await?;
        Ok((finished, seen))
    }

    /// Finishes every run still `Pending` that started more than `older_than` ago, `batch` at a
    /// time. Returns how many it finished.
    pub async fn finish_abandoned_runs(
        &self,
        older_than: Duration,
        batch: u64,
    ) -> StoreResult<u64> {
        let batch = batch.max(1);
        let age = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let cutoff = from_millis(to_millis(Timestamp::now()).saturating_sub(age));
        let mut finished = 0;
        loop {
            let (count, seen) = self.finish_abandoned_runs_batch(cutoff, batch).await?;
            finished += count;
            if seen < batch {
                return Ok(finished);
            }
            // Let request traffic in between batches.
            tokio::task::yield_now().await;
        }
    }
}

/// Sweeps abandoned runs once now (start-up, after migrations) and then every `interval`
/// (`None`: only once), on its own task, logging how many it finished.
pub fn spawn_abandoned_run_sweep(
    store: Store,
    older_than: Duration,
    interval: Option<Duration>,
    batch: u64,
) {
    tokio::spawn(async move {
        let mut ticker = interval.map(|every| {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker
        });
        let mut first = true;
        loop {
            if let Some(ticker) = ticker.as_mut() {
                // The first tick is immediate: the start-up pass.
                ticker.tick().await;
            }
            match store.finish_abandoned_runs(older_than, batch).await {
                // Later passes that find nothing stay quiet.
                Ok(0) if !first => {}
                Ok(count) => tracing::info!(
                    runs = count,
                    older_than_secs = older_than.as_secs(),
                    "abandoned runs: finished runs left pending as {RUN_ABANDONED}"
                ),
                Err(error) => {
                    tracing::warn!(%error, "abandoned run sweep failed; retrying next pass")
                }
            }
            if ticker.is_none() {
                return;
            }
            first = false;
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sea_orm::{DbBackend, QueryTrait, Statement};

    use super::*;
    use crate::test_db::{memory_store, sqlite_plan};

    async fn plan(store: &Store, sql: &str) -> String {
        sqlite_plan(store, Statement::from_string(DbBackend::Sqlite, sql))
            .await
            .join("; ")
    }

    /// The runs indexes most rows stay out of (partial, migration m20261124_000001) still serve
    /// the queries that need them.
    #[tokio::test]
    async fn partial_runs_indexes_serve_their_queries_on_sqlite() {
        let store = memory_store().await;

        let sweep = pending_runs(Timestamp::now(), 10)
            .build(DbBackend::Sqlite)
            .to_string();
        let sweep_plan = plan(&store, &sweep).await;
        assert!(
            sweep_plan.contains("ix_runs_status_created"),
            "the sweep scans the runs: {sweep_plan}"
        );
        for (query, index) in [
            (
                "SELECT id FROM runs WHERE tenant_id = 't' AND parent_id = 'p'",
                "ix_runs_tenant_parent",
            ),
            (
                "SELECT id FROM runs WHERE tenant_id = 't' AND customer_external_id = 'c' \
                 AND created_at >= 0",
                "ix_runs_tenant_customer",
            ),
            (
                "SELECT id FROM runs WHERE tenant_id = 't' AND flow_name = 'f' \
                 AND created_at >= 0",
                "ix_runs_tenant_flow_created",
            ),
        ] {
            let found = plan(&store, query).await;
            assert!(found.contains(index), "{query}: {found}");
        }
    }
}
