//! Tenant B must never see or touch tenant A's data. The matrix walks every route of the OpenAPI
//! document, so a route added later without a fixture here fails this test.

use std::collections::HashMap;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{openapi_doc, routes, spawn_app};

#[tokio::test]
async fn another_tenants_ids_are_not_found_and_lists_never_show_them() {
    let app = spawn_app().await;
    let a = app.create_tenant("tenant-a").await;
    let b = app.create_tenant("tenant-b").await;
    let a_session = app.session_for(&a).await;
    let b_session = app.session_for(&b).await;

    // Tenant A's data, with markers that must never appear in B's responses.
    let marker = "a-private-marker";
    let customer = app
        .post(
            "/api/v1/customers",
            &a.api_key,
            json!({"externalId": format!("{marker}-customer"), "name": format!("{marker} name"), "email": "a@a.example.com"}),
        )
        .await;
    assert_eq!(customer.status, 201, "{}", customer.text);
    let env = app
        .post(
            "/api/v1/environments",
            &a.api_key,
            json!({"name": format!("{marker}-env")}),
        )
        .await;
    assert_eq!(env.status, 201);
    let a_key = app
        .post(
            "/api/v1/api-keys",
            &a_session,
            json!({"name": format!("{marker}-key")}),
        )
        .await
        .json();
    let a_key_id = a_key["id"].as_str().unwrap().to_string();
    let a_user = app
        .post(
            "/api/v1/users",
            &a_session,
            json!({"email": format!("{marker}-user@a.example.com"), "password": "a's password"}),
        )
        .await;
    assert_eq!(a_user.status, 201, "{}", a_user.text);
    let a_user_id = a_user.json()["id"].as_str().unwrap().to_string();
    let settings = app
        .put("/api/v1/settings", &a.api_key, json!({"callbackOrigins": ["https://a-private-marker.example.com"], "defaultModel": format!("openai/{marker}")}))
        .await;
    assert_eq!(settings.status, 200, "{}", settings.text);

    let rule = app
        .post(
            "/api/v1/routing-rules",
            &a.api_key,
            json!({"alias": format!("{marker}-alias"), "models": ["openai/gpt-4o-mini"], "description": format!("{marker} rule")}),
        )
        .await;
    assert_eq!(rule.status, 201, "{}", rule.text);
    let rule_id = rule.json()["id"].as_str().unwrap().to_string();

    let tool = app
        .post(
            "/api/v1/tools",
            &a.api_key,
            json!({"name": format!("{marker}-tool"), "toolType": "External",
                   "webUrl": "https://a-private-marker.example.com/tool",
                   "headers": {"X-Key": format!("{marker}-tool-header")}}),
        )
        .await;
    assert_eq!(tool.status, 201, "{}", tool.text);
    let tool_id = tool.json()["id"].as_str().unwrap().to_string();
    let server = app
        .post(
            "/api/v1/mcp-servers",
            &a.api_key,
            json!({"name": format!("{marker} mcp"), "url": "https://a-private-marker.example.com/mcp"}),
        )
        .await;
    assert_eq!(server.status, 201, "{}", server.text);
    let server_id = server.json()["id"].as_str().unwrap().to_string();

    let flow = app
        .post(
            "/api/v1/flows",
            &a.api_key,
            json!({"title": format!("{marker} flow")}),
        )
        .await;
    assert_eq!(flow.status, 201, "{}", flow.text);
    let flow_id = flow.json()["id"].as_str().unwrap().to_string();
    let versions = app
        .get(&format!("/api/v1/flows/{flow_id}/versions"), &a.api_key)
        .await
        .json();
    let version_id = versions[0]["id"].as_str().unwrap().to_string();
    let template = app
        .put(
            &format!("/api/v1/flows/{flow_id}/versions/{version_id}/templates/main"),
            &a.api_key,
            json!({"template": format!("{marker} prompt"), "toolIds": [tool_id]}),
        )
        .await;
    assert_eq!(template.status, 200, "{}", template.text);
    let run_id = uuid::Uuid::now_v7().to_string();
    let mut run = baton_store::runs::new_record(
        run_id.clone(),
        baton_store::TenantId::new(a.id.clone()),
        baton_domain::run::RunKind::Chat,
        format!("openai/{marker}-run"),
    );
    run.tags = vec![format!("Marker:{marker}-tag")];
    // Usage reports would show A's customer if they leaked.
    run.customer_external_id = Some(format!("{marker}-customer"));
    run.cost_credits = 7;
    run.status = baton_domain::run::RunStatus::Succeeded;
    run.flow_name = Some(format!("{marker}-flow"));
    run.served_model = Some(format!("openai/{marker}-run"));
    app.store.write_runs(&[run], &[]).await.unwrap();

    let budget = app
        .post(
            "/api/v1/budgets",
            &a.api_key,
            json!({"name": format!("{marker} budget"), "period": "Day", "limitCredits": 1000,
                   "customerId": format!("{marker}-customer")}),
        )
        .await;
    assert_eq!(budget.status, 201, "{}", budget.text);
    let budget_id = budget.json()["id"].as_str().unwrap().to_string();

    let before = snapshot(&app, &a.api_key, &a_session, &a_key_id, marker).await;
    // B deleting or changing the password of A's user would end this session.
    let a_user_session = app
        .request(
            Method::POST,
            "/api/v1/auth/login",
            None,
            Some(json!({"email": format!("{marker}-user@a.example.com"), "password": "a's password"})),
        )
        .await
        .json()["accessToken"]
        .as_str()
        .unwrap()
        .to_string();

    // Every templated path, filled with A's ids.
    let fixtures: HashMap<&str, String> = HashMap::from([
        (
            "/api/v1/api-keys/{id}",
            format!("/api/v1/api-keys/{a_key_id}"),
        ),
        ("/api/v1/users/{id}", format!("/api/v1/users/{a_user_id}")),
        (
            "/api/v1/users/{id}/password",
            format!("/api/v1/users/{a_user_id}/password"),
        ),
        (
            "/api/v1/customers/{externalId}",
            format!("/api/v1/customers/{marker}-customer"),
        ),
        (
            "/api/v1/customers/{externalId}/deactivate",
            format!("/api/v1/customers/{marker}-customer/deactivate"),
        ),
        (
            "/api/v1/customers/{externalId}/usage",
            format!("/api/v1/customers/{marker}-customer/usage"),
        ),
        (
            "/api/v1/routing-rules/{id}",
            format!("/api/v1/routing-rules/{rule_id}"),
        ),
        ("/api/v1/flows/{flowId}", format!("/api/v1/flows/{flow_id}")),
        (
            "/api/v1/flows/{flowId}/versions",
            format!("/api/v1/flows/{flow_id}/versions"),
        ),
        (
            "/api/v1/flows/{flowId}/versions/{versionId}",
            format!("/api/v1/flows/{flow_id}/versions/{version_id}"),
        ),
        (
            "/api/v1/flows/{flowId}/versions/{versionId}/fork",
            format!("/api/v1/flows/{flow_id}/versions/{version_id}/fork"),
        ),
        (
            "/api/v1/flows/{flowId}/versions/{versionId}/environments",
            format!("/api/v1/flows/{flow_id}/versions/{version_id}/environments"),
        ),
        (
            "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}",
            format!("/api/v1/flows/{flow_id}/versions/{version_id}/templates/main"),
        ),
        (
            "/api/v1/flows/{flowId}/parameters",
            format!("/api/v1/flows/{flow_id}/parameters"),
        ),
        (
            "/api/v1/flows/{flowId}/runs",
            format!("/api/v1/flows/{flow_id}/runs"),
        ),
        ("/api/v1/runs/{runId}", format!("/api/v1/runs/{run_id}")),
        // The catalogue is the platform's, the same for every tenant: nothing of A's to find.
        (
            "/api/v1/models/{model}",
            "/api/v1/models/openai%2Fb-unknown".to_string(),
        ),
        (
            "/api/v1/models/{provider}/{model}",
            "/api/v1/models/openai/b-unknown".to_string(),
        ),
        (
            "/api/v1/runs/{runId}/cancel",
            format!("/api/v1/runs/{run_id}/cancel"),
        ),
        (
            "/api/v1/llm-logs/{id}",
            format!("/api/v1/llm-logs/{run_id}"),
        ),
        (
            "/api/v1/llm-logs/{id}/hierarchy",
            format!("/api/v1/llm-logs/{run_id}/hierarchy"),
        ),
        (
            "/api/v1/llm-logs/{id}/events",
            format!("/api/v1/llm-logs/{run_id}/events"),
        ),
        (
            "/api/v1/llm-logs/{id}/events/stats",
            format!("/api/v1/llm-logs/{run_id}/events/stats"),
        ),
        (
            "/api/v1/llm-logs/{id}/log-entries",
            format!("/api/v1/llm-logs/{run_id}/log-entries"),
        ),
        ("/api/v1/tools/{id}", format!("/api/v1/tools/{tool_id}")),
        (
            "/api/v1/budgets/{id}",
            format!("/api/v1/budgets/{budget_id}"),
        ),
        (
            "/api/v1/statistics/flow/{flowName}",
            format!("/api/v1/statistics/flow/{marker}-flow"),
        ),
        (
            "/api/v1/statistics/flow/{flowName}/request",
            format!("/api/v1/statistics/flow/{marker}-flow/request"),
        ),
        (
            "/api/v1/statistics/flow/{flowName}/tree",
            format!("/api/v1/statistics/flow/{marker}-flow/tree"),
        ),
        (
            "/api/v1/statistics/flow/{flowName}/extended",
            format!("/api/v1/statistics/flow/{marker}-flow/extended"),
        ),
        (
            "/api/v1/tools/{id}/usage",
            format!("/api/v1/tools/{tool_id}/usage"),
        ),
        (
            "/api/v1/mcp-servers/{id}",
            format!("/api/v1/mcp-servers/{server_id}"),
        ),
        (
            "/api/v1/mcp-servers/{id}/discover",
            format!("/api/v1/mcp-servers/{server_id}/discover"),
        ),
        (
            "/api/v1/mcp-servers/{id}/import",
            format!("/api/v1/mcp-servers/{server_id}/import"),
        ),
    ]);
    // Bodies that pass validation, so that the tenant check is what answers.
    let valid_bodies: HashMap<&str, Value> = HashMap::from([
        (
            "/api/v1/routing-rules/{id}",
            json!({"alias": "b-alias", "models": ["openai/gpt-4o-mini"]}),
        ),
        (
            "/api/v1/flows/{flowId}/versions/{versionId}/environments",
            json!({"environment": "b-env"}),
        ),
        (
            "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}",
            json!({"template": "b prompt"}),
        ),
        (
            "/api/v1/tools/{id}",
            json!({"name": "b-tool", "toolType": "External", "webUrl": "https://b.example.com/t"}),
        ),
        (
            "/api/v1/mcp-servers/{id}",
            json!({"name": "b mcp", "url": "https://b.example.com/mcp"}),
        ),
        (
            "/api/v1/mcp-servers/{id}/import",
            json!({"toolNames": ["x"]}),
        ),
        (
            "/api/v1/users/{id}/password",
            json!({"password": "b's new password"}),
        ),
        (
            "/api/v1/budgets/{id}",
            json!({"name": "b budget", "period": "Day", "limitCredits": 1}),
        ),
    ]);
    let b_env = app
        .post("/api/v1/environments", &b.api_key, json!({"name": "b-env"}))
        .await;
    assert_eq!(b_env.status, 201);
    let doc = openapi_doc(&app).await;
    // Ids B sent in the URL may be echoed in B's own 404; everything else of A's must not appear.
    let secrets = [
        "a-private-marker name",
        "a@a.example.com",
        "a-private-marker-env",
        "a-private-marker-key",
        "a-private-marker-user",
        "a-private-marker.example.com",
        "openai/a-private-marker",
        "a-private-marker-alias",
        "a-private-marker rule",
        "a-private-marker flow",
        "a-private-marker-flow",
        "a-private-marker prompt",
        "a-private-marker-run",
        "a-private-marker-tag",
        "a-private-marker-tool",
        "a-private-marker mcp",
        "a-private-marker budget",
        budget_id.as_str(),
        flow_id.as_str(),
        tool_id.as_str(),
        server_id.as_str(),
        version_id.as_str(),
        a.id.as_str(),
        a_key_id.as_str(),
        a_user_id.as_str(),
    ];
    let mut checked = 0;
    for (method, path, needs_auth) in routes(&doc) {
        if !needs_auth {
            continue;
        }
        let concrete = if path.contains('{') {
            fixtures
                .get(path.as_str())
                .unwrap_or_else(|| {
                    panic!("{method} {path} has no cross-tenant fixture: add one here")
                })
                .clone()
        } else if method == Method::GET {
            match path.as_str() {
                // Required query parameters, naming B's own environment.
                "/api/v1/environments/diff" => {
                    format!("{path}?sourceEnvironment=b-env&targetEnvironment=b-env")
                }
                // A's exact tag and a prefix of it: B's reports must still be empty.
                "/api/v1/statistics/tag-costs" => format!("{path}?tag=Marker:{marker}-tag"),
                "/api/v1/statistics/tag-costs/by-key" => format!("{path}?prefix=Marker:"),
                _ => path.clone(),
            }
        } else {
            // Creating under B's own tenant cannot touch A; the GET of each list checks leaks.
            continue;
        };
        let body = matches!(method, Method::POST | Method::PUT).then(|| {
            valid_bodies
                .get(path.as_str())
                .cloned()
                .unwrap_or_else(|| json!({}))
        });
        let mut response = app
            .request(method.clone(), &concrete, Some(&b.api_key), body.clone())
            .await;
        if response.status == 403 {
            response = app
                .request(method.clone(), &concrete, Some(&b_session), body)
                .await;
        }
        if path.starts_with("/api/v1/models/{") {
            response.error(404, "MODEL_NOT_FOUND");
        } else if path.contains('{') {
            response.error(404, "NOT_FOUND");
        } else {
            assert_eq!(
                response.status, 200,
                "{method} {concrete}: {}",
                response.text
            );
        }
        for secret in secrets.iter().filter(|s| !concrete.contains(**s)) {
            assert!(
                !response.text.contains(secret),
                "{method} {concrete} leaked {secret}: {}",
                response.text
            );
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} routes checked");

    // Nothing of A's changed.
    assert_eq!(
        snapshot(&app, &a.api_key, &a_session, &a_key_id, marker).await,
        before
    );
    assert_eq!(
        app.get("/api/v1/api-keys", &a_session)
            .await
            .json()
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["revokedAt"].is_null())
            .count(),
        2
    );
    let _: Value = app.get("/api/v1/customers", &a.api_key).await.json();
    // A's user still exists with its password and its session.
    assert_eq!(app.get("/api/v1/users", &a_user_session).await.status, 200);
}

/// Everything of A's that B's requests could have changed.
async fn snapshot(
    app: &crate::helpers::TestApp,
    key: &str,
    session: &str,
    key_id: &str,
    marker: &str,
) -> Vec<String> {
    vec![
        app.get(&format!("/api/v1/customers/{marker}-customer"), key)
            .await
            .text,
        app.get("/api/v1/environments", key).await.text,
        app.get(&format!("/api/v1/api-keys/{key_id}"), session)
            .await
            .text,
        app.get("/api/v1/users", session).await.text,
        app.get("/api/v1/settings", key).await.text,
        app.get("/api/v1/routing-rules", key).await.text,
        app.get("/api/v1/flows", key).await.text,
        app.get("/api/v1/tools", key).await.text,
        app.get("/api/v1/mcp-servers", key).await.text,
        app.get("/api/v1/budgets", key).await.text,
    ]
}
