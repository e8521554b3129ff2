//! The model catalogue: data shipped with the code (`data/catalogue.json`), overridable by the
//! operator. Models missing from it are still served (priced 0, flagged `pricingUncertain`).

use std::collections::BTreeMap;

use foldhash::HashMap;

use baton_domain::model::ModelDescriptor;
use serde::Deserialize;

use crate::error::ProviderError;

const SHIPPED: &str = include_str!("../data/catalogue.json");

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CatalogueFile {
    #[allow(dead_code)]
    version: u32,
    defaults: BTreeMap<String, String>,
    models: Vec<ModelDescriptor>,
    #[serde(default)]
    web_search_credits_per_call: BTreeMap<String, i64>,
}

#[derive(Debug, Clone)]
pub struct Catalogue {
    models: Vec<ModelDescriptor>,
    /// Provider, then model name: looked up with borrowed `&str`s, no allocation per request,
    /// and hashed with foldhash (a request looks models up about eight times; only
    /// configuration inserts, so SipHash's flooding resistance buys nothing here).
    index: HashMap<String, HashMap<String, usize>>,
    defaults: BTreeMap<String, String>,
    web_search_fees: BTreeMap<String, i64>,
}

impl Catalogue {
    /// The catalogue shipped with this build.
    pub fn shipped() -> Result<Catalogue, ProviderError> {
        Self::from_json(SHIPPED)
    }

    pub fn from_json(text: &str) -> Result<Catalogue, ProviderError> {
        let file: CatalogueFile =
            serde_json::from_str(text).map_err(|e| ProviderError::InvalidResponse {
                provider: "catalogue".into(),
                message: e.to_string(),
            })?;
        let mut models = file.models;
        for model in &mut models {
            model.id = format!("{}/{}", model.provider, model.name);
            // Published with the model, so a client can predict and check that part of a bill.
            model.web_search_credits_per_call = model.supports_web_search.then(|| {
                let fee = file.web_search_credits_per_call.get(&model.provider);
                fee.copied().unwrap_or(0)
            });
        }
        models.sort_by(|a, b| a.id.cmp(&b.id));
        let mut index: HashMap<String, HashMap<String, usize>> = HashMap::default();
        for (i, m) in models.iter().enumerate() {
            index
                .entry(m.provider.clone())
                .or_default()
                .insert(m.name.clone(), i);
        }
        Ok(Catalogue {
            models,
            index,
            defaults: file.defaults,
            web_search_fees: file.web_search_credits_per_call,
        })
    }

    pub fn models(&self) -> &[ModelDescriptor] {
        &self.models
    }

    pub fn get(&self, provider: &str, model: &str) -> Option<&ModelDescriptor> {
        self.index
            .get(provider)?
            .get(model)
            .map(|&i| &self.models[i])
    }

    /// Finds the entry of a served model name, which providers often report with a date suffix
    /// (`gpt-4o-mini-2024-07-18` for `gpt-4o-mini`).
    pub fn lookup_served(&self, provider: &str, served: &str) -> Option<&ModelDescriptor> {
        self.get(provider, served).or_else(|| {
            self.models
                .iter()
                .filter(|m| m.provider == provider && served.starts_with(&m.name))
                .filter(|m| served[m.name.len()..].starts_with('-'))
                .max_by_key(|m| m.name.len())
        })
    }

    pub fn default_model(&self, provider: &str) -> Option<&str> {
        self.defaults.get(provider).map(String::as_str)
    }

    pub fn web_search_fee(&self, provider: &str) -> i64 {
        self.web_search_fees.get(provider).copied().unwrap_or(0)
    }

    pub fn models_of<'a>(
        &'a self,
        provider: &'a str,
    ) -> impl Iterator<Item = &'a ModelDescriptor> + 'a {
        self.models.iter().filter(move |m| m.provider == provider)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BUILT_IN;

    #[test]
    fn shipped_catalogue_covers_every_provider_with_priced_models() {
        let catalogue = Catalogue::shipped().unwrap();
        for provider in BUILT_IN {
            let models: Vec<_> = catalogue.models_of(provider).collect();
            // DeepSeek's API serves four model names in all (docs/catalogue-sources.md).
            let minimum = if *provider == "deepseek" { 4 } else { 5 };
            assert!(
                models.len() >= minimum,
                "{provider} has only {} models",
                models.len()
            );
            let default = catalogue
                .default_model(provider)
                .unwrap_or_else(|| panic!("{provider} has no default"));
            assert!(
                catalogue.get(provider, default).is_some(),
                "{provider} default {default} is not in the catalogue"
            );
            for m in models {
                assert!(
                    m.input_credits_per_million > 0 && m.output_credits_per_million > 0,
                    "{} is unpriced",
                    m.id
                );
                assert!(
                    m.context_window > 0 && m.max_output_tokens > 0,
                    "{} has no limits",
                    m.id
                );
                assert!(m.cached_input_credits_per_million.is_none_or(|c| c >= 0));
            }
        }
        let ids: std::collections::HashSet<_> = catalogue.models().iter().map(|m| &m.id).collect();
        assert_eq!(ids.len(), catalogue.models().len(), "duplicate models");
        // A model that searches publishes its provider's fee per search; no other model does.
        for m in catalogue.models() {
            let fee = catalogue.web_search_fee(&m.provider);
            let expected = m.supports_web_search.then_some(fee);
            assert_eq!(m.web_search_credits_per_call, expected, "{}", m.id);
        }
        assert!(
            catalogue
                .models()
                .iter()
                .any(|m| m.web_search_credits_per_call.is_some())
        );
    }

    #[test]
    fn served_names_with_date_suffixes_find_their_entry() {
        let catalogue = Catalogue::from_json(
            r#"{"version":1,"defaults":{"openai":"gpt-4o"},"models":[
            {"provider":"openai","name":"gpt-4o","displayName":"a","contextWindow":1,"maxOutputTokens":1,"inputCreditsPerMillion":1,"outputCreditsPerMillion":1,"cachedInputCreditsPerMillion":null,"supportsStructuredOutput":true,"supportsTools":true,"supportsVision":true,"supportsStreaming":true,"supportsReasoning":false},
            {"provider":"openai","name":"gpt-4o-mini","displayName":"b","contextWindow":1,"maxOutputTokens":1,"inputCreditsPerMillion":2,"outputCreditsPerMillion":1,"cachedInputCreditsPerMillion":null,"supportsStructuredOutput":true,"supportsTools":true,"supportsVision":true,"supportsStreaming":true,"supportsReasoning":false}]}"#,
        )
        .unwrap();
        assert_eq!(
            catalogue
                .lookup_served("openai", "gpt-4o-mini-2024-07-18")
                .unwrap()
                .name,
            "gpt-4o-mini"
        );
        assert_eq!(
            catalogue
                .lookup_served("openai", "gpt-4o-2024-08-06")
                .unwrap()
                .name,
            "gpt-4o"
        );
        assert!(catalogue.lookup_served("openai", "gpt-4ox").is_none());
        assert_eq!(
            catalogue.get("openai", "gpt-4o").unwrap().id,
            "openai/gpt-4o"
        );
    }
}
