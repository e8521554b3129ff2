//! Application state, built once at start-up and shared by every request.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use baton_domain::TenantId;
use baton_domain::settings::TenantSettings;
use baton_executor::{Engine, EngineConfig, Limits};
use baton_providers::Registry;
use baton_providers::routing::{Router, RouterConfig, RuleSet};
use baton_store::Store;
use baton_store::runs::RunWriter;
use baton_tools::{GuardPolicy, GuardedClient};
use secrecy::{ExposeSecret, SecretString};

use crate::auth::login::{LoginLimiter, spawn_pruner};
use crate::auth::{Authenticator, SessionKeys, SessionSettings};
use crate::error::ApiError;
use crate::mcp::{McpConfig, McpService};
use crate::metrics::Metrics;
use crate::overload::{Overload, OverloadConfig};
use crate::serve::ServeOptions;
use crate::streams::StreamSlots;

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
    /// Abuse limits (`[limits]`): messages, tool results, streams, agent fan-out.
    pub limits: Limits,
    /// Whether runs are written to the invocation log. Off, nothing is kept: no log, statistics,
    /// usage or budget spend (`docs/decisions.md`, "Invocation log off").
    pub invocation_log: bool,
    /// Load shedding (`overload.rs`).
    pub overload: OverloadConfig,
    /// How accepted connections are served: the header deadline (`serve.rs`).
    pub connections: ServeOptions,
}

impl ApiConfig {
    /// The part of the configuration the engine takes.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            request_timeout: self.request_timeout,
            response_cache_max_bytes: self.response_cache_max_bytes,
            router: self.router,
            outbound: self.outbound.clone(),
            tool_call_timeout: self.tool_call_timeout,
            tool_connect_timeout: self.tool_connect_timeout,
            limits: self.limits,
        }
    }
}

/// `server.max_body_bytes` unless configured.
pub const DEFAULT_MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
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
            limits: Limits::default(),
            invocation_log: true,
            overload: OverloadConfig::default(),
            connections: ServeOptions::default(),
        }
    }
}

/// What every request shares, behind one `Arc`: handlers and middleware take the state by
/// value (axum clones it per extractor), and one reference count is cheaper than the dozen
/// the parts hold (a profile at 1,000 RPS showed cloning and dropping them at ~4%).
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

#[derive(Clone)]
pub struct AppParts {
    pub store: Store,
    pub auth: Arc<Authenticator>,
    pub login_limiter: Arc<LoginLimiter>,
    pub providers: Arc<Registry>,
    /// The invocation log's batched writer.
    pub runs: RunWriter,
    /// Runs flows and model calls: router, caches, limits, the storage traits over `store`.
    pub engine: Engine,
    /// Orders model chains and keeps the circuit breakers (the engine's).
    pub router: Arc<Router>,
    /// The one client for tenant-supplied destinations (the engine's).
    pub outbound: GuardedClient,
    pub config: Arc<ApiConfig>,
    /// What `/metrics` reports.
    pub metrics: Arc<Metrics>,
    /// Baton's own MCP server (`/api/v1/mcp`).
    pub(crate) mcp: Arc<McpService>,
    /// Open event streams per tenant (`limits.max_streams_per_tenant`).
    pub streams: StreamSlots,
    /// Whether Baton is past its capacity (load shedding).
    pub overload: Arc<Overload>,
    /// Held while an MCP import plans and writes, so concurrent imports of the same tools
    /// refresh what the first wrote instead of colliding with it (an admin operation: one lock
    /// for the instance is enough).
    pub(crate) mcp_imports: Arc<tokio::sync::Mutex<()>>,
}
const JWT_SECRET_NAME: &str = "jwt_signing_key";
pub const MIN_JWT_SECRET_LEN: usize = 32;

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
        let flows: Arc<dyn baton_executor::FlowStore> = Arc::new(store.clone());
        let sink: Arc<dyn baton_executor::RunSink> = if config.invocation_log {
            Arc::new(runs.clone())
        } else {
            Arc::new(baton_executor::DiscardRuns::new(flows.clone()))
        };
        let engine = Engine::new(config.engine_config(), providers.clone(), flows, sink)?;
        let overload = Overload::new(config.overload);
        let metrics = Arc::new(Metrics::new());
        metrics.watch_overload(overload.clone());
        let state = AppState(Arc::new(AppParts {
            overload,
            router: engine.router().clone(),
            outbound: engine.outbound().clone(),
            engine,
            auth: Arc::new(Authenticator::new(store.clone(), sessions)),
            store,
            login_limiter,
            providers,
            runs,
            mcp: Arc::new(crate::mcp::service(&config)),
            streams: StreamSlots::new(config.limits.max_streams_per_tenant),
            config: Arc::new(config),
            metrics,
            mcp_imports: Arc::default(),
        }));
        state.start_runtime_tasks();
        Ok(state)
    }

    /// Starts what each runtime serving requests needs on it (the load-shedding probe, which
    /// measures the delay of the runtime it runs on). [`AppState::build`] does it for the
    /// runtime it runs on; a server with a runtime per thread calls it on each other one.
    pub fn start_runtime_tasks(&self) {
        if self.config.overload.is_enabled() {
            self.overload
                .spawn_probe(self.config.invocation_log.then(|| self.runs.clone()));
        }
    }

    /// Reports into `metrics` (shared with the log writer, which counts runs into it).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> AppState {
        metrics.watch_writer(self.runs.clone());
        metrics.watch_overload(self.overload.clone());
        Arc::make_mut(&mut self.0).metrics = metrics;
        self
    }

    /// The tenant's settings, from the engine's cache when fresh.
    pub async fn tenant_settings(
        &self,
        tenant: &TenantId,
    ) -> Result<Arc<TenantSettings>, ApiError> {
        Ok(self.engine.tenant_settings(tenant).await?)
    }

    pub async fn forget_settings(&self, tenant: &TenantId) {
        self.engine.forget_settings(tenant).await;
    }

    /// The tenant's routing rules by alias, from the engine's cache when fresh.
    pub async fn routing_rules(&self, tenant: &TenantId) -> Result<Arc<RuleSet>, ApiError> {
        Ok(self.engine.routing_rules(tenant).await?)
    }

    pub async fn forget_routing_rules(&self, tenant: &TenantId) {
        self.engine.forget_routing_rules(tenant).await;
    }

    pub async fn forget_budgets(&self, tenant: &TenantId) {
        self.engine.forget_budgets(tenant).await;
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
