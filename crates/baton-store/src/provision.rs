//! Creating and dropping whole databases: used by test suites to give each test its own
//! PostgreSQL database, and by operators' tooling.

use sea_orm::{ConnectionTrait, Database};

use crate::{StoreError, StoreResult};

fn check_name(name: &str) -> StoreResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::Config(format!(
            "invalid database name '{name}'"
        )))
    }
}

/// Creates database `name` on the server `admin_url` points at and returns the new URL.
pub async fn create_postgres_database(admin_url: &str, name: &str) -> StoreResult<String> {
    check_name(name)?;
    let admin = Database::connect(admin_url).await?;
    admin
        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
        .await?;
    admin.close().await?;
    let base = admin_url
        .rsplit_once('/')
        .map(|(base, _)| base)
        .unwrap_or(admin_url);
    Ok(format!("{base}/{name}"))
}

pub async fn drop_postgres_database(admin_url: &str, name: &str) -> StoreResult<()> {
    check_name(name)?;
    let admin = Database::connect(admin_url).await?;
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await?;
    admin.close().await?;
    Ok(())
}
