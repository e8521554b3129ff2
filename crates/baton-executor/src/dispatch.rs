//! One tool call, by tool type. External tools are HTTP GETs to the bound endpoint; MCP tools
//! go to their registered server; both through the outbound guard. Virtual tools never reach
//! here (the provider runs them). Agent and CritiqueLoop tools run their flows as child
//! requests through an [`AgentRunner`].

use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton_domain::tool::{McpServer, Tool, ToolType};
use baton_tools::external::{CallContext, OriginSource, call_external, select_endpoint};
use baton_tools::guard::redact;
use baton_tools::{GuardedClient, McpEndpoint};
use serde_json::{Map, Value};

/// SPEC.md "Limits": a tool's response reaches the model up to 1 MB (the default of
/// `limits.max_tool_result_bytes`).
pub const MAX_TOOL_RESPONSE_BYTES: usize = crate::bounds::DEFAULT_MAX_TOOL_RESULT_BYTES;

/// Finds a tenant's MCP servers (the store implements it).
#[async_trait]
pub trait McpDirectory: Send + Sync {
    async fn server(&self, id: &str) -> Option<McpServer>;
}

/// Runs an Agent tool's flow as a child request (the api crate implements it: it knows flows,
/// routing and the log). Depth limits and cycle checks are its business too.
#[async_trait]
pub trait AgentRunner: Send + Sync {
    async fn run_agent(&self, tool: &Tool, arguments: Map<String, Value>) -> AgentOutcome;
    /// A CritiqueLoop tool: producer and critic flows until the critic approves.
    async fn run_critique(&self, tool: &Tool, arguments: Map<String, Value>) -> AgentOutcome;
}

/// What a sub-agent produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOutcome {
    /// The child's final text, or why it could not run or failed.
    pub result: Result<String, String>,
    /// The child request, when one was started.
    pub child_request_id: Option<String>,
    /// Everything the child's subtree cost, in credits.
    pub child_credits: i64,
}

/// What one call produced, with where it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The text for the model, or why the call failed (also for the model).
    pub result: Result<String, String>,
    /// The endpoint called, without query or credentials.
    pub target_url: Option<String>,
    pub origin_source: Option<OriginSource>,
    /// Agent tools: the child request and its subtree's cost.
    pub child_request_id: Option<String>,
    pub child_credits: Option<i64>,
}

impl ToolOutcome {
    fn failed(message: impl Into<String>) -> ToolOutcome {
        ToolOutcome {
            result: Err(message.into()),
            target_url: None,
            origin_source: None,
            child_request_id: None,
            child_credits: None,
        }
    }
}

/// Everything a run's tool calls share.
pub struct Dispatcher<'a> {
    pub client: &'a GuardedClient,
    pub context: CallContext<'a>,
    pub mcp: &'a dyn McpDirectory,
    /// Runs Agent tools; without one they fail with a message saying so.
    pub agents: Option<&'a dyn AgentRunner>,
    /// A sub-agent's context tools answer from this.
    pub agent_context: Option<&'a crate::context::AgentContext>,
    /// One tool call's limit (`tools.call_timeout_ms`).
    pub timeout: Duration,
    /// The request's deadline: no call runs past it, whatever `timeout` says (a hung tool host
    /// would otherwise outlive the request and leave its run unfinished).
    pub deadline: Option<Instant>,
    /// Bytes of one tool result, bounded while reading (`limits.max_tool_result_bytes`).
    pub max_result_bytes: usize,
    /// Agent and CritiqueLoop calls one model turn may start (`limits.max_agent_calls_per_turn`).
    pub max_agent_calls_per_turn: usize,
}

impl Dispatcher<'_> {
    /// The time the next call may take: its own limit, cut short by the request's deadline.
    fn call_timeout(&self) -> Duration {
        match self.deadline {
            Some(deadline) => self
                .timeout
                .min(deadline.saturating_duration_since(Instant::now())),
            None => self.timeout,
        }
    }

    /// Where a call would go, for `toolStarted` (External: the bound endpoint; MCP: the
    /// server). `None` when it cannot be bound; the call then fails with the reason.
    pub async fn target(&self, tool: &Tool) -> Option<(Option<String>, Option<OriginSource>)> {
        match tool.tool_type {
            ToolType::External => select_endpoint(tool, &self.context)
                .ok()
                .map(|e| (Some(redact(&e.url)), Some(e.origin_source))),
            ToolType::Mcp => {
                let id = tool.config.mcp_server_id.as_deref()?;
                let server = self.mcp.server(id).await?;
                let url = url::Url::parse(&server.url).ok()?;
                Some((Some(redact(&url)), Some(OriginSource::Tool)))
            }
            _ => Some((None, None)),
        }
    }

    pub async fn call(&self, tool: &Tool, arguments: Map<String, Value>) -> ToolOutcome {
        match tool.tool_type {
            ToolType::External => {
                let outcome = call_external(
                    self.client,
                    tool,
                    &self.context,
                    &arguments,
                    self.call_timeout(),
                    self.max_result_bytes,
                )
                .await;
                ToolOutcome {
                    result: outcome.result.map_err(|e| e.to_string()),
                    target_url: outcome.target_url,
                    origin_source: Some(outcome.origin_source),
                    child_request_id: None,
                    child_credits: None,
                }
            }
            ToolType::Mcp => self.call_mcp(tool, arguments).await,
            ToolType::Virtual => ToolOutcome::failed(format!(
                "'{}' is run by the model provider itself and cannot be called as a function",
                tool.name
            )),
            ToolType::Agent | ToolType::CritiqueLoop => match self.agents {
                Some(agents) => {
                    let outcome = if tool.tool_type == ToolType::Agent {
                        agents.run_agent(tool, arguments).await
                    } else {
                        agents.run_critique(tool, arguments).await
                    };
                    ToolOutcome {
                        result: outcome.result,
                        target_url: None,
                        origin_source: None,
                        child_request_id: outcome.child_request_id,
                        child_credits: Some(outcome.child_credits),
                    }
                }
                None => ToolOutcome::failed(format!(
                    "'{}' is a {} tool and this run cannot start sub-agents",
                    tool.name,
                    tool.tool_type.as_str()
                )),
            },
        }
    }

    async fn call_mcp(&self, tool: &Tool, arguments: Map<String, Value>) -> ToolOutcome {
        let Some(id) = tool.config.mcp_server_id.as_deref() else {
            return ToolOutcome::failed(format!("MCP tool '{}' names no server", tool.name));
        };
        let Some(server) = self.mcp.server(id).await else {
            return ToolOutcome::failed(format!(
                "the MCP server of tool '{}' is no longer registered",
                tool.name
            ));
        };
        let url = match url::Url::parse(&server.url) {
            Ok(url) => url,
            Err(e) => return ToolOutcome::failed(format!("the MCP server URL is invalid: {e}")),
        };
        let target_url = Some(redact(&url));
        let endpoint = McpEndpoint {
            url: &url,
            headers: &server.headers,
        };
        let result = baton_tools::mcp::call_tool(
            self.client,
            endpoint,
            tool.config.mcp_tool_name.as_deref().unwrap_or(&tool.name),
            arguments,
            self.call_timeout(),
            self.max_result_bytes,
        )
        .await
        .map_err(|e| format!("MCP server '{}': {e}", server.name));
        ToolOutcome {
            result,
            target_url,
            origin_source: Some(OriginSource::Tool),
            child_request_id: None,
            child_credits: None,
        }
    }
}
