use sea_orm::{DbErr, SqlErr};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    /// No row with that id in this tenant (another tenant's row looks exactly the same).
    #[error("{resource} '{id}' not found")]
    NotFound { resource: &'static str, id: String },
    /// A unique name or id is taken.
    #[error("{resource} '{key}' already exists")]
    AlreadyExists { resource: &'static str, key: String },
    /// Another writer changed the row first; the caller may retry.
    #[error("{resource} was changed concurrently; try again")]
    Conflict { resource: &'static str },
    /// The run is finished: nothing more can be done to it (a retry cannot succeed).
    #[error("run '{0}' has already finished")]
    RunFinished(String),
    /// An activated version is read-only: fork it to change it.
    #[error("version '{0}' is activated and read-only: fork it to make changes")]
    VersionActivated(String),
    /// The row is still referenced (a tool by templates, a server by imported tools).
    #[error("{resource} '{id}' is still used by {by}")]
    InUse {
        resource: &'static str,
        id: String,
        by: String,
    },
    #[error("database configuration: {0}")]
    Config(String),
    /// A stored value could not be decoded (a bug or a hand-edited row).
    #[error("stored {0} is corrupt: {1}")]
    Corrupt(&'static str, String),
    /// The database cannot be reached (pool exhausted, connection refused or lost).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(DbErr),
}

impl From<DbErr> for StoreError {
    fn from(err: DbErr) -> Self {
        match err {
            DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => {
                StoreError::Unavailable(err.to_string())
            }
            other => StoreError::Database(other),
        }
    }
}

impl StoreError {
    pub(crate) fn not_found(resource: &'static str, id: impl Into<String>) -> Self {
        Self::NotFound {
            resource,
            id: id.into(),
        }
    }
}

/// Maps a unique-constraint violation on insert to [`StoreError::AlreadyExists`].
pub(crate) fn on_unique(resource: &'static str, key: &str) -> impl FnOnce(DbErr) -> StoreError {
    let key = key.to_string();
    move |err| match err.sql_err() {
        Some(SqlErr::UniqueConstraintViolation(_)) => StoreError::AlreadyExists { resource, key },
        _ => StoreError::from(err),
    }
}

pub type StoreResult<T> = Result<T, StoreError>;
