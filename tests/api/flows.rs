//! Flows end to end over HTTP: versions, templates, activation, environments, runs.

use baton_testkit::Reply;
use serde_json::{Value, json};

use crate::chat::app_with_mock;
use crate::helpers::TestApp;

struct Api<'a> {
    app: &'a TestApp,
    key: String,
}

impl Api<'_> {
    async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let response = self
            .app
            .request(method.clone(), path, Some(&self.key), body)
            .await;
        assert!(
            response.status.is_success(),
            "{method} {path}: {} {}",
            response.status,
            response.text
        );
        if response.text.is_empty() {
            Value::Null
        } else {
            response.json()
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.ok(reqwest::Method::POST, path, Some(body)).await
    }

    async fn put(&self, path: &str, body: Value) -> Value {
        self.ok(reqwest::Method::PUT, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.ok(reqwest::Method::GET, path, None).await
    }

    async fn run(&self, flow: &str, body: Value) -> Value {
        self.post(&format!("/api/v1/flows/{flow}/runs"), body).await
    }
}

fn system_and_user(body: &Value) -> (String, String) {
    let messages = body["messages"].as_array().unwrap();
    let text = |role: &str| {
        messages
            .iter()
            .find(|m| m["role"] == role)
            .map(|m| m["content"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    (text("system"), text("user"))
}

#[tokio::test]
async fn the_flow_lifecycle_pins_prompts_to_environments() {
    let (app, mock) = app_with_mock().await;
    let api = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    for name in ["staging", "production"] {
        api.post("/api/v1/environments", json!({"name": name}))
            .await;
    }
    let flow = api
        .post("/api/v1/flows", json!({"title": "Support Bot"}))
        .await;
    assert_eq!(flow["name"], "support-bot");
    assert_eq!(flow["executionMode"], "Direct");
    assert_eq!(flow["activeVersions"], json!({}));
    let slug = "support-bot";
    let versions = api.get(&format!("/api/v1/flows/{slug}/versions")).await;
    assert_eq!(versions.as_array().unwrap().len(), 1);
    let v1 = versions[0]["id"].as_str().unwrap().to_string();
    assert_eq!(versions[0]["entrypoint"], "main");
    assert_eq!(versions[0]["status"], "Draft");
    assert_eq!(versions[0]["templates"][0]["name"], "main");
    // A second flow with the same title gets its own slug.
    let twin = api
        .post("/api/v1/flows", json!({"title": "Support  bot!"}))
        .await;
    assert_eq!(twin["name"], "support-bot-2");
    // A title spelling another flow's id gets a slug of its own (flows are found by either).
    let lookalike = api
        .post("/api/v1/flows", json!({"title": flow["id"].clone()}))
        .await;
    assert_ne!(lookalike["name"], flow["id"]);
    let found = api
        .get(&format!(
            "/api/v1/flows/{}",
            lookalike["name"].as_str().unwrap()
        ))
        .await;
    assert_eq!(found["id"], lookalike["id"]);
    // Its empty entrypoint renders to nothing: activating it would fail every run.
    let twin_versions = api.get("/api/v1/flows/support-bot-2/versions").await;
    let twin_v1 = twin_versions[0]["id"].as_str().unwrap();
    let activate = format!("/api/v1/flows/support-bot-2/versions/{twin_v1}/environments");
    let error = app
        .post(&activate, &api.key, json!({"environment": "staging"}))
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "versionId");
    api.put(
        &format!("/api/v1/flows/support-bot-2/versions/{twin_v1}/templates/main"),
        json!({"template": "Hi"}),
    )
    .await;
    let error = app
        .post(
            &activate,
            &api.key,
            json!({"environment": "staging", "comment": "x".repeat(2_001)}),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "comment");
    let twin = api.get("/api/v1/flows/support-bot-2").await;
    assert_eq!(
        twin["activeVersions"],
        json!({}),
        "refused: nothing activated"
    );

    let template =
        |v: &str, name: &str| format!("/api/v1/flows/{slug}/versions/{v}/templates/{name}");
    api.put(
        &template(&v1, "main"),
        json!({
            "template": "You are [[persona]] for Acme. // internal: keep it short\nDocs: https://docs.acme.example/help /* not for the model\nat all */ Tone: [[tone]].",
            "userTemplate": "[[question]]",
            "llm": "openai/gpt-4o-mini",
            "temperature": 0.3
        }),
    )
    .await;
    api.put(
        &template(&v1, "tone"),
        json!({"template": "friendly and [[style]]"}),
    )
    .await;

    // Bad templates are refused, naming the field and the token.
    for (body, needle) in [
        (json!({"template": "Hi [[Bad-Name]]"}), "Bad-Name"),
        (json!({"template": "Hi [[a b]]"}), "a b"),
        (json!({"template": "loop [[loop_a]]"}), "loop_a"),
    ] {
        let response = app
            .put(&template(&v1, "loop_a"), &api.key, body.clone())
            .await;
        let error = response.error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], "template", "{body}");
        assert!(
            error["message"].as_str().unwrap().contains(needle),
            "{body}: {error}"
        );
    }
    app.put(&template(&v1, "Main"), &api.key, json!({"template": "x"}))
        .await
        .error(400, "VALIDATION_ERROR");
    // Models must be ones a run can resolve: an alias of the tenant, or a known provider's.
    for (body, param) in [
        (json!({"template": "x", "llm": "nosuch/model"}), "llm"),
        (json!({"template": "x", "llm": "two words"}), "llm"),
        (
            json!({"template": "x", "llm": "openai/gpt-4o-mini", "fallbacks": ["anthropic", "nosuch/x"]}),
            "fallbacks[1]",
        ),
    ] {
        let error = app
            .put(&template(&v1, "models"), &api.key, body.clone())
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param, "{body}");
    }
    let error = app
        .put(
            &format!("/api/v1/flows/{slug}"),
            &api.key,
            json!({"classifierModel": "nosuch/x"}),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "classifierModel");
    api.post(
        "/api/v1/routing-rules",
        json!({"alias": "team/fast", "models": ["openai/gpt-4o-mini"]}),
    )
    .await;
    api.put(
        &template(&v1, "models"),
        json!({"template": "x", "llm": "team/fast", "fallbacks": ["google"]}),
    )
    .await;
    assert_eq!(
        app.delete(&template(&v1, "models"), &api.key).await.status,
        204
    );
    // Templates nested deeper than rendering goes are refused when saved.
    for i in 0..=16 {
        api.put(
            &template(&v1, &format!("d{i}")),
            json!({"template": format!("[[d{}]]", i + 1)}),
        )
        .await;
    }
    let error = app
        .put(&template(&v1, "d17"), &api.key, json!({"template": "end"}))
        .await
        .error(400, "VALIDATION_ERROR");
    assert!(
        error["message"].as_str().unwrap().contains("nested"),
        "{error}"
    );
    for i in 0..=16 {
        app.delete(&template(&v1, &format!("d{i}")), &api.key).await;
    }

    // Parameters: the entrypoint's, with sub-templates named.
    let parameters = api.get(&format!("/api/v1/flows/{slug}/parameters")).await;
    let tokens: Vec<(&str, &str)> = parameters
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["token"].as_str().unwrap(), p["source"].as_str().unwrap()))
        .collect();
    for expected in [
        ("persona", "template"),
        ("tone", "template"),
        ("style", "template"),
        ("question", "userTemplate"),
    ] {
        assert!(tokens.contains(&expected), "{expected:?} in {tokens:?}");
    }
    let tone = parameters
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["token"] == "tone")
        .unwrap();
    // The sub-template it includes when no value is given, as an object.
    assert_eq!(tone["promptTemplate"]["name"], "tone", "{tone}");
    assert!(tone["promptTemplate"]["template"].is_string(), "{tone}");

    // A run needs an active version.
    app.post(
        &format!("/api/v1/flows/{slug}/runs"),
        &api.key,
        json!({"parameters": {}}),
    )
    .await
    .error(400, "VALIDATION_ERROR");

    // Activate v1 in staging: it becomes read-only.
    app.post(
        &format!("/api/v1/flows/{slug}/versions/{v1}/environments"),
        &api.key,
        json!({"environment": "nowhere"}),
    )
    .await
    .error(400, "VALIDATION_ERROR");
    let activated = api
        .post(
            &format!("/api/v1/flows/{slug}/versions/{v1}/environments"),
            json!({"environment": "staging", "comment": "first cut"}),
        )
        .await;
    assert_eq!(activated["status"], "Activated");
    assert_eq!(activated["activations"][0]["comment"], "first cut");
    assert!(
        activated["activations"][0]["activatedBy"]
            .as_str()
            .unwrap()
            .starts_with("apiKey:")
    );
    app.put(
        &template(&v1, "main"),
        &api.key,
        json!({"template": "changed"}),
    )
    .await
    .error(409, "VERSION_ACTIVATED");
    let refused_delete = app.delete(&template(&v1, "tone"), &api.key).await;
    refused_delete.error(409, "VERSION_ACTIVATED");
    // Activation changed the flow's activeVersions, so the flow was updated.
    let after = api.get(&format!("/api/v1/flows/{slug}")).await;
    let parse = |at: &Value| chrono::DateTime::parse_from_rfc3339(at.as_str().unwrap()).unwrap();
    assert!(
        parse(&after["updatedAt"]) > parse(&flow["updatedAt"]),
        "{after}"
    );

    // Fork, change, activate in production.
    let v2 = api
        .post(
            &format!("/api/v1/flows/{slug}/versions/{v1}/fork"),
            json!({}),
        )
        .await;
    assert_eq!(v2["status"], "Draft");
    assert_eq!(v2["number"], 2);
    let v2 = v2["id"].as_str().unwrap().to_string();
    api.put(
        &template(&v2, "main"),
        json!({"template": "You are [[persona]], version two.", "userTemplate": "[[question]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    api.post(
        &format!("/api/v1/flows/{slug}/versions/{v2}/environments"),
        json!({"environment": "production"}),
    )
    .await;
    let source = api
        .get(&format!("/api/v1/flows/{slug}/versions/{v1}"))
        .await;
    assert_eq!(
        source["templates"][0]["template"].as_str().unwrap(),
        "You are [[persona]] for Acme. // internal: keep it short\nDocs: https://docs.acme.example/help /* not for the model\nat all */ Tone: [[tone]].",
        "forking leaves the source unchanged"
    );

    // A run in each environment uses its pinned prompt.
    let parameters = json!({"persona": "a support agent", "question": "Where is my order?"});
    mock.push(Reply::text("It ships tomorrow.").with_usage(30, 6));
    let staging = api
        .run(
            slug,
            json!({"environment": "staging", "parameters": parameters, "tags": ["Team:support"]}),
        )
        .await;
    let sent = mock.received().pop().unwrap();
    let (system, user) = system_and_user(&sent.body);
    assert_eq!(
        system,
        "You are a support agent for Acme. \nDocs: https://docs.acme.example/help  Tone: friendly and [[style]]."
    );
    assert_eq!(user, "Where is my order?");
    assert_eq!(sent.body["temperature"], 0.3);
    assert_eq!(staging["versionId"], v1);
    assert_eq!(staging["environment"], "staging");
    assert_eq!(staging["templateName"], "main");
    assert_eq!(staging["flowName"], slug);
    assert_eq!(staging["status"], "Succeeded");
    assert_eq!(staging["output"]["text"], "It ships tomorrow.");
    assert_eq!(staging["servedModel"], "openai/gpt-4o-mini");
    assert_eq!(staging["fallbackUsed"], false);
    assert_eq!(staging["usage"]["tokensIn"], 30);
    assert!(staging["usage"]["costCredits"].as_i64().unwrap() > 0);
    assert_eq!(
        staging["usage"]["totalCreditsUsed"],
        staging["usage"]["costCredits"]
    );
    assert_eq!(
        staging["warnings"],
        json!([{"code": "UNRESOLVED_PARAMETER", "message": staging["warnings"][0]["message"], "parameter": "style"}])
    );

    mock.push(Reply::text("v2 answer"));
    let production = api
        .run(
            slug,
            // Names are read trimmed, as activation stores them.
            json!({"environment": " production ", "parameters": parameters}),
        )
        .await;
    let (system, _) = system_and_user(&mock.received().pop().unwrap().body);
    assert_eq!(system, "You are a support agent, version two.");
    assert_eq!(production["versionId"], v2);
    assert_eq!(production["environment"], "production");
    assert_eq!(production["warnings"], json!([]));

    // No environment given: the first one activated (staging).
    mock.push(Reply::text("default env"));
    let default = api.run(slug, json!({"parameters": parameters})).await;
    assert_eq!(default["environment"], "staging");

    // The run is in the log, with its flow and environment.
    // The log is written off the request path: it appears shortly after.
    let path = format!("/api/v1/runs/{}", staging["id"].as_str().unwrap());
    let mut run = Value::Null;
    for _ in 0..100 {
        let response = app.get(&path, &api.key).await;
        if response.status == 200 {
            run = response.json();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(run["flowName"], slug);
    assert_eq!(run["environment"], "staging");
    assert_eq!(run["kind"], "flow");
    assert_eq!(run["tags"], json!(["Team:support"]));

    // Diff, promote staging -> production, diff again.
    let diff_path =
        "/api/v1/environments/diff?sourceEnvironment=staging&targetEnvironment=production";
    let diff = api.get(diff_path).await;
    let row = diff
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["flowName"] == slug)
        .unwrap()
        .clone();
    assert_eq!(
        (
            row["sourceVersionId"].as_str(),
            row["targetVersionId"].as_str(),
            row["same"].as_bool()
        ),
        (Some(v1.as_str()), Some(v2.as_str()), Some(false))
    );
    let promoted = api
        .post(
            "/api/v1/environments/promote",
            json!({"sourceEnvironment": "staging", "targetEnvironment": "production", "comment": "roll back"}),
        )
        .await;
    assert_eq!(promoted[0]["versionId"], v1);
    let diff = api.get(diff_path).await;
    assert_eq!(diff[0]["same"], true);
    let flow = api.get(&format!("/api/v1/flows/{slug}")).await;
    assert_eq!(flow["activeVersions"]["production"], v1);
    mock.push(Reply::text("v1 again"));
    api.run(
        slug,
        json!({"environment": "production", "parameters": parameters}),
    )
    .await;
    let (system, _) = system_and_user(&mock.received().pop().unwrap().body);
    assert!(
        system.starts_with("You are a support agent for Acme."),
        "{system}"
    );
    let history = api
        .get(&format!("/api/v1/flows/{slug}/versions/{v1}"))
        .await;
    let environments: Vec<&str> = history["activations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["environment"].as_str().unwrap())
        .collect();
    assert_eq!(environments, ["staging", "production"]);
    // A flow named twice (by slug and by id) is promoted once.
    let id = flow["id"].as_str().unwrap();
    let promoted = api
        .post(
            "/api/v1/environments/promote",
            json!({"sourceEnvironment": "staging", "targetEnvironment": "production",
                   "flowIds": [slug, id]}),
        )
        .await;
    assert_eq!(promoted.as_array().unwrap().len(), 1, "{promoted}");
    let history = api
        .get(&format!("/api/v1/flows/{slug}/versions/{v1}"))
        .await;
    assert_eq!(history["activations"].as_array().unwrap().len(), 3);

    // Update the flow; soft delete removes it everywhere.
    let updated = api
        .put(
            &format!("/api/v1/flows/{slug}"),
            json!({"title": "Support"}),
        )
        .await;
    assert_eq!(updated["title"], "Support");
    assert_eq!(updated["name"], slug, "the slug is stable");
    assert_eq!(
        app.delete(&format!("/api/v1/flows/{slug}"), &api.key)
            .await
            .status,
        204
    );
    app.get(&format!("/api/v1/flows/{slug}"), &api.key)
        .await
        .error(404, "NOT_FOUND");
    app.post(
        &format!("/api/v1/flows/{slug}/runs"),
        &api.key,
        json!({"parameters": parameters}),
    )
    .await
    .error(404, "NOT_FOUND");
    let listed = api.get("/api/v1/flows").await;
    assert!(listed.as_array().unwrap().iter().all(|f| f["name"] != slug));
}

/// Sets up a flow whose version 1 holds `templates`, activated in `production`.
async fn activated_flow(api: &Api<'_>, title: &str, templates: Value) -> String {
    let flow = api.post("/api/v1/flows", json!({"title": title})).await;
    let slug = flow["name"].as_str().unwrap().to_string();
    let versions = api.get(&format!("/api/v1/flows/{slug}/versions")).await;
    let v1 = versions[0]["id"].as_str().unwrap().to_string();
    for (name, body) in templates.as_object().unwrap() {
        api.put(
            &format!("/api/v1/flows/{slug}/versions/{v1}/templates/{name}"),
            body.clone(),
        )
        .await;
    }
    api.post(
        &format!("/api/v1/flows/{slug}/versions/{v1}/environments"),
        json!({"environment": "production"}),
    )
    .await;
    slug
}

#[tokio::test]
async fn parameters_that_empty_the_prompt_are_named_and_nothing_is_called() {
    let (app, mock) = app_with_mock().await;
    let api = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    api.post("/api/v1/environments", json!({"name": "production"}))
        .await;
    let slug = activated_flow(
        &api,
        "Echo",
        json!({"main": {"template": "", "userTemplate": "[[x]]", "llm": "openai/gpt-4o-mini"}}),
    )
    .await;
    let refused = app
        .post(
            &format!("/api/v1/flows/{slug}/runs"),
            &api.key,
            json!({"parameters": {"x": " "}}),
        )
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(refused["param"], "parameters");
    assert!(mock.received().is_empty());
}

#[tokio::test]
async fn route_mode_lets_the_classifier_pick_a_described_template() {
    let (app, mock) = app_with_mock().await;
    let api = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    api.post("/api/v1/environments", json!({"name": "production"}))
        .await;
    let slug = activated_flow(
        &api,
        "Helpdesk",
        json!({
            "main": {"template": "General help.", "userTemplate": "[[question]]", "llm": "openai/gpt-4o-mini"},
            "billing": {"description": "Invoices, refunds and payments", "template": "You handle billing.", "userTemplate": "[[question]]", "llm": "openai/gpt-4o-mini"},
            "tech": {"description": "Bugs, errors and outages", "template": "You fix technical problems.", "userTemplate": "[[question]]", "llm": "anthropic/claude-haiku-4-5"}
        }),
    )
    .await;
    api.put(
        &format!("/api/v1/flows/{slug}"),
        json!({"executionMode": "route", "classifierModel": "openai/gpt-4o-mini"}),
    )
    .await;

    let before = mock.received().len();
    mock.push(Reply::text("tech").with_usage(50, 1));
    mock.push(Reply::text("Restart the router."));
    let run = api
        .run(
            &slug,
            json!({"parameters": {"question": "The app crashes on start"}}),
        )
        .await;
    assert_eq!(run["templateName"], "tech");
    assert_eq!(run["output"]["text"], "Restart the router.");
    assert_eq!(run["servedModel"], "anthropic/claude-haiku-4-5");
    let received = mock.received();
    assert_eq!(received.len(), before + 2);
    let classifier = &received[before].body;
    let menu = classifier["messages"][0]["content"].as_str().unwrap();
    assert!(
        menu.contains("billing: Invoices") && menu.contains("tech: Bugs"),
        "{menu}"
    );
    assert_eq!(
        classifier["messages"][1]["content"],
        "The app crashes on start"
    );
    assert_eq!(
        received[before + 1].body["system"],
        "You fix technical problems."
    );
    // The classifier's cost is part of the request's total.
    assert!(
        run["usage"]["totalCreditsUsed"].as_i64().unwrap()
            > run["usage"]["costCredits"].as_i64().unwrap()
    );

    // Models capitalise and punctuate their answer.
    mock.push(Reply::text("Tech."));
    mock.push(Reply::text("Reboot."));
    let run = api
        .run(&slug, json!({"parameters": {"question": "Error 500"}}))
        .await;
    assert_eq!(run["templateName"], "tech");

    // The classifier's model failing upstream does not fail the request: the entrypoint runs,
    // with a warning.
    mock.push(Reply::status(503, "overloaded"));
    mock.push(Reply::text("General answer."));
    let run = api
        .run(&slug, json!({"parameters": {"question": "Anything"}}))
        .await;
    assert_eq!(run["templateName"], "main", "{run}");
    assert_eq!(run["output"]["text"], "General answer.");
    assert_eq!(run["warnings"][0]["code"], "CLASSIFIER_FAILED", "{run}");

    // Input refused before the classifier is called: no call is made, no run is logged.
    let logged = || async {
        // Rows are written in the log writer's batch (100 ms).
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let page = app.get("/api/v1/llm-logs?pageSize=200", &api.key).await;
        page.json()["items"].as_array().unwrap().len()
    };
    let (calls_before, runs_before) = (mock.received().len(), logged().await);
    let runs = format!("/api/v1/flows/{slug}/runs");
    let parameters = json!({"question": "hi"});
    app.post(
        &runs,
        &api.key,
        json!({"parameters": parameters, "responseSchema": {"type": "bogus"}}),
    )
    .await
    .error(400, "VALIDATION_ERROR");
    app.post(
        &runs,
        &api.key,
        json!({"parameters": parameters, "overrideModel": "nosuch/x"}),
    )
    .await
    .error(404, "MODEL_NOT_FOUND");
    assert_eq!(mock.received().len(), calls_before, "no classifier call");
    assert_eq!(logged().await, runs_before, "refused requests log nothing");

    // A hard budget: the request that reaches it is refused after its classifier call (its
    // holds fill the budget); from then on the classifier is refused too, and never called.
    let budget = api
        .post(
            "/api/v1/budgets",
            json!({"name": "tiny", "period": "Day", "limitCredits": 1, "hardLimit": true}),
        )
        .await;
    app.post(&runs, &api.key, json!({"parameters": parameters}))
        .await
        .error(402, "BUDGET_EXCEEDED");
    logged().await;
    let calls_before = mock.received().len();
    for _ in 0..3 {
        app.post(&runs, &api.key, json!({"parameters": parameters}))
            .await
            .error(402, "BUDGET_EXCEEDED");
    }
    assert_eq!(mock.received().len(), calls_before, "no classifier call");
    let budget_path = format!("/api/v1/budgets/{}", budget["id"].as_str().unwrap());
    assert_eq!(app.delete(&budget_path, &api.key).await.status, 204);

    // A Route flow whose empty entrypoint only runs when the classifier names nothing can be
    // activated (a Direct one could never run, and cannot).
    let routed = api.post("/api/v1/flows", json!({"title": "Routed"})).await;
    let routed_slug = routed["name"].as_str().unwrap().to_string();
    api.put(
        &format!("/api/v1/flows/{routed_slug}"),
        json!({"executionMode": "Route", "classifierModel": "openai/gpt-4o-mini"}),
    )
    .await;
    let versions = api
        .get(&format!("/api/v1/flows/{routed_slug}/versions"))
        .await;
    let v1 = versions[0]["id"].as_str().unwrap().to_string();
    for name in ["alpha", "beta"] {
        api.put(
            &format!("/api/v1/flows/{routed_slug}/versions/{v1}/templates/{name}"),
            json!({"description": format!("{name} questions"), "template": name, "llm": "openai/gpt-4o-mini"}),
        )
        .await;
    }
    let activated = app
        .post(
            &format!("/api/v1/flows/{routed_slug}/versions/{v1}/environments"),
            &api.key,
            json!({"environment": "production"}),
        )
        .await;
    assert_eq!(activated.status, 200, "{}", activated.text);

    // With fewer than two described templates the entrypoint runs, no classifier call.
    let single = activated_flow(
        &api,
        "Single",
        json!({
            "main": {"template": "Only one.", "userTemplate": "[[question]]", "llm": "openai/gpt-4o-mini"},
            "other": {"description": "The only described one", "template": "Other.", "llm": "openai/gpt-4o-mini"}
        }),
    )
    .await;
    api.put(
        &format!("/api/v1/flows/{single}"),
        json!({"executionMode": "Route"}),
    )
    .await;
    let before = mock.received().len();
    let run = api
        .run(&single, json!({"parameters": {"question": "hi"}}))
        .await;
    assert_eq!(run["templateName"], "main");
    assert_eq!(mock.received().len(), before + 1);
}

#[tokio::test]
async fn runs_resolve_models_through_aliases_overrides_and_fallbacks() {
    let (app, mock) = app_with_mock().await;
    let api = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    api.post("/api/v1/environments", json!({"name": "production"}))
        .await;
    api.post(
        "/api/v1/routing-rules",
        json!({"alias": "smart", "models": ["anthropic/claude-haiku-4-5"]}),
    )
    .await;
    let slug = activated_flow(
        &api,
        "Resolver",
        json!({"main": {"template": "Be brief.", "userTemplate": "[[q]]", "llm": "smart",
                        "fallbacks": ["google/gemini-2.5-flash"],
                        "responseSchema": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}),
    )
    .await;
    let run = |body: Value| api.run(&slug, body);

    // The template's alias routes to Anthropic.
    mock.push(Reply::text(r#"{"answer": "yes"}"#));
    let out = run(json!({"parameters": {"q": "?"}})).await;
    assert_eq!(out["model"], "smart");
    assert_eq!(out["servedModel"], "anthropic/claude-haiku-4-5");
    assert_eq!(out["output"]["json"], json!({"answer": "yes"}));
    assert_eq!(mock.received().pop().unwrap().path, "/v1/messages");

    // The template's fallbacks follow when the alias's model fails.
    mock.push(Reply::status(503, "overloaded"));
    mock.push(Reply::text(r#"{"answer": "from gemini"}"#));
    let out = run(json!({"parameters": {"q": "?"}})).await;
    assert_eq!(out["fallbackUsed"], true);
    assert_eq!(out["servedModel"], "google/gemini-2.5-flash");

    // overrideModel wins over the template's llm; responseSchema in the body wins too.
    mock.push(Reply::text(r#"{"n": 1}"#));
    let out = run(
        json!({"parameters": {"q": "?"}, "overrideModel": "openai/gpt-4o-mini",
                         "responseSchema": {"type": "object", "required": ["n"]}}),
    )
    .await;
    assert_eq!(out["servedModel"], "openai/gpt-4o-mini");
    assert_eq!(out["output"]["json"], json!({"n": 1}));

    // Bad input names the field and changes nothing.
    let calls = mock.received().len();
    for (body, param) in [
        (json!({"overrideModel": "Bad Model"}), "overrideModel"),
        (json!({"vendorTools": ["telepathy"]}), "vendorTools[0]"),
        (json!({"environment": "staging"}), "environment"),
        (
            json!({"tags": (0..21).map(|i| format!("K{i}:v")).collect::<Vec<_>>()}),
            "tags",
        ),
    ] {
        let error = app
            .post(
                &format!("/api/v1/flows/{slug}/runs"),
                &api.key,
                body.clone(),
            )
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param, "{body}");
    }
    assert_eq!(mock.received().len(), calls);
}

#[tokio::test]
async fn flow_runs_stream_the_events_format() {
    let (app, mock) = app_with_mock().await;
    let api = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    api.post("/api/v1/environments", json!({"name": "production"}))
        .await;
    let slug = activated_flow(
        &api,
        "Streamer",
        json!({"main": {"template": "Be brief.", "userTemplate": "[[q]]", "llm": "openai/gpt-4o-mini"}}),
    )
    .await;
    mock.push(Reply::text("streamed flow answer"));
    let response = app
        .post(
            &format!("/api/v1/flows/{slug}/runs"),
            &api.key,
            json!({"parameters": {"q": "hi"}, "stream": true}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let events: Vec<Value> = response
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.first(), Some(&"requestStarted"));
    assert!(types.contains(&"contentDelta"));
    assert_eq!(types.last(), Some(&"requestCompleted"));
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "contentDelta")
        .filter_map(|e| e["data"]["text"].as_str())
        .collect();
    assert_eq!(text, "streamed flow answer");
}

#[tokio::test]
async fn export_from_one_tenant_imports_into_another_and_runs_there() {
    let (app, mock) = app_with_mock().await;
    let a = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    a.post("/api/v1/environments", json!({"name": "production"}))
        .await;
    let slug = activated_flow(
        &a,
        "Exported Flow",
        json!({"main": {"template": "Exported prompt about [[topic]].", "userTemplate": "[[q]]", "llm": "openai/gpt-4o-mini"},
               "extra": {"description": "kept too", "template": "Extra."}}),
    )
    .await;
    let document = a.get("/api/v1/export").await;
    assert_eq!(document["format"], 1);
    let exported = &document["flows"][0];
    assert_eq!(exported["name"], slug);
    assert_eq!(
        exported["versions"][0]["templates"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        exported["versions"][0]["activations"][0]["environment"],
        "production"
    );

    let tenant_b = app.create_tenant("tenant-b").await;
    let b = Api {
        app: &app,
        key: tenant_b.api_key.clone(),
    };
    let report = b.post("/api/v1/export/import", document.clone()).await;
    assert_eq!(report["flowsCreated"], json!([slug]));
    assert_eq!(report["environmentsCreated"], json!(["production"]));
    mock.push(Reply::text("imported answer"));
    let run = b
        .run(&slug, json!({"parameters": {"topic": "cats", "q": "hi"}}))
        .await;
    assert_eq!(run["environment"], "production");
    assert_eq!(run["output"]["text"], "imported answer");
    let (system, _) = system_and_user(&mock.received().pop().unwrap().body);
    assert_eq!(system, "Exported prompt about cats.");
    // The replayed activation is the importer's, in the usual form.
    let imported = b.get(&format!("/api/v1/flows/{slug}/versions")).await;
    let by = imported[0]["activations"][0]["activatedBy"]
        .as_str()
        .unwrap();
    assert!(by.starts_with("apiKey:") && !by.contains(' '), "{by}");

    // A second import skips what exists and changes nothing.
    let again = b.post("/api/v1/export/import", document.clone()).await;
    assert_eq!(again["flowsCreated"], json!([]));
    assert_eq!(again["flowsSkipped"], json!([slug]));
    assert_eq!(b.get("/api/v1/flows").await.as_array().unwrap().len(), 1);

    // A broken document is refused whole, naming the field.
    let mut broken = document.clone();
    broken["flows"][0]["name"] = json!("Not A Slug");
    let error = app
        .post("/api/v1/export/import", &tenant_b.api_key, broken)
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "flows[0].name");
    // So is one that saving and activating would refuse (a model no run can resolve, an
    // activated entrypoint that renders to nothing, an over-long activation comment).
    let main = exported["versions"][0]["templates"]
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t["name"] == "main")
        .unwrap();
    let renamed = |document: &Value| {
        let mut copy = document.clone();
        copy["flows"][0]["name"] = json!("renamed");
        copy
    };
    let mut bad_model = renamed(&document);
    bad_model["flows"][0]["versions"][0]["templates"][main]["llm"] = json!("nope/x");
    let mut empty = renamed(&document);
    empty["flows"][0]["versions"][0]["templates"][main]["template"] = json!("");
    empty["flows"][0]["versions"][0]["templates"][main]["userTemplate"] = Value::Null;
    let mut long_comment = renamed(&document);
    long_comment["flows"][0]["versions"][0]["activations"][0]["comment"] = json!("x".repeat(2_001));
    let mut hot = renamed(&document);
    hot["flows"][0]["versions"][0]["templates"][main]["temperature"] = json!(9);
    let mut bad_schema = renamed(&document);
    bad_schema["flows"][0]["versions"][0]["templates"][main]["responseSchema"] =
        json!({"type": "bogus"});
    let mut unknown_tool = renamed(&document);
    unknown_tool["flows"][0]["versions"][0]["templates"][main]["toolIds"] = json!(["nonexistent"]);
    // Two versions numbered alike (the second flow of the document is refused, and the first,
    // valid one is not written either: the document is checked whole first).
    let mut twins = renamed(&document);
    let mut second = twins["flows"][0].clone();
    second["name"] = json!("twins");
    let version = second["versions"][0].clone();
    second["versions"] = json!([version.clone(), version]);
    twins["flows"].as_array_mut().unwrap().push(second);
    twins["flows"][0]["versions"][0]["activations"][0]["environment"] = json!("brand-new");
    // A slug that is another flow's id would answer to that flow.
    let mut id_slug = renamed(&document);
    id_slug["flows"][0]["name"] = json!(b.get("/api/v1/flows").await[0]["id"].clone());
    for (refused, param) in [
        (
            hot,
            format!("flows[0].versions[0].templates[{main}].temperature"),
        ),
        (
            bad_schema,
            format!("flows[0].versions[0].templates[{main}].responseSchema"),
        ),
        (
            unknown_tool,
            format!("flows[0].versions[0].templates[{main}].toolIds[0]"),
        ),
        (twins, "flows[1].versions[1].number".to_string()),
        (id_slug, "flows[0].name".to_string()),
        (
            bad_model,
            format!("flows[0].versions[0].templates[{main}].llm"),
        ),
        (empty, "flows[0].versions[0]".to_string()),
        (
            long_comment,
            "flows[0].versions[0].activations[0].comment".to_string(),
        ),
    ] {
        let error = app
            .post("/api/v1/export/import", &tenant_b.api_key, refused)
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(error["param"], param.as_str());
    }
    assert_eq!(b.get("/api/v1/flows").await.as_array().unwrap().len(), 1);
    let environments = b.get("/api/v1/environments").await;
    assert!(
        !environments.to_string().contains("brand-new"),
        "a refused import creates no environment: {environments}"
    );
}

/// An exported Agent tool names its flow by the exporting tenant's id: importing the document
/// points it at the imported flow (by slug); importing the tool without its flow, or naming
/// another tenant's flow, is refused naming the field, and nothing is imported.
#[tokio::test]
async fn imported_agent_tools_point_at_imported_flows_never_at_another_tenants() {
    let (app, _mock) = app_with_mock().await;
    let a = Api {
        app: &app,
        key: app.default_tenant.api_key.clone(),
    };
    a.post("/api/v1/environments", json!({"name": "production"}))
        .await;
    let slug = activated_flow(
        &a,
        "Researcher",
        json!({"main": {"template": "Research [[input]].", "llm": "openai/gpt-4o-mini"}}),
    )
    .await;
    let flow_id = a.get(&format!("/api/v1/flows/{slug}")).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    a.post(
        "/api/v1/tools",
        json!({"name": "researcher", "toolType": "Agent", "agentTemplateId": flow_id,
               "description": "Ask the researcher"}),
    )
    .await;
    let document = a.get("/api/v1/export").await;
    assert_eq!(document["flows"][0]["id"], flow_id.as_str());

    let tenant_b = app.create_tenant("tenant-b").await;
    let b = Api {
        app: &app,
        key: tenant_b.api_key.clone(),
    };
    let report = b.post("/api/v1/export/import", document.clone()).await;
    assert_eq!(report["toolsCreated"], json!(["researcher"]));
    let tools = b.get("/api/v1/tools").await;
    assert_eq!(
        tools[0]["agentTemplateId"],
        slug.as_str(),
        "the imported flow"
    );

    // The tool without its flow: A's flow id means nothing in C.
    let tenant_c = app.create_tenant("tenant-c").await;
    let mut tools_only = document;
    tools_only["flows"] = json!([]);
    let error = app
        .post("/api/v1/export/import", &tenant_c.api_key, tools_only)
        .await
        .error(400, "VALIDATION_ERROR");
    assert_eq!(error["param"], "tools[0].agentTemplateId");
    let c = Api {
        app: &app,
        key: tenant_c.api_key.clone(),
    };
    assert_eq!(c.get("/api/v1/tools").await, json!([]), "nothing imported");
}
