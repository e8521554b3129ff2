//! `/api/v1/users`: the tenant's users, session tokens only (as `/api-keys`: a leaked API key
//! cannot mint a login). Deleting a user or changing a password ends the user's sessions.

use axum::extract::State;
use axum::http::StatusCode;
use baton_domain::user::{User, validate_new_user, validate_password};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::auth::login::hash_password_blocking;
use crate::auth::{Principal, PrincipalKind, SessionPrincipal};
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::{Json, PathParam};
use crate::state::AppState;

/// No `Debug`: the password must not reach a log line.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateUser {
    /// Unique across all tenants (login names a user by email alone); stored lowercased.
    pub email: String,
    /// 8 to 1024 characters.
    pub password: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChangePassword {
    /// The new password, 8 to 1024 characters.
    pub password: String,
}

async fn hash(password: String) -> ApiResult<String> {
    hash_password_blocking(password)
        .await
        .map_err(|e| ApiError::Internal(format!("could not hash a password: {e}")))
}

#[utoipa::path(get, path = "/api/v1/users", tag = "users",
    responses(
        (status = 200, description = "The tenant's users, oldest first (never password hashes)", body = [User]),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
    ))]
pub async fn list_users(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
) -> ApiResult<axum::Json<Vec<User>>> {
    Ok(axum::Json(state.store.list_users(&principal.tenant).await?))
}

#[utoipa::path(post, path = "/api/v1/users", tag = "users", request_body = CreateUser,
    responses(
        (status = 201, description = "Created; the user can log in at /api/v1/auth/login", body = User),
        (status = 400, description = "Invalid email or password; `param` names it", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
        (status = 409, description = "The email is taken (`ALREADY_EXISTS`)", body = ErrorResponse),
    ))]
pub async fn create_user(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    Json(body): Json<CreateUser>,
) -> ApiResult<(StatusCode, axum::Json<User>)> {
    let email = validate_new_user(&body.email, &body.password)?;
    let password_hash = hash(body.password).await?;
    let user = state
        .store
        .create_user(&principal.tenant, &email, &password_hash)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(user)))
}

#[utoipa::path(get, path = "/api/v1/users/{id}", tag = "users",
    params(("id" = String, Path, description = "User id")),
    responses(
        (status = 200, description = "The user", body = User),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
        (status = 404, description = "No such user", body = ErrorResponse),
    ))]
pub async fn get_user(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    PathParam(id): PathParam,
) -> ApiResult<axum::Json<User>> {
    Ok(axum::Json(
        state.store.get_user(&principal.tenant, &id).await?,
    ))
}

/// Deletes the user; their session tokens are refused from then on.
#[utoipa::path(delete, path = "/api/v1/users/{id}", tag = "users",
    params(("id" = String, Path, description = "User id")),
    responses(
        (status = 204, description = "Deleted; the user's sessions have ended"),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
        (status = 404, description = "No such user", body = ErrorResponse),
        (status = 409, description = "The caller's own user (`CANNOT_DELETE_SELF`)", body = ErrorResponse),
    ))]
pub async fn delete_user(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    PathParam(id): PathParam,
) -> ApiResult<StatusCode> {
    // Keeps a tenant from locking itself out by accident: its last user cannot remove itself.
    if is_caller(&principal, &id) {
        return Err(ApiError::Conflict {
            code: "CANNOT_DELETE_SELF",
            message: "you cannot delete your own user; another user of the tenant can".into(),
        });
    }
    state.store.delete_user(&principal.tenant, &id).await?;
    state.auth.forget_user(&principal.tenant, &id).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets a new password; every session of the user issued before (the caller's own included,
/// when it is their password) is refused from then on.
#[utoipa::path(put, path = "/api/v1/users/{id}/password", tag = "users",
    params(("id" = String, Path, description = "User id")),
    request_body = ChangePassword,
    responses(
        (status = 204, description = "Changed; the user's earlier sessions have ended"),
        (status = 400, description = "Invalid password; `param` names it", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Needs a session token", body = ErrorResponse),
        (status = 404, description = "No such user", body = ErrorResponse),
    ))]
pub async fn change_password(
    State(state): State<AppState>,
    SessionPrincipal(principal): SessionPrincipal,
    PathParam(id): PathParam,
    Json(body): Json<ChangePassword>,
) -> ApiResult<StatusCode> {
    validate_password(&body.password)?;
    // An unknown id is answered before argon2 spends its time on the hash.
    state.store.get_user(&principal.tenant, &id).await?;
    let password_hash = hash(body.password).await?;
    state
        .store
        .set_user_password(&principal.tenant, &id, &password_hash)
        .await?;
    state.auth.forget_user(&principal.tenant, &id).await;
    Ok(StatusCode::NO_CONTENT)
}

fn is_caller(principal: &Principal, id: &str) -> bool {
    matches!(&principal.kind, PrincipalKind::Session { user_id } if user_id == id)
}
