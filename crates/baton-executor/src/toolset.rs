//! The tools of one run: what providers are told, and how arguments are checked.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};

use baton_domain::chat::{ToolDefinition, VendorTool};
use baton_domain::tool::{Tool, ToolType};
use serde_json::{Map, Value};

struct Entry {
    /// `None` for a context tool (answered in-process, no record).
    tool: Option<Arc<Tool>>,
    /// `None` when the schema itself could not be compiled: arguments then pass unchecked.
    validator: Option<Arc<jsonschema::Validator>>,
}

/// The context tools with their validators, compiled once: every sub-agent offers them, and
/// compiling their four schemas per sub-agent cost more than the rest of its tool set.
static CONTEXT_TOOLS: LazyLock<Vec<(ToolDefinition, Option<Arc<jsonschema::Validator>>)>> =
    LazyLock::new(|| {
        crate::context::AgentContext::definitions()
            .into_iter()
            .map(|definition| {
                let validator = jsonschema::validator_for(&definition.parameters)
                    .ok()
                    .map(Arc::new);
                (definition, validator)
            })
            .collect()
    });

/// A template's tools as the engine caches them: the tools found, and their tool sets, each
/// built (every schema compiled) once, when a run first asks for it, instead of per run.
#[derive(Default)]
pub struct TemplateTools {
    found: Vec<Tool>,
    plain: OnceLock<Arc<ToolSet>>,
    with_context: OnceLock<Arc<ToolSet>>,
}

impl TemplateTools {
    pub fn new(found: Vec<Tool>) -> TemplateTools {
        TemplateTools {
            found,
            ..TemplateTools::default()
        }
    }

    /// The tools found (a listed id that no longer exists is missing).
    pub fn found(&self) -> &[Tool] {
        &self.found
    }

    /// The tool set of a flow run.
    pub fn set(&self) -> Arc<ToolSet> {
        self.plain
            .get_or_init(|| Arc::new(ToolSet::new(self.found.iter().cloned())))
            .clone()
    }

    /// The tool set of a sub-agent: the template's tools and the context tools.
    pub fn set_with_context_tools(&self) -> Arc<ToolSet> {
        self.with_context
            .get_or_init(|| Arc::new(ToolSet::new(self.found.iter().cloned()).with_context_tools()))
            .clone()
    }
}

/// A template's tools: function definitions for the model, provider-native (Virtual) tools, and
/// a validator per function.
#[derive(Default)]
pub struct ToolSet {
    entries: HashMap<String, Entry>,
    definitions: Vec<ToolDefinition>,
    vendor: Vec<VendorTool>,
}

impl ToolSet {
    pub fn new(tools: impl IntoIterator<Item = Tool>) -> ToolSet {
        let mut set = ToolSet::default();
        for tool in tools {
            if tool.tool_type == ToolType::Virtual {
                if let Some(vendor) = tool.config.virtual_tool_id
                    && !set.vendor.contains(&vendor)
                {
                    set.vendor.push(vendor);
                }
                continue;
            }
            if set.entries.contains_key(&tool.name) {
                continue;
            }
            let schema = tool.json_schema();
            // No remote `$ref` resolution: the workspace builds jsonschema without resolvers.
            let validator = match jsonschema::validator_for(&schema) {
                Ok(validator) => Some(Arc::new(validator)),
                Err(error) => {
                    tracing::warn!(tool = %tool.name, %error, "tool schema does not compile; arguments go unchecked");
                    None
                }
            };
            set.definitions.push(ToolDefinition {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: schema,
                strict: None,
            });
            set.entries.insert(
                tool.name.clone(),
                Entry {
                    tool: Some(Arc::new(tool)),
                    validator,
                },
            );
        }
        set
    }

    /// Adds the context tools of a sub-agent (they replace a library tool of the same name).
    pub fn with_context_tools(mut self) -> ToolSet {
        for (definition, validator) in CONTEXT_TOOLS.iter() {
            self.definitions.retain(|d| d.name != definition.name);
            self.entries.insert(
                definition.name.clone(),
                Entry {
                    tool: None,
                    validator: validator.clone(),
                },
            );
            self.definitions.push(definition.clone());
        }
        self
    }

    /// Whether `name` is a context tool of this set.
    pub fn is_context_tool(&self, name: &str) -> bool {
        self.entries.get(name).is_some_and(|e| e.tool.is_none())
    }

    pub fn is_empty(&self) -> bool {
        self.definitions.is_empty() && self.vendor.is_empty()
    }

    /// Function tools, for the request's `tools`.
    pub fn definitions(&self) -> &[ToolDefinition] {
        &self.definitions
    }

    /// Provider-native tools, for the request's `vendor_tools`.
    pub fn vendor_tools(&self) -> &[VendorTool] {
        &self.vendor
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Tool>> {
        self.entries.get(name).and_then(|e| e.tool.as_ref())
    }

    /// The model's arguments as an object, checked against the tool's schema. The error says
    /// what is wrong in words the model can act on.
    pub fn check_arguments(&self, name: &str, raw: &str) -> Result<Map<String, Value>, String> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| format!("there is no tool named '{name}'"))?;
        let value: Value = if raw.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(raw)
                .map_err(|e| format!("the arguments are not valid JSON: {e}"))?
        };
        let Value::Object(arguments) = value else {
            return Err("the arguments must be a JSON object".into());
        };
        if let Some(validator) = &entry.validator {
            let instance = Value::Object(arguments);
            let problems: Vec<String> = validator
                .iter_errors(&instance)
                .take(5)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    if at.is_empty() {
                        e.to_string()
                    } else {
                        format!("{at}: {e}")
                    }
                })
                .collect();
            if !problems.is_empty() {
                return Err(format!(
                    "invalid arguments for '{name}': {}",
                    problems.join("; ")
                ));
            }
            let Value::Object(arguments) = instance else {
                return Err("the arguments must be a JSON object".into());
            };
            return Ok(arguments);
        }
        Ok(arguments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_domain::Timestamp;
    use baton_domain::tool::ToolInput;
    use serde_json::json;

    fn tool(body: Value) -> Tool {
        let input: ToolInput = serde_json::from_value(body).unwrap();
        input
            .validate()
            .unwrap()
            .into_tool("id".into(), Timestamp::now(), Timestamp::now())
    }

    #[test]
    fn functions_and_vendor_tools_are_told_apart_and_arguments_checked() {
        let set = ToolSet::new([
            tool(
                json!({"name": "weather", "toolType": "External", "webUrl": "/w",
                "parameters": {"properties": [
                    {"name": "city", "type": "String", "required": true},
                    {"name": "days", "type": "Number"}]}}),
            ),
            tool(json!({"name": "search", "toolType": "Virtual", "virtualToolId": "web_search"})),
        ]);
        assert_eq!(set.definitions().len(), 1);
        assert_eq!(set.vendor_tools(), &[VendorTool::WebSearch]);
        assert!(
            set.check_arguments("weather", r#"{"city": "Oslo"}"#)
                .is_ok()
        );
        let missing = set
            .check_arguments("weather", r#"{"days": 2}"#)
            .unwrap_err();
        assert!(missing.contains("city"), "{missing}");
        let wrong = set
            .check_arguments("weather", r#"{"city": "Oslo", "days": "two"}"#)
            .unwrap_err();
        assert!(wrong.contains("/days"), "{wrong}");
        assert!(set.check_arguments("weather", "not json").is_err());
        assert!(set.check_arguments("weather", "[1]").is_err());
        assert!(set.check_arguments("nope", "{}").is_err());
    }

    #[test]
    fn template_tools_build_each_set_once() {
        let template = TemplateTools::new(vec![tool(
            json!({"name": "weather", "toolType": "External", "webUrl": "/w"}),
        )]);
        let plain = template.set();
        assert!(Arc::ptr_eq(&plain, &template.set()));
        assert!(!plain.is_context_tool("get_state"));
        let with_context = template.set_with_context_tools();
        assert!(Arc::ptr_eq(
            &with_context,
            &template.set_with_context_tools()
        ));
        assert!(with_context.is_context_tool("get_state"));
        assert!(with_context.get("weather").is_some());
        assert_eq!(template.found().len(), 1);
    }

    #[test]
    fn context_tools_replace_a_namesake_and_check_their_arguments() {
        // Saved before context tools' names were refused for tenant tools.
        let mut namesake = tool(json!({"name": "state", "toolType": "External", "webUrl": "/s"}));
        namesake.name = "get_state".into();
        let set = ToolSet::new([namesake]).with_context_tools();
        assert!(set.is_context_tool("get_state"));
        let names: Vec<&str> = set.definitions().iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names.iter().filter(|n| **n == "get_state").count(),
            1,
            "{names:?}"
        );
        assert!(names.contains(&"set_state") && names.contains(&"get_context"));
        let missing = set.check_arguments("get_state", "{}").unwrap_err();
        assert!(missing.contains("key"), "{missing}");
        assert!(
            set.check_arguments("set_state", r#"{"key": "k", "value": 1}"#)
                .is_ok()
        );
    }
}
