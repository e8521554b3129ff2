//! Regressions for what `cargo xtask conformance` (schemathesis) found: each test replays the
//! failing request over real HTTP (docs/reliability.md, "API conformance (schemathesis)").

use serde_json::json;

use crate::helpers::{send, spawn_app};

/// serde reads a struct from a JSON array too, so `[null, null]` was a patch that changed nothing
/// and answered 200; every body of the API is documented as an object.
#[tokio::test]
async fn array_bodies_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    app.post(
        "/api/v1/customers",
        &key,
        json!({"externalId": "c1", "name": "Before"}),
    )
    .await;
    let settings_before = app.get("/api/v1/settings", &key).await.json();

    for (path, body) in [
        ("/api/v1/settings", "[null, null]"),
        ("/api/v1/customers/c1", "[\"After\"]"),
        ("/api/v1/customers", " [\"c2\"]"),
    ] {
        let method = if path == "/api/v1/customers" {
            reqwest::Method::POST
        } else {
            reqwest::Method::PUT
        };
        let err = send(
            app.client
                .request(method, app.url(path))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
        .error(400, "VALIDATION_ERROR");
        assert!(
            err["message"].as_str().unwrap().contains("JSON object"),
            "{err}"
        );
    }
    assert_eq!(
        app.get("/api/v1/settings", &key).await.json(),
        settings_before
    );
    let customers = app.get("/api/v1/customers", &key).await.json();
    assert_eq!(customers.as_array().unwrap().len(), 1);
    assert_eq!(customers[0]["name"], "Before");
}

/// A time span whose last character is several bytes long was split inside that character and
/// the handler panicked (500); it is an invalid span like any other.
#[tokio::test]
async fn time_spans_ending_in_a_multibyte_character_are_400() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    for path in [
        "/api/v1/statistics?period=%C3%AE",
        "/api/v1/statistics?period=7%C3%A9",
        "/api/v1/statistics/model-costs?period=%0A%07%23T%C2%A6",
        "/api/v1/statistics/flow/any/request?period=Uz%F1%B2%B2%A9a%C3%91",
    ] {
        let err = app.get(path, &key).await.error(400, "VALIDATION_ERROR");
        assert_eq!(err["param"], "period", "{path}");
    }
}
