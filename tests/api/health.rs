use reqwest::Method;

use crate::helpers::spawn_app;

#[tokio::test]
async fn probes_answer_without_auth_and_every_response_has_a_request_id() {
    let app = spawn_app().await;
    let live = app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(live.status, 200);
    assert_eq!(live.json()["status"], "ok");
    let ready = app.request(Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["status"], "ready");

    let mut ids = std::collections::HashSet::new();
    for response in [live, ready] {
        let id = response.headers["x-request-id"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(uuid::Uuid::parse_str(&id).is_ok());
        ids.insert(id);
    }
    assert_eq!(ids.len(), 2, "request ids repeat");

    // Graceful stop: the server task ends and the port is closed.
    let address = app.url("/healthz");
    app.stop().await;
    assert!(
        reqwest::get(&address).await.is_err(),
        "still serving after stop"
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_get_the_error_shape() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    app.get("/api/v1/no-such-thing", &key)
        .await
        .error(404, "NOT_FOUND");
    app.request(Method::PATCH, "/api/v1/environments", Some(&key), None)
        .await
        .error(405, "METHOD_NOT_ALLOWED");
}

#[tokio::test]
async fn readiness_fails_when_the_database_is_gone() {
    let app = spawn_app().await;
    app.store.clone().close().await.unwrap();
    let ready = app.request(Method::GET, "/readyz", None, None).await;
    ready.error(503, "SERVICE_UNAVAILABLE");
}
