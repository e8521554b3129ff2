//! Hard-limited budgets on the request path: before the first model call a request holds an
//! upper estimate of one call on every hard-limited budget it counts against (one atomic step in
//! the store: `spent + reserved < limit`), so concurrent requests cannot overspend beyond one
//! request, and a budget with no room refuses it (`BUDGET_EXCEEDED`). The store counts the
//! spend when the run is logged and releases the hold then (see `baton-store`'s budgets).

use std::sync::Arc;

use baton_domain::TenantId;
use baton_domain::Timestamp;
use baton_domain::budget::{Budget, BudgetHold};
use baton_domain::chat::{InferenceRequest, Usage};
use baton_domain::run::RunRecord;

use crate::engine::Engine;
use crate::error::{ExecutorError, ExecutorResult};
use crate::gateway::CallPlan;
use crate::runlog::Pricing;
use crate::storage::FlowStore;

/// Output tokens assumed for a model missing from the catalogue when the request sets no
/// `max_tokens`.
const DEFAULT_OUTPUT_ESTIMATE: u64 = 4096;

/// Holds taken for one request; given back if the request never reaches the log.
pub struct Holds {
    flows: Arc<dyn FlowStore>,
    tenant: TenantId,
    holds: Vec<BudgetHold>,
}

impl Holds {
    /// The log takes the holds over: they are released when the run is written as finished.
    pub fn attach(mut self, record: Option<&mut RunRecord>) {
        if let Some(record) = record {
            record.budget_holds = std::mem::take(&mut self.holds);
        }
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        if self.holds.is_empty() {
            return;
        }
        let (flows, tenant, holds) = (
            self.flows.clone(),
            self.tenant.clone(),
            std::mem::take(&mut self.holds),
        );
        // Drop cannot wait: the release runs on its own task.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = flows.release_budget_holds(&tenant, &holds).await {
                    tracing::warn!(%error, "could not release budget holds");
                }
            });
        }
    }
}

/// An upper estimate of one model call of the request: a token per byte of its text (tokens
/// are rarely shorter), and `max_tokens` of output, else the model's output limit (else 4096),
/// priced as the first model of the chain. Holding at least what a call can cost is what bounds
/// a hard limit's overshoot to one request.
pub fn estimate_credits(pricing: &Pricing, plan: &CallPlan, request: &InferenceRequest) -> i64 {
    let Some(model) = plan.chain.primary() else {
        return 1;
    };
    let bytes: usize = request.messages.iter().map(|m| m.joined_text().len()).sum();
    let output_limit = pricing
        .catalogue
        .get(&model.provider, &model.model)
        .map_or(DEFAULT_OUTPUT_ESTIMATE, |d| d.max_output_tokens);
    let usage = Usage {
        tokens_in: bytes as u64,
        tokens_out: request.max_tokens.map_or(output_limit, u64::from),
        ..Usage::default()
    };
    pricing
        .cost(&model.provider, &model.model, &model.model, &usage)
        .billed
        .0
        .max(1)
}

fn budget_exceeded(budget: &Budget) -> ExecutorError {
    ExecutorError::BudgetExceeded(format!(
        "budget '{}' has reached its limit of {} credits for this {} period",
        budget.name,
        budget.limit_credits,
        budget.period.as_str().to_ascii_lowercase()
    ))
}

impl Engine {
    /// Takes a hold of `estimate` credits on every hard-limited budget a request of `customer`
    /// with `tags` counts against, or refuses the request (the holds already taken go back).
    pub async fn admit(
        &self,
        tenant: &TenantId,
        customer: Option<&str>,
        tags: &[String],
        estimate: i64,
    ) -> ExecutorResult<Holds> {
        let mut taken = Holds {
            flows: self.flows().clone(),
            tenant: tenant.clone(),
            holds: Vec::new(),
        };
        let budgets = self.budgets(tenant).await?;
        let now = Timestamp::now();
        for budget in budgets
            .iter()
            .filter(|b| b.hard_limit && b.applies_to(customer, tags))
        {
            let (start, _) = baton_ledger::budget_window(budget.period, now.0);
            let hold = BudgetHold {
                budget_id: budget.id.clone(),
                window_start_ms: start.timestamp_millis(),
                credits: estimate.max(1),
            };
            if !self.flows().hold_budget(tenant, budget, &hold).await? {
                // `taken` is dropped here: the holds on other budgets go back.
                return Err(budget_exceeded(budget));
            }
            taken.holds.push(hold);
        }
        Ok(taken)
    }
}
