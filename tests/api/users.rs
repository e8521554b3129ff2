//! User management over HTTP: session tokens only, tenant-scoped, and the sessions of a deleted
//! user or of a changed password end. The login limit (5 a minute per address in tests) bounds
//! how many logins one test may make.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Response, TestApp, spawn_app};

async fn login(app: &TestApp, email: &str, password: &str) -> Response {
    app.request(
        Method::POST,
        "/api/v1/auth/login",
        None,
        Some(json!({"email": email, "password": password})),
    )
    .await
}

async fn session(app: &TestApp, email: &str, password: &str) -> String {
    let response = login(app, email, password).await;
    assert_eq!(response.status, 200, "{}", response.text);
    response.json()["accessToken"].as_str().unwrap().to_string()
}

/// Creates a user through the API; returns its record.
async fn create(app: &TestApp, token: &str, email: &str, password: &str) -> Value {
    let created = app
        .post(
            "/api/v1/users",
            token,
            json!({"email": email, "password": password}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    created.json()
}

#[tokio::test]
async fn api_keys_cannot_manage_users() {
    let app = spawn_app().await;
    let key = &app.default_tenant.api_key;
    let body = json!({"email": "k@example.com", "password": "long enough"});
    for (method, path) in [
        (Method::GET, "/api/v1/users"),
        (Method::POST, "/api/v1/users"),
        (Method::GET, "/api/v1/users/x"),
        (Method::DELETE, "/api/v1/users/x"),
        (Method::PUT, "/api/v1/users/x/password"),
    ] {
        app.request(method, path, Some(key), Some(body.clone()))
            .await
            .error(403, "FORBIDDEN");
    }
    // Nothing was created by the refused POST.
    let admin = app.session_for(&app.default_tenant).await;
    let users = app.get("/api/v1/users", &admin).await.json();
    assert_eq!(users.as_array().unwrap().len(), 1, "{users}");
}

#[tokio::test]
async fn users_are_created_listed_read_and_deleted_and_a_deleted_users_session_ends() {
    let app = spawn_app().await;
    let admin = app.session_for(&app.default_tenant).await;

    let user = create(&app, &admin, " Ada@Example.COM ", "first password").await;
    let id = user["id"].as_str().unwrap().to_string();
    assert_eq!(user["email"], "ada@example.com");
    assert_eq!(user["tenantId"], app.default_tenant.id.as_str());
    assert!(user["createdAt"].is_string());
    assert!(user["passwordChangedAt"].is_null());
    assert!(user.get("passwordHash").is_none(), "{user}");

    // Listed (with the admin), readable, never with a hash.
    let listed = app.get("/api/v1/users", &admin).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(!listed.text.contains("argon2"), "{}", listed.text);
    let listed = listed.json();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[1], user);
    let got = app.get(&format!("/api/v1/users/{id}"), &admin).await;
    assert_eq!(got.status, 200, "{}", got.text);
    assert_eq!(got.json(), user);

    // Emails are unique platform-wide, compared case-insensitively.
    app.post(
        "/api/v1/users",
        &admin,
        json!({"email": "ADA@example.com", "password": "another password"}),
    )
    .await
    .error(409, "ALREADY_EXISTS");
    let other = app.create_tenant("other").await;
    let other_admin = app.session_for(&other).await;
    app.post(
        "/api/v1/users",
        &other_admin,
        json!({"email": "ada@example.com", "password": "another password"}),
    )
    .await
    .error(409, "ALREADY_EXISTS");

    // The new user logs in; their session works, and they cannot delete themself.
    let ada = session(&app, "ada@example.com", "first password").await;
    assert_eq!(app.get("/api/v1/users", &ada).await.status, 200);
    let err = app
        .delete(&format!("/api/v1/users/{id}"), &ada)
        .await
        .error(409, "CANNOT_DELETE_SELF");
    assert!(err["message"].as_str().unwrap().contains("your own user"));

    // Deleted: gone, and the session (cached by the request above) is refused at once.
    let deleted = app.delete(&format!("/api/v1/users/{id}"), &admin).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    app.get("/api/v1/users", &ada)
        .await
        .error(401, "UNAUTHORIZED");
    app.get(&format!("/api/v1/users/{id}"), &admin)
        .await
        .error(404, "NOT_FOUND");
    app.delete(&format!("/api/v1/users/{id}"), &admin)
        .await
        .error(404, "NOT_FOUND");
    login(&app, "ada@example.com", "first password")
        .await
        .error(401, "UNAUTHORIZED");
    assert_eq!(
        app.get("/api/v1/users", &admin)
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn a_password_change_ends_earlier_sessions_and_only_the_new_password_logs_in() {
    let app = spawn_app().await;
    let admin = app.session_for(&app.default_tenant).await;
    let user = create(&app, &admin, "bob@example.com", "first password").await;
    let id = user["id"].as_str().unwrap().to_string();
    let bob = session(&app, "bob@example.com", "first password").await;
    assert_eq!(app.get("/api/v1/users", &bob).await.status, 200);

    // Bob changes his own password: his own session ends too.
    let changed = app
        .put(
            &format!("/api/v1/users/{id}/password"),
            &bob,
            json!({"password": "second password"}),
        )
        .await;
    assert_eq!(changed.status, 204, "{}", changed.text);
    app.get("/api/v1/users", &bob)
        .await
        .error(401, "UNAUTHORIZED");
    login(&app, "bob@example.com", "first password")
        .await
        .error(401, "UNAUTHORIZED");
    let bob = session(&app, "bob@example.com", "second password").await;
    assert_eq!(app.get("/api/v1/users", &bob).await.status, 200);
    let got = app.get(&format!("/api/v1/users/{id}"), &admin).await.json();
    assert!(got["passwordChangedAt"].is_string(), "{got}");

    // Another user (the admin) changes it again: Bob's newer session ends as well.
    let changed = app
        .put(
            &format!("/api/v1/users/{id}/password"),
            &admin,
            json!({"password": "third password"}),
        )
        .await;
    assert_eq!(changed.status, 204, "{}", changed.text);
    app.get("/api/v1/users", &bob)
        .await
        .error(401, "UNAUTHORIZED");
    // The admin's own session is untouched.
    assert_eq!(app.get("/api/v1/users", &admin).await.status, 200);

    app.put(
        "/api/v1/users/no-such-user/password",
        &admin,
        json!({"password": "long enough"}),
    )
    .await
    .error(404, "NOT_FOUND");
}

#[tokio::test]
async fn invalid_input_names_the_field_and_writes_nothing() {
    let app = spawn_app().await;
    let admin = app.session_for(&app.default_tenant).await;
    let before = app.get("/api/v1/users", &admin).await.json();

    for (body, param) in [
        (json!({}), "email"),
        (json!({"email": "c@example.com"}), "password"),
        (json!({"email": 42, "password": "long enough"}), "email"),
        (
            json!({"email": "no-at-sign", "password": "long enough"}),
            "email",
        ),
        (
            json!({"email": "c@example.com", "password": "short"}),
            "password",
        ),
        (
            json!({"email": "c@example.com", "password": "x".repeat(1025)}),
            "password",
        ),
        (
            json!({"email": "c@example.com", "password": "long enough", "role": "admin"}),
            "role",
        ),
    ] {
        let err = app
            .post("/api/v1/users", &admin, body.clone())
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(err["param"], param, "{body}");
    }
    assert_eq!(app.get("/api/v1/users", &admin).await.json(), before);

    // A refused password change keeps the old password and the sessions.
    let user = create(&app, &admin, "cy@example.com", "first password").await;
    let path = format!("/api/v1/users/{}/password", user["id"].as_str().unwrap());
    let cy = session(&app, "cy@example.com", "first password").await;
    for (body, param) in [
        (json!({}), "password"),
        (json!({"password": "short"}), "password"),
        (json!({"password": 12345678}), "password"),
        (
            json!({"password": "long enough", "email": "x@y.z"}),
            "email",
        ),
    ] {
        let err = app
            .put(&path, &admin, body.clone())
            .await
            .error(400, "VALIDATION_ERROR");
        assert_eq!(err["param"], param, "{body}");
    }
    assert_eq!(app.get("/api/v1/users", &cy).await.status, 200);
    session(&app, "cy@example.com", "first password").await;
}
