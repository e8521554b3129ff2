//! The executor's one error type. Every variant has a stable code ([`ExecutorError::code`]),
//! which is what the invocation log records; the HTTP layer converts it once into its own error
//! (status codes live there).

use std::time::Duration;

use baton_domain::DomainError;
use baton_providers::ProviderError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecutorError {
    /// Invalid input; `param` names the offending field as the client spelled it.
    #[error("{message}")]
    Validation { param: String, message: String },
    /// A flow, version, tenant or run that does not exist (or is another tenant's).
    #[error("{0}")]
    NotFound(String),
    /// Every model of the chain failed, or the chain could not be resolved.
    #[error(transparent)]
    Provider(ProviderError),
    /// The tenant's `requestsPerMinute` is used up.
    #[error("too many requests; retry after {} seconds", retry_after_seconds(*retry_after))]
    RateLimited { retry_after: Duration },
    /// The agent tree reached its cost ceiling before a model call.
    #[error(
        "the request reached its cost ceiling of {budget} credits; no further model calls were made"
    )]
    CostLimitExceeded { budget: i64 },
    /// A hard-limited budget has no room left in its period.
    #[error("{0}")]
    BudgetExceeded(String),
    /// A cancel request stopped the run before it produced anything.
    #[error("the run was cancelled before it produced anything")]
    Cancelled,
    /// An event stream reached `limits.max_stream_duration` and was ended.
    #[error(
        "the stream reached its maximum duration of {seconds} seconds (limits.max_stream_duration_secs) and was ended"
    )]
    StreamDurationExceeded { seconds: u64 },
    /// A streamed answer that does not follow the requested schema (no retry: it was sent).
    #[error("{0}")]
    StructuredOutputInvalid(String),
    /// The storage behind the traits cannot be reached.
    #[error("the database is unavailable")]
    Unavailable,
    /// Something failed on our side (a storage error, a broken configuration).
    #[error("internal error: {0}")]
    Internal(String),
}

pub type ExecutorResult<T> = Result<T, ExecutorError>;

impl ExecutorError {
    pub fn validation(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Validation {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The stable machine-readable code (DESIGN.md error codes).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Validation { .. } => "VALIDATION_ERROR",
            Self::NotFound(_) => "NOT_FOUND",
            Self::Provider(err) => provider_code(err),
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::CostLimitExceeded { .. } => "COST_LIMIT_EXCEEDED",
            Self::BudgetExceeded(_) => "BUDGET_EXCEEDED",
            Self::Cancelled => "RUN_CANCELLED",
            Self::StreamDurationExceeded { .. } => "STREAM_DURATION_EXCEEDED",
            Self::StructuredOutputInvalid(_) => "STRUCTURED_OUTPUT_INVALID",
            Self::Unavailable => "SERVICE_UNAVAILABLE",
            Self::Internal(_) => "INTERNAL_ERROR",
        }
    }
}

/// DESIGN.md "Provider failures": what the client can fix is told apart from upstream trouble.
fn provider_code(err: &ProviderError) -> &'static str {
    match err {
        ProviderError::ModelNotFound { .. } | ProviderError::UnknownProvider(_) => {
            "MODEL_NOT_FOUND"
        }
        ProviderError::NotConfigured(_) => "PROVIDER_NOT_CONFIGURED",
        ProviderError::Unsupported { .. } => "UNSUPPORTED",
        ProviderError::Timeout { .. } => "PROVIDER_TIMEOUT",
        ProviderError::InvalidOutput { .. } => "STRUCTURED_OUTPUT_INVALID",
        ProviderError::Invalid(_) => "VALIDATION_ERROR",
        // The provider refused the request itself: the client can fix it.
        ProviderError::Status {
            status: 400 | 413 | 422,
            ..
        } => "PROVIDER_REJECTED",
        ProviderError::Status { .. }
        | ProviderError::Connection { .. }
        | ProviderError::InvalidResponse { .. } => "PROVIDER_ERROR",
    }
}

impl From<DomainError> for ExecutorError {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::Validation { param, message } => Self::Validation { param, message },
        }
    }
}

impl From<ProviderError> for ExecutorError {
    fn from(err: ProviderError) -> Self {
        match err {
            // A model name or routing choice that cannot be used is the client's input.
            ProviderError::Invalid(invalid) => invalid.into(),
            other => Self::Provider(other),
        }
    }
}

/// A wait in the whole seconds a client is told (message and `Retry-After` alike): rounded up,
/// so a client that waits that long finds its slot, and at least 1.
pub fn retry_after_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}
