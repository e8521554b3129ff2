//! Baton's own MCP server at `POST /api/v1/mcp` (DESIGN.md paths table): rmcp's Streamable
//! HTTP server with the tools `get_run`, `cancel_run`, `cancel_all_runs`, `list_flows` and
//! `run_flow`, each the same operation as its REST route.
//!
//! - The route sits behind `require_auth`, so a request without a valid key is a 401 before rmcp
//!   sees it. Every tool call takes the tenant from the `Principal` of its own HTTP request
//!   (rmcp hands the request's `http::request::Parts` to the handler): nothing about the caller
//!   is kept between requests.
//! - Stateless (no `Mcp-Session-Id`): any instance answers any request, as for the REST API.
//! - Host and Origin are checked by rmcp (DNS-rebinding protection) against `McpConfig`.
//! - Failures of an operation (not found, invalid input, a finished run) are tool results with
//!   `isError: true` whose structured content is the DESIGN.md error body; malformed arguments
//!   are `isError` results too (rmcp's message names the field), so a model can correct them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::auth::Principal;
use crate::context::RequestId;
use crate::error::{ApiError, ApiResult, ErrorResponse};
use crate::routes::flow_runs::{self, FlowRunBody};
use crate::state::{ApiConfig, AppState};

/// Where MCP requests may come from (rmcp's DNS-rebinding protection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    /// Accepted `Host` values: `name` (any port) or `name:port`. Empty accepts any host.
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host[:port|:*]`) of requests that send one; a
    /// request without `Origin` (not a browser) is not checked.
    pub allowed_origins: Vec<String>,
}

/// Loopback names: a server reached through a DNS name must list that name.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl Default for McpConfig {
    fn default() -> Self {
        let allowed_origins = ["http", "https"]
            .iter()
            .flat_map(|scheme| {
                ["localhost", "127.0.0.1", "[::1]"]
                    .iter()
                    .map(move |host| format!("{scheme}://{host}:*"))
            })
            .collect();
        Self {
            allowed_hosts: LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect(),
            allowed_origins,
        }
    }
}

pub(crate) type McpService = StreamableHttpService<BatonTools, NeverSessionManager>;

/// The rmcp service behind `/api/v1/mcp`, built once per application.
pub(crate) fn service(config: &ApiConfig) -> McpService {
    let router = Arc::new(BatonTools::tool_router());
    let transport = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(config.mcp.allowed_hosts.clone())
        .with_allowed_origins(config.mcp.allowed_origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(config.max_body_bytes);
    StreamableHttpService::new(
        move || {
            Ok(BatonTools {
                router: router.clone(),
            })
        },
        Arc::new(NeverSessionManager::default()),
        transport,
    )
}

/// MCP over Streamable HTTP: one JSON-RPC message per POST, answered as JSON.
#[utoipa::path(post, path = "/api/v1/mcp", tag = "mcp",
    request_body(content = Object, content_type = "application/json",
        description = "A JSON-RPC 2.0 message of the Model Context Protocol (initialize, tools/list, tools/call, ...). Tools: get_run, cancel_run, cancel_all_runs, list_flows, run_flow."),
    params(("Accept" = String, Header, description = "Must accept application/json and text/event-stream")),
    responses(
        (status = 200, description = "The JSON-RPC response", body = Object),
        (status = 202, description = "A notification was accepted"),
        (status = 400, description = "The body is not JSON (INVALID_JSON) or no JSON-RPC message", body = ErrorResponse),
        (status = 401, description = "Not authenticated", body = ErrorResponse),
        (status = 403, description = "Host or Origin not allowed", body = ErrorResponse),
        (status = 406, description = "Accept does not allow JSON and event streams", body = ErrorResponse),
        (status = 415, description = "The body is not JSON", body = ErrorResponse),
    ))]
pub async fn mcp_endpoint(State(state): State<AppState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    widen_accept(&mut parts.headers);
    let limit = state.config.max_body_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return ApiError::PayloadTooLarge { limit }.into_response();
    };
    if let Some(answer) = invalid_params(&bytes) {
        return answer;
    }
    let mut request = Request::from_parts(parts, Body::from(bytes));
    request.extensions_mut().insert(state.clone());
    let response = state.mcp.handle(request).await.map(Body::new);
    in_error_shape(response).await
}

/// `*/*` accepts both of the transport's types, but rmcp looks for them by name.
fn widen_accept(headers: &mut HeaderMap) {
    let any = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|media| media.split(';').next().is_some_and(|m| m.trim() == "*/*"));
    if any {
        headers.insert(
            header::ACCEPT,
            header::HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
}

/// A request rmcp would answer "method not found" (or, for params that are no object, "no
/// JSON-RPC message") because its params do not parse: JSON-RPC's "invalid params" (-32602)
/// instead, with the reason. The params are read with rmcp's own types, so what passes here is
/// what rmcp reads.
fn invalid_params(body: &[u8]) -> Option<Response> {
    use rmcp::model::{CallToolRequestParams, InitializeRequestParams, PaginatedRequestParams};
    fn reads<T: serde::de::DeserializeOwned>(params: Option<&Value>) -> Result<(), String> {
        let params = params.cloned().unwrap_or_else(|| json!({}));
        serde_json::from_value::<T>(params)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    let message: Value = serde_json::from_slice(body).ok()?;
    let id = message.get("id")?.clone();
    let params = message.get("params").filter(|p| !p.is_null());
    let problem = if params.is_some_and(|p| !p.is_object()) {
        Err("params must be an object".to_string())
    } else {
        match message.get("method")?.as_str()? {
            "tools/call" => reads::<CallToolRequestParams>(params),
            "initialize" => reads::<InitializeRequestParams>(params),
            "tools/list" => reads::<Option<PaginatedRequestParams>>(params),
            _ => Ok(()),
        }
    }
    .err()?;
    let answer = json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32602, "message": format!("invalid params: {problem}")}});
    Some(axum::Json(answer).into_response())
}

/// rmcp answers transport failures (Host refused, wrong Accept, ...) in plain text; they get the
/// DESIGN.md error shape with rmcp's message. JSON-RPC answers pass unchanged.
async fn in_error_shape(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let bytes = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    // A JSON-RPC error object answered with an HTTP error (a message that is no request, say)
    // gets the one error shape too, with its message.
    let rpc_message = is_json
        .then(|| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .flatten()
        .and_then(|body| body.pointer("/error/message")?.as_str().map(str::to_string));
    if is_json && rpc_message.is_none() {
        // Already JSON of another kind: passed on as it came.
        let mut passed = Response::new(Body::from(bytes));
        *passed.status_mut() = status;
        passed.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        return passed;
    }
    if let Some(message) = rpc_message.filter(|_| status == StatusCode::BAD_REQUEST) {
        return ApiError::Invalid {
            code: "VALIDATION_ERROR",
            message,
            param: None,
        }
        .into_response();
    }
    let mut message = String::from_utf8_lossy(&bytes).trim().to_string();
    if message.is_empty() {
        message = ApiError::from_status(status).to_string();
    }
    // rmcp answers a body it cannot read with 415, as for a wrong content type: malformed
    // JSON is a 400 `INVALID_JSON` and JSON that is no JSON-RPC message a 400
    // `VALIDATION_ERROR`, as everywhere else (DESIGN.md "Errors").
    let error = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE if message.contains("JSON-RPC message") => {
            ApiError::Invalid {
                code: "VALIDATION_ERROR",
                message: "the body is JSON but no JSON-RPC message".into(),
                param: None,
            }
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE if message.starts_with("fail to deserialize") => {
            ApiError::Invalid {
                code: "INVALID_JSON",
                message: format!("the body is not valid JSON: {message}"),
                param: None,
            }
        }
        StatusCode::FORBIDDEN => ApiError::Forbidden(message),
        _ if status.is_server_error() => ApiError::Internal(format!("MCP transport: {message}")),
        _ => ApiError::Status {
            status,
            code: ApiError::from_status(status).code(),
            message,
        },
    };
    error.into_response()
}

/// The caller of one tool call, read from its own HTTP request.
struct Caller {
    state: AppState,
    principal: Principal,
    request_id: String,
    headers: HeaderMap,
}

impl Caller {
    fn of(parts: &Parts) -> Result<Caller, ErrorData> {
        let missing =
            |what: &str| ErrorData::internal_error(format!("the MCP request has no {what}"), None);
        Ok(Caller {
            state: parts
                .extensions
                .get::<AppState>()
                .cloned()
                .ok_or_else(|| missing("application state"))?,
            principal: parts
                .extensions
                .get::<Principal>()
                .cloned()
                .ok_or_else(|| missing("principal"))?,
            request_id: parts
                .extensions
                .get::<RequestId>()
                .map(|id| id.0.clone())
                .ok_or_else(|| missing("request id"))?,
            headers: parts.headers.clone(),
        })
    }

    /// The tool's answer: the value as structured content, or the DESIGN.md error body with
    /// `isError` (logged like a REST error).
    fn answer<T: Serialize>(&self, tool: &str, result: ApiResult<T>) -> CallToolResult {
        let error = match result.and_then(|value| {
            serde_json::to_value(value).map_err(|e| ApiError::Internal(e.to_string()))
        }) {
            Ok(value) => return CallToolResult::structured(value),
            Err(error) => error,
        };
        if error.status().is_server_error() {
            tracing::error!(request_id = %self.request_id, tool, code = error.code(), error = %error, "MCP tool failed");
        } else {
            tracing::debug!(request_id = %self.request_id, tool, code = error.code(), error = %error, "MCP tool refused");
        }
        let body = error.body(&self.request_id);
        CallToolResult::structured_error(serde_json::to_value(body).unwrap_or(Value::Null))
    }
}

/// The arguments of an operation that takes none: any given is refused, as the other
/// operations refuse unknown ones.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArguments {}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRef {
    /// The run (request) id, as in `X-Request-Id` and the flow run response's `id`.
    pub run_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunFlowArgs {
    /// Flow id or slug.
    pub flow_id: String,
    /// Values for the templates' `[[name]]` placeholders; non-string values are inserted as
    /// JSON text.
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    /// The environment whose pinned version runs; default: the first activated.
    #[serde(default)]
    pub environment: Option<String>,
    /// Model or routing alias, instead of the template's `llm`.
    #[serde(default)]
    pub override_model: Option<String>,
    /// `Key:value` tags for the run.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// End customer to attribute usage to.
    #[serde(default)]
    pub customer_id: Option<String>,
}

impl RunFlowArgs {
    /// The REST body with the same meaning (the REST validation applies unchanged).
    fn into_body(self) -> ApiResult<FlowRunBody> {
        let mut body = Map::new();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                body.insert(key.to_string(), value);
            }
        };
        put("parameters", self.parameters.map(Value::Object));
        put("environment", self.environment.map(Value::String));
        put("overrideModel", self.override_model.map(Value::String));
        put("tags", self.tags.map(|tags| json!(tags)));
        put("customerId", self.customer_id.map(Value::String));
        serde_json::from_value(Value::Object(body))
            .map_err(|e| ApiError::Internal(format!("run_flow arguments: {e}")))
    }
}

/// The running-run ids `cancel_all_runs` asked to stop.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CancelledRuns {
    count: usize,
    run_ids: Vec<String>,
}

#[derive(Debug, Serialize)]
struct FlowList {
    flows: Vec<baton_domain::flow::Flow>,
}

/// The tools; built per request (stateless transport), sharing one router.
#[derive(Clone)]
pub(crate) struct BatonTools {
    router: Arc<ToolRouter<BatonTools>>,
}

#[tool_router]
impl BatonTools {
    #[tool(
        description = "A run's record, as GET /api/v1/runs/{runId}: status, model, usage and cost, toolCalls (each with targetUrl and originSource), callbackOrigin, warnings and cancellation fields."
    )]
    async fn get_run(
        &self,
        Parameters(args): Parameters<RunRef>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Caller::of(&parts)?;
        let result = crate::routes::flow_runs::find_run(
            &caller.state,
            &caller.principal.tenant,
            &args.run_id,
        )
        .await;
        Ok(caller.answer("get_run", result))
    }

    #[tool(
        description = "Asks a running run to stop, as POST /api/v1/runs/{runId}/cancel: it and every sub-agent stop at their next step; a model call in flight finishes and what was produced is kept and billed. Answers the run's record; a finished run is a CONFLICT error."
    )]
    async fn cancel_run(
        &self,
        Parameters(args): Parameters<RunRef>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Caller::of(&parts)?;
        let result =
            crate::routes::flow_runs::cancel(&caller.state, &caller.principal, &args.run_id).await;
        Ok(caller.answer("cancel_run", result))
    }

    #[tool(
        description = "Asks every still-running top-level run of the tenant to stop (their sub-agents stop with them). Answers {count, runIds}."
    )]
    async fn cancel_all_runs(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(NoArguments {}): Parameters<NoArguments>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Caller::of(&parts)?;
        let result = caller
            .state
            .store
            .request_cancel_all(&caller.principal.tenant, &caller.principal.actor())
            .await;
        caller.state.engine.note_cancel_request();
        let result = result
            .map(|run_ids| CancelledRuns {
                count: run_ids.len(),
                run_ids,
            })
            .map_err(ApiError::from);
        Ok(caller.answer("cancel_all_runs", result))
    }

    #[tool(
        description = "The tenant's flows, as GET /api/v1/flows: {flows: [{id, name (slug), title, activeVersions, executionMode, ...}]}."
    )]
    async fn list_flows(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(NoArguments {}): Parameters<NoArguments>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Caller::of(&parts)?;
        let result = caller
            .state
            .store
            .list_flows(&caller.principal.tenant)
            .await
            .map(|flows| FlowList { flows })
            .map_err(ApiError::from);
        Ok(caller.answer("list_flows", result))
    }

    #[tool(
        description = "Runs a flow and waits for its answer, as POST /api/v1/flows/{flowId}/runs without streaming: {id, output: {text, json}, model, servedModel, usage, toolCalls, warnings, ...}. The run's id is the MCP request's X-Request-Id."
    )]
    async fn run_flow(
        &self,
        Parameters(args): Parameters<RunFlowArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Caller::of(&parts)?;
        let result = run_flow_as(&caller, args).await;
        Ok(caller.answer("run_flow", result))
    }
}

/// The REST handler itself, so both surfaces run flows the same way.
async fn run_flow_as(caller: &Caller, args: RunFlowArgs) -> ApiResult<Value> {
    let flow_ref = args.flow_id.clone();
    let body = args.into_body()?;
    let response = flow_runs::run_flow(
        State(caller.state.clone()),
        caller.principal.clone(),
        axum::Extension(RequestId(caller.request_id.clone())),
        caller.headers.clone(),
        crate::extract::PathParam(flow_ref),
        crate::extract::Json(body),
    )
    .await?;
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::Internal(format!("reading the flow run response: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::Internal(format!("the flow run response is not JSON: {e}")))
}

#[tool_handler(router = self.router)]
impl ServerHandler for BatonTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new(
                "baton",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Baton runs the tenant's flows and reports on their runs. Use list_flows to find a flow, run_flow to run it, get_run to inspect a run, cancel_run or cancel_all_runs to stop running ones.",
            )
    }
}
