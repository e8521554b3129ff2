//! Baton's executor: runs a model conversation with tools until it ends (SPEC.md "Tool-calling
//! loop"). The model and the observers of the run are traits the caller implements, so the loop
//! knows neither HTTP nor storage; the tools run through `baton-tools`.
//!
//! - [`toolset`]: a template's tools as provider definitions, with argument validation.
//! - [`dispatch`]: one tool call, by tool type (External, MCP; Virtual tools run at the provider).
//! - [`tool_loop`]: the loop itself: model turn, all calls of the turn in parallel, repeat.

pub mod context;
pub mod dispatch;
pub mod tool_loop;
pub mod toolset;

pub use context::{AgentContext, StateScope};
pub use dispatch::{AgentOutcome, AgentRunner, Dispatcher, McpDirectory, ToolOutcome};
pub use tool_loop::{
    DEFAULT_MAX_TOOL_ITERATIONS, LoopFailure, LoopOutcome, ModelTurns, ToolEvents, run_tool_loop,
};
pub use toolset::ToolSet;
