//! Application state, built once at start-up and shared by every request.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use baton_domain::TenantId;
use baton_domain::budget::Budget;
use baton_domain::settings::TenantSettings;
use baton_providers::Registry;
use baton_providers::routing::{Router, RouterConfig, RuleSet};
use baton_store::Store;
use baton_store::runs::RunWriter;
use baton_tools::{GuardPolicy, GuardedClient};
use moka::future::Cache;
use secrecy::{ExposeSecret, SecretString};

use crate::auth::login::{LoginLimiter, spawn_pruner};
use crate::auth::{Authenticator, SessionKeys, SessionSettings};
use crate::cache::ResponseCache;
use crate::error::ApiError;
use crate::limits::TenantLimiters;
use crate::metrics::Metrics;
use crate::mcp::{McpConfig, McpService};
use crate::routes::flow_runs::CompiledVersion;

/// What the HTTP layer needs from the operator's configuration.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Requests with larger bodies get 413.
    pub max_body_bytes: usize,
    /// Whole-request deadline for non-streaming requests.
    pub request_timeout: Duration,
    pub session_ttl: Duration,
    pub login_attempts_per_minute: NonZeroU32,
    /// HS256 key for session tokens. When absent, one is generated and kept in the database so
    /// every instance shares it.
    pub jwt_secret: Option<SecretString>,
    /// Size bound of the response cache, in bytes of cached answers.
    pub response_cache_max_bytes: u64,
    /// Circuit breakers of the model router.
    pub router: RouterConfig,
    /// What the outbound guard lets through (strict unless a debug build relaxes it).
    pub outbound: GuardPolicy,
    /// Bound on one tool call (External, MCP).
    pub tool_call_timeout: Duration,
    pub tool_connect_timeout: Duration,
    /// Hosts and origins Baton's own MCP server accepts.
    pub mcp: McpConfig,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 10 * 1024 * 1024,
            request_timeout: Duration::from_secs(600),
            session_ttl: Duration::from_secs(12 * 3600),
            login_attempts_per_minute: NonZeroU32::MIN.saturating_add(9),
            jwt_secret: None,
            response_cache_max_bytes: 256 * 1024 * 1024,
            router: RouterConfig::default(),
            outbound: GuardPolicy::strict(),
            tool_call_timeout: Duration::from_secs(30),
            tool_connect_timeout: Duration::from_secs(10),
            mcp: McpConfig::default(),
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub auth: Arc<Authenticator>,
    pub login_limiter: Arc<LoginLimiter>,
    pub providers: Arc<Registry>,
    /// The invocation log's batched writer.
    pub runs: RunWriter,
    /// Tenant settings read on the hot path; dropped on change (other instances: TTL).
    settings: Cache<String, Arc<TenantSettings>>,
    /// Tenant routing rules, likewise.
    rules: Cache<String, Arc<RuleSet>>,
    /// Tenant budgets (checked before every model-calling request), likewise.
    budgets: Cache<String, Arc<Vec<Budget>>>,
    /// Orders model chains and keeps the circuit breakers.
    pub router: Arc<Router>,
    pub responses: ResponseCache,
    pub limiters: TenantLimiters,
    /// The one client for tenant-supplied destinations (tool hosts, MCP servers).
    pub outbound: GuardedClient,
    /// Compiled activated versions (immutable) by tenant and version id.
    pub(crate) versions: Cache<String, Arc<CompiledVersion>>,
    pub config: Arc<ApiConfig>,
    /// What `/metrics` reports.
    pub metrics: Arc<Metrics>,
    /// Baton's own MCP server (`/api/v1/mcp`).
    pub(crate) mcp: Arc<McpService>,
}

/// How stale another instance's cached settings may be.
const SETTINGS_CACHE_TTL: Duration = Duration::from_secs(30);
const JWT_SECRET_NAME: &str = "jwt_signing_key";
const MIN_JWT_SECRET_LEN: usize = 32;

impl AppState {
    pub async fn build(
        store: Store,
        providers: Arc<Registry>,
        runs: RunWriter,
        config: ApiConfig,
    ) -> Result<AppState, ApiError> {
        let secret = match &config.jwt_secret {
            Some(secret) if secret.expose_secret().len() >= MIN_JWT_SECRET_LEN => {
                secret.expose_secret().to_string()
            }
            Some(_) => {
                return Err(ApiError::Internal(format!(
                    "auth.jwt_secret must be at least {MIN_JWT_SECRET_LEN} bytes"
                )));
            }
            None => {
                let mut bytes = [0u8; 32];
                baton_domain::apikey::random_bytes(&mut bytes)
                    .map_err(|e| ApiError::Internal(e.to_string()))?;
                let candidate = hex_encode(&bytes);
                store
                    .get_or_init_secret(JWT_SECRET_NAME, &candidate)
                    .await?
            }
        };
        let sessions = SessionKeys::new(
            secret.as_bytes(),
            &SessionSettings {
                ttl: config.session_ttl,
            },
        );
        let login_limiter = LoginLimiter::per_minute(config.login_attempts_per_minute);
        spawn_pruner(login_limiter.clone(), Duration::from_secs(60));
        Ok(AppState {
            router: Arc::new(Router::new(providers.clone(), config.router)),
            responses: ResponseCache::new(config.response_cache_max_bytes),
            limiters: TenantLimiters::new(),
            outbound: GuardedClient::new(config.outbound.clone(), config.tool_connect_timeout)
                .map_err(|e| ApiError::Internal(e.to_string()))?,
            versions: Cache::builder().max_capacity(10_000).build(),
            rules: Cache::builder()
                .max_capacity(100_000)
                .time_to_live(SETTINGS_CACHE_TTL)
                .build(),
            budgets: Cache::builder()
                .max_capacity(100_000)
                .time_to_live(SETTINGS_CACHE_TTL)
                .build(),
            auth: Arc::new(Authenticator::new(store.clone(), sessions)),
            store,
            login_limiter,
            providers,
            runs,
            settings: Cache::builder()
                .max_capacity(100_000)
                .time_to_live(SETTINGS_CACHE_TTL)
                .build(),
            mcp: Arc::new(crate::mcp::service(&config)),
            config: Arc::new(config),
            metrics: Arc::new(Metrics::new()),
        })
    }

    /// Reports into `metrics` (shared with the log writer, which counts runs into it).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> AppState {
        metrics.watch_writer(self.runs.clone());
        self.metrics = metrics;
        self
    }

    /// The tenant's settings, from the cache when fresh.
    pub async fn tenant_settings(
        &self,
        tenant: &TenantId,
    ) -> Result<Arc<TenantSettings>, ApiError> {
        if let Some(settings) = self.settings.get(tenant.as_str()).await {
            return Ok(settings);
        }
        let settings = Arc::new(self.store.tenant_settings(tenant).await?.settings);
        self.settings
            .insert(tenant.as_str().to_string(), settings.clone())
            .await;
        Ok(settings)
    }

    pub async fn forget_settings(&self, tenant: &TenantId) {
        self.settings.invalidate(tenant.as_str()).await;
    }

    /// The tenant's routing rules by alias, from the cache when fresh.
    pub async fn routing_rules(&self, tenant: &TenantId) -> Result<Arc<RuleSet>, ApiError> {
        if let Some(rules) = self.rules.get(tenant.as_str()).await {
            return Ok(rules);
        }
        let rules = Arc::new(RuleSet::new(self.store.list_routing_rules(tenant).await?));
        self.rules
            .insert(tenant.as_str().to_string(), rules.clone())
            .await;
        Ok(rules)
    }

    pub async fn forget_routing_rules(&self, tenant: &TenantId) {
        self.rules.invalidate(tenant.as_str()).await;
    }

    /// The tenant's budgets, from the cache when fresh.
    pub async fn tenant_budgets(&self, tenant: &TenantId) -> Result<Arc<Vec<Budget>>, ApiError> {
        if let Some(budgets) = self.budgets.get(tenant.as_str()).await {
            return Ok(budgets);
        }
        let budgets = Arc::new(self.store.list_budgets(tenant).await?);
        self.budgets
            .insert(tenant.as_str().to_string(), budgets.clone())
            .await;
        Ok(budgets)
    }

    pub async fn forget_budgets(&self, tenant: &TenantId) {
        self.budgets.invalidate(tenant.as_str()).await;
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
