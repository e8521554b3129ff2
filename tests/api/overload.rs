//! Load shedding (`baton-api/src/overload.rs`, `docs/reliability.md` "Overload") on the real
//! server: a runtime kept busy past the shedding target gets API requests refused with 503
//! `OVERLOADED` and `Retry-After`, before they do anything; health checks and metrics still
//! answer; once the runtime has caught up, requests are taken again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::helpers::spawn_app_with;

#[tokio::test]
async fn a_saturated_server_refuses_api_requests_until_it_catches_up() {
    let app = spawn_app_with(|config| {
        config.server.shed_queue_delay_ms = 60;
        config.server.shed_interval_ms = 100;
    })
    .await;
    let session = app.session_for(&app.default_tenant).await;
    let keys_before = app.get("/api/v1/api-keys", &session).await.json();

    // The test's runtime is the server's (one thread): blocking it in long slices, with a
    // short turn for everything else between them, is what a saturated server looks like.
    let busy = Arc::new(AtomicBool::new(true));
    let hog = tokio::spawn({
        let busy = busy.clone();
        async move {
            while busy.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(150));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let mut refused = None;
    let mut created_before_shedding = 0;
    for _ in 0..100 {
        let response = app
            .post("/api/v1/api-keys", &session, json!({"name": "during"}))
            .await;
        if response.status == 503 {
            refused = Some(response);
            break;
        }
        assert_eq!(response.status, 201, "{}", response.text);
        created_before_shedding += 1;
    }
    let refused = refused.expect("a saturated server never refused a request");
    let error = refused.error(503, "OVERLOADED");
    assert_eq!(error["type"], "api_error");
    assert!(error["message"].as_str().unwrap().contains("overloaded"));
    assert_eq!(refused.headers["retry-after"], "1");

    // Operators can still see it: the health check answers and metrics say why.
    let health = app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, 200, "{}", health.text);
    let mut reported = false;
    for _ in 0..100 {
        let metrics = app.request(Method::GET, "/metrics", None, None).await;
        assert_eq!(metrics.status, 200);
        if metrics.text.contains("baton_overloaded 1")
            && metrics
                .text
                .contains("baton_http_errors_total{code=\"OVERLOADED\",status=\"503\"}")
        {
            reported = true;
            break;
        }
    }
    assert!(reported, "metrics never showed the shedding");

    busy.store(false, Ordering::Relaxed);
    hog.await.unwrap();
    let mut taken = false;
    for _ in 0..500 {
        let response = app.get("/api/v1/api-keys", &session).await;
        if response.status == 200 {
            taken = true;
            // The refused request did nothing: only keys made before shedding began exist.
            assert_eq!(
                response.json().as_array().unwrap().len(),
                keys_before.as_array().unwrap().len() + created_before_shedding
            );
            break;
        }
        response.error(503, "OVERLOADED");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(taken, "requests were still refused on an idle server");
}
