//! sea-orm entities, one module per table. Private to the store: nothing above sees them.

pub mod api_keys;
pub mod budget_alerts;
pub mod budget_charges;
pub mod budget_windows;
pub mod budgets;
pub mod customers;
pub mod environments;
pub mod flow_activations;
pub mod flow_templates;
pub mod flow_versions;
pub mod flows;
pub mod mcp_servers;
pub mod routing_rules;
pub mod run_event_pages;
pub mod run_log_entries;
pub mod run_tags;
pub mod runs;
pub mod server_secrets;
pub mod tenants;
pub mod tools;
pub mod users;
