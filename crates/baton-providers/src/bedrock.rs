//! AWS Bedrock Converse API (`POST {base}/model/{modelId}/converse` and `.../converse-stream`),
//! signed with SigV4 (`aws-sigv4`, service `bedrock`). Streams arrive in the AWS event-stream
//! binary framing, read frame by frame with `aws-smithy-eventstream`. Structured output is a
//! forced tool call, as on Anthropic; images must be inline bytes.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody, SignableRequest,
    SignatureLocation, SigningSettings, UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_types::event_stream::Message as EventMessage;
use baton_domain::chat::{
    ContentPart, FinishReason, ImageSource, InferenceRequest, InferenceResponse, Message,
    ResponseFormat, Role, StreamDelta, ToolCall, ToolChoice, Usage,
};
use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::anthropic::{catalogue_max_tokens, claude_thinking_budget};
use crate::catalogue::Catalogue;
use crate::error::{ProviderError, ProviderResult};
use crate::http;
use crate::provider::{DeltaStream, Provider, ToolBlock, system_only_as_user};

/// The SigV4 signing name of the Bedrock runtime.
pub const SERVICE: &str = "bedrock";
/// Used for `maxTokens` when extended thinking needs one and the request gives none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// An event-stream frame declaring more than this is an error rather than unbounded buffering.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;
/// The forced tool that carries structured output.
const STRUCTURED_TOOL: &str = "structured_output";
const JSON: &str = "application/json";
/// Everything but RFC 3986's unreserved characters is escaped in the model-id path segment
/// (`:` of `...-v1:0`, `/` of ARNs).
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Static AWS credentials (an access key, or temporary ones with their session token).
#[derive(Debug, Clone)]
pub struct AwsCredentials {
    pub access_key_id: SecretString,
    pub secret_access_key: SecretString,
    pub session_token: Option<SecretString>,
}

pub struct BedrockProvider {
    key: String,
    base_url: String,
    region: String,
    /// Kept in the SDK's type, whose `Debug` redacts the secret and which zeroes it on drop.
    credentials: Credentials,
    client: http::ProviderClient,
    timeout: Option<Duration>,
    /// Where a Claude model's max output tokens come from when thinking needs `maxTokens` and
    /// the request sets none.
    catalogue: Option<Arc<Catalogue>>,
}

impl BedrockProvider {
    pub fn new(
        key: impl Into<String>,
        base_url: impl Into<String>,
        region: String,
        credentials: AwsCredentials,
        client: impl Into<http::ProviderClient>,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            key: key.into(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            region,
            credentials: Credentials::new(
                credentials.access_key_id.expose_secret(),
                credentials.secret_access_key.expose_secret(),
                credentials
                    .session_token
                    .map(|t| t.expose_secret().to_string()),
                None,
                "baton",
            ),
            client: client.into(),
            timeout,
            catalogue: None,
        }
    }

    /// Thinking without `max_tokens` asks for the model's max output tokens from `catalogue`
    /// instead of a fixed default.
    pub fn with_catalogue(mut self, catalogue: Arc<Catalogue>) -> Self {
        self.catalogue = Some(catalogue);
        self
    }

    fn wire(&self, request: &InferenceRequest) -> ProviderResult<ConverseRequest> {
        let default_max_tokens =
            catalogue_max_tokens(self.catalogue.as_deref(), &self.key, &request.model)
                .unwrap_or(DEFAULT_MAX_TOKENS);
        to_wire(&self.key, request, default_max_tokens)
    }

    fn request(
        &self,
        model: &str,
        body: &ConverseRequest,
        stream: bool,
    ) -> ProviderResult<reqwest::RequestBuilder> {
        let url = endpoint(&self.base_url, model, stream);
        let url = url::Url::parse(&url).map_err(|e| ProviderError::Connection {
            provider: self.key.clone(),
            message: format!("invalid base URL: {e}"),
        })?;
        let body = serde_json::to_vec(body).map_err(|e| ProviderError::InvalidResponse {
            provider: self.key.clone(),
            message: format!("could not encode the request: {e}"),
        })?;
        let headers = sign(
            &url,
            &body,
            &self.region,
            &self.credentials,
            SystemTime::now(),
        )
        .map_err(|message| ProviderError::Connection {
            provider: self.key.clone(),
            message: format!("could not sign the request: {message}"),
        })?;
        let mut builder = self
            .client
            .get()
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, JSON);
        for header in headers {
            let mut value =
                reqwest::header::HeaderValue::from_str(&header.value).map_err(|_| {
                    ProviderError::Connection {
                        provider: self.key.clone(),
                        message: format!("the signed header {} is not a header value", header.name),
                    }
                })?;
            value.set_sensitive(header.sensitive || header.name == "authorization");
            builder = builder.header(header.name, value);
        }
        Ok(builder.body(body))
    }
}

#[async_trait]
impl Provider for BedrockProvider {
    fn key(&self) -> &str {
        &self.key
    }

    fn takes_image_urls(&self) -> bool {
        false
    }

    async fn infer(&self, request: &InferenceRequest) -> ProviderResult<InferenceResponse> {
        let body = self.wire(request)?;
        let builder = self.request(&request.model, &body, false)?;
        let wire: ConverseResponse = http::send_json(
            &self.client,
            &self.key,
            &request.model,
            builder,
            self.timeout,
        )
        .await?;
        Ok(from_wire(wire, &request.model, structured(request)))
    }

    async fn infer_stream(&self, request: &InferenceRequest) -> ProviderResult<DeltaStream> {
        let body = self.wire(request)?;
        let builder = self.request(&request.model, &body, true)?;
        let structured = structured(request);
        http::stream(
            &self.client,
            &self.key,
            &request.model,
            builder,
            self.timeout,
            |response| {
                let provider = self.key.clone();
                let bytes = response
                    .bytes_stream()
                    .map(move |chunk| chunk.map_err(|e| http::body_error(&provider, &e)));
                deltas(&self.key, bytes, structured, MAX_FRAME_BYTES)
            },
        )
        .await
    }
}

pub(crate) fn structured(request: &InferenceRequest) -> bool {
    matches!(
        request.response_format,
        Some(ResponseFormat::JsonSchema { .. } | ResponseFormat::JsonObject)
    )
}

/// The Bedrock runtime endpoint of a region, the base URL unless the operator sets one.
pub fn default_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// `{base}/model/{modelId}/converse[-stream]`, the model id escaped as one path segment.
pub(crate) fn endpoint(base_url: &str, model: &str, stream: bool) -> String {
    format!(
        "{base_url}/model/{}/{}",
        utf8_percent_encode(model, PATH_SEGMENT),
        if stream {
            "converse-stream"
        } else {
            "converse"
        }
    )
}

fn is_anthropic(model: &str) -> bool {
    model.contains("anthropic.") || model.contains("claude")
}

fn is_nova(model: &str) -> bool {
    model.contains("amazon.nova")
}

// ---- Signing -------------------------------------------------------------------------------

/// A header the signature adds to the request.
#[derive(Debug)]
pub(crate) struct SignedHeader {
    name: &'static str,
    value: String,
    sensitive: bool,
}

/// Signs `POST url` with `body` (SigV4, headers `host`, `content-type`, `x-amz-date` and, with
/// temporary credentials, `x-amz-security-token`; the body's SHA-256 is in the canonical
/// request). Returns the headers to add: `x-amz-date`, `authorization`, maybe the token.
///
/// The URL is sent exactly as given, with the model id's `:` as `%3A`. Like every AWS service but
/// S3, Bedrock URI-encodes each path segment of the received (already encoded) path once more
/// for its canonical request, so the signer double-encodes (`%3A` is signed as `%253A`) and
/// normalises the path: the SDK's defaults for `bedrock-runtime`.
pub(crate) fn sign(
    url: &url::Url,
    body: &[u8],
    region: &str,
    credentials: &Credentials,
    time: SystemTime,
) -> Result<Vec<SignedHeader>, String> {
    // The Host header hyper sends: the port only when it is not the scheme's default.
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => return Err("the base URL has no host".into()),
    };
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Double;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Enabled;
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    settings.signature_location = SignatureLocation::Headers;
    settings.session_token_mode = SessionTokenMode::Include;
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let signable = SignableRequest::new(
        "POST",
        url.as_str(),
        [("host", host.as_str()), ("content-type", JSON)].into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    let (instructions, _signature) = aws_sigv4::http_request::sign(signable, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    let (headers, _query) = instructions.into_parts();
    Ok(headers
        .into_iter()
        .map(|h| SignedHeader {
            name: h.name(),
            value: h.value().to_string(),
            sensitive: h.sensitive(),
        })
        .collect())
}

// ---- Request -------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConverseRequest {
    messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inference_config: Option<InferenceConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    additional_model_request_fields: Option<Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop_sequences: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig {
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
}

#[derive(Debug, Serialize)]
struct WireMessage {
    role: &'static str,
    content: Vec<Value>,
}

fn unsupported(provider: &str, what: impl Into<String>) -> ProviderError {
    ProviderError::Unsupported {
        provider: provider.to_string(),
        what: what.into(),
        field: None,
    }
}

/// Converse takes images only as inline bytes of four formats.
fn image_block(provider: &str, source: &ImageSource) -> ProviderResult<Value> {
    match source {
        ImageSource::Base64 { media_type, data } => {
            let format = match media_type.as_str() {
                "image/png" => "png",
                "image/jpeg" | "image/jpg" => "jpeg",
                "image/gif" => "gif",
                "image/webp" => "webp",
                other => {
                    return Err(unsupported(
                        provider,
                        format!("images of type '{other}' (Converse takes png, jpeg, gif, webp)"),
                    ));
                }
            };
            Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
        }
        ImageSource::Url { .. } => Err(unsupported(
            provider,
            // The engine inlines URLs before a request reaches Converse (`takes_image_urls`).
            "image URLs (Converse takes only inline images)",
        )),
    }
}

/// Text and image blocks of a message. Converse refuses blank text blocks, so they are left out.
fn content_blocks(provider: &str, message: &Message) -> ProviderResult<Vec<Value>> {
    let mut blocks = Vec::new();
    for part in &message.content {
        match part {
            ContentPart::Text { text } if text.trim().is_empty() => {}
            ContentPart::Text { text } => blocks.push(json!({"text": text})),
            ContentPart::Image { source, .. } => blocks.push(image_block(provider, source)?),
        }
    }
    Ok(blocks)
}

/// A tool's answer: a JSON object goes as a `json` block, anything else as text.
fn tool_result_block(provider: &str, message: &Message) -> ProviderResult<Value> {
    let text = message.joined_text();
    let mut content = Vec::new();
    match serde_json::from_str::<Value>(&text) {
        Ok(value @ Value::Object(_)) => content.push(json!({"json": value})),
        _ if text.trim().is_empty() => {}
        _ => content.push(json!({"text": text})),
    }
    for part in &message.content {
        if let ContentPart::Image { source, .. } = part {
            content.push(image_block(provider, source)?);
        }
    }
    Ok(json!({"toolResult": {
        "toolUseId": message.tool_call_id.clone().unwrap_or_default(),
        "content": content,
    }}))
}

fn tool_spec(name: &str, description: Option<&str>, schema: &Value) -> Value {
    let mut spec = json!({"name": name, "inputSchema": {"json": schema}});
    if let Some(description) = description.filter(|d| !d.is_empty()) {
        spec["description"] = Value::from(description);
    }
    json!({"toolSpec": spec})
}

/// The Converse request; `default_max_tokens` is `maxTokens` when thinking needs one and the
/// request sets none.
pub(crate) fn to_wire(
    provider: &str,
    request: &InferenceRequest,
    default_max_tokens: u32,
) -> ProviderResult<ConverseRequest> {
    let as_user = system_only_as_user(request);
    let request = as_user.as_ref().unwrap_or(request);
    if let Some(tool) = request.vendor_tools.first() {
        return Err(ProviderError::Unsupported {
            provider: provider.to_string(),
            what: format!("the vendor tool '{}' (Converse has none)", tool.as_str()),
            field: Some("vendor_tools"),
        });
    }
    let mut system = Vec::new();
    let mut messages: Vec<WireMessage> = Vec::new();
    // Whether the history has toolUse/toolResult blocks, and the tools it called (see below).
    let mut tool_history = false;
    let mut called: Vec<&str> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message.role {
            Role::System => {
                let text = message.joined_text();
                if !text.trim().is_empty() {
                    system.push(json!({"text": text}));
                }
                continue;
            }
            Role::Tool => {
                tool_history = true;
                ("user", vec![tool_result_block(provider, message)?])
            }
            Role::User | Role::Assistant => {
                let mut blocks = content_blocks(provider, message)?;
                for call in &message.tool_calls {
                    let input: Value =
                        serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                    blocks.push(json!({"toolUse": {"toolUseId": call.id, "name": call.name, "input": input}}));
                    tool_history = true;
                    called.push(&call.name);
                }
                let role = if message.role == Role::User {
                    "user"
                } else {
                    "assistant"
                };
                (role, blocks)
            }
        };
        if blocks.is_empty() {
            continue;
        }
        // Converse wants alternating roles: consecutive turns of one role become one.
        match messages.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => messages.push(WireMessage {
                role,
                content: blocks,
            }),
        }
    }

    // Converse has no "none" choice: withholding the tools says it.
    let tools_allowed = request.tool_choice != Some(ToolChoice::None);
    let mut tools: Vec<Value> = request
        .tools
        .iter()
        .map(|t| tool_spec(&t.name, t.description.as_deref(), &t.parameters))
        .collect();
    // Claude's thinking follows the Messages API's rules (`claude_thinking_budget`): under the
    // caller's max_tokens, and off for a turn that continues a tool call.
    let thinking_budget = if is_anthropic(&request.model) {
        claude_thinking_budget(request)
    } else {
        None
    };
    // Claude's extended thinking allows only auto (Converse has no "none"): forcing a tool is
    // refused with a ValidationException.
    let thinking = thinking_budget.is_some();
    let mut tool_choice = request
        .tool_choice
        .as_ref()
        .and_then(|choice| match choice {
            ToolChoice::Auto => Some(json!({"auto": {}})),
            ToolChoice::None => None,
            ToolChoice::Required | ToolChoice::Tool(_) if thinking => Some(json!({"auto": {}})),
            ToolChoice::Required => Some(json!({"any": {}})),
            ToolChoice::Tool(name) => Some(json!({"tool": {"name": name}})),
        });
    if !tools_allowed {
        tools.clear();
    }
    let structured_tool = match &request.response_format {
        Some(ResponseFormat::JsonSchema { schema, .. }) => Some(tool_spec(
            STRUCTURED_TOOL,
            Some("Return the answer as this JSON object."),
            schema,
        )),
        Some(ResponseFormat::JsonObject) => Some(tool_spec(
            STRUCTURED_TOOL,
            Some("Return the answer as a JSON object."),
            &json!({"type": "object"}),
        )),
        _ => None,
    };
    if let Some(structured_tool) = structured_tool {
        // The answer comes as the structured tool's input. With the caller's tools offered too,
        // "any" lets the model call a real tool in a tool loop or answer through the structured
        // tool; forcing the structured tool would end every loop at once. A specific choice
        // stays; with "none" the caller's tools were withheld above.
        tool_choice = Some(match &request.tool_choice {
            _ if thinking => json!({"auto": {}}),
            Some(ToolChoice::Tool(name)) => json!({"tool": {"name": name}}),
            _ if tools.is_empty() => json!({"tool": {"name": STRUCTURED_TOOL}}),
            _ => json!({"any": {}}),
        });
        tools.push(structured_tool);
    }
    // Converse refuses toolUse/toolResult blocks in a request without toolConfig. When the tools
    // were withheld (tool choice "none") or never sent, they are declared again without a choice:
    // the request's own, or else stand-ins named after the calls in the history.
    if tools.is_empty() && tool_history {
        tool_choice = None;
        tools = if request.tools.is_empty() {
            called.sort_unstable();
            called.dedup();
            if called.is_empty() {
                called.push("tool");
            }
            called
                .into_iter()
                .map(|name| {
                    tool_spec(
                        name,
                        Some("A tool used earlier in this conversation."),
                        &json!({"type": "object"}),
                    )
                })
                .collect()
        } else {
            request
                .tools
                .iter()
                .map(|t| tool_spec(&t.name, t.description.as_deref(), &t.parameters))
                .collect()
        };
    }
    let tool_config = (!tools.is_empty()).then_some(ToolConfig { tools, tool_choice });

    let mut additional = serde_json::Map::new();
    // Claude's thinking isn't compatible with temperature or top_k modifications and takes
    // top_p only from 0.95 up (a ValidationException otherwise).
    if let Some(top_k) = request.top_k.filter(|_| !thinking) {
        if is_nova(&request.model) {
            additional.insert("inferenceConfig".into(), json!({"topK": top_k}));
        } else {
            additional.insert("top_k".into(), Value::from(top_k));
        }
    }
    let mut max_tokens = request.max_tokens;
    if let Some(budget) = thinking_budget {
        additional.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
        // The thinking budget counts against maxTokens, which must exceed it: the caller's
        // already does (the budget was fitted under it); the default is raised above it.
        max_tokens = Some(max_tokens.unwrap_or_else(|| default_max_tokens.max(budget + 1)));
    }
    let inference_config = InferenceConfig {
        max_tokens,
        temperature: request.temperature.filter(|_| !thinking),
        top_p: request
            .top_p
            .map(|p| if thinking { p.max(0.95) } else { p }),
        stop_sequences: request.stop.clone(),
    };
    let has_inference_config = inference_config.max_tokens.is_some()
        || inference_config.temperature.is_some()
        || inference_config.top_p.is_some()
        || !inference_config.stop_sequences.is_empty();
    Ok(ConverseRequest {
        messages,
        system,
        inference_config: has_inference_config.then_some(inference_config),
        tool_config,
        additional_model_request_fields: (!additional.is_empty())
            .then_some(Value::Object(additional)),
    })
}

// ---- Response ------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConverseResponse {
    #[serde(default)]
    output: Option<Output>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Debug, Deserialize)]
struct Output {
    #[serde(default)]
    message: Option<OutputMessage>,
}

#[derive(Debug, Deserialize)]
struct OutputMessage {
    #[serde(default)]
    content: Vec<Block>,
}

/// A content block: a union, so one member is set; others (reasoning, citations) are skipped.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Block {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<WireToolUse>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireToolUse {
    tool_use_id: String,
    name: String,
    #[serde(default)]
    input: Value,
}

impl WireToolUse {
    /// The input as arguments JSON; an absent input is no arguments, `{}`, as in a stream.
    fn arguments(&self) -> String {
        if self.input.is_null() {
            "{}".into()
        } else {
            self.input.to_string()
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_write_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Bedrock's `inputTokens` excludes cache reads and writes; ours includes them.
    fn canonical(&self) -> Usage {
        let cached = self.cache_read_input_tokens.unwrap_or(0);
        Usage {
            tokens_in: self.input_tokens + cached + self.cache_write_input_tokens.unwrap_or(0),
            tokens_out: self.output_tokens,
            reasoning_tokens: 0,
            cached_tokens: cached,
            web_search_calls: 0,
        }
    }
}

/// The canonical finish reason. `tool_use` ends a turn that called real tools, or one whose
/// only call is the structured-output tool (then it is the final answer).
fn finish_reason(raw: &str, real_tool_calls: bool) -> FinishReason {
    match raw {
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" if real_tool_calls => FinishReason::ToolCalls,
        "tool_use" => FinishReason::Stop,
        "guardrail_intervened" | "content_filtered" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

pub(crate) fn from_wire(
    wire: ConverseResponse,
    requested_model: &str,
    structured: bool,
) -> InferenceResponse {
    let mut response = InferenceResponse {
        model: requested_model.to_string(),
        usage: wire.usage.canonical(),
        ..Default::default()
    };
    let blocks = wire
        .output
        .and_then(|o| o.message)
        .map(|m| m.content)
        .unwrap_or_default();
    // The structured-output tool's input is the answer's text; text the model wrote around it
    // (possible when thinking leaves the choice to the model) is not part of the JSON.
    let mut structured_answer = None;
    for block in blocks {
        if let Some(text) = block.text {
            response.text.push_str(&text);
        }
        match block.tool_use {
            Some(call) if structured && call.name == STRUCTURED_TOOL => {
                structured_answer = Some(call.arguments());
            }
            Some(call) => response.tool_calls.push(ToolCall {
                arguments: call.arguments(),
                id: call.tool_use_id,
                name: call.name,
            }),
            None => {}
        }
    }
    if let Some(answer) = structured_answer {
        response.text = answer;
    }
    response.finish_reason = wire
        .stop_reason
        .as_deref()
        .map(|r| finish_reason(r, !response.tool_calls.is_empty()))
        .unwrap_or_default();
    response
}

// ---- Stream --------------------------------------------------------------------------------

/// Cuts a byte stream into event-stream frames, whatever the chunking: the 4-byte total length
/// that starts each frame says when one is complete; `aws-smithy-eventstream` then checks both
/// CRCs and reads headers and payload.
#[derive(Debug)]
pub(crate) struct FrameBuffer {
    buffer: BytesMut,
    max_frame_bytes: usize,
}

impl FrameBuffer {
    pub(crate) fn new(max_frame_bytes: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_frame_bytes,
        }
    }

    /// Adds a chunk and returns the frames it completes, in order; a broken frame is an error
    /// after the complete frames before it (so what they carried does not depend on whether the
    /// broken one arrived in the same chunk), and nothing after it is read.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<Result<EventMessage, String>> {
        self.buffer.extend_from_slice(chunk);
        let mut frames = Vec::new();
        while let Some(prefix) = self.buffer.get(..4) {
            let mut prefix = prefix;
            let total = prefix.get_u32() as usize;
            if total > self.max_frame_bytes {
                frames.push(Err(format!(
                    "an event-stream frame of {total} bytes exceeds {} bytes",
                    self.max_frame_bytes
                )));
                break;
            }
            // Prelude (12 bytes) and message CRC (4) at least.
            if total < 16 {
                frames.push(Err(format!("an event-stream frame claims {total} bytes")));
                break;
            }
            if self.buffer.len() < total {
                break;
            }
            let frame = self.buffer.split_to(total).freeze();
            match aws_smithy_eventstream::frame::read_message_from(frame) {
                Ok(message) => frames.push(Ok(message)),
                Err(e) => {
                    frames.push(Err(format!("broken event-stream frame: {e}")));
                    break;
                }
            }
        }
        frames
    }

    /// Bytes of a frame not yet complete.
    pub(crate) fn pending(&self) -> usize {
        self.buffer.len()
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStart {
    #[serde(default)]
    content_block_index: u32,
    #[serde(default)]
    start: StartBody,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartBody {
    #[serde(default)]
    tool_use: Option<StartToolUse>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartToolUse {
    tool_use_id: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockDelta {
    #[serde(default)]
    content_block_index: u32,
    #[serde(default)]
    delta: DeltaBody,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeltaBody {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_use: Option<DeltaToolUse>,
}

#[derive(Debug, Deserialize)]
struct DeltaToolUse {
    #[serde(default)]
    input: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStop {
    #[serde(default)]
    content_block_index: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageStop {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct WireException {
    #[serde(default, alias = "Message")]
    message: Option<String>,
}

fn header<'a>(message: &'a EventMessage, name: &str) -> Option<&'a str> {
    message
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str())
}

/// The HTTP status each ConverseStream exception stands for.
fn exception_status(kind: &str) -> u16 {
    match kind {
        "throttlingException" => 429,
        "modelStreamErrorException" => 502,
        "serviceUnavailableException" => 503,
        "validationException" => 400,
        "modelTimeoutException" => 408,
        _ => 500,
    }
}

/// Per-stream state: which content blocks are tool calls, and their ordinals.
#[derive(Debug)]
pub(crate) struct StreamState {
    provider: String,
    structured: bool,
    /// Content-block index to its tool call.
    tool_blocks: HashMap<u32, ToolBlock>,
    next_tool: u32,
    /// Structured output: text held back until it is known whether the answer comes through
    /// the structured tool (then the text is not part of it) or as text (sent at the finish).
    held_text: String,
    /// Structured output: the structured tool's input has begun; later text is dropped.
    structured_answer: bool,
}

impl StreamState {
    pub(crate) fn new(provider: &str, structured: bool) -> Self {
        Self {
            provider: provider.to_string(),
            structured,
            tool_blocks: HashMap::new(),
            next_tool: 0,
            held_text: String::new(),
            structured_answer: false,
        }
    }

    fn invalid(&self, message: String) -> ProviderError {
        ProviderError::InvalidResponse {
            provider: self.provider.clone(),
            message,
        }
    }

    fn payload<T: DeserializeOwned>(
        &self,
        message: &EventMessage,
        event: &str,
    ) -> ProviderResult<T> {
        serde_json::from_slice(message.payload())
            .map_err(|e| self.invalid(format!("unreadable {event} event: {e}")))
    }

    pub(crate) fn map(&mut self, message: &EventMessage) -> ProviderResult<Vec<StreamDelta>> {
        match header(message, ":message-type").unwrap_or("event") {
            "event" => {}
            "exception" => {
                let kind = header(message, ":exception-type").unwrap_or("exception");
                let detail = serde_json::from_slice::<WireException>(message.payload())
                    .ok()
                    .and_then(|e| e.message)
                    .unwrap_or_else(|| kind.to_string());
                return Err(ProviderError::Status {
                    provider: self.provider.clone(),
                    status: exception_status(kind),
                    message: format!("{kind}: {detail}"),
                    retry_after: None,
                });
            }
            "error" => {
                let code = header(message, ":error-code").unwrap_or("error");
                let detail = header(message, ":error-message").unwrap_or("");
                return Err(ProviderError::Status {
                    provider: self.provider.clone(),
                    status: 500,
                    message: format!("{code}: {detail}"),
                    retry_after: None,
                });
            }
            _ => return Ok(Vec::new()),
        }
        let event = header(message, ":event-type").unwrap_or("");
        Ok(match event {
            "contentBlockStart" => {
                let start: BlockStart = self.payload(message, event)?;
                let Some(tool) = start.start.tool_use else {
                    return Ok(Vec::new());
                };
                if self.structured && tool.name == STRUCTURED_TOOL {
                    self.tool_blocks
                        .insert(start.content_block_index, ToolBlock::new(None));
                    self.structured_answer = true;
                    self.held_text.clear();
                    return Ok(Vec::new());
                }
                let ordinal = self.next_tool;
                self.next_tool += 1;
                self.tool_blocks
                    .insert(start.content_block_index, ToolBlock::new(Some(ordinal)));
                vec![StreamDelta::ToolCallStart {
                    index: ordinal,
                    id: tool.tool_use_id,
                    name: tool.name,
                }]
            }
            "contentBlockDelta" => {
                let delta: BlockDelta = self.payload(message, event)?;
                let mut out = Vec::new();
                if let Some(text) = delta.delta.text.filter(|t| !t.is_empty()) {
                    if !self.structured {
                        out.push(StreamDelta::Text(text));
                    } else if !self.structured_answer {
                        self.held_text.push_str(&text);
                    }
                }
                if let Some(tool) = delta.delta.tool_use.filter(|t| !t.input.is_empty())
                    && let Some(block) = self.tool_blocks.get_mut(&delta.content_block_index)
                {
                    out.push(block.input(tool.input));
                }
                out
            }
            // A call without arguments streams its input as "" (or not at all).
            "contentBlockStop" => {
                let stop: BlockStop = self.payload(message, event)?;
                let block = self.tool_blocks.get_mut(&stop.content_block_index);
                block.and_then(ToolBlock::close).into_iter().collect()
            }
            "messageStop" => {
                let stop: MessageStop = self.payload(message, event)?;
                let mut out = Vec::new();
                if let Some(reason) = stop.stop_reason {
                    if !self.held_text.is_empty() {
                        out.push(StreamDelta::Text(std::mem::take(&mut self.held_text)));
                    }
                    out.push(StreamDelta::Finish(finish_reason(
                        &reason,
                        self.next_tool > 0,
                    )));
                }
                out
            }
            "metadata" => {
                let metadata: Metadata = self.payload(message, event)?;
                metadata
                    .usage
                    .map(|u| vec![StreamDelta::Usage(u.canonical())])
                    .unwrap_or_default()
            }
            // messageStart, and events added later.
            _ => Vec::new(),
        })
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = ProviderResult<Bytes>> + Send>>;

struct Decoding {
    bytes: ByteStream,
    frames: FrameBuffer,
    state: StreamState,
    ready: VecDeque<ProviderResult<StreamDelta>>,
    /// A delta went out: the stream is committed to its model.
    yielded: bool,
    done: bool,
}

impl Decoding {
    /// Queues the deltas of `chunk`; after an error nothing more is read.
    fn feed(&mut self, chunk: &[u8]) {
        for frame in self.frames.push(chunk) {
            let frame = match frame {
                Ok(frame) => frame,
                Err(message) => {
                    let err = self.state.invalid(message);
                    self.fail(err);
                    return;
                }
            };
            match self.state.map(&frame) {
                Ok(deltas) => self.ready.extend(deltas.into_iter().map(Ok)),
                Err(err) => {
                    self.fail(err);
                    return;
                }
            }
        }
    }

    fn fail(&mut self, err: ProviderError) {
        self.ready.push_back(Err(err));
        self.done = true;
    }
}

/// Canonical deltas of a ConverseStream body. An exception frame, a broken frame, or a body
/// that ends inside a frame ends the stream with an error.
pub(crate) fn deltas<S>(
    provider: &str,
    bytes: S,
    structured: bool,
    max_frame_bytes: usize,
) -> DeltaStream
where
    S: Stream<Item = ProviderResult<Bytes>> + Send + 'static,
{
    let decoding = Decoding {
        bytes: Box::pin(bytes),
        frames: FrameBuffer::new(max_frame_bytes),
        state: StreamState::new(provider, structured),
        ready: VecDeque::new(),
        yielded: false,
        done: false,
    };
    Box::pin(futures::stream::unfold(decoding, |mut d| async move {
        loop {
            if let Some(item) = d.ready.pop_front() {
                d.yielded |= item.is_ok();
                return Some((item, d));
            }
            if d.done {
                return None;
            }
            match d.bytes.next().await {
                Some(Ok(chunk)) => d.feed(&chunk),
                Some(Err(err)) => d.fail(err),
                None if d.frames.pending() > 0 => {
                    let message = format!(
                        "the event stream ended inside a frame ({} bytes left)",
                        d.frames.pending()
                    );
                    // A body cut before the answer began is a broken connection, retryable
                    // like the transport errors above; later it is a broken answer.
                    let err = if d.yielded {
                        d.state.invalid(message)
                    } else {
                        ProviderError::Connection {
                            provider: d.state.provider.clone(),
                            message,
                        }
                    };
                    d.fail(err);
                }
                None => d.done = true,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue};
    use baton_domain::chat::{ResponseAccumulator, ToolDefinition, VendorTool};
    use sha2::{Digest, Sha256};

    use super::*;

    fn credentials(token: Option<&str>) -> Credentials {
        Credentials::new(
            "AKID",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            token.map(str::to_string),
            None,
            "test",
        )
    }

    fn tool_call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn request() -> InferenceRequest {
        InferenceRequest {
            model: "us.anthropic.claude-sonnet-4-5-20250929-v1:0".into(),
            messages: vec![
                Message::text(Role::System, "be brief"),
                Message::text(Role::System, "   "),
                Message {
                    role: Role::User,
                    content: vec![
                        ContentPart::Text {
                            text: "what is this?".into(),
                        },
                        ContentPart::Text { text: " ".into() },
                        ContentPart::Image {
                            source: ImageSource::Base64 {
                                media_type: "image/jpeg".into(),
                                data: "AAAA".into(),
                            },
                            detail: None,
                        },
                    ],
                    tool_calls: vec![],
                    tool_call_id: None,
                    name: None,
                },
                Message::text(Role::User, "and?"),
                Message {
                    role: Role::Assistant,
                    content: vec![ContentPart::Text {
                        text: "looking".into(),
                    }],
                    tool_calls: vec![
                        tool_call("t1", "lookup", "{\"q\":1}"),
                        tool_call("t2", "lookup", "not json"),
                    ],
                    tool_call_id: None,
                    name: None,
                },
                Message {
                    tool_call_id: Some("t1".into()),
                    ..Message::text(Role::Tool, "{\"found\":true}")
                },
                Message {
                    tool_call_id: Some("t2".into()),
                    ..Message::text(Role::Tool, "plain")
                },
                Message::text(Role::User, "thanks"),
            ],
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            max_tokens: Some(100),
            seed: Some(7),
            stop: vec!["END".into()],
            tools: vec![ToolDefinition {
                name: "lookup".into(),
                description: Some("find".into()),
                parameters: json!({"type": "object", "properties": {"q": {"type": "integer"}}}),
                strict: None,
            }],
            tool_choice: Some(ToolChoice::Required),
            thinking_budget: Some(2000),
            ..Default::default()
        }
    }

    fn wire(request: &InferenceRequest) -> Value {
        serde_json::to_value(to_wire("bedrock", request, DEFAULT_MAX_TOKENS).unwrap()).unwrap()
    }

    #[test]
    fn maps_every_field() {
        let wire = wire(&request());
        assert_eq!(wire["system"], json!([{"text": "be brief"}]));
        assert!(wire.get("model").is_none());
        // Two user turns merge; the blank text part is left out.
        assert_eq!(
            wire["messages"][0],
            json!({"role": "user", "content": [
                {"text": "what is this?"},
                {"image": {"format": "jpeg", "source": {"bytes": "AAAA"}}},
                {"text": "and?"}
            ]})
        );
        assert_eq!(
            wire["messages"][1],
            json!({"role": "assistant", "content": [
                {"text": "looking"},
                {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {"q": 1}}},
                {"toolUse": {"toolUseId": "t2", "name": "lookup", "input": {}}}
            ]})
        );
        // Tool results are one user turn, merged with the user message after them.
        assert_eq!(
            wire["messages"][2],
            json!({"role": "user", "content": [
                {"toolResult": {"toolUseId": "t1", "content": [{"json": {"found": true}}]}},
                {"toolResult": {"toolUseId": "t2", "content": [{"text": "plain"}]}},
                {"text": "thanks"}
            ]})
        );
        assert_eq!(wire["messages"].as_array().unwrap().len(), 3);
        // No thinking here (it continues a tool call, under a max_tokens of 100): every sampling
        // setting is sent.
        assert_eq!(
            wire["inferenceConfig"],
            json!({"maxTokens": 100, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]})
        );
        assert_eq!(wire["additionalModelRequestFields"], json!({"top_k": 40}));
        assert_eq!(
            wire["toolConfig"],
            json!({
                "tools": [{"toolSpec": {"name": "lookup", "description": "find",
                    "inputSchema": {"json": {"type": "object", "properties": {"q": {"type": "integer"}}}}}}],
                "toolChoice": {"any": {}}
            })
        );
        // Claude's thinking refuses temperature and top_k, and top_p under 0.95.
        let thinking = super::tests::wire(&InferenceRequest {
            messages: vec![Message::text(Role::User, "hi")],
            max_tokens: Some(3000),
            ..request()
        });
        assert_eq!(
            thinking["inferenceConfig"],
            json!({"maxTokens": 3000, "topP": 0.95, "stopSequences": ["END"]})
        );
        // "required" under Claude's thinking, which refuses forced tool use.
        assert_eq!(thinking["toolConfig"]["toolChoice"], json!({"auto": {}}));
        assert_eq!(
            thinking["additionalModelRequestFields"],
            json!({"thinking": {"type": "enabled", "budget_tokens": 2000}})
        );
    }

    #[test]
    fn maps_choices_models_and_structured_output() {
        let mut req = InferenceRequest {
            model: "amazon.nova-pro-v1:0".into(),
            messages: vec![Message::text(Role::User, "hi")],
            top_k: Some(5),
            thinking_budget: Some(5000),
            tools: request().tools,
            tool_choice: Some(ToolChoice::Auto),
            ..Default::default()
        };
        let nova = wire(&req);
        // Nova takes topK inside its own inferenceConfig; thinking budgets are Anthropic's.
        assert_eq!(
            nova["additionalModelRequestFields"],
            json!({"inferenceConfig": {"topK": 5}})
        );
        assert!(nova.get("inferenceConfig").is_none());
        assert_eq!(nova["toolConfig"]["toolChoice"], json!({"auto": {}}));

        req.tool_choice = Some(ToolChoice::Tool("lookup".into()));
        assert_eq!(
            wire(&req)["toolConfig"]["toolChoice"],
            json!({"tool": {"name": "lookup"}})
        );
        req.tool_choice = None;
        assert!(wire(&req)["toolConfig"].get("toolChoice").is_none());
        req.tool_choice = Some(ToolChoice::None);
        assert!(wire(&req).get("toolConfig").is_none());

        req.response_format = Some(ResponseFormat::JsonSchema {
            name: "r".into(),
            schema: json!({"type": "object", "required": ["a"]}),
            strict: None,
        });
        let structured = wire(&req);
        assert_eq!(
            structured["toolConfig"],
            json!({
                "tools": [{"toolSpec": {"name": STRUCTURED_TOOL, "description": "Return the answer as this JSON object.",
                    "inputSchema": {"json": {"type": "object", "required": ["a"]}}}}],
                "toolChoice": {"tool": {"name": STRUCTURED_TOOL}}
            })
        );
        req.response_format = Some(ResponseFormat::JsonObject);
        req.tool_choice = Some(ToolChoice::Auto);
        let object = wire(&req);
        assert_eq!(object["toolConfig"]["tools"].as_array().unwrap().len(), 2);
        assert_eq!(
            object["toolConfig"]["tools"][1]["toolSpec"]["inputSchema"],
            json!({"json": {"type": "object"}})
        );
        req.response_format = Some(ResponseFormat::Text);
        assert_eq!(wire(&req)["toolConfig"]["toolChoice"], json!({"auto": {}}));
    }

    /// Converse's toolChoice: `{"auto":{}}`, `{"any":{}}`, `{"tool":{"name":..}}`.
    #[test]
    fn structured_output_leaves_the_callers_tools_callable() {
        let names = |wire: &Value| -> Vec<String> {
            wire["toolConfig"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["toolSpec"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        let mut req = InferenceRequest {
            model: "amazon.nova-pro-v1:0".into(),
            messages: vec![Message::text(Role::User, "hi")],
            tools: request().tools,
            response_format: Some(ResponseFormat::JsonObject),
            ..Default::default()
        };
        for choice in [None, Some(ToolChoice::Auto), Some(ToolChoice::Required)] {
            req.tool_choice = choice.clone();
            let wire = wire(&req);
            assert_eq!(names(&wire), ["lookup", STRUCTURED_TOOL], "{choice:?}");
            assert_eq!(
                wire["toolConfig"]["toolChoice"],
                json!({"any": {}}),
                "{choice:?}"
            );
        }
        req.tool_choice = Some(ToolChoice::Tool("lookup".into()));
        assert_eq!(
            wire(&req)["toolConfig"]["toolChoice"],
            json!({"tool": {"name": "lookup"}})
        );
        req.tool_choice = Some(ToolChoice::None);
        let wire_none = wire(&req);
        assert_eq!(names(&wire_none), [STRUCTURED_TOOL]);
        assert_eq!(
            wire_none["toolConfig"]["toolChoice"],
            json!({"tool": {"name": STRUCTURED_TOOL}})
        );
        // Claude with thinking takes only auto.
        req.model = "anthropic.claude-sonnet-4-5-20250929-v1:0".into();
        req.thinking_budget = Some(2048);
        req.tool_choice = None;
        assert_eq!(wire(&req)["toolConfig"]["toolChoice"], json!({"auto": {}}));
        req.tools.clear();
        assert_eq!(wire(&req)["toolConfig"]["toolChoice"], json!({"auto": {}}));
    }

    /// Claude's thinking needs `maxTokens` above the budget: without the request's, the
    /// model's max output from the catalogue, 4096 for a model the catalogue lacks.
    #[test]
    fn thinking_max_tokens_default_to_the_catalogues_max_output() {
        let catalogue = Arc::new(Catalogue::shipped().unwrap());
        let model = "global.anthropic.claude-haiku-4-5-20251001-v1:0";
        let max_output = catalogue.get("bedrock", model).unwrap().max_output_tokens;
        let provider = BedrockProvider::new(
            "bedrock",
            "https://bedrock-runtime.us-east-1.amazonaws.com",
            "us-east-1".into(),
            AwsCredentials {
                access_key_id: "AKID".into(),
                secret_access_key: "secret".into(),
                session_token: None,
            },
            crate::http::ProviderClient::new(None).unwrap(),
            None,
        )
        .with_catalogue(catalogue);
        let mut req = InferenceRequest {
            model: model.into(),
            messages: vec![Message::text(Role::User, "hi")],
            thinking_budget: Some(2048),
            ..Default::default()
        };
        let max_tokens = |req: &InferenceRequest| {
            serde_json::to_value(provider.wire(req).unwrap()).unwrap()["inferenceConfig"]
                ["maxTokens"]
                .clone()
        };
        assert_eq!(max_tokens(&req), json!(max_output));
        req.model = "anthropic.claude-unknown-v1:0".into();
        assert_eq!(max_tokens(&req), json!(DEFAULT_MAX_TOKENS));
        req.max_tokens = Some(3000);
        assert_eq!(max_tokens(&req), json!(3000));
    }

    /// The caller's max_tokens is a cap, thinking included: never raised, the budget fits
    /// under it, and thinking is off when Claude's smallest budget (1,024) cannot.
    #[test]
    fn the_thinking_budget_fits_under_the_callers_max_tokens() {
        let request = |max_tokens| InferenceRequest {
            model: "us.anthropic.claude-sonnet-4-5-20250929-v1:0".into(),
            messages: vec![Message::text(Role::User, "hi")],
            max_tokens,
            temperature: Some(0.5),
            thinking_budget: Some(8192),
            ..Default::default()
        };
        let capped = wire(&request(Some(1500)));
        assert_eq!(capped["inferenceConfig"]["maxTokens"], 1500);
        assert_eq!(
            capped["additionalModelRequestFields"]["thinking"]["budget_tokens"],
            1499
        );
        let small = wire(&request(Some(1000)));
        assert_eq!(small["inferenceConfig"]["maxTokens"], 1000);
        assert!(
            small.get("additionalModelRequestFields").is_none(),
            "{small}"
        );
        assert_eq!(
            small["inferenceConfig"]["temperature"], 0.5,
            "without thinking the sampling settings stay"
        );
        let open = wire(&request(None));
        assert_eq!(
            open["additionalModelRequestFields"]["thinking"]["budget_tokens"],
            8192
        );
        assert_eq!(open["inferenceConfig"]["maxTokens"], 8193);
    }

    /// Claude (through Converse as directly) refuses a continued tool turn under thinking
    /// without the thinking block canonical messages cannot carry: that turn goes without.
    #[test]
    fn a_continued_tool_turn_is_sent_without_thinking() {
        let mut req = InferenceRequest {
            model: "us.anthropic.claude-sonnet-4-5-20250929-v1:0".into(),
            messages: vec![Message::text(Role::User, "hi")],
            tools: request().tools,
            thinking_budget: Some(2048),
            ..Default::default()
        };
        assert_eq!(
            wire(&req)["additionalModelRequestFields"]["thinking"]["budget_tokens"],
            2048
        );
        req.messages.push(Message {
            role: Role::Assistant,
            content: vec![],
            tool_calls: vec![tool_call("t1", "lookup", "{}")],
            tool_call_id: None,
            name: None,
        });
        req.messages.push(Message {
            tool_call_id: Some("t1".into()),
            ..Message::text(Role::Tool, "42")
        });
        let continued = wire(&req);
        assert!(
            continued.get("additionalModelRequestFields").is_none(),
            "{continued}"
        );
    }

    #[test]
    fn tool_history_keeps_a_tool_config() {
        let history = vec![
            Message::text(Role::User, "hi"),
            Message {
                role: Role::Assistant,
                content: vec![],
                tool_calls: vec![tool_call("t1", "lookup", "{}")],
                tool_call_id: None,
                name: None,
            },
            Message {
                tool_call_id: Some("t1".into()),
                ..Message::text(Role::Tool, "")
            },
        ];
        // Tool choice "none" withholds the tools, but Converse needs them declared for history.
        let mut req = InferenceRequest {
            model: "anthropic.claude-3-haiku-20240307-v1:0".into(),
            messages: history,
            tools: request().tools,
            tool_choice: Some(ToolChoice::None),
            ..Default::default()
        };
        let kept = wire(&req);
        assert_eq!(kept["toolConfig"]["tools"][0]["toolSpec"]["name"], "lookup");
        assert!(kept["toolConfig"].get("toolChoice").is_none());
        // A blank tool result is an empty content list, not a blank text block.
        assert_eq!(
            kept["messages"][2]["content"][0]["toolResult"]["content"],
            json!([])
        );
        // Without declared tools, stand-ins named after the calls.
        req.tools.clear();
        req.tool_choice = None;
        let stand_in = wire(&req);
        assert_eq!(
            stand_in["toolConfig"]["tools"],
            json!([{"toolSpec": {"name": "lookup", "description": "A tool used earlier in this conversation.",
                "inputSchema": {"json": {"type": "object"}}}}])
        );
        // No history of tools, no tools: no toolConfig.
        req.messages.truncate(1);
        assert!(wire(&req).get("toolConfig").is_none());
    }

    #[test]
    fn refuses_what_converse_cannot_take() {
        let mut req = InferenceRequest {
            model: "m".into(),
            messages: vec![Message::text(Role::User, "hi")],
            vendor_tools: vec![VendorTool::WebSearch],
            ..Default::default()
        };
        assert!(matches!(
            to_wire("bedrock", &req, DEFAULT_MAX_TOKENS),
            Err(ProviderError::Unsupported { .. })
        ));
        req.vendor_tools.clear();
        req.messages[0].content.push(ContentPart::Image {
            source: ImageSource::Url {
                url: "https://x.example.com/a.png".into(),
            },
            detail: None,
        });
        let err = to_wire("bedrock", &req, DEFAULT_MAX_TOKENS).unwrap_err();
        assert!(err.to_string().contains("image URLs"), "{err}");
        req.messages[0].content[1] = ContentPart::Image {
            source: ImageSource::Base64 {
                media_type: "image/bmp".into(),
                data: "AAAA".into(),
            },
            detail: None,
        };
        assert!(matches!(
            to_wire("bedrock", &req, DEFAULT_MAX_TOKENS),
            Err(ProviderError::Unsupported { .. })
        ));
        for (media, format) in [
            ("image/png", "png"),
            ("image/gif", "gif"),
            ("image/webp", "webp"),
        ] {
            let block = image_block(
                "bedrock",
                &ImageSource::Base64 {
                    media_type: media.into(),
                    data: "AAAA".into(),
                },
            )
            .unwrap();
            assert_eq!(block["image"]["format"], format);
        }
    }

    #[test]
    fn model_ids_are_one_escaped_path_segment() {
        assert_eq!(
            endpoint(
                &default_base_url("us-east-1"),
                "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
                false
            ),
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse"
        );
        assert_eq!(
            endpoint(
                "http://127.0.0.1:9",
                "arn:aws:bedrock:us-east-1:123:inference-profile/x",
                true
            ),
            "http://127.0.0.1:9/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Ainference-profile%2Fx/converse-stream"
        );
        // The URL keeps the escapes as they are.
        let url = url::Url::parse(&endpoint("http://h", "a:b", false)).unwrap();
        assert_eq!(url.path(), "/model/a%3Ab/converse");
    }

    const JAN_1_2026: u64 = 1_767_225_600;

    fn signed(
        url: &str,
        token: Option<&str>,
        body: &[u8],
    ) -> HashMap<&'static str, (String, bool)> {
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(JAN_1_2026);
        sign(
            &url::Url::parse(url).unwrap(),
            body,
            "us-east-1",
            &credentials(token),
            time,
        )
        .unwrap()
        .into_iter()
        .map(|h| (h.name, (h.value, h.sensitive)))
        .collect()
    }

    fn hex_sha256(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[test]
    fn signs_with_sigv4_for_bedrock() {
        let url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/us.anthropic.claude-3-v1%3A0/converse";
        let body = br#"{"messages":[]}"#;
        let headers = signed(url, None, body);
        assert_eq!(headers["x-amz-date"].0, "20260101T000000Z");
        let auth = &headers["authorization"].0;
        let rest = auth
            .strip_prefix("AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=")
            .unwrap_or_else(|| panic!("unexpected authorization: {auth}"));
        let (signed_headers, signature) = rest.split_once(", Signature=").unwrap();
        assert_eq!(signed_headers, "content-type;host;x-amz-date");
        assert_eq!(signature.len(), 64);
        assert!(
            signature
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(!headers.contains_key("x-amz-security-token"));

        // The same inputs give the same signature; another body another one.
        assert_eq!(signed(url, None, body)["authorization"].0, *auth);
        assert_ne!(signed(url, None, b"{}")["authorization"].0, *auth);

        // Worked by hand: the canonical URI is the sent path encoded once more (%3A -> %253A),
        // and the body's hash closes the canonical request.
        let canonical = format!(
            "POST\n/model/us.anthropic.claude-3-v1%253A0/converse\n\ncontent-type:application/json\nhost:bedrock-runtime.us-east-1.amazonaws.com\nx-amz-date:20260101T000000Z\n\ncontent-type;host;x-amz-date\n{}",
            hex_sha256(body)
        );
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n20260101T000000Z\n20260101/us-east-1/bedrock/aws4_request\n{}",
            hex_sha256(canonical.as_bytes())
        );
        let key = v4::generate_signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            SystemTime::UNIX_EPOCH + Duration::from_secs(JAN_1_2026),
            "us-east-1",
            "bedrock",
        );
        assert_eq!(
            signature,
            v4::calculate_signature(key, string_to_sign.as_bytes())
        );
    }

    #[test]
    fn signs_session_tokens_and_ports() {
        let headers = signed(
            "http://127.0.0.1:8080/model/m/converse",
            Some("TOKEN"),
            b"{}",
        );
        assert_eq!(headers["x-amz-security-token"], ("TOKEN".to_string(), true));
        assert!(
            headers["authorization"]
                .0
                .contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token,")
        );
        let without_port = signed("http://127.0.0.1/model/m/converse", Some("TOKEN"), b"{}");
        assert_ne!(without_port["authorization"].0, headers["authorization"].0);
    }

    #[test]
    fn reads_text_tool_calls_and_usage() {
        let wire: ConverseResponse = serde_json::from_value(json!({
            "output": {"message": {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "s"}}},
                {"text": "Let me "},
                {"text": "look."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {"q": 1}}}
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 10, "outputTokens": 3, "totalTokens": 13,
                      "cacheReadInputTokens": 5, "cacheWriteInputTokens": 2},
            "metrics": {"latencyMs": 120}
        }))
        .unwrap();
        let r = from_wire(wire, "us.anthropic.claude-3-v1:0", false);
        assert_eq!(r.model, "us.anthropic.claude-3-v1:0");
        assert_eq!(r.text, "Let me look.");
        assert_eq!(
            r.tool_calls,
            vec![tool_call("tooluse_1", "lookup", "{\"q\":1}")]
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 17,
                tokens_out: 3,
                reasoning_tokens: 0,
                cached_tokens: 5,
                web_search_calls: 0
            }
        );
    }

    #[test]
    fn reads_structured_output_and_stop_reasons() {
        let wire: ConverseResponse = serde_json::from_value(json!({
            "output": {"message": {"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "x", "name": STRUCTURED_TOOL, "input": {"answer": 42}}}
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 1, "outputTokens": 1}
        }))
        .unwrap();
        let r = from_wire(wire, "m", true);
        assert_eq!(r.text, "{\"answer\":42}");
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.finish_reason, FinishReason::Stop);
        for (raw, reason) in [
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("max_tokens", FinishReason::Length),
            ("tool_use", FinishReason::ToolCalls),
            ("guardrail_intervened", FinishReason::ContentFilter),
            ("content_filtered", FinishReason::ContentFilter),
        ] {
            assert_eq!(finish_reason(raw, true), reason, "{raw}");
        }
        let empty: ConverseResponse = serde_json::from_value(json!({})).unwrap();
        assert_eq!(from_wire(empty, "m", false).text, "");
    }

    // ---- Stream fixtures: frames built with the crate's encoder ----

    fn frame(headers: &[(&'static str, &str)], payload: &Value) -> Vec<u8> {
        let mut message = EventMessage::new(Bytes::from(payload.to_string()));
        for (name, value) in headers {
            message = message.add_header(Header::new(
                *name,
                HeaderValue::String(value.to_string().into()),
            ));
        }
        let mut out = Vec::new();
        write_message_to(&message, &mut out).unwrap();
        out
    }

    fn event(name: &str, payload: Value) -> Vec<u8> {
        frame(
            &[
                (":event-type", name),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            &payload,
        )
    }

    fn exception(kind: &str, message: &str) -> Vec<u8> {
        frame(
            &[
                (":exception-type", kind),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            &json!({"message": message}),
        )
    }

    /// A full ConverseStream: text (with a multi-byte character), two tool calls, usage.
    fn conversation() -> Vec<u8> {
        [
            event("messageStart", json!({"role": "assistant", "p": "abc"})),
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "Hé"}, "p": "ab"})),
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "llo ✓"}})),
            event("contentBlockStop", json!({"contentBlockIndex": 0})),
            event("contentBlockStart", json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tu_1", "name": "lookup"}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"q\":"}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "1}"}}})),
            event("contentBlockStop", json!({"contentBlockIndex": 1})),
            event("contentBlockStart", json!({"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "tu_2", "name": "other"}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 2, "delta": {"toolUse": {"input": "{}"}}})),
            event("contentBlockStop", json!({"contentBlockIndex": 2})),
            event("messageStop", json!({"stopReason": "tool_use"})),
            event("metadata", json!({"usage": {"inputTokens": 9, "outputTokens": 12, "totalTokens": 21, "cacheReadInputTokens": 4}, "metrics": {"latencyMs": 5}})),
        ]
        .concat()
    }

    async fn decode(chunks: Vec<Vec<u8>>, structured: bool) -> Vec<ProviderResult<StreamDelta>> {
        let bytes = futures::stream::iter(chunks.into_iter().map(|c| Ok(Bytes::from(c))));
        deltas("bedrock", bytes, structured, MAX_FRAME_BYTES)
            .collect()
            .await
    }

    fn accumulate(deltas: &[ProviderResult<StreamDelta>]) -> InferenceResponse {
        let mut acc = ResponseAccumulator::new("m");
        for delta in deltas {
            acc.push(delta.as_ref().unwrap());
        }
        acc.finish()
    }

    #[tokio::test]
    async fn stream_frames_assemble() {
        let deltas = decode(vec![conversation()], false).await;
        assert_eq!(
            deltas[..4],
            [
                Ok(StreamDelta::Text("Hé".into())),
                Ok(StreamDelta::Text("llo ✓".into())),
                // Ordinals, not block indices.
                Ok(StreamDelta::ToolCallStart {
                    index: 0,
                    id: "tu_1".into(),
                    name: "lookup".into()
                }),
                Ok(StreamDelta::ToolCallArguments {
                    index: 0,
                    fragment: "{\"q\":".into()
                }),
            ]
        );
        let r = accumulate(&deltas);
        assert_eq!(r.text, "Héllo ✓");
        assert_eq!(
            r.tool_calls,
            vec![
                tool_call("tu_1", "lookup", "{\"q\":1}"),
                tool_call("tu_2", "other", "{}")
            ]
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 13,
                tokens_out: 12,
                reasoning_tokens: 0,
                cached_tokens: 4,
                web_search_calls: 0
            }
        );
    }

    /// The same bytes split at every boundary (inside preludes, headers, CRCs and multi-byte
    /// characters) and byte by byte decode to the same deltas.
    #[tokio::test]
    async fn every_split_gives_the_same_deltas() {
        let raw = conversation();
        let whole = decode(vec![raw.clone()], false).await;
        assert!(whole.iter().all(Result::is_ok));
        for i in 1..raw.len() {
            let split = decode(vec![raw[..i].to_vec(), raw[i..].to_vec()], false).await;
            assert_eq!(split, whole, "split at {i}");
        }
        let bytewise = decode(raw.iter().map(|b| vec![*b]).collect(), false).await;
        assert_eq!(bytewise, whole);
    }

    #[tokio::test]
    async fn structured_output_streams_as_text() {
        let raw = [
            event("messageStart", json!({"role": "assistant"})),
            event("contentBlockStart", json!({"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "x", "name": STRUCTURED_TOOL}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{\"a\":"}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "1}"}}})),
            event("messageStop", json!({"stopReason": "tool_use"})),
        ]
        .concat();
        let r = accumulate(&decode(vec![raw], true).await);
        assert_eq!(r.text, "{\"a\":1}");
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.finish_reason, FinishReason::Stop);
    }

    /// With structured output and the caller's tools offered, a real call stays a tool call
    /// (the loop goes on), and text before the structured answer is not part of it.
    #[tokio::test]
    async fn structured_streams_tell_real_tool_calls_from_the_answer() {
        let raw = [
            event("contentBlockStart", json!({"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup"}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{\"q\":1}"}}})),
            event("messageStop", json!({"stopReason": "tool_use"})),
        ]
        .concat();
        let r = accumulate(&decode(vec![raw], true).await);
        assert_eq!(
            r.tool_calls,
            vec![tool_call("tooluse_1", "lookup", "{\"q\":1}")]
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.text, "");

        let raw = [
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "Here:"}})),
            event("contentBlockStart", json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "x", "name": STRUCTURED_TOOL}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"a\":1}"}}})),
            event("messageStop", json!({"stopReason": "tool_use"})),
        ]
        .concat();
        let r = accumulate(&decode(vec![raw], true).await);
        assert_eq!(r.text, "{\"a\":1}");
        assert_eq!(r.finish_reason, FinishReason::Stop);

        // An answer given as text is sent whole at the finish.
        let raw = [
            event(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "{\"a\":"}}),
            ),
            event(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "2}"}}),
            ),
            event("messageStop", json!({"stopReason": "end_turn"})),
        ]
        .concat();
        let r = accumulate(&decode(vec![raw], true).await);
        assert_eq!(r.text, "{\"a\":2}");
    }

    /// A call without arguments streams its input as "" (or none at all): its arguments are
    /// `{}`, as a complete answer's.
    #[tokio::test]
    async fn a_streamed_call_without_arguments_has_empty_object_arguments() {
        let raw = [
            event("messageStart", json!({"role": "assistant"})),
            event("contentBlockStart", json!({"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "tu_1", "name": "now"}}})),
            event("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": ""}}})),
            event("contentBlockStop", json!({"contentBlockIndex": 0})),
            event("contentBlockStart", json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tu_2", "name": "now"}}})),
            event("contentBlockStop", json!({"contentBlockIndex": 1})),
            event("messageStop", json!({"stopReason": "tool_use"})),
        ]
        .concat();
        let r = accumulate(&decode(vec![raw], false).await);
        assert_eq!(
            r.tool_calls,
            vec![
                tool_call("tu_1", "now", "{}"),
                tool_call("tu_2", "now", "{}")
            ]
        );
        // The complete answer's, even with the input left out.
        let sync: ConverseResponse = serde_json::from_value(json!({
            "output": {"message": {"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "tu_1", "name": "now", "input": {}}},
                {"toolUse": {"toolUseId": "tu_2", "name": "now"}}
            ]}},
            "stopReason": "tool_use"
        }))
        .unwrap();
        let r = from_wire(sync, "m", false);
        assert_eq!(
            r.tool_calls,
            vec![
                tool_call("tu_1", "now", "{}"),
                tool_call("tu_2", "now", "{}")
            ]
        );
    }

    #[tokio::test]
    async fn exception_frames_are_status_errors() {
        for (kind, status) in [
            ("throttlingException", 429),
            ("modelStreamErrorException", 502),
            ("serviceUnavailableException", 503),
            ("internalServerException", 500),
            ("validationException", 400),
        ] {
            let raw = [
                event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 0, "delta": {"text": "Hi"}}),
                ),
                exception(kind, "slow down"),
                event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 0, "delta": {"text": "never"}}),
                ),
            ]
            .concat();
            let deltas = decode(vec![raw], false).await;
            assert_eq!(deltas.len(), 2, "{kind}: nothing after the exception");
            assert_eq!(deltas[0], Ok(StreamDelta::Text("Hi".into())));
            let err = deltas[1].clone().unwrap_err();
            assert_eq!(err.status(), Some(status), "{kind}");
            assert!(err.to_string().contains("slow down"), "{err}");
        }
    }

    /// Found by fuzzing: the deltas of the frames before a broken one were dropped when both
    /// arrived in one chunk, and kept when they arrived apart.
    #[tokio::test]
    async fn frames_before_a_broken_one_count_however_they_arrive() {
        let good = event("contentBlockDelta", json!({"delta": {"text": "kept"}}));
        let mut broken = event("contentBlockDelta", json!({"delta": {"text": "lost"}}));
        broken[5] ^= 0x01; // inside the prelude: its checksum fails
        let together = decode(vec![[good.clone(), broken.clone()].concat()], false).await;
        let apart = decode(vec![good, broken], false).await;
        for deltas in [&together, &apart] {
            assert_eq!(deltas.len(), 2, "{deltas:?}");
            assert_eq!(
                deltas[0].as_ref().unwrap(),
                &StreamDelta::Text("kept".into())
            );
            assert!(matches!(
                deltas[1],
                Err(ProviderError::InvalidResponse { .. })
            ));
        }
    }

    #[tokio::test]
    async fn broken_streams_are_invalid_responses() {
        let raw = conversation();
        // Ends inside a frame.
        let truncated = decode(vec![raw[..raw.len() - 3].to_vec()], false).await;
        assert!(matches!(
            truncated.last(),
            Some(Err(ProviderError::InvalidResponse { .. }))
        ));
        // A flipped payload byte fails the CRC.
        let mut corrupt = raw.clone();
        corrupt[40] ^= 0x20;
        let deltas = decode(vec![corrupt], false).await;
        assert!(matches!(
            deltas.last(),
            Some(Err(ProviderError::InvalidResponse { .. }))
        ));
        // A frame declaring more than the bound fails at once, without buffering it.
        let huge = (MAX_FRAME_BYTES as u32 + 1).to_be_bytes().to_vec();
        let deltas = decode(vec![huge], false).await;
        assert_eq!(deltas.len(), 1);
        assert!(
            deltas[0]
                .clone()
                .unwrap_err()
                .to_string()
                .contains("exceeds")
        );
        // Unreadable JSON in a known event.
        let bad = frame(
            &[(":event-type", "messageStop"), (":message-type", "event")],
            &json!("not an object"),
        );
        let deltas = decode(vec![bad], false).await;
        assert!(matches!(
            deltas[0],
            Err(ProviderError::InvalidResponse { .. })
        ));
        // A transport error ends the stream with that error.
        let failing = futures::stream::iter(vec![
            Ok(Bytes::from(event(
                "contentBlockDelta",
                json!({"delta": {"text": "a"}}),
            ))),
            Err(ProviderError::Connection {
                provider: "bedrock".into(),
                message: "reset".into(),
            }),
        ]);
        let deltas: Vec<_> = deltas_of(failing).await;
        assert_eq!(deltas.len(), 2);
        assert!(matches!(deltas[1], Err(ProviderError::Connection { .. })));
    }

    /// A body that ends inside a frame before any delta was cut before the answer began:
    /// retryable, as a broken connection is, so the chain tries the next model.
    #[tokio::test]
    async fn a_body_cut_before_the_answer_is_retryable() {
        let mut raw = event("messageStart", json!({"role": "assistant"}));
        let text = event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": "a"}}),
        );
        raw.extend_from_slice(&text[..text.len() / 2]);
        let deltas = decode(vec![raw], false).await;
        match &deltas[..] {
            [Err(error @ ProviderError::Connection { .. })] => assert!(error.is_retryable()),
            other => panic!("expected a connection error, got {other:?}"),
        }
    }

    async fn deltas_of<S>(bytes: S) -> Vec<ProviderResult<StreamDelta>>
    where
        S: Stream<Item = ProviderResult<Bytes>> + Send + 'static,
    {
        deltas("bedrock", bytes, false, MAX_FRAME_BYTES)
            .collect()
            .await
    }

    /// Mirrors `baton_testkit::bedrock::stream` (which cannot be a dependency here): the mock's
    /// frames decode to the answer they encode.
    fn testkit_stream(text: &str, calls: &[(&str, &str, Value)], tokens: (u64, u64)) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(event("messageStart", json!({"role": "assistant"})));
        let mut index = 0;
        if !text.is_empty() {
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(3) {
                let piece: String = piece.iter().collect();
                out.extend(event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": index, "delta": {"text": piece}}),
                ));
            }
            out.extend(event(
                "contentBlockStop",
                json!({"contentBlockIndex": index}),
            ));
            index += 1;
        }
        for (id, name, arguments) in calls {
            out.extend(event("contentBlockStart", json!({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": id, "name": name}}})));
            let args = arguments.to_string();
            let mut middle = args.len() / 2;
            while !args.is_char_boundary(middle) {
                middle += 1;
            }
            let (head, tail) = args.split_at(middle);
            for part in [head, tail] {
                out.extend(event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": index, "delta": {"toolUse": {"input": part}}}),
                ));
            }
            out.extend(event(
                "contentBlockStop",
                json!({"contentBlockIndex": index}),
            ));
            index += 1;
        }
        let stop = if calls.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        };
        out.extend(event("messageStop", json!({"stopReason": stop})));
        out.extend(event(
            "metadata",
            json!({"usage": {"inputTokens": tokens.0, "outputTokens": tokens.1,
            "totalTokens": tokens.0 + tokens.1}, "metrics": {"latencyMs": 1}}),
        ));
        out
    }

    #[tokio::test]
    async fn the_mock_encoding_decodes_to_its_answer() {
        let raw = testkit_stream(
            "Grüße, world",
            &[("call_1", "lookup", json!({"q": "é", "n": 1}))],
            (10, 5),
        );
        let chunks: Vec<Vec<u8>> = raw.chunks(7).map(<[u8]>::to_vec).collect();
        let r = accumulate(&decode(chunks, false).await);
        assert_eq!(r.text, "Grüße, world");
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(
            serde_json::from_str::<Value>(&r.tool_calls[0].arguments).unwrap(),
            json!({"q": "é", "n": 1})
        );
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (10, 5));
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
    }

    /// The whole path over HTTP: the signed request as sent, and the answer read back.
    #[tokio::test]
    async fn infers_over_http_with_a_signed_request() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for body in [
                json!({"output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
                       "stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 1}})
                .to_string()
                .into_bytes(),
                testkit_stream("streamed", &[], (4, 2)),
            ] {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if rest.len() >= length {
                            break;
                        }
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                socket.write_all(head.as_bytes()).await.unwrap();
                socket.write_all(&body).await.unwrap();
                seen.push(String::from_utf8_lossy(&request).to_string());
            }
            seen
        });

        let provider = BedrockProvider::new(
            "bedrock",
            format!("{base}/"),
            "us-east-1".into(),
            AwsCredentials {
                access_key_id: "AKID".into(),
                secret_access_key: "secret".into(),
                session_token: Some("TOKEN".into()),
            },
            crate::http::ProviderClient::new(None).unwrap(),
            Some(Duration::from_secs(10)),
        );
        let req = InferenceRequest {
            model: "us.anthropic.claude-3-v1:0".into(),
            messages: vec![Message::text(Role::User, "hello")],
            ..Default::default()
        };
        let answer = provider.infer(&req).await.unwrap();
        assert_eq!(answer.text, "hi");
        assert_eq!(answer.model, "us.anthropic.claude-3-v1:0");
        let streamed: Vec<_> = provider.infer_stream(&req).await.unwrap().collect().await;
        let r = accumulate(&streamed);
        assert_eq!(r.text, "streamed");
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (4, 2));

        let seen = server.await.unwrap();
        assert!(
            seen[0].starts_with("POST /model/us.anthropic.claude-3-v1%3A0/converse HTTP/1.1\r\n"),
            "{}",
            seen[0]
        );
        assert!(
            seen[1].starts_with(
                "POST /model/us.anthropic.claude-3-v1%3A0/converse-stream HTTP/1.1\r\n"
            )
        );
        for request in &seen {
            let lower = request.to_lowercase();
            assert!(lower.contains("\r\ncontent-type: application/json\r\n"));
            assert!(lower.contains("\r\nx-amz-security-token: token\r\n"));
            assert!(lower.contains("\r\nx-amz-date: "));
            assert!(lower.contains("\r\nauthorization: aws4-hmac-sha256 credential=akid/"));
            assert!(lower.contains("/us-east-1/bedrock/aws4_request, signedheaders=content-type;host;x-amz-date;x-amz-security-token, signature="));
            assert!(
                request.ends_with(r#"{"messages":[{"role":"user","content":[{"text":"hello"}]}]}"#)
            );
        }
    }
}
