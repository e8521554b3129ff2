//! Tenant settings: one document per tenant, every field with a default.

use serde::{Deserialize, Deserializer, Serialize};

use crate::origin::{CallbackOrigin, parse_origin_list};
use crate::tool::MAX_AGENT_DEPTH;
use crate::{DomainError, DomainResult};

/// Platform default for nested agent calls (SPEC.md "Limits").
pub const DEFAULT_MAX_AGENT_DEPTH: u32 = 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", default)]
pub struct TenantSettings {
    /// Origins that caller-hosted tools may be called back on. None registered: they do not run.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub callback_origins: Vec<CallbackOrigin>,
    /// Days that prompt and response text are kept; `null` keeps them for the run's lifetime.
    pub text_retention_days: Option<u32>,
    /// Share of runs (0 to 1) whose text is stored; debug runs always keep text.
    pub text_sample_rate: f64,
    pub default_max_agent_depth: u32,
    /// Ceiling on the cost of one request across its whole agent tree; `null` means none.
    pub max_cost_per_request_credits: Option<i64>,
    /// Model used when a template's `llm` is empty.
    pub default_model: Option<String>,
    /// Added on top of the raw provider price for billed cost.
    pub markup_percent: f64,
    /// 0 disables the response cache.
    pub response_cache_ttl_seconds: u64,
    /// Requests per minute accepted for this tenant; `null` means unlimited.
    pub requests_per_minute: Option<u32>,
    /// Per model attempt: until a stream's response headers; `null`: no own limit.
    pub connect_timeout_ms: Option<u64>,
    /// Per model attempt: until a stream's first token.
    pub first_token_timeout_ms: Option<u64>,
    /// Per model attempt: the whole answer.
    pub attempt_timeout_ms: Option<u64>,
}

/// Longest per-attempt timeout a tenant or a request may set (one hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Checks a per-attempt timeout given in milliseconds.
pub fn validate_timeout_ms(value: u64, param: &str) -> DomainResult<u64> {
    if value == 0 || value > MAX_TIMEOUT_MS {
        return Err(DomainError::validation(
            param,
            format!("{param} must be between 1 and {MAX_TIMEOUT_MS} milliseconds"),
        ));
    }
    Ok(value)
}

impl Default for TenantSettings {
    fn default() -> Self {
        Self {
            callback_origins: Vec::new(),
            text_retention_days: None,
            text_sample_rate: 1.0,
            default_max_agent_depth: DEFAULT_MAX_AGENT_DEPTH,
            max_cost_per_request_credits: None,
            default_model: None,
            markup_percent: 0.0,
            response_cache_ttl_seconds: 0,
            requests_per_minute: None,
            connect_timeout_ms: None,
            first_token_timeout_ms: None,
            attempt_timeout_ms: None,
        }
    }
}

/// Callback origins as an array, or as one text with an origin per line (the settings form).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum OriginsInput {
    List(Vec<String>),
    Text(String),
}

/// A change to the settings: absent fields stay as they are; `null` resets a nullable field.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingsPatch {
    #[serde(default, deserialize_with = "not_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = OriginsInput, required = false))]
    pub callback_origins: Option<OriginsInput>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>))]
    pub text_retention_days: Option<Option<u32>>,
    #[serde(default, deserialize_with = "not_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64, required = false))]
    pub text_sample_rate: Option<f64>,
    #[serde(default, deserialize_with = "not_null")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = u32, required = false, minimum = 1, maximum = 100)
    )]
    pub default_max_agent_depth: Option<u32>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub max_cost_per_request_credits: Option<Option<i64>>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub default_model: Option<Option<String>>,
    #[serde(default, deserialize_with = "not_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64, required = false))]
    pub markup_percent: Option<f64>,
    #[serde(default, deserialize_with = "not_null")]
    #[cfg_attr(feature = "openapi", schema(value_type = u64, required = false))]
    pub response_cache_ttl_seconds: Option<u64>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u32>))]
    pub requests_per_minute: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub connect_timeout_ms: Option<Option<u64>>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub first_token_timeout_ms: Option<Option<u64>>,
    #[serde(default, deserialize_with = "double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub attempt_timeout_ms: Option<Option<u64>>,
}

/// A field that may be left out but has no unset state: `null` is refused (naming the field)
/// rather than read as absent, which would answer 200 and change nothing.
fn not_null<'de, T, D>(deserializer: D) -> Result<Option<T>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// Distinguishes a field set to `null` (`Some(None)`) from an absent one (`None`).
pub(crate) fn double_option<'de, T, D>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl TenantSettings {
    /// Returns the settings with the patch applied, or the first invalid field. The receiver is
    /// untouched either way, so a rejected patch changes nothing.
    pub fn apply(&self, patch: SettingsPatch) -> DomainResult<TenantSettings> {
        let mut next = self.clone();
        if let Some(origins) = patch.callback_origins {
            let lines = match origins {
                OriginsInput::List(list) => list,
                OriginsInput::Text(text) => vec![text],
            };
            next.callback_origins = parse_origin_list(&lines, "callbackOrigins")?;
        }
        if let Some(days) = patch.text_retention_days {
            if days == Some(0) {
                return Err(DomainError::validation(
                    "textRetentionDays",
                    "textRetentionDays must be at least 1, or null to keep text",
                ));
            }
            next.text_retention_days = days;
        }
        if let Some(rate) = patch.text_sample_rate {
            if !(0.0..=1.0).contains(&rate) {
                return Err(DomainError::validation(
                    "textSampleRate",
                    "textSampleRate must be between 0 and 1",
                ));
            }
            next.text_sample_rate = rate;
        }
        if let Some(depth) = patch.default_max_agent_depth {
            if !(1..=MAX_AGENT_DEPTH).contains(&depth) {
                return Err(DomainError::validation(
                    "defaultMaxAgentDepth",
                    format!("defaultMaxAgentDepth must be between 1 and {MAX_AGENT_DEPTH}"),
                ));
            }
            next.default_max_agent_depth = depth;
        }
        if let Some(ceiling) = patch.max_cost_per_request_credits {
            if ceiling.is_some_and(|c| c <= 0) {
                return Err(DomainError::validation(
                    "maxCostPerRequestCredits",
                    "maxCostPerRequestCredits must be a positive number of credits, or null",
                ));
            }
            next.max_cost_per_request_credits = ceiling;
        }
        if let Some(model) = patch.default_model {
            let model = model
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty());
            if model.as_ref().is_some_and(|m| m.len() > 200) {
                return Err(DomainError::validation(
                    "defaultModel",
                    "defaultModel must be at most 200 characters",
                ));
            }
            next.default_model = model;
        }
        if let Some(markup) = patch.markup_percent {
            if !(0.0..=1000.0).contains(&markup) {
                return Err(DomainError::validation(
                    "markupPercent",
                    "markupPercent must be between 0 and 1000",
                ));
            }
            next.markup_percent = markup;
        }
        if let Some(ttl) = patch.response_cache_ttl_seconds {
            if ttl > 30 * 24 * 3600 {
                return Err(DomainError::validation(
                    "responseCacheTtlSeconds",
                    "responseCacheTtlSeconds must be at most 30 days (2592000)",
                ));
            }
            next.response_cache_ttl_seconds = ttl;
        }
        if let Some(rpm) = patch.requests_per_minute {
            if rpm == Some(0) {
                return Err(DomainError::validation(
                    "requestsPerMinute",
                    "requestsPerMinute must be at least 1, or null for no limit",
                ));
            }
            next.requests_per_minute = rpm;
        }
        for (patch, field, param) in [
            (
                patch.connect_timeout_ms,
                &mut next.connect_timeout_ms,
                "connectTimeoutMs",
            ),
            (
                patch.first_token_timeout_ms,
                &mut next.first_token_timeout_ms,
                "firstTokenTimeoutMs",
            ),
            (
                patch.attempt_timeout_ms,
                &mut next.attempt_timeout_ms,
                "attemptTimeoutMs",
            ),
        ] {
            if let Some(value) = patch {
                *field = value.map(|ms| validate_timeout_ms(ms, param)).transpose()?;
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(json: &str) -> SettingsPatch {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn absent_fields_stay_and_null_resets() {
        let base = TenantSettings::default()
            .apply(patch(r#"{"textRetentionDays": 30, "markupPercent": 10}"#))
            .unwrap();
        assert_eq!(base.text_retention_days, Some(30));
        let next = base.apply(patch(r#"{"textRetentionDays": null}"#)).unwrap();
        assert_eq!(next.text_retention_days, None);
        assert_eq!(next.markup_percent, 10.0);
    }

    #[test]
    fn origins_accept_text_with_one_per_line() {
        let s = TenantSettings::default()
            .apply(patch(
                r#"{"callbackOrigins": "https://a.example.com\n*.b.example.com"}"#,
            ))
            .unwrap();
        let written = serde_json::to_value(&s).unwrap();
        assert_eq!(
            written["callbackOrigins"],
            serde_json::json!(["https://a.example.com", "*.b.example.com"])
        );
    }

    #[test]
    fn invalid_values_name_their_field() {
        for (json, field) in [
            (r#"{"textSampleRate": 1.5}"#, "textSampleRate"),
            (r#"{"defaultMaxAgentDepth": 0}"#, "defaultMaxAgentDepth"),
            (
                r#"{"maxCostPerRequestCredits": -5}"#,
                "maxCostPerRequestCredits",
            ),
            (r#"{"markupPercent": -1}"#, "markupPercent"),
            (
                r#"{"callbackOrigins": ["ok.example.com", "https://x.com/path"]}"#,
                "callbackOrigins[1]",
            ),
            (r#"{"textRetentionDays": 0}"#, "textRetentionDays"),
            (r#"{"connectTimeoutMs": 0}"#, "connectTimeoutMs"),
            (r#"{"firstTokenTimeoutMs": 3600001}"#, "firstTokenTimeoutMs"),
            (r#"{"attemptTimeoutMs": 0}"#, "attemptTimeoutMs"),
        ] {
            let DomainError::Validation { param, .. } =
                TenantSettings::default().apply(patch(json)).unwrap_err();
            assert_eq!(param, field, "{json}");
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<SettingsPatch>(r#"{"nope": 1}"#).is_err());
    }

    #[test]
    fn stored_document_round_trips_and_tolerates_missing_fields() {
        let s: TenantSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(s, TenantSettings::default());
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<TenantSettings>(&text).unwrap(), s);
    }
}
