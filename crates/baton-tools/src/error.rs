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
    #[error("the response is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the tool did not answer in time")]
    Timeout,
    #[error("the request failed: {0}")]
    Request(String),
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}
