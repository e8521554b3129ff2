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
//! - [`storage`], [`memory`]: the storage traits and the in-memory store.
//!
//! # Embedding
//!
//! An engine over a [`MemoryStore`] and one OpenAI-compatible provider (here the testkit mock),
//! running a flow whose template has an Agent tool that runs a second flow, streamed
//! (`cargo run -p baton-executor --example embed` is the same as a program):
//!
//! ```
//! use std::sync::Arc;
//!
//! use baton_domain::TenantId;
//! use baton_executor::memory::{agent_tool, template};
//! use baton_executor::{Engine, EngineConfig, FlowRunRequest, MemoryStore};
//! use baton_providers::{Catalogue, ProviderConfig, ProvidersConfig, Registry};
//! use baton_testkit::{MockProvider, Reply};
//! use futures::StreamExt;
//! use serde_json::json;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any OpenAI-compatible server; the mock answers: a tool call, the agent, the final answer.
//! let mock = MockProvider::start().await?;
//! mock.push(Reply::tool_call("researcher", json!({"input": "tides"})));
//! mock.push(Reply::text("The moon pulls the oceans."));
//! mock.push(Reply::text("Tides come from the moon."));
//! let providers = ProvidersConfig::from([(
//!     "openai".to_string(),
//!     ProviderConfig {
//!         base_url: Some(mock.openai_base()),
//!         api_key: Some("sk-test".to_string().into()),
//!         ..ProviderConfig::default()
//!     },
//! )]);
//! let registry = Registry::from_config(&providers, Arc::new(Catalogue::shipped()?))?;
//!
//! let store = MemoryStore::new();
//! let engine = Engine::new(
//!     EngineConfig::default(),
//!     Arc::new(registry),
//!     Arc::new(store.clone()),
//!     Arc::new(store.clone()),
//! )?;
//!
//! let tenant = TenantId::new("acme");
//! let llm = "openai/gpt-4o-mini";
//! store.add_flow(&tenant, "researcher", "production", "main",
//!     vec![template("main", "You research a topic.", llm)]);
//! store.add_tool(&tenant, agent_tool("researcher", "Researches a topic", "researcher"));
//! let mut writer = template("main", "Answer with the researcher's help.", llm);
//! writer.user_template = Some("[[question]]".into());
//! writer.tool_ids = vec!["researcher".into()];
//! store.add_flow(&tenant, "writer", "production", "main", vec![writer]);
//!
//! let mut request = FlowRunRequest::new(tenant.clone(), "run-1", "writer");
//! request.parameters = json!({"question": "Why are there tides?"}).as_object().cloned();
//! let mut events = engine.run_flow_stream(request).await?;
//! let mut types = Vec::new();
//! while let Some(envelope) = events.next().await {
//!     types.push(envelope["type"].as_str().unwrap_or_default().to_string());
//!     if envelope["type"] == "requestCompleted" {
//!         assert_eq!(envelope["data"]["result"]["textResponse"], "Tides come from the moon.");
//!     }
//! }
//! assert_eq!(types.first().map(String::as_str), Some("requestStarted"));
//! assert!(types.iter().any(|t| t == "agentCompleted"));
//! assert_eq!(types.last().map(String::as_str), Some("requestCompleted"));
//! // The run and its sub-agent are in the log.
//! assert_eq!(store.runs(&tenant).len(), 2);
//! # Ok(())
//! # }
//! ```

pub mod agents;
pub mod bounds;
pub mod budgets;
pub mod cache;
pub mod capture;
pub mod context;
pub mod critique;
pub mod dispatch;
pub mod engine;
pub mod error;
pub mod events;
pub mod flow_run;
pub mod gateway;
pub mod images;
pub mod limits;
pub mod memory;
pub mod runlog;
pub mod storage;
pub mod stream;
pub mod tool_loop;
pub mod toolrun;
pub mod toolset;

pub use bounds::Limits;
pub use context::{AgentContext, StateScope};
pub use dispatch::{AgentOutcome, AgentRunner, Dispatcher, McpDirectory, ToolOutcome};
pub use engine::{CompiledVersion, Engine, EngineConfig};
pub use error::{ExecutorError, ExecutorResult};
pub use events::{EventFilter, EventOptions};
pub use flow_run::{EnvelopeStream, FlowRunOutcome, FlowRunRequest};
pub use gateway::RequestTimeouts;
pub use memory::MemoryStore;
pub use storage::{DiscardRuns, FlowStore, FoundFlow, PromisedRuns, RunItem, RunPromise, RunSink};
pub use tool_loop::{
    DEFAULT_MAX_TOOL_ITERATIONS, LoopFailure, LoopOutcome, ModelTurns, ToolEvents, run_tool_loop,
};
pub use toolrun::Callback;
pub use toolset::{TemplateTools, ToolSet};
