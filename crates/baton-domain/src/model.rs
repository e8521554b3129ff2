//! Model names (`<provider>/<model>`) and catalogue entries.

use serde::{Deserialize, Serialize};

use crate::{DomainError, DomainResult};

/// A model named with its provider: `openai/gpt-4o-mini`. A bare provider key (`anthropic`)
/// means that provider's default model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRef {
    pub provider: String,
    /// `None` for a bare provider key.
    pub model: Option<String>,
}

impl ModelRef {
    pub fn parse(raw: &str, param: &str) -> DomainResult<ModelRef> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(DomainError::validation(
                param,
                format!("{param} must not be empty"),
            ));
        }
        if raw.len() > 256 || raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(DomainError::validation(
                param,
                format!("'{raw}' is not a valid model name"),
            ));
        }
        let (provider, model) = match raw.split_once('/') {
            Some((provider, model)) => (provider, Some(model)),
            None => (raw, None),
        };
        let valid_key = !provider.is_empty()
            && provider
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !valid_key {
            return Err(DomainError::validation(
                param,
                format!("'{raw}' must be <provider>/<model-name> with a lowercase provider key"),
            ));
        }
        if model.is_some_and(str::is_empty) {
            return Err(DomainError::validation(
                param,
                format!("'{raw}' names no model after the '/'"),
            ));
        }
        Ok(ModelRef {
            provider: provider.to_string(),
            model: model.map(str::to_string),
        })
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.model {
            Some(model) => write!(f, "{}/{model}", self.provider),
            None => f.write_str(&self.provider),
        }
    }
}

/// One model of the catalogue: limits, prices (credits per million tokens) and capabilities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelDescriptor {
    /// `<provider>/<name>`, the name clients use.
    #[serde(default)]
    pub id: String,
    pub provider: String,
    /// The provider's own model name.
    pub name: String,
    pub display_name: String,
    pub context_window: u64,
    pub max_output_tokens: u64,
    pub input_credits_per_million: i64,
    pub output_credits_per_million: i64,
    pub cached_input_credits_per_million: Option<i64>,
    pub supports_structured_output: bool,
    pub supports_tools: bool,
    pub supports_vision: bool,
    pub supports_streaming: bool,
    pub supports_reasoning: bool,
    #[serde(default)]
    pub supports_web_search: bool,
    /// What one web search the model runs costs, in credits (the provider's fee per call,
    /// billed beside the tokens); absent for a model without web search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_credits_per_call: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_refs() {
        let m = ModelRef::parse("openai/gpt-4o-mini", "model").unwrap();
        assert_eq!(
            (m.provider.as_str(), m.model.as_deref()),
            ("openai", Some("gpt-4o-mini"))
        );
        let bedrock =
            ModelRef::parse("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", "model").unwrap();
        assert_eq!(
            bedrock.model.as_deref(),
            Some("anthropic.claude-3-5-sonnet-20240620-v1:0")
        );
        // Model names may contain further slashes (Hugging Face style ids on compatible servers).
        let nested = ModelRef::parse("vllm/meta-llama/Llama-3.1-8B", "model").unwrap();
        assert_eq!(nested.model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(ModelRef::parse("anthropic", "model").unwrap().model, None);
        for bad in ["", "OpenAI/gpt", "openai/", "/gpt", "open ai/x", "a/b c"] {
            assert!(ModelRef::parse(bad, "model").is_err(), "{bad}");
        }
        assert_eq!(m.to_string(), "openai/gpt-4o-mini");
    }
}
