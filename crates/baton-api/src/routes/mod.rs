//! The router: one module per resource, assembled here.

pub mod api_keys;
pub mod budgets;
pub mod chat;
pub mod chat_events;
pub mod customers;
pub mod environments;
pub mod export;
pub mod flow_runs;
pub mod flows;
pub mod health;
pub mod inference;
pub mod llm_logs;
pub mod mcp_servers;
pub mod models;
pub mod openapi;
pub mod routing_rules;
pub mod settings;
pub mod statistics;
pub mod tools;
pub mod users;

use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::login;
use crate::state::AppState;

/// Routes reachable without credentials.
pub(crate) fn public_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(crate::metrics::metrics))
        .routes(routes!(login::login))
        .routes(routes!(openapi::openapi_json))
}

/// Routes that need an API key or session token (the auth layer is added by the caller; so is
/// load shedding, documented here as every such route's 503).
pub(crate) fn protected_routes() -> OpenApiRouter<AppState> {
    let mut router = protected_route_list();
    document_shedding(router.get_openapi_mut());
    router
}

/// Adds load shedding's answer (`overload.rs`) to every operation of `api`.
fn document_shedding(api: &mut utoipa::openapi::OpenApi) {
    let overloaded = utoipa::openapi::Ref::new(openapi::OVERLOADED_RESPONSE_REF);
    for item in api.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            operation
                .responses
                .responses
                .entry("503".into())
                .or_insert_with(|| overloaded.clone().into());
        }
    }
}

fn protected_route_list() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(api_keys::list_api_keys, api_keys::create_api_key))
        .routes(routes!(api_keys::get_api_key, api_keys::revoke_api_key))
        .routes(routes!(users::list_users, users::create_user))
        .routes(routes!(users::get_user, users::delete_user))
        .routes(routes!(users::change_password))
        .routes(routes!(budgets::list_budgets, budgets::create_budget))
        .routes(routes!(
            budgets::get_budget,
            budgets::update_budget,
            budgets::delete_budget
        ))
        .routes(routes!(
            environments::list_environments,
            environments::create_environment
        ))
        .routes(routes!(environments::diff_environments))
        .routes(routes!(environments::promote_environment))
        .routes(routes!(flows::list_flows, flows::create_flow))
        .routes(routes!(
            flows::get_flow,
            flows::update_flow,
            flows::delete_flow
        ))
        .routes(routes!(flows::list_versions, flows::create_version))
        .routes(routes!(flows::get_version))
        .routes(routes!(flows::fork_version))
        .routes(routes!(flows::activate_version))
        .routes(routes!(
            flows::get_template,
            flows::put_template,
            flows::delete_template
        ))
        .routes(routes!(flows::flow_parameters))
        .routes(routes!(flow_runs::run_flow))
        .routes(routes!(flow_runs::get_run))
        .routes(routes!(flow_runs::cancel_run))
        .routes(routes!(llm_logs::list_llm_logs))
        .routes(routes!(llm_logs::get_llm_log))
        .routes(routes!(llm_logs::get_llm_log_hierarchy))
        .routes(routes!(llm_logs::get_llm_log_events))
        .routes(routes!(llm_logs::get_llm_log_event_stats))
        .routes(routes!(llm_logs::get_llm_log_entries))
        .routes(routes!(crate::mcp::mcp_endpoint))
        .routes(routes!(export::export))
        .routes(routes!(export::import))
        .routes(routes!(settings::get_settings, settings::update_settings))
        .routes(routes!(
            customers::list_customers,
            customers::create_customer
        ))
        .routes(routes!(
            customers::get_customer,
            customers::update_customer,
            customers::delete_customer
        ))
        .routes(routes!(customers::deactivate_customer))
        .routes(routes!(customers::customer_usage))
        .routes(routes!(customers::customers_usage))
        .routes(routes!(models::list_descriptors))
        .routes(routes!(models::list_models))
        .routes(routes!(models::retrieve_model))
        .routes(routes!(models::retrieve_provider_model))
        .routes(routes!(models::list_providers))
        .routes(routes!(chat::chat_completions))
        .routes(routes!(inference::inference))
        .routes(routes!(tools::list_tools, tools::create_tool))
        .routes(routes!(
            tools::get_tool,
            tools::update_tool,
            tools::delete_tool
        ))
        .routes(routes!(tools::tool_usage))
        .routes(routes!(
            mcp_servers::list_mcp_servers,
            mcp_servers::create_mcp_server
        ))
        .routes(routes!(
            mcp_servers::get_mcp_server,
            mcp_servers::update_mcp_server,
            mcp_servers::delete_mcp_server
        ))
        .routes(routes!(mcp_servers::discover_mcp_tools))
        .routes(routes!(mcp_servers::import_mcp_tools))
        .routes(routes!(statistics::statistics))
        .routes(routes!(statistics::overview))
        .routes(routes!(statistics::model_costs))
        .routes(routes!(statistics::tag_costs))
        .routes(routes!(statistics::tag_costs_by_key))
        .routes(routes!(statistics::flow_stats))
        .routes(routes!(statistics::flow_request_stats))
        .routes(routes!(statistics::flow_tree_stats))
        .routes(routes!(statistics::flow_extended_stats))
        .routes(routes!(
            routing_rules::list_routing_rules,
            routing_rules::create_routing_rule
        ))
        .routes(routes!(
            routing_rules::get_routing_rule,
            routing_rules::update_routing_rule,
            routing_rules::delete_routing_rule
        ))
}

/// The OpenAPI document of every route, generated from the handlers' annotations.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, api) = OpenApiRouter::<AppState>::with_openapi(openapi::ApiDoc::openapi())
        .merge(public_routes())
        .merge(protected_routes())
        .split_for_parts();
    api
}
