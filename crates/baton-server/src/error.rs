use thiserror::Error;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] baton_store::StoreError),
    #[error(transparent)]
    Api(#[from] baton_api::ApiError),
    #[error(transparent)]
    Domain(#[from] baton_domain::DomainError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
}
