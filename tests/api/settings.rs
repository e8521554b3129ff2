use serde_json::json;

use crate::helpers::spawn_app;

#[tokio::test]
async fn defaults_partial_updates_and_resets() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let defaults = app.get("/api/v1/settings", &key).await.json();
    assert_eq!(
        defaults,
        json!({
            "callbackOrigins": [], "textRetentionDays": null, "textSampleRate": 1.0,
            "defaultMaxAgentDepth": 10, "maxCostPerRequestCredits": null, "defaultModel": null,
            "markupPercent": 0.0, "responseCacheTtlSeconds": 0, "requestsPerMinute": null,
            "connectTimeoutMs": null, "firstTokenTimeoutMs": null, "attemptTimeoutMs": null
        })
    );

    let updated = app
        .put(
            "/api/v1/settings",
            &key,
            json!({"callbackOrigins": "https://app.example.com\n*.tools.example.com:8443\n", "textRetentionDays": 30, "markupPercent": 12.5}),
        )
        .await;
    assert_eq!(updated.status, 200, "{}", updated.text);
    let updated = updated.json();
    assert_eq!(
        updated["callbackOrigins"],
        json!(["https://app.example.com", "*.tools.example.com:8443"])
    );
    assert_eq!(updated["textRetentionDays"], 30);
    assert_eq!(updated["markupPercent"], 12.5);

    // Absent fields stay; null resets.
    let reset = app
        .put("/api/v1/settings", &key, json!({"textRetentionDays": null}))
        .await
        .json();
    assert_eq!(reset["textRetentionDays"], json!(null));
    assert_eq!(reset["markupPercent"], 12.5);
    assert_eq!(reset["callbackOrigins"].as_array().unwrap().len(), 2);
    assert_eq!(app.get("/api/v1/settings", &key).await.json(), reset);
}

#[tokio::test]
async fn invalid_values_change_nothing() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let before = app
        .put(
            "/api/v1/settings",
            &key,
            json!({"callbackOrigins": ["https://ok.example.com"]}),
        )
        .await
        .json();
    for (body, param) in [
        (
            json!({"callbackOrigins": ["https://ok.example.com", "https://bad.example.com/path"], "markupPercent": 5}),
            "callbackOrigins[1]",
        ),
        (json!({"callbackOrigins": ["*.com"]}), "callbackOrigins[0]"),
        (
            json!({"callbackOrigins": "ftp://x.example.com"}),
            "callbackOrigins[0]",
        ),
        (json!({"textSampleRate": 2}), "textSampleRate"),
        (json!({"textSampleRate": "half"}), "textSampleRate"),
        (json!({"defaultMaxAgentDepth": -1}), "defaultMaxAgentDepth"),
        (
            json!({"maxCostPerRequestCredits": 0}),
            "maxCostPerRequestCredits",
        ),
        (json!({"unknownSetting": true}), "unknownSetting"),
        // Fields with no unset state refuse null rather than ignore it.
        (json!({"textSampleRate": null}), "textSampleRate"),
        (json!({"markupPercent": null}), "markupPercent"),
        (
            json!({"defaultMaxAgentDepth": null}),
            "defaultMaxAgentDepth",
        ),
        (
            json!({"responseCacheTtlSeconds": null}),
            "responseCacheTtlSeconds",
        ),
        (json!({"callbackOrigins": null}), "callbackOrigins"),
        // A default model no run could resolve is refused when saved.
        (json!({"defaultModel": "nope/x"}), "defaultModel"),
        (json!({"defaultModel": "bad model"}), "defaultModel"),
        (json!({"defaultModel": "no-such-alias"}), "defaultModel"),
    ] {
        let err = app
            .put("/api/v1/settings", &key, body.clone())
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(err["param"], param, "{body}");
    }
    assert_eq!(app.get("/api/v1/settings", &key).await.json(), before);
}

#[tokio::test]
async fn concurrent_updates_all_land() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    let fields = [
        "textRetentionDays",
        "defaultMaxAgentDepth",
        "responseCacheTtlSeconds",
        "requestsPerMinute",
    ];
    let updates = fields
        .iter()
        .map(|field| app.put("/api/v1/settings", &key, json!({*field: 7})));
    for response in futures::future::join_all(updates).await {
        assert_eq!(response.status, 200, "{}", response.text);
    }
    let settings = app.get("/api/v1/settings", &key).await.json();
    for field in fields {
        assert_eq!(settings[field], 7, "{field} was lost: {settings}");
    }
}
