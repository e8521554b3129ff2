//! Baton's provider adapters. One [`Provider`] trait with `infer` and `infer_stream`; one module
//! per wire format holding its wire types beside the mapping to the canonical types of
//! `baton_domain::chat`; the model catalogue; and the registry that builds providers from the
//! operator's configuration.

pub mod anthropic;
pub mod bedrock;
#[doc(hidden)]
pub mod bench;
pub mod catalogue;
pub mod config;
pub mod error;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
pub mod gemini;
pub mod http;
pub mod openai;
pub mod openai_responses;
pub mod provider;
pub mod routing;
pub mod sse;
pub mod structured;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;

pub use catalogue::Catalogue;
pub use config::{BUILT_IN, ProviderConfig, ProvidersConfig, WireFormat};
pub use error::{ProviderError, ProviderResult};
pub use provider::{DeltaStream, Provider};

use crate::anthropic::AnthropicProvider;
use crate::bedrock::{AwsCredentials, BedrockProvider};
use crate::gemini::GeminiProvider;
use crate::openai::{Flavor, OpenAiProvider};

/// A provider as `/providers` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    pub key: String,
    pub configured: bool,
    pub built_in: bool,
}

/// Every provider Baton can call, by key.
pub struct Registry {
    providers: BTreeMap<String, Arc<dyn Provider>>,
    configured: BTreeMap<String, bool>,
    extra_models: BTreeMap<String, Vec<String>>,
    catalogue: Arc<Catalogue>,
}

fn default_base_url(key: &str) -> &'static str {
    match key {
        "openai" => "https://api.openai.com/v1",
        "anthropic" => "https://api.anthropic.com",
        "google" => "https://generativelanguage.googleapis.com",
        "mistral" => "https://api.mistral.ai/v1",
        "deepseek" => "https://api.deepseek.com",
        _ => "",
    }
}

impl Registry {
    /// Builds every built-in provider plus the extra ones of `config`. A provider without
    /// credentials is registered but reported unconfigured; calls to it fail with
    /// [`ProviderError::NotConfigured`].
    pub fn from_config(
        config: &ProvidersConfig,
        catalogue: Arc<Catalogue>,
    ) -> ProviderResult<Registry> {
        let mut registry = Registry {
            providers: BTreeMap::new(),
            configured: BTreeMap::new(),
            extra_models: BTreeMap::new(),
            catalogue,
        };
        let mut keys: Vec<&str> = BUILT_IN.to_vec();
        keys.extend(
            config
                .keys()
                .map(String::as_str)
                .filter(|k| !BUILT_IN.contains(k)),
        );
        for key in keys {
            let provider_config = config.get(key).cloned().unwrap_or_default();
            let built_in = BUILT_IN.contains(&key);
            if !built_in {
                registry
                    .extra_models
                    .insert(key.to_string(), provider_config.models.clone());
            }
            if let Some(provider) = build(key, built_in, &provider_config, &registry.catalogue)? {
                registry.configured.insert(key.to_string(), true);
                registry.providers.insert(key.to_string(), provider);
            } else {
                registry.configured.insert(key.to_string(), false);
            }
        }
        Ok(registry)
    }

    /// Replaces or adds a provider (embedding, tests).
    pub fn insert(&mut self, provider: Arc<dyn Provider>) {
        let key = provider.key().to_string();
        self.configured.insert(key.clone(), true);
        self.providers.insert(key, provider);
    }

    pub fn get(&self, key: &str) -> ProviderResult<&Arc<dyn Provider>> {
        match self.providers.get(key) {
            Some(provider) => Ok(provider),
            None if self.configured.contains_key(key) => {
                Err(ProviderError::NotConfigured(key.to_string()))
            }
            None => Err(ProviderError::UnknownProvider(key.to_string())),
        }
    }

    pub fn is_known(&self, key: &str) -> bool {
        self.configured.contains_key(key)
    }

    /// Whether the provider has credentials (so it can be called).
    pub fn is_configured(&self, key: &str) -> bool {
        self.configured.get(key).copied().unwrap_or(false)
    }

    pub fn catalogue(&self) -> &Arc<Catalogue> {
        &self.catalogue
    }

    pub fn list(&self) -> Vec<ProviderInfo> {
        self.configured
            .iter()
            .map(|(key, configured)| ProviderInfo {
                key: key.clone(),
                configured: *configured,
                built_in: BUILT_IN.contains(&key.as_str()),
            })
            .collect()
    }

    /// Models a provider is known to serve: the catalogue's, or the operator's list for extras.
    pub fn models_of(&self, key: &str) -> Vec<String> {
        match self.extra_models.get(key) {
            Some(models) => models.iter().map(|m| format!("{key}/{m}")).collect(),
            None => self
                .catalogue
                .models_of(key)
                .map(|m| m.id.clone())
                .collect(),
        }
    }
}

fn build(
    key: &str,
    built_in: bool,
    config: &ProviderConfig,
    catalogue: &Arc<Catalogue>,
) -> ProviderResult<Option<Arc<dyn Provider>>> {
    let has_key = config
        .api_key
        .as_ref()
        .is_some_and(|k| !k.expose_secret().is_empty());
    let timeout = config.timeout_secs.map(Duration::from_secs);
    let client = || http::ProviderClient::new(config.connect_timeout_secs.map(Duration::from_secs));
    let base_url = |fallback: &str| {
        config
            .base_url
            .clone()
            .unwrap_or_else(|| fallback.to_string())
    };
    let provider: Arc<dyn Provider> = match key {
        "openai" | "mistral" | "deepseek" if built_in => {
            if !has_key {
                return Ok(None);
            }
            let flavor = match key {
                "openai" => Flavor::OpenAi,
                "mistral" => Flavor::Mistral,
                _ => Flavor::DeepSeek,
            };
            Arc::new(OpenAiProvider::new(
                key,
                flavor,
                base_url(default_base_url(key)),
                config.api_key.clone(),
                client()?,
                timeout,
            ))
        }
        "azure" => {
            let Some(endpoint) = config.base_url.clone().filter(|_| has_key) else {
                return Ok(None);
            };
            let api_version = config
                .api_version
                .clone()
                .unwrap_or_else(|| openai::AZURE_DEFAULT_API_VERSION.into());
            Arc::new(OpenAiProvider::new(
                key,
                Flavor::Azure { api_version },
                endpoint,
                config.api_key.clone(),
                client()?,
                timeout,
            ))
        }
        "anthropic" => {
            let Some(api_key) = config.api_key.clone().filter(|_| has_key) else {
                return Ok(None);
            };
            Arc::new(
                AnthropicProvider::new(
                    key,
                    base_url(default_base_url(key)),
                    api_key,
                    client()?,
                    timeout,
                )
                .with_catalogue(catalogue.clone()),
            )
        }
        "google" => {
            let Some(api_key) = config.api_key.clone().filter(|_| has_key) else {
                return Ok(None);
            };
            Arc::new(GeminiProvider::new(
                key,
                base_url(default_base_url(key)),
                api_key,
                client()?,
                timeout,
            ))
        }
        "bedrock" => {
            let (Some(region), Some(access_key_id), Some(secret_access_key)) = (
                config.region.clone(),
                config.access_key_id.clone(),
                config.secret_access_key.clone(),
            ) else {
                return Ok(None);
            };
            let base = config
                .base_url
                .clone()
                .unwrap_or_else(|| bedrock::default_base_url(&region));
            let credentials = AwsCredentials {
                access_key_id,
                secret_access_key,
                session_token: config.session_token.clone(),
            };
            Arc::new(
                BedrockProvider::new(key, base, region, credentials, client()?, timeout)
                    .with_catalogue(catalogue.clone()),
            )
        }
        _ => {
            // Extra providers: OpenAI-compatible servers (xAI, Groq, vLLM, Ollama, ...). A local
            // server may need no key.
            let Some(base) = config.base_url.clone() else {
                return Err(ProviderError::NotConfigured(format!(
                    "{key} (extra providers need base_url)"
                )));
            };
            match config.kind.unwrap_or(WireFormat::Openai) {
                WireFormat::Openai => Arc::new(OpenAiProvider::new(
                    key,
                    Flavor::Compatible,
                    base,
                    config.api_key.clone(),
                    client()?,
                    timeout,
                )),
                other => {
                    return Err(ProviderError::Unsupported {
                        provider: key.to_string(),
                        what: format!(
                            "extra providers of kind {other:?} (only OpenAI-compatible ones)"
                        ),
                        field: None,
                    });
                }
            }
        }
    };
    Ok(Some(provider))
}
