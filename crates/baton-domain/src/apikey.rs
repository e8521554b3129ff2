//! The format of API keys. A key is shown once; Baton keeps only its SHA-256 and a short prefix.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::Timestamp;

/// Every key starts with this, so leaked keys are easy to recognise (and to scan for).
pub const KEY_PREFIX: &str = "baton_";
/// Characters of the key kept in clear to let users tell keys apart.
const VISIBLE_PREFIX_LEN: usize = KEY_PREFIX.len() + 8;
const KEY_RANDOM_BYTES: usize = 32;

/// A freshly made key: the secret (shown once) and what is stored.
pub struct GeneratedKey {
    pub secret: String,
    pub hash: String,
    pub prefix: String,
}

#[derive(Debug, thiserror::Error)]
#[error("the operating system's random number generator failed: {0}")]
pub struct RandomnessError(String);

/// Fills `buf` from the OS random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), RandomnessError> {
    getrandom::fill(buf).map_err(|e| RandomnessError(e.to_string()))
}

/// Makes a new key with 256 bits of randomness.
pub fn generate_key() -> Result<GeneratedKey, RandomnessError> {
    let mut bytes = [0u8; KEY_RANDOM_BYTES];
    random_bytes(&mut bytes)?;
    let secret = format!("{KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes));
    Ok(from_secret(secret))
}

/// Describes an operator-supplied key (e.g. `BATON_BOOTSTRAP_API_KEY`) as it will be stored.
pub fn from_secret(secret: String) -> GeneratedKey {
    let hash = hash_key(&secret);
    let prefix = visible_prefix(&secret);
    GeneratedKey {
        secret,
        hash,
        prefix,
    }
}

/// Hex SHA-256 of the key. Keys carry 256 bits of entropy, so a slow hash buys nothing.
pub fn hash_key(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    // Every authenticated request hashes its key: `encode_to_slice` writes by table lookup
    // where `hex::encode` collects a char iterator (~1.5k instructions for 32 bytes).
    let mut hex = [0u8; 64];
    match hex::encode_to_slice(digest, &mut hex) {
        Ok(()) => String::from_utf8_lossy(&hex).into_owned(),
        Err(_) => hex::encode(digest), // not reached: a digest is 32 bytes
    }
}

pub fn visible_prefix(secret: &str) -> String {
    secret.chars().take(VISIBLE_PREFIX_LEN).collect()
}

/// Compares two stored hashes without leaking where they differ.
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// An API key as listed: never the secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyInfo {
    pub id: String,
    pub name: String,
    /// The first characters of the key, to tell keys apart.
    pub prefix: String,
    pub created_at: Timestamp,
    pub last_used_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_hashed() {
        let a = generate_key().unwrap();
        let b = generate_key().unwrap();
        assert_ne!(a.secret, b.secret);
        assert!(a.secret.starts_with(KEY_PREFIX));
        assert_eq!(a.secret.len(), KEY_PREFIX.len() + 43);
        assert_eq!(a.hash, hash_key(&a.secret));
        assert_eq!(a.hash.len(), 64);
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(a.secret.starts_with(&a.prefix));
        assert!(!a.hash.contains(&a.secret));
        assert!(hashes_equal(&a.hash, &hash_key(&a.secret)));
        assert!(!hashes_equal(&a.hash, &b.hash));
    }
}
