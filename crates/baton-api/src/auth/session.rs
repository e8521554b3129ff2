//! Session tokens: HS256 JWTs. The algorithm is pinned, and `exp`, `iss` and `aud` are required
//! and checked.

use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, encode};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

pub const ISSUER: &str = "baton";
pub const AUDIENCE: &str = "baton-api";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// User id.
    pub sub: String,
    /// Tenant id.
    pub tid: String,
    pub iss: String,
    pub aud: String,
    pub iat: u64,
    pub exp: u64,
    /// The user's session version when the token was issued; a password change bumps it, so
    /// older tokens are refused. Absent in tokens issued before versions existed: 0, the
    /// version of a user whose password never changed.
    #[serde(default)]
    pub ver: i64,
}

#[derive(Debug, Clone)]
pub struct SessionSettings {
    pub ttl: Duration,
}

pub struct SessionKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    ttl: Duration,
}

impl SessionKeys {
    /// `secret` must be at least 32 bytes of key material.
    pub fn new(secret: &[u8], settings: &SessionSettings) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[ISSUER]);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = 5;
        Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
            ttl: settings.ttl,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn issue(
        &self,
        user_id: &str,
        tenant_id: &str,
        session_version: i64,
    ) -> Result<String, ApiError> {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = Claims {
            sub: user_id.to_string(),
            tid: tenant_id.to_string(),
            iss: ISSUER.to_string(),
            aud: AUDIENCE.to_string(),
            iat: now,
            exp: now + self.ttl.as_secs(),
            ver: session_version,
        };
        encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|e| ApiError::Internal(format!("could not sign a session token: {e}")))
    }

    pub fn verify(&self, token: &str) -> Result<Claims, jsonwebtoken::errors::Error> {
        decode::<Claims>(token, &self.decoding, &self.validation).map(|data| data.claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ttl: u64) -> SessionKeys {
        SessionKeys::new(
            &[7u8; 32],
            &SessionSettings {
                ttl: Duration::from_secs(ttl),
            },
        )
    }

    #[test]
    fn round_trip_and_rejections() {
        let k = keys(60);
        let token = k.issue("u1", "t1", 3).unwrap();
        let claims = k.verify(&token).unwrap();
        assert_eq!(
            (claims.sub.as_str(), claims.tid.as_str(), claims.ver),
            ("u1", "t1", 3)
        );

        // Another secret, a tampered token and an expired token all fail.
        let other = SessionKeys::new(
            &[8u8; 32],
            &SessionSettings {
                ttl: Duration::from_secs(60),
            },
        );
        assert!(other.verify(&token).is_err());
        let mut tampered = token.clone();
        tampered.pop();
        assert!(k.verify(&tampered).is_err());

        let now = jsonwebtoken::get_current_timestamp();
        let expired = Claims {
            sub: "u1".into(),
            tid: "t1".into(),
            iss: ISSUER.into(),
            aud: AUDIENCE.into(),
            iat: now - 7200,
            exp: now - 3600,
            ver: 0,
        };
        let expired = encode(
            &Header::new(Algorithm::HS256),
            &expired,
            &EncodingKey::from_secret(&[7u8; 32]),
        )
        .unwrap();
        assert!(k.verify(&expired).is_err());

        // `alg: none` and other algorithms are refused.
        let none = format!(
            "{}.{}.",
            base64_url(r#"{"alg":"none","typ":"JWT"}"#),
            token.split('.').nth(1).unwrap()
        );
        assert!(k.verify(&none).is_err());
        let hs512 = encode(
            &Header::new(Algorithm::HS512),
            &claims,
            &EncodingKey::from_secret(&[7u8; 32]),
        )
        .unwrap();
        assert!(k.verify(&hs512).is_err());
    }

    fn base64_url(s: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }
}
