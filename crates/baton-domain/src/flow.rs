//! Flows, their versions and templates (SPEC.md "Flow", "Version", "Template"), and the rules of
//! their inputs. Template text syntax is checked by `baton-template` above this crate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DomainError, DomainResult, Timestamp};

/// The template every new flow starts with, and the default entrypoint.
pub const ENTRYPOINT: &str = "main";
const MAX_TITLE_LEN: usize = 200;
const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
const MAX_DESCRIPTION_LEN: usize = 4000;
const MAX_LIST: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ExecutionMode {
    /// The entrypoint template runs.
    #[default]
    Direct,
    /// A classifier picks the template whose description fits the input.
    Route,
}

impl ExecutionMode {
    pub fn parse(raw: &str, param: &str) -> DomainResult<ExecutionMode> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "direct" => Ok(ExecutionMode::Direct),
            "route" => Ok(ExecutionMode::Route),
            _ => Err(DomainError::validation(
                param,
                format!("unknown execution mode '{raw}': use Direct or Route"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionMode::Direct => "Direct",
            ExecutionMode::Route => "Route",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Flow {
    pub id: String,
    /// The slug: unique per tenant, usable wherever `{flowId}` is.
    pub name: String,
    pub title: String,
    /// Environment name to the version running there.
    pub active_versions: BTreeMap<String, String>,
    pub execution_mode: ExecutionMode,
    pub classifier_model: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum VersionStatus {
    Draft,
    Activated,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Activation {
    pub environment: String,
    pub comment: Option<String>,
    pub activated_at: Timestamp,
    pub activated_by: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Template {
    pub name: String,
    pub description: Option<String>,
    /// System prompt with `[[parameter]]` placeholders.
    pub template: String,
    pub user_template: Option<String>,
    /// Model or routing alias; empty means the tenant's default model.
    pub llm: Option<String>,
    pub temperature: Option<f64>,
    pub max_tool_calls: Option<u32>,
    pub tool_ids: Vec<String>,
    pub fallbacks: Vec<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub response_schema: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub id: String,
    pub flow_id: String,
    /// 1, 2, ... per flow.
    pub number: u32,
    pub status: VersionStatus,
    pub entrypoint: String,
    pub templates: Vec<Template>,
    /// Every activation of this version, oldest first.
    pub activations: Vec<Activation>,
    pub created_at: Timestamp,
}

impl Version {
    pub fn template(&self, name: &str) -> Option<&Template> {
        self.templates.iter().find(|t| t.name == name)
    }
}

/// `POST /flows` body.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewFlow {
    pub title: String,
}

/// `PUT /flows/{flowId}` body: only given fields change.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowPatch {
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub execution_mode: Option<String>,
    /// `null` resets to the default classifier model.
    #[serde(default, deserialize_with = "crate::settings::double_option")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub classifier_model: Option<Option<String>>,
}

/// A validated flow patch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidFlowPatch {
    pub title: Option<String>,
    pub execution_mode: Option<ExecutionMode>,
    pub classifier_model: Option<Option<String>>,
}

pub fn validate_title(raw: &str) -> DomainResult<String> {
    let title = raw.trim();
    if title.is_empty() {
        return Err(DomainError::validation("title", "title must not be empty"));
    }
    if title.chars().count() > MAX_TITLE_LEN {
        return Err(DomainError::validation(
            "title",
            format!("title must be at most {MAX_TITLE_LEN} characters"),
        ));
    }
    if title.chars().any(char::is_control) {
        return Err(DomainError::validation(
            "title",
            "title must not contain control characters",
        ));
    }
    Ok(title.to_string())
}

impl FlowPatch {
    pub fn validate(self) -> DomainResult<ValidFlowPatch> {
        Ok(ValidFlowPatch {
            title: self.title.as_deref().map(validate_title).transpose()?,
            execution_mode: self
                .execution_mode
                .as_deref()
                .map(|m| ExecutionMode::parse(m, "executionMode"))
                .transpose()?,
            classifier_model: self
                .classifier_model
                .map(|m| m.map(|m| m.trim().to_string()).filter(|m| !m.is_empty())),
        })
    }
}

/// The slug of a title: lowercase ASCII letters and digits, words joined by `-`.
pub fn slugify(title: &str) -> String {
    let mut slug = String::with_capacity(title.len());
    for c in title.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    while slug.ends_with('-') {
        slug.pop();
    }
    slug.truncate(80);
    while slug.ends_with('-') {
        slug.pop();
    }
    if slug.is_empty() {
        "flow".to_string()
    } else {
        slug
    }
}

/// `PUT .../templates/{name}` body.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateInput {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub user_template: Option<String>,
    #[serde(default)]
    pub llm: Option<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Tool turns before the last call without tools; any 32-bit unsigned count.
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<i64>, minimum = 0, maximum = 4_294_967_295_i64)
    )]
    pub max_tool_calls: Option<u32>,
    #[serde(default)]
    pub tool_ids: Vec<String>,
    #[serde(default)]
    pub fallbacks: Vec<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub response_schema: Option<Value>,
}

impl From<Template> for TemplateInput {
    /// A stored template as the body that would save it (an import checks it as a save does).
    fn from(template: Template) -> TemplateInput {
        TemplateInput {
            description: template.description,
            template: template.template,
            user_template: template.user_template,
            llm: template.llm,
            temperature: template.temperature,
            max_tool_calls: template.max_tool_calls,
            tool_ids: template.tool_ids,
            fallbacks: template.fallbacks,
            response_schema: template.response_schema,
        }
    }
}

/// Template names follow the placeholder rule, since `[[name]]` composes them.
pub fn validate_template_name(name: &str, param: &str) -> DomainResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(DomainError::validation(
            param,
            format!(
                "template name '{name}' must be 1 to 64 lowercase letters, digits or underscores"
            ),
        ))
    }
}

impl TemplateInput {
    /// Checks every field but the template text's syntax; returns the stored form.
    pub fn validate(self, name: &str) -> DomainResult<Template> {
        validate_template_name(name, "name")?;
        for (field, text) in [
            ("template", Some(&self.template)),
            ("userTemplate", self.user_template.as_ref()),
        ] {
            if text.is_some_and(|t| t.len() > MAX_TEMPLATE_BYTES) {
                return Err(DomainError::validation(
                    field,
                    format!("{field} must be at most {MAX_TEMPLATE_BYTES} bytes"),
                ));
            }
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(DomainError::validation(
                "temperature",
                "temperature must be between 0 and 2",
            ));
        }
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
        for (field, list) in [("toolIds", &self.tool_ids), ("fallbacks", &self.fallbacks)] {
            if list.len() > MAX_LIST {
                return Err(DomainError::validation(
                    field,
                    format!("{field} may list at most {MAX_LIST} entries"),
                ));
            }
            if let Some(i) = list.iter().position(|v| v.trim().is_empty()) {
                return Err(DomainError::validation(
                    format!("{field}[{i}]"),
                    "must not be empty",
                ));
            }
        }
        if self
            .response_schema
            .as_ref()
            .is_some_and(|s| !s.is_object() && !s.is_null())
        {
            return Err(DomainError::validation(
                "responseSchema",
                "responseSchema must be a JSON Schema object",
            ));
        }
        Ok(Template {
            name: name.to_string(),
            description,
            template: self.template,
            user_template: self.user_template.filter(|u| !u.is_empty()),
            llm: self
                .llm
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty()),
            temperature: self.temperature,
            max_tool_calls: self.max_tool_calls,
            tool_ids: self.tool_ids,
            fallbacks: self
                .fallbacks
                .into_iter()
                .map(|f| f.trim().to_string())
                .collect(),
            response_schema: self.response_schema.filter(|s| !s.is_null()),
        })
    }
}

/// `POST .../versions/{versionId}/environments` body.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActivateVersion {
    pub environment: String,
    #[serde(default)]
    pub comment: Option<String>,
}

/// `GET /api/v1/export`: every flow with all versions, templates and activations, and tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExportDocument {
    /// Format version of the document (1).
    pub format: u32,
    pub exported_at: Timestamp,
    pub flows: Vec<ExportedFlow>,
    /// Tool records (the tool runtime adds them); imported tools are matched by name.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub tools: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExportedFlow {
    /// The flow's id in the exporting tenant: an import finds tools' references to it (Agent
    /// and CritiqueLoop tools) by it and points them at the imported flow. Not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The slug; an import skips a flow whose slug the tenant already has.
    pub name: String,
    pub title: String,
    #[serde(default)]
    pub execution_mode: ExecutionMode,
    #[serde(default)]
    pub classifier_model: Option<String>,
    pub versions: Vec<ExportedVersion>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExportedVersion {
    pub number: u32,
    pub entrypoint: String,
    pub templates: Vec<Template>,
    /// Oldest first; replayed in order on import, so each environment ends where it was.
    #[serde(default)]
    pub activations: Vec<Activation>,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ImportReport {
    pub flows_created: Vec<String>,
    /// Flows whose slug the tenant already had.
    pub flows_skipped: Vec<String>,
    /// Environments the activations needed that the tenant did not have.
    pub environments_created: Vec<String>,
    pub tools_created: Vec<String>,
    pub tools_skipped: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(slugify("Customer Support Bot"), "customer-support-bot");
        assert_eq!(slugify("  Héllo -- World!! 2 "), "h-llo-world-2");
        assert_eq!(slugify("***"), "flow");
        assert!(slugify(&"a".repeat(300)).len() <= 80);
    }

    #[test]
    fn template_inputs_name_their_bad_field() {
        let param = |input: TemplateInput, name: &str| {
            let DomainError::Validation { param, .. } = input.validate(name).unwrap_err();
            param
        };
        assert_eq!(param(TemplateInput::default(), "Main"), "name");
        assert_eq!(
            param(
                TemplateInput {
                    temperature: Some(2.5),
                    ..Default::default()
                },
                "main"
            ),
            "temperature"
        );
        assert_eq!(
            param(
                TemplateInput {
                    fallbacks: vec!["openai/x".into(), " ".into()],
                    ..Default::default()
                },
                "main"
            ),
            "fallbacks[1]"
        );
        assert_eq!(
            param(
                TemplateInput {
                    response_schema: Some(Value::from(3)),
                    ..Default::default()
                },
                "main"
            ),
            "responseSchema"
        );
        let ok = TemplateInput {
            llm: Some("  ".into()),
            user_template: Some(String::new()),
            ..Default::default()
        }
        .validate("main")
        .unwrap();
        assert_eq!((ok.llm, ok.user_template), (None, None));
    }

    #[test]
    fn modes_parse_in_any_case() {
        assert_eq!(
            ExecutionMode::parse("ROUTE", "m").unwrap(),
            ExecutionMode::Route
        );
        assert!(ExecutionMode::parse("fast", "m").is_err());
    }
}
