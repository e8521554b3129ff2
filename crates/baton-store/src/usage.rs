//! Usage per end customer (SPEC.md "Customers"): sums over the invocation log in a period.

use std::collections::HashMap;

use baton_domain::customer::{Customer, CustomerUsage, CustomersUsage, UsageTotals};
use baton_domain::run::RunStatus;
use baton_domain::{TenantId, Timestamp};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, FromQueryResult, QueryFilter, QuerySelect};

use crate::entity::{customers, runs};
use crate::time::to_millis;
use crate::{Store, StoreResult};

#[derive(Debug, FromQueryResult)]
struct UsageRow {
    customer_external_id: Option<String>,
    credits: i64,
    raw_credits: i64,
    requests: i64,
    inferences: i64,
    tokens_in: i64,
    tokens_out: i64,
}

impl From<&UsageRow> for UsageTotals {
    fn from(row: &UsageRow) -> Self {
        UsageTotals {
            credits: row.credits,
            raw_credits: row.raw_credits,
            requests: row.requests,
            inferences: row.inferences,
            tokens_in: row.tokens_in,
            tokens_out: row.tokens_out,
        }
    }
}

/// `SUM` is NUMERIC on PostgreSQL; the cast keeps both backends returning BIGINT.
fn sum(expression: &str) -> Expr {
    Expr::cust(format!("CAST(COALESCE(SUM({expression}), 0) AS BIGINT)"))
}

/// The model calls of a run, as SQL over `runs`.
pub(crate) const INFERENCES: &str = "CASE WHEN inference_count > 0 THEN inference_count WHEN served_model IS NOT NULL THEN 1 ELSE 0 END";

impl Store {
    /// Sums per customer external id of the tenant's runs created in `[from, to)`, for one
    /// customer or all of them.
    async fn usage_rows(
        &self,
        tenant: &TenantId,
        external_id: Option<&str>,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<Vec<UsageRow>> {
        let mut query = runs::Entity::find()
            .select_only()
            .column(runs::Column::CustomerExternalId)
            .column_as(sum("cost_credits"), "credits")
            .column_as(sum("raw_cost_credits"), "raw_credits")
            .column_as(
                sum("CASE WHEN parent_id IS NULL THEN 1 ELSE 0 END"),
                "requests",
            )
            // Model calls: a run with tools counts each; rows from before the count was kept
            // count one when a model served them (a failed request before any call, none).
            .column_as(sum(INFERENCES), "inferences")
            .column_as(sum("tokens_in"), "tokens_in")
            .column_as(sum("tokens_out"), "tokens_out")
            .filter(runs::Column::TenantId.eq(tenant.as_str()))
            .filter(runs::Column::CreatedAt.gte(to_millis(from)))
            .filter(runs::Column::CreatedAt.lt(to_millis(to)))
            .filter(runs::Column::CustomerExternalId.is_not_null())
            // Finished runs only, as in the statistics: a run still going has no spend yet.
            .filter(runs::Column::Status.ne(RunStatus::Pending.as_str()))
            .group_by(runs::Column::CustomerExternalId);
        if let Some(external_id) = external_id {
            query = query.filter(runs::Column::CustomerExternalId.eq(external_id));
        }
        Ok(query.into_model::<UsageRow>().all(self.conn()).await?)
    }

    /// One customer's usage in `[from, to)` (404 for an unknown customer). A deactivated
    /// customer still answers here, marked `isActive: false`; only the summary leaves it out.
    pub async fn customer_usage(
        &self,
        tenant: &TenantId,
        external_id: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<CustomerUsage> {
        let customer = self.get_customer(tenant, external_id).await?;
        let rows = self.usage_rows(tenant, Some(external_id), from, to).await?;
        let totals = rows.first().map(UsageTotals::from).unwrap_or_default();
        Ok(CustomerUsage::new(&customer, from, to, totals))
    }

    /// Usage of every active customer with runs in `[from, to)`.
    pub async fn customers_usage(
        &self,
        tenant: &TenantId,
        from: Timestamp,
        to: Timestamp,
    ) -> StoreResult<CustomersUsage> {
        let rows = self.usage_rows(tenant, None, from, to).await?;
        let ids: Vec<&str> = rows
            .iter()
            .filter_map(|r| r.customer_external_id.as_deref())
            .collect();
        let mut active: HashMap<String, Customer> = HashMap::with_capacity(ids.len());
        // Bounded IN lists: a tenant may have many customers in a period.
        for chunk in ids.chunks(500) {
            let found = customers::Entity::find()
                .filter(customers::Column::TenantId.eq(tenant.as_str()))
                .filter(customers::Column::IsActive.eq(true))
                .filter(customers::Column::ExternalId.is_in(chunk.iter().copied()))
                .all(self.conn())
                .await?;
            for model in found {
                let customer = crate::customers::to_customer(model)?;
                active.insert(customer.external_id.clone(), customer);
            }
        }
        let usage = rows
            .iter()
            .filter_map(|row| {
                let customer = active.get(row.customer_external_id.as_deref()?)?;
                Some(CustomerUsage::new(
                    customer,
                    from,
                    to,
                    UsageTotals::from(row),
                ))
            })
            .collect();
        Ok(CustomersUsage::new(from, to, usage))
    }
}
