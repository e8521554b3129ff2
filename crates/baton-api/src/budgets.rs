//! Budget alerts: the log writer reports thresholds reached (`baton_store::budgets`, where the
//! spend is counted); [`spawn_alert_delivery`] sends each to the budget's webhook, signed,
//! through the outbound guard, with retries. The holds taken before a request are the engine's
//! (`baton_executor::budgets`).

use std::time::Duration;

use baton_domain::Timestamp;
use baton_domain::credits::Credits;
use baton_store::budgets::BudgetAlert;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::mpsc;

use crate::state::AppState;

/// Delivery attempts of one round, and the first wait between them (doubling).
const DELIVERY_ATTEMPTS: u32 = 5;
/// Rounds of an alert in all: the first as it is reached, the rest taken by the sweep
/// `AlertResend::retry_after` after the one before failed, the wait doubling each time (with
/// the default 5 minutes, the last round is ~10.6 hours after the first).
const DELIVERY_ROUNDS: u32 = 8;
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(500);
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub const SIGNATURE_HEADER: &str = "X-Baton-Signature";

/// Delivers alerts as the log writer reports them, each on its own task.
pub fn spawn_alert_delivery(
    state: AppState,
    mut alerts: mpsc::UnboundedReceiver<BudgetAlert>,
    resend: AlertResend,
) {
    tokio::spawn(async move {
        while let Some(alert) = alerts.recv().await {
            tokio::spawn(deliver(state.clone(), alert, resend.retry_after));
        }
    });
}

/// When alerts are sent again (`retention.alert_*`): an alert is recorded in the log writer's
/// transaction and sent by the process that wrote it, so one whose process stopped first
/// would otherwise never be sent; and one whose round of attempts failed (the receiver down)
/// is worth another round once it may be back.
#[derive(Debug, Clone, Copy)]
pub struct AlertResend {
    /// Age past which an alert with no delivery recorded counts as unsent (its own process
    /// sends it within [`longest_delivery`] of recording it).
    pub after: Duration,
    /// Between sweeps after the one at start-up; `None`: only that one.
    pub every: Option<Duration>,
    /// Wait after an alert's first failed round before the next (doubling each round); the
    /// sweep after that time sends it.
    pub retry_after: Duration,
}

/// Alerts leased per query of a sweep.
const RESEND_BATCH: u64 = 100;

/// The longest one delivery can take: every attempt timing out, and the waits between them.
/// A sweep's lease on an alert lasts at least this long, so no sweep takes an alert another
/// is still sending.
pub fn longest_delivery() -> Duration {
    let waits: Duration = (0..DELIVERY_ATTEMPTS - 1)
        .map(|retry| FIRST_RETRY_DELAY * 2u32.pow(retry))
        .sum();
    WEBHOOK_TIMEOUT * DELIVERY_ATTEMPTS + waits
}

/// Sends unsent alerts, and alerts whose next round is due, at start-up, then every
/// `resend.every`, each on its own task (as [`spawn_alert_delivery`] does). At-least-once: the
/// receiver may see an alert twice (its process sent it but stopped before recording so); the
/// body's `id` is the same each time.
pub fn spawn_alert_resend(state: AppState, resend: AlertResend) {
    tokio::spawn(async move {
        loop {
            send_leased(&state, resend, Leasing::Unsent).await;
            send_leased(&state, resend, Leasing::Due).await;
            match resend.every {
                Some(every) => tokio::time::sleep(every).await,
                None => return,
            }
        }
    });
}

/// Which alerts a sweep leases.
#[derive(Debug, Clone, Copy)]
enum Leasing {
    /// Recorded `AlertResend::after` ago or more with no delivery recorded.
    Unsent,
    /// Their last round failed and the next is due.
    Due,
}

impl Leasing {
    fn alerts(self) -> &'static str {
        match self {
            Leasing::Unsent => "budget alerts that no process sent",
            Leasing::Due => "budget alerts due another round",
        }
    }
}

/// Leases batches of `leasing`'s alerts until one comes back short, sending each on its own
/// task.
async fn send_leased(state: &AppState, resend: AlertResend, leasing: Leasing) {
    let (Ok(after), Ok(lease)) = (
        chrono::Duration::from_std(resend.after),
        chrono::Duration::from_std(resend.after.max(longest_delivery())),
    ) else {
        return;
    };
    let store = &state.store;
    loop {
        let now = chrono::Utc::now();
        let until = Timestamp(now + lease);
        let leased = match leasing {
            Leasing::Unsent => {
                let recorded_before = Timestamp(now - after);
                store
                    .lease_unsent_alerts(recorded_before, Timestamp(now), until, RESEND_BATCH)
                    .await
            }
            Leasing::Due => {
                store
                    .lease_due_alert_retries(Timestamp(now), until, RESEND_BATCH)
                    .await
            }
        };
        match leased {
            Ok((alerts, seen)) => {
                if !alerts.is_empty() {
                    tracing::info!(alerts = alerts.len(), "sending {}", leasing.alerts());
                }
                for alert in alerts {
                    tokio::spawn(deliver(state.clone(), alert, resend.retry_after));
                }
                if seen < RESEND_BATCH {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not look for {}", leasing.alerts());
                return;
            }
        }
    }
}

/// When the round after `round` (1-based) of a failed delivery is due, if there is one.
fn next_round_at(round: u32, retry_after: Duration) -> Option<Timestamp> {
    if round >= DELIVERY_ROUNDS {
        return None;
    }
    let wait = chrono::Duration::from_std(retry_after.checked_mul(2u32.pow(round - 1))?).ok()?;
    chrono::Utc::now().checked_add_signed(wait).map(Timestamp)
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

/// One round of attempts to send `alert`; if it fails, the next round is recorded as due
/// `retry_after` (doubled per earlier round) from now, until [`DELIVERY_ROUNDS`].
async fn deliver(state: AppState, alert: BudgetAlert, retry_after: Duration) {
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
        // Nothing to send to: recorded, so no sweep takes the alert up again.
        let error = Some("the budget has no webhook URL");
        record(&state, &alert, alert.attempts, error, None).await;
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
                record(&state, &alert, alert.attempts + attempt, None, None).await;
                break;
            }
            Err(error) => {
                let made = alert.attempts + attempt;
                tracing::warn!(budget = %alert.budget_id, attempt = made, %error, "budget alert not delivered");
                last_error = Some(error);
                if attempt < DELIVERY_ATTEMPTS {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
    if let Some(error) = last_error {
        let round = alert.attempts / DELIVERY_ATTEMPTS + 1;
        let next = next_round_at(round, retry_after);
        if next.is_none() {
            tracing::warn!(budget = %alert.budget_id, rounds = round, "budget alert given up");
        }
        let attempts = alert.attempts + DELIVERY_ATTEMPTS;
        record(&state, &alert, attempts, Some(&error), next).await;
    }
}

async fn record(
    state: &AppState,
    alert: &BudgetAlert,
    attempts: u32,
    error: Option<&str>,
    retry_at: Option<Timestamp>,
) {
    if let Err(e) = state
        .store
        .record_alert_delivery(alert, attempts, error, retry_at)
        .await
    {
        tracing::warn!(error = %e, "could not record a budget alert delivery");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_outlasts_every_attempt_and_wait_of_a_delivery() {
        // Five 10 s attempts and waits of 0.5 + 1 + 2 + 4 s.
        assert_eq!(longest_delivery(), Duration::from_millis(57_500));
    }

    #[test]
    fn failed_rounds_are_retried_further_apart_until_the_last() {
        let five_minutes = Duration::from_secs(300);
        let wait = |round| {
            next_round_at(round, five_minutes).map(|at| (at.0 - chrono::Utc::now()).num_seconds())
        };
        // Seconds of a clock read again: a little under the wait asked for.
        assert!((298..=300).contains(&wait(1).unwrap()), "{:?}", wait(1));
        assert!((598..=600).contains(&wait(2).unwrap()), "{:?}", wait(2));
        let last = 300 * 2i64.pow(DELIVERY_ROUNDS - 2);
        assert!((last - 2..=last).contains(&wait(DELIVERY_ROUNDS - 1).unwrap()));
        assert_eq!(wait(DELIVERY_ROUNDS), None, "given up after the last round");
    }

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
