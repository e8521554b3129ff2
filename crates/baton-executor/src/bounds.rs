//! Abuse limits (operator configuration `[limits]`): what one request may make Baton hold or do.
//! Each bound fails in the way its place allows: a request over a bound is refused before
//! anything runs, a tool call over a bound fails as a tool call (the run goes on, the model is
//! told why), a stream past its lifetime ends with an `error` event.

use std::time::Duration;

/// The bounds, with production defaults (`docs/reliability.md` "Abuse limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Messages in one request's conversation (`messages` of chat and inference requests).
    pub max_messages: usize,
    /// Bytes of one tool result (External, caller-hosted and MCP tools), counted while reading.
    pub max_tool_result_bytes: usize,
    /// Lifetime of one event stream (SSE) of a chat request or flow run.
    pub max_stream_duration: Duration,
    /// Agent and CritiqueLoop calls one model turn may start; the excess calls fail.
    pub max_agent_calls_per_turn: usize,
    /// Event streams a tenant may have open at once (per instance).
    pub max_streams_per_tenant: usize,
}

/// SPEC.md "Limits": a tool's response reaches the model up to 1 MB.
pub const DEFAULT_MAX_TOOL_RESULT_BYTES: usize = 1024 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_messages: 1000,
            max_tool_result_bytes: DEFAULT_MAX_TOOL_RESULT_BYTES,
            max_stream_duration: Duration::from_secs(30 * 60),
            max_agent_calls_per_turn: 8,
            max_streams_per_tenant: 100,
        }
    }
}

impl Limits {
    /// The error a stream ends with at its lifetime bound.
    pub fn stream_duration_exceeded(&self) -> crate::ExecutorError {
        crate::ExecutorError::StreamDurationExceeded {
            seconds: self.max_stream_duration.as_secs(),
        }
    }

    /// A request's conversation over `max_messages`: the message naming the bound.
    pub fn check_messages(&self, count: usize) -> Result<(), String> {
        if count > self.max_messages {
            return Err(format!(
                "messages has {count} entries; at most {} are accepted",
                self.max_messages
            ));
        }
        Ok(())
    }
}
