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

/// The value of the first sample line starting with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_requests_errors_tokens_credits_and_attempts() {
    let (app, mock) = crate::chat::app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(baton_testkit::Reply::text("counted").with_usage(1200, 300));
    let response = crate::helpers::send(
        app.client
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&serde_json::json!({"model": "openai/gpt-4o-mini",
                                      "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let id = response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let run = crate::chat::wait_for_run(&app, &id).await;
    app.get("/api/v1/flows/nope", &key)
        .await
        .error(404, "NOT_FOUND");
    assert_eq!(app.get("/no/such/route", &key).await.status, 404);

    // The writer counts a run into the metrics just after its batch commits, on the writer's
    // thread (at idle priority on a busy machine): the row can be read a moment before.
    let mut scraped = app.request(Method::GET, "/metrics", None, None).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sample(
        &scraped.text,
        r#"baton_runs_total{kind="chat",status="Succeeded"}"#,
    )
    .is_none()
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        scraped = app.request(Method::GET, "/metrics", None, None).await;
    }
    assert_eq!(scraped.status, 200, "no credentials needed");
    assert!(
        scraped.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = scraped.text;
    let chat =
        r#"baton_http_requests_total{method="POST",route="/api/v1/chat/completions",status="200"}"#;
    assert_eq!(sample(&text, chat), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"baton_http_requests_total{method="GET",route="/api/v1/flows/{flowId}",status="404"}"#
        ),
        Some(1.0),
        "routes are labelled by template: {text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"baton_http_errors_total{code="NOT_FOUND",status="404"}"#
        ),
        Some(1.0)
    );
    assert!(text.contains(
        r#"baton_http_request_duration_seconds_count{method="POST",route="/api/v1/chat/completions"} 1"#
    ));
    assert_eq!(
        sample(
            &text,
            r#"baton_http_requests_total{method="GET",route="unmatched",status="404"}"#
        ),
        Some(1.0),
        "a path no route matches is one label: {text}"
    );
    let model = r#"model="openai/gpt-4o-mini""#;
    assert_eq!(
        sample(
            &text,
            &format!(r#"baton_tokens_total{{{model},kind="in"}}"#)
        ),
        Some(1200.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!(r#"baton_tokens_total{{{model},kind="out"}}"#)
        ),
        Some(300.0)
    );
    assert_eq!(
        sample(&text, &format!("baton_billed_credits_total{{{model}}}")),
        Some(run.cost_credits as f64)
    );
    assert_eq!(
        sample(
            &text,
            r#"baton_provider_attempts_total{model="openai/gpt-4o-mini",outcome="succeeded"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"baton_runs_total{kind="chat",status="Succeeded"}"#),
        Some(1.0)
    );
    assert!(sample(&text, "baton_log_writer_queue_depth").is_some());
    // The run above was written in a batch, on one lane or the other.
    let batches = sample(&text, r#"baton_log_writer_batches_total{lane="idle"}"#).unwrap_or(0.0)
        + sample(&text, r#"baton_log_writer_batches_total{lane="own"}"#).unwrap_or(0.0);
    assert!(batches >= 1.0, "{text}");
    assert!(sample(&text, "baton_log_writer_starved_batches_total").is_some());
}
