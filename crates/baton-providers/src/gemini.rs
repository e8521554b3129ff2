//! Google Gemini API: `POST {base}/v1beta/models/{model}:generateContent`, streams on
//! `:streamGenerateContent?alt=sse`. The key travels in the `x-goog-api-key` header, never in
//! the URL. `web_search` is Gemini's Google Search grounding; its sources become citations.

use std::fmt::Write as _;
use std::time::Duration;

use async_trait::async_trait;
use baton_domain::chat::{
    Citation, ContentPart, FinishReason, ImageSource, InferenceRequest, InferenceResponse, Message,
    ResponseFormat, Role, StreamDelta, ToolCall, ToolChoice, Usage, VendorTool,
};
use bytes::Bytes;
use futures::Stream;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ProviderError, ProviderResult};
use crate::http;
use crate::provider::{DeltaStream, Provider, thinking_under_cap};
use crate::sse::{self, Deltas, HeldUntilContent};

/// Google's documented stand-in for a thought signature. Gemini 3 rejects replayed function
/// calls without one, and canonical tool calls cannot carry the real signature back.
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";
/// The smallest thinking budget every Gemini thinking model takes (2.5 Flash-Lite's; 2.5 Pro's
/// is 128); a budget shrunk under the caller's max_tokens is not taken below it.
const MIN_THINKING_BUDGET: u32 = 512;

pub struct GeminiProvider {
    key: String,
    base_url: String,
    api_key: SecretString,
    client: http::ProviderClient,
    timeout: Option<Duration>,
}

impl GeminiProvider {
    pub fn new(
        key: impl Into<String>,
        base_url: impl Into<String>,
        api_key: SecretString,
        client: impl Into<http::ProviderClient>,
        timeout: Option<Duration>,
    ) -> Self {
        Self {
            key: key.into(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            api_key,
            client: client.into(),
            timeout,
        }
    }

    fn endpoint(&self, model: &str, stream: bool) -> String {
        let model = path_segment(model.strip_prefix("models/").unwrap_or(model));
        if stream {
            format!(
                "{}/v1beta/models/{model}:streamGenerateContent?alt=sse",
                self.base_url
            )
        } else {
            format!("{}/v1beta/models/{model}:generateContent", self.base_url)
        }
    }

    fn request(
        &self,
        model: &str,
        stream: bool,
        body: &GenerateContentRequest,
    ) -> reqwest::RequestBuilder {
        self.client
            .get()
            .post(self.endpoint(model, stream))
            .header("x-goog-api-key", self.api_key.expose_secret())
            .json(body)
    }

    fn wire(&self, request: &InferenceRequest) -> ProviderResult<GenerateContentRequest> {
        if let Some(tool) = request
            .vendor_tools
            .iter()
            .find(|t| **t != VendorTool::WebSearch)
        {
            return Err(ProviderError::Unsupported {
                provider: self.key.clone(),
                what: format!(
                    "the vendor tool '{}' (Gemini runs web_search as Google Search grounding)",
                    tool.as_str()
                ),
                field: Some("vendor_tools"),
            });
        }
        to_wire(request).map_err(|what| ProviderError::Unsupported {
            field: None,
            provider: self.key.clone(),
            what,
        })
    }
}

#[async_trait]
impl Provider for GeminiProvider {
    fn key(&self) -> &str {
        &self.key
    }

    async fn infer(&self, request: &InferenceRequest) -> ProviderResult<InferenceResponse> {
        let body = self.wire(request)?;
        let builder = self.request(&request.model, false, &body);
        let wire: GenerateContentResponse = http::send_json(
            &self.client,
            &self.key,
            &request.model,
            builder,
            self.timeout,
        )
        .await?;
        answer(&self.key, wire, &request.model)
    }

    async fn infer_stream(&self, request: &InferenceRequest) -> ProviderResult<DeltaStream> {
        let body = self.wire(request)?;
        http::stream(
            &self.client,
            &self.key,
            &request.model,
            self.request(&request.model, true, &body),
            self.timeout,
            |response| deltas(&self.key, response.bytes_stream()),
        )
        .await
    }
}

/// Canonical deltas of a streamGenerateContent SSE body: the HTTP response's, or any byte
/// stream (benchmarks drive it from memory).
pub(crate) fn deltas<S, E>(provider: &str, bytes: S) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let name = provider.to_string();
    let mut state = StreamState::default();
    sse::deltas(
        provider,
        bytes,
        move |data, out| match serde_json::from_str::<GenerateContentResponse>(data) {
            Ok(mut chunk) => match chunk.error.take() {
                Some(error) => out.push_back(Err(error.into_provider_error(&name))),
                None => state.map(chunk, out),
            },
            Err(err) => out.push_back(Err(ProviderError::InvalidResponse {
                provider: name.clone(),
                message: format!("unreadable stream chunk: {err}"),
            })),
        },
    )
}

/// Percent-encodes a model name as one path segment, so nothing in it can reshape the URL.
fn path_segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

// ---- Request -------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GenerateContentRequest {
    contents: Vec<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<SystemInstruction>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation_config: Option<GenerationConfig>,
}

#[derive(Debug, Serialize)]
struct Content {
    role: &'static str,
    parts: Vec<Value>,
}

#[derive(Debug, Serialize)]
struct SystemInstruction {
    parts: Vec<Value>,
}

#[derive(Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop_sequences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    /// Standard JSON Schema (`responseSchema` takes only Google's OpenAPI subset).
    #[serde(skip_serializing_if = "Option::is_none")]
    response_json_schema: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_config: Option<ThinkingConfig>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct ThinkingConfig {
    thinking_budget: u32,
}

/// Gemini 3 and later (and aliases such as `gemini-flash-latest`) validate thought signatures
/// on replayed function calls; Gemini 1.x/2.x and other families (Gemma) neither need nor check
/// them.
fn needs_signature(model: &str) -> bool {
    let model = model.strip_prefix("models/").unwrap_or(model);
    model.starts_with("gemini-")
        && !(model.starts_with("gemini-1") || model.starts_with("gemini-2"))
}

/// `https://x/a.PNG?s=1` -> `image/png`; Gemini wants a MIME type beside every file URI.
fn guess_mime_type(url: &str) -> &'static str {
    let without_query = url.split(['?', '#']).next().unwrap_or_default();
    let after_scheme = without_query
        .split_once("://")
        .map_or(without_query, |(_, rest)| rest);
    let path = after_scheme.split_once('/').map_or("", |(_, path)| path);
    let file = path.rsplit('/').next().unwrap_or_default();
    let extension = file
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase());
    match extension.as_deref() {
        Some("png") => "image/png",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("heic") => "image/heic",
        Some("heif") => "image/heif",
        _ => "image/jpeg",
    }
}

fn image_part(source: &ImageSource) -> Value {
    match source {
        ImageSource::Base64 { media_type, data } => {
            json!({"inlineData": {"mimeType": media_type, "data": data}})
        }
        ImageSource::Url { url } => {
            json!({"fileData": {"mimeType": guess_mime_type(url), "fileUri": url}})
        }
    }
}

fn content_parts(message: &Message) -> Vec<Value> {
    message
        .content
        .iter()
        .filter_map(|part| match part {
            ContentPart::Text { text } if text.is_empty() => None,
            ContentPart::Text { text } => Some(json!({"text": text})),
            ContentPart::Image { source, .. } => Some(image_part(source)),
        })
        .collect()
}

/// Gemini's `args` must be an object; anything else the model once produced becomes `{}`.
fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

/// A tool result as a `functionResponse`. Gemini matches results by function name: the
/// message's `name`, else the name of the latest earlier call with the same id.
fn function_response(message: &Message, earlier: &[Message]) -> Result<Value, String> {
    let id = message.tool_call_id.as_deref().unwrap_or_default();
    let name = message
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            earlier
                .iter()
                .rev()
                .flat_map(|m| m.tool_calls.iter().rev())
                .find(|c| !id.is_empty() && c.id == id)
                .map(|c| c.name.clone())
        })
        .ok_or_else(|| {
            format!(
                "a tool result for call '{id}' whose function is unknown (Gemini needs the \
                 function name: send the result's name or the assistant turn that made the call)"
            )
        })?;
    let text = message.joined_text();
    let content = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
    Ok(json!({"functionResponse": {"name": name, "response": {"content": content}}}))
}

/// Maps the canonical request; the error names what Gemini cannot be sent.
pub(crate) fn to_wire(request: &InferenceRequest) -> Result<GenerateContentRequest, String> {
    let as_user = crate::provider::system_only_as_user(request);
    let request = as_user.as_ref().unwrap_or(request);
    let signed = needs_signature(&request.model);
    let mut system = Vec::new();
    let mut contents: Vec<Content> = Vec::new();
    for (position, message) in request.messages.iter().enumerate() {
        let (role, parts) = match message.role {
            Role::System => {
                let text = message.joined_text();
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            Role::Tool => (
                "user",
                vec![function_response(message, &request.messages[..position])?],
            ),
            Role::User => ("user", content_parts(message)),
            Role::Assistant => {
                let mut parts = content_parts(message);
                for (i, call) in message.tool_calls.iter().enumerate() {
                    let mut part = json!({"functionCall": {
                        "name": call.name,
                        "args": arguments_object(&call.arguments),
                    }});
                    // Only the first call of a step carries a signature (parallel calls share it).
                    if signed && i == 0 {
                        part["thoughtSignature"] = Value::from(SKIP_SIGNATURE);
                    }
                    parts.push(part);
                }
                ("model", parts)
            }
        };
        if parts.is_empty() {
            continue;
        }
        // Consecutive turns of one role become one: tool results after each other, or a tool
        // result followed by the user's next message.
        match contents.last_mut() {
            Some(last) if last.role == role => last.parts.extend(parts),
            _ => contents.push(Content { role, parts }),
        }
    }

    let mut tools = Vec::new();
    if !request.tools.is_empty() {
        let declarations: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                let mut declaration = json!({"name": t.name});
                if let Some(description) = &t.description {
                    declaration["description"] = Value::from(description.as_str());
                }
                // Standard JSON Schema (`additionalProperties` and all), unlike `parameters`.
                if !t.parameters.is_null() {
                    declaration["parametersJsonSchema"] = t.parameters.clone();
                }
                declaration
            })
            .collect();
        tools.push(json!({"functionDeclarations": declarations}));
    }
    if request.vendor_tools.contains(&VendorTool::WebSearch) {
        tools.push(json!({"googleSearch": {}}));
    }
    let tool_config = request
        .tool_choice
        .as_ref()
        .filter(|_| !request.tools.is_empty())
        .map(|choice| {
            let config = match choice {
                ToolChoice::Auto => json!({"mode": "AUTO"}),
                ToolChoice::None => json!({"mode": "NONE"}),
                ToolChoice::Required => json!({"mode": "ANY"}),
                ToolChoice::Tool(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
            };
            json!({"functionCallingConfig": config})
        });

    let (response_mime_type, response_json_schema) = match &request.response_format {
        Some(ResponseFormat::JsonObject) => (Some("application/json"), None),
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            (Some("application/json"), Some(schema.clone()))
        }
        Some(ResponseFormat::Text) | None => (None, None),
    };
    let generation_config = GenerationConfig {
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        max_output_tokens: request.max_tokens,
        // Gemini's seed is an int32: wider seeds keep their low 32 bits (still deterministic).
        seed: request.seed.map(|seed| seed as i32),
        presence_penalty: request.presence_penalty,
        frequency_penalty: request.frequency_penalty,
        stop_sequences: request.stop.clone(),
        response_mime_type,
        response_json_schema,
        // Gemini counts thinking in maxOutputTokens: under the caller's cap the budget shrinks
        // to fit, and with no room for the smallest budget no thinkingConfig is sent (the
        // model's default, as for a request that asks for none; the cap still holds).
        thinking_config: request
            .thinking_budget
            .and_then(|budget| thinking_under_cap(budget, request.max_tokens, MIN_THINKING_BUDGET))
            .map(|thinking_budget| ThinkingConfig { thinking_budget }),
    };
    Ok(GenerateContentRequest {
        contents,
        system_instruction: (!system.is_empty()).then(|| SystemInstruction {
            parts: vec![json!({"text": system.join("\n\n")})],
        }),
        tools,
        tool_config,
        generation_config: (generation_config != GenerationConfig::default())
            .then_some(generation_config),
    })
}

// ---- Response ------------------------------------------------------------------------------

/// A `generateContent` response, and equally one chunk of a stream.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GenerateContentResponse {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    model_version: Option<String>,
    /// Streams report failures after the 200 as a chunk holding only this.
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<WireContent>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    grounding_metadata: Option<GroundingMetadata>,
}

#[derive(Debug, Default, Deserialize)]
struct WireContent {
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part {
    #[serde(default)]
    text: Option<String>,
    /// Thought summaries are reasoning, not answer text.
    #[serde(default)]
    thought: bool,
    #[serde(default)]
    function_call: Option<FunctionCall>,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    args: Option<Value>,
}

impl FunctionCall {
    /// Gemini usually sends no id; the call's ordinal within the response stands in.
    fn into_tool_call(self, ordinal: u32) -> ToolCall {
        ToolCall {
            id: self
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{ordinal}")),
            name: self.name,
            arguments: self.args.unwrap_or_else(|| json!({})).to_string(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroundingMetadata {
    #[serde(default)]
    grounding_chunks: Vec<GroundingChunk>,
    #[serde(default)]
    web_search_queries: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct GroundingChunk {
    #[serde(default)]
    web: Option<WebSource>,
}

#[derive(Debug, Deserialize)]
struct WebSource {
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    title: Option<String>,
}

impl GroundingMetadata {
    fn citations(self) -> impl Iterator<Item = Citation> {
        self.grounding_chunks
            .into_iter()
            .filter_map(|chunk| chunk.web)
            .filter_map(|web| {
                web.uri.filter(|u| !u.is_empty()).map(|url| Citation {
                    url,
                    title: web.title,
                })
            })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
    /// Search results and other tool output fed to the model: billed as input.
    #[serde(default)]
    tool_use_prompt_token_count: u64,
}

impl UsageMetadata {
    /// `promptTokenCount` includes cached tokens, as ours does; thinking is billed as output.
    fn canonical(&self) -> Usage {
        Usage {
            tokens_in: self.prompt_token_count + self.tool_use_prompt_token_count,
            tokens_out: self.candidates_token_count + self.thoughts_token_count,
            reasoning_tokens: self.thoughts_token_count,
            cached_tokens: self.cached_content_token_count,
            web_search_calls: 0,
        }
    }
}

#[derive(Debug, Deserialize)]
struct WireError {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: Option<String>,
}

impl WireError {
    fn into_provider_error(self, provider: &str) -> ProviderError {
        let by_name = match self.status.as_deref() {
            Some("INVALID_ARGUMENT" | "FAILED_PRECONDITION") => 400,
            Some("PERMISSION_DENIED") => 403,
            Some("RESOURCE_EXHAUSTED") => 429,
            Some("UNAVAILABLE") => 503,
            Some("DEADLINE_EXCEEDED") => 504,
            _ => 500,
        };
        let status = self.code.filter(|c| *c >= 400).unwrap_or(by_name);
        ProviderError::Status {
            provider: provider.to_string(),
            status,
            message: if self.message.is_empty() {
                "stream error".into()
            } else {
                self.message
            },
            retry_after: None,
        }
    }
}

fn finish_reason(raw: &str) -> FinishReason {
    match raw {
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY"
        | "RECITATION"
        | "PROHIBITED_CONTENT"
        | "BLOCKLIST"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => FinishReason::ContentFilter,
        // Failed tool calls end the answer with no call to make: OpenAI's finish reasons (what
        // clients are given) have no error, and `stop` is the closest.
        "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" | "TOO_MANY_TOOL_CALLS" => {
            FinishReason::Stop
        }
        _ => FinishReason::Stop,
    }
}

/// The canonical response of a decoded answer, or the error a 200 answer may still carry.
pub(crate) fn answer(
    provider: &str,
    mut wire: GenerateContentResponse,
    requested_model: &str,
) -> ProviderResult<InferenceResponse> {
    if let Some(error) = wire.error.take() {
        return Err(error.into_provider_error(provider));
    }
    Ok(from_wire(wire, requested_model))
}

pub(crate) fn from_wire(wire: GenerateContentResponse, requested_model: &str) -> InferenceResponse {
    let mut usage = wire
        .usage_metadata
        .as_ref()
        .map(UsageMetadata::canonical)
        .unwrap_or_default();
    let model = wire
        .model_version
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| requested_model.to_string());
    let Some(candidate) = wire.candidates.into_iter().next() else {
        // A blocked prompt has no candidates, only the reason.
        let blocked = wire.prompt_feedback.and_then(|f| f.block_reason).is_some();
        return InferenceResponse {
            model,
            usage,
            // An empty answer otherwise: OpenAI's finish reasons have no error.
            finish_reason: if blocked {
                FinishReason::ContentFilter
            } else {
                FinishReason::Stop
            },
            ..Default::default()
        };
    };
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for part in candidate.content.unwrap_or_default().parts {
        if let Some(call) = part.function_call {
            let ordinal = tool_calls.len() as u32;
            tool_calls.push(call.into_tool_call(ordinal));
        } else if let Some(piece) = part.text.filter(|_| !part.thought) {
            text.push_str(&piece);
        }
    }
    let mut citations: Vec<Citation> = Vec::new();
    if let Some(grounding) = candidate.grounding_metadata {
        usage.web_search_calls = grounding.web_search_queries.len() as u64;
        for citation in grounding.citations() {
            if !citations.iter().any(|c| c.url == citation.url) {
                citations.push(citation);
            }
        }
    }
    let finish_reason = if tool_calls.is_empty() {
        candidate
            .finish_reason
            .as_deref()
            .map(finish_reason)
            .unwrap_or_default()
    } else {
        // Gemini says STOP after function calls.
        FinishReason::ToolCalls
    };
    InferenceResponse {
        discarded: Vec::new(),
        model,
        text,
        tool_calls,
        finish_reason,
        usage,
        citations,
        refusal: None,
    }
}

// ---- Stream --------------------------------------------------------------------------------

/// Per-stream state. Each chunk is a whole `GenerateContentResponse`; function calls arrive
/// whole, so each is announced and given its arguments at once.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    next_call: u32,
    cited: Vec<String>,
    /// Distinct search queries seen, so repeated grounding metadata is counted once.
    queries: Vec<String>,
    usage: Usage,
    model_reported: bool,
    /// The model and usage, held until the answer begins.
    held: HeldUntilContent,
}

impl StreamState {
    /// Pushes the deltas `chunk` stands for. Every chunk names the model and usage, and one
    /// may carry nothing visible (empty text, a thought): those go out with the first text,
    /// call, citation or finish, so an error or a stall after such a chunk is still a failure
    /// before the first token.
    pub(crate) fn map(&mut self, chunk: GenerateContentResponse, out: &mut Deltas) {
        let from = out.len();
        self.map_chunk(chunk, out);
        self.held.settle(out, from);
    }

    fn map_chunk(&mut self, chunk: GenerateContentResponse, out: &mut Deltas) {
        let mut push = |delta| out.push_back(Ok(delta));
        if !self.model_reported
            && let Some(model) = chunk.model_version.filter(|m| !m.is_empty())
        {
            self.model_reported = true;
            push(StreamDelta::Model(model));
        }
        let mut usage_changed = false;
        if let Some(metadata) = &chunk.usage_metadata {
            self.usage = Usage {
                web_search_calls: self.usage.web_search_calls,
                ..metadata.canonical()
            };
            usage_changed = true;
        }
        let Some(candidate) = chunk.candidates.into_iter().next() else {
            if usage_changed {
                push(StreamDelta::Usage(self.usage));
            }
            if chunk.prompt_feedback.and_then(|f| f.block_reason).is_some() {
                push(StreamDelta::Finish(FinishReason::ContentFilter));
            }
            return;
        };
        for part in candidate.content.unwrap_or_default().parts {
            if let Some(call) = part.function_call {
                let index = self.next_call;
                self.next_call += 1;
                let call = call.into_tool_call(index);
                push(StreamDelta::ToolCallStart {
                    index,
                    id: call.id,
                    name: call.name,
                });
                push(StreamDelta::ToolCallArguments {
                    index,
                    fragment: call.arguments,
                });
            } else if let Some(text) = part.text.filter(|t| !t.is_empty() && !part.thought) {
                push(StreamDelta::Text(text));
            }
        }
        if let Some(grounding) = candidate.grounding_metadata {
            for query in &grounding.web_search_queries {
                if !self.queries.contains(query) {
                    self.queries.push(query.clone());
                }
            }
            let searches = self.queries.len() as u64;
            if searches != self.usage.web_search_calls {
                self.usage.web_search_calls = searches;
                usage_changed = true;
            }
            for citation in grounding.citations() {
                if !self.cited.contains(&citation.url) {
                    self.cited.push(citation.url.clone());
                    push(StreamDelta::Citation(citation));
                }
            }
        }
        if usage_changed {
            push(StreamDelta::Usage(self.usage));
        }
        if let Some(reason) = candidate.finish_reason {
            push(StreamDelta::Finish(if self.next_call > 0 {
                FinishReason::ToolCalls
            } else {
                finish_reason(&reason)
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use baton_domain::chat::{ResponseAccumulator, ToolDefinition};
    use futures::StreamExt;

    use super::*;

    fn assistant_calls(calls: &[(&str, &str, &str)]) -> Message {
        Message {
            role: Role::Assistant,
            content: vec![],
            tool_calls: calls
                .iter()
                .map(|(id, name, arguments)| ToolCall {
                    id: (*id).into(),
                    name: (*name).into(),
                    arguments: (*arguments).into(),
                })
                .collect(),
            tool_call_id: None,
            name: None,
        }
    }

    fn tool_result(id: &str, name: Option<&str>, text: &str) -> Message {
        Message {
            tool_call_id: Some(id.into()),
            name: name.map(Into::into),
            ..Message::text(Role::Tool, text)
        }
    }

    fn request() -> InferenceRequest {
        InferenceRequest {
            openai_options: Default::default(),
            model: "gemini-2.5-flash".into(),
            messages: vec![
                Message::text(Role::System, "be brief"),
                Message {
                    role: Role::User,
                    content: vec![
                        ContentPart::Text {
                            text: "compare these".into(),
                        },
                        ContentPart::Image {
                            source: ImageSource::Base64 {
                                media_type: "image/png".into(),
                                data: "AAAA".into(),
                            },
                            detail: None,
                        },
                        ContentPart::Image {
                            source: ImageSource::Url {
                                url: "https://img.example.com/cat.WEBP?size=2".into(),
                            },
                            detail: Some("high".into()),
                        },
                        ContentPart::Image {
                            source: ImageSource::Url {
                                url: "https://img.example.com/photo".into(),
                            },
                            detail: None,
                        },
                    ],
                    tool_calls: vec![],
                    tool_call_id: None,
                    name: None,
                },
                Message::text(Role::Assistant, "Let me look."),
                assistant_calls(&[
                    ("c1", "lookup", "{\"q\":1}"),
                    ("c2", "weather", "{\"city\":\"Oslo\"}"),
                ]),
                tool_result("c1", None, "{\"found\":true}"),
                tool_result("c2", Some("weather"), "sunny"),
                Message::text(Role::User, "thanks"),
                Message::text(Role::System, "answer in English"),
            ],
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            max_tokens: Some(4000),
            seed: Some(7),
            stop: vec!["END".into()],
            tools: vec![
                ToolDefinition {
                    name: "lookup".into(),
                    description: Some("find".into()),
                    parameters: json!({"type": "object", "properties": {"q": {"type": "integer"}}, "additionalProperties": false}),
                    strict: Some(true),
                },
                ToolDefinition {
                    name: "weather".into(),
                    description: None,
                    parameters: json!({"type": "object"}),
                    strict: None,
                },
            ],
            tool_choice: Some(ToolChoice::Tool("lookup".into())),
            response_format: Some(ResponseFormat::JsonSchema {
                name: "r".into(),
                schema: json!({"type": "object", "properties": {"a": {"type": "string"}}}),
                strict: Some(true),
            }),
            thinking_budget: Some(2048),
            parallel_tool_calls: None,
            frequency_penalty: None,
            presence_penalty: None,
            vendor_tools: vec![VendorTool::WebSearch],
            stream_usage: true,
        }
    }

    #[test]
    fn maps_every_field() {
        let penalised = InferenceRequest {
            presence_penalty: Some(0.5),
            frequency_penalty: Some(1.5),
            ..request()
        };
        let wire = serde_json::to_value(to_wire(&penalised).unwrap()).unwrap();
        assert_eq!(wire["generationConfig"]["presencePenalty"], 0.5);
        assert_eq!(wire["generationConfig"]["frequencyPenalty"], 1.5);
        let wire = serde_json::to_value(to_wire(&request()).unwrap()).unwrap();
        assert_eq!(
            wire["systemInstruction"],
            json!({"parts": [{"text": "be brief\n\nanswer in English"}]})
        );
        let contents = wire["contents"].as_array().unwrap();
        // user, model (text + calls merged), user (both results + "thanks" merged)
        assert_eq!(contents.len(), 3);
        assert_eq!(
            contents[0],
            json!({"role": "user", "parts": [
                {"text": "compare these"},
                {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"fileData": {"mimeType": "image/webp", "fileUri": "https://img.example.com/cat.WEBP?size=2"}},
                {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://img.example.com/photo"}},
            ]})
        );
        assert_eq!(
            contents[1],
            json!({"role": "model", "parts": [
                {"text": "Let me look."},
                {"functionCall": {"name": "lookup", "args": {"q": 1}}},
                {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}},
            ]})
        );
        assert_eq!(
            contents[2],
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "lookup", "response": {"content": {"found": true}}}},
                {"functionResponse": {"name": "weather", "response": {"content": "sunny"}}},
                {"text": "thanks"},
            ]})
        );
        assert_eq!(
            wire["generationConfig"],
            json!({
                "temperature": 0.5, "topP": 0.9, "topK": 40, "maxOutputTokens": 4000, "seed": 7,
                "stopSequences": ["END"], "responseMimeType": "application/json",
                "responseJsonSchema": {"type": "object", "properties": {"a": {"type": "string"}}},
                "thinkingConfig": {"thinkingBudget": 2048},
            })
        );
        assert_eq!(
            wire["tools"],
            json!([
                {"functionDeclarations": [
                    {"name": "lookup", "description": "find", "parametersJsonSchema":
                        {"type": "object", "properties": {"q": {"type": "integer"}}, "additionalProperties": false}},
                    {"name": "weather", "parametersJsonSchema": {"type": "object"}},
                ]},
                {"googleSearch": {}},
            ])
        );
        assert_eq!(
            wire["toolConfig"],
            json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["lookup"]}})
        );
    }

    /// Gemini counts thinking in maxOutputTokens: the caller's cap is never raised, the budget
    /// fits under it, and with no room for the smallest budget no thinking is asked for.
    #[test]
    fn the_thinking_budget_fits_under_the_callers_max_tokens() {
        let generation = |max_tokens, thinking_budget| {
            let request = InferenceRequest {
                model: "gemini-2.5-flash".into(),
                messages: vec![Message::text(Role::User, "hi")],
                max_tokens,
                thinking_budget,
                ..Default::default()
            };
            serde_json::to_value(to_wire(&request).unwrap()).unwrap()["generationConfig"].clone()
        };
        assert_eq!(
            generation(Some(3000), Some(8192)),
            json!({"maxOutputTokens": 3000, "thinkingConfig": {"thinkingBudget": 2999}})
        );
        assert_eq!(
            generation(Some(1024), Some(8192)),
            json!({"maxOutputTokens": 1024, "thinkingConfig": {"thinkingBudget": 1023}})
        );
        assert_eq!(
            generation(Some(400), Some(8192)),
            json!({"maxOutputTokens": 400})
        );
        // A budget that fits is sent as asked (0 turns thinking off where a model allows it).
        assert_eq!(
            generation(Some(400), Some(0)),
            json!({"maxOutputTokens": 400, "thinkingConfig": {"thinkingBudget": 0}})
        );
        assert_eq!(
            generation(None, Some(24_576)),
            json!({"thinkingConfig": {"thinkingBudget": 24_576}})
        );
    }

    #[test]
    fn maps_tool_choices_and_json_mode() {
        let mut req = InferenceRequest {
            model: "gemini-2.5-pro".into(),
            messages: vec![Message::text(Role::User, "hi")],
            tools: request().tools,
            response_format: Some(ResponseFormat::JsonObject),
            ..Default::default()
        };
        for (choice, mode) in [
            (ToolChoice::Auto, "AUTO"),
            (ToolChoice::None, "NONE"),
            (ToolChoice::Required, "ANY"),
        ] {
            req.tool_choice = Some(choice);
            let wire = serde_json::to_value(to_wire(&req).unwrap()).unwrap();
            assert_eq!(
                wire["toolConfig"],
                json!({"functionCallingConfig": {"mode": mode}})
            );
            assert_eq!(
                wire["generationConfig"],
                json!({"responseMimeType": "application/json"})
            );
        }
        // Nothing optional set: no generationConfig, tools or system instruction at all.
        let bare = InferenceRequest {
            model: "gemini-2.5-pro".into(),
            messages: vec![Message::text(Role::User, "hi")],
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&bare).unwrap()).unwrap();
        assert_eq!(
            wire,
            json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
        );
    }

    #[test]
    fn tool_results_need_a_function_name() {
        // The name comes from the latest earlier call with that id.
        let req = InferenceRequest {
            model: "gemini-2.5-flash".into(),
            messages: vec![
                Message::text(Role::User, "go"),
                assistant_calls(&[("call_0", "first", "{}")]),
                tool_result("call_0", None, "1"),
                assistant_calls(&[("call_0", "second", "not json")]),
                tool_result("call_0", None, "2"),
            ],
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&req).unwrap()).unwrap();
        assert_eq!(
            wire["contents"][2]["parts"][0],
            json!({"functionResponse": {"name": "first", "response": {"content": 1}}})
        );
        assert_eq!(
            wire["contents"][3]["parts"][0],
            json!({"functionCall": {"name": "second", "args": {}}})
        );
        assert_eq!(
            wire["contents"][4]["parts"][0]["functionResponse"]["name"],
            "second"
        );

        let orphan = InferenceRequest {
            model: "gemini-2.5-flash".into(),
            messages: vec![tool_result("nowhere", None, "1")],
            ..Default::default()
        };
        let err = to_wire(&orphan).unwrap_err();
        assert!(err.contains("nowhere"), "{err}");
    }

    #[test]
    fn gemini_3_calls_carry_a_thought_signature() {
        let req = InferenceRequest {
            model: "gemini-3-pro-preview".into(),
            messages: vec![
                Message::text(Role::User, "go"),
                assistant_calls(&[("a", "f", "{}"), ("b", "g", "{}")]),
            ],
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&req).unwrap()).unwrap();
        let parts = &wire["contents"][1]["parts"];
        assert_eq!(parts[0]["thoughtSignature"], SKIP_SIGNATURE);
        assert!(parts[1].get("thoughtSignature").is_none());
        let older = InferenceRequest {
            model: "gemini-2.5-flash".into(),
            ..req
        };
        let wire = serde_json::to_value(to_wire(&older).unwrap()).unwrap();
        assert!(!needs_signature("gemma-3-27b-it"));
        assert!(needs_signature("gemini-flash-latest"));
        assert!(
            wire["contents"][1]["parts"][0]
                .get("thoughtSignature")
                .is_none()
        );
    }

    #[test]
    fn other_vendor_tools_are_unsupported_and_the_key_stays_out_of_the_url() {
        let provider = GeminiProvider::new(
            "google",
            "https://generativelanguage.googleapis.com/",
            SecretString::from("secret-key"),
            crate::http::ProviderClient::new(None).unwrap(),
            None,
        );
        for tool in [VendorTool::CodeInterpreter, VendorTool::WebSearch20250305] {
            let req = InferenceRequest {
                vendor_tools: vec![tool],
                ..Default::default()
            };
            assert!(matches!(
                provider.wire(&req),
                Err(ProviderError::Unsupported { .. })
            ));
        }
        assert_eq!(
            provider.endpoint("gemini-2.5-flash", false),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(
            provider.endpoint("models/gemini-2.5-flash", true),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            provider.endpoint("a/b?c", false),
            "https://generativelanguage.googleapis.com/v1beta/models/a%2Fb%3Fc:generateContent"
        );
        let body = provider.wire(&request()).unwrap();
        let built = provider
            .request("gemini-2.5-flash", true, &body)
            .build()
            .unwrap();
        assert_eq!(built.headers()["x-goog-api-key"], "secret-key");
        assert!(!built.url().as_str().contains("secret-key"));
    }

    #[test]
    fn reads_text_calls_usage_and_model() {
        let wire: GenerateContentResponse = serde_json::from_value(json!({
            "candidates": [{"index": 0, "finishReason": "STOP", "content": {"role": "model", "parts": [
                {"text": "pondering", "thought": true},
                {"text": "Hel"}, {"text": "lo"},
                {"functionCall": {"name": "lookup", "args": {"q": 1}}, "thoughtSignature": "c2ln"},
                {"functionCall": {"id": "given", "name": "weather"}},
            ]}}],
            "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 5, "thoughtsTokenCount": 3,
                              "cachedContentTokenCount": 4, "totalTokenCount": 20},
            "modelVersion": "gemini-2.5-flash-001", "responseId": "r"
        }))
        .unwrap();
        let r = from_wire(wire, "gemini-2.5-flash");
        assert_eq!(r.model, "gemini-2.5-flash-001");
        assert_eq!(r.text, "Hello");
        assert_eq!(
            r.tool_calls,
            vec![
                ToolCall {
                    id: "call_0".into(),
                    name: "lookup".into(),
                    arguments: "{\"q\":1}".into()
                },
                ToolCall {
                    id: "given".into(),
                    name: "weather".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 12,
                tokens_out: 8,
                reasoning_tokens: 3,
                cached_tokens: 4,
                web_search_calls: 0
            }
        );
    }

    #[test]
    fn reads_grounding_citations_and_search_count() {
        let wire: GenerateContentResponse = serde_json::from_value(json!({
            "candidates": [{"finishReason": "STOP", "content": {"role": "model", "parts": [{"text": "It rains."}]},
                "groundingMetadata": {
                    "webSearchQueries": ["weather oslo", "oslo forecast"],
                    "groundingChunks": [
                        {"web": {"uri": "https://a.example", "title": "a.example"}},
                        {"web": {"uri": "https://b.example"}},
                        {"web": {"uri": "https://a.example", "title": "a.example"}},
                        {"retrievedContext": {"uri": "gs://x"}},
                    ],
                    "groundingSupports": [{"segment": {"text": "It rains."}, "groundingChunkIndices": [0]}]
                }}],
            "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 3, "toolUsePromptTokenCount": 100}
        }))
        .unwrap();
        let r = from_wire(wire, "gemini-2.5-flash");
        assert_eq!(r.model, "gemini-2.5-flash");
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert_eq!(
            r.citations,
            vec![
                Citation {
                    url: "https://a.example".into(),
                    title: Some("a.example".into())
                },
                Citation {
                    url: "https://b.example".into(),
                    title: None
                },
            ]
        );
        assert_eq!(r.usage.web_search_calls, 2);
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (108, 3));
    }

    #[test]
    fn reads_blocks_and_finish_reasons() {
        let blocked: GenerateContentResponse = serde_json::from_value(json!({
            "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []},
            "usageMetadata": {"promptTokenCount": 6, "totalTokenCount": 6}
        }))
        .unwrap();
        let r = from_wire(blocked, "gemini-2.5-flash");
        assert_eq!(r.finish_reason, FinishReason::ContentFilter);
        assert_eq!(r.text, "");
        assert_eq!(r.usage.tokens_in, 6);

        let empty: GenerateContentResponse = serde_json::from_value(json!({})).unwrap();
        assert_eq!(from_wire(empty, "m").finish_reason, FinishReason::Stop);

        for (raw, expected) in [
            ("STOP", FinishReason::Stop),
            ("MAX_TOKENS", FinishReason::Length),
            ("SAFETY", FinishReason::ContentFilter),
            ("RECITATION", FinishReason::ContentFilter),
            ("PROHIBITED_CONTENT", FinishReason::ContentFilter),
            ("BLOCKLIST", FinishReason::ContentFilter),
            ("SPII", FinishReason::ContentFilter),
            ("MALFORMED_FUNCTION_CALL", FinishReason::Stop),
            ("UNEXPECTED_TOOL_CALL", FinishReason::Stop),
            ("TOO_MANY_TOOL_CALLS", FinishReason::Stop),
            ("LANGUAGE", FinishReason::Stop),
            ("OTHER", FinishReason::Stop),
            ("FINISH_REASON_UNSPECIFIED", FinishReason::Stop),
        ] {
            assert_eq!(finish_reason(raw), expected, "{raw}");
        }
        // A candidate cut by safety, with no content at all.
        let cut: GenerateContentResponse =
            serde_json::from_value(json!({"candidates": [{"finishReason": "SAFETY"}]})).unwrap();
        let r = from_wire(cut, "m");
        assert_eq!(
            (r.text.as_str(), r.finish_reason),
            ("", FinishReason::ContentFilter)
        );
    }

    fn assemble(chunks: Vec<Value>) -> InferenceResponse {
        let mut state = StreamState::default();
        let mut acc = ResponseAccumulator::new("gemini-2.5-flash");
        for chunk in chunks {
            let mut out = sse::Deltas::new();
            state.map(serde_json::from_value(chunk).unwrap(), &mut out);
            for delta in out {
                acc.push(&delta.unwrap());
            }
        }
        assert!(acc.is_finished());
        acc.finish()
    }

    #[test]
    fn stream_chunks_assemble() {
        let r = assemble(vec![
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "thinking", "thought": true}]}}],
                   "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9}}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}],
                   "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 1}}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "lo"}]}}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [
                {"functionCall": {"name": "lookup", "args": {"q": 1}}},
                {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}},
            ]}}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP"}],
                   "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 7, "thoughtsTokenCount": 2,
                                     "cachedContentTokenCount": 3},
                   "modelVersion": "gemini-2.5-flash-001"}),
        ]);
        assert_eq!(r.text, "Hello");
        assert_eq!(
            r.tool_calls,
            vec![
                ToolCall {
                    id: "call_0".into(),
                    name: "lookup".into(),
                    arguments: "{\"q\":1}".into()
                },
                ToolCall {
                    id: "call_1".into(),
                    name: "weather".into(),
                    arguments: "{\"city\":\"Oslo\"}".into()
                },
            ]
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 9,
                tokens_out: 9,
                reasoning_tokens: 2,
                cached_tokens: 3,
                web_search_calls: 0
            }
        );
        assert_eq!(r.model, "gemini-2.5-flash-001");
    }

    #[test]
    fn stream_grounding_counts_searches_once() {
        let grounding = json!({"webSearchQueries": ["q1"], "groundingChunks": [{"web": {"uri": "https://a.example", "title": "A"}}]});
        let r = assemble(vec![
            json!({"candidates": [{"content": {"parts": [{"text": "It "}]}}]}),
            json!({"candidates": [{"content": {"parts": [{"text": "rains."}]}, "groundingMetadata": grounding}]}),
            json!({"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP", "groundingMetadata": grounding}],
                   "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2}}),
        ]);
        assert_eq!(r.text, "It rains.");
        assert_eq!(
            r.citations,
            vec![Citation {
                url: "https://a.example".into(),
                title: Some("A".into())
            }]
        );
        assert_eq!(r.usage.web_search_calls, 1);
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (4, 2));
        assert_eq!(r.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn stream_blocks_and_errors() {
        let r = assemble(vec![json!({
            "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
            "usageMetadata": {"promptTokenCount": 5}
        })]);
        assert_eq!(r.finish_reason, FinishReason::ContentFilter);
        assert_eq!(r.text, "");
        assert_eq!(r.usage.tokens_in, 5);

        let chunk: GenerateContentResponse = serde_json::from_value(json!({
            "error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}
        }))
        .unwrap();
        let err = chunk.error.unwrap().into_provider_error("google");
        assert_eq!(err.status(), Some(429));
        assert!(err.is_retryable());
        assert!(err.to_string().contains("Resource exhausted"));
        let chunk: GenerateContentResponse = serde_json::from_value(json!({
            "error": {"message": "overloaded", "status": "UNAVAILABLE"}
        }))
        .unwrap();
        assert_eq!(
            chunk.error.unwrap().into_provider_error("google").status(),
            Some(503)
        );
    }

    /// Serves one canned HTTP response on a port of its own; yields the raw request received.
    fn serve_once(response: Vec<u8>) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut received = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = socket.read(&mut buf).unwrap();
                received.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&received).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(str::to_string)
                        })
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    if body.len() >= length {
                        break;
                    }
                }
                assert!(n > 0, "client closed early");
            }
            socket.write_all(&response).unwrap();
            String::from_utf8_lossy(&received).to_string()
        });
        (base, handle)
    }

    fn provider(base: &str) -> GeminiProvider {
        GeminiProvider::new(
            "google",
            base,
            SecretString::from("secret-key"),
            crate::http::ProviderClient::new(None).unwrap(),
            Some(Duration::from_secs(10)),
        )
    }

    fn simple(model: &str) -> InferenceRequest {
        InferenceRequest {
            model: model.into(),
            messages: vec![Message::text(Role::User, "hi")],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn streams_over_http() {
        let mut body = String::new();
        for chunk in [
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hé"}]}}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "llo"}]}, "finishReason": "STOP"}],
                   "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}}),
        ] {
            body.push_str(&format!("data: {chunk}\r\n\r\n"));
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (base, server) = serve_once(response.into_bytes());
        let mut stream = provider(&base)
            .infer_stream(&simple("gemini-2.5-flash"))
            .await
            .unwrap();
        let mut acc = ResponseAccumulator::new("gemini-2.5-flash");
        while let Some(delta) = stream.next().await {
            acc.push(&delta.unwrap());
        }
        let r = acc.finish();
        assert_eq!(r.text, "Héllo");
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (3, 2));
        let request = server.join().unwrap();
        assert!(
            request.starts_with(
                "POST /v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse HTTP/1.1"
            ),
            "{request}"
        );
        assert!(request.contains("x-goog-api-key: secret-key"), "{request}");
    }

    #[tokio::test]
    async fn stream_errors_after_the_status_are_errors() {
        let body = "data: {\"error\": {\"code\": 503, \"message\": \"overloaded\", \"status\": \"UNAVAILABLE\"}}\r\n\r\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (base, server) = serve_once(response.into_bytes());
        let mut stream = provider(&base)
            .infer_stream(&simple("gemini-2.5-flash"))
            .await
            .unwrap();
        let first = stream.next().await.unwrap();
        assert!(
            matches!(&first, Err(ProviderError::Status { status: 503, message, .. }) if message == "overloaded"),
            "{first:?}"
        );
        server.join().unwrap();
    }

    #[tokio::test]
    async fn http_errors_keep_geminis_message() {
        let body = r#"[{"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}]"#;
        let response = format!(
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 2\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (base, server) = serve_once(response.into_bytes());
        let err = provider(&base)
            .infer(&simple("gemini-2.5-flash"))
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(429));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
        assert!(err.to_string().contains("Quota exceeded"), "{err}");
        assert!(!err.to_string().contains("secret-key"));
        let request = server.join().unwrap();
        assert!(
            request.starts_with("POST /v1beta/models/gemini-2.5-flash:generateContent HTTP/1.1"),
            "{request}"
        );
    }

    #[test]
    fn guesses_image_types() {
        for (url, mime) in [
            ("https://x.example/a.png", "image/png"),
            ("https://x.example/dir.v2/a.JPG", "image/jpeg"),
            ("https://x.example/a.gif#frag", "image/gif"),
            ("https://x.example/a.heic?x=y.png", "image/heic"),
            ("https://x.example.png", "image/jpeg"),
            ("https://x.example/noext", "image/jpeg"),
        ] {
            assert_eq!(guess_mime_type(url), mime, "{url}");
        }
    }

    /// A chunk that shows nothing (a thought, empty text) still names the model and usage, but
    /// yields nothing: a stream is served (no fallback, no first-token timeout) once its first
    /// delta arrives, so an error or a stall after such a chunk is a failure before the first
    /// token. The model and usage come with the first text, call or finish, model first.
    #[tokio::test]
    async fn nothing_is_yielded_before_the_answer_begins() {
        let body = |chunks: &[Value]| {
            let text: String = chunks
                .iter()
                .map(|c| format!("data: {c}\r\n\r\n"))
                .collect();
            futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(text))])
        };
        let quiet = [
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "hmm", "thought": true}]}}],
                   "usageMetadata": {"promptTokenCount": 9}, "modelVersion": "gemini-2.5-flash-001"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}}],
                   "usageMetadata": {"promptTokenCount": 9}, "modelVersion": "gemini-2.5-flash-001"}),
        ];
        let error =
            json!({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}});
        let items: Vec<_> = deltas("google", body(&[quiet[0].clone(), quiet[1].clone(), error]))
            .collect()
            .await;
        match &items[..] {
            [Err(error @ ProviderError::Status { status: 503, .. })] => {
                assert!(error.is_retryable());
            }
            other => panic!("expected the error alone, got {other:?}"),
        }

        let stalled = body(&quiet).chain(futures::stream::pending());
        let mut stalled = deltas("google", stalled);
        let first = tokio::time::timeout(Duration::from_millis(50), stalled.next()).await;
        assert!(first.is_err(), "a chunk without content yielded {first:?}");

        let text = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]}}],
                          "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 1},
                          "modelVersion": "gemini-2.5-flash-001"});
        let items: Vec<_> = deltas("google", body(&[quiet[0].clone(), text]))
            .collect()
            .await;
        assert_eq!(
            items[..3],
            [
                Ok(StreamDelta::Model("gemini-2.5-flash-001".into())),
                Ok(StreamDelta::Usage(Usage {
                    tokens_in: 9,
                    ..Usage::default()
                })),
                Ok(StreamDelta::Text("Hi".into())),
            ]
        );
    }
}
