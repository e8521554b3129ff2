//! Baton's engine: flow runs, the tool-calling loop, agent trees, cancellation and events. It
//! knows neither HTTP nor sea-orm: storage is the [`FlowStore`] and [`RunSink`] traits, which
//! `baton-store` implements over its database and [`MemoryStore`] in memory, and providers are
//! `baton-providers`. The HTTP layer parses requests into [`FlowRunRequest`]s and renders
//! outcomes, events and [`ExecutorError`]s.
//!
//! - [`engine`]: the [`Engine`], built once (providers, router, caches, limits, storage).
//! - [`flow_run`]: [`Engine::run_flow`] and [`Engine::run_flow_stream`].
//! - [`gateway`]: what every model call goes through (rate limit, routing, timeouts, cache).
//! - [`toolrun`], [`agents`], [`critique`]: a run with tools, sub-agents, critique loops.
//! - [`tool_loop`], [`toolset`], [`dispatch`], [`context`]: the loop and one tool call.
//! - [`events`], [`stream`]: event envelopes, filters, the stream of a single call.
//! - [`runlog`]: the invocation log record of a run, priced with the ledger.
//! - [`storage`]: the storage traits.

pub mod agents;
pub mod cache;
pub mod context;
pub mod critique;
pub mod dispatch;
pub mod engine;
pub mod error;
pub mod events;
pub mod flow_run;
pub mod gateway;
pub mod limits;
pub mod runlog;
pub mod storage;
pub mod stream;
pub mod tool_loop;
pub mod toolrun;
pub mod toolset;

pub use context::{AgentContext, StateScope};
pub use dispatch::{AgentOutcome, AgentRunner, Dispatcher, McpDirectory, ToolOutcome};
pub use engine::{CompiledVersion, Engine, EngineConfig};
pub use error::{ExecutorError, ExecutorResult};
pub use events::{EventFilter, EventOptions};
pub use flow_run::{EnvelopeStream, FlowRunOutcome, FlowRunRequest};
pub use gateway::RequestTimeouts;
pub use storage::{FlowStore, FoundFlow, RunItem, RunSink};
pub use tool_loop::{
    DEFAULT_MAX_TOOL_ITERATIONS, LoopFailure, LoopOutcome, ModelTurns, ToolEvents, run_tool_loop,
};
pub use toolrun::Callback;
pub use toolset::ToolSet;
