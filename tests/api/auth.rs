use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::Method;
use serde_json::json;

use crate::helpers::{LOGIN_ATTEMPTS_PER_MINUTE, TEST_JWT_SECRET, openapi_doc, routes, spawn_app};

#[tokio::test]
async fn every_protected_route_needs_credentials() {
    let app = spawn_app().await;
    let doc = openapi_doc(&app).await;
    let routes = routes(&doc);
    assert!(
        routes.iter().filter(|r| r.2).count() >= 10,
        "too few protected routes: {routes:?}"
    );
    for (method, path, needs_auth) in routes {
        let concrete = path.replace('{', "x").replace('}', "");
        let response = app
            .request(method.clone(), &concrete, None, Some(json!({})))
            .await;
        if needs_auth {
            response.error(401, "UNAUTHORIZED");
            assert_eq!(response.headers["www-authenticate"], "Bearer");
        } else {
            assert_ne!(
                response.status, 401,
                "{method} {path} is documented as public"
            );
        }
    }
}

#[tokio::test]
async fn bad_credentials_are_401_never_500() {
    let app = spawn_app().await;
    let now = jsonwebtoken::get_current_timestamp();
    let tenant = &app.default_tenant;
    let sign = |claims: serde_json::Value, secret: &str, alg: Algorithm| {
        encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let claims = |exp: u64| json!({"sub": "u", "tid": tenant.id, "iss": "baton", "aud": "baton-api", "iat": now - 10, "exp": exp});
    let expired = sign(claims(now - 3600), TEST_JWT_SECRET, Algorithm::HS256);
    let forged = sign(
        claims(now + 3600),
        "another-secret-another-secret-another-secret",
        Algorithm::HS256,
    );
    let wrong_alg = sign(claims(now + 3600), TEST_JWT_SECRET, Algorithm::HS384);
    let wrong_audience = sign(
        json!({"sub": "u", "tid": tenant.id, "iss": "baton", "aud": "other", "iat": now, "exp": now + 3600}),
        TEST_JWT_SECRET,
        Algorithm::HS256,
    );
    let huge = "a".repeat(16 * 1024);
    let headers = [
        "garbage".to_string(),
        "Bearer".to_string(),
        "Bearer ".to_string(),
        "Basic dXNlcjpwYXNz".to_string(),
        "Bearer ' OR '1'='1".to_string(),
        "Bearer baton_' OR '1'='1".to_string(),
        format!("Bearer {huge}"),
        format!("Bearer baton_{huge}"),
        format!("Bearer {}x", tenant.api_key),
        format!("Bearer {expired}"),
        format!("Bearer {forged}"),
        format!("Bearer {wrong_alg}"),
        format!("Bearer {wrong_audience}"),
    ];
    for header in headers {
        let response = crate::helpers::send(
            app.client
                .get(app.url("/api/v1/environments"))
                .header("authorization", &header),
        )
        .await;
        response.error(401, "UNAUTHORIZED");
    }
    // The genuine key works, with any capitalisation of the scheme.
    let ok = crate::helpers::send(
        app.client
            .get(app.url("/api/v1/environments"))
            .header("authorization", format!("bearer {}", tenant.api_key)),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
}

#[tokio::test]
async fn login_issues_a_session_token_and_is_rate_limited() {
    let app = spawn_app().await;
    let token = app.session_for(&app.default_tenant).await;
    let response = app.get("/api/v1/environments", &token).await;
    assert_eq!(response.status, 200, "{}", response.text);

    // Wrong password and unknown email look the same.
    let wrong = app
        .request(
            Method::POST,
            "/api/v1/auth/login",
            None,
            Some(json!({"email": "nobody@example.com", "password": "whatever12"})),
        )
        .await;
    wrong.error(401, "UNAUTHORIZED");

    // session_for used one attempt and `wrong` another; the rest of the quota is spent here.
    let mut limited = None;
    for _ in 0..LOGIN_ATTEMPTS_PER_MINUTE {
        let response = app
            .request(
                Method::POST,
                "/api/v1/auth/login",
                None,
                Some(json!({"email": "x@example.com", "password": "whatever12"})),
            )
            .await;
        if response.status == 429 {
            limited = Some(response);
            break;
        }
        response.error(401, "UNAUTHORIZED");
    }
    let limited = limited.expect("the login limit was never hit");
    limited.error(429, "RATE_LIMITED");
    let retry_after: u64 = limited.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    // The message tells the same wait as the header.
    assert_eq!(
        limited.json()["error"]["message"],
        format!("too many requests; retry after {retry_after} seconds")
    );
}

#[tokio::test]
async fn api_keys_need_a_session_and_revoked_keys_stop_working() {
    let app = spawn_app().await;
    let tenant = &app.default_tenant;

    // An API key cannot manage keys.
    app.get("/api/v1/api-keys", &tenant.api_key)
        .await
        .error(403, "FORBIDDEN");
    app.post("/api/v1/api-keys", &tenant.api_key, json!({"name": "x"}))
        .await
        .error(403, "FORBIDDEN");

    let session = app.session_for(tenant).await;
    let created = app
        .post("/api/v1/api-keys", &session, json!({"name": "ci"}))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let created = created.json();
    let secret = created["apiKey"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(secret.starts_with("baton_"));
    assert!(secret.starts_with(created["prefix"].as_str().unwrap()));
    assert_eq!(created["name"], "ci");

    // The key works, is listed without its secret, and gets lastUsedAt.
    assert_eq!(app.get("/api/v1/environments", &secret).await.status, 200);
    let listed = app.get("/api/v1/api-keys", &session).await;
    assert!(!listed.text.contains(&secret), "the secret is shown again");
    assert!(
        listed
            .json()
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["id"] == id)
    );
    let mut last_used = serde_json::Value::Null;
    for _ in 0..50 {
        last_used = app
            .get(&format!("/api/v1/api-keys/{id}"), &session)
            .await
            .json()["lastUsedAt"]
            .clone();
        if last_used.is_string() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(last_used.is_string(), "lastUsedAt was never recorded");

    // Revoked: 401 at once, even though the key was cached.
    let revoked = app
        .delete(&format!("/api/v1/api-keys/{id}"), &session)
        .await;
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    assert!(revoked.json()["revokedAt"].is_string());
    app.get("/api/v1/environments", &secret)
        .await
        .error(401, "UNAUTHORIZED");

    // Nothing stored reveals the key.
    assert!(
        !app.get("/api/v1/api-keys", &session)
            .await
            .text
            .contains(&secret)
    );
}
