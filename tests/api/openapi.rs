use std::path::PathBuf;

use crate::helpers::{openapi_doc, routes, spawn_app};

/// Every route this part of Baton serves; a route missing from the document fails here.
const EXPECTED: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/api/v1/openapi.json"),
    ("POST", "/api/v1/auth/login"),
    ("GET", "/api/v1/api-keys"),
    ("POST", "/api/v1/api-keys"),
    ("GET", "/api/v1/api-keys/{id}"),
    ("DELETE", "/api/v1/api-keys/{id}"),
    ("GET", "/api/v1/users"),
    ("POST", "/api/v1/users"),
    ("GET", "/api/v1/users/{id}"),
    ("DELETE", "/api/v1/users/{id}"),
    ("PUT", "/api/v1/users/{id}/password"),
    ("GET", "/api/v1/environments"),
    ("POST", "/api/v1/environments"),
    ("GET", "/api/v1/settings"),
    ("PUT", "/api/v1/settings"),
    ("GET", "/api/v1/customers"),
    ("POST", "/api/v1/customers"),
    ("GET", "/api/v1/customers/{externalId}"),
    ("PUT", "/api/v1/customers/{externalId}"),
    ("DELETE", "/api/v1/customers/{externalId}"),
    ("POST", "/api/v1/customers/{externalId}/deactivate"),
    ("GET", "/api/v1/models/descriptors"),
    ("GET", "/api/v1/providers"),
    ("POST", "/api/v1/chat/completions"),
    ("POST", "/api/v1/inference"),
    ("GET", "/api/v1/routing-rules"),
    ("POST", "/api/v1/routing-rules"),
    ("GET", "/api/v1/routing-rules/{id}"),
    ("PUT", "/api/v1/routing-rules/{id}"),
    ("DELETE", "/api/v1/routing-rules/{id}"),
    ("POST", "/api/v1/runs/{runId}/cancel"),
    ("GET", "/api/v1/tools"),
    ("POST", "/api/v1/tools"),
    ("GET", "/api/v1/tools/{id}"),
    ("PUT", "/api/v1/tools/{id}"),
    ("DELETE", "/api/v1/tools/{id}"),
    ("GET", "/api/v1/tools/{id}/usage"),
    ("GET", "/api/v1/mcp-servers"),
    ("POST", "/api/v1/mcp-servers"),
    ("GET", "/api/v1/mcp-servers/{id}"),
    ("PUT", "/api/v1/mcp-servers/{id}"),
    ("DELETE", "/api/v1/mcp-servers/{id}"),
    ("POST", "/api/v1/mcp-servers/{id}/discover"),
    ("POST", "/api/v1/mcp-servers/{id}/import"),
    ("GET", "/api/v1/environments/diff"),
    ("POST", "/api/v1/environments/promote"),
    ("GET", "/api/v1/flows"),
    ("POST", "/api/v1/flows"),
    ("GET", "/api/v1/flows/{flowId}"),
    ("PUT", "/api/v1/flows/{flowId}"),
    ("DELETE", "/api/v1/flows/{flowId}"),
    ("GET", "/api/v1/flows/{flowId}/versions"),
    ("POST", "/api/v1/flows/{flowId}/versions"),
    ("GET", "/api/v1/flows/{flowId}/versions/{versionId}"),
    ("POST", "/api/v1/flows/{flowId}/versions/{versionId}/fork"),
    (
        "POST",
        "/api/v1/flows/{flowId}/versions/{versionId}/environments",
    ),
    (
        "GET",
        "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}",
    ),
    (
        "PUT",
        "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}",
    ),
    (
        "DELETE",
        "/api/v1/flows/{flowId}/versions/{versionId}/templates/{name}",
    ),
    ("GET", "/api/v1/flows/{flowId}/parameters"),
    ("POST", "/api/v1/flows/{flowId}/runs"),
    ("GET", "/api/v1/runs/{runId}"),
    ("GET", "/api/v1/export"),
    ("POST", "/api/v1/export/import"),
];

#[tokio::test]
async fn the_document_lists_every_route_and_every_listed_route_exists() {
    let app = spawn_app().await;
    let doc = openapi_doc(&app).await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let documented: Vec<(String, String)> = routes(&doc)
        .into_iter()
        .map(|(m, p, _)| (m.to_string(), p))
        .collect();
    for (method, path) in EXPECTED {
        assert!(
            documented.iter().any(|(m, p)| m == method && p == path),
            "{method} {path} is served but missing from the OpenAPI document"
        );
    }
    // Every authenticated operation documents load shedding's 503; public ones are never shed.
    for (method, path, needs_auth) in routes(&doc) {
        let operation = &doc["paths"][&path][method.as_str().to_lowercase()];
        let documented = &operation["responses"]["503"]["$ref"];
        if needs_auth {
            assert_eq!(
                documented, "#/components/responses/Overloaded",
                "{method} {path}"
            );
        } else {
            assert!(documented.is_null(), "{method} {path} is never shed");
        }
    }
    assert_eq!(
        doc["components"]["responses"]["Overloaded"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ErrorResponse"
    );
    // And nothing documented is missing from the router (405/404 from the router means absent).
    for (method, path) in &documented {
        let concrete = path.replace('{', "x").replace('}', "");
        let response = app
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                &concrete,
                None,
                None,
            )
            .await;
        assert_ne!(
            response.status, 405,
            "{method} {path} is documented but not routed"
        );
        if response.status == 404 {
            assert_ne!(
                response.json()["error"]["message"],
                "no such route",
                "{method} {path} is documented but not routed"
            );
        }
    }
}

/// `docs/openapi.json` is the committed copy; `cargo xtask openapi` rewrites it.
#[test]
fn openapi_document_is_current() {
    let generated = baton_api::openapi().to_pretty_json().unwrap() + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    if std::env::var_os("BATON_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is stale: run `cargo xtask openapi`"
    );
}
