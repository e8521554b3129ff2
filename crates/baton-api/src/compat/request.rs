use baton_domain::chat::{
    ContentPart, ImageSource, InferenceRequest, Message, ResponseFormat, Role, ToolCall,
    ToolChoice, ToolDefinition, VendorTool,
};
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::gateway::RequestTimeouts;

const MAX_MESSAGES: usize = 10_000;
const MAX_TOOLS: usize = 256;

/// OpenAI Chat Completions fields with no canonical form, passed on as sent to OpenAI and Azure
/// OpenAI (their API's own; other providers would not know them).
const OPENAI_OPTIONS: &[&str] = &[
    "service_tier",
    "store",
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "prediction",
    "web_search_options",
    "modalities",
    "audio",
];

/// A chat completion request. Fields Baton does not use (`logprobs`, `logit_bias`, ...) are
/// accepted and ignored, as OpenAI SDKs send them freely; OpenAI's own options
/// ([`OPENAI_OPTIONS`]) go to OpenAI and Azure as they came.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    /// `<provider>/<model-name>` or a routing alias.
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub seed: Option<i64>,
    /// `minimal`, `low`, `medium` or `high`: a thinking budget on every provider that has one
    /// (1,024, 2,048, 8,192 or 24,576 tokens; OpenAI gets the effort back).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub stop: Option<Value>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub stream_options: Option<Map<String, Value>>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<WireTool>>,
    /// `auto`, `none`, `required`, or `{"type": "function", "function": {"name": ...}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    /// End-user id; used for customer attribution when the header and `customerId` are absent.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default, rename = "customerId")]
    pub customer_id: Option<String>,
    #[serde(default)]
    pub x_log_level: Option<String>,
    /// Cache-bust string: part of the response-cache key, never sent to providers.
    #[serde(default)]
    pub x_nonce: Option<String>,
    /// Per model attempt time limits; override the tenant's settings.
    #[serde(default)]
    pub x_timeouts: Option<RequestTimeouts>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub ignored: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default)]
    pub tool_calls: Option<Vec<WireToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WireToolCall {
    pub id: String,
    #[serde(default)]
    pub function: Option<WireFunctionCall>,
}

#[derive(Debug, Deserialize)]
pub struct WireFunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// Absent on provider-native tools (`{"type": "web_search"}`).
    #[serde(default)]
    pub function: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// The validated request: the canonical inference plus what only the gateway uses.
#[derive(Debug)]
pub struct ParsedChat {
    pub model: String,
    pub inference: InferenceRequest,
    pub stream: bool,
    pub stream_options: Map<String, Value>,
    pub customer: Option<String>,
    /// The body field `customer` came from (`customerId`, else OpenAI's `user`), for errors.
    pub customer_param: &'static str,
    pub nonce: Option<String>,
    pub timeouts: RequestTimeouts,
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::validation(param, message)
}

pub fn parse(request: ChatCompletionRequest) -> Result<ParsedChat, ApiError> {
    if request.model.trim().is_empty() {
        return Err(invalid(
            "model",
            "model must name <provider>/<model-name> or a routing alias",
        ));
    }
    if request.messages.is_empty() {
        return Err(invalid(
            "messages",
            "messages must contain at least one message",
        ));
    }
    if request.messages.len() > MAX_MESSAGES {
        return Err(invalid(
            "messages",
            format!("at most {MAX_MESSAGES} messages per request"),
        ));
    }
    if let Some(t) = request.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(invalid(
            "temperature",
            "temperature must be between 0 and 2",
        ));
    }
    if let Some(p) = request.top_p
        && !(0.0..=1.0).contains(&p)
    {
        return Err(invalid("top_p", "top_p must be between 0 and 1"));
    }
    // A zero budget cannot be answered: providers refuse it, after the request was made.
    for (name, limit) in [
        ("max_tokens", request.max_tokens),
        ("max_completion_tokens", request.max_completion_tokens),
    ] {
        if limit == Some(0) {
            return Err(invalid(name, format!("{name} must be at least 1")));
        }
    }
    if request.n.is_some_and(|n| n != 1) {
        return Err(invalid("n", "only n = 1 is supported"));
    }
    for (name, penalty) in [
        ("frequency_penalty", request.frequency_penalty),
        ("presence_penalty", request.presence_penalty),
    ] {
        if penalty.is_some_and(|p| !(-2.0..=2.0).contains(&p)) {
            return Err(invalid(name, format!("{name} must be between -2 and 2")));
        }
    }
    let thinking_budget = request
        .reasoning_effort
        .as_deref()
        .map(thinking_budget_of)
        .transpose()?;
    let messages = request
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(m, i))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = request.tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(invalid(
            "tools",
            format!("at most {MAX_TOOLS} tools per request"),
        ));
    }
    let mut vendor_tools = Vec::new();
    let mut function_tools = Vec::with_capacity(tools.len());
    for (i, wire) in tools.into_iter().enumerate() {
        match tool(wire, i)? {
            AnyTool::Function(definition) => function_tools.push(definition),
            AnyTool::Vendor(vendor) if !vendor_tools.contains(&vendor) => vendor_tools.push(vendor),
            AnyTool::Vendor(_) => {}
        }
    }
    let tools = function_tools;
    let tool_choice = request.tool_choice.map(|v| tool_choice(&v)).transpose()?;
    if let Some(ToolChoice::Tool(name)) = &tool_choice
        && !tools.iter().any(|t| &t.name == name)
    {
        return Err(invalid(
            "tool_choice",
            format!("tool_choice names '{name}', which is not in tools"),
        ));
    }
    let response_format = request
        .response_format
        .map(|v| response_format(&v))
        .transpose()?
        .flatten();
    let stop = match request.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) if items.len() <= 4 && items.iter().all(Value::is_string) => {
            items
                .into_iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        }
        Some(_) => {
            return Err(invalid(
                "stop",
                "stop must be a string or an array of up to 4 strings",
            ));
        }
    };
    let stream_options = request.stream_options.unwrap_or_default();
    let include_usage = match stream_options.get("include_usage") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(include)) => *include,
        Some(_) => {
            return Err(invalid(
                "stream_options.include_usage",
                "include_usage must be a boolean",
            ));
        }
    };
    let mut ignored = request.ignored;
    let openai_options = OPENAI_OPTIONS
        .iter()
        .filter_map(|name| ignored.remove_entry(*name))
        .filter(|(_, value)| !value.is_null())
        .collect();
    Ok(ParsedChat {
        model: request.model.trim().to_string(),
        inference: InferenceRequest {
            model: String::new(),
            messages,
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: None,
            max_tokens: request.max_completion_tokens.or(request.max_tokens),
            parallel_tool_calls: request.parallel_tool_calls,
            frequency_penalty: request.frequency_penalty,
            presence_penalty: request.presence_penalty,
            seed: request.seed,
            stop,
            tools,
            tool_choice,
            response_format,
            thinking_budget,
            vendor_tools,
            stream_usage: include_usage,
            openai_options,
        },
        stream: request.stream.unwrap_or(false),
        stream_options,
        customer_param: if request.customer_id.is_some() {
            "customerId"
        } else {
            "user"
        },
        customer: request
            .customer_id
            .or(request.user)
            .filter(|c| !c.trim().is_empty()),
        nonce: request.x_nonce,
        timeouts: request
            .x_timeouts
            .unwrap_or_default()
            .validated("x_timeouts")?,
    })
}

/// OpenAI's `reasoning_effort` as a thinking budget, which every reasoning provider takes
/// (Anthropic's minimum is 1,024); the OpenAI adapter maps the budget back to an effort.
fn thinking_budget_of(effort: &str) -> Result<u32, ApiError> {
    const EFFORTS: [(&str, u32); 4] = [
        ("minimal", 1_024),
        ("low", 2_048),
        ("medium", 8_192),
        ("high", 24_576),
    ];
    EFFORTS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(effort))
        .map(|(_, budget)| *budget)
        .ok_or_else(|| {
            invalid(
                "reasoning_effort",
                format!("unknown reasoning_effort '{effort}': use minimal, low, medium or high"),
            )
        })
}

pub(crate) fn message(wire: WireMessage, index: usize) -> Result<Message, ApiError> {
    let param = format!("messages[{index}]");
    // Enum values are read in any case (DESIGN.md "Name and wire conventions").
    let is = |name: &str| wire.role.eq_ignore_ascii_case(name);
    let role = if is("system") || is("developer") {
        Role::System
    } else if is("user") {
        Role::User
    } else if is("assistant") {
        Role::Assistant
    } else if is("tool") {
        Role::Tool
    } else {
        return Err(invalid(
            format!("{param}.role"),
            format!(
                "unknown role '{}': use system, user, assistant or tool",
                wire.role
            ),
        ));
    };
    let content = match wire.content {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![ContentPart::Text { text }],
        Some(Value::Array(parts)) => parts
            .into_iter()
            .enumerate()
            .map(|(j, part)| content_part(part, &format!("{param}.content[{j}]")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(invalid(
                format!("{param}.content"),
                "content must be a string or an array of parts",
            ));
        }
    };
    let tool_calls: Vec<ToolCall> = wire
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, call)| {
            let function = call.function.ok_or_else(|| {
                invalid(
                    format!("{param}.tool_calls[{j}].function"),
                    "a tool call needs a function",
                )
            })?;
            Ok(ToolCall {
                id: call.id,
                name: function.name,
                arguments: function.arguments.unwrap_or_default(),
            })
        })
        .collect::<Result<_, ApiError>>()?;
    if role == Role::Tool && wire.tool_call_id.as_deref().is_none_or(str::is_empty) {
        return Err(invalid(
            format!("{param}.tool_call_id"),
            "a tool message needs the tool_call_id it answers",
        ));
    }
    if content.is_empty() && tool_calls.is_empty() && role != Role::Assistant {
        return Err(invalid(
            format!("{param}.content"),
            "content must not be empty",
        ));
    }
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id: wire.tool_call_id,
        name: wire.name,
    })
}

/// An enum value as the matches below spell it: lower case (DESIGN.md: enum values are read in
/// any case), borrowed when it already is.
fn lower(value: Option<&str>) -> Option<std::borrow::Cow<'_, str>> {
    value.map(|v| {
        if v.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(v.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(v)
        }
    })
}

fn content_part(part: Value, param: &str) -> Result<ContentPart, ApiError> {
    match lower(part.get("type").and_then(Value::as_str)).as_deref() {
        Some("text") => part
            .get("text")
            .and_then(Value::as_str)
            .map(|text| ContentPart::Text {
                text: text.to_string(),
            })
            .ok_or_else(|| invalid(format!("{param}.text"), "a text part needs a text string")),
        Some("image_url") => {
            let image = part.get("image_url");
            let url = image
                .and_then(|i| i.get("url").or(Some(i)))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    invalid(
                        format!("{param}.image_url.url"),
                        "an image part needs image_url.url",
                    )
                })?;
            let source = ImageSource::parse(url, &format!("{param}.image_url.url"))?;
            let detail = image
                .and_then(|i| i.get("detail"))
                .and_then(Value::as_str)
                .map(str::to_string);
            Ok(ContentPart::Image { source, detail })
        }
        Some(other) => Err(invalid(
            format!("{param}.type"),
            format!("unsupported content part type '{other}'"),
        )),
        None => Err(invalid(
            format!("{param}.type"),
            "a content part needs a type",
        )),
    }
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

enum AnyTool {
    Function(ToolDefinition),
    /// A provider-run tool (DESIGN.md "Virtual tools"), given as `{"type": "web_search"}`.
    Vendor(VendorTool),
}

fn tool(wire: WireTool, index: usize) -> Result<AnyTool, ApiError> {
    let param = format!("tools[{index}]");
    let function = match (lower(wire.kind.as_deref()).as_deref(), wire.function) {
        (None | Some("function"), Some(function)) => function,
        (None | Some("function"), None) => {
            return Err(invalid(
                format!("{param}.function"),
                "a function tool needs a function object",
            ));
        }
        // OpenAI's Responses API names its search tool `web_search_preview` too.
        (Some("web_search_preview"), _) => return Ok(AnyTool::Vendor(VendorTool::WebSearch)),
        (Some(kind), _) => {
            return VendorTool::parse(kind, &format!("{param}.type"))
                .map(AnyTool::Vendor)
                .map_err(|_| {
                    invalid(
                        format!("{param}.type"),
                        format!(
                            "unknown tool type '{kind}': use function, web_search, code_interpreter or web_search_20250305"
                        ),
                    )
                });
        }
    };
    if !valid_tool_name(&function.name) {
        return Err(invalid(
            format!("{param}.function.name"),
            "a tool name is 1 to 64 letters, digits, '_' or '-'",
        ));
    }
    let parameters = function
        .parameters
        .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
    if !parameters.is_object() {
        return Err(invalid(
            format!("{param}.function.parameters"),
            "parameters must be a JSON Schema object",
        ));
    }
    Ok(AnyTool::Function(ToolDefinition {
        name: function.name,
        description: function.description,
        parameters,
        strict: function.strict,
    }))
}

fn tool_choice(value: &Value) -> Result<ToolChoice, ApiError> {
    match value {
        Value::String(s) if s.eq_ignore_ascii_case("auto") => Ok(ToolChoice::Auto),
        Value::String(s) if s.eq_ignore_ascii_case("none") => Ok(ToolChoice::None),
        Value::String(s) if s.eq_ignore_ascii_case("required") => Ok(ToolChoice::Required),
        Value::String(other) => Err(invalid(
            "tool_choice",
            format!("unknown tool_choice '{other}': use auto, none, required or a function"),
        )),
        Value::Object(_) => value
            .pointer("/function/name")
            .and_then(Value::as_str)
            .map(|name| ToolChoice::Tool(name.to_string()))
            .ok_or_else(|| invalid("tool_choice", "a specific tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}")),
        _ => Err(invalid("tool_choice", "tool_choice must be a string or an object")),
    }
}

fn response_format(value: &Value) -> Result<Option<ResponseFormat>, ApiError> {
    match lower(value.get("type").and_then(Value::as_str)).as_deref() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let spec = value.get("json_schema").ok_or_else(|| {
                invalid(
                    "response_format.json_schema",
                    "json_schema is required with type json_schema",
                )
            })?;
            let name = spec
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| valid_tool_name(n))
                .ok_or_else(|| {
                    invalid(
                        "response_format.json_schema.name",
                        "a name of 1 to 64 letters, digits, '_' or '-' is required",
                    )
                })?;
            let schema = spec
                .get("schema")
                .filter(|s| s.is_object())
                .cloned()
                .ok_or_else(|| {
                    invalid(
                        "response_format.json_schema.schema",
                        "schema must be a JSON Schema object",
                    )
                })?;
            Ok(Some(ResponseFormat::JsonSchema {
                name: name.to_string(),
                schema,
                strict: spec.get("strict").and_then(Value::as_bool),
            }))
        }
        _ => Err(invalid(
            "response_format.type",
            "response_format.type must be text, json_object or json_schema",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse_json(value: Value) -> Result<ParsedChat, ApiError> {
        parse(serde_json::from_value(value).unwrap())
    }

    fn param(value: Value) -> String {
        match parse_json(value).unwrap_err() {
            ApiError::Invalid { param, .. } => param.unwrap_or_default(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_strings_parts_images_tools_and_formats() {
        let parsed = parse_json(json!({
            "model": "openai/gpt-4o-mini",
            "messages": [
                {"role": "developer", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "ok"}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                      {"type": "web_search"}, {"type": "web_search_preview"}, {"type": "code_interpreter"}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
            "stop": "END", "frequency_penalty": 0.5, "x_nonce": "n1", "user": "u-1"
        }))
        .unwrap();
        assert_eq!(parsed.inference.messages.len(), 4);
        assert_eq!(parsed.inference.messages[0].role, Role::System);
        assert!(matches!(
            parsed.inference.messages[1].content[1],
            ContentPart::Image {
                source: ImageSource::Base64 { .. },
                ..
            }
        ));
        assert_eq!(
            parsed.inference.tool_choice,
            Some(ToolChoice::Tool("f".into()))
        );
        assert_eq!(parsed.inference.stop, ["END"]);
        assert_eq!(parsed.inference.tools.len(), 1);
        assert_eq!(
            parsed.inference.vendor_tools,
            [VendorTool::WebSearch, VendorTool::CodeInterpreter]
        );
        assert_eq!(parsed.customer.as_deref(), Some("u-1"));
        assert_eq!(parsed.nonce.as_deref(), Some("n1"));
        assert!(parsed.inference.stream_usage);
    }

    #[test]
    fn reasoning_effort_parallel_calls_and_penalties_are_read() {
        let parsed = parse_json(json!({
            "model": "openai/gpt-5", "messages": [{"role": "user", "content": "hi"}],
            "reasoning_effort": "High", "parallel_tool_calls": false,
            "frequency_penalty": 0.5, "presence_penalty": -2
        }))
        .unwrap();
        assert_eq!(parsed.inference.thinking_budget, Some(24_576));
        assert_eq!(parsed.inference.parallel_tool_calls, Some(false));
        assert_eq!(parsed.inference.frequency_penalty, Some(0.5));
        assert_eq!(parsed.inference.presence_penalty, Some(-2.0));
        let base = |extra: Value| {
            let mut body =
                json!({"model": "openai/x", "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            body
        };
        assert_eq!(
            param(base(json!({"reasoning_effort": "extreme"}))),
            "reasoning_effort"
        );
        assert_eq!(
            param(base(json!({"presence_penalty": 2.5}))),
            "presence_penalty"
        );
    }

    #[test]
    fn roles_and_tool_choices_are_read_in_any_case() {
        let parsed = parse_json(json!({
            "model": "openai/gpt-4o-mini",
            "messages": [{"role": "SYSTEM", "content": "s"}, {"role": "User", "content": "hi"}],
            "tool_choice": "AUTO"
        }))
        .unwrap();
        let roles: Vec<Role> = parsed.inference.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User]);
        assert_eq!(parsed.inference.tool_choice, Some(ToolChoice::Auto));
        // Tool types, content part types and the response format's type too.
        let parsed = parse_json(json!({
            "model": "openai/gpt-4o-mini",
            "messages": [{"role": "user", "content": [{"type": "TEXT", "text": "hi"},
                {"type": "Image_URL", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
            "tools": [{"type": "FUNCTION", "function": {"name": "f"}}],
            "response_format": {"type": "JSON_OBJECT"}
        }))
        .unwrap();
        assert_eq!(parsed.inference.messages[0].content.len(), 2);
        assert_eq!(parsed.inference.tools[0].name, "f");
        assert_eq!(
            parsed.inference.response_format,
            Some(ResponseFormat::JsonObject)
        );
    }

    #[test]
    fn invalid_fields_are_named() {
        let base = |extra: Value| {
            let mut body =
                json!({"model": "openai/x", "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            body
        };
        assert_eq!(param(base(json!({"temperature": 2.5}))), "temperature");
        assert_eq!(param(base(json!({"max_tokens": 0}))), "max_tokens");
        assert_eq!(
            param(base(json!({"max_completion_tokens": 0}))),
            "max_completion_tokens"
        );
        assert_eq!(param(base(json!({"messages": []}))), "messages");
        assert_eq!(
            param(base(
                json!({"messages": [{"role": "robot", "content": "x"}]})
            )),
            "messages[0].role"
        );
        assert_eq!(
            param(base(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]})
            )),
            "messages[0].content[0].image_url.url"
        );
        assert_eq!(
            param(base(
                json!({"messages": [{"role": "tool", "content": "x"}]})
            )),
            "messages[0].tool_call_id"
        );
        assert_eq!(
            param(base(json!({"tool_choice": "sometimes"}))),
            "tool_choice"
        );
        assert_eq!(
            param(base(
                json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})
            )),
            "tools[0].function.name"
        );
        assert_eq!(
            param(base(json!({"tools": [{"type": "browser"}]}))),
            "tools[0].type"
        );
        assert_eq!(
            param(base(json!({"tools": [{"type": "function"}]}))),
            "tools[0].function"
        );
        assert_eq!(
            param(base(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r"}}})
            )),
            "response_format.json_schema.schema"
        );
        assert_eq!(param(base(json!({"n": 2}))), "n");
    }
}
