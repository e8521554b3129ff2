//! A fresh database per test: a temporary SQLite file, or a new PostgreSQL database when
//! `BATON_TEST_DATABASE_URL` names a server.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;

use baton_domain::TenantId;
use baton_domain::budget::{Budget, BudgetInput};
use baton_store::{Store, StoreOptions};

/// A database no other test uses, and what removes it.
pub struct Scratch {
    pub url: String,
    postgres: Option<(String, String)>,
    sqlite_file: Option<PathBuf>,
}

impl Scratch {
    pub async fn new(label: &str) -> Scratch {
        let unique = format!(
            "{label}_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        match std::env::var("BATON_TEST_DATABASE_URL") {
            Ok(admin) if admin.starts_with("postgres") => {
                let name = format!("baton_s_{unique}");
                let url = baton_store::provision::create_postgres_database(&admin, &name)
                    .await
                    .unwrap();
                Scratch {
                    url,
                    postgres: Some((admin, name)),
                    sqlite_file: None,
                }
            }
            _ => {
                let path = std::env::temp_dir().join(format!("baton_{unique}.db"));
                Scratch {
                    url: format!("sqlite://{}", path.display()),
                    postgres: None,
                    sqlite_file: Some(path),
                }
            }
        }
    }

    /// The URL a plain sea-orm connection opens (SQLite needs telling to create the file).
    pub fn raw_url(&self) -> String {
        if self.url.starts_with("sqlite:") {
            format!("{}?mode=rwc", self.url)
        } else {
            self.url.clone()
        }
    }

    pub async fn remove(self) {
        if let Some((admin, name)) = self.postgres {
            let _ = baton_store::provision::drop_postgres_database(&admin, &name).await;
        }
        if let Some(path) = self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

/// A migrated store on a fresh database.
pub struct Db {
    pub store: Store,
    scratch: Scratch,
}

pub async fn database(label: &str) -> Db {
    let scratch = Scratch::new(label).await;
    let store = Store::connect(&StoreOptions::new(scratch.url.clone()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    Db { store, scratch }
}

impl Db {
    /// The database's URL, for a connection of the test's own.
    pub fn url(&self) -> &str {
        &self.scratch.url
    }

    pub async fn drop_database(self) {
        let _ = self.store.close().await;
        self.scratch.remove().await;
    }
}

/// A monthly budget named "all" of `limit` credits over every request of `tenant`, with no
/// alerts and no hard limit until `shape` sets them.
pub async fn monthly_budget(
    store: &Store,
    tenant: &TenantId,
    limit: i64,
    shape: impl FnOnce(&mut BudgetInput),
) -> Budget {
    let mut input = BudgetInput {
        name: "all".into(),
        period: "month".into(),
        limit_credits: limit,
        alert_thresholds_percent: None,
        webhook_url: None,
        hard_limit: false,
        customer_id: None,
        tag: None,
    };
    shape(&mut input);
    store
        .create_budget(tenant, &input.validate().unwrap(), "secret")
        .await
        .unwrap()
}
