//! Baton's schema, one dated module per migration. The same migrations run on SQLite and
//! PostgreSQL; they use only types both understand.
//!
//! Conventions: ids are text (UUID v7); timestamps are BIGINT epoch milliseconds, so time
//! arithmetic and bucketing are the same SQL on both databases; every tenant-owned table has a
//! `tenant_id` column and its unique indexes lead with it.

pub use sea_orm_migration::prelude::*;

mod m20261122_000001_foundation;
mod m20261122_000002_runs;
mod m20261122_000003_routing;
mod m20261122_000004_flows;
mod m20261122_000005_tools;
mod m20261123_000001_run_log_entries;
mod m20261123_000002_budgets;
mod m20261123_000003_flow_stats_index;
mod m20261123_000004_run_budget_holds;
mod m20261124_000001_leaner_run_log;
mod m20261124_000002_packed_event_pages;
mod m20261127_000001_log_tables_without_tenant_keys;
mod m20261127_000002_one_row_a_run;
mod m20261129_000001_budget_alert_leases;
mod m20261129_000002_budget_alert_retries;
mod m20261129_000003_user_sessions;
mod m20261129_000004_run_inference_count;
mod m20261202_000001_call_lifecycles;
pub mod packed_pages;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261122_000001_foundation::Migration),
            Box::new(m20261122_000002_runs::Migration),
            Box::new(m20261122_000003_routing::Migration),
            Box::new(m20261122_000004_flows::Migration),
            Box::new(m20261122_000005_tools::Migration),
            Box::new(m20261123_000001_run_log_entries::Migration),
            Box::new(m20261123_000002_budgets::Migration),
            Box::new(m20261123_000003_flow_stats_index::Migration),
            Box::new(m20261123_000004_run_budget_holds::Migration),
            Box::new(m20261124_000001_leaner_run_log::Migration),
            Box::new(m20261124_000002_packed_event_pages::Migration),
            Box::new(m20261127_000001_log_tables_without_tenant_keys::Migration),
            Box::new(m20261127_000002_one_row_a_run::Migration),
            Box::new(m20261129_000001_budget_alert_leases::Migration),
            Box::new(m20261129_000002_budget_alert_retries::Migration),
            Box::new(m20261129_000003_user_sessions::Migration),
            Box::new(m20261129_000004_run_inference_count::Migration),
            Box::new(m20261202_000001_call_lifecycles::Migration),
        ]
    }
}
