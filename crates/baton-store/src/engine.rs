//! The executor's storage traits over the database: what a run reads ([`FlowStore`] on
//! [`Store`]) and where it logs ([`RunSink`] on the batched [`RunWriter`]).

use async_trait::async_trait;
use baton_domain::TenantId;
use baton_domain::budget::{Budget, BudgetHold};
use baton_domain::flow::Version;
use baton_domain::routing::RoutingRule;
use baton_domain::settings::TenantSettings;
use baton_domain::tool::{McpServer, Tool};
use baton_executor::{
    ExecutorError, ExecutorResult, FlowStore, FoundFlow, RunItem, RunPromise, RunSink,
};

use crate::runs::{LogItem, RunWriter};
use crate::{Store, StoreError};

impl From<StoreError> for ExecutorError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { .. } => ExecutorError::NotFound(err.to_string()),
            StoreError::Unavailable(_) => ExecutorError::Unavailable,
            other => ExecutorError::Internal(other.to_string()),
        }
    }
}

#[async_trait]
impl FlowStore for Store {
    async fn flow(&self, tenant: &TenantId, id_or_slug: &str) -> ExecutorResult<FoundFlow> {
        let found = self.get_flow(tenant, id_or_slug).await?;
        Ok(FoundFlow {
            flow: found.flow,
            environments: found.environments,
        })
    }

    async fn version(
        &self,
        tenant: &TenantId,
        flow_id: &str,
        version_id: &str,
    ) -> ExecutorResult<Version> {
        Ok(self.get_version(tenant, flow_id, version_id).await?)
    }

    async fn tools(&self, tenant: &TenantId, ids: &[String]) -> ExecutorResult<Vec<Tool>> {
        Ok(self.tools_by_ids(tenant, ids).await?)
    }

    async fn mcp_server(&self, tenant: &TenantId, id: &str) -> ExecutorResult<McpServer> {
        Ok(self.get_mcp_server(tenant, id).await?)
    }

    async fn cancel_requested(
        &self,
        tenant: &TenantId,
        run_ids: &[String],
    ) -> ExecutorResult<bool> {
        Ok(Store::cancel_requested(self, tenant, run_ids).await?)
    }

    async fn tenant_settings(&self, tenant: &TenantId) -> ExecutorResult<TenantSettings> {
        Ok(Store::tenant_settings(self, tenant).await?.settings)
    }

    async fn routing_rules(&self, tenant: &TenantId) -> ExecutorResult<Vec<RoutingRule>> {
        Ok(self.list_routing_rules(tenant).await?)
    }

    async fn budgets(&self, tenant: &TenantId) -> ExecutorResult<Vec<Budget>> {
        Ok(self.list_budgets(tenant).await?)
    }

    async fn hold_budget(
        &self,
        tenant: &TenantId,
        budget: &Budget,
        hold: &BudgetHold,
    ) -> ExecutorResult<bool> {
        Ok(Store::hold_budget(self, tenant, budget, hold).await?)
    }

    async fn release_budget_holds(
        &self,
        tenant: &TenantId,
        holds: &[BudgetHold],
    ) -> ExecutorResult<()> {
        Ok(Store::release_budget_holds(self, tenant, holds).await?)
    }
}

#[async_trait]
impl RunSink for RunWriter {
    async fn queue(&self, item: RunItem) -> ExecutorResult<()> {
        let item = match item {
            RunItem::Run(record) => LogItem::Run(record),
            RunItem::Events(tenant, events) => LogItem::Events(tenant, events),
            RunItem::LogEntries(tenant, lines) => LogItem::LogEntries(tenant, lines),
        };
        Ok(self.write(item).await?)
    }

    async fn flush(&self) {
        // A run answered a moment ago may not be queued yet (its task runs after the reply).
        self.promised_runs_queued().await;
        RunWriter::flush(self).await;
    }

    fn promise_run(&self) -> Option<RunPromise> {
        RunWriter::promise_run(self)
    }

    fn service_stopping(&self) -> bool {
        RunWriter::service_stopping(self)
    }
}
