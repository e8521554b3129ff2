//! Routing rules, fallbacks, strategies, breakers, rate limits and the response cache, against
//! two mock providers: `primary` serves `openai/*`, `backup` serves `anthropic/*`.

use std::time::Duration;

use baton_providers::ProviderConfig;
use baton_testkit::{MockProvider, Reply};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};

const PRIMARY: &str = "openai/gpt-4o-mini";
const BACKUP: &str = "anthropic/claude-haiku-4-5";

struct Setup {
    app: TestApp,
    primary: MockProvider,
    backup: MockProvider,
    key: String,
}

async fn setup_with(
    breaker_threshold: u32,
    breaker_cooldown_ms: u64,
    request_timeout_secs: u64,
) -> Setup {
    let primary = MockProvider::start().await.unwrap();
    let backup = MockProvider::start().await.unwrap();
    let (primary_base, backup_root) = (primary.openai_base(), backup.root());
    let app = spawn_app_with(move |config| {
        config.providers.insert(
            "openai".into(),
            ProviderConfig {
                base_url: Some(primary_base),
                api_key: Some("sk-primary".into()),
                ..Default::default()
            },
        );
        config.providers.insert(
            "anthropic".into(),
            ProviderConfig {
                base_url: Some(backup_root),
                api_key: Some("sk-backup".into()),
                ..Default::default()
            },
        );
        // Nothing listens on port 9: connections are refused.
        config.providers.insert(
            "mistral".into(),
            ProviderConfig {
                base_url: Some("http://127.0.0.1:9/v1".into()),
                api_key: Some("sk-nowhere".into()),
                ..Default::default()
            },
        );
        for key in ["google", "bedrock", "azure", "deepseek"] {
            config
                .providers
                .insert(key.into(), ProviderConfig::default());
        }
        config.routing.breaker_failure_threshold = breaker_threshold;
        config.routing.breaker_cooldown_ms = breaker_cooldown_ms;
        config.server.request_timeout_secs = request_timeout_secs;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    Setup {
        app,
        primary,
        backup,
        key,
    }
}

async fn setup() -> Setup {
    // A breaker that does not open during the failure-kind tests.
    setup_with(1000, 60_000, 600).await
}

impl Setup {
    async fn rule(&self, alias: &str, models: &[&str], extra: Value) -> Value {
        let mut body = json!({"alias": alias, "models": models});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let created = self
            .app
            .post("/api/v1/routing-rules", &self.key, body)
            .await;
        assert_eq!(created.status, 201, "{}", created.text);
        created.json()
    }

    async fn chat(&self, model: &str, extra: Value) -> crate::helpers::Response {
        let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        self.app
            .post("/api/v1/chat/completions", &self.key, body)
            .await
    }

    fn calls(&self) -> (usize, usize) {
        (self.primary.received().len(), self.backup.received().len())
    }

    async fn run(&self, id: &str) -> baton_domain::run::RunRecord {
        let tenant = baton_store::TenantId::new(self.app.default_tenant.id.clone());
        for _ in 0..100 {
            if let Ok(run) = self.app.store.get_run(&tenant, id).await {
                return run;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("run {id} was never logged");
    }
}

fn request_id(response: &crate::helpers::Response) -> String {
    response.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string()
}

fn stream_text(body: &str) -> (String, Option<Value>) {
    let mut text = String::new();
    let mut error = None;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if chunk.get("error").is_some() {
            error = Some(chunk);
        } else if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(piece);
        }
    }
    (text, error)
}

#[tokio::test]
async fn routing_rules_are_validated_and_managed() {
    let s = setup().await;
    let rule = s
        .rule(
            "fast",
            &[PRIMARY, "anthropic"],
            json!({"strategy": "roundrobin", "description": "cheap first"}),
        )
        .await;
    assert_eq!(rule["strategy"], "RoundRobin");
    assert_eq!(rule["models"], json!([PRIMARY, "anthropic"]));
    let id = rule["id"].as_str().unwrap();

    let post = |body: Value| s.app.post("/api/v1/routing-rules", &s.key, body);
    post(json!({"alias": "fast", "models": [PRIMARY]}))
        .await
        .error(409, "ALREADY_EXISTS");
    for (body, param) in [
        (json!({"alias": "x", "models": []}), "models"),
        (
            json!({"alias": "x", "models": [PRIMARY, "nope/model"]}),
            "models[1]",
        ),
        // An alias cannot name another alias.
        (json!({"alias": "x", "models": ["fast"]}), "models[0]"),
        // Not in the catalogue, and Google is not configured here.
        (
            json!({"alias": "x", "models": ["google/gemini-9-imaginary"]}),
            "models[0]",
        ),
        (
            json!({"alias": "x", "models": [PRIMARY], "strategy": "Fastest"}),
            "strategy",
        ),
        (
            json!({"alias": "x", "models": [PRIMARY, BACKUP], "strategy": "Weighted", "weights": [1]}),
            "weights",
        ),
        (json!({"alias": "two words", "models": [PRIMARY]}), "alias"),
        (json!({"models": [PRIMARY]}), "alias"),
    ] {
        let error = post(body.clone()).await.error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param, "{body}");
    }
    // A configured provider may serve models newer than the catalogue.
    let newer = post(json!({"alias": "new", "models": ["openai/gpt-99-preview"]})).await;
    assert_eq!(newer.status, 201, "{}", newer.text);

    let listed = s.app.get("/api/v1/routing-rules", &s.key).await.json();
    let aliases: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alias"].as_str().unwrap())
        .collect();
    assert_eq!(aliases, ["fast", "new"]);

    let path = format!("/api/v1/routing-rules/{id}");
    let replaced = s
        .app
        .put(&path, &s.key, json!({"alias": "fast", "models": [BACKUP]}))
        .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text);
    assert_eq!(replaced.json()["strategy"], "Sequential");
    assert_eq!(
        s.app.get(&path, &s.key).await.json()["models"],
        json!([BACKUP])
    );
    // The change applies to the next request at once.
    let answered = s.chat("fast", json!({})).await;
    assert_eq!(answered.status, 200, "{}", answered.text);
    assert_eq!(s.calls(), (0, 1));
    // While the tenant's defaultModel names the alias, it is neither removed nor renamed.
    let set = s
        .app
        .put("/api/v1/settings", &s.key, json!({"defaultModel": "fast"}))
        .await;
    assert_eq!(set.status, 200, "{}", set.text);
    s.app.delete(&path, &s.key).await.error(409, "IN_USE");
    s.app
        .put(&path, &s.key, json!({"alias": "quick", "models": [BACKUP]}))
        .await
        .error(409, "IN_USE");
    s.app
        .put("/api/v1/settings", &s.key, json!({"defaultModel": null}))
        .await;
    assert_eq!(s.app.delete(&path, &s.key).await.status, 204);
    s.app.get(&path, &s.key).await.error(404, "NOT_FOUND");
    s.chat("fast", json!({}))
        .await
        .error(404, "MODEL_NOT_FOUND");
}

#[tokio::test]
async fn an_alias_a_flow_runs_on_stays_while_it_does() {
    let s = setup().await;
    let rule = s.rule("house", &[PRIMARY], json!({})).await;
    let path = format!("/api/v1/routing-rules/{}", rule["id"].as_str().unwrap());
    let app = &s.app;
    let created = app.post(
        "/api/v1/environments",
        &s.key,
        json!({"name": "production"}),
    );
    assert_eq!(created.await.status, 201);
    let flow = app
        .post("/api/v1/flows", &s.key, json!({"title": "Desk"}))
        .await;
    let slug = flow.json()["name"].as_str().unwrap().to_string();
    let versions = app
        .get(&format!("/api/v1/flows/{slug}/versions"), &s.key)
        .await;
    let v1 = versions.json()[0]["id"].as_str().unwrap().to_string();
    let template = format!("/api/v1/flows/{slug}/versions/{v1}/templates/main");
    let body = json!({"template": "Help.", "llm": PRIMARY, "fallbacks": ["house"]});
    assert_eq!(app.put(&template, &s.key, body).await.status, 200);
    // A draft does not hold the alias (it is checked again when activated)...
    let renamed = app
        .put(&path, &s.key, json!({"alias": "home", "models": [PRIMARY]}))
        .await;
    assert_eq!(renamed.status, 200, "{}", renamed.text);
    let activate = format!("/api/v1/flows/{slug}/versions/{v1}/environments");
    let refused = app
        .post(&activate, &s.key, json!({"environment": "production"}))
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(refused["param"], "versionId");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains("'main' fallbacks[0]"), "{message}");
    app.put(
        &path,
        &s.key,
        json!({"alias": "house", "models": [PRIMARY]}),
    )
    .await;
    let activated = app
        .post(&activate, &s.key, json!({"environment": "production"}))
        .await;
    assert_eq!(activated.status, 200, "{}", activated.text);
    // ...an active version does, as a flow's classifier does.
    let in_use = app.delete(&path, &s.key).await.error(409, "IN_USE");
    let message = in_use["message"].as_str().unwrap();
    assert!(
        message.contains("template 'main' of flow 'desk'"),
        "{message}"
    );
    app.put(&path, &s.key, json!({"alias": "home", "models": [PRIMARY]}))
        .await
        .error(409, "IN_USE");
    let fork = format!("/api/v1/flows/{slug}/versions/{v1}/fork");
    let forked = app.post(&fork, &s.key, json!({})).await;
    assert_eq!(forked.status, 201, "{}", forked.text);
    let v2 = forked.json()["id"].as_str().unwrap().to_string();
    let body = json!({"template": "Help.", "llm": PRIMARY});
    let replaced = format!("/api/v1/flows/{slug}/versions/{v2}/templates/main");
    assert_eq!(app.put(&replaced, &s.key, body).await.status, 200);
    let activate_v2 = format!("/api/v1/flows/{slug}/versions/{v2}/environments");
    let activated = app
        .post(&activate_v2, &s.key, json!({"environment": "production"}))
        .await;
    assert_eq!(activated.status, 200, "{}", activated.text);
    let classifier = json!({"executionMode": "Route", "classifierModel": "house"});
    let routed = app
        .put(&format!("/api/v1/flows/{slug}"), &s.key, classifier)
        .await;
    assert_eq!(routed.status, 200, "{}", routed.text);
    let in_use = app.delete(&path, &s.key).await.error(409, "IN_USE");
    assert!(
        in_use["message"]
            .as_str()
            .unwrap()
            .contains("classifierModel")
    );
    let direct = json!({"executionMode": "Direct", "classifierModel": null});
    app.put(&format!("/api/v1/flows/{slug}"), &s.key, direct)
        .await;
    assert_eq!(app.delete(&path, &s.key).await.status, 204);
}

#[tokio::test]
async fn an_outage_ahead_of_an_unconfigured_provider_is_still_an_outage() {
    let s = setup().await;
    s.rule("edge", &[PRIMARY, "google/gemini-2.5-flash"], json!({}))
        .await;
    s.primary.push(Reply::status(503, "primary down"));
    // Google is not configured here: passed over, and the 503 is what the client learns.
    let failed = s.chat("edge", json!({})).await.error(502, "PROVIDER_ERROR");
    assert!(
        failed["message"].as_str().unwrap().contains("503"),
        "{failed}"
    );
    assert_eq!(s.calls(), (1, 0));
    // With nothing configured on the chain, it is a configuration problem, said so.
    s.rule(
        "nowhere",
        &["google/gemini-2.5-flash", "deepseek/deepseek-v4-flash"],
        json!({}),
    )
    .await;
    s.chat("nowhere", json!({}))
        .await
        .error(400, "PROVIDER_NOT_CONFIGURED");
}

#[tokio::test]
async fn each_retryable_failure_falls_back_once_and_a_rejection_does_not() {
    let s = setup().await;
    s.rule("resilient", &[PRIMARY, BACKUP], json!({})).await;
    let fast_timeouts = json!({"x_timeouts": {"total_ms": 400}});
    for (what, failure, extra) in [
        ("500", Reply::status(500, "primary down"), json!({})),
        ("429", Reply::status(429, "slow down"), json!({})),
        (
            "timeout",
            Reply::Delayed(Duration::from_secs(3), Box::new(Reply::text("too late"))),
            fast_timeouts.clone(),
        ),
        (
            "broken body",
            Reply::BreakAfterFirstChunk(Box::new(Reply::text("cut short"))),
            json!({}),
        ),
    ] {
        let before = s.calls();
        s.primary.push(failure);
        s.backup.push(Reply::text(format!("backup answers {what}")));
        let response = s.chat("resilient", extra).await;
        assert_eq!(response.status, 200, "{what}: {}", response.text);
        let body = response.json();
        assert_eq!(
            body["choices"][0]["message"]["content"],
            format!("backup answers {what}")
        );
        assert_eq!(body["model"], BACKUP, "{what}");
        assert_eq!(response.headers["x-baton-fallback-used"], "true", "{what}");
        assert_eq!(
            s.calls(),
            (before.0 + 1, before.1 + 1),
            "{what}: one call per hop"
        );

        let run = s.run(&request_id(&response)).await;
        assert!(run.fallback_used, "{what}");
        assert_eq!(run.served_model.as_deref(), Some(BACKUP));
        let attempts: Vec<(&str, &str)> = run
            .attempts
            .iter()
            .map(|a| (a.model.as_str(), a.outcome.as_str()))
            .collect();
        assert_eq!(attempts.len(), 2, "{what}: {attempts:?}");
        assert_eq!(attempts[0].0, PRIMARY);
        assert_ne!(attempts[0].1, "succeeded");
        assert_eq!(attempts[1], (BACKUP, "succeeded"));
    }

    // A refused connection is retryable too.
    s.rule("far", &["mistral/mistral-small-latest", BACKUP], json!({}))
        .await;
    s.backup.push(Reply::text("backup answers refused"));
    let response = s.chat("far", json!({})).await;
    assert_eq!(response.status, 200, "{}", response.text);
    assert_eq!(
        response.json()["choices"][0]["message"]["content"],
        "backup answers refused"
    );

    // The first model answers: no fallback, no header.
    let before = s.calls();
    s.primary.push(Reply::text("primary answers"));
    let response = s.chat("resilient", json!({})).await;
    assert_eq!(response.json()["model"], PRIMARY);
    assert!(response.headers.get("x-baton-fallback-used").is_none());
    assert_eq!(s.calls(), (before.0 + 1, before.1));

    // A 400 from the provider is the request's fault: the next model is not tried.
    let before = s.calls();
    s.primary.push(Reply::status(400, "bad parameter"));
    s.chat("resilient", json!({}))
        .await
        .error(400, "PROVIDER_REJECTED");
    assert_eq!(s.calls(), (before.0 + 1, before.1));

    // Every model fails: 502, each tried once.
    let before = s.calls();
    s.primary.push(Reply::status(503, "primary down"));
    s.backup.push(Reply::status(500, "backup down"));
    let failed = s.chat("resilient", json!({})).await;
    failed.error(502, "PROVIDER_ERROR");
    assert_eq!(s.calls(), (before.0 + 1, before.1 + 1));
    let run = s.run(&request_id(&failed)).await;
    assert_eq!(run.attempts.len(), 2);
    assert_eq!(run.error_code.as_deref(), Some("PROVIDER_ERROR"));
}

#[tokio::test]
async fn streams_fall_back_before_the_first_byte_only() {
    let s = setup().await;
    s.rule("resilient", &[PRIMARY, BACKUP], json!({})).await;

    // Before the first byte: connect timeout, first-token timeout and 500 all fall back.
    for (what, failure, timeouts) in [
        ("500", Reply::status(500, "primary down"), json!({})),
        (
            "connect timeout",
            Reply::Delayed(Duration::from_secs(3), Box::new(Reply::text("late"))),
            json!({"connect_ms": 300}),
        ),
    ] {
        let before = s.calls();
        s.primary.push(failure);
        s.backup
            .push(Reply::text(format!("streamed by backup {what}")));
        let response = s
            .chat("resilient", json!({"stream": true, "x_timeouts": timeouts}))
            .await;
        assert_eq!(response.status, 200, "{what}: {}", response.text);
        assert_eq!(response.headers["x-baton-fallback-used"], "true");
        let (text, error) = stream_text(&response.text);
        assert_eq!(text, format!("streamed by backup {what}"), "{what}");
        assert!(error.is_none(), "{what}");
        assert_eq!(s.calls(), (before.0 + 1, before.1 + 1), "{what}");
    }

    // First-token timeout: headers come at once, the first token too late.
    s.primary.set_stream_chunking(4, Duration::from_millis(250));
    let before = s.calls();
    s.primary.push(Reply::text("slow primary"));
    s.backup.push(Reply::text("quick backup"));
    let response = s
        .chat(
            "resilient",
            json!({"stream": true, "x_timeouts": {"first_token_ms": 400}}),
        )
        .await;
    let (text, _) = stream_text(&response.text);
    assert_eq!(text, "quick backup");
    assert_eq!(s.calls(), (before.0 + 1, before.1 + 1));
    s.primary.set_stream_chunking(7, Duration::ZERO);

    // After the first byte: the client keeps what it got and gets an error chunk; no fallback.
    let before = s.calls();
    s.primary
        .push(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
            "a long answer that the primary will not finish sending",
        ))));
    let response = s.chat("resilient", json!({"stream": true})).await;
    assert_eq!(response.status, 200);
    let (text, error) = stream_text(&response.text);
    assert!(!text.is_empty(), "some content arrived first");
    assert_eq!(error.unwrap()["error"]["code"], "PROVIDER_ERROR");
    assert_eq!(s.calls(), (before.0 + 1, before.1));
    let run = s.run(&request_id(&response)).await;
    assert_eq!(run.error_code.as_deref(), Some("PROVIDER_ERROR"));
    assert!(!run.fallback_used);
}

#[tokio::test]
async fn retry_after_is_honoured_within_the_deadline() {
    let s = setup_with(1000, 60_000, 5).await;
    s.primary.push(Reply::rate_limited(1));
    s.primary.push(Reply::text("after the wait"));
    let response = s.chat(PRIMARY, json!({})).await;
    assert_eq!(response.status, 200, "{}", response.text);
    assert_eq!(
        response.json()["choices"][0]["message"]["content"],
        "after the wait"
    );
    assert_eq!(s.calls(), (2, 0));
    // A wait longer than the request's deadline (5 s here) is not taken.
    s.primary.push(Reply::rate_limited(30));
    s.chat(PRIMARY, json!({}))
        .await
        .error(502, "PROVIDER_ERROR");
    assert_eq!(s.calls(), (3, 0));
}

#[tokio::test]
async fn round_robin_and_weighted_spread_requests() {
    let s = setup().await;
    s.rule("rr", &[PRIMARY, BACKUP], json!({"strategy": "RoundRobin"}))
        .await;
    for _ in 0..11 {
        assert_eq!(s.chat("rr", json!({})).await.status, 200);
    }
    let (p, b) = s.calls();
    assert_eq!(p + b, 11);
    assert!(p.abs_diff(b) <= 1, "round robin gave {p} and {b}");

    s.rule(
        "weighted",
        &[PRIMARY, BACKUP],
        json!({"strategy": "Weighted", "weights": [3, 1]}),
    )
    .await;
    let before = s.calls();
    for _ in 0..40 {
        assert_eq!(s.chat("weighted", json!({})).await.status, 200);
    }
    let (p, b) = (s.calls().0 - before.0, s.calls().1 - before.1);
    // Smooth weighted round-robin is exact over every 4 requests; allow one either way.
    assert!(
        p.abs_diff(30) <= 1 && b.abs_diff(10) <= 1,
        "weighted gave {p} and {b}"
    );
}

#[tokio::test]
async fn the_breaker_skips_a_dead_model_and_resumes_after_recovery() {
    const COOLDOWN: Duration = Duration::from_millis(1500);
    let s = setup_with(2, COOLDOWN.as_millis() as u64, 600).await;
    s.rule("guarded", &[PRIMARY, BACKUP], json!({})).await;
    for _ in 0..2 {
        s.primary.push(Reply::status(500, "down"));
        assert_eq!(s.chat("guarded", json!({})).await.status, 200);
    }
    let opened = std::time::Instant::now();
    assert_eq!(s.calls(), (2, 2));
    // Open: the primary is not called at all. The runs are read after the open window, since
    // waiting for each to be logged could outlast the cooldown on a loaded machine.
    let mut skipped = Vec::new();
    for _ in 0..3 {
        let response = s.chat("guarded", json!({})).await;
        assert_eq!(response.json()["model"], BACKUP);
        skipped.push(request_id(&response));
    }
    assert!(
        opened.elapsed() < COOLDOWN,
        "the requests outlasted the open window"
    );
    assert_eq!(s.calls(), (2, 5));
    for id in &skipped {
        let run = s.run(id).await;
        assert_eq!(run.attempts[0].outcome, "skipped_circuit_open");
    }
    // After the cooldown one probe goes through; the primary has recovered.
    tokio::time::sleep(COOLDOWN.saturating_sub(opened.elapsed()) + Duration::from_millis(100))
        .await;
    for _ in 0..3 {
        let response = s.chat("guarded", json!({})).await;
        assert_eq!(response.json()["model"], PRIMARY);
    }
    assert_eq!(s.calls(), (5, 5));
}

#[tokio::test]
async fn the_service_format_and_events_say_which_model_answered() {
    let s = setup().await;
    s.rule("resilient", &[PRIMARY, BACKUP], json!({})).await;
    s.primary.push(Reply::status(500, "down"));
    s.backup.push(Reply::text("from backup"));
    let response = s
        .app
        .post(
            "/api/v1/inference",
            &s.key,
            json!({"model": "resilient", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let body = response.json();
    assert_eq!(body["fallback_used"], true);
    assert_eq!(body["served_model"], BACKUP);
    assert_eq!(body["model"], "resilient");

    s.primary.push(Reply::status(500, "down"));
    let response = s
        .chat(
            "resilient",
            json!({"stream": true, "stream_options": {"format": "events"}}),
        )
        .await;
    let completed = response
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|e| e["type"] == "agentInferenceCompleted")
        .unwrap();
    assert_eq!(completed["data"]["wasFallback"], true);
    assert_eq!(completed["data"]["provider"], "anthropic");
}

#[tokio::test]
async fn tenant_rate_limits_answer_429_with_retry_after() {
    let s = setup().await;
    let limited = s
        .app
        .put("/api/v1/settings", &s.key, json!({"requestsPerMinute": 2}))
        .await;
    assert_eq!(limited.status, 200, "{}", limited.text);
    for _ in 0..2 {
        assert_eq!(s.chat(PRIMARY, json!({})).await.status, 200);
    }
    let refused = s.chat(PRIMARY, json!({})).await;
    refused.error(429, "RATE_LIMITED");
    let wait: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(
        refused.json()["error"]["message"],
        format!("too many requests; retry after {wait} seconds"),
        "the message tells the header's wait"
    );
    assert_eq!(s.calls(), (2, 0), "a refused request reaches no provider");
    // Another tenant has its own budget.
    let other = s.app.create_tenant("other").await;
    let response = s
        .app
        .post(
            "/api/v1/chat/completions",
            &other.api_key,
            json!({"model": PRIMARY, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
}

#[tokio::test]
async fn the_response_cache_serves_repeats_free_until_the_nonce_changes() {
    let s = setup().await;
    // Off by default: two calls.
    s.chat(PRIMARY, json!({})).await;
    s.chat(PRIMARY, json!({})).await;
    assert_eq!(s.calls(), (2, 0));
    s.app
        .put(
            "/api/v1/settings",
            &s.key,
            json!({"responseCacheTtlSeconds": 60}),
        )
        .await;
    s.primary
        .push(Reply::text("worth caching").with_usage(40, 8));
    let first = s.chat(PRIMARY, json!({"x_nonce": "a"})).await;
    let second = s.chat(PRIMARY, json!({"x_nonce": "a"})).await;
    assert_eq!(s.calls(), (3, 0), "the repeat was served from the cache");
    assert_eq!(
        second.json()["choices"][0]["message"]["content"],
        "worth caching"
    );
    assert_eq!(second.json()["usage"], first.json()["usage"]);
    let fresh = s.run(&request_id(&first)).await;
    let cached = s.run(&request_id(&second)).await;
    assert!(!fresh.was_cached && fresh.cost_credits > 0);
    assert!(cached.was_cached);
    assert_eq!(cached.cost_credits, 0);
    assert_eq!(cached.usage, fresh.usage);

    // A new nonce, or another tenant, misses.
    s.chat(PRIMARY, json!({"x_nonce": "b"})).await;
    assert_eq!(s.calls(), (4, 0));
    let other = s.app.create_tenant("other").await;
    s.app
        .put(
            "/api/v1/settings",
            &other.api_key,
            json!({"responseCacheTtlSeconds": 60}),
        )
        .await;
    s.app
        .post(
            "/api/v1/chat/completions",
            &other.api_key,
            json!({"model": PRIMARY, "x_nonce": "a", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(s.calls(), (5, 0));

    // A streamed answer is cached too, and replayed as a stream.
    s.primary.push(Reply::text("streamed once"));
    let streamed = s
        .chat(PRIMARY, json!({"stream": true, "x_nonce": "s"}))
        .await;
    let replayed = s
        .chat(PRIMARY, json!({"stream": true, "x_nonce": "s"}))
        .await;
    assert_eq!(s.calls(), (6, 0));
    assert_eq!(stream_text(&streamed.text).0, "streamed once");
    assert_eq!(stream_text(&replayed.text).0, "streamed once");
    let events = s
        .chat(
            PRIMARY,
            json!({"stream": true, "x_nonce": "s", "stream_options": {"format": "events"}}),
        )
        .await;
    assert!(
        events.text.contains("\"wasCached\":true"),
        "{}",
        events.text
    );
    assert_eq!(s.calls(), (6, 0));
}

#[tokio::test]
async fn under_load_with_injected_failures_every_request_gets_one_answer_and_one_log() {
    let s = setup().await;
    s.rule("resilient", &[PRIMARY, BACKUP], json!({})).await;
    const N: usize = 500;
    for i in 0..N {
        s.primary.push(if i % 10 < 3 {
            Reply::status(500, "injected")
        } else {
            Reply::text("primary")
        });
    }
    let client = s.app.client.clone();
    let url = s.app.url("/api/v1/chat/completions");
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let (client, url, key) = (client.clone(), url.clone(), s.key.clone());
            tokio::spawn(async move {
                let response = client
                    .post(url)
                    .bearer_auth(key)
                    .json(&json!({"model": "resilient", "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                let id = response.headers()["x-request-id"].to_str().unwrap().to_string();
                let body: Value = response.json().await.unwrap();
                (status, id, body)
            })
        })
        .collect();
    let mut ids = std::collections::HashSet::new();
    let mut from_backup = 0;
    for task in tasks {
        let (status, id, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(ids.insert(id), "one response per request");
        if body["model"] == BACKUP {
            from_backup += 1;
        }
    }
    assert_eq!(ids.len(), N);
    assert_eq!(from_backup, N * 3 / 10);
    assert_eq!(s.calls(), (N, N * 3 / 10));
    // Every request is logged exactly once.
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    let mut logged = 0;
    for _ in 0..100 {
        logged = s
            .app
            .store
            .list_runs(&tenant)
            .await
            .unwrap()
            .iter()
            .filter(|r| ids.contains(&r.id))
            .count();
        if logged == N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(logged, N);
}
