use std::fmt;

use serde::{Deserialize, Serialize};

/// A fresh opaque id: UUID v7, so ids sort by creation time and make stable cursors.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The tenant every stored row belongs to. Repository functions take it as an argument, so a
/// query that forgets the tenant does not compile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantId(String);

impl TenantId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
