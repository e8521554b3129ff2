//! Bad input gets 400 (or 413) in the error shape, names the field, and writes nothing.

use serde_json::json;

use crate::helpers::{send, spawn_app, spawn_app_with};

#[tokio::test]
async fn malformed_and_mistyped_bodies_name_the_field_and_write_nothing() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let url = app.url("/api/v1/customers");

    let raw = |body: &'static str| {
        app.client
            .post(&url)
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body)
    };
    send(raw("{\"externalId\": "))
        .await
        .error(400, "INVALID_JSON");
    send(raw("{\"externalId\": \"x\","))
        .await
        .error(400, "INVALID_JSON");
    send(raw("")).await.error(400, "INVALID_JSON");
    send(raw("{\"externalId\": \"x\"} {}"))
        .await
        .error(400, "INVALID_JSON");
    let missing_type = send(
        app.client
            .post(&url)
            .bearer_auth(&key)
            .body("{\"externalId\": \"x\"}"),
    )
    .await;
    missing_type.error(400, "INVALID_CONTENT_TYPE");

    for (body, param) in [
        (json!({}), "externalId"),
        (json!({"externalId": 42}), "externalId"),
        (json!({"externalId": "x", "isActive": "yes"}), "isActive"),
        (json!({"externalId": "x", "metadata": "text"}), "metadata"),
        (json!({"externalId": "x", "email": "not-an-email"}), "email"),
        (json!({"externalId": "x", "surprise": 1}), "surprise"),
        (json!({"externalId": ""}), "externalId"),
    ] {
        let err = app
            .post("/api/v1/customers", &key, body.clone())
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(err["param"], param, "{body}");
    }
    assert_eq!(app.get("/api/v1/customers", &key).await.json(), json!([]));
}

#[tokio::test]
async fn oversized_bodies_get_413_and_write_nothing() {
    let app = spawn_app_with(|config| config.server.max_body_bytes = 16 * 1024).await;
    let key = app.default_tenant.api_key.clone();
    let big = "x".repeat(32 * 1024);
    let response = app
        .post(
            "/api/v1/customers",
            &key,
            json!({"externalId": "big", "name": big}),
        )
        .await;
    response.error(413, "PAYLOAD_TOO_LARGE");
    assert_eq!(response.headers["connection"], "close");
    // Without Content-Length (chunked), the limit still holds. The body goes on well past the
    // limit: the server reads and drops the rest before answering, so the client, still
    // writing, gets the 413 rather than a reset connection.
    let stream = futures::stream::iter((0..512).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1024])));
    let chunked = send(
        app.client
            .post(app.url("/api/v1/customers"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(stream)),
    )
    .await;
    chunked.error(413, "PAYLOAD_TOO_LARGE");
    // The unread rest of the body ends the connection; the client is told, so its next request
    // goes on a new one (on the one being closed it failed as an incomplete message).
    assert_eq!(chunked.headers["connection"], "close");
    assert_eq!(app.get("/api/v1/customers", &key).await.json(), json!([]));
}

#[tokio::test]
async fn operations_without_a_body_refuse_one_and_write_nothing() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let flow = app
        .post("/api/v1/flows", &key, json!({"title": "Bodiless"}))
        .await
        .json();
    let versions_path = format!("/api/v1/flows/{}/versions", flow["id"].as_str().unwrap());
    let versions = app.url(&versions_path);
    let with_body = |content_type: &'static str, body: &'static str| {
        app.client
            .post(&versions)
            .bearer_auth(&key)
            .header("content-type", content_type)
            .body(body)
    };
    let refused = send(with_body("application/json", r#"{"templates": []}"#))
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(refused["param"], "templates");
    send(with_body("application/json", "{garbage"))
        .await
        .error(400, "INVALID_JSON");
    send(with_body("application/json", " []"))
        .await
        .error(400, "VALIDATION_ERROR");
    send(with_body("text/plain", "garbage"))
        .await
        .error(400, "INVALID_CONTENT_TYPE");
    let count = || async {
        app.get(&versions_path, &key)
            .await
            .json()
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count().await, 1, "a refused request created no version");
    // No body, `{}` and `null` are all "none".
    assert_eq!(
        send(app.client.post(&versions).bearer_auth(&key))
            .await
            .status,
        201
    );
    assert_eq!(send(with_body("application/json", "{}")).await.status, 201);
    assert_eq!(
        send(with_body("application/json", " null ")).await.status,
        201
    );
    assert_eq!(count().await, 4);
    let customer = app
        .post("/api/v1/customers", &key, json!({"externalId": "c1"}))
        .await;
    assert_eq!(customer.status, 201);
    let deactivate = app.url("/api/v1/customers/c1/deactivate");
    let refused = send(
        app.client
            .post(&deactivate)
            .bearer_auth(&key)
            .json(&json!({"reason": "churned"})),
    )
    .await
    .error(400, "VALIDATION_ERROR");
    assert_eq!(refused["param"], "reason");
    let kept = app.get("/api/v1/customers/c1", &key).await.json();
    assert_eq!(kept["isActive"], true, "{kept}");
}
