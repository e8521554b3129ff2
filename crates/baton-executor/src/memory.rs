//! [`MemoryStore`]: the storage traits in memory, tenant-scoped like the database, for
//! embedding the engine without one (examples, tests, short-lived tools). Nothing survives the
//! process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use baton_domain::flow::{Activation, ExecutionMode, Flow, Template, Version, VersionStatus};
use baton_domain::lifecycle::LoggedAnswer;
use baton_domain::routing::RoutingRule;
use baton_domain::run::{RunRecord, StoredEvent};
use baton_domain::settings::TenantSettings;
use baton_domain::tool::{
    McpServer, ParameterType, Tool, ToolConfig, ToolParameters, ToolProperty, ToolType,
};
use baton_domain::{TenantId, Timestamp};

use crate::error::{ExecutorError, ExecutorResult};
use crate::storage::{FlowStore, FoundFlow, RunItem, RunSink};

/// Keys are `(tenant, id)`: another tenant's id is simply not found.
type Key = (String, String);

fn key(tenant: &TenantId, id: &str) -> Key {
    (tenant.as_str().to_string(), id.to_string())
}

#[derive(Default)]
struct Data {
    flows: HashMap<Key, FoundFlow>,
    versions: HashMap<Key, Version>,
    tools: HashMap<Key, Tool>,
    mcp_servers: HashMap<Key, McpServer>,
    settings: HashMap<String, TenantSettings>,
    rules: HashMap<String, Vec<RoutingRule>>,
    runs: HashMap<Key, RunRecord>,
    /// Run ids in the order they were first logged, per tenant.
    run_order: Vec<Key>,
    events: HashMap<Key, Vec<StoredEvent>>,
    cancelled: HashSet<Key>,
}

/// Flows, tools, settings and the run log of any number of tenants, in memory. Clones share
/// the same data. A tenant without settings has the defaults.
#[derive(Clone, Default)]
pub struct MemoryStore {
    data: Arc<Mutex<Data>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a flow named `name` (its slug, also usable as its id) with one version made of
    /// `templates`, activated in `environment`; `entrypoint` names the template that runs.
    /// Returns the flow.
    pub fn add_flow(
        &self,
        tenant: &TenantId,
        name: &str,
        environment: &str,
        entrypoint: &str,
        templates: Vec<Template>,
    ) -> Flow {
        let now = Timestamp::now();
        let flow_id = uuid::Uuid::now_v7().to_string();
        let version_id = uuid::Uuid::now_v7().to_string();
        let flow = Flow {
            id: flow_id.clone(),
            name: name.to_string(),
            title: name.to_string(),
            active_versions: BTreeMap::from([(environment.to_string(), version_id.clone())]),
            execution_mode: ExecutionMode::default(),
            classifier_model: None,
            created_at: now,
            updated_at: now,
        };
        let version = Version {
            id: version_id.clone(),
            flow_id: flow_id.clone(),
            number: 1,
            status: VersionStatus::Activated,
            entrypoint: entrypoint.to_string(),
            templates,
            activations: vec![Activation {
                environment: environment.to_string(),
                comment: None,
                activated_at: now,
                activated_by: "memory-store".to_string(),
            }],
            created_at: now,
        };
        let found = FoundFlow {
            flow: flow.clone(),
            environments: vec![environment.to_string()],
        };
        let mut data = self.lock();
        data.versions.insert(key(tenant, &version_id), version);
        data.flows.insert(key(tenant, &flow_id), found);
        flow
    }

    pub fn add_tool(&self, tenant: &TenantId, tool: Tool) {
        self.lock().tools.insert(key(tenant, &tool.id), tool);
    }

    pub fn add_mcp_server(&self, tenant: &TenantId, server: McpServer) {
        self.lock()
            .mcp_servers
            .insert(key(tenant, &server.id), server);
    }

    pub fn set_settings(&self, tenant: &TenantId, settings: TenantSettings) {
        self.lock()
            .settings
            .insert(tenant.as_str().to_string(), settings);
    }

    pub fn set_routing_rules(&self, tenant: &TenantId, rules: Vec<RoutingRule>) {
        self.lock().rules.insert(tenant.as_str().to_string(), rules);
    }

    /// Asks a run to stop at its next step (like `POST /runs/{runId}/cancel`).
    pub fn request_cancel(&self, tenant: &TenantId, run_id: &str) {
        self.lock().cancelled.insert(key(tenant, run_id));
    }

    /// The tenant's logged runs (root runs and their children), oldest first.
    pub fn runs(&self, tenant: &TenantId) -> Vec<RunRecord> {
        let data = self.lock();
        data.run_order
            .iter()
            .filter(|(t, _)| t == tenant.as_str())
            .filter_map(|k| data.runs.get(k).cloned())
            .collect()
    }

    pub fn run(&self, tenant: &TenantId, run_id: &str) -> Option<RunRecord> {
        self.lock().runs.get(&key(tenant, run_id)).cloned()
    }

    /// The stored lifecycle events of a run, in order.
    pub fn events(&self, tenant: &TenantId, run_id: &str) -> Vec<StoredEvent> {
        self.lock()
            .events
            .get(&key(tenant, run_id))
            .cloned()
            .unwrap_or_default()
    }
}

fn not_found(what: &str, id: &str) -> ExecutorError {
    ExecutorError::NotFound(format!("{what} '{id}' not found"))
}

#[async_trait]
impl FlowStore for MemoryStore {
    async fn flow(&self, tenant: &TenantId, id_or_slug: &str) -> ExecutorResult<FoundFlow> {
        let data = self.lock();
        data.flows
            .get(&key(tenant, id_or_slug))
            .or_else(|| {
                data.flows
                    .iter()
                    .find(|((t, _), found)| t == tenant.as_str() && found.flow.name == id_or_slug)
                    .map(|(_, found)| found)
            })
            .cloned()
            .ok_or_else(|| not_found("flow", id_or_slug))
    }

    async fn version(
        &self,
        tenant: &TenantId,
        flow_id: &str,
        version_id: &str,
    ) -> ExecutorResult<Version> {
        self.lock()
            .versions
            .get(&key(tenant, version_id))
            .filter(|v| v.flow_id == flow_id)
            .cloned()
            .ok_or_else(|| not_found("version", version_id))
    }

    async fn tools(&self, tenant: &TenantId, ids: &[String]) -> ExecutorResult<Vec<Tool>> {
        let data = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| data.tools.get(&key(tenant, id)).cloned())
            .collect())
    }

    async fn mcp_server(&self, tenant: &TenantId, id: &str) -> ExecutorResult<McpServer> {
        self.lock()
            .mcp_servers
            .get(&key(tenant, id))
            .cloned()
            .ok_or_else(|| not_found("MCP server", id))
    }

    async fn cancel_requested(
        &self,
        tenant: &TenantId,
        run_ids: &[String],
    ) -> ExecutorResult<bool> {
        let data = self.lock();
        Ok(run_ids
            .iter()
            .any(|id| data.cancelled.contains(&key(tenant, id))))
    }

    async fn tenant_settings(&self, tenant: &TenantId) -> ExecutorResult<TenantSettings> {
        Ok(self
            .lock()
            .settings
            .get(tenant.as_str())
            .cloned()
            .unwrap_or_default())
    }

    async fn routing_rules(&self, tenant: &TenantId) -> ExecutorResult<Vec<RoutingRule>> {
        Ok(self
            .lock()
            .rules
            .get(tenant.as_str())
            .cloned()
            .unwrap_or_default())
    }
}

#[async_trait]
impl RunSink for MemoryStore {
    async fn queue(&self, item: RunItem) -> ExecutorResult<()> {
        let mut data = self.lock();
        match item {
            RunItem::Run(record) => {
                let tenant = record
                    .tenant
                    .clone()
                    .ok_or_else(|| ExecutorError::Internal("a run without a tenant".into()))?;
                let k = key(&tenant, &record.id);
                if !data.runs.contains_key(&k) {
                    data.run_order.push(k.clone());
                }
                // A one-call request's lifecycle stands for its events, as the database
                // rebuilds them when read.
                let mut record = record;
                if let Some(lifecycle) = record.lifecycle.take() {
                    let answer = record
                        .response
                        .as_ref()
                        .and_then(|response| LoggedAnswer::read(response).ok());
                    let events = lifecycle.events(&record.id, answer.as_ref());
                    data.events.entry(k.clone()).or_default().extend(events);
                }
                // A later write of the same run replaces the pending one.
                data.runs.insert(k, *record);
            }
            RunItem::Events(tenant, events) => {
                for event in events {
                    data.events
                        .entry(key(&tenant, &event.run_id))
                        .or_default()
                        .push(event);
                }
            }
            // Captured log lines are a database feature; the in-memory store keeps none.
            RunItem::LogEntries(..) => {}
        }
        Ok(())
    }
}

/// A template with a system prompt and a model, everything else unset.
pub fn template(name: &str, system: &str, llm: &str) -> Template {
    Template {
        name: name.to_string(),
        description: None,
        template: system.to_string(),
        user_template: None,
        llm: Some(llm.to_string()),
        temperature: None,
        max_tool_calls: None,
        tool_ids: Vec::new(),
        fallbacks: Vec::new(),
        response_schema: None,
    }
}

/// An Agent tool `name` (also its id) that runs `flow` on a string `input`.
pub fn agent_tool(name: &str, description: &str, flow: &str) -> Tool {
    let now = Timestamp::now();
    Tool {
        id: name.to_string(),
        name: name.to_string(),
        description: Some(description.to_string()),
        tool_type: ToolType::Agent,
        type_alias: ToolType::Agent,
        parameters: ToolParameters {
            properties: vec![ToolProperty {
                name: "input".to_string(),
                description: Some("What the agent should work on".to_string()),
                kind: ParameterType::String,
                required: true,
                allowed: None,
                is_list: false,
            }],
            ..ToolParameters::default()
        },
        config: ToolConfig {
            agent_template_id: Some(flow.to_string()),
            ..ToolConfig::default()
        },
        created_at: now,
        updated_at: now,
    }
}
