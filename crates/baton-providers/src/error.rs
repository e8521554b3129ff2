use std::time::Duration;

use baton_domain::DomainError;
use baton_domain::chat::Usage;
use thiserror::Error;

/// Why a model call failed. Messages keep what the provider said but never a credential.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ProviderError {
    /// The provider answered with an error status.
    #[error("{provider} answered {status}: {message}")]
    Status {
        provider: String,
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("{provider} did not answer in time ({stage})")]
    Timeout {
        provider: String,
        stage: &'static str,
    },
    #[error("could not reach {provider}: {message}")]
    Connection { provider: String, message: String },
    #[error("{provider} sent a response that cannot be read: {message}")]
    InvalidResponse { provider: String, message: String },
    #[error("{provider} does not know model '{model}': {message}")]
    ModelNotFound {
        provider: String,
        model: String,
        message: String,
    },
    #[error("provider '{0}' is not configured: set its API key (see the README)")]
    NotConfigured(String),
    #[error("unknown provider '{0}'")]
    UnknownProvider(String),
    /// The answer did not follow the requested JSON Schema, twice.
    #[error("{provider} answered twice without following the response schema: {message}")]
    InvalidOutput {
        provider: String,
        message: String,
        /// What the two answers cost: billed although the request failed.
        usage: Usage,
    },
    /// A model name or routing choice that cannot be used, named by its field.
    #[error(transparent)]
    Invalid(#[from] DomainError),
    /// The request asks for something this provider cannot do (e.g. a vendor tool it lacks).
    /// `field`: the request field that asked for it (`InferenceRequest`'s name), when one did.
    #[error("{provider} does not support {what}")]
    Unsupported {
        provider: String,
        what: String,
        field: Option<&'static str>,
    },
}

impl ProviderError {
    /// Retryable failures move on to the next model of a chain (DESIGN.md "Model resolution").
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Status { status, .. } => {
                *status == 429 || *status == 408 || *status >= 500
            }
            ProviderError::Timeout { .. } | ProviderError::Connection { .. } => true,
            ProviderError::InvalidResponse { .. }
            | ProviderError::InvalidOutput { .. }
            | ProviderError::ModelNotFound { .. }
            | ProviderError::NotConfigured(_)
            | ProviderError::UnknownProvider(_)
            | ProviderError::Invalid(_)
            | ProviderError::Unsupported { .. } => false,
        }
    }

    /// A short word for the invocation log's attempt list.
    pub fn outcome(&self) -> &'static str {
        match self {
            ProviderError::Status { status: 429, .. } => "rate_limited",
            ProviderError::Status { status, .. } if *status >= 500 => "server_error",
            ProviderError::Status { .. } => "rejected",
            ProviderError::Timeout { .. } => "timeout",
            ProviderError::Connection { .. } => "connection_error",
            ProviderError::InvalidResponse { .. } => "invalid_response",
            ProviderError::ModelNotFound { .. } | ProviderError::UnknownProvider(_) => {
                "model_not_found"
            }
            ProviderError::NotConfigured(_) => "not_configured",
            ProviderError::InvalidOutput { .. } => "invalid_output",
            ProviderError::Invalid(_) => "invalid_request",
            ProviderError::Unsupported { .. } => "unsupported",
        }
    }

    /// Tokens a failed call still consumed.
    pub fn spent_usage(&self) -> Option<Usage> {
        match self {
            ProviderError::InvalidOutput { usage, .. } => Some(*usage),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The upstream HTTP status, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ProviderError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type ProviderResult<T> = Result<T, ProviderError>;
