//! `POST /api/v1/auth/login`: email and password for a session token, rate limited per client
//! address and per email.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::extract::{ConnectInfo, State};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::extract::Json;
use crate::state::AppState;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoginRequest {
    pub email: String,
    pub password: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoginResponse {
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Seconds until the token expires.
    pub expires_in: u64,
}

/// Login attempts allowed per client address and per email.
pub struct LoginLimiter {
    by_address: DefaultKeyedRateLimiter<IpAddr>,
    by_email: DefaultKeyedRateLimiter<String>,
}

impl LoginLimiter {
    pub fn per_minute(attempts: NonZeroU32) -> Arc<Self> {
        let quota = Quota::per_minute(attempts);
        Arc::new(Self {
            by_address: RateLimiter::keyed(quota),
            by_email: RateLimiter::keyed(quota),
        })
    }

    fn check(&self, address: IpAddr, email: &str) -> ApiResult<()> {
        let clock = DefaultClock::default();
        self.by_address
            .check_key(&address)
            .and_then(|()| self.by_email.check_key(&email.to_string()))
            .map_err(|not_until| ApiError::RateLimited {
                retry_after: not_until.wait_time_from(clock.now()),
            })
    }

    /// Drops idle keys so the limiter's memory stays bounded.
    pub fn prune(&self) {
        self.by_address.retain_recent();
        self.by_email.retain_recent();
    }
}

/// Hashes a password with argon2id (PHC string). CPU-heavy: call from a blocking thread.
pub fn hash_password(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    baton_domain::apikey::random_bytes(&mut salt).map_err(|e| e.to_string())?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// [`hash_password`] on a blocking thread, so argon2 does not stall the request's runtime.
pub async fn hash_password_blocking(password: String) -> Result<String, String> {
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| e.to_string())?
}

fn verify_password(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc).is_ok_and(|hash| {
        Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok()
    })
}

/// Verified against when the email is unknown, so both cases take the same time.
static DUMMY_HASH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| hash_password("not a real password").unwrap_or_default());

#[utoipa::path(
    post,
    path = "/api/v1/auth/login",
    tag = "auth",
    request_body = LoginRequest,
    security(()),
    responses(
        (status = 200, description = "A session token", body = LoginResponse),
        (status = 400, description = "Malformed request", body = ErrorResponse),
        (status = 401, description = "Wrong email or password", body = ErrorResponse),
        (status = 429, description = "Too many attempts; see Retry-After", body = ErrorResponse),
    )
)]
pub async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Json(request): Json<LoginRequest>,
) -> ApiResult<axum::Json<LoginResponse>> {
    let email = request.email.trim().to_lowercase();
    state.login_limiter.check(peer.ip(), &email)?;
    if request.password.len() > baton_domain::user::MAX_PASSWORD_LEN {
        return Err(wrong_credentials());
    }
    let found = state.store.find_user_for_login(&email).await?;
    let phc = found
        .as_ref()
        .map_or_else(|| DUMMY_HASH.clone(), |c| c.password_hash.clone());
    let password = request.password;
    let valid = tokio::task::spawn_blocking(move || verify_password(&password, &phc))
        .await
        .map_err(|e| ApiError::Internal(format!("password check failed: {e}")))?;
    let credentials = match found {
        Some(credentials) if valid => credentials,
        _ => return Err(wrong_credentials()),
    };
    let sessions = state.auth.sessions();
    let user = &credentials.user;
    let access_token = sessions.issue(&user.id, &user.tenant_id, credentials.session_version)?;
    Ok(axum::Json(LoginResponse {
        access_token,
        token_type: "Bearer",
        expires_in: sessions.ttl().as_secs(),
    }))
}

fn wrong_credentials() -> ApiError {
    ApiError::Unauthorized("wrong email or password".into())
}

/// Runs [`LoginLimiter::prune`] every `every` until the process ends.
pub fn spawn_pruner(limiter: Arc<LoginLimiter>, every: Duration) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(every);
        loop {
            ticker.tick().await;
            limiter.prune();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_and_verify() {
        let phc = hash_password("correct horse").unwrap();
        assert!(phc.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &phc));
        assert!(!verify_password("wrong horse", &phc));
        assert!(!verify_password("x", "not a phc string"));
    }

    #[test]
    fn limiter_blocks_after_quota_and_says_when() {
        let limiter = LoginLimiter::per_minute(NonZeroU32::new(2).unwrap());
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(limiter.check(ip, "a@x.io").is_ok());
        assert!(limiter.check(ip, "b@x.io").is_ok());
        match limiter.check(ip, "c@x.io") {
            Err(ApiError::RateLimited { retry_after }) => assert!(retry_after > Duration::ZERO),
            other => panic!("expected a rate limit, got {other:?}"),
        }
        // Another address is not limited by the first one's attempts.
        assert!(limiter.check("10.0.0.2".parse().unwrap(), "d@x.io").is_ok());
    }
}
