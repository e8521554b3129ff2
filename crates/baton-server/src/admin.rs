//! Operator actions shared by start-up and the CLI: tenants, keys, users.

use baton_api::auth::login::hash_password_blocking;
use baton_domain::apikey::{GeneratedKey, KEY_PREFIX, from_secret, generate_key};
use baton_domain::user::{User, validate_new_user};
use baton_store::api_keys::NewApiKey;
use baton_store::tenants::Tenant;
use baton_store::{Store, StoreError};
use secrecy::{ExposeSecret, SecretString};

use crate::{Bootstrap, ServerError};

pub const DEFAULT_TENANT: &str = "default";
const MIN_BOOTSTRAP_KEY_LEN: usize = 32;

/// A configured bootstrap key is well formed. Checked before the database is touched, and
/// whether or not it will be used, so a typo is told at once rather than leaving a migrated
/// database behind or passing silently on a later start.
pub fn check_bootstrap_key(configured_key: Option<&SecretString>) -> Result<(), ServerError> {
    match configured_key.map(|secret| secret.expose_secret()) {
        Some(secret) if !secret.starts_with(KEY_PREFIX) || secret.len() < MIN_BOOTSTRAP_KEY_LEN => {
            Err(ServerError::Config(format!(
                "BATON_BOOTSTRAP_API_KEY must start with '{KEY_PREFIX}' and be at least {MIN_BOOTSTRAP_KEY_LEN} characters"
            )))
        }
        // A space or a non-ASCII character cannot travel in a bearer token: such a key would
        // never authenticate, and the operator would be locked out of the tenant.
        Some(secret) if !secret.bytes().all(|b| b.is_ascii_graphic()) => Err(ServerError::Config(
            "BATON_BOOTSTRAP_API_KEY must be printable ASCII without spaces".into(),
        )),
        _ => Ok(()),
    }
}

/// On an empty database: creates tenant `default` with one API key (`configured_key`, which
/// start-up has checked with [`check_bootstrap_key`] before opening the database, else a new
/// one).
pub async fn bootstrap_if_empty(
    store: &Store,
    configured_key: Option<&SecretString>,
) -> Result<Option<Bootstrap>, ServerError> {
    if store.count_tenants().await? > 0 {
        return Ok(None);
    }
    let key = match configured_key {
        Some(secret) => from_secret(secret.expose_secret().to_string()),
        None => new_key()?,
    };
    let tenant = match store.create_tenant(DEFAULT_TENANT).await {
        Ok(tenant) => tenant,
        // Another instance starting at the same moment won the race; it prints the key.
        Err(StoreError::AlreadyExists { .. }) => return Ok(None),
        Err(other) => return Err(other.into()),
    };
    store_key(store, &tenant, "bootstrap", &key).await?;
    Ok(Some(Bootstrap {
        tenant_name: tenant.name,
        tenant_id: tenant.id.to_string(),
        generated_api_key: configured_key.is_none().then_some(key.secret),
    }))
}

fn new_key() -> Result<GeneratedKey, ServerError> {
    generate_key().map_err(|e| ServerError::Other(e.to_string()))
}

async fn store_key(
    store: &Store,
    tenant: &Tenant,
    name: &str,
    key: &GeneratedKey,
) -> Result<(), ServerError> {
    store
        .create_api_key(
            &tenant.id,
            NewApiKey {
                name,
                key_hash: &key.hash,
                prefix: &key.prefix,
                created_by: None,
            },
        )
        .await?;
    Ok(())
}

fn validate_tenant_name(name: &str) -> Result<&str, ServerError> {
    let name = name.trim();
    let valid = !name.is_empty() && name.len() <= 128 && !name.chars().any(char::is_control);
    if valid {
        Ok(name)
    } else {
        Err(ServerError::Config(
            "tenant name must be 1 to 128 printable characters".into(),
        ))
    }
}

/// Creates a tenant and its first API key; returns the tenant and the key (shown once).
pub async fn create_tenant(store: &Store, name: &str) -> Result<(Tenant, String), ServerError> {
    let tenant = store.create_tenant(validate_tenant_name(name)?).await?;
    let key = new_key()?;
    store_key(store, &tenant, "cli", &key).await?;
    Ok((tenant, key.secret))
}

pub async fn find_tenant(store: &Store, name: &str) -> Result<Tenant, ServerError> {
    store
        .find_tenant_by_name(name.trim())
        .await?
        .ok_or_else(|| ServerError::Other(format!("tenant '{name}' not found")))
}

/// Adds an API key to an existing tenant.
pub async fn create_key(
    store: &Store,
    tenant_name: &str,
    label: &str,
) -> Result<(Tenant, String), ServerError> {
    let tenant = find_tenant(store, tenant_name).await?;
    let key = new_key()?;
    store_key(store, &tenant, label, &key).await?;
    Ok((tenant, key.secret))
}

/// Adds a user who can log in with email and password.
pub async fn create_user(
    store: &Store,
    tenant_name: &str,
    email: &str,
    password: &str,
) -> Result<User, ServerError> {
    let tenant = find_tenant(store, tenant_name).await?;
    let email = validate_new_user(email, password)?;
    let hash = hash_password_blocking(password.to_string())
        .await
        .map_err(ServerError::Other)?;
    Ok(store.create_user(&tenant.id, &email, &hash).await?)
}
