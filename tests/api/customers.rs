use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn crud_deactivate_and_partial_updates() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();

    let created = app
        .post("/api/v1/customers", &key, json!({"externalId": "cus_1", "name": "Ada", "email": "ada@example.com", "metadata": {"plan": "pro"}}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let created = created.json();
    assert_eq!(created["externalId"], "cus_1");
    assert_eq!(created["isActive"], true);
    assert_eq!(created["metadata"], json!({"plan": "pro"}));

    app.post("/api/v1/customers", &key, json!({"externalId": "cus_1"}))
        .await
        .error(409, "ALREADY_EXISTS");

    // Only non-null fields change.
    let updated = app
        .put(
            "/api/v1/customers/cus_1",
            &key,
            json!({"name": "Ada L.", "email": null}),
        )
        .await;
    assert_eq!(updated.status, 200, "{}", updated.text);
    let updated = updated.json();
    assert_eq!(updated["name"], "Ada L.");
    assert_eq!(updated["email"], "ada@example.com");
    assert_eq!(updated["metadata"], json!({"plan": "pro"}));
    assert_eq!(updated["createdAt"], created["createdAt"]);

    let deactivated = app
        .post("/api/v1/customers/cus_1/deactivate", &key, json!({}))
        .await;
    assert_eq!(deactivated.status, 200, "{}", deactivated.text);
    assert_eq!(deactivated.json()["isActive"], false);
    assert_eq!(
        app.get("/api/v1/customers/cus_1", &key).await.json()["isActive"],
        false
    );

    // External ids with URL-significant characters round-trip through the path.
    let odd = app
        .post(
            "/api/v1/customers",
            &key,
            json!({"externalId": "org/42 team"}),
        )
        .await;
    assert_eq!(odd.status, 201, "{}", odd.text);
    let fetched = app.get("/api/v1/customers/org%2F42%20team", &key).await;
    assert_eq!(fetched.status, 200, "{}", fetched.text);
    assert_eq!(fetched.json()["externalId"], "org/42 team");

    assert_eq!(
        app.delete("/api/v1/customers/cus_1", &key).await.status,
        204
    );
    app.get("/api/v1/customers/cus_1", &key)
        .await
        .error(404, "NOT_FOUND");
    app.delete("/api/v1/customers/cus_1", &key)
        .await
        .error(404, "NOT_FOUND");
    app.put("/api/v1/customers/cus_1", &key, json!({"name": "x"}))
        .await
        .error(404, "NOT_FOUND");
}

#[tokio::test]
async fn list_pages_in_creation_order() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    for i in 0..5 {
        assert_eq!(
            app.post(
                "/api/v1/customers",
                &key,
                json!({"externalId": format!("c{i}")})
            )
            .await
            .status,
            201
        );
    }
    let ids = |response: crate::helpers::Response| -> Vec<String> {
        response
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["externalId"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        ids(app.get("/api/v1/customers", &key).await),
        ["c0", "c1", "c2", "c3", "c4"]
    );
    assert_eq!(
        ids(app.get("/api/v1/customers?limit=2&offset=2", &key).await),
        ["c2", "c3"]
    );
    let err = app
        .get("/api/v1/customers?limit=0", &key)
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(err["param"], "limit");
    let err = app
        .get("/api/v1/customers?limit=many", &key)
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(err["param"], "limit");
    let err = app
        .get("/api/v1/customers?colour=red", &key)
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(err["param"], "colour");
}

#[tokio::test]
async fn customers_auto_created_on_first_use_are_shared_not_duplicated() {
    let app = spawn_app().await;
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    let store = app.store.clone();
    let first_uses = (0..8).map(|_| {
        let (store, tenant) = (store.clone(), tenant.clone());
        async move { store.ensure_customer(&tenant, "auto-1").await.unwrap().id }
    });
    let ids = futures::future::join_all(first_uses).await;
    assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
    let listed = app
        .get("/api/v1/customers", &app.default_tenant.api_key)
        .await
        .json();
    assert_eq!(listed.as_array().unwrap().len(), 1);
}

/// Sends one chat request attributed to `customer` and returns its logged run.
async fn chat_as(
    app: &crate::helpers::TestApp,
    mock: &baton_testkit::MockProvider,
    customer: &str,
    tokens: (u64, u64),
) -> baton_domain::run::RunRecord {
    mock.push(baton_testkit::Reply::text("ok").with_usage(tokens.0, tokens.1));
    let response = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&app.default_tenant.api_key)
            .header("x-baton-customer-id", customer)
            .json(&json!({"model": "openai/gpt-4o-mini",
                          "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"].to_str().unwrap();
    crate::chat::wait_for_run(app, id).await
}

#[tokio::test]
async fn usage_per_customer_and_summary_over_a_period() {
    let (app, mock) = crate::chat::app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());

    let a1 = chat_as(&app, &mock, "cus_a", (1000, 500)).await;
    let a2 = chat_as(&app, &mock, "cus_a", (2000, 100)).await;
    let b1 = chat_as(&app, &mock, "cus_b", (300, 30)).await;
    let c1 = chat_as(&app, &mock, "cus_c", (5000, 5000)).await;
    // A sub-agent of a1 (same customer, not a request of its own) and an old request.
    let record = |id: &str, created: baton_domain::Timestamp, credits: i64| {
        let mut run = baton_store::runs::new_record(
            id.to_string(),
            tenant.clone(),
            baton_domain::run::RunKind::Flow,
            "openai/gpt-4o-mini".into(),
        );
        run.customer_external_id = Some("cus_a".into());
        run.served_model = Some("openai/gpt-4o-mini".into());
        run.status = baton_domain::run::RunStatus::Succeeded;
        run.cost_credits = credits;
        run.raw_cost_credits = credits;
        run.usage.tokens_in = 7;
        run.usage.tokens_out = 3;
        run.created_at = created;
        run
    };
    let mut child = record(&uuid::Uuid::now_v7().to_string(), a1.created_at, 100);
    // A sub-agent whose tool loop made three model calls.
    child.inference_count = 3;
    child.parent_id = Some(a1.id.clone());
    child.root_id = a1.id.clone();
    child.depth = 1;
    let long_ago = baton_domain::Timestamp(chrono::Utc::now() - chrono::Duration::days(40));
    let old = record(&uuid::Uuid::now_v7().to_string(), long_ago, 1_000_000);
    // A request still running: not counted until it finishes, as in the statistics.
    let mut running = record(&uuid::Uuid::now_v7().to_string(), a1.created_at, 0);
    running.status = baton_domain::run::RunStatus::Pending;
    running.served_model = None;
    app.store
        .write_runs(&[child, old, running], &[])
        .await
        .unwrap();
    app.post("/api/v1/customers/cus_c/deactivate", &key, json!({}))
        .await;

    let a_credits = a1.cost_credits + a2.cost_credits + 100;
    assert!(a1.cost_credits > 0 && b1.cost_credits > 0);
    let usage = app.get("/api/v1/customers/cus_a/usage", &key).await;
    assert_eq!(usage.status, 200, "{}", usage.text);
    let usage = usage.json();
    assert_eq!(usage["externalId"], "cus_a");
    assert_eq!(usage["creditsUsed"], a_credits, "the last 30 days only");
    assert_eq!(usage["costUsd"], a_credits as f64 / 1e6);
    assert_eq!(
        usage["requestCount"], 2,
        "the sub-agent is part of its request"
    );
    assert_eq!(usage["inferenceCount"], 1 + 1 + 3, "model calls, not runs");
    assert_eq!(a1.inference_count, 1, "a chat call is one");
    assert_eq!(usage["tokensIn"], 1000 + 2000 + 7);
    assert_eq!(usage["tokensOut"], 500 + 100 + 3);

    // An explicit period reaching back includes the old request.
    let from = (chrono::Utc::now() - chrono::Duration::days(50))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let wide = app
        .get(&format!("/api/v1/customers/cus_a/usage?from={from}"), &key)
        .await
        .json();
    assert_eq!(wide["creditsUsed"], a_credits + 1_000_000);
    assert_eq!(wide["requestCount"], 3);
    // A bare date is read as that day's UTC midnight, as on /llm-logs.
    let day = (chrono::Utc::now() - chrono::Duration::days(50)).date_naive();
    let by_day = app
        .get(&format!("/api/v1/customers/cus_a/usage?from={day}"), &key)
        .await;
    assert_eq!(by_day.status, 200, "{}", by_day.text);
    assert_eq!(by_day.json()["creditsUsed"], a_credits + 1_000_000);

    // The summary: active customers, most credits first; the deactivated one left out.
    let summary = app.get("/api/v1/customers/usage", &key).await;
    assert_eq!(summary.status, 200, "{}", summary.text);
    let summary = summary.json();
    let ids: Vec<&str> = summary["customers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["externalId"].as_str().unwrap())
        .collect();
    let mut expected = [("cus_a", a_credits), ("cus_b", b1.cost_credits)];
    expected.sort_by_key(|(_, credits)| -credits);
    assert_eq!(ids, expected.iter().map(|(id, _)| *id).collect::<Vec<_>>());
    assert_eq!(summary["totalCreditsUsed"], a_credits + b1.cost_credits);
    assert_eq!(summary["totalRequests"], 3);

    // A deactivated customer's own report still answers, marked as such.
    let c = app.get("/api/v1/customers/cus_c/usage", &key).await.json();
    assert_eq!(c["isActive"], false);
    assert_eq!(c["creditsUsed"], c1.cost_credits);

    app.get("/api/v1/customers/nobody/usage", &key)
        .await
        .error(404, "NOT_FOUND");
    let to = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    app.get(&format!("/api/v1/customers/usage?from={to}&to={to}"), &key)
        .await
        .error(400, "VALIDATION_ERROR");
    let bad = app
        .get("/api/v1/customers/usage?from=yesterday", &key)
        .await;
    bad.error(400, "VALIDATION_ERROR");
    assert_eq!(bad.json()["error"]["param"], "from");
}
