//! Baton's persistence layer: the only crate that knows sea-orm.
//!
//! [`Store`] wraps the connection pool. Each resource has a module of repository methods on it;
//! every method that touches tenant data takes a [`TenantId`] argument and filters by it, so
//! another tenant's row is indistinguishable from a missing one. The exceptions are the
//! authentication lookups (key hash, login email), which are what establish the tenant.

mod bulk;
mod entity;
mod error;
mod event_pages;
mod time;

pub mod abandoned;
pub mod api_keys;
pub mod budgets;
pub mod customers;
pub mod engine;
pub mod environments;
pub mod flows;
pub mod logs;
pub mod provision;
pub mod retention;
pub mod routing_rules;
pub mod runs;
pub mod secrets;
pub mod stats;
pub mod tenants;
pub mod tools;
pub mod usage;
pub mod users;

use std::sync::Arc;
use std::time::Duration;

use baton_migrations::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};

pub use baton_domain::TenantId;
pub use bulk::ARRAY_ROWS_PER_STATEMENT;
pub use error::{StoreError, StoreResult};

/// Which database engine a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of_url(url: &str) -> Option<Backend> {
        if url.starts_with("sqlite:") {
            Some(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Backend::Postgres)
        } else {
            None
        }
    }
}

/// Connection settings for [`Store::connect`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// How long SQLite waits on a locked database before failing a statement.
    pub sqlite_busy_timeout: Duration,
}

impl StoreOptions {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
            sqlite_busy_timeout: Duration::from_secs(5),
        }
    }
}

/// The database, shared by every request. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    db: DatabaseConnection,
    backend: Backend,
    options: ConnectedWith,
    /// Most log rows one PostgreSQL array statement writes ([`Store::with_array_statement_rows`]).
    array_rows: usize,
}

/// What the store was opened with, for [`Store::own_connection`]. Its `Debug` shows the URL
/// without its password.
#[derive(Clone)]
struct ConnectedWith(Arc<StoreOptions>);

impl std::fmt::Debug for ConnectedWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ConnectedWith")
            .field(&redact_url(&self.0.url))
            .finish()
    }
}

impl Store {
    /// Opens the pool. SQLite files are created if missing and run in WAL mode with a busy
    /// timeout, so readers never block the writer and writers queue instead of failing.
    pub async fn connect(options: &StoreOptions) -> StoreResult<Store> {
        let backend = Backend::of_url(&options.url).ok_or_else(|| {
            StoreError::Config(format!(
                "unsupported database URL '{}': use sqlite://PATH or postgres://...",
                redact_url(&options.url)
            ))
        })?;
        let mut connect = ConnectOptions::new(options.url.clone());
        connect
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .sqlx_logging(false);
        if backend == Backend::Sqlite {
            let busy = options.sqlite_busy_timeout;
            connect.map_sqlx_sqlite_opts(move |o| {
                o.create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(busy)
                    .foreign_keys(true)
                    .pragma("temp_store", "memory")
            });
        }
        let db = Database::connect(connect).await?;
        Ok(Store {
            db,
            backend,
            options: ConnectedWith(Arc::new(options.clone())),
            array_rows: bulk::ARRAY_ROWS_PER_STATEMENT,
        })
    }

    /// The same store, writing the invocation log's rows on PostgreSQL in statements of at
    /// most `rows` rows each (1 to [`ARRAY_ROWS_PER_STATEMENT`]), all in the batch's one
    /// transaction. The database server works through one statement in one go at normal
    /// priority; shorter statements leave a CPU free sooner for a request's thread that wakes
    /// meanwhile (docs/performance.md, "Short statements on the idle lane").
    pub fn with_array_statement_rows(mut self, rows: usize) -> Store {
        self.array_rows = rows.clamp(1, bulk::ARRAY_ROWS_PER_STATEMENT);
        self
    }

    /// Most log rows one PostgreSQL array statement of this store writes.
    pub fn array_statement_rows(&self) -> usize {
        self.array_rows
    }

    /// The same database through a pool of one connection of its own, for a task that writes
    /// in batches (the invocation log's writer). Its statements are prepared once and stay
    /// prepared on that connection, where through the shared pool each of its connections
    /// prepared them again and kept its own copy (a 128-row insert binds thousands of
    /// parameters: ~1M instructions to prepare on SQLite), and its commits never wait for a
    /// pooled connection.
    /// An in-memory SQLite database exists per connection, so such a store is returned as is.
    pub async fn own_connection(&self) -> StoreResult<Store> {
        let url = &self.options.0.url;
        if self.backend == Backend::Sqlite
            && (url.contains(":memory:") || url.contains("mode=memory"))
        {
            return Ok(self.clone());
        }
        let mut options = (*self.options.0).clone();
        options.max_connections = 1;
        Store::connect(&options).await
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Applies every pending migration.
    pub async fn migrate(&self) -> StoreResult<()> {
        Migrator::up(&self.db, None).await?;
        Ok(())
    }

    /// Round trip to the database, for readiness checks.
    pub async fn ping(&self) -> StoreResult<()> {
        self.db.execute_unprepared("SELECT 1").await?;
        Ok(())
    }

    pub async fn close(self) -> StoreResult<()> {
        self.db.close().await?;
        Ok(())
    }

    pub(crate) fn conn(&self) -> &DatabaseConnection {
        &self.db
    }

    /// A transaction that will write. On SQLite it takes the write lock at `BEGIN IMMEDIATE`, so
    /// it waits out the busy timeout instead of failing when another writer commits between its
    /// first read and first write (a deferred transaction cannot be upgraded then).
    pub(crate) async fn begin_write(&self) -> StoreResult<sea_orm::DatabaseTransaction> {
        use sea_orm::{SqliteTransactionMode, TransactionOptions, TransactionTrait};
        let options = TransactionOptions {
            sqlite_transaction_mode: (self.db.get_database_backend()
                == sea_orm::DatabaseBackend::Sqlite)
                .then_some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        };
        Ok(self.db.begin_with_options(options).await?)
    }
}

/// Hides the password of a database URL in messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Helpers for this crate's unit tests.
#[cfg(test)]
pub(crate) mod test_db {
    #![allow(clippy::unwrap_used)]

    use sea_orm::{ConnectionTrait, DbBackend, Statement};

    use crate::{Store, StoreOptions};

    /// A migrated in-memory SQLite store.
    pub async fn memory_store() -> Store {
        let mut options = StoreOptions::new("sqlite::memory:");
        // One connection: each in-memory SQLite connection is its own database.
        options.max_connections = 1;
        let store = Store::connect(&options).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    /// SQLite's plan for `statement` (SQL without `EXPLAIN QUERY PLAN`), one line per step.
    pub async fn sqlite_plan(store: &Store, mut statement: Statement) -> Vec<String> {
        assert_eq!(statement.db_backend, DbBackend::Sqlite);
        statement.sql = format!("EXPLAIN QUERY PLAN {}", statement.sql);
        store
            .conn()
            .query_all_raw(statement)
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get::<String>("", "detail").unwrap())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            Backend::of_url("sqlite://./baton.db"),
            Some(Backend::Sqlite)
        );
        assert_eq!(
            Backend::of_url("postgres://u@h/db"),
            Some(Backend::Postgres)
        );
        assert_eq!(Backend::of_url("mysql://x"), None);
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[tokio::test]
    async fn an_in_memory_database_keeps_its_one_connection() {
        let store = test_db::memory_store().await;
        // A second connection would open a second, empty in-memory database.
        let writer = store.own_connection().await.unwrap();
        writer.create_tenant("t").await.unwrap();
        assert_eq!(store.count_tenants().await.unwrap(), 1);
    }

    #[test]
    fn the_store_debug_output_hides_the_password() {
        let options = ConnectedWith(Arc::new(StoreOptions::new("postgres://u:secret@h/db")));
        assert_eq!(
            format!("{options:?}"),
            "ConnectedWith(\"postgres://u:***@h/db\")"
        );
    }
}
