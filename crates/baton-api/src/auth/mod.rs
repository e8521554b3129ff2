//! Authentication: API keys and session tokens (JWT) on every protected route.
//!
//! API keys are looked up by SHA-256 and cached for a short while, so the hot path makes no
//! database read; revocation drops the cached entry on this instance at once and on others
//! within [`KEY_CACHE_TTL`]. Session tokens are HS256 JWTs with pinned algorithm, issuer,
//! audience and expiry; their user must still exist with the session version the token carries
//! (a password change bumps it), checked through a cache of the same kind: deleting a user or
//! changing a password refuses their sessions on this instance at once, on others within
//! [`KEY_CACHE_TTL`].

pub mod login;
mod session;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::HeaderValue;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use baton_domain::apikey::{KEY_PREFIX, hash_key, hashes_equal};
use baton_domain::{TenantId, Timestamp};
use baton_store::Store;
use moka::future::Cache;

pub use session::{SessionKeys, SessionSettings};

use crate::error::ApiError;
use crate::state::AppState;

/// How long a verified key is trusted without asking the database again.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(30);
/// `lastUsedAt` is written at most this often per key.
const TOUCH_INTERVAL_MS: i64 = 60_000;
/// Longer bearer values are rejected before any work is done.
const MAX_TOKEN_LEN: usize = 4096;

/// Who is calling: the tenant every query is scoped to, and how they proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: TenantId,
    pub kind: PrincipalKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalKind {
    ApiKey { key_id: String },
    Session { user_id: String },
}

impl Principal {
    /// A label for audit fields such as `activatedBy`.
    pub fn actor(&self) -> String {
        match &self.kind {
            PrincipalKind::ApiKey { key_id } => format!("apiKey:{key_id}"),
            PrincipalKind::Session { user_id } => format!("user:{user_id}"),
        }
    }
}

#[derive(Debug)]
struct CachedKey {
    key_id: String,
    tenant: TenantId,
    last_touch_ms: AtomicI64,
}

/// A session's user: (tenant id, user id).
type SessionUser = (String, String);

pub struct Authenticator {
    store: Store,
    keys: Cache<String, Arc<CachedKey>>,
    /// The current session version of each user seen lately; `None`: the user is gone.
    session_versions: Cache<SessionUser, Option<i64>>,
    sessions: SessionKeys,
}

impl Authenticator {
    pub fn new(store: Store, sessions: SessionKeys) -> Self {
        let keys = Cache::builder()
            .max_capacity(100_000)
            .time_to_live(KEY_CACHE_TTL)
            .build();
        let session_versions = Cache::builder()
            .max_capacity(100_000)
            .time_to_live(KEY_CACHE_TTL)
            .build();
        Self {
            store,
            keys,
            session_versions,
            sessions,
        }
    }

    pub fn sessions(&self) -> &SessionKeys {
        &self.sessions
    }

    /// Checks an `Authorization` header value.
    pub async fn authenticate(&self, header: Option<&HeaderValue>) -> Result<Principal, ApiError> {
        let header = header.ok_or_else(|| {
            ApiError::Unauthorized("missing Authorization header: send 'Authorization: Bearer <API key or access token>'".into())
        })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|value| {
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|token| !token.is_empty() && token.len() <= MAX_TOKEN_LEN)
            .ok_or_else(|| {
                ApiError::Unauthorized(
                    "the Authorization header must be 'Bearer <API key or access token>'".into(),
                )
            })?;

        if token.starts_with(KEY_PREFIX) {
            self.authenticate_key(token).await
        } else {
            let claims = self
                .sessions
                .verify(token)
                .map_err(|_| invalid_credentials())?;
            let user = (claims.tid, claims.sub);
            // Boxed on a miss for the same reason as keys' loads.
            let current = match self.session_versions.get(&user).await {
                Some(current) => current,
                None => Box::pin(self.load_session_version(&user)).await?,
            };
            if current != Some(claims.ver) {
                return Err(invalid_credentials());
            }
            let (tenant, user_id) = user;
            Ok(Principal {
                tenant: TenantId::new(tenant),
                kind: PrincipalKind::Session { user_id },
            })
        }
    }

    /// Reads a user's session version (`None` for a deleted user, cached too: a deleted user's
    /// token keeps failing without a query each time).
    async fn load_session_version(&self, user: &SessionUser) -> Result<Option<i64>, ApiError> {
        self.session_versions
            .try_get_with_by_ref(user, async {
                let tenant = TenantId::new(user.0.clone());
                self.store
                    .user_session_version(&tenant, &user.1)
                    .await
                    .map_err(ApiError::from)
            })
            .await
            .map_err(Arc::unwrap_or_clone)
    }

    /// Forgets a user's cached session version at once (after a delete or password change).
    pub async fn forget_user(&self, tenant: &TenantId, user_id: &str) {
        self.session_versions
            .invalidate(&(tenant.as_str().to_string(), user_id.to_string()))
            .await;
    }

    async fn authenticate_key(&self, token: &str) -> Result<Principal, ApiError> {
        let hash = hash_key(token);
        // A hit awaits only moka's `get`; the load and its database query run boxed, so every
        // request's future does not carry their ~5 KB (docs/performance.md, "Smaller futures").
        let cached = match self.keys.get(hash.as_str()).await {
            Some(cached) => cached,
            None => Box::pin(self.load_key(&hash)).await?,
        };
        self.touch_later(&cached);
        Ok(Principal {
            tenant: cached.tenant.clone(),
            kind: PrincipalKind::ApiKey {
                key_id: cached.key_id.clone(),
            },
        })
    }

    /// Reads a key that is not cached. Concurrent first requests with one key read it once; an
    /// unknown key is not cached.
    async fn load_key(&self, hash: &str) -> Result<Arc<CachedKey>, ApiError> {
        self.keys
            .try_get_with_by_ref(hash, async {
                let owner = self
                    .store
                    .find_key_owner(hash)
                    .await?
                    .ok_or_else(invalid_credentials)?;
                if !hashes_equal(&owner.key_hash, hash) {
                    return Err(invalid_credentials());
                }
                Ok(Arc::new(CachedKey {
                    key_id: owner.key_id,
                    tenant: owner.tenant_id,
                    last_touch_ms: AtomicI64::new(0),
                }))
            })
            .await
            .map_err(Arc::unwrap_or_clone)
    }

    /// Records `lastUsedAt` off the request path, at most once a minute per key.
    fn touch_later(&self, cached: &CachedKey) {
        let now = Timestamp::now();
        let now_ms = now.0.timestamp_millis();
        let last = cached.last_touch_ms.load(Ordering::Relaxed);
        if now_ms - last < TOUCH_INTERVAL_MS
            || cached
                .last_touch_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let store = self.store.clone();
        let key_id = cached.key_id.clone();
        tokio::spawn(async move {
            if let Err(err) = store.touch_api_key(&key_id, now).await {
                tracing::warn!(%key_id, error = %err, "could not record lastUsedAt");
            }
        });
    }

    /// Forgets a cached key at once (after revocation).
    pub async fn forget_key(&self, key_hash: &str) {
        self.keys.invalidate(key_hash).await;
    }
}

fn invalid_credentials() -> ApiError {
    ApiError::Unauthorized("invalid, expired or revoked API key or token".into())
}

/// Middleware on every protected route: refuses the request while Baton is overloaded, then
/// authenticates and stores the [`Principal`]. One layer for both: each layer costs every
/// request a boxed future and a clone of the route's service.
pub async fn require_auth(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    // Shedding first: refusing must stay cheap when the machine has no time to spare.
    state.overload.note_arrival();
    if let Some(refusal) = state.overload.refusal() {
        return refusal;
    }
    match state
        .auth
        .authenticate(request.headers().get(AUTHORIZATION))
        .await
    {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| ApiError::Unauthorized("authentication required".into()))
    }
}

/// A principal that logged in interactively; API keys get 403 (DESIGN.md: key management is
/// session-only, so a leaked key cannot mint more keys).
pub struct SessionPrincipal(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for SessionPrincipal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let principal = Principal::from_request_parts(parts, state).await?;
        match principal.kind {
            PrincipalKind::Session { .. } => Ok(SessionPrincipal(principal)),
            PrincipalKind::ApiKey { .. } => Err(ApiError::Forbidden(
                "this endpoint needs a session token from /api/v1/auth/login; API keys are not accepted".into(),
            )),
        }
    }
}
