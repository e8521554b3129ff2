use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn create_list_and_refuse_duplicates() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    assert_eq!(
        app.get("/api/v1/environments", &key).await.json(),
        json!([])
    );

    for name in ["staging", "production"] {
        let created = app
            .post("/api/v1/environments", &key, json!({"name": name}))
            .await;
        assert_eq!(created.status, 201, "{}", created.text);
        let body = created.json();
        assert_eq!(body["name"], name);
        assert!(body["id"].is_string());
        assert!(body["createdAt"].as_str().unwrap().ends_with('Z'));
    }
    app.post("/api/v1/environments", &key, json!({"name": " staging "}))
        .await
        .error(409, "ALREADY_EXISTS");

    let names: Vec<String> = app
        .get("/api/v1/environments", &key)
        .await
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["staging", "production"]);

    let err = app
        .post("/api/v1/environments", &key, json!({"name": ""}))
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(err["param"], "name");
    let err = app
        .post("/api/v1/environments", &key, json!({}))
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(err["param"], "name");
    assert_eq!(
        app.get("/api/v1/environments", &key)
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn environments_are_per_tenant() {
    let app = spawn_app().await;
    let other = app.create_tenant("other").await;
    let key = app.default_tenant.api_key.clone();
    assert_eq!(
        app.post("/api/v1/environments", &key, json!({"name": "production"}))
            .await
            .status,
        201
    );
    // The same name is free in another tenant.
    assert_eq!(
        app.post(
            "/api/v1/environments",
            &other.api_key,
            json!({"name": "production"})
        )
        .await
        .status,
        201
    );
}
