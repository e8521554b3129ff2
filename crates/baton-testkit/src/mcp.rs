//! A mock MCP server speaking Streamable HTTP (rmcp's server, stateful sessions) on a random
//! loopback port, recording the tool calls and headers it received.
//!
//! Tools: `add` {a, b} -> the sum; `echo` {text, times?} -> the text repeated; `slow` {ms} ->
//! "done" after sleeping; `fail` -> an `isError` result "boom"; `big` {bytes} -> that many 'x'.
//! `tools/list` answers two tools a page, so clients must follow cursors. [`MockMcpServer::start`]
//! answers every request as an SSE stream (stateful sessions); [`MockMcpServer::start_json`]
//! answers plain JSON bodies (`Content-Type: application/json`, stateless), the other shape a
//! client must bound.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::Value;

/// Tools per `tools/list` page.
const PAGE: usize = 2;

#[derive(Default)]
struct Recorded {
    calls: Vec<(String, Value)>,
    /// (lower-case name, value) of every header of every HTTP request.
    headers: Vec<(String, String)>,
    requests: usize,
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Recorded>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Recorded> {
        // A test that panicked while holding the lock has failed already; keep recording.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct MockMcpServer {
    address: SocketAddr,
    shared: Shared,
}

impl MockMcpServer {
    pub async fn start() -> MockMcpServer {
        MockMcpServer::serve(None, StreamableHttpServerConfig::default()).await
    }

    /// Stateless, answering each request with one JSON body rather than an SSE stream.
    pub async fn start_json() -> MockMcpServer {
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true);
        MockMcpServer::serve(None, config).await
    }

    /// Answers 401 to every request without `name: value`.
    pub async fn start_with_required_header(name: &str, value: &str) -> MockMcpServer {
        MockMcpServer::serve(
            Some((name.to_ascii_lowercase(), value.to_string())),
            StreamableHttpServerConfig::default(),
        )
        .await
    }

    /// e.g. `http://127.0.0.1:PORT/mcp`
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.address)
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// (tool name, arguments) of the `tools/call` requests received, in order.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.shared.lock().calls.clone()
    }

    /// The values of header `name` over all HTTP requests received, in order.
    pub fn seen_header(&self, name: &str) -> Vec<String> {
        let name = name.to_ascii_lowercase();
        self.shared
            .lock()
            .headers
            .iter()
            .filter(|(seen, _)| *seen == name)
            .map(|(_, value)| value.clone())
            .collect()
    }

    /// Number of HTTP requests received.
    pub fn requests(&self) -> usize {
        self.shared.lock().requests
    }

    #[allow(clippy::expect_used)] // test support: failing to bind is a broken test machine
    async fn serve(
        required: Option<(String, String)>,
        config: StreamableHttpServerConfig,
    ) -> MockMcpServer {
        let shared = Shared::default();
        let router = mcp_router(shared.clone(), required, config);
        let address = crate::serve::serve_loopback(router)
            .await
            .expect("bind a loopback port");
        MockMcpServer { address, shared }
    }
}

/// The mock MCP server's route (`/mcp`) alone, for a process that serves it beside others (the
/// `baton-mock` binary). Its recordings are not reachable from outside.
pub fn router() -> Router {
    mcp_router(
        Shared::default(),
        None,
        StreamableHttpServerConfig::default(),
    )
}

fn mcp_router(
    shared: Shared,
    required: Option<(String, String)>,
    config: StreamableHttpServerConfig,
) -> Router {
    let tools = shared.clone();
    let service = StreamableHttpService::new(
        move || Ok(MockTools::new(tools.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let gate = Gate {
        shared,
        required: required.map(Arc::new),
    };
    Router::new()
        .route_service("/mcp", service)
        .layer(middleware::from_fn_with_state(gate, record_and_check))
}

#[derive(Clone)]
struct Gate {
    shared: Shared,
    required: Option<Arc<(String, String)>>,
}

/// Records every request's headers, then refuses it if the required header is missing.
async fn record_and_check(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    {
        let mut recorded = gate.shared.lock();
        recorded.requests += 1;
        recorded.headers.extend(headers.iter().map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        }));
    }
    if let Some(required) = &gate.required {
        let (name, value) = required.as_ref();
        let present = headers
            .get_all(name.as_str())
            .iter()
            .any(|seen| seen.as_bytes() == value.as_bytes());
        if !present {
            return (StatusCode::UNAUTHORIZED, "missing credentials").into_response();
        }
    }
    next.run(request).await
}

#[derive(Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: f64,
    b: f64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    text: String,
    times: Option<u32>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct SlowArgs {
    ms: u64,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct BigArgs {
    bytes: usize,
}

#[derive(Clone)]
struct MockTools {
    router: ToolRouter<MockTools>,
    shared: Shared,
}

impl MockTools {
    fn new(shared: Shared) -> MockTools {
        MockTools {
            router: MockTools::tool_router(),
            shared,
        }
    }
}

#[tool_router]
impl MockTools {
    #[tool(description = "Adds two numbers")]
    async fn add(&self, Parameters(AddArgs { a, b }): Parameters<AddArgs>) -> String {
        (a + b).to_string()
    }

    #[tool(description = "Repeats a text")]
    async fn echo(&self, Parameters(EchoArgs { text, times }): Parameters<EchoArgs>) -> String {
        text.repeat(times.unwrap_or(1) as usize)
    }

    #[tool(description = "Sleeps, then answers done")]
    async fn slow(&self, Parameters(SlowArgs { ms }): Parameters<SlowArgs>) -> String {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        "done".to_string()
    }

    #[tool(description = "Always fails")]
    async fn fail(&self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text("boom")])
    }

    #[tool(description = "Answers that many bytes of x")]
    async fn big(&self, Parameters(BigArgs { bytes }): Parameters<BigArgs>) -> String {
        "x".repeat(bytes)
    }

    /// A name with a character function names do not take (MCP allows it).
    #[tool(name = "files.read", description = "Reads a file by name")]
    async fn files_read(&self, Parameters(EchoArgs { text, .. }): Parameters<EchoArgs>) -> String {
        format!("contents of {text}")
    }
}

impl ServerHandler for MockTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let start = match request.and_then(|r| r.cursor) {
            Some(cursor) => cursor
                .parse::<usize>()
                .map_err(|_| ErrorData::invalid_params("bad cursor", None))?,
            None => 0,
        };
        let all = self.router.list_all();
        let end = (start + PAGE).min(all.len());
        let mut page =
            ListToolsResult::with_all_items(all.get(start..end).unwrap_or_default().to_vec());
        page.next_cursor = (end < all.len()).then(|| end.to_string());
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.clone().map_or(Value::Null, Value::Object);
        self.shared
            .lock()
            .calls
            .push((request.name.to_string(), arguments));
        self.router
            .call(ToolCallContext::new(self, request, context))
            .await
    }
}
