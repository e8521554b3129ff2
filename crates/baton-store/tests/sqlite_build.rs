//! The bundled SQLite is built with the query planner stability guarantee (`.cargo/config.toml`,
//! `LIBSQLITE3_FLAGS`). Without it SQLite 3.47+ plans a statement with `LIMIT ?` (every
//! single-row lookup) by the bound value and compiles it again at each execution.

#![allow(clippy::unwrap_used)]

use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};

#[tokio::test]
async fn the_bundled_sqlite_keeps_plans_independent_of_bound_values() {
    let raw = Database::connect("sqlite::memory:").await.unwrap();
    let rows = raw
        .query_all_raw(Statement::from_string(
            DbBackend::Sqlite,
            "PRAGMA compile_options",
        ))
        .await
        .unwrap();
    let options: Vec<String> = rows
        .iter()
        .map(|row| row.try_get_by_index::<String>(0).unwrap())
        .collect();
    assert!(
        options.iter().any(|option| option == "ENABLE_QPSG"),
        "SQLite was built without SQLITE_ENABLE_QPSG: {options:?}"
    );
    raw.close().await.unwrap();
}
