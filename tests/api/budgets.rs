//! Budgets: CRUD, hard limits under concurrency (spend stays within one request of the limit),
//! alerts delivered once per threshold with a valid signature, retried when the receiver fails.

use std::time::Duration;

use baton_testkit::{Reply, WebhookReceiver};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::chat::app_with_mock_and;
use crate::helpers::TestApp;

/// Credits of one mock answer of 1000 tokens in and 500 out on gpt-4o-mini.
async fn credits_per_call(app: &TestApp) -> i64 {
    let descriptors = app
        .get("/api/v1/models/descriptors", &app.default_tenant.api_key)
        .await
        .json();
    let mini = descriptors
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == "openai/gpt-4o-mini")
        .unwrap()
        .clone();
    let micro = 1000 * mini["inputCreditsPerMillion"].as_i64().unwrap()
        + 500 * mini["outputCreditsPerMillion"].as_i64().unwrap();
    (micro + 500_000) / 1_000_000
}

async fn chat(app: &TestApp, headers: &[(&str, &str)]) -> crate::helpers::Response {
    let mut request = app
        .client
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(&app.default_tenant.api_key)
        // 1000 bytes: the mock's 1000 tokens in are not more than the text could be.
        .json(&json!({"model": "openai/gpt-4o-mini", "max_tokens": 500,
                      "messages": [{"role": "user", "content": "x".repeat(1000)}]}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    crate::helpers::send(request).await
}

/// The budget's current period once the log writer has caught up with `expected_runs` runs.
async fn settled(app: &TestApp, id: &str, expected_runs: usize) -> Value {
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    for _ in 0..200 {
        let runs = app.store.list_runs(&tenant).await.unwrap();
        if runs.len() >= expected_runs && runs.iter().all(|r| r.completed_at.is_some()) {
            let budget = app
                .get(
                    &format!("/api/v1/budgets/{id}"),
                    &app.default_tenant.api_key,
                )
                .await
                .json();
            if budget["currentPeriod"]["reservedCredits"] == 0 {
                return budget;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("budget {id} never settled");
}

/// Waits until `receiver` has had `count` deliveries, or `within` has passed (the caller
/// asserts what arrived).
async fn wait_for_deliveries(receiver: &WebhookReceiver, count: usize, within: Duration) {
    let step = Duration::from_millis(50);
    for _ in 0..within.as_millis() / step.as_millis() {
        if receiver.deliveries().len() >= count {
            return;
        }
        tokio::time::sleep(step).await;
    }
}

#[tokio::test]
async fn budgets_are_created_listed_replaced_and_deleted() {
    let (app, _mock) = app_with_mock_and(|_| {}).await;
    let key = app.default_tenant.api_key.clone();
    let created = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Monthly", "period": "month", "limitCredits": 5000000,
                   "webhookUrl": "https://hooks.example.com/baton", "tag": "Team:search"}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let created = created.json();
    assert_eq!(created["period"], "Month");
    assert_eq!(created["alertThresholdsPercent"], json!([50, 80, 100]));
    assert_eq!(created["hardLimit"], false);
    assert!(
        created["webhookSecret"]
            .as_str()
            .unwrap()
            .starts_with("whsec_")
    );
    assert_eq!(created["currentPeriod"]["spentCredits"], 0);
    assert_eq!(created["currentPeriod"]["remainingCredits"], 5000000);
    let id = created["id"].as_str().unwrap().to_string();

    // The secret is shown once.
    let fetched = app.get(&format!("/api/v1/budgets/{id}"), &key).await.json();
    assert!(fetched.get("webhookSecret").is_none());
    assert_eq!(fetched["tag"], "Team:search");

    app.post(
        "/api/v1/budgets",
        &key,
        json!({"name": "Monthly", "period": "Day", "limitCredits": 1}),
    )
    .await
    .error(409, "ALREADY_EXISTS");
    for (body, param) in [
        (
            json!({"name": "x", "period": "Year", "limitCredits": 1}),
            "period",
        ),
        (
            json!({"name": "x", "period": "Day", "limitCredits": 0}),
            "limitCredits",
        ),
        (
            json!({"name": "x", "period": "Day", "limitCredits": 1, "alertThresholdsPercent": [0]}),
            "alertThresholdsPercent",
        ),
        (
            json!({"name": "x", "period": "Day", "limitCredits": 1, "webhookUrl": "not a url"}),
            "webhookUrl",
        ),
    ] {
        let bad = app.post("/api/v1/budgets", &key, body).await;
        bad.error(400, "VALIDATION_ERROR");
        assert_eq!(bad.json()["error"]["param"], param);
    }
    assert_eq!(
        app.get("/api/v1/budgets", &key)
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        1,
        "invalid bodies wrote nothing"
    );

    let replaced = app
        .put(
            &format!("/api/v1/budgets/{id}"),
            &key,
            json!({"name": "Daily", "period": "DAY", "limitCredits": 10, "hardLimit": true}),
        )
        .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text);
    let replaced = replaced.json();
    assert_eq!(replaced["period"], "Day");
    assert_eq!(replaced["hardLimit"], true);
    assert_eq!(replaced["tag"], Value::Null);
    let deleted = app
        .request(
            reqwest::Method::DELETE,
            &format!("/api/v1/budgets/{id}"),
            Some(&key),
            None,
        )
        .await;
    assert_eq!(deleted.status, 204);
    app.get(&format!("/api/v1/budgets/{id}"), &key)
        .await
        .error(404, "NOT_FOUND");
}

#[tokio::test]
async fn concurrent_requests_cannot_overspend_a_hard_limit_by_more_than_one_request() {
    let (app, mock) = app_with_mock_and(|_| {}).await;
    let key = app.default_tenant.api_key.clone();
    let per_call = credits_per_call(&app).await;
    assert!(per_call > 0);
    let budget = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Room for one", "period": "Day", "limitCredits": per_call,
                   "hardLimit": true}),
        )
        .await
        .json();
    let id = budget["id"].as_str().unwrap().to_string();
    for _ in 0..50 {
        mock.push(Reply::text("spent").with_usage(1000, 500));
    }
    let responses = futures::future::join_all((0..50).map(|_| chat(&app, &[]))).await;
    let served = responses.iter().filter(|r| r.status == 200).count();
    let refused: Vec<_> = responses.iter().filter(|r| r.status == 402).collect();
    assert_eq!(
        served + refused.len(),
        50,
        "every request answered 200 or 402"
    );
    assert!(served >= 1, "the room for one request was used");
    assert!(
        !refused.is_empty(),
        "50 requests do not fit in room for one"
    );
    for response in &refused {
        response.error(402, "BUDGET_EXCEEDED");
    }
    let settled = settled(&app, &id, served).await;
    let spent = settled["currentPeriod"]["spentCredits"].as_i64().unwrap();
    assert_eq!(
        spent,
        served as i64 * per_call,
        "spend is what the served requests cost"
    );
    assert!(
        spent <= per_call * 2,
        "spend {spent} overshoots the limit {per_call} by more than one request"
    );
    // Once spent, the next request is refused; deleting the budget lifts the limit.
    chat(&app, &[]).await.error(402, "BUDGET_EXCEEDED");
    app.request(
        reqwest::Method::DELETE,
        &format!("/api/v1/budgets/{id}"),
        Some(&key),
        None,
    )
    .await;
    assert_eq!(chat(&app, &[]).await.status, 200);
}

#[tokio::test]
async fn a_budget_counts_only_its_customer_or_tag() {
    let (app, mock) = app_with_mock_and(|_| {}).await;
    let key = app.default_tenant.api_key.clone();
    let per_call = credits_per_call(&app).await;
    let budget = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Search team", "period": "Week", "limitCredits": per_call,
                   "hardLimit": true, "tag": "Team:search"}),
        )
        .await
        .json();
    let id = budget["id"].as_str().unwrap().to_string();
    for _ in 0..3 {
        mock.push(Reply::text("spent").with_usage(1000, 500));
    }
    assert_eq!(
        chat(&app, &[("x-baton-tags", "Team:ads")]).await.status,
        200
    );
    assert_eq!(
        chat(&app, &[("x-baton-tags", "Team:search")]).await.status,
        200
    );
    let settled = settled(&app, &id, 2).await;
    assert_eq!(
        settled["currentPeriod"]["spentCredits"], per_call,
        "only the tagged request"
    );
    chat(&app, &[("x-baton-tags", "Team:search")])
        .await
        .error(402, "BUDGET_EXCEEDED");
    assert_eq!(
        chat(&app, &[("x-baton-tags", "Team:ads")]).await.status,
        200
    );
}

#[tokio::test]
async fn each_threshold_alerts_once_with_a_valid_signature_and_failed_deliveries_are_retried() {
    // The first delivery fails: the sender retries it.
    let receiver = WebhookReceiver::start(1).await.unwrap();
    let address = receiver.addr();
    let (app, mock) = app_with_mock_and(move |config| config.outbound_allowed.push(address)).await;
    let key = app.default_tenant.api_key.clone();
    let per_call = credits_per_call(&app).await;
    // Four calls reach 100%: 50% after the second, 75% after the third.
    let budget = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Alerts", "period": "Month", "limitCredits": per_call * 4,
                   "alertThresholdsPercent": [50, 75, 100], "webhookUrl": receiver.url()}),
        )
        .await
        .json();
    let secret = budget["webhookSecret"].as_str().unwrap().to_string();
    let id = budget["id"].as_str().unwrap().to_string();
    for n in 1..=6 {
        mock.push(Reply::text("spent").with_usage(1000, 500));
        assert_eq!(
            chat(&app, &[]).await.status,
            200,
            "a soft budget refuses nothing"
        );
        settled(&app, &id, n).await;
    }
    // Three thresholds, one failed attempt: four deliveries, then nothing more.
    wait_for_deliveries(&receiver, 4, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 4, "{deliveries:?}");
    assert_eq!(deliveries[0].status, 500);
    let mut thresholds: Vec<i64> = Vec::new();
    for delivery in deliveries.iter().skip(1) {
        let signature = delivery.header("x-baton-signature").unwrap();
        let (t, v1) = signature
            .strip_prefix("t=")
            .and_then(|rest| rest.split_once(",v1="))
            .unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(&delivery.body);
        mac.verify_slice(&hex::decode(v1).unwrap())
            .expect("the signature verifies with the budget's secret");
        let body: Value = serde_json::from_slice(&delivery.body).unwrap();
        assert_eq!(body["type"], "budget.threshold_reached");
        assert_eq!(body["budgetId"], id.as_str());
        assert_eq!(body["limitCredits"], per_call * 4);
        thresholds.push(body["thresholdPercent"].as_i64().unwrap());
    }
    thresholds.sort_unstable();
    assert_eq!(thresholds, [50, 75, 100]);
}

/// Creates a monthly budget of `limit` credits alerting `receiver` at 50%; returns its id.
async fn half_spent_alerts(app: &TestApp, receiver: &WebhookReceiver, limit: i64) -> String {
    let budget = app
        .post(
            "/api/v1/budgets",
            &app.default_tenant.api_key,
            json!({"name": "Half spent", "period": "Month", "limitCredits": limit,
                   "alertThresholdsPercent": [50], "webhookUrl": receiver.url()}),
        )
        .await
        .json();
    budget["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_alert_its_process_never_sent_is_sent_once_by_the_sweep() {
    let receiver = WebhookReceiver::start(0).await.unwrap();
    let address = receiver.addr();
    let (app, _mock) = app_with_mock_and(move |config| {
        config.outbound_allowed.push(address);
        // Any alert with no delivery recorded counts as unsent; a sweep a second.
        config.retention.alert_resend_after_secs = 0;
        config.retention.alert_sweep_interval_secs = 1;
    })
    .await;
    let id = half_spent_alerts(&app, &receiver, 1000).await;
    // A run whose process wrote its row, and with it the alert, then stopped before sending
    // it: here the row goes straight to the store, so no process sends it.
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    let mut run = baton_domain::run::RunRecord::pending(
        "run-of-a-stopped-process".into(),
        tenant,
        baton_domain::run::RunKind::Chat,
        "openai/gpt-4o-mini".into(),
    );
    run.status = baton_domain::run::RunStatus::Succeeded;
    run.cost_credits = 600;
    run.completed_at = Some(baton_domain::Timestamp::now());
    let recorded = app.store.write_runs(&[run], &[]).await.unwrap();
    assert_eq!(recorded.len(), 1, "the 50% threshold, recorded");

    wait_for_deliveries(&receiver, 1, Duration::from_secs(10)).await;
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 1, "the sweep sent it");
    let body: Value = serde_json::from_slice(&deliveries[0].body).unwrap();
    assert_eq!(body["type"], "budget.threshold_reached");
    assert_eq!(body["budgetId"], id.as_str());
    assert_eq!(body["thresholdPercent"], 50);
    assert_eq!(body["spentCredits"], 600);
    assert!(deliveries[0].header("x-baton-signature").is_some());
    // Recorded as sent: the sweeps after it leave it alone.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(receiver.deliveries().len(), 1, "sent once");
}

#[tokio::test]
async fn an_alert_whose_round_of_attempts_failed_is_sent_in_a_later_round() {
    // The receiver is down for a whole round of five attempts, then back.
    let receiver = WebhookReceiver::start(5).await.unwrap();
    let address = receiver.addr();
    let (app, mock) = app_with_mock_and(move |config| {
        config.outbound_allowed.push(address);
        // The next round is due as soon as one fails; a sweep a second takes it.
        config.retention.alert_retry_after_secs = 0;
        config.retention.alert_sweep_interval_secs = 1;
    })
    .await;
    let per_call = credits_per_call(&app).await;
    let id = half_spent_alerts(&app, &receiver, per_call * 2).await;
    mock.push(Reply::text("spent").with_usage(1000, 500));
    assert_eq!(chat(&app, &[]).await.status, 200);

    // A round's waits are 0.5 + 1 + 2 + 4 s; the sweep takes the next within a second.
    wait_for_deliveries(&receiver, 6, Duration::from_secs(20)).await;
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 6, "{deliveries:?}");
    assert!(deliveries[..5].iter().all(|d| d.status == 500));
    assert_eq!(deliveries[5].status, 200);
    let first: Value = serde_json::from_slice(&deliveries[0].body).unwrap();
    let sent: Value = serde_json::from_slice(&deliveries[5].body).unwrap();
    assert_eq!(sent["budgetId"], id.as_str());
    assert_eq!(
        sent["id"], first["id"],
        "the same alert, for receivers to drop repeats"
    );
    // Delivered: the sweeps after it leave it alone.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(receiver.deliveries().len(), 6, "sent once");
}

#[tokio::test]
async fn a_call_holding_budget_leaves_a_row_whose_hold_the_abandoned_run_sweep_gives_back() {
    let (app, mock) = app_with_mock_and(|_| {}).await;
    let key = app.default_tenant.api_key.clone();
    let per_call = credits_per_call(&app).await;
    let budget = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Capped", "period": "Month", "limitCredits": per_call * 100,
                   "hardLimit": true}),
        )
        .await
        .json();
    let id = budget["id"].as_str().unwrap().to_string();
    mock.push(Reply::Delayed(
        Duration::from_secs(2),
        Box::new(Reply::text("slow").with_usage(1000, 500)),
    ));
    let reserved = || async {
        app.get(&format!("/api/v1/budgets/{id}"), &key).await.json()["currentPeriod"]
            ["reservedCredits"]
            .as_i64()
            .unwrap()
    };
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    // What a process that stops mid-call leaves: its run's row, `Pending`, with the hold.
    let stopped_mid_call = async {
        let mut pending = false;
        // Up to 5 s (1 s once ran out on PostgreSQL with a build sharing the two CPUs).
        for _ in 0..250 {
            let runs = app.store.list_runs(&tenant).await.unwrap();
            pending = runs
                .iter()
                .any(|r| r.status == baton_domain::run::RunStatus::Pending);
            if pending {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(pending, "the call's row is written while it runs");
        assert!(reserved().await > 0, "the call holds credits");
        // The sweep of any instance, once the run is past the longest a run can live.
        let finished = app
            .store
            .finish_abandoned_runs(Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(finished, 1, "the call's row was there to finish");
        assert_eq!(reserved().await, 0, "the hold given back");
    };
    let (response, ()) = tokio::join!(chat(&app, &[]), stopped_mid_call);
    // Here the process lived on: its final row replaces the swept one, is charged once and
    // gives nothing back twice.
    assert_eq!(response.status, 200, "{}", response.text);
    for _ in 0..200 {
        let runs = app.store.list_runs(&tenant).await.unwrap();
        if runs[0].status == baton_domain::run::RunStatus::Succeeded {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let period = &app.get(&format!("/api/v1/budgets/{id}"), &key).await.json()["currentPeriod"];
    assert_eq!(period["spentCredits"], per_call);
    assert_eq!(period["reservedCredits"], 0);
}

/// Waits until the log holds `runs` finished runs of the default tenant.
async fn logged(app: &TestApp, runs: usize) {
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    for _ in 0..200 {
        let listed = app.store.list_runs(&tenant).await.unwrap();
        if listed.len() >= runs && listed.iter().all(|r| r.completed_at.is_some()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{runs} runs were never logged");
}

#[tokio::test]
async fn a_budget_counts_its_period_from_the_log_and_alerts_again_after_its_limit_is_raised() {
    let receiver = WebhookReceiver::start(0).await.unwrap();
    let address = receiver.addr();
    let (app, mock) = app_with_mock_and(move |config| {
        config.outbound_allowed.push(address);
        config.retention.alert_resend_after_secs = 0;
        config.retention.alert_sweep_interval_secs = 1;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    let per_call = credits_per_call(&app).await;
    let tagged = [("X-Baton-Tags", "Proj:h")];
    // Spent before the budget exists: three tagged calls, one untagged.
    for headers in [&tagged[..], &tagged[..], &tagged[..], &[]] {
        mock.push(Reply::text("spent").with_usage(1000, 500));
        assert_eq!(chat(&app, headers).await.status, 200);
    }
    logged(&app, 4).await;

    let budget = app
        .post(
            "/api/v1/budgets",
            &key,
            json!({"name": "Project", "period": "Month", "limitCredits": per_call * 3,
                   "tag": "Proj:h", "hardLimit": true, "alertThresholdsPercent": [100],
                   "webhookUrl": receiver.url()}),
        )
        .await
        .json();
    let id = budget["id"].as_str().unwrap().to_string();
    assert_eq!(
        budget["currentPeriod"]["spentCredits"],
        per_call * 3,
        "the period's tagged spend so far: {budget}"
    );
    assert_eq!(
        chat(&app, &tagged).await.status,
        402,
        "the limit is reached"
    );
    // The threshold it was created past is alerted (by the sweep).
    wait_for_deliveries(&receiver, 1, Duration::from_secs(10)).await;
    assert_eq!(receiver.deliveries().len(), 1);

    // A raised limit: room again, and reaching it alerts again.
    let raised = json!({"name": "Project", "period": "Month", "limitCredits": per_call * 5,
                        "tag": "Proj:h", "hardLimit": true, "alertThresholdsPercent": [100],
                        "webhookUrl": receiver.url()});
    let updated = app
        .put(&format!("/api/v1/budgets/{id}"), &key, raised.clone())
        .await
        .json();
    assert_eq!(updated["currentPeriod"]["spentCredits"], per_call * 3);
    for n in 5..=6 {
        mock.push(Reply::text("spent").with_usage(1000, 500));
        assert_eq!(chat(&app, &tagged).await.status, 200);
        settled(&app, &id, n).await;
    }
    wait_for_deliveries(&receiver, 2, Duration::from_secs(10)).await;
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    let second: Value = serde_json::from_slice(&deliveries[1].body).unwrap();
    assert_eq!(second["limitCredits"], per_call * 5);
    assert_eq!(second["thresholdPercent"], 100);

    // Another period counts that period's spend from the log (all of it is today's).
    let mut daily = raised;
    daily["period"] = json!("Day");
    let daily = app
        .put(&format!("/api/v1/budgets/{id}"), &key, daily)
        .await
        .json();
    assert_eq!(daily["currentPeriod"]["spentCredits"], per_call * 5);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        receiver.deliveries().len(),
        3,
        "the daily period's 100% is a threshold of its own"
    );
}
