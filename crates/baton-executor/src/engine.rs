//! The [`Engine`]: everything a run needs, built once and shared (an `Arc` inside, so clones
//! are cheap): providers and the router with its circuit breakers, the response cache, tenant
//! rate limiters, the guarded outbound client, caches of settings, routing rules and compiled
//! versions, and the storage traits.

use std::sync::Arc;
use std::time::Duration;

use baton_domain::TenantId;
use baton_domain::budget::Budget;
use baton_domain::flow::{Template, Version};
use baton_domain::settings::TenantSettings;
use baton_domain::tool::Tool;
use baton_providers::Registry;
use baton_providers::routing::{Router, RouterConfig, RuleSet};
use baton_template::{Field, Library, TemplateError, TemplateSource};
use baton_tools::{GuardPolicy, GuardedClient};
use moka::future::Cache;

use crate::bounds::Limits;
use crate::cache::ResponseCache;
use crate::error::{ExecutorError, ExecutorResult};
use crate::limits::TenantLimiters;
use crate::storage::{FlowStore, RunSink};

/// What the engine needs from the operator's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Whole-request deadline: no model attempt (or Retry-After wait) runs past it.
    pub request_timeout: Duration,
    /// Size bound of the response cache, in bytes of cached answers.
    pub response_cache_max_bytes: u64,
    /// Circuit breakers of the model router.
    pub router: RouterConfig,
    /// What the outbound guard lets through.
    pub outbound: GuardPolicy,
    /// Bound on one tool call (External, MCP).
    pub tool_call_timeout: Duration,
    pub tool_connect_timeout: Duration,
    /// Abuse limits: messages, tool result size, stream lifetime, agent fan-out.
    pub limits: Limits,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(600),
            response_cache_max_bytes: 256 * 1024 * 1024,
            router: RouterConfig::default(),
            outbound: GuardPolicy::strict(),
            tool_call_timeout: Duration::from_secs(30),
            tool_connect_timeout: Duration::from_secs(10),
            limits: Limits::default(),
        }
    }
}

/// A flow's version ready to run: the record and its compiled templates.
pub struct CompiledVersion {
    pub version: Version,
    pub library: Library,
}

/// How stale another instance's cached settings and rules may be.
const SETTINGS_CACHE_TTL: Duration = Duration::from_secs(30);

pub(crate) struct Inner {
    pub(crate) providers: Arc<Registry>,
    pub(crate) router: Arc<Router>,
    pub(crate) responses: ResponseCache,
    pub(crate) limiters: TenantLimiters,
    pub(crate) outbound: GuardedClient,
    pub(crate) flows: Arc<dyn FlowStore>,
    pub(crate) runs: Arc<dyn RunSink>,
    pub(crate) config: EngineConfig,
    /// Tenant settings read on the hot path; dropped on change (other instances: TTL).
    settings: Cache<String, Arc<TenantSettings>>,
    /// Tenant routing rules, likewise.
    rules: Cache<String, Arc<RuleSet>>,
    /// Compiled activated versions (immutable) by tenant and version id.
    versions: Cache<String, Arc<CompiledVersion>>,
    /// Tenant budgets, checked before every request; dropped on change (other instances: TTL).
    pub(crate) budgets: Cache<String, Arc<Vec<Budget>>>,
    /// A template's tools by tenant and tool ids, so a run reads none from storage; a tenant's
    /// entries are dropped when any of its tools changes (other instances: TTL).
    tools: Cache<String, Arc<Vec<Tool>>>,
}

#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl Engine {
    pub fn new(
        config: EngineConfig,
        providers: Arc<Registry>,
        flows: Arc<dyn FlowStore>,
        runs: Arc<dyn RunSink>,
    ) -> ExecutorResult<Engine> {
        let outbound = GuardedClient::new(config.outbound.clone(), config.tool_connect_timeout)
            .map_err(|e| ExecutorError::Internal(e.to_string()))?;
        Ok(Engine {
            inner: Arc::new(Inner {
                router: Arc::new(Router::new(providers.clone(), config.router)),
                responses: ResponseCache::new(config.response_cache_max_bytes),
                limiters: TenantLimiters::new(),
                outbound,
                providers,
                flows,
                runs,
                settings: Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(SETTINGS_CACHE_TTL)
                    .build(),
                rules: Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(SETTINGS_CACHE_TTL)
                    .build(),
                versions: Cache::builder().max_capacity(10_000).build(),
                budgets: Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(SETTINGS_CACHE_TTL)
                    .build(),
                tools: Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(SETTINGS_CACHE_TTL)
                    .support_invalidation_closures()
                    .build(),
                config,
            }),
        })
    }

    pub fn providers(&self) -> &Arc<Registry> {
        &self.inner.providers
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.inner.router
    }

    /// The one client for tenant-supplied destinations (tool hosts, MCP servers).
    pub fn outbound(&self) -> &GuardedClient {
        &self.inner.outbound
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn flows(&self) -> &Arc<dyn FlowStore> {
        &self.inner.flows
    }

    pub fn runs(&self) -> &Arc<dyn RunSink> {
        &self.inner.runs
    }

    /// The tenant's settings, from the cache when fresh.
    pub async fn tenant_settings(&self, tenant: &TenantId) -> ExecutorResult<Arc<TenantSettings>> {
        if let Some(settings) = self.inner.settings.get(tenant.as_str()).await {
            return Ok(settings);
        }
        let settings = Arc::new(self.inner.flows.tenant_settings(tenant).await?);
        self.inner
            .settings
            .insert(tenant.as_str().to_string(), settings.clone())
            .await;
        Ok(settings)
    }

    /// Drops the cached settings; call after changing them.
    pub async fn forget_settings(&self, tenant: &TenantId) {
        self.inner.settings.invalidate(tenant.as_str()).await;
    }

    /// The tenant's routing rules by alias, from the cache when fresh.
    pub async fn routing_rules(&self, tenant: &TenantId) -> ExecutorResult<Arc<RuleSet>> {
        if let Some(rules) = self.inner.rules.get(tenant.as_str()).await {
            return Ok(rules);
        }
        let rules = Arc::new(RuleSet::new(self.inner.flows.routing_rules(tenant).await?));
        self.inner
            .rules
            .insert(tenant.as_str().to_string(), rules.clone())
            .await;
        Ok(rules)
    }

    /// Drops the cached routing rules; call after changing them.
    pub async fn forget_routing_rules(&self, tenant: &TenantId) {
        self.inner.rules.invalidate(tenant.as_str()).await;
    }

    /// The tenant's budgets, from the cache when fresh.
    pub async fn budgets(&self, tenant: &TenantId) -> ExecutorResult<Arc<Vec<Budget>>> {
        if let Some(budgets) = self.inner.budgets.get(tenant.as_str()).await {
            return Ok(budgets);
        }
        let budgets = Arc::new(self.inner.flows.budgets(tenant).await?);
        self.inner
            .budgets
            .insert(tenant.as_str().to_string(), budgets.clone())
            .await;
        Ok(budgets)
    }

    /// Drops the cached budgets; call after changing them.
    pub async fn forget_budgets(&self, tenant: &TenantId) {
        self.inner.budgets.invalidate(tenant.as_str()).await;
    }

    /// The tools of `ids` that exist, in the order of `ids`, from the cache when fresh.
    pub async fn tools(&self, tenant: &TenantId, ids: &[String]) -> ExecutorResult<Arc<Vec<Tool>>> {
        if ids.is_empty() {
            return Ok(Arc::default());
        }
        let key = format!("{}\u{1f}{}", tenant.as_str(), ids.join("\u{1f}"));
        if let Some(hit) = self.inner.tools.get(&key).await {
            return Ok(hit);
        }
        let tools = Arc::new(self.inner.flows.tools(tenant, ids).await?);
        self.inner.tools.insert(key, tools.clone()).await;
        Ok(tools)
    }

    /// Drops the tenant's cached tool lists; call after creating, changing or deleting a tool.
    pub fn forget_tools(&self, tenant: &TenantId) {
        let prefix = format!("{}\u{1f}", tenant.as_str());
        if let Err(error) = self
            .inner
            .tools
            .invalidate_entries_if(move |key, _| key.starts_with(&prefix))
        {
            // Only fails when the cache was built without closures: then drop everything.
            tracing::warn!(%error, "could not drop a tenant's cached tools; dropping all");
            self.inner.tools.invalidate_all();
        }
    }

    /// A version ready to run. Activated versions never change, so compiled ones are cached.
    pub async fn compiled_version(
        &self,
        tenant: &TenantId,
        flow_id: &str,
        version_id: &str,
    ) -> ExecutorResult<Arc<CompiledVersion>> {
        let key = format!("{}\u{1f}{version_id}", tenant.as_str());
        if let Some(hit) = self.inner.versions.get(&key).await {
            return Ok(hit);
        }
        let version = self
            .inner
            .flows
            .version(tenant, flow_id, version_id)
            .await?;
        let library = compile(&version.templates)?;
        let compiled = Arc::new(CompiledVersion { version, library });
        self.inner.versions.insert(key, compiled.clone()).await;
        Ok(compiled)
    }
}

/// Compiles a version's templates; an error names the field (`template` or `userTemplate`).
pub fn compile(templates: &[Template]) -> ExecutorResult<Library> {
    let sources: Vec<TemplateSource<'_>> = templates
        .iter()
        .map(|t| TemplateSource {
            name: &t.name,
            template: &t.template,
            user_template: t.user_template.as_deref(),
        })
        .collect();
    Library::compile(&sources).map_err(|(name, err)| {
        let field = match &err {
            TemplateError::InvalidName {
                field: Field::UserTemplate,
                ..
            }
            | TemplateError::Unclosed {
                field: Field::UserTemplate,
                ..
            } => "userTemplate",
            _ => "template",
        };
        ExecutorError::validation(field, format!("template '{name}': {err}"))
    })
}
