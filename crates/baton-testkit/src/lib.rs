//! Test support: a mock LLM provider on a real port that speaks the providers' wire formats
//! (OpenAI Chat Completions incl. Azure's deployment URLs, OpenAI Responses incl. Azure's v1
//! path, Anthropic Messages, Gemini
//! generateContent, Bedrock Converse with its event-stream framing), scripted per
//! request, recording what it received. Tests and benchmarks share it.
//!
//! The test-support crate is the one place besides `baton-api` that uses axum: it is the
//! providers' HTTP server, not Baton's.

pub mod bedrock;
pub mod fast;
pub mod faults;
pub mod files;
pub mod floor;
pub mod gemini;
pub mod mcp;
pub mod mock;
pub mod responses;
mod serve;
pub mod tool_host;
pub mod webhook;

pub use fast::{FastMock, FastMockOptions};
pub use faults::{PausableProxy, ResetServer};
pub use files::FileHost;
pub use mcp::MockMcpServer;
pub use mock::{Answer, CitationReply, MockProvider, Received, Reply, ToolCallReply};
pub use webhook::{Delivery, WebhookReceiver};
