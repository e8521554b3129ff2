//! The [`Engine`]: everything a run needs, built once and shared (an `Arc` inside, so clones
//! are cheap): providers and the router with its circuit breakers, the response cache, tenant
//! rate limiters, the guarded outbound client, caches of settings, routing rules and compiled
//! versions, and the storage traits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use baton_domain::TenantId;
use baton_domain::budget::Budget;
use baton_domain::flow::{Template, Version};
use baton_domain::settings::TenantSettings;
use baton_providers::Registry;
use baton_providers::routing::{Router, RouterConfig, RuleSet};
use baton_template::{Field, Library, TemplateError, TemplateSource};
use baton_tools::{GuardPolicy, GuardedClient};
use moka::future::Cache;

use crate::bounds::Limits;
use crate::cache::ResponseCache;
use crate::error::{ExecutorError, ExecutorResult};
use crate::events::EventLog;
use crate::limits::TenantLimiters;
use crate::storage::{FlowStore, FoundFlow, RunSink};
use crate::toolset::TemplateTools;

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
    // Every cache is read through `cached`: concurrent misses of one key (a burst after
    // start-up or an invalidation) wait for one load instead of each reading storage; a failed
    // load is not cached.
    /// Tenant settings read on the hot path; dropped on change (other instances: TTL).
    settings: Cache<String, Arc<TenantSettings>>,
    /// Tenant routing rules, likewise.
    rules: Cache<String, Arc<RuleSet>>,
    /// Compiled activated versions (immutable) by tenant and version id.
    versions: Cache<String, Arc<CompiledVersion>>,
    /// Tenant budgets, checked before every request; dropped on change (other instances: TTL).
    pub(crate) budgets: Cache<String, Arc<Vec<Budget>>>,
    /// A template's tools by tenant and tool ids, so a run reads none from storage and compiles
    /// no schema; a tenant's entries are dropped when any of its tools changes (other
    /// instances: TTL).
    tools: Cache<String, Arc<TemplateTools>>,
    /// Flows by tenant and id or name, as every flow run and sub-agent resolves them (with
    /// their active versions and environments); a tenant's entries are dropped when any of its
    /// flows or activations changes (other instances: TTL).
    flows_found: Cache<String, Arc<FoundFlow>>,
    /// Cancel requests made through this instance so far: a tool loop that sees the count
    /// change asks the store at its next step instead of waiting for its next periodic look.
    cancel_requests: AtomicU64,
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
                flows_found: Cache::builder()
                    .max_capacity(100_000)
                    .time_to_live(SETTINGS_CACHE_TTL)
                    .support_invalidation_closures()
                    .build(),
                cancel_requests: AtomicU64::new(0),
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

    /// The event log of request (or run) `request_id`: it stores events only if the run sink
    /// keeps them, so with the invocation log off no event is serialised for storage.
    pub fn event_log(&self, request_id: String) -> EventLog {
        EventLog::new(request_id).storing(self.inner.runs.keeps_runs())
    }

    /// The tenant's settings, from the cache when fresh.
    pub async fn tenant_settings(&self, tenant: &TenantId) -> ExecutorResult<Arc<TenantSettings>> {
        cached(&self.inner.settings, tenant.as_str(), async {
            Ok(Arc::new(self.inner.flows.tenant_settings(tenant).await?))
        })
        .await
    }

    /// Drops the cached settings; call after changing them.
    pub async fn forget_settings(&self, tenant: &TenantId) {
        self.inner.settings.invalidate(tenant.as_str()).await;
    }

    /// The tenant's routing rules by alias, from the cache when fresh.
    pub async fn routing_rules(&self, tenant: &TenantId) -> ExecutorResult<Arc<RuleSet>> {
        cached(&self.inner.rules, tenant.as_str(), async {
            Ok(Arc::new(RuleSet::new(
                self.inner.flows.routing_rules(tenant).await?,
            )))
        })
        .await
    }

    /// Drops the cached routing rules; call after changing them.
    pub async fn forget_routing_rules(&self, tenant: &TenantId) {
        self.inner.rules.invalidate(tenant.as_str()).await;
    }

    /// The tenant's budgets, from the cache when fresh.
    pub async fn budgets(&self, tenant: &TenantId) -> ExecutorResult<Arc<Vec<Budget>>> {
        cached(&self.inner.budgets, tenant.as_str(), async {
            Ok(Arc::new(self.inner.flows.budgets(tenant).await?))
        })
        .await
    }

    /// Drops the cached budgets; call after changing them.
    pub async fn forget_budgets(&self, tenant: &TenantId) {
        self.inner.budgets.invalidate(tenant.as_str()).await;
    }

    /// The tools of `ids` that exist, in the order of `ids`, from the cache when fresh.
    pub async fn tools(
        &self,
        tenant: &TenantId,
        ids: &[String],
    ) -> ExecutorResult<Arc<TemplateTools>> {
        static NO_TOOLS: LazyLock<Arc<TemplateTools>> = LazyLock::new(Arc::default);
        if ids.is_empty() {
            return Ok(NO_TOOLS.clone());
        }
        let key = format!("{}\u{1f}{}", tenant.as_str(), ids.join("\u{1f}"));
        cached(&self.inner.tools, &key, async {
            Ok(Arc::new(TemplateTools::new(
                self.inner.flows.tools(tenant, ids).await?,
            )))
        })
        .await
    }

    /// Drops the tenant's cached tool lists; call after creating, changing or deleting a tool.
    pub fn forget_tools(&self, tenant: &TenantId) {
        forget_tenant(&self.inner.tools, tenant);
    }

    /// A flow by id or name with its active versions and environments, as a run resolves it
    /// (cached: every flow run and sub-agent reads one).
    pub async fn found_flow(
        &self,
        tenant: &TenantId,
        id_or_name: &str,
    ) -> ExecutorResult<Arc<FoundFlow>> {
        let key = format!("{}\u{1f}{id_or_name}", tenant.as_str());
        cached(&self.inner.flows_found, &key, async {
            Ok(Arc::new(self.inner.flows.flow(tenant, id_or_name).await?))
        })
        .await
    }

    /// Call after storing a cancel request: running tool loops on this instance look for it
    /// at their next step.
    pub fn note_cancel_request(&self) {
        self.inner.cancel_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cancel_requests(&self) -> u64 {
        self.inner.cancel_requests.load(Ordering::Relaxed)
    }

    /// Drops the tenant's cached flows; call after changing or deleting a flow or activating a
    /// version (promotion and import included).
    pub fn forget_flows(&self, tenant: &TenantId) {
        forget_tenant(&self.inner.flows_found, tenant);
    }

    /// A version ready to run. Activated versions never change, so compiled ones are cached.
    pub async fn compiled_version(
        &self,
        tenant: &TenantId,
        flow_id: &str,
        version_id: &str,
    ) -> ExecutorResult<Arc<CompiledVersion>> {
        let key = format!("{}\u{1f}{version_id}", tenant.as_str());
        cached(&self.inner.versions, &key, async {
            let version = self
                .inner
                .flows
                .version(tenant, flow_id, version_id)
                .await?;
            let library = compile(&version.templates)?;
            Ok(Arc::new(CompiledVersion { version, library }))
        })
        .await
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

/// Drops `tenant`'s entries from a cache keyed `tenant\u{1f}...` (built with invalidation
/// closures).
fn forget_tenant<V: Clone + Send + Sync + 'static>(cache: &Cache<String, V>, tenant: &TenantId) {
    let prefix = format!("{}\u{1f}", tenant.as_str());
    if let Err(error) = cache.invalidate_entries_if(move |key, _| key.starts_with(&prefix)) {
        // Only fails when the cache was built without closures: then drop everything.
        tracing::warn!(%error, "could not drop a tenant's cached entries; dropping all");
        cache.invalidate_all();
    }
}

/// `key`'s value from `cache`, else `load`ed into it. A hit awaits only moka's `get`; the load
/// (moka's `try_get_with`: concurrent misses of one key share one load) runs boxed, so its
/// machinery, ~1.5 KB of future, is not carried by every request's future on every hit
/// (docs/performance.md, "Smaller futures").
async fn cached<V: Clone + Send + Sync + 'static>(
    cache: &Cache<String, V>,
    key: &str,
    load: impl Future<Output = ExecutorResult<V>> + Send,
) -> ExecutorResult<V> {
    if let Some(value) = cache.get(key).await {
        return Ok(value);
    }
    Box::pin(cache.try_get_with_by_ref(key, load))
        .await
        .map_err(Arc::unwrap_or_clone)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use baton_domain::routing::RoutingRule;
    use baton_domain::tool::{McpServer, Tool};
    use baton_providers::{Catalogue, ProvidersConfig};
    use tokio::sync::Semaphore;

    use super::*;
    use crate::memory::MemoryStore;

    /// Settings loads that count themselves and wait at a gate the test opens.
    struct Gated {
        inner: MemoryStore,
        loads: AtomicUsize,
        gate: Semaphore,
        /// Flow reads (not gated).
        flow_loads: AtomicUsize,
    }

    impl Gated {
        fn new() -> Gated {
            Gated {
                inner: MemoryStore::new(),
                loads: AtomicUsize::new(0),
                gate: Semaphore::new(0),
                flow_loads: AtomicUsize::new(0),
            }
        }
    }

    #[async_trait]
    impl FlowStore for Gated {
        async fn flow(&self, tenant: &TenantId, id: &str) -> ExecutorResult<FoundFlow> {
            self.flow_loads.fetch_add(1, Ordering::SeqCst);
            self.inner.flow(tenant, id).await
        }
        async fn version(
            &self,
            tenant: &TenantId,
            flow: &str,
            id: &str,
        ) -> ExecutorResult<Version> {
            self.inner.version(tenant, flow, id).await
        }
        async fn tools(&self, tenant: &TenantId, ids: &[String]) -> ExecutorResult<Vec<Tool>> {
            self.inner.tools(tenant, ids).await
        }
        async fn mcp_server(&self, tenant: &TenantId, id: &str) -> ExecutorResult<McpServer> {
            self.inner.mcp_server(tenant, id).await
        }
        async fn cancel_requested(
            &self,
            tenant: &TenantId,
            ids: &[String],
        ) -> ExecutorResult<bool> {
            self.inner.cancel_requested(tenant, ids).await
        }
        async fn tenant_settings(&self, tenant: &TenantId) -> ExecutorResult<TenantSettings> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            let _pass = self.gate.acquire().await;
            self.inner.tenant_settings(tenant).await
        }
        async fn routing_rules(&self, tenant: &TenantId) -> ExecutorResult<Vec<RoutingRule>> {
            self.inner.routing_rules(tenant).await
        }
    }

    #[tokio::test]
    async fn concurrent_misses_of_one_key_load_once() {
        let store = Arc::new(Gated::new());
        let engine = engine_over(store.clone(), Arc::new(MemoryStore::new()));
        let tenant = TenantId::new("acme");
        let readers = futures::future::join_all((0..8).map(|_| engine.tenant_settings(&tenant)));
        // Opens the gate once every reader has been polled and is waiting for the first load.
        let opener = async {
            tokio::task::yield_now().await;
            store.gate.add_permits(Semaphore::MAX_PERMITS);
        };
        let (results, ()) = tokio::join!(readers, opener);
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(store.loads.load(Ordering::SeqCst), 1);
        // A hit reads nothing.
        engine.tenant_settings(&tenant).await.unwrap();
        assert_eq!(store.loads.load(Ordering::SeqCst), 1);
        // Dropped after a change: the next read loads again.
        engine.forget_settings(&tenant).await;
        engine.tenant_settings(&tenant).await.unwrap();
        assert_eq!(store.loads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn flows_are_read_once_until_their_tenant_forgets_them() {
        let store = Arc::new(Gated::new());
        let (acme, other) = (TenantId::new("acme"), TenantId::new("other"));
        let main = || vec![crate::memory::template("main", "Hi", "openai/gpt-4o-mini")];
        store
            .inner
            .add_flow(&acme, "support", "production", "main", main());
        let engine = engine_over(store.clone(), Arc::new(MemoryStore::new()));
        let loads = || store.flow_loads.load(Ordering::SeqCst);

        let found = engine.found_flow(&acme, "support").await.unwrap();
        assert_eq!(found.flow.name, "support");
        assert_eq!(found.environments, ["production"]);
        engine.found_flow(&acme, "support").await.unwrap();
        assert_eq!(loads(), 1, "a hit reads nothing");
        // Another tenant's change keeps this tenant's entries.
        engine.forget_flows(&other);
        engine.found_flow(&acme, "support").await.unwrap();
        assert_eq!(loads(), 1);
        engine.forget_flows(&acme);
        engine.found_flow(&acme, "support").await.unwrap();
        assert_eq!(loads(), 2, "read again after the tenant's change");
        // A flow not found is not remembered as missing: created later, it is found at once.
        assert!(engine.found_flow(&acme, "later").await.is_err());
        store
            .inner
            .add_flow(&acme, "later", "production", "main", main());
        assert_eq!(
            engine.found_flow(&acme, "later").await.unwrap().flow.name,
            "later"
        );
        // Entries are per tenant: the same name elsewhere is not this flow.
        assert!(engine.found_flow(&other, "support").await.is_err());
    }

    fn engine_over(flows: Arc<dyn FlowStore>, runs: Arc<dyn RunSink>) -> Engine {
        let catalogue = Arc::new(Catalogue::shipped().unwrap());
        let registry = Registry::from_config(&ProvidersConfig::default(), catalogue).unwrap();
        Engine::new(EngineConfig::default(), Arc::new(registry), flows, runs).unwrap()
    }

    fn engine_with(runs: Arc<dyn RunSink>) -> Engine {
        engine_over(Arc::new(MemoryStore::new()), runs)
    }

    /// With the invocation log off (the discarding sink) a request's events are not stored,
    /// so none is serialised; with a sink that keeps runs they are.
    #[test]
    fn event_logs_store_only_for_a_sink_that_keeps_runs() {
        let flows: Arc<dyn FlowStore> = Arc::new(MemoryStore::new());
        let cases: [(Arc<dyn RunSink>, usize); 2] = [
            (Arc::new(MemoryStore::new()), 1),
            (Arc::new(crate::DiscardRuns::new(flows)), 0),
        ];
        for (runs, stored) in cases {
            let mut events = engine_with(runs).event_log("r1".into());
            events.record("requestStarted", serde_json::json!({}));
            assert_eq!(events.count(), 1);
            assert_eq!(events.take_stored().len(), stored);
        }
    }
}
