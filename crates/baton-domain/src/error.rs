use thiserror::Error;

/// Everything that can be wrong with input before it reaches storage.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DomainError {
    /// The value of one field is invalid; `param` names it the way the client spelled it.
    #[error("{message}")]
    Validation { param: String, message: String },
}

impl DomainError {
    pub fn validation(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Validation {
            param: param.into(),
            message: message.into(),
        }
    }
}

pub type DomainResult<T> = Result<T, DomainError>;
