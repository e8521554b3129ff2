//! Structured output: the answer to a `json_schema` response format is checked against the
//! schema; an invalid answer is asked for once more, then the call fails.

use baton_domain::chat::{InferenceRequest, InferenceResponse, ResponseFormat};
use serde_json::Value;

use crate::error::{ProviderError, ProviderResult};
use crate::provider::Provider;

/// Errors listed in a failure message, at most.
const MAX_REPORTED_ERRORS: usize = 3;

/// A compiled output schema. Remote and file `$ref`s are never fetched (the crate is built
/// without its resolvers).
pub struct OutputSchema {
    validator: jsonschema::Validator,
}

impl OutputSchema {
    /// The schema of a request's `json_schema` response format, if it has one.
    pub fn of(request: &InferenceRequest) -> Result<Option<OutputSchema>, String> {
        match &request.response_format {
            Some(ResponseFormat::JsonSchema { schema, .. }) => Self::compile(schema).map(Some),
            _ => Ok(None),
        }
    }

    pub fn compile(schema: &Value) -> Result<OutputSchema, String> {
        jsonschema::validator_for(schema)
            .map(|validator| OutputSchema { validator })
            .map_err(|e| format!("the JSON Schema is invalid: {e}"))
    }

    /// Whether `text` is JSON that follows the schema; the error says why not.
    pub fn check(&self, text: &str) -> Result<(), String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("the answer is not JSON: {e}"))?;
        let errors: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(MAX_REPORTED_ERRORS)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

/// Calls the provider and, when there is a `schema`, checks the answer against it: an invalid
/// answer is retried once; both calls' usage is counted. Answers that call tools, and refusals
/// (the model's final word, which follows no schema), are not checked.
pub async fn infer_checked(
    provider: &dyn Provider,
    request: &InferenceRequest,
    schema: Option<&OutputSchema>,
) -> ProviderResult<InferenceResponse> {
    let first = provider.infer(request).await?;
    let Some(schema) = schema else {
        return Ok(first);
    };
    let Err(first_problem) = check_answer(schema, &first) else {
        return Ok(first);
    };
    tracing::debug!(provider = provider.key(), problem = %first_problem, "structured output invalid; retrying once");
    let mut second = provider.infer(request).await?;
    let mut usage = first.usage;
    usage.add(second.usage);
    second.usage = usage;
    // Two calls: each is priced and counted on its own.
    second.discarded.push(first.usage);
    match check_answer(schema, &second) {
        Ok(()) => Ok(second),
        Err(problem) => Err(ProviderError::InvalidOutput {
            provider: provider.key().to_string(),
            message: problem,
            usage: second.usage,
        }),
    }
}

fn check_answer(schema: &OutputSchema, response: &InferenceResponse) -> Result<(), String> {
    if response.tool_calls.is_empty() && response.refusal.is_none() {
        schema.check(&response.text)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn checks_json_and_names_what_is_wrong() {
        let schema = OutputSchema::compile(&json!({
            "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]
        }))
        .unwrap();
        assert!(schema.check(r#"{"age": 3}"#).is_ok());
        let err = schema.check(r#"{"age": "three"}"#).unwrap_err();
        assert!(err.contains("/age"), "{err}");
        assert!(schema.check("{}").unwrap_err().contains("age"));
        assert!(schema.check("not json").unwrap_err().contains("not JSON"));
        assert!(OutputSchema::compile(&json!({"type": 12})).is_err());
    }

    #[test]
    fn a_refusal_is_a_valid_final_answer() {
        let schema = OutputSchema::compile(&json!({"type": "object"})).unwrap();
        let refused = InferenceResponse {
            refusal: Some("I can't help with that.".into()),
            ..InferenceResponse::default()
        };
        assert!(check_answer(&schema, &refused).is_ok());
        assert!(check_answer(&schema, &InferenceResponse::default()).is_err());
    }

    #[test]
    fn remote_refs_are_not_fetched() {
        // Without resolvers a remote $ref cannot be compiled, so nothing is fetched.
        let result =
            OutputSchema::compile(&json!({"$ref": "http://169.254.169.254/latest/meta-data"}));
        assert!(result.is_err());
    }
}
