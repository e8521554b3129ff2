//! Model resolution, DESIGN.md "Model resolution", in one place:
//!
//! 1. `overrideModel` on the request, else the template's `llm` (on the compatible endpoint and
//!    `/inference`, the body's `model`);
//! 2. a tenant routing alias expands to its models and strategy (tenant rules win over template
//!    configuration);
//! 3. the template's `fallbacks` are appended (an alias there expands in place);
//! 4. a bare provider key means that provider's default model; an empty name means the tenant's
//!    default model, else the platform default.

use std::collections::HashMap;
use std::sync::Arc;

use baton_domain::DomainError;
use baton_domain::model::ModelRef;
use baton_domain::routing::{RoutingRule, Strategy};

use crate::{ProviderError, ProviderResult, Registry};

/// Used when neither the request, the template nor the tenant names a model.
pub const PLATFORM_DEFAULT_MODEL: &str = "openai";

/// A name and the request field it came from (errors name the field).
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    pub name: &'a str,
    pub param: &'a str,
}

/// What a request and its template say about the model.
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelSelection<'a> {
    pub override_model: Option<Named<'a>>,
    /// The template's `llm`, or the body's `model` on the direct endpoints.
    pub configured: Option<Named<'a>>,
    pub fallbacks: &'a [String],
    /// The fallbacks' field name, `fallbacks` unless the caller says otherwise.
    pub fallbacks_param: &'a str,
    pub tenant_default: Option<&'a str>,
}

/// A tenant's rules by alias; built once per tenant and cached above this crate.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    by_alias: HashMap<String, Arc<RoutingRule>>,
}

impl RuleSet {
    pub fn new(rules: Vec<RoutingRule>) -> RuleSet {
        RuleSet {
            by_alias: rules
                .into_iter()
                .map(|rule| (rule.alias.clone(), Arc::new(rule)))
                .collect(),
        }
    }

    pub fn get(&self, alias: &str) -> Option<&Arc<RoutingRule>> {
        self.by_alias.get(alias)
    }
}

/// One concrete model of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChainModel {
    pub provider: String,
    pub model: String,
}

impl std::fmt::Display for ChainModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

/// The models a request may be served by, in fallback order before the strategy is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The name the request used (an alias, a model, or the default it fell back to).
    pub requested: String,
    pub models: Vec<ChainModel>,
    pub strategy: Strategy,
    /// One weight per routed model, for `Weighted`.
    pub weights: Option<Vec<u32>>,
    /// The alias, when the first name was one (round-robin and weighted state is kept per alias).
    pub alias: Option<String>,
    /// How many leading models the strategy orders: the alias's own. Template fallbacks follow
    /// in their listed order.
    pub routed: usize,
}

impl Chain {
    pub fn primary(&self) -> Option<&ChainModel> {
        self.models.first()
    }
}

/// Resolves a request's model choice into its chain.
pub fn resolve(
    selection: &ModelSelection<'_>,
    rules: &RuleSet,
    registry: &Registry,
) -> ProviderResult<Chain> {
    fn non_empty(named: Option<Named<'_>>) -> Option<Named<'_>> {
        named.filter(|n| !n.name.trim().is_empty())
    }
    let primary = non_empty(selection.override_model)
        .or(non_empty(selection.configured))
        .or(selection
            .tenant_default
            .filter(|d| !d.trim().is_empty())
            .map(|name| Named {
                name,
                param: "defaultModel",
            }))
        .unwrap_or(Named {
            name: PLATFORM_DEFAULT_MODEL,
            param: "model",
        });
    let name = primary.name.trim();

    let mut chain = Chain {
        requested: name.to_string(),
        models: Vec::new(),
        strategy: Strategy::Sequential,
        weights: None,
        alias: None,
        routed: 0,
    };
    match rules.get(name) {
        Some(rule) => {
            for (i, model) in rule.models.iter().enumerate() {
                push_model(&mut chain.models, model, &format!("models[{i}]"), registry)?;
            }
            chain.strategy = rule.strategy;
            chain.weights = rule.weights.clone();
            chain.alias = Some(rule.alias.clone());
        }
        None => push_model(&mut chain.models, name, primary.param, registry)?,
    }
    chain.routed = chain.models.len();

    let fallbacks_param = if selection.fallbacks_param.is_empty() {
        "fallbacks"
    } else {
        selection.fallbacks_param
    };
    for (i, fallback) in selection.fallbacks.iter().enumerate() {
        let param = format!("{fallbacks_param}[{i}]");
        match rules.get(fallback.trim()) {
            Some(rule) => {
                for model in &rule.models {
                    push_model(&mut chain.models, model, &param, registry)?;
                }
            }
            None => push_model(&mut chain.models, fallback, &param, registry)?,
        }
    }
    Ok(chain)
}

/// Adds one model unless the chain has it already (trying it twice gains nothing).
fn push_model(
    models: &mut Vec<ChainModel>,
    raw: &str,
    param: &str,
    registry: &Registry,
) -> ProviderResult<()> {
    let model = concrete(raw, param, registry)?;
    if !models.contains(&model) {
        models.push(model);
    }
    Ok(())
}

/// `<provider>/<model>`, or a bare provider key expanded to its default model.
pub fn concrete(raw: &str, param: &str, registry: &Registry) -> ProviderResult<ChainModel> {
    let reference = ModelRef::parse(raw, param)?;
    if !registry.is_known(&reference.provider) {
        return Err(ProviderError::UnknownProvider(reference.provider));
    }
    let model = match reference.model {
        Some(model) => model,
        None => registry
            .catalogue()
            .default_model(&reference.provider)
            .map(str::to_string)
            .ok_or_else(|| {
                DomainError::validation(
                    param,
                    format!(
                        "provider '{}' has no default model: name one",
                        reference.provider
                    ),
                )
            })?,
    };
    Ok(ChainModel {
        provider: reference.provider,
        model,
    })
}

#[cfg(test)]
mod tests {
    use baton_domain::Timestamp;

    use super::*;
    use crate::{Catalogue, ProviderConfig, ProvidersConfig};

    fn registry() -> Registry {
        let mut config = ProvidersConfig::new();
        config.insert(
            "openai".into(),
            ProviderConfig {
                api_key: Some("k".into()),
                ..Default::default()
            },
        );
        Registry::from_config(&config, Arc::new(Catalogue::shipped().unwrap())).unwrap()
    }

    fn rule(alias: &str, models: &[&str], strategy: Strategy) -> RoutingRule {
        RoutingRule {
            id: alias.into(),
            alias: alias.into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            strategy,
            weights: None,
            description: None,
            created_at: Timestamp::now(),
            updated_at: Timestamp::now(),
        }
    }

    fn named<'a>(name: &'a str, param: &'a str) -> Option<Named<'a>> {
        Some(Named { name, param })
    }

    /// The precedence table of DESIGN.md "Model resolution", one row per case.
    #[test]
    fn precedence_table() {
        let registry = registry();
        let anthropic_default = registry
            .catalogue()
            .default_model("anthropic")
            .unwrap()
            .to_string();
        let openai_default = registry
            .catalogue()
            .default_model("openai")
            .unwrap()
            .to_string();
        let rules = RuleSet::new(vec![
            rule(
                "fast",
                &["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"],
                Strategy::RoundRobin,
            ),
            rule(
                "smart",
                &["anthropic/claude-sonnet-4-5"],
                Strategy::Sequential,
            ),
            // A rule may shadow a real model name: tenant rules win over template config.
            rule(
                "openai/gpt-4o",
                &["mistral/mistral-large-latest"],
                Strategy::Sequential,
            ),
        ]);
        let fallbacks = vec!["smart".to_string(), "google/gemini-2.5-flash".to_string()];
        let no_fallbacks: Vec<String> = Vec::new();
        struct Case<'a> {
            what: &'a str,
            selection: ModelSelection<'a>,
            models: Vec<String>,
            strategy: Strategy,
            routed: usize,
        }
        let cases = [
            Case {
                what: "overrideModel alias beats the template llm",
                selection: ModelSelection {
                    override_model: named("fast", "overrideModel"),
                    configured: named("openai/gpt-4o-mini", "llm"),
                    ..Default::default()
                },
                models: vec![
                    "openai/gpt-4o-mini".into(),
                    "anthropic/claude-haiku-4-5".into(),
                ],
                strategy: Strategy::RoundRobin,
                routed: 2,
            },
            Case {
                what: "overrideModel model beats the template llm",
                selection: ModelSelection {
                    override_model: named("google/gemini-2.5-pro", "overrideModel"),
                    configured: named("fast", "llm"),
                    ..Default::default()
                },
                models: vec!["google/gemini-2.5-pro".into()],
                strategy: Strategy::Sequential,
                routed: 1,
            },
            Case {
                what: "a tenant rule wins over the template's model of the same name",
                selection: ModelSelection {
                    configured: named("openai/gpt-4o", "llm"),
                    ..Default::default()
                },
                models: vec!["mistral/mistral-large-latest".into()],
                strategy: Strategy::Sequential,
                routed: 1,
            },
            Case {
                what: "template fallbacks follow the alias, aliases among them expanded",
                selection: ModelSelection {
                    configured: named("fast", "llm"),
                    fallbacks: &fallbacks,
                    ..Default::default()
                },
                models: vec![
                    "openai/gpt-4o-mini".into(),
                    "anthropic/claude-haiku-4-5".into(),
                    "anthropic/claude-sonnet-4-5".into(),
                    "google/gemini-2.5-flash".into(),
                ],
                strategy: Strategy::RoundRobin,
                routed: 2,
            },
            Case {
                what: "a model already in the chain is not repeated",
                selection: ModelSelection {
                    configured: named("anthropic/claude-sonnet-4-5", "llm"),
                    fallbacks: &fallbacks,
                    ..Default::default()
                },
                models: vec![
                    "anthropic/claude-sonnet-4-5".into(),
                    "google/gemini-2.5-flash".into(),
                ],
                strategy: Strategy::Sequential,
                routed: 1,
            },
            Case {
                what: "a bare provider key means its default model",
                selection: ModelSelection {
                    configured: named("anthropic", "llm"),
                    fallbacks: &no_fallbacks,
                    ..Default::default()
                },
                models: vec![format!("anthropic/{anthropic_default}")],
                strategy: Strategy::Sequential,
                routed: 1,
            },
            Case {
                what: "an empty llm means the tenant default, which may be an alias",
                selection: ModelSelection {
                    configured: named("  ", "llm"),
                    tenant_default: Some("smart"),
                    ..Default::default()
                },
                models: vec!["anthropic/claude-sonnet-4-5".into()],
                strategy: Strategy::Sequential,
                routed: 1,
            },
            Case {
                what: "no name and no tenant default means the platform default",
                selection: ModelSelection::default(),
                models: vec![format!("openai/{openai_default}")],
                strategy: Strategy::Sequential,
                routed: 1,
            },
        ];
        for case in cases {
            let chain = resolve(&case.selection, &rules, &registry).unwrap();
            let models: Vec<String> = chain.models.iter().map(ToString::to_string).collect();
            assert_eq!(models, case.models, "{}", case.what);
            assert_eq!(chain.strategy, case.strategy, "{}", case.what);
            assert_eq!(chain.routed, case.routed, "{}", case.what);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let registry = registry();
        let rules = RuleSet::default();
        let fallbacks = vec!["openai/gpt-4o".to_string(), "Not A Model".to_string()];
        let err = resolve(
            &ModelSelection {
                configured: named("openai/gpt-4o-mini", "llm"),
                fallbacks: &fallbacks,
                ..Default::default()
            },
            &rules,
            &registry,
        )
        .unwrap_err();
        assert!(
            matches!(&err, ProviderError::Invalid(DomainError::Validation { param, .. }) if param == "fallbacks[1]"),
            "{err:?}"
        );
        let err = resolve(
            &ModelSelection {
                override_model: named("nope/model", "overrideModel"),
                ..Default::default()
            },
            &rules,
            &registry,
        )
        .unwrap_err();
        assert_eq!(err, ProviderError::UnknownProvider("nope".into()));
    }
}
