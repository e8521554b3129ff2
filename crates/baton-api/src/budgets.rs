//! Budgets on the request path: a hard-limited budget holds an estimate of the request's cost
//! before the first model call (one conditional update in the store, so concurrent requests
//! cannot overspend beyond one request), and refuses with 402 `BUDGET_EXCEEDED` once its period
//! is spent. The spend itself is counted when the run is logged (`baton_store::budgets`), which
//! also releases the hold and reports thresholds reached; [`spawn_alert_delivery`] sends those
//! to the budget's webhook, signed, through the outbound guard, with retries.

use std::time::Duration;

use baton_domain::budget::{Budget, BudgetHold};
use baton_domain::chat::{InferenceRequest, Usage};
use baton_domain::credits::Credits;
use baton_domain::run::RunRecord;
use baton_domain::{TenantId, Timestamp};
use baton_store::Store;
use baton_store::budgets::BudgetAlert;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::error::{ApiError, ApiResult};
use crate::gateway::CallPlan;
use crate::runlog::Pricing;
use crate::state::AppState;

/// Output tokens assumed for a model missing from the catalogue when the request sets no
/// `max_tokens`.
const DEFAULT_OUTPUT_ESTIMATE: u64 = 4096;
/// Delivery attempts of one alert, and the first wait between them (doubling).
const DELIVERY_ATTEMPTS: u32 = 5;
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub const SIGNATURE_HEADER: &str = "X-Baton-Signature";

/// Holds taken for one request; given back if the request never reaches the log.
pub struct Holds {
    store: Store,
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
        let (store, tenant, holds) = (
            self.store.clone(),
            self.tenant.clone(),
            std::mem::take(&mut self.holds),
        );
        tokio::spawn(async move {
            if let Err(error) = store.release_budget_holds(&tenant, &holds).await {
                tracing::warn!(%error, "could not release budget holds");
            }
        });
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

/// Takes a hold on every hard-limited budget the request counts against, or refuses it.
pub async fn admit(
    state: &AppState,
    tenant: &TenantId,
    customer: Option<&str>,
    tags: &[String],
    estimate: i64,
) -> ApiResult<Holds> {
    let mut taken = Holds {
        store: state.store.clone(),
        tenant: tenant.clone(),
        holds: Vec::new(),
    };
    let budgets = state.tenant_budgets(tenant).await?;
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
        if !state.store.hold_budget(tenant, budget, &hold).await? {
            // `taken` is dropped here: the holds on other budgets go back.
            return Err(budget_exceeded(budget));
        }
        taken.holds.push(hold);
    }
    Ok(taken)
}

fn budget_exceeded(budget: &Budget) -> ApiError {
    ApiError::Status {
        status: axum::http::StatusCode::PAYMENT_REQUIRED,
        code: "BUDGET_EXCEEDED",
        message: format!(
            "budget '{}' has reached its limit of {} credits for this {} period",
            budget.name,
            budget.limit_credits,
            budget.period.as_str().to_ascii_lowercase()
        ),
    }
}

/// Delivers alerts as the log writer reports them, each on its own task.
pub fn spawn_alert_delivery(state: AppState, mut alerts: mpsc::UnboundedReceiver<BudgetAlert>) {
    tokio::spawn(async move {
        while let Some(alert) = alerts.recv().await {
            tokio::spawn(deliver(state.clone(), alert));
        }
    });
}

/// `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` under `secret`.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

async fn deliver(state: AppState, alert: BudgetAlert) {
    let (budget, url, secret) = match state
        .store
        .budget_webhook(&alert.tenant, &alert.budget_id)
        .await
    {
        Ok(found) => found,
        // Deleted since: nobody to tell.
        Err(_) => return,
    };
    let Some(url) = url.and_then(|u| url::Url::parse(&u).ok()) else {
        return;
    };
    let (start, end) = baton_ledger::budget_window(budget.period, alert.window_start.0);
    let body = json!({
        "type": "budget.threshold_reached",
        "id": format!("{}:{}:{}", budget.id, start.timestamp_millis(), alert.threshold_percent),
        "budgetId": budget.id, "budgetName": budget.name, "period": budget.period,
        "periodStart": Timestamp(start), "periodEnd": Timestamp(end),
        "thresholdPercent": alert.threshold_percent,
        "limitCredits": budget.limit_credits, "spentCredits": alert.spent_credits,
        "spentUsd": Credits(alert.spent_credits).to_usd(),
        "hardLimit": budget.hard_limit, "customerId": budget.customer_id, "tag": budget.tag,
        "sentAt": Timestamp::now(),
    })
    .to_string();
    let mut delay = FIRST_RETRY_DELAY;
    let mut last_error = None;
    for attempt in 1..=DELIVERY_ATTEMPTS {
        let timestamp = chrono::Utc::now().timestamp();
        let sent = match state.outbound.request(http::Method::POST, &url) {
            Ok(request) => {
                let request = request
                    .timeout(WEBHOOK_TIMEOUT)
                    .header("content-type", "application/json")
                    .header(SIGNATURE_HEADER, sign(&secret, timestamp, body.as_bytes()))
                    .body(body.clone());
                match state.outbound.send(request).await {
                    Ok(response) if response.status().is_success() => Ok(()),
                    Ok(response) => Err(format!("the webhook answered {}", response.status())),
                    Err(error) => Err(error.to_string()),
                }
            }
            Err(error) => Err(error.to_string()),
        };
        match sent {
            Ok(()) => {
                last_error = None;
                record(&state, &alert, attempt, None).await;
                break;
            }
            Err(error) => {
                tracing::warn!(budget = %alert.budget_id, attempt, %error, "budget alert not delivered");
                last_error = Some(error);
                if attempt < DELIVERY_ATTEMPTS {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
    if let Some(error) = last_error {
        record(&state, &alert, DELIVERY_ATTEMPTS, Some(&error)).await;
    }
}

async fn record(state: &AppState, alert: &BudgetAlert, attempts: u32, error: Option<&str>) {
    if let Err(e) = state
        .store
        .record_alert_delivery(alert, attempts, error)
        .await
    {
        tracing::warn!(error = %e, "could not record a budget alert delivery");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_over_timestamp_and_body() {
        let signature = sign("whsec_test", 1_700_000_000, b"{\"a\":1}");
        // Python: hmac.new(b"whsec_test", b'1700000000.{"a":1}', hashlib.sha256).hexdigest()
        assert_eq!(
            signature,
            "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"
        );
        assert_ne!(signature, sign("whsec_other", 1_700_000_000, b"{\"a\":1}"));
        assert_ne!(signature, sign("whsec_test", 1_700_000_001, b"{\"a\":1}"));
    }
}
