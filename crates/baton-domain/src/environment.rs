use serde::{Deserialize, Serialize};

use crate::{DomainError, DomainResult, Timestamp};

const MAX_NAME_LEN: usize = 64;

/// A tenant-level named environment (`development`, `staging`, `production`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Environment {
    pub id: String,
    pub name: String,
    pub created_at: Timestamp,
}

/// Names are free-form, but must be printable, trimmed and short enough for a URL query.
pub fn validate_environment_name(raw: &str, param: &str) -> DomainResult<String> {
    let name = raw.trim();
    if name.is_empty() {
        return Err(DomainError::validation(
            param,
            format!("{param} must not be empty"),
        ));
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Err(DomainError::validation(
            param,
            format!("{param} must be at most {MAX_NAME_LEN} characters"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(DomainError::validation(
            param,
            format!("{param} must not contain control characters"),
        ));
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            validate_environment_name("  production ", "name").unwrap(),
            "production"
        );
        assert!(validate_environment_name("", "name").is_err());
        assert!(validate_environment_name("a\u{0}b", "name").is_err());
        assert!(validate_environment_name(&"x".repeat(65), "name").is_err());
        assert!(validate_environment_name("Staging EU-1", "name").is_ok());
    }
}
