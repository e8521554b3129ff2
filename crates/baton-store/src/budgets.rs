//! Budgets: CRUD, holds taken before a request (one conditional update, so concurrent requests
//! cannot overspend beyond one request), and the spend and alerts written with the invocation
//! log (see [`Store::charge_budgets`], called inside the writer's transaction).

use std::collections::HashMap;

use baton_domain::budget::{Budget, BudgetHold, BudgetPeriod, BudgetWindow, ValidBudget};
use baton_domain::credits::Credits;
use baton_domain::run::{RunRecord, RunStatus};
use baton_domain::{TenantId, Timestamp, new_id};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Func, OnConflict, Query, SimpleExpr};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};

use baton_ledger::{budget_window, reached_thresholds};

use crate::entity::{budget_alerts, budget_charges, budget_windows, budgets, run_tags, runs};
use crate::error::{StoreError, on_unique};
use crate::time::{from_millis, to_millis};
use crate::{Store, StoreResult};

/// An alert no sender has finished with (not delivered, no attempt or outcome recorded): the
/// condition of the partial index `ix_budget_alerts_unsent_created` (migration
/// m20261129_000001).
const UNSENT: &str = "\"delivered_at\" IS NULL AND \"attempts\" = 0 AND \"last_error\" IS NULL";

/// An alert threshold reached for the first time in a period: what the webhook is told.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetAlert {
    pub tenant: TenantId,
    pub budget_id: String,
    pub window_start: Timestamp,
    pub threshold_percent: u32,
    pub spent_credits: i64,
    /// Delivery attempts made before this one (earlier, failed rounds).
    pub attempts: u32,
}

fn to_budget(model: budgets::Model) -> StoreResult<Budget> {
    let corrupt = |what: &str, e: String| StoreError::Corrupt("budget", format!("{what}: {e}"));
    Ok(Budget {
        period: BudgetPeriod::parse(&model.period, "period")
            .map_err(|e| corrupt("period", e.to_string()))?,
        alert_thresholds_percent: serde_json::from_str(&model.alert_thresholds)
            .map_err(|e| corrupt("alert thresholds", e.to_string()))?,
        id: model.id,
        name: model.name,
        limit_credits: model.limit_credits,
        webhook_url: model.webhook_url,
        hard_limit: model.hard_limit,
        customer_id: model.customer_external_id,
        tag: model.tag,
        created_at: from_millis(model.created_at),
        updated_at: from_millis(model.updated_at),
    })
}

fn thresholds_text(budget: &ValidBudget) -> String {
    serde_json::Value::from(budget.alert_thresholds_percent.clone()).to_string()
}

/// Makes sure the period's row exists, so the conditional updates below have a row to test.
async fn ensure_window<C: ConnectionTrait>(
    conn: &C,
    tenant: &str,
    budget_id: &str,
    window_start: i64,
) -> StoreResult<()> {
    budget_windows::Entity::insert(budget_windows::ActiveModel {
        budget_id: Set(budget_id.to_string()),
        window_start: Set(window_start),
        tenant_id: Set(tenant.to_string()),
        spent_credits: Set(0),
        reserved_credits: Set(0),
    })
    .on_conflict(
        OnConflict::columns([
            budget_windows::Column::BudgetId,
            budget_windows::Column::WindowStart,
        ])
        .do_nothing()
        .to_owned(),
    )
    .exec_without_returning(conn)
    .await?;
    Ok(())
}

/// An alert row for `threshold` of a budget's period, not yet sent.
fn new_alert(
    budget_id: &str,
    window_start: i64,
    threshold: u32,
    tenant: &str,
    spent: i64,
) -> budget_alerts::ActiveModel {
    budget_alerts::ActiveModel {
        budget_id: Set(budget_id.to_string()),
        window_start: Set(window_start),
        threshold: Set(i32::try_from(threshold).unwrap_or(i32::MAX)),
        tenant_id: Set(tenant.to_string()),
        spent_credits: Set(spent),
        created_at: Set(to_millis(Timestamp::now())),
        delivered_at: Set(None),
        attempts: Set(0),
        last_error: Set(None),
        leased_until: Set(0),
        retry_at: Set(None),
    }
}

/// Records an alert once per budget, period and threshold; returns whether it is new.
async fn insert_alert<C: ConnectionTrait>(
    conn: &C,
    alert: budget_alerts::ActiveModel,
) -> StoreResult<bool> {
    let inserted = budget_alerts::Entity::insert(alert)
        .on_conflict(
            OnConflict::columns([
                budget_alerts::Column::BudgetId,
                budget_alerts::Column::WindowStart,
                budget_alerts::Column::Threshold,
            ])
            .do_nothing()
            .to_owned(),
        )
        .exec_without_returning(conn)
        .await?;
    Ok(inserted == 1)
}

/// What the budget's scope (customer, tag) spent from `start` to `end` (ms), read from the
/// invocation log.
async fn logged_spend<C: ConnectionTrait>(
    conn: &C,
    tenant: &str,
    budget: &Budget,
    start: i64,
    end: i64,
) -> StoreResult<i64> {
    let mut query = runs::Entity::find()
        .select_only()
        .column_as(
            Expr::expr(Func::coalesce([
                Func::sum(Expr::col(runs::Column::CostCredits)).into(),
                Expr::value(0),
            ]))
            .cast_as(Alias::new("BIGINT")),
            "spent",
        )
        .filter(runs::Column::TenantId.eq(tenant))
        .filter(runs::Column::CreatedAt.gte(start))
        .filter(runs::Column::CreatedAt.lt(end));
    if let Some(customer) = &budget.customer_id {
        query = query.filter(runs::Column::CustomerExternalId.eq(customer.as_str()));
    }
    if let Some(tag) = &budget.tag {
        query = query.filter(
            runs::Column::Id.in_subquery(
                Query::select()
                    .column(run_tags::Column::RunId)
                    .from(run_tags::Entity)
                    .and_where(run_tags::Column::TenantId.eq(tenant))
                    .and_where(run_tags::Column::Tag.eq(tag.as_str()))
                    .to_owned(),
            ),
        );
    }
    let spent: Option<i64> = query.into_tuple().one(conn).await?;
    Ok(spent.unwrap_or(0))
}

/// Brings the budget's current period in line with the budget as it now is: with `reseed`
/// (a new budget, or another period or scope) its spend is what the log says was spent in the
/// period so far (it counted only runs written after the budget existed, so a hard limit could
/// be stepped around by creating a budget) and the period's alerts are dropped; otherwise
/// alerts of thresholds no longer reached are dropped, so that after a raised limit they are
/// sent again when reached. Thresholds reached now and not yet alerted are recorded, for the
/// alert sweep to send.
async fn reconcile_current_period<C: ConnectionTrait>(
    conn: &C,
    tenant: &str,
    budget: &Budget,
    reseed: bool,
) -> StoreResult<()> {
    let (start, end) = budget_window(budget.period, Timestamp::now().0);
    let (start, end) = (start.timestamp_millis(), end.timestamp_millis());
    ensure_window(conn, tenant, &budget.id, start).await?;
    if reseed {
        let spent = logged_spend(conn, tenant, budget, start, end).await?;
        budget_windows::Entity::update_many()
            .col_expr(budget_windows::Column::SpentCredits, Expr::value(spent))
            .filter(budget_windows::Column::BudgetId.eq(budget.id.as_str()))
            .filter(budget_windows::Column::WindowStart.eq(start))
            .exec(conn)
            .await?;
    }
    let spent = budget_windows::Entity::find_by_id((budget.id.clone(), start))
        .one(conn)
        .await?
        .map_or(0, |w| w.spent_credits);
    let reached = reached_thresholds(
        budget.limit_credits,
        spent,
        &budget.alert_thresholds_percent,
    );
    let reached_codes: Vec<i32> = reached
        .iter()
        .map(|t| i32::try_from(*t).unwrap_or(i32::MAX))
        .collect();
    let mut stale = budget_alerts::Entity::delete_many()
        .filter(budget_alerts::Column::BudgetId.eq(budget.id.as_str()))
        .filter(budget_alerts::Column::WindowStart.eq(start));
    // Another period or scope is a period of its own even when it starts at the same instant
    // (a month's first day, as a day): what the old one alerted says nothing of the new one.
    if !reseed {
        stale = stale.filter(budget_alerts::Column::Threshold.is_not_in(reached_codes));
    }
    stale.exec(conn).await?;
    for threshold in reached {
        insert_alert(conn, new_alert(&budget.id, start, threshold, tenant, spent)).await?;
    }
    Ok(())
}

/// `reserved - credits`, never below zero. Built with the query builder, not custom SQL with
/// `$n` placeholders: on SQLite those name the statement's n-th parameter, not the expression's.
fn minus_reserved(credits: i64) -> Expr {
    let reserved = || Expr::col(budget_windows::Column::ReservedCredits);
    Expr::case(reserved().gt(credits), reserved().sub(credits))
        .finally(0)
        .into()
}

impl Store {
    pub async fn create_budget(
        &self,
        tenant: &TenantId,
        budget: &ValidBudget,
        webhook_secret: &str,
    ) -> StoreResult<Budget> {
        let now = to_millis(Timestamp::now());
        let model = budgets::ActiveModel {
            id: Set(new_id()),
            tenant_id: Set(tenant.as_str().to_string()),
            name: Set(budget.name.clone()),
            period: Set(budget.period.as_str().to_string()),
            limit_credits: Set(budget.limit_credits),
            alert_thresholds: Set(thresholds_text(budget)),
            webhook_url: Set(budget.webhook_url.clone()),
            webhook_secret: Set(webhook_secret.to_string()),
            hard_limit: Set(budget.hard_limit),
            customer_external_id: Set(budget.customer_id.clone()),
            tag: Set(budget.tag.clone()),
            created_at: Set(now),
            updated_at: Set(now),
        }
        .insert(self.conn())
        .await
        .map_err(on_unique("budget", &budget.name))?;
        let created = to_budget(model)?;
        reconcile_current_period(self.conn(), tenant.as_str(), &created, true).await?;
        Ok(created)
    }

    pub async fn list_budgets(&self, tenant: &TenantId) -> StoreResult<Vec<Budget>> {
        budgets::Entity::find()
            .filter(budgets::Column::TenantId.eq(tenant.as_str()))
            .order_by_asc(budgets::Column::Name)
            .all(self.conn())
            .await?
            .into_iter()
            .map(to_budget)
            .collect()
    }

    async fn find_budget_row(&self, tenant: &TenantId, id: &str) -> StoreResult<budgets::Model> {
        budgets::Entity::find_by_id(id)
            .filter(budgets::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?
            .ok_or_else(|| StoreError::not_found("budget", id))
    }

    pub async fn get_budget(&self, tenant: &TenantId, id: &str) -> StoreResult<Budget> {
        to_budget(self.find_budget_row(tenant, id).await?)
    }

    /// The webhook address and signing key of a budget, for delivering its alerts.
    pub async fn budget_webhook(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> StoreResult<(Budget, Option<String>, String)> {
        let row = self.find_budget_row(tenant, id).await?;
        let (url, secret) = (row.webhook_url.clone(), row.webhook_secret.clone());
        Ok((to_budget(row)?, url, secret))
    }

    /// Replaces every field of the budget; the spend of its periods is kept.
    pub async fn update_budget(
        &self,
        tenant: &TenantId,
        id: &str,
        budget: &ValidBudget,
    ) -> StoreResult<Budget> {
        let row = self.find_budget_row(tenant, id).await?;
        let before = to_budget(row.clone())?;
        let mut active: budgets::ActiveModel = row.into();
        active.name = Set(budget.name.clone());
        active.period = Set(budget.period.as_str().to_string());
        active.limit_credits = Set(budget.limit_credits);
        active.alert_thresholds = Set(thresholds_text(budget));
        active.webhook_url = Set(budget.webhook_url.clone());
        active.hard_limit = Set(budget.hard_limit);
        active.customer_external_id = Set(budget.customer_id.clone());
        active.tag = Set(budget.tag.clone());
        active.updated_at = Set(to_millis(Timestamp::now()));
        let model = active
            .update(self.conn())
            .await
            .map_err(on_unique("budget", &budget.name))?;
        let updated = to_budget(model)?;
        let rescoped = before.period != updated.period
            || before.customer_id != updated.customer_id
            || before.tag != updated.tag;
        reconcile_current_period(self.conn(), tenant.as_str(), &updated, rescoped).await?;
        Ok(updated)
    }

    pub async fn delete_budget(&self, tenant: &TenantId, id: &str) -> StoreResult<()> {
        let txn = self.begin_write().await?;
        // Children first: SQLite enforces foreign keys only when asked to.
        budget_windows::Entity::delete_many()
            .filter(budget_windows::Column::TenantId.eq(tenant.as_str()))
            .filter(budget_windows::Column::BudgetId.eq(id))
            .exec(&txn)
            .await?;
        budget_alerts::Entity::delete_many()
            .filter(budget_alerts::Column::TenantId.eq(tenant.as_str()))
            .filter(budget_alerts::Column::BudgetId.eq(id))
            .exec(&txn)
            .await?;
        let result = budgets::Entity::delete_many()
            .filter(budgets::Column::TenantId.eq(tenant.as_str()))
            .filter(budgets::Column::Id.eq(id))
            .exec(&txn)
            .await?;
        if result.rows_affected == 0 {
            return Err(StoreError::not_found("budget", id));
        }
        txn.commit().await?;
        Ok(())
    }

    /// Spend and holds of one period of a budget.
    pub async fn budget_window(
        &self,
        tenant: &TenantId,
        budget: &Budget,
        start: Timestamp,
        end: Timestamp,
    ) -> StoreResult<BudgetWindow> {
        let row = budget_windows::Entity::find_by_id((budget.id.clone(), to_millis(start)))
            .filter(budget_windows::Column::TenantId.eq(tenant.as_str()))
            .one(self.conn())
            .await?;
        let (spent, reserved) = row.map_or((0, 0), |r| (r.spent_credits, r.reserved_credits));
        Ok(BudgetWindow {
            start,
            end,
            spent_credits: spent,
            spent_usd: Credits(spent).to_usd(),
            reserved_credits: reserved,
            remaining_credits: Ord::max(
                budget
                    .limit_credits
                    .saturating_sub(spent)
                    .saturating_sub(reserved),
                0,
            ),
        })
    }

    /// Holds `hold.credits` against the budget's period if its spend plus holds is still under
    /// the limit. One conditional update decides, so of many concurrent requests only those
    /// that find room get through, and the period can end above its limit by at most what one
    /// request costs beyond its hold. Returns whether the hold was taken.
    pub async fn hold_budget(
        &self,
        tenant: &TenantId,
        budget: &Budget,
        hold: &BudgetHold,
    ) -> StoreResult<bool> {
        let take = || {
            budget_windows::Entity::update_many()
                .col_expr(
                    budget_windows::Column::ReservedCredits,
                    Expr::col(budget_windows::Column::ReservedCredits).add(hold.credits),
                )
                .filter(budget_windows::Column::TenantId.eq(tenant.as_str()))
                .filter(budget_windows::Column::BudgetId.eq(budget.id.as_str()))
                .filter(budget_windows::Column::WindowStart.eq(hold.window_start_ms))
                // Not custom SQL with `$1`: on SQLite that named the statement's first
                // parameter (the hold), so a second hold was refused once any was taken.
                .filter(
                    Expr::col(budget_windows::Column::SpentCredits)
                        .add(Expr::col(budget_windows::Column::ReservedCredits))
                        .lt(budget.limit_credits),
                )
                .exec(self.conn())
        };
        if take().await?.rows_affected == 1 {
            return Ok(true);
        }
        // No room, or no row yet for the period: make sure the row exists (a concurrent first
        // request may be creating it too) and try once more. Requests with room take one write.
        ensure_window(
            self.conn(),
            tenant.as_str(),
            &budget.id,
            hold.window_start_ms,
        )
        .await?;
        Ok(take().await?.rows_affected == 1)
    }

    /// Gives holds back (a request that never ran, or the hold's share after a failure).
    pub async fn release_budget_holds(
        &self,
        tenant: &TenantId,
        holds: &[BudgetHold],
    ) -> StoreResult<()> {
        for hold in holds {
            release(self.conn(), tenant.as_str(), hold).await?;
        }
        Ok(())
    }

    /// Inside the log writer's transaction: adds each finished run's billed cost to the periods
    /// of the budgets it counts against (once per run), releases the holds the runs carried, and
    /// records the alert thresholds now reached for the first time in their period. `settled`:
    /// runs whose holds were already given back (their stored row was finished before).
    pub(crate) async fn charge_budgets<C: ConnectionTrait>(
        &self,
        conn: &C,
        records: &[RunRecord],
        settled: &foldhash::HashSet<String>,
    ) -> StoreResult<Vec<BudgetAlert>> {
        let finished: Vec<&RunRecord> = records
            .iter()
            .filter(|r| r.status != RunStatus::Pending && r.tenant.is_some())
            .collect();
        if finished.is_empty() {
            return Ok(Vec::new());
        }
        let mut tenants: Vec<&str> = finished
            .iter()
            .filter_map(|r| r.tenant.as_ref().map(TenantId::as_str))
            .collect();
        tenants.sort_unstable();
        tenants.dedup();
        let mut by_tenant: HashMap<String, Vec<Budget>> = HashMap::new();
        for model in budgets::Entity::find()
            .filter(budgets::Column::TenantId.is_in(tenants))
            .all(conn)
            .await?
        {
            let tenant = model.tenant_id.clone();
            by_tenant.entry(tenant).or_default().push(to_budget(model)?);
        }
        // Spend per (budget, period start).
        let mut spend: HashMap<(String, i64), (String, i64)> = HashMap::new();
        for record in &finished {
            let Some(tenant) = record.tenant.as_ref() else {
                continue;
            };
            if !settled.contains(&record.id) {
                for hold in &record.budget_holds {
                    release(conn, tenant.as_str(), hold).await?;
                }
            }
            let Some(budgets) = by_tenant.get(tenant.as_str()) else {
                continue;
            };
            let applicable: Vec<&Budget> = budgets
                .iter()
                .filter(|b| b.applies_to(record.customer_external_id.as_deref(), &record.tags))
                .collect();
            if applicable.is_empty() || record.cost_credits == 0 {
                continue;
            }
            let charged = budget_charges::Entity::insert(budget_charges::ActiveModel {
                run_id: Set(record.id.clone()),
                tenant_id: Set(tenant.as_str().to_string()),
                created_at: Set(to_millis(Timestamp::now())),
            })
            .on_conflict(
                OnConflict::column(budget_charges::Column::RunId)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(conn)
            .await?;
            if charged == 0 {
                continue;
            }
            for budget in applicable {
                let (start, _) = budget_window(budget.period, record.created_at.0);
                let start = start.timestamp_millis();
                let entry = spend
                    .entry((budget.id.clone(), start))
                    .or_insert_with(|| (tenant.as_str().to_string(), 0));
                entry.1 = entry.1.saturating_add(record.cost_credits);
            }
        }
        let mut alerts = Vec::new();
        for ((budget_id, start), (tenant, credits)) in spend {
            ensure_window(conn, &tenant, &budget_id, start).await?;
            budget_windows::Entity::update_many()
                .col_expr(
                    budget_windows::Column::SpentCredits,
                    Expr::col(budget_windows::Column::SpentCredits).add(credits),
                )
                .filter(budget_windows::Column::BudgetId.eq(budget_id.as_str()))
                .filter(budget_windows::Column::WindowStart.eq(start))
                .exec(conn)
                .await?;
            let Some(budget) = by_tenant
                .get(&tenant)
                .and_then(|list| list.iter().find(|b| b.id == budget_id))
            else {
                continue;
            };
            let spent = budget_windows::Entity::find_by_id((budget_id.clone(), start))
                .one(conn)
                .await?
                .map_or(0, |w| w.spent_credits);
            for threshold in reached_thresholds(
                budget.limit_credits,
                spent,
                &budget.alert_thresholds_percent,
            ) {
                let alert = new_alert(&budget_id, start, threshold, &tenant, spent);
                if insert_alert(conn, alert).await? {
                    alerts.push(BudgetAlert {
                        tenant: TenantId::new(tenant.clone()),
                        budget_id: budget_id.clone(),
                        window_start: from_millis(start),
                        threshold_percent: threshold,
                        spent_credits: spent,
                        attempts: 0,
                    });
                }
            }
        }
        Ok(alerts)
    }

    /// Leases alerts nobody has sent: up to `batch` recorded before `recorded_before` whose
    /// delivery was never finished (no attempt recorded, not delivered) and that no sender
    /// holds at `now`, oldest first, each held until `lease_until`. An alert is leased by one
    /// conditional update, so instances sweeping at once never take the same one. Returns the
    /// alerts leased and how many were looked at (call again while that is `batch`).
    pub async fn lease_unsent_alerts(
        &self,
        recorded_before: Timestamp,
        now: Timestamp,
        lease_until: Timestamp,
        batch: u64,
    ) -> StoreResult<(Vec<BudgetAlert>, u64)> {
        let candidates = budget_alerts::Entity::find()
            // A literal, not bound values: the partial index's condition, which the planners
            // can only match against a literal.
            .filter(Expr::cust(UNSENT))
            .filter(budget_alerts::Column::CreatedAt.lt(to_millis(recorded_before)))
            .filter(budget_alerts::Column::LeasedUntil.lt(to_millis(now)))
            .order_by_asc(budget_alerts::Column::CreatedAt)
            .limit(batch)
            .all(self.conn())
            .await?;
        // Still unsent: no sender recorded an outcome since it was read.
        self.lease(candidates, lease_until, |_| Expr::cust(UNSENT))
            .await
    }

    /// Leases alerts whose last delivery round failed and whose next is due at `now`: up to
    /// `batch`, the longest due first, that no sender holds, each held until `lease_until`
    /// (one conditional update each, as [`Store::lease_unsent_alerts`]). Returns the alerts
    /// leased, each with the attempts made so far, and how many were looked at.
    pub async fn lease_due_alert_retries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        batch: u64,
    ) -> StoreResult<(Vec<BudgetAlert>, u64)> {
        let now = to_millis(now);
        let candidates = budget_alerts::Entity::find()
            // `retry_at <= now` implies the partial index's `retry_at IS NOT NULL`.
            .filter(budget_alerts::Column::RetryAt.lte(now))
            .filter(budget_alerts::Column::LeasedUntil.lt(now))
            .order_by_asc(budget_alerts::Column::RetryAt)
            .limit(batch)
            .all(self.conn())
            .await?;
        // Still due: no round was recorded since it was read (each records its attempts).
        self.lease(candidates, lease_until, |alert| {
            budget_alerts::Column::Attempts
                .eq(alert.attempts)
                .and(budget_alerts::Column::RetryAt.is_not_null())
        })
        .await
    }

    /// Holds each of `candidates` until `lease_until` unless a sender leased it since it was
    /// read, or it no longer meets `still` (a delivery was recorded): those are left out.
    async fn lease(
        &self,
        candidates: Vec<budget_alerts::Model>,
        lease_until: Timestamp,
        still: impl Fn(&budget_alerts::Model) -> SimpleExpr,
    ) -> StoreResult<(Vec<BudgetAlert>, u64)> {
        let seen = candidates.len() as u64;
        let mut leased = Vec::with_capacity(candidates.len());
        for alert in candidates {
            let updated = budget_alerts::Entity::update_many()
                .col_expr(
                    budget_alerts::Column::LeasedUntil,
                    Expr::value(to_millis(lease_until)),
                )
                .filter(budget_alerts::Column::BudgetId.eq(alert.budget_id.as_str()))
                .filter(budget_alerts::Column::WindowStart.eq(alert.window_start))
                .filter(budget_alerts::Column::Threshold.eq(alert.threshold))
                .filter(budget_alerts::Column::LeasedUntil.eq(alert.leased_until))
                .filter(still(&alert))
                .exec(self.conn())
                .await?;
            if updated.rows_affected == 1 {
                leased.push(BudgetAlert {
                    tenant: TenantId::new(alert.tenant_id),
                    budget_id: alert.budget_id,
                    window_start: from_millis(alert.window_start),
                    threshold_percent: u32::try_from(alert.threshold).unwrap_or(0),
                    spent_credits: alert.spent_credits,
                    attempts: u32::try_from(alert.attempts).unwrap_or(0),
                });
            }
        }
        Ok((leased, seen))
    }

    /// Records how a delivery round of an alert went: `attempts` made in all (earlier rounds
    /// included), the last error if it failed, and when the next round is due, if one is.
    pub async fn record_alert_delivery(
        &self,
        alert: &BudgetAlert,
        attempts: u32,
        error: Option<&str>,
        retry_at: Option<Timestamp>,
    ) -> StoreResult<()> {
        budget_alerts::Entity::update_many()
            .col_expr(
                budget_alerts::Column::Attempts,
                Expr::value(i32::try_from(attempts).unwrap_or(i32::MAX)),
            )
            .col_expr(
                budget_alerts::Column::DeliveredAt,
                Expr::value(error.is_none().then(|| to_millis(Timestamp::now()))),
            )
            .col_expr(
                budget_alerts::Column::LastError,
                Expr::value(error.map(str::to_string)),
            )
            .col_expr(
                budget_alerts::Column::RetryAt,
                Expr::value(retry_at.filter(|_| error.is_some()).map(to_millis)),
            )
            .filter(budget_alerts::Column::TenantId.eq(alert.tenant.as_str()))
            .filter(budget_alerts::Column::BudgetId.eq(alert.budget_id.as_str()))
            .filter(budget_alerts::Column::WindowStart.eq(to_millis(alert.window_start)))
            .filter(
                budget_alerts::Column::Threshold
                    .eq(i32::try_from(alert.threshold_percent).unwrap_or(i32::MAX)),
            )
            .exec(self.conn())
            .await?;
        Ok(())
    }
}

pub(crate) async fn release<C: ConnectionTrait>(
    conn: &C,
    tenant: &str,
    hold: &BudgetHold,
) -> StoreResult<()> {
    budget_windows::Entity::update_many()
        .col_expr(
            budget_windows::Column::ReservedCredits,
            minus_reserved(hold.credits),
        )
        .filter(budget_windows::Column::TenantId.eq(tenant))
        .filter(budget_windows::Column::BudgetId.eq(hold.budget_id.as_str()))
        .filter(budget_windows::Column::WindowStart.eq(hold.window_start_ms))
        .exec(conn)
        .await?;
    Ok(())
}
