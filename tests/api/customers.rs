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
