use thiserror::Error;

/// Why a tool call (or a request to a tenant-supplied address) failed. Messages name the cause
/// for the model and the log; they never carry a token or a URL's query.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ToolError {
    /// The destination is private or reserved (or not http/https).
    #[error("refused to call {target}: {reason}")]
    Forbidden { target: String, reason: String },
    #[error("more than {0} redirects")]
    TooManyRedirects(usize),
    #[error("the tool result is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the tool did not answer in time")]
    Timeout,
    #[error("the request failed: {0}")]
    Request(String),
    #[error("could not build the HTTP client: {0}")]
    Client(String),
    /// A configured header cannot be sent (its value is never shown: it is usually a secret).
    #[error("invalid header '{name}': {reason}")]
    InvalidHeader { name: String, reason: String },
    /// The MCP server answered with a protocol error (unknown tool, bad arguments, ...).
    #[error("the MCP server answered with an error: {0}")]
    Mcp(String),
    /// The tool ran and reported a failure (an MCP result with `isError`); its text.
    #[error("the tool reported an error: {0}")]
    ToolReported(String),
    /// No endpoint could be bound, or the request could not be built (the message names why).
    #[error("{0}")]
    Unbound(String),
    /// The tool answered with a non-2xx status; `body` is a short prefix of its answer.
    #[error("the tool answered with status {status}: {body}")]
    Status { status: u16, body: String },
}
