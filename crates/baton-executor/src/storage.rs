//! What the engine needs from storage, as traits it owns (DESIGN.md "Crates"): `baton-store`
//! implements them over its database, [`crate::MemoryStore`] in memory. Every method touching
//! tenant data takes the tenant; another tenant's id is [`ExecutorError::NotFound`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use baton_domain::TenantId;
use baton_domain::budget::{Budget, BudgetHold};
use baton_domain::flow::{Flow, Version};
use baton_domain::logs::RunLogEntry;
use baton_domain::routing::RoutingRule;
use baton_domain::run::{RunRecord, StoredEvent};
use baton_domain::settings::TenantSettings;
use baton_domain::tool::{McpServer, Tool};

use tokio::sync::Notify;

use crate::error::ExecutorResult;

/// A flow with the environments it is active in.
#[derive(Debug, Clone)]
pub struct FoundFlow {
    pub flow: Flow,
    /// Environments by first activation, oldest first (the default is the first).
    pub environments: Vec<String>,
}

/// The definitions a run reads: flows, versions, tools, settings, routing rules, cancellation.
#[async_trait]
pub trait FlowStore: Send + Sync {
    /// A flow by id or slug.
    async fn flow(&self, tenant: &TenantId, id_or_slug: &str) -> ExecutorResult<FoundFlow>;
    async fn version(
        &self,
        tenant: &TenantId,
        flow_id: &str,
        version_id: &str,
    ) -> ExecutorResult<Version>;
    /// The tools of `ids` that exist, in the order of `ids`.
    async fn tools(&self, tenant: &TenantId, ids: &[String]) -> ExecutorResult<Vec<Tool>>;
    async fn mcp_server(&self, tenant: &TenantId, id: &str) -> ExecutorResult<McpServer>;
    /// Whether a cancel was requested for any of `run_ids` (a run and its ancestors).
    async fn cancel_requested(&self, tenant: &TenantId, run_ids: &[String])
    -> ExecutorResult<bool>;
    async fn tenant_settings(&self, tenant: &TenantId) -> ExecutorResult<TenantSettings>;
    async fn routing_rules(&self, tenant: &TenantId) -> ExecutorResult<Vec<RoutingRule>>;

    /// The tenant's budgets. A store without budgets has none.
    async fn budgets(&self, _tenant: &TenantId) -> ExecutorResult<Vec<Budget>> {
        Ok(Vec::new())
    }

    /// Holds `hold.credits` against the budget's period if its spend plus holds is still under
    /// its limit, in one atomic step; returns whether the hold was taken.
    async fn hold_budget(
        &self,
        _tenant: &TenantId,
        _budget: &Budget,
        _hold: &BudgetHold,
    ) -> ExecutorResult<bool> {
        Ok(true)
    }

    /// Gives holds back (a request that stopped before it was logged).
    async fn release_budget_holds(
        &self,
        _tenant: &TenantId,
        _holds: &[BudgetHold],
    ) -> ExecutorResult<()> {
        Ok(())
    }
}

/// One entry of the invocation log.
#[derive(Debug, Clone)]
pub enum RunItem {
    /// A run, pending (so it can be found and cancelled while it runs) or finished; a later
    /// write of the same id replaces it.
    Run(Box<RunRecord>),
    /// Lifecycle events of a run.
    Events(TenantId, Vec<StoredEvent>),
    /// Internal log lines of a run made for debugging (`crate::capture`).
    LogEntries(TenantId, Vec<RunLogEntry>),
}

/// Where finished runs go. Implementations queue (the request path never writes the log
/// itself) and may wait for room: back-pressure, never loss.
#[async_trait]
pub trait RunSink: Send + Sync {
    async fn queue(&self, item: RunItem) -> ExecutorResult<()>;

    /// Whether queued runs and their events are kept. A sink that drops them spares the
    /// request path serialising events nobody will read ([`crate::Engine::event_log`]).
    fn keeps_runs(&self) -> bool {
        true
    }

    /// A promise that a task will queue a run after its request's reply, when the sink keeps
    /// runs and would take one now without waiting for room (the writer keeps up); [`flush`]
    /// waits until every promise is kept, so a run read back by id right after its reply is
    /// found. `None`: queue the run before replying, so that while the writer is behind the
    /// wait for room slows the client (back-pressure) instead of piling up runs nobody waits
    /// for. Sinks that write at once promise nothing.
    ///
    /// [`flush`]: RunSink::flush
    fn promise_run(&self) -> Option<RunPromise> {
        None
    }

    /// Writes what is queued now (a sink that batches waits for its batch otherwise), so a run
    /// just answered can be read back by id. Sinks that write at once have nothing to do.
    async fn flush(&self) {}

    /// Whether the service is shutting down: a run dropped now was cut by it, not by its
    /// client.
    fn service_stopping(&self) -> bool {
        false
    }
}

/// The runs tasks have promised to queue after their replies ([`RunSink::promise_run`]).
#[derive(Debug, Default)]
pub struct PromisedRuns {
    outstanding: AtomicUsize,
    kept: Notify,
}

impl PromisedRuns {
    pub fn promise(self: &Arc<Self>) -> RunPromise {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        RunPromise(self.clone())
    }

    /// Returns once no promise is outstanding (runs promised meanwhile are waited for too).
    pub async fn kept(&self) {
        loop {
            let kept = self.kept.notified();
            tokio::pin!(kept);
            // Registered before the count is read: a promise kept in between still wakes it.
            kept.as_mut().enable();
            if self.outstanding.load(Ordering::SeqCst) == 0 {
                return;
            }
            kept.await;
        }
    }
}

/// Held by the task that queues a run after its reply; dropped once the run is queued (or
/// the task is dropped: nothing will come).
#[derive(Debug)]
pub struct RunPromise(Arc<PromisedRuns>);

impl Drop for RunPromise {
    fn drop(&mut self) {
        if self.0.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.kept.notify_waiters();
        }
    }
}

/// A sink that keeps nothing: the operator turned the invocation log off. The budget holds a
/// finished run carries are still given back, since no log writer will release them.
pub struct DiscardRuns {
    flows: std::sync::Arc<dyn FlowStore>,
}

impl DiscardRuns {
    pub fn new(flows: std::sync::Arc<dyn FlowStore>) -> DiscardRuns {
        DiscardRuns { flows }
    }
}

#[async_trait]
impl RunSink for DiscardRuns {
    async fn queue(&self, item: RunItem) -> ExecutorResult<()> {
        if let RunItem::Run(record) = item
            && !record.budget_holds.is_empty()
            && let Some(tenant) = &record.tenant
        {
            self.flows
                .release_budget_holds(tenant, &record.budget_holds)
                .await?;
        }
        Ok(())
    }

    fn keeps_runs(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn kept_returns_at_once_with_no_promise_outstanding() {
        let promised = Arc::new(PromisedRuns::default());
        tokio::time::timeout(Duration::from_secs(5), promised.kept())
            .await
            .expect("nothing was promised");
        drop(promised.promise());
        tokio::time::timeout(Duration::from_secs(5), promised.kept())
            .await
            .expect("the one promise was kept");
    }

    #[tokio::test]
    async fn kept_waits_for_every_outstanding_promise() {
        let promised = Arc::new(PromisedRuns::default());
        let first = promised.promise();
        let second = promised.promise();
        let waiting = tokio::spawn({
            let promised = promised.clone();
            async move { promised.kept().await }
        });
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one promise is still outstanding");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("both promises kept")
            .unwrap();
    }
}
