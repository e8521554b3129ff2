//! Tenant routing rules: an alias over a chain of models and the strategy that orders it.

use serde::{Deserialize, Serialize};

use crate::model::ModelRef;
use crate::{DomainError, DomainResult, Timestamp};

const MAX_ALIAS_LEN: usize = 256;
const MAX_MODELS: usize = 16;
const MAX_DESCRIPTION_LEN: usize = 2000;
const MAX_WEIGHT: u32 = 1_000_000;

/// How a rule's chain is ordered for each request. Every strategy falls back along the rest of
/// the chain on retryable failures and skips models whose circuit breaker is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Strategy {
    /// The listed order: the first model, then the others as fallbacks.
    #[default]
    Sequential,
    /// The starting model rotates from request to request.
    RoundRobin,
    /// The starting model is chosen in proportion to `weights`.
    Weighted,
    /// The model with the lowest recent latency starts.
    LeastLatency,
}

impl Strategy {
    /// Case-insensitive, as DESIGN.md asks of every enum.
    pub fn parse(raw: &str, param: &str) -> DomainResult<Strategy> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "sequential" => Ok(Strategy::Sequential),
            "roundrobin" | "round_robin" => Ok(Strategy::RoundRobin),
            "weighted" => Ok(Strategy::Weighted),
            "leastlatency" | "least_latency" => Ok(Strategy::LeastLatency),
            _ => Err(DomainError::validation(
                param,
                format!(
                    "unknown strategy '{raw}': use Sequential, RoundRobin, Weighted or LeastLatency"
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Sequential => "Sequential",
            Strategy::RoundRobin => "RoundRobin",
            Strategy::Weighted => "Weighted",
            Strategy::LeastLatency => "LeastLatency",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RoutingRule {
    pub id: String,
    /// Usable wherever a model name is accepted.
    pub alias: String,
    /// `<provider>/<model>` names (or bare provider keys), in order.
    pub models: Vec<String>,
    pub strategy: Strategy,
    /// One weight per model, for `Weighted`.
    pub weights: Option<Vec<u32>>,
    pub description: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// The body of a create or a full replace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingRuleInput {
    pub alias: String,
    pub models: Vec<String>,
    /// `Sequential` (default), `RoundRobin`, `Weighted` or `LeastLatency`; any case.
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub weights: Option<Vec<u32>>,
    #[serde(default)]
    pub description: Option<String>,
}

/// A rule input whose fields are well formed; whether each model exists is checked above this
/// crate, against the catalogue and the configured providers.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRule {
    pub alias: String,
    pub models: Vec<ModelRef>,
    pub strategy: Strategy,
    pub weights: Option<Vec<u32>>,
    pub description: Option<String>,
}

pub fn validate_alias(raw: &str, param: &str) -> DomainResult<String> {
    let alias = raw.trim();
    if alias.is_empty() {
        return Err(DomainError::validation(
            param,
            format!("{param} must not be empty"),
        ));
    }
    if alias.len() > MAX_ALIAS_LEN {
        return Err(DomainError::validation(
            param,
            format!("{param} must be at most {MAX_ALIAS_LEN} bytes"),
        ));
    }
    if alias.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(DomainError::validation(
            param,
            format!("{param} must not contain white space or control characters"),
        ));
    }
    Ok(alias.to_string())
}

impl RoutingRuleInput {
    pub fn validate(self) -> DomainResult<ValidRule> {
        let alias = validate_alias(&self.alias, "alias")?;
        if self.models.is_empty() {
            return Err(DomainError::validation(
                "models",
                "models must name at least one model",
            ));
        }
        if self.models.len() > MAX_MODELS {
            return Err(DomainError::validation(
                "models",
                format!("models may name at most {MAX_MODELS} models"),
            ));
        }
        let mut models = Vec::with_capacity(self.models.len());
        for (i, raw) in self.models.iter().enumerate() {
            let param = format!("models[{i}]");
            let model = ModelRef::parse(raw, &param)?;
            if models.contains(&model) {
                return Err(DomainError::validation(
                    param,
                    format!("'{raw}' is listed twice"),
                ));
            }
            models.push(model);
        }
        let strategy = match &self.strategy {
            Some(raw) => Strategy::parse(raw, "strategy")?,
            None => Strategy::Sequential,
        };
        let weights = match (strategy, self.weights) {
            (Strategy::Weighted, None) => {
                return Err(DomainError::validation(
                    "weights",
                    "the Weighted strategy needs one weight per model",
                ));
            }
            (Strategy::Weighted, Some(weights)) => {
                if weights.len() != models.len() {
                    return Err(DomainError::validation(
                        "weights",
                        format!(
                            "weights has {} entries for {} models",
                            weights.len(),
                            models.len()
                        ),
                    ));
                }
                if let Some(i) = weights.iter().position(|w| *w > MAX_WEIGHT) {
                    return Err(DomainError::validation(
                        format!("weights[{i}]"),
                        format!("a weight must be at most {MAX_WEIGHT}"),
                    ));
                }
                if weights.iter().all(|w| *w == 0) {
                    return Err(DomainError::validation(
                        "weights",
                        "at least one weight must be above 0",
                    ));
                }
                Some(weights)
            }
            (_, Some(_)) => {
                return Err(DomainError::validation(
                    "weights",
                    "weights apply only to the Weighted strategy",
                ));
            }
            (_, None) => None,
        };
        let description = self
            .description
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty());
        if description
            .as_ref()
            .is_some_and(|d| d.len() > MAX_DESCRIPTION_LEN)
        {
            return Err(DomainError::validation(
                "description",
                format!("description must be at most {MAX_DESCRIPTION_LEN} bytes"),
            ));
        }
        Ok(ValidRule {
            alias,
            models,
            strategy,
            weights,
            description,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(
        models: &[&str],
        strategy: Option<&str>,
        weights: Option<Vec<u32>>,
    ) -> RoutingRuleInput {
        RoutingRuleInput {
            alias: " fast ".into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            strategy: strategy.map(str::to_string),
            weights,
            description: Some("  ".into()),
        }
    }

    fn param_of(err: DomainError) -> String {
        let DomainError::Validation { param, .. } = err;
        param
    }

    #[test]
    fn valid_rules_are_normalised() {
        let rule = input(
            &["openai/gpt-4o-mini", "anthropic"],
            Some("roundrobin"),
            None,
        )
        .validate()
        .unwrap();
        assert_eq!(rule.alias, "fast");
        assert_eq!(rule.strategy, Strategy::RoundRobin);
        assert_eq!(rule.models[1].model, None);
        assert_eq!(rule.description, None);
        let weighted = input(
            &["openai/a", "openai/b"],
            Some("WEIGHTED"),
            Some(vec![3, 1]),
        )
        .validate()
        .unwrap();
        assert_eq!(weighted.weights, Some(vec![3, 1]));
    }

    #[test]
    fn each_bad_field_is_named() {
        for (rule, param) in [
            (input(&[], None, None), "models"),
            (input(&["openai/a", "Bad Model"], None, None), "models[1]"),
            (input(&["openai/a", "openai/a"], None, None), "models[1]"),
            (input(&["openai/a"], Some("Fastest"), None), "strategy"),
            (input(&["openai/a"], Some("Weighted"), None), "weights"),
            (
                input(&["openai/a"], Some("Weighted"), Some(vec![1, 2])),
                "weights",
            ),
            (
                input(&["openai/a"], Some("Weighted"), Some(vec![0])),
                "weights",
            ),
            (input(&["openai/a"], None, Some(vec![1])), "weights"),
            (
                RoutingRuleInput {
                    alias: "two words".into(),
                    ..input(&["openai/a"], None, None)
                },
                "alias",
            ),
        ] {
            assert_eq!(param_of(rule.validate().unwrap_err()), param);
        }
    }

    #[test]
    fn strategies_round_trip_in_the_spec_spelling() {
        for strategy in [
            Strategy::Sequential,
            Strategy::RoundRobin,
            Strategy::Weighted,
            Strategy::LeastLatency,
        ] {
            assert_eq!(Strategy::parse(strategy.as_str(), "s").unwrap(), strategy);
            assert_eq!(
                serde_json::to_value(strategy).unwrap(),
                serde_json::json!(strategy.as_str())
            );
        }
    }
}
