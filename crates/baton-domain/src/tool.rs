//! Tools in a tenant's library (SPEC.md "Tool", DESIGN.md "Tool records"): the record, the
//! create/replace input and its validation, and the service-format parameters with their
//! conversion to and from JSON Schema.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::chat::VendorTool;
use crate::environment::validate_environment_name;
use crate::{DomainError, DomainResult, Timestamp};

const MAX_DESCRIPTION_LEN: usize = 4000;
const MAX_PROPERTIES: usize = 64;
const MAX_URL_LEN: usize = 2048;
const MAX_ENUM_VALUES: usize = 256;
const MAX_ENUM_VALUE_LEN: usize = 256;
const MAX_HEADERS: usize = 32;
/// CritiqueLoop iterations a tool may ask for; each one is two flow runs.
pub const MAX_LOOP_ITERATIONS: u32 = 20;
pub const DEFAULT_LOOP_ITERATIONS: u32 = 3;
/// The deepest agent nesting a tool may allow.
pub const MAX_AGENT_DEPTH: u32 = 100;
pub const DEFAULT_CALLBACK_TOKEN_HEADER: &str = "X-Tool-Token";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ToolType {
    /// An HTTP endpoint Baton calls with GET (fixed host or caller-hosted).
    External,
    /// A provider-native tool (`web_search`, ...) the provider runs itself.
    Virtual,
    /// Another flow run as a sub-agent.
    Agent,
    /// A producer flow and a critic flow iterated until the critic approves.
    CritiqueLoop,
    /// A tool of a registered MCP server.
    Mcp,
}

impl ToolType {
    /// Any letter case, as DESIGN.md asks of every enum.
    pub fn parse(raw: &str, param: &str) -> DomainResult<ToolType> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "external" => Ok(ToolType::External),
            "virtual" => Ok(ToolType::Virtual),
            "agent" => Ok(ToolType::Agent),
            "critiqueloop" | "critique_loop" => Ok(ToolType::CritiqueLoop),
            "mcp" => Ok(ToolType::Mcp),
            _ => Err(DomainError::validation(
                param,
                format!(
                    "unknown tool type '{raw}': use External, Virtual, Agent, CritiqueLoop or Mcp"
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ToolType::External => "External",
            ToolType::Virtual => "Virtual",
            ToolType::Agent => "Agent",
            ToolType::CritiqueLoop => "CritiqueLoop",
            ToolType::Mcp => "Mcp",
        }
    }
}

/// The type of one parameter. The spec shows `String` and `Number`; `Integer` and `Boolean`
/// are accepted too, since MCP tools and real APIs use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ParameterType {
    String,
    Number,
    Integer,
    Boolean,
}

impl ParameterType {
    fn parse(raw: &str, param: &str) -> DomainResult<ParameterType> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "string" => Ok(ParameterType::String),
            "number" => Ok(ParameterType::Number),
            "integer" => Ok(ParameterType::Integer),
            "boolean" => Ok(ParameterType::Boolean),
            _ => Err(DomainError::validation(
                param,
                format!("unknown parameter type '{raw}': use String, Number, Integer or Boolean"),
            )),
        }
    }

    fn json_type(self) -> &'static str {
        match self {
            ParameterType::String => "string",
            ParameterType::Number => "number",
            ParameterType::Integer => "integer",
            ParameterType::Boolean => "boolean",
        }
    }
}

/// One parameter in the service format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolProperty {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(rename = "type")]
    pub kind: ParameterType,
    #[serde(default)]
    pub required: bool,
    #[serde(default, rename = "enum", skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<String>>,
    /// `true` makes the parameter an array of `type`.
    #[serde(default)]
    pub is_list: bool,
}

/// `parameters` in the service format: `{type: "Object", properties: [...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolParameters {
    /// Always `Object`.
    #[serde(rename = "type", default = "object_type")]
    pub kind: String,
    #[serde(default)]
    pub properties: Vec<ToolProperty>,
}

fn object_type() -> String {
    "Object".to_string()
}

impl Default for ToolParameters {
    fn default() -> Self {
        ToolParameters {
            kind: object_type(),
            properties: Vec::new(),
        }
    }
}

impl ToolParameters {
    /// The JSON Schema providers receive for this tool.
    pub fn to_json_schema(&self) -> Value {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for property in &self.properties {
            let mut item = Map::new();
            item.insert("type".into(), property.kind.json_type().into());
            if let Some(allowed) = &property.allowed {
                item.insert("enum".into(), json!(allowed));
            }
            let mut schema = if property.is_list {
                let mut list = Map::new();
                list.insert("type".into(), "array".into());
                list.insert("items".into(), Value::Object(item));
                list
            } else {
                item
            };
            if let Some(description) = &property.description {
                schema.insert("description".into(), description.clone().into());
            }
            properties.insert(property.name.clone(), Value::Object(schema));
            if property.required {
                required.push(Value::from(property.name.clone()));
            }
        }
        json!({"type": "object", "properties": properties, "required": required})
    }

    /// The service format of a JSON Schema (an MCP tool's input schema). Lossy by nature:
    /// nested objects become `String` parameters (the model sends them as JSON text); the
    /// original schema is kept beside it (`rawInputSchema`) and is what providers receive.
    pub fn from_json_schema(schema: &Value) -> ToolParameters {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| {
                props
                    .iter()
                    .map(|(name, prop)| {
                        let is_list = prop.get("type").and_then(Value::as_str) == Some("array");
                        let item = if is_list {
                            prop.get("items").unwrap_or(&Value::Null)
                        } else {
                            prop
                        };
                        let kind = match item.get("type").and_then(Value::as_str) {
                            Some("number") => ParameterType::Number,
                            Some("integer") => ParameterType::Integer,
                            Some("boolean") => ParameterType::Boolean,
                            _ => ParameterType::String,
                        };
                        let allowed = item.get("enum").and_then(Value::as_array).map(|values| {
                            values
                                .iter()
                                .map(|v| match v {
                                    Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect()
                        });
                        let description = prop
                            .get("description")
                            .or_else(|| prop.get("title"))
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        ToolProperty {
                            name: name.clone(),
                            description,
                            kind,
                            required: required.contains(&name.as_str()),
                            allowed,
                            is_list,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        ToolParameters {
            kind: object_type(),
            properties,
        }
    }

    fn validate(mut self) -> DomainResult<ToolParameters> {
        if !self.kind.eq_ignore_ascii_case("object") {
            return Err(DomainError::validation(
                "parameters.type",
                format!("parameters.type must be Object, not '{}'", self.kind),
            ));
        }
        self.kind = object_type();
        if self.properties.len() > MAX_PROPERTIES {
            return Err(DomainError::validation(
                "parameters.properties",
                format!("a tool may have at most {MAX_PROPERTIES} parameters"),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, property) in self.properties.iter().enumerate() {
            let param = format!("parameters.properties[{i}].name");
            validate_property_name(&property.name, &param)?;
            if !seen.insert(property.name.as_str()) {
                return Err(DomainError::validation(
                    param,
                    format!("parameter '{}' is declared twice", property.name),
                ));
            }
            if property
                .allowed
                .as_ref()
                .is_some_and(|values| values.is_empty())
            {
                return Err(DomainError::validation(
                    format!("parameters.properties[{i}].enum"),
                    "enum must list at least one value",
                ));
            }
            if property
                .description
                .as_ref()
                .is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_LEN)
            {
                return Err(DomainError::validation(
                    format!("parameters.properties[{i}].description"),
                    format!("description is longer than {MAX_DESCRIPTION_LEN} characters"),
                ));
            }
            let values = property.allowed.as_deref().unwrap_or_default();
            if values.len() > MAX_ENUM_VALUES {
                return Err(DomainError::validation(
                    format!("parameters.properties[{i}].enum"),
                    format!("enum may list at most {MAX_ENUM_VALUES} values"),
                ));
            }
            if let Some(j) = values
                .iter()
                .position(|v| v.chars().count() > MAX_ENUM_VALUE_LEN)
            {
                return Err(DomainError::validation(
                    format!("parameters.properties[{i}].enum[{j}]"),
                    format!("an enum value is at most {MAX_ENUM_VALUE_LEN} characters"),
                ));
            }
        }
        Ok(self)
    }
}

/// The raw input form of `parameters`: the type names are checked case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolParametersInput {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub properties: Vec<ToolPropertyInput>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolPropertyInput {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// `String`, `Number`, `Integer` or `Boolean`, any case; default `String`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub required: bool,
    #[serde(default, rename = "enum")]
    pub allowed: Option<Vec<String>>,
    #[serde(default)]
    pub is_list: bool,
}

impl ToolParametersInput {
    fn validate(self) -> DomainResult<ToolParameters> {
        let properties = self
            .properties
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let kind = match p.kind.as_deref() {
                    Some(raw) => {
                        ParameterType::parse(raw, &format!("parameters.properties[{i}].type"))?
                    }
                    None => ParameterType::String,
                };
                Ok(ToolProperty {
                    name: p.name.trim().to_string(),
                    description: p
                        .description
                        .map(|d| d.trim().to_string())
                        .filter(|d| !d.is_empty()),
                    kind,
                    required: p.required,
                    allowed: p.allowed,
                    is_list: p.is_list,
                })
            })
            .collect::<DomainResult<Vec<_>>>()?;
        ToolParameters {
            kind: self.kind.unwrap_or_else(object_type),
            properties,
        }
        .validate()
    }
}

/// Property names become JSON keys and query parameter names.
fn validate_property_name(name: &str, param: &str) -> DomainResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if valid {
        Ok(())
    } else {
        Err(DomainError::validation(
            param,
            format!("parameter name '{name}' must be 1 to 64 letters, digits, '_', '-' or '.'"),
        ))
    }
}

/// Tool names are sent to providers as function names, which allow `[A-Za-z0-9_-]{1,64}`.
/// The context tools every sub-agent is given (SPEC.md "Context tools"). A tenant's tool may not
/// take one of these names: in a sub-agent the built-in one would win and the tenant's tool would
/// silently never be called.
pub const CONTEXT_TOOL_NAMES: [&str; 4] = [
    "get_context",
    "get_original_input",
    "get_state",
    "set_state",
];

pub fn validate_tool_name(raw: &str, param: &str) -> DomainResult<String> {
    let name = raw.trim();
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(name.to_string())
    } else {
        Err(DomainError::validation(
            param,
            format!(
                "tool name '{name}' must be 1 to 64 letters, digits, '_' or '-' (providers accept no other function names)"
            ),
        ))
    }
}

/// An environment-specific endpoint of an External tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvironmentOverride {
    pub web_url: String,
}

/// A tool in a tenant's library. Serialised with the type under both `toolType` and `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub tool_type: ToolType,
    /// The same value as `toolType` (the spec uses both names).
    #[serde(rename = "type")]
    pub type_alias: ToolType,
    pub parameters: ToolParameters,
    #[serde(flatten)]
    pub config: ToolConfig,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Tool {
    /// The record as clients see it: header values (often credentials) replaced by
    /// [`REDACTED`]; they are only ever sent to the tool's host.
    pub fn redacted(mut self) -> Tool {
        for value in self.config.headers.values_mut() {
            *value = REDACTED.to_string();
        }
        self
    }
}

/// The type-specific fields; those of other types are absent (null).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolConfig {
    // External
    /// Absolute `https://...` (fixed host) or a relative path (caller-hosted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_url: Option<String>,
    /// Environment name to URL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub web_urls: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment_overrides: BTreeMap<String, EnvironmentOverride>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Header the caller's `X-Baton-Callback-Token` is presented under (default `X-Tool-Token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_token_header: Option<String>,
    // Virtual
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_tool_id: Option<VendorTool>,
    // Agent
    /// The flow (id or slug) run as the sub-agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_template_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_agent_depth: Option<u32>,
    // CritiqueLoop
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_flow_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic_flow_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loop_iterations: Option<u32>,
    // Mcp
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server_id: Option<String>,
    /// The MCP server's own input schema; providers receive it unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub raw_input_schema: Option<Value>,
    /// The name the MCP server knows the tool by, when this tool's is another: a server's name
    /// with characters function names do not take (`files.read`), or a tool renamed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_tool_name: Option<String>,
}

impl Tool {
    /// The JSON Schema of the arguments: an MCP tool's original schema, else the converted
    /// service-format parameters.
    pub fn json_schema(&self) -> Value {
        match &self.config.raw_input_schema {
            Some(schema) if schema.is_object() => schema.clone(),
            // A sub-agent needs to be told something: without parameters it takes one `input`,
            // which its flow reads as `[[input]]` (or as its user message).
            _ if self.parameters.properties.is_empty()
                && matches!(self.tool_type, ToolType::Agent | ToolType::CritiqueLoop) =>
            {
                json!({"type": "object",
                       "properties": {"input": {"type": "string", "description": "The task for the agent, in full"}},
                       "required": ["input"]})
            }
            _ => self.parameters.to_json_schema(),
        }
    }

    /// The header the callback token is presented under.
    pub fn callback_token_header(&self) -> &str {
        self.config
            .callback_token_header
            .as_deref()
            .unwrap_or(DEFAULT_CALLBACK_TOKEN_HEADER)
    }
}

/// `POST /tools` and `PUT /tools/{id}` body: a tool record without the server-set fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolInput {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// `External`, `Virtual`, `Agent`, `CritiqueLoop` or `Mcp`, any case.
    #[serde(default)]
    pub tool_type: Option<String>,
    /// Same as `toolType`; either may be sent (both must agree when both are).
    #[serde(default, rename = "type")]
    pub type_alias: Option<String>,
    #[serde(default)]
    pub parameters: Option<ToolParametersInput>,
    #[serde(default)]
    pub web_url: Option<String>,
    #[serde(default)]
    pub web_urls: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub environment_overrides: Option<BTreeMap<String, EnvironmentOverride>>,
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub callback_token_header: Option<String>,
    #[serde(default)]
    pub virtual_tool_id: Option<String>,
    #[serde(default)]
    pub agent_template_id: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub max_agent_depth: Option<u32>,
    #[serde(default)]
    pub producer_flow_id: Option<String>,
    #[serde(default)]
    pub critic_flow_id: Option<String>,
    #[serde(default)]
    pub max_loop_iterations: Option<u32>,
    #[serde(default)]
    pub mcp_server_id: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub raw_input_schema: Option<Value>,
    #[serde(default)]
    pub mcp_tool_name: Option<String>,
    // Server-set fields of an exported record; accepted so a record can be sent back as is.
    #[serde(default, skip_serializing)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub id: Option<Value>,
    #[serde(default, skip_serializing)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub created_at: Option<Value>,
    #[serde(default, skip_serializing)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub updated_at: Option<Value>,
}

/// A tool input whose fields are well formed. Whether the flows and the MCP server it names
/// exist is checked above this crate.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTool {
    pub name: String,
    pub description: Option<String>,
    pub tool_type: ToolType,
    pub parameters: ToolParameters,
    pub config: ToolConfig,
}

impl ValidTool {
    /// The record, once stored.
    pub fn into_tool(self, id: String, created_at: Timestamp, updated_at: Timestamp) -> Tool {
        Tool {
            id,
            name: self.name,
            description: self.description,
            tool_type: self.tool_type,
            type_alias: self.tool_type,
            parameters: self.parameters,
            config: self.config,
            created_at,
            updated_at,
        }
    }
}

impl From<Tool> for ToolInput {
    /// A stored record back in input form (import of an exported document).
    fn from(tool: Tool) -> ToolInput {
        let config = tool.config;
        ToolInput {
            name: tool.name,
            description: tool.description,
            tool_type: Some(tool.tool_type.as_str().to_string()),
            parameters: Some(ToolParametersInput {
                kind: Some(tool.parameters.kind),
                properties: tool
                    .parameters
                    .properties
                    .into_iter()
                    .map(|p| ToolPropertyInput {
                        name: p.name,
                        description: p.description,
                        kind: Some(p.kind.json_type().to_string()),
                        required: p.required,
                        allowed: p.allowed,
                        is_list: p.is_list,
                    })
                    .collect(),
            }),
            web_url: config.web_url,
            web_urls: Some(config.web_urls),
            environment_overrides: Some(config.environment_overrides),
            headers: Some(config.headers),
            callback_token_header: config.callback_token_header,
            virtual_tool_id: config.virtual_tool_id.map(|v| v.as_str().to_string()),
            agent_template_id: config.agent_template_id,
            max_agent_depth: config.max_agent_depth,
            producer_flow_id: config.producer_flow_id,
            critic_flow_id: config.critic_flow_id,
            max_loop_iterations: config.max_loop_iterations,
            mcp_server_id: config.mcp_server_id,
            raw_input_schema: config.raw_input_schema,
            mcp_tool_name: config.mcp_tool_name,
            ..ToolInput::default()
        }
    }
}

/// This library's name for a tool an MCP server calls `remote`: the same where it is a valid
/// tool name, else with each other character replaced by `_` (`files.read` -> `files_read`).
pub fn mcp_local_name(remote: &str) -> String {
    let mut name: String = remote
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.len() > 64 {
        name.truncate(64);
    }
    if name.is_empty() {
        "_".to_string()
    } else {
        name
    }
}

/// Headers the MCP transport sets itself; a server record may not carry them.
pub const MCP_TRANSPORT_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// Headers HTTP itself manages on every request: a stored value would break or redirect each
/// call (a `Content-Length` on a bodiless GET hangs it until the timeout; `Host` sends it to
/// another virtual host).
pub const HTTP_MANAGED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Refuses a header in any of `managed` (set by `setter`) and a name given twice in different
/// cases (only one would be sent).
fn refuse_managed_headers(
    headers: &BTreeMap<String, String>,
    param: &str,
    managed: &[&[&str]],
    setter: &str,
) -> DomainResult<()> {
    let mut seen = std::collections::HashSet::new();
    for name in headers.keys() {
        let lower = name.to_ascii_lowercase();
        if managed.iter().any(|list| list.contains(&lower.as_str())) {
            return Err(DomainError::validation(
                format!("{param}.{name}"),
                format!("'{name}' is set by {setter} itself"),
            ));
        }
        if !seen.insert(lower) {
            return Err(DomainError::validation(
                format!("{param}.{name}"),
                format!("header '{name}' is given twice (header names ignore case)"),
            ));
        }
    }
    Ok(())
}

/// Whether `raw` is a relative `webUrl` (the tool is caller-hosted).
pub fn is_relative_url(raw: &str) -> bool {
    raw.starts_with('/')
}

fn validate_web_url(raw: &str, param: &str) -> DomainResult<String> {
    let url = raw.trim();
    if url.is_empty() {
        return Err(DomainError::validation(
            param,
            format!("{param} must not be empty"),
        ));
    }
    if url.len() > MAX_URL_LEN {
        return Err(DomainError::validation(
            param,
            format!("{param} must be at most {MAX_URL_LEN} bytes"),
        ));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(DomainError::validation(
            param,
            format!("{param} must not contain white space or control characters"),
        ));
    }
    if is_relative_url(url) {
        if url.starts_with("//") {
            return Err(DomainError::validation(
                param,
                format!(
                    "{param} '{url}' is protocol-relative: use an absolute https:// URL or a path starting with a single '/'"
                ),
            ));
        }
        return Ok(url.to_string());
    }
    // Placeholders may sit in the host, port or path: check the shape with each filled in by a
    // value that fits any of them.
    let probe = fill_placeholders(url, "1");
    match url::Url::parse(&probe) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => {
            Ok(url.to_string())
        }
        _ => Err(DomainError::validation(
            param,
            format!(
                "{param} '{url}' must be an absolute http(s) URL or a relative path starting with '/'"
            ),
        )),
    }
}

/// `text` with every `[[...]]` replaced by `value`.
fn fill_placeholders(text: &str, value: &str) -> String {
    let mut filled = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[[") {
        let Some(length) = rest[start..].find("]]") else {
            break;
        };
        filled.push_str(&rest[..start]);
        filled.push_str(value);
        rest = &rest[start + length + 2..];
    }
    filled.push_str(rest);
    filled
}

fn validate_header_name(name: &str, param: &str) -> DomainResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if valid {
        Ok(())
    } else {
        Err(DomainError::validation(
            param,
            format!("'{name}' is not a valid HTTP header name"),
        ))
    }
}

/// Checks custom headers: valid names, values without line breaks. Values are never echoed.
pub fn validate_headers(headers: &BTreeMap<String, String>, param: &str) -> DomainResult<()> {
    if headers.len() > MAX_HEADERS {
        return Err(DomainError::validation(
            param,
            format!("at most {MAX_HEADERS} headers"),
        ));
    }
    for (name, value) in headers {
        validate_header_name(name, &format!("{param}.{name}"))?;
        if value.len() > 8192 || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(DomainError::validation(
                format!("{param}.{name}"),
                format!("the value of header '{name}' must be one line of at most 8192 bytes"),
            ));
        }
    }
    Ok(())
}

fn required_text(value: Option<String>, param: &str, tool_type: ToolType) -> DomainResult<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            DomainError::validation(
                param,
                format!("{param} is required for a {} tool", tool_type.as_str()),
            )
        })
}

impl ToolInput {
    pub fn validate(self) -> DomainResult<ValidTool> {
        let name = validate_tool_name(&self.name, "name")?;
        if CONTEXT_TOOL_NAMES.contains(&name.as_str()) {
            return Err(DomainError::validation(
                "name",
                format!(
                    "'{name}' is the name of a context tool every sub-agent has: choose another"
                ),
            ));
        }
        let tool_type = match (&self.tool_type, &self.type_alias) {
            (Some(a), Some(b)) => {
                let (a, b) = (ToolType::parse(a, "toolType")?, ToolType::parse(b, "type")?);
                if a != b {
                    return Err(DomainError::validation(
                        "type",
                        format!(
                            "toolType '{}' and type '{}' disagree",
                            a.as_str(),
                            b.as_str()
                        ),
                    ));
                }
                a
            }
            (Some(a), None) => ToolType::parse(a, "toolType")?,
            (None, Some(b)) => ToolType::parse(b, "type")?,
            (None, None) => {
                return Err(DomainError::validation(
                    "toolType",
                    "toolType (or type) is required: External, Virtual, Agent, CritiqueLoop or Mcp",
                ));
            }
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
        let raw_input_schema = self.raw_input_schema.filter(|s| !s.is_null());
        let parameters = match self.parameters {
            Some(input) => input.validate()?,
            // An MCP tool's parameters follow from its schema when not given.
            None => raw_input_schema
                .as_ref()
                .map(ToolParameters::from_json_schema)
                .unwrap_or_default(),
        };

        let web_urls = self.web_urls.unwrap_or_default();
        let environment_overrides = self.environment_overrides.unwrap_or_default();
        let headers = self.headers.unwrap_or_default();
        // Fields of another type are refused: they would be silently ignored otherwise.
        let foreign: &[(&str, bool)] = &[
            ("webUrl", self.web_url.is_some()),
            ("webUrls", !web_urls.is_empty()),
            ("environmentOverrides", !environment_overrides.is_empty()),
            ("headers", !headers.is_empty()),
            ("callbackTokenHeader", self.callback_token_header.is_some()),
            ("virtualToolId", self.virtual_tool_id.is_some()),
            ("agentTemplateId", self.agent_template_id.is_some()),
            ("maxAgentDepth", self.max_agent_depth.is_some()),
            ("producerFlowId", self.producer_flow_id.is_some()),
            ("criticFlowId", self.critic_flow_id.is_some()),
            ("maxLoopIterations", self.max_loop_iterations.is_some()),
            ("mcpServerId", self.mcp_server_id.is_some()),
            ("rawInputSchema", raw_input_schema.is_some()),
            ("mcpToolName", self.mcp_tool_name.is_some()),
        ];
        let own: &[&str] = match tool_type {
            ToolType::External => &[
                "webUrl",
                "webUrls",
                "environmentOverrides",
                "headers",
                "callbackTokenHeader",
            ],
            ToolType::Virtual => &["virtualToolId"],
            ToolType::Agent => &["agentTemplateId", "maxAgentDepth"],
            ToolType::CritiqueLoop => &["producerFlowId", "criticFlowId", "maxLoopIterations"],
            ToolType::Mcp => &["mcpServerId", "rawInputSchema", "mcpToolName"],
        };
        if let Some((field, _)) = foreign
            .iter()
            .find(|(field, present)| *present && !own.contains(field))
        {
            return Err(DomainError::validation(
                *field,
                format!("{field} does not apply to a {} tool", tool_type.as_str()),
            ));
        }

        let mut config = ToolConfig::default();
        match tool_type {
            ToolType::External => {
                config.web_url = self
                    .web_url
                    .as_deref()
                    .map(|u| validate_web_url(u, "webUrl"))
                    .transpose()?;
                // Keys are environment names, held to their rules (and trimmed as stored).
                for (env, url) in &web_urls {
                    let name = validate_environment_name(env, &format!("webUrls.{env}"))?;
                    let url = validate_web_url(url, &format!("webUrls.{env}"))?;
                    config.web_urls.insert(name, url);
                }
                for (env, over) in environment_overrides {
                    let name =
                        validate_environment_name(&env, &format!("environmentOverrides.{env}"))?;
                    let param = format!("environmentOverrides.{env}.webUrl");
                    let web_url = validate_web_url(&over.web_url, &param)?;
                    config
                        .environment_overrides
                        .insert(name, EnvironmentOverride { web_url });
                }
                if config.web_url.is_none() && config.web_urls.is_empty() {
                    return Err(DomainError::validation(
                        "webUrl",
                        "webUrl is required for an External tool (an absolute https:// URL, or a relative path for a caller-hosted tool)",
                    ));
                }
                validate_headers(&headers, "headers")?;
                refuse_managed_headers(&headers, "headers", &[HTTP_MANAGED_HEADERS], "HTTP")?;
                config.headers = headers;
                if let Some(header) = self.callback_token_header {
                    let header = header.trim().to_string();
                    validate_header_name(&header, "callbackTokenHeader")?;
                    if HTTP_MANAGED_HEADERS.contains(&header.to_ascii_lowercase().as_str()) {
                        return Err(DomainError::validation(
                            "callbackTokenHeader",
                            format!("'{header}' is set by HTTP itself: choose another header"),
                        ));
                    }
                    config.callback_token_header = Some(header);
                }
            }
            ToolType::Virtual => {
                let id = required_text(self.virtual_tool_id, "virtualToolId", tool_type)?;
                config.virtual_tool_id = Some(VendorTool::parse(&id, "virtualToolId")?);
            }
            ToolType::Agent => {
                config.agent_template_id = Some(required_text(
                    self.agent_template_id,
                    "agentTemplateId",
                    tool_type,
                )?);
                if let Some(depth) = self.max_agent_depth
                    && !(1..=MAX_AGENT_DEPTH).contains(&depth)
                {
                    return Err(DomainError::validation(
                        "maxAgentDepth",
                        format!("maxAgentDepth must be between 1 and {MAX_AGENT_DEPTH}"),
                    ));
                }
                config.max_agent_depth = self.max_agent_depth;
            }
            ToolType::CritiqueLoop => {
                config.producer_flow_id = Some(required_text(
                    self.producer_flow_id,
                    "producerFlowId",
                    tool_type,
                )?);
                config.critic_flow_id = Some(required_text(
                    self.critic_flow_id,
                    "criticFlowId",
                    tool_type,
                )?);
                let iterations = self.max_loop_iterations.unwrap_or(DEFAULT_LOOP_ITERATIONS);
                if !(1..=MAX_LOOP_ITERATIONS).contains(&iterations) {
                    return Err(DomainError::validation(
                        "maxLoopIterations",
                        format!("maxLoopIterations must be between 1 and {MAX_LOOP_ITERATIONS}"),
                    ));
                }
                config.max_loop_iterations = Some(iterations);
            }
            ToolType::Mcp => {
                config.mcp_server_id =
                    Some(required_text(self.mcp_server_id, "mcpServerId", tool_type)?);
                // An MCP tool's input is an object (the MCP specification says so, and
                // providers take no other function parameters); a schema that leaves its type
                // out says so explicitly here, so providers are told.
                let mut raw_input_schema = raw_input_schema;
                if let Some(schema) = raw_input_schema.as_mut() {
                    let Some(object) = schema.as_object_mut() else {
                        return Err(DomainError::validation(
                            "rawInputSchema",
                            "rawInputSchema must be a JSON Schema object of type 'object'",
                        ));
                    };
                    match object.get("type") {
                        None => {
                            object.insert("type".into(), Value::from("object"));
                        }
                        Some(kind) if kind == "object" => {}
                        Some(_) => {
                            return Err(DomainError::validation(
                                "rawInputSchema",
                                "rawInputSchema must be a JSON Schema object of type 'object'",
                            ));
                        }
                    }
                }
                config.raw_input_schema = raw_input_schema;
                if let Some(remote) = self.mcp_tool_name {
                    let remote = remote.trim();
                    if remote.is_empty()
                        || remote.len() > 128
                        || remote.chars().any(char::is_control)
                    {
                        return Err(DomainError::validation(
                            "mcpToolName",
                            "mcpToolName must be 1 to 128 characters on one line",
                        ));
                    }
                    config.mcp_tool_name = Some(remote.to_string());
                }
            }
        }
        Ok(ValidTool {
            name,
            description,
            tool_type,
            parameters,
            config,
        })
    }
}

/// A flow version whose templates list a tool (`GET /tools/{id}/usage`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolUsage {
    pub flow_id: String,
    pub flow_name: String,
    pub flow_title: String,
    pub version_id: String,
    pub version_number: u32,
    pub template_names: Vec<String>,
    /// Environments this version is active in.
    pub environments: Vec<String>,
}

/// A registered MCP server (SPEC.md "MCP server"). Header values are secrets: responses show
/// them redacted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct McpServer {
    pub id: String,
    pub name: String,
    pub url: String,
    pub headers: BTreeMap<String, String>,
    pub discovered_tool_count: Option<u32>,
    pub last_connected_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Shown instead of a stored header value; sent back unchanged on update, it keeps the value.
pub const REDACTED: &str = "********";

/// The stored value of header `name` (header names ignore case), which a `********` sent back
/// on update keeps.
pub fn stored_header<'a>(stored: &'a BTreeMap<String, String>, name: &str) -> Option<&'a String> {
    stored
        .iter()
        .find(|(stored, _)| stored.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
}

impl McpServer {
    /// The record as clients see it: header values replaced by [`REDACTED`].
    pub fn redacted(mut self) -> McpServer {
        for value in self.headers.values_mut() {
            *value = REDACTED.to_string();
        }
        self
    }
}

/// `POST /mcp-servers` and `PUT /mcp-servers/{id}` body.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServerInput {
    pub name: String,
    pub url: String,
    /// Sent on every request to the server (e.g. `Authorization`). On update, a value of
    /// `********` keeps the stored one.
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ValidMcpServer {
    pub name: String,
    pub url: url::Url,
    pub headers: BTreeMap<String, String>,
}

impl McpServerInput {
    pub fn validate(self) -> DomainResult<ValidMcpServer> {
        let name = self.name.trim().to_string();
        if name.is_empty() || name.len() > 200 {
            return Err(DomainError::validation(
                "name",
                "name must be 1 to 200 characters",
            ));
        }
        if self.url.len() > MAX_URL_LEN {
            return Err(DomainError::validation(
                "url",
                format!("url is longer than {MAX_URL_LEN} bytes"),
            ));
        }
        let url = url::Url::parse(self.url.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| DomainError::validation("url", "url must be an absolute http(s) URL"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(DomainError::validation(
                "url",
                "url must not carry credentials: put them in headers",
            ));
        }
        let headers = self.headers.unwrap_or_default();
        validate_headers(&headers, "headers")?;
        refuse_managed_headers(
            &headers,
            "headers",
            &[MCP_TRANSPORT_HEADERS, HTTP_MANAGED_HEADERS],
            "the MCP transport",
        )?;
        Ok(ValidMcpServer { name, url, headers })
    }
}

/// One tool a server offers (`POST /mcp-servers/{id}/discover`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredTool {
    pub name: String,
    pub description: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input_schema: Value,
    /// A tool of this server with this name is already in the library.
    pub already_imported: bool,
}

/// `POST /mcp-servers/{id}/import` body.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpImportInput {
    pub tool_names: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(input: Value) -> String {
        let input: ToolInput = serde_json::from_value(input).unwrap();
        let DomainError::Validation { param, .. } = input.validate().unwrap_err();
        param
    }

    #[test]
    fn type_is_read_from_either_field_in_any_case() {
        for body in [
            json!({"name": "w", "toolType": "external", "webUrl": "https://x.example/w"}),
            json!({"name": "w", "type": "EXTERNAL", "webUrl": "https://x.example/w"}),
            json!({"name": "w", "type": "External", "toolType": "eXternal", "webUrl": "/w"}),
        ] {
            let input: ToolInput = serde_json::from_value(body).unwrap();
            assert_eq!(input.validate().unwrap().tool_type, ToolType::External);
        }
        assert_eq!(param_of(json!({"name": "w", "webUrl": "/w"})), "toolType");
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "Agent", "type": "Mcp"})),
            "type"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "Lambda"})),
            "toolType"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(
            param_of(json!({"name": "bad name", "toolType": "External", "webUrl": "/w"})),
            "name"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External"})),
            "webUrl"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrl": "ftp://x/y"})),
            "webUrl"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrl": "//evil.example/x"})),
            "webUrl"
        );
        assert_eq!(
            param_of(
                json!({"name": "w", "toolType": "External", "webUrl": "/w", "headers": {"Bad Header": "v"}})
            ),
            "headers.Bad Header"
        );
        assert_eq!(
            param_of(
                json!({"name": "w", "toolType": "External", "webUrl": "/w", "virtualToolId": "web_search"})
            ),
            "virtualToolId"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "Virtual", "virtualToolId": "telepathy"})),
            "virtualToolId"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "Agent"})),
            "agentTemplateId"
        );
        assert_eq!(
            param_of(
                json!({"name": "w", "toolType": "CritiqueLoop", "producerFlowId": "a", "criticFlowId": "b", "maxLoopIterations": 0})
            ),
            "maxLoopIterations"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrl": "/w",
                "parameters": {"type": "Object", "properties": [{"name": "q", "type": "Date"}]}})),
            "parameters.properties[0].type"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrl": "/w",
                "parameters": {"properties": [{"name": "q"}, {"name": "q"}]}})),
            "parameters.properties[1].name"
        );
        // Every stored string is bounded.
        let long = "x".repeat(4_001);
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrl": "/w",
                "parameters": {"properties": [{"name": "q", "description": long}]}})),
            "parameters.properties[0].description"
        );
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrl": "/w",
                "parameters": {"properties": [{"name": "q", "enum": ["a", "x".repeat(257)]}]}})),
            "parameters.properties[0].enum[1]"
        );
        let env = "e".repeat(300);
        assert_eq!(
            param_of(json!({"name": "w", "toolType": "External", "webUrls": {env.clone(): "/w"}})),
            format!("webUrls.{env}")
        );
    }

    #[test]
    fn critique_loop_defaults_to_three_iterations() {
        let input: ToolInput = serde_json::from_value(json!({
            "name": "review", "type": "critiqueloop", "producerFlowId": "p", "criticFlowId": "c"
        }))
        .unwrap();
        assert_eq!(
            input.validate().unwrap().config.max_loop_iterations,
            Some(3)
        );
    }

    #[test]
    fn service_parameters_convert_to_json_schema_and_back() {
        let input: ToolParametersInput = serde_json::from_value(json!({
            "type": "Object",
            "properties": [
                {"name": "city", "description": "City name", "type": "String", "required": true},
                {"name": "unit", "type": "string", "enum": ["c", "f"]},
                {"name": "days", "type": "Number", "isList": true},
            ]
        }))
        .unwrap();
        let params = input.validate().unwrap();
        let schema = params.to_json_schema();
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "array", "items": {"type": "number"}},
                },
                "required": ["city"],
            })
        );
        // JSON object keys come back sorted.
        let mut back = ToolParameters::from_json_schema(&schema);
        let mut expected = params.clone();
        back.properties.sort_by(|a, b| a.name.cmp(&b.name));
        expected.properties.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(back, expected);
    }

    #[test]
    fn external_tools_refuse_headers_http_manages_and_names_given_twice() {
        let refused = |extra: serde_json::Value| {
            let mut body =
                json!({"name": "t", "toolType": "External", "webUrl": "https://a.example/x"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let input: ToolInput = serde_json::from_value(body).unwrap();
            match input.validate() {
                Err(DomainError::Validation { param, .. }) => param,
                Ok(_) => panic!("{extra} was accepted"),
            }
        };
        assert_eq!(
            refused(json!({"headers": {"Content-Length": "5"}})),
            "headers.Content-Length"
        );
        assert_eq!(
            refused(json!({"headers": {"host": "evil.example"}})),
            "headers.host"
        );
        assert_eq!(
            refused(json!({"headers": {"X-A": "1", "x-a": "2"}})),
            "headers.x-a"
        );
        assert_eq!(
            refused(json!({"callbackTokenHeader": "Host"})),
            "callbackTokenHeader"
        );
        assert_eq!(refused(json!({"name": "get_state"})), "name");
        // A placeholder may stand for the port too.
        for url in [
            "http://[[h]]:[[port]]/x",
            "https://[[t]].example.com:8443/[[p]]",
        ] {
            let input: ToolInput =
                serde_json::from_value(json!({"name": "t", "toolType": "External", "webUrl": url}))
                    .unwrap();
            assert!(input.validate().is_ok(), "{url}");
        }
        let kept: ToolInput = serde_json::from_value(json!({
            "name": "t", "toolType": "External", "webUrl": "https://a.example/x",
            "headers": {"Authorization": "Bearer k", "X-A": "1"}, "callbackTokenHeader": "X-Caller",
        }))
        .unwrap();
        assert!(kept.validate().is_ok());
    }

    #[test]
    fn mcp_schemas_become_service_parameters() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer", "title": "A"},
                "flag": {"type": "boolean"},
                "opts": {"type": "object"},
            },
            "required": ["a"],
        });
        let input: ToolInput = serde_json::from_value(json!({
            "name": "add", "toolType": "Mcp", "mcpServerId": "s1", "rawInputSchema": schema,
        }))
        .unwrap();
        let tool = input.validate().unwrap();
        let kinds: Vec<_> = tool
            .parameters
            .properties
            .iter()
            .map(|p| (p.name.as_str(), p.kind, p.required))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("a", ParameterType::Integer, true),
                ("flag", ParameterType::Boolean, false),
                ("opts", ParameterType::String, false),
            ]
        );
        let stored = tool.into_tool("t".into(), Timestamp::now(), Timestamp::now());
        assert_eq!(
            stored.json_schema(),
            schema,
            "providers get the original schema"
        );
    }

    #[test]
    fn records_serialise_the_type_twice_and_round_trip_to_input() {
        let input: ToolInput = serde_json::from_value(json!({
            "name": "weather", "toolType": "External", "webUrl": "/weather?city=[[city]]",
            "headers": {"X-Api": "k"}, "callbackTokenHeader": "X-Secret",
        }))
        .unwrap();
        let tool =
            input
                .validate()
                .unwrap()
                .into_tool("t1".into(), Timestamp::now(), Timestamp::now());
        let value = serde_json::to_value(&tool).unwrap();
        assert_eq!(value["toolType"], "External");
        assert_eq!(value["type"], "External");
        assert_eq!(value["webUrl"], "/weather?city=[[city]]");
        assert!(value.get("virtualToolId").is_none());
        // An exported record is accepted back as input.
        let back: ToolInput = serde_json::from_value(value).unwrap();
        assert_eq!(back.validate().unwrap().config, tool.config);
        assert_eq!(tool.callback_token_header(), "X-Secret");
    }

    #[test]
    fn mcp_server_inputs() {
        let bad = |body: Value| {
            let input: McpServerInput = serde_json::from_value(body).unwrap();
            let DomainError::Validation { param, .. } = input.validate().unwrap_err();
            param
        };
        assert_eq!(
            bad(json!({"name": "", "url": "https://m.example/mcp"})),
            "name"
        );
        assert_eq!(bad(json!({"name": "m", "url": "m.example/mcp"})), "url");
        assert_eq!(
            bad(json!({"name": "m", "url": "https://u:p@m.example/mcp"})),
            "url"
        );
        assert_eq!(
            bad(json!({"name": "m", "url": "https://m.example/mcp", "headers": {"A": "x\ny"}})),
            "headers.A"
        );
        let long = format!("https://m.example/{}", "p".repeat(2_048));
        assert_eq!(bad(json!({"name": "m", "url": long})), "url");
        let server = McpServer {
            id: "s".into(),
            name: "m".into(),
            url: "https://m.example/mcp".into(),
            headers: BTreeMap::from([("Authorization".into(), "Bearer secret".into())]),
            discovered_tool_count: None,
            last_connected_at: None,
            created_at: Timestamp::now(),
            updated_at: Timestamp::now(),
        };
        assert_eq!(server.redacted().headers["Authorization"], REDACTED);
    }
}
