//! Baton's tool runtime. So far: the outbound guard every call to a tenant-supplied address goes
//! through (`guard`); the tool kinds (External, MCP) and the tool loop build on it.

pub mod error;
pub mod external;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
pub mod guard;
pub mod mcp;

pub use error::ToolError;
pub use guard::{Fetched, GuardPolicy, GuardedClient, is_forbidden, read_capped};
pub use mcp::{DiscoveredTool, McpEndpoint};
