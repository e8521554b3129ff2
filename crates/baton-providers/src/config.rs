//! Operator configuration of providers: base URL, credentials, and extra OpenAI-compatible
//! providers. Provider base URLs are operator input, not tenant input, so they are not guarded.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::Deserialize;

/// The seven built-in providers (DESIGN.md "Providers").
pub const BUILT_IN: &[&str] = &[
    "openai",
    "anthropic",
    "google",
    "bedrock",
    "azure",
    "mistral",
    "deepseek",
];

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireFormat {
    /// OpenAI Chat Completions (also Azure, Mistral, DeepSeek and compatible servers).
    Openai,
    Anthropic,
    Gemini,
    Bedrock,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Only for extra providers: the wire format they speak (default `openai`).
    pub kind: Option<WireFormat>,
    pub base_url: Option<String>,
    pub api_key: Option<SecretString>,
    /// Azure OpenAI `api-version`.
    pub api_version: Option<String>,
    /// AWS region for Bedrock.
    pub region: Option<String>,
    pub access_key_id: Option<SecretString>,
    pub secret_access_key: Option<SecretString>,
    pub session_token: Option<SecretString>,
    /// Models an extra provider serves (shown by `/providers`; others are still sent on).
    #[serde(default)]
    pub models: Vec<String>,
    /// Whole-call timeout for non-streaming calls, in seconds; a stream's bound from the call's
    /// start to its first delta (its response headers included), a retryable timeout.
    pub timeout_secs: Option<u64>,
    /// Connect timeout, in seconds.
    pub connect_timeout_secs: Option<u64>,
}

impl ProviderConfig {
    /// Fills unset fields from the provider's conventional environment variables
    /// (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`, `AWS_ACCESS_KEY_ID`, ...).
    pub fn with_conventional_env(
        mut self,
        key: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let secret = |names: &[&str]| names.iter().find_map(|n| lookup(n)).map(SecretString::from);
        let plain = |names: &[&str]| names.iter().find_map(|n| lookup(n));
        match key {
            "openai" => self.api_key = self.api_key.or_else(|| secret(&["OPENAI_API_KEY"])),
            "anthropic" => self.api_key = self.api_key.or_else(|| secret(&["ANTHROPIC_API_KEY"])),
            "google" => {
                self.api_key = self
                    .api_key
                    .or_else(|| secret(&["GEMINI_API_KEY", "GOOGLE_API_KEY"]))
            }
            "mistral" => self.api_key = self.api_key.or_else(|| secret(&["MISTRAL_API_KEY"])),
            "deepseek" => self.api_key = self.api_key.or_else(|| secret(&["DEEPSEEK_API_KEY"])),
            "azure" => {
                self.api_key = self.api_key.or_else(|| secret(&["AZURE_OPENAI_API_KEY"]));
                self.base_url = self.base_url.or_else(|| plain(&["AZURE_OPENAI_ENDPOINT"]));
                self.api_version = self.api_version.or_else(|| plain(&["OPENAI_API_VERSION"]));
            }
            "bedrock" => {
                self.access_key_id = self
                    .access_key_id
                    .or_else(|| secret(&["AWS_ACCESS_KEY_ID"]));
                self.secret_access_key = self
                    .secret_access_key
                    .or_else(|| secret(&["AWS_SECRET_ACCESS_KEY"]));
                self.session_token = self
                    .session_token
                    .or_else(|| secret(&["AWS_SESSION_TOKEN"]));
                self.region = self
                    .region
                    .or_else(|| plain(&["AWS_REGION", "AWS_DEFAULT_REGION"]));
            }
            _ => {}
        }
        self
    }
}

/// Every provider's configuration, keyed by provider key.
pub type ProvidersConfig = BTreeMap<String, ProviderConfig>;

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    #[test]
    fn conventional_variables_fill_gaps_but_never_override() {
        let env = |name: &str| match name {
            "OPENAI_API_KEY" => Some("sk-env".to_string()),
            "AWS_REGION" => Some("eu-west-1".to_string()),
            _ => None,
        };
        let from_env = ProviderConfig::default().with_conventional_env("openai", env);
        assert_eq!(from_env.api_key.unwrap().expose_secret(), "sk-env");
        let explicit = ProviderConfig {
            api_key: Some("sk-file".into()),
            ..Default::default()
        }
        .with_conventional_env("openai", env);
        assert_eq!(explicit.api_key.unwrap().expose_secret(), "sk-file");
        assert_eq!(
            ProviderConfig::default()
                .with_conventional_env("bedrock", env)
                .region
                .as_deref(),
            Some("eu-west-1")
        );
    }
}
