//! Users who log in to the UI with email and password.

use serde::{Deserialize, Serialize};

use crate::{DomainError, DomainResult, Timestamp};

pub const MIN_PASSWORD_LEN: usize = 8;
/// Bounds argon2's work on hostile input.
pub const MAX_PASSWORD_LEN: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub id: String,
    pub tenant_id: String,
    pub email: String,
    pub created_at: Timestamp,
    /// When the password was last changed (sessions issued before then are refused); null
    /// while it is the one the user was created with.
    pub password_changed_at: Option<Timestamp>,
}

/// Emails are compared case-insensitively, so they are stored lowercased.
pub fn normalize_email(raw: &str) -> DomainResult<String> {
    let email = raw.trim().to_lowercase();
    let valid = email.len() <= 320
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && email
            .split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && !domain.is_empty());
    if valid {
        Ok(email)
    } else {
        Err(DomainError::validation(
            "email",
            "email must be an address like name@example.com",
        ))
    }
}

pub fn validate_password(password: &str) -> DomainResult<()> {
    let len = password.chars().count();
    if len < MIN_PASSWORD_LEN || password.len() > MAX_PASSWORD_LEN {
        return Err(DomainError::validation(
            "password",
            format!("password must be {MIN_PASSWORD_LEN} to {MAX_PASSWORD_LEN} characters"),
        ));
    }
    Ok(())
}

/// The rules for a new user, shared by the CLI and the API: returns the normalised email.
pub fn validate_new_user(email: &str, password: &str) -> DomainResult<String> {
    let email = normalize_email(email)?;
    validate_password(password)?;
    Ok(email)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_and_passwords() {
        assert_eq!(
            normalize_email(" Ada@Example.COM ").unwrap(),
            "ada@example.com"
        );
        assert!(normalize_email("no-at-sign").is_err());
        assert!(validate_password("short").is_err());
        assert!(validate_password("long enough").is_ok());
        assert_eq!(
            validate_new_user("A@b.io", "long enough").unwrap(),
            "a@b.io"
        );
        assert!(validate_new_user("A@b.io", "short").is_err());
    }
}
