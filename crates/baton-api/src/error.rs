//! The one error type of the HTTP layer and the one place it becomes a response.
//!
//! Handlers return [`ApiError`]. Its `IntoResponse` only records the error in the response's
//! extensions; the `request_context` middleware renders the DESIGN.md body (with the request id)
//! and logs it once.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use baton_domain::DomainError;
use baton_executor::ExecutorError;
use baton_executor::error::retry_after_seconds;
use baton_providers::ProviderError;
use baton_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// Invalid input; `param` names the offending field.
    #[error("{message}")]
    Invalid {
        code: &'static str,
        message: String,
        param: Option<String>,
    },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    #[error("the request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("too many requests; retry after {} seconds", retry_after_seconds(*retry_after))]
    RateLimited { retry_after: Duration },
    #[error("the database is unavailable")]
    Unavailable,
    /// Load shedding (`overload.rs`): Baton is past its capacity and refuses new requests.
    #[error("Baton is overloaded; retry after {} seconds", retry_after_seconds(*retry_after))]
    Overloaded { retry_after: Duration },
    /// Something failed on our side; the message is logged, not sent.
    #[error("internal error: {0}")]
    Internal(String),
    /// An error response produced by a layer below the handlers (router, timeout, body limit).
    #[error("{message}")]
    Status {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
}

/// The error body of every endpoint (OpenAI-compatible, so SDKs surface it).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `VALIDATION_ERROR`.
    pub code: &'static str,
    pub message: String,
    /// OpenAI-style error class, e.g. `invalid_request_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The offending field, when one is to blame.
    pub param: Option<String>,
    pub request_id: String,
}

impl ApiError {
    pub fn validation(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            code: "VALIDATION_ERROR",
            message: message.into(),
            param: Some(param.into()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable | Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Status { status, .. } => *status,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid { code, .. }
            | Self::Conflict { code, .. }
            | Self::Status { code, .. } => code,
            Self::Unauthorized(_) => "UNAUTHORIZED",
            Self::Forbidden(_) => "FORBIDDEN",
            Self::NotFound(_) => "NOT_FOUND",
            Self::PayloadTooLarge { .. } => "PAYLOAD_TOO_LARGE",
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::Unavailable => "SERVICE_UNAVAILABLE",
            Self::Overloaded { .. } => "OVERLOADED",
            Self::Internal(_) => "INTERNAL_ERROR",
        }
    }

    fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            409 => "conflict_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The message sent to the client; internal details stay in the log.
    fn public_message(&self) -> String {
        match self {
            Self::Internal(_) => {
                "an internal error occurred; it has been logged with this request id".into()
            }
            other => other.to_string(),
        }
    }

    /// Turns an error status made by a lower layer into our error.
    pub fn from_status(status: StatusCode) -> Self {
        let (code, message) = match status.as_u16() {
            404 => ("NOT_FOUND", "no such route"),
            405 => (
                "METHOD_NOT_ALLOWED",
                "this method is not allowed on this route",
            ),
            408 | 504 => ("TIMEOUT", "the request took too long and was stopped"),
            406 => (
                "NOT_ACCEPTABLE",
                "the Accept header allows no type this route answers with",
            ),
            413 => ("PAYLOAD_TOO_LARGE", "the request body is too large"),
            415 => (
                "UNSUPPORTED_MEDIA_TYPE",
                "send a JSON body with Content-Type: application/json",
            ),
            400..=499 => ("BAD_REQUEST", "the request is invalid"),
            _ => ("INTERNAL_ERROR", "an internal error occurred"),
        };
        Self::Status {
            status,
            code,
            message: message.into(),
        }
    }

    /// The DESIGN.md error body (also the content of an MCP tool's error result).
    pub(crate) fn body(&self, request_id: &str) -> ErrorResponse {
        ErrorResponse {
            error: ErrorDetail {
                code: self.code(),
                message: self.public_message(),
                kind: self.kind(),
                param: match self {
                    Self::Invalid { param, .. } => param.clone(),
                    _ => None,
                },
                request_id: request_id.to_string(),
            },
        }
    }

    /// Builds the final response; called once by the middleware.
    pub(crate) fn render(&self, request_id: &str) -> Response {
        let body = self.body(request_id);
        let mut response = (self.status(), axum::Json(body)).into_response();
        match self {
            Self::RateLimited { retry_after } | Self::Overloaded { retry_after } => {
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_seconds(*retry_after)),
                );
            }
            Self::Unauthorized(_) => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read, so the connection closes after this answer;
            // saying so keeps the client from sending its next request on it (it did, at
            // times: the next request failed with an incomplete message).
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.status().into_response();
        response.extensions_mut().insert(self);
        response
    }
}

impl From<DomainError> for ApiError {
    fn from(err: DomainError) -> Self {
        match err {
            DomainError::Validation { param, message } => Self::Invalid {
                code: "VALIDATION_ERROR",
                message,
                param: Some(param),
            },
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { .. } => Self::NotFound(err.to_string()),
            StoreError::AlreadyExists { .. } => Self::Conflict {
                code: "ALREADY_EXISTS",
                message: err.to_string(),
            },
            StoreError::Conflict { .. } | StoreError::RunFinished(_) => Self::Conflict {
                code: "CONFLICT",
                message: err.to_string(),
            },
            StoreError::InUse { .. } => Self::Conflict {
                code: "IN_USE",
                message: err.to_string(),
            },
            StoreError::VersionActivated(_) => Self::Conflict {
                code: "VERSION_ACTIVATED",
                message: err.to_string(),
            },
            StoreError::Unavailable(_) => Self::Unavailable,
            other => Self::Internal(other.to_string()),
        }
    }
}

impl ApiError {
    /// A provider's refusal (`UNSUPPORTED`) names the request field that asked for it by the
    /// canonical (`/inference`) name; an endpoint whose body calls it otherwise renames it here
    /// (`None`: its body has no such field).
    pub(crate) fn provider_field(mut self, rename: impl FnOnce(&str) -> Option<String>) -> Self {
        if let Self::Invalid {
            code: "UNSUPPORTED",
            param,
            ..
        } = &mut self
        {
            *param = param.as_deref().and_then(rename);
        }
        self
    }
}

impl From<ProviderError> for ApiError {
    fn from(err: ProviderError) -> Self {
        ExecutorError::from(err).into()
    }
}

/// The one conversion of the engine's errors: its codes as they are, with their statuses.
impl From<ExecutorError> for ApiError {
    fn from(err: ExecutorError) -> Self {
        let code = err.code();
        let status = match &err {
            ExecutorError::Validation { param, message } => {
                return Self::Invalid {
                    code,
                    message: message.clone(),
                    param: Some(param.clone()),
                };
            }
            // A refusal of what a request field asked for names the field.
            ExecutorError::Provider(ProviderError::Unsupported {
                field: Some(field), ..
            }) => {
                return Self::Invalid {
                    code,
                    message: err.to_string(),
                    param: Some((*field).to_string()),
                };
            }
            ExecutorError::NotFound(message) => return Self::NotFound(message.clone()),
            ExecutorError::RateLimited { retry_after } => {
                return Self::RateLimited {
                    retry_after: *retry_after,
                };
            }
            ExecutorError::Unavailable => return Self::Unavailable,
            ExecutorError::Internal(message) => return Self::Internal(message.clone()),
            ExecutorError::CostLimitExceeded { .. } | ExecutorError::BudgetExceeded(_) => {
                StatusCode::PAYMENT_REQUIRED
            }
            ExecutorError::Cancelled => StatusCode::CONFLICT,
            // Reported inside streams only (an `error` event); a status for completeness.
            ExecutorError::StreamDurationExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            ExecutorError::StructuredOutputInvalid(_) => StatusCode::BAD_GATEWAY,
            ExecutorError::Provider(_) => match code {
                "MODEL_NOT_FOUND" => StatusCode::NOT_FOUND,
                "PROVIDER_NOT_CONFIGURED" | "UNSUPPORTED" | "PROVIDER_REJECTED" => {
                    StatusCode::BAD_REQUEST
                }
                "PROVIDER_TIMEOUT" => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            },
        };
        Self::Status {
            status,
            code,
            message: err.to_string(),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
