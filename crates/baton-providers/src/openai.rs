//! OpenAI Chat Completions: `openai`, `azure` (deployment URL, `api-version`, `api-key` header),
//! `mistral`, `deepseek`, and operator-declared compatible servers. Wire types sit next to the
//! mapping; nothing outside this module sees them.

use std::time::Duration;

use async_trait::async_trait;
use baton_domain::chat::{
    Citation, ContentPart, FinishReason, InferenceRequest, InferenceResponse, Message,
    ResponseFormat, Role, StreamDelta, ToolCall, ToolChoice, Usage,
};
use bytes::Bytes;
use futures::Stream;
use secrecy::{ExposeSecret, SecretString};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{ProviderError, ProviderResult};
use crate::provider::{DeltaStream, Provider};
use crate::sse::{self, Deltas, HeldUntilContent};
use crate::{http, openai_responses};

/// How this server differs from OpenAI's own API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Azure { api_version: String },
    Mistral,
    DeepSeek,
    Compatible,
}

pub const AZURE_DEFAULT_API_VERSION: &str = "2024-10-21";

pub struct OpenAiProvider {
    key: String,
    flavor: Flavor,
    base_url: String,
    /// `{base_url}/chat/completions` (every flavor but Azure, whose URL names the model).
    chat_url: http::FixedUrl,
    api_key: Option<SecretString>,
    client: http::ProviderClient,
    timeout: Option<Duration>,
}

impl OpenAiProvider {
    pub fn new(
        key: impl Into<String>,
        flavor: Flavor,
        base_url: impl Into<String>,
        api_key: Option<SecretString>,
        client: impl Into<http::ProviderClient>,
        timeout: Option<Duration>,
    ) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        Self {
            key: key.into(),
            flavor,
            chat_url: http::FixedUrl::new(format!("{base_url}/chat/completions")),
            base_url,
            api_key,
            client: client.into(),
            timeout,
        }
    }

    fn post(&self, model: &str) -> reqwest::RequestBuilder {
        match &self.flavor {
            Flavor::Azure { api_version } => self.client.get().post(format!(
                "{}/openai/deployments/{}/chat/completions?api-version={api_version}",
                self.base_url,
                url::form_urlencoded::byte_serialize(model.as_bytes()).collect::<String>()
            )),
            _ => self.chat_url.post(self.client.get()),
        }
    }

    fn request(&self, model: &str, body: &ChatRequest<'_>) -> reqwest::RequestBuilder {
        let mut builder = self.post(model).json(body);
        if let Some(key) = &self.api_key {
            builder = match self.flavor {
                Flavor::Azure { .. } => builder.header("api-key", key.expose_secret()),
                _ => builder.bearer_auth(key.expose_secret()),
            };
        }
        builder
    }

    /// Vendor tools run only on OpenAI's and Azure's Responses API.
    fn responses(&self, request: &InferenceRequest) -> Option<openai_responses::Endpoint<'_>> {
        let azure = matches!(self.flavor, Flavor::Azure { .. });
        (!request.vendor_tools.is_empty() && (azure || self.flavor == Flavor::OpenAi)).then(|| {
            openai_responses::Endpoint {
                provider: &self.key,
                base_url: &self.base_url,
                azure,
                api_key: self.api_key.as_ref(),
                client: &self.client,
                timeout: self.timeout,
            }
        })
    }

    fn check(&self, request: &InferenceRequest) -> ProviderResult<()> {
        if let Some(tool) = request.vendor_tools.first() {
            return Err(ProviderError::Unsupported {
                provider: self.key.clone(),
                what: format!(
                    "the vendor tool '{}' on the Chat Completions API",
                    tool.as_str()
                ),
                field: Some("vendor_tools"),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn key(&self) -> &str {
        &self.key
    }

    async fn infer(&self, request: &InferenceRequest) -> ProviderResult<InferenceResponse> {
        if let Some(endpoint) = self.responses(request) {
            return endpoint.infer(request).await;
        }
        self.check(request)?;
        let body = to_wire(request, &self.flavor, false);
        let wire: ChatResponse = http::send_json(
            &self.client,
            &self.key,
            &request.model,
            self.request(&request.model, &body),
            self.timeout,
        )
        .await?;
        Ok(from_wire(wire, &request.model))
    }

    async fn infer_stream(&self, request: &InferenceRequest) -> ProviderResult<DeltaStream> {
        if let Some(endpoint) = self.responses(request) {
            return endpoint.infer_stream(request).await;
        }
        self.check(request)?;
        let body = to_wire(request, &self.flavor, true);
        http::stream(
            &self.client,
            &self.key,
            &request.model,
            self.request(&request.model, &body),
            self.timeout,
            |response| deltas(&self.key, response.bytes_stream()),
        )
        .await
    }
}

/// Canonical deltas of a Chat Completions SSE body: the HTTP response's, or any byte stream
/// (benchmarks drive it from memory).
pub(crate) fn deltas<S, E>(provider: &str, bytes: S) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let name = provider.to_string();
    let mut state = StreamState::default();
    sse::deltas(provider, bytes, move |data, out| {
        if data.trim() == "[DONE]" {
            return;
        }
        match serde_json::from_str::<ChatChunk>(data) {
            // Compatible servers report mid-stream failures as an error object.
            Ok(ChatChunk {
                error: Some(error), ..
            }) => out.push_back(Err(stream_error(&name, &error))),
            Ok(chunk) => state.map(chunk, out),
            Err(err) => out.push_back(Err(match serde_json::from_str::<Value>(data) {
                Ok(value) if value.get("error").is_some() => stream_error(&name, &value["error"]),
                _ => ProviderError::InvalidResponse {
                    provider: name.clone(),
                    message: format!("unreadable stream chunk: {err}"),
                },
            })),
        }
    })
}

/// An error object sent inside a stream (`{"error": {"message": ...}}` or `{"error": "..."}`).
fn stream_error(provider: &str, error: &Value) -> ProviderError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("stream error");
    ProviderError::Status {
        provider: provider.to_string(),
        status: 502,
        message: message.to_string(),
        retry_after: None,
    }
}

// ---- Wire types: request -------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub(crate) struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    /// Mistral's name for `seed` (it refuses `seed` as an extra field, 422).
    #[serde(skip_serializing_if = "Option::is_none")]
    random_seed: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    /// The client's OpenAI-only fields (OpenAI and Azure; other compatible servers may refuse
    /// fields they do not know).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    openai_options: Option<&'a Map<String, Value>>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireMessage {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    tool_calls: Vec<WireToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    function: WireFunctionCall,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireFunctionCall {
    name: String,
    arguments: String,
}

#[derive(Debug, Serialize)]
struct WireTool {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction,
}

#[derive(Debug, Serialize)]
struct WireFunction {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    parameters: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn content_value(message: &Message) -> Option<Value> {
    let only_text = message
        .content
        .iter()
        .all(|p| matches!(p, ContentPart::Text { .. }));
    if message.content.is_empty() {
        return None;
    }
    if only_text {
        return Some(Value::String(message.joined_text()));
    }
    let parts = message
        .content
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => serde_json::json!({"type": "text", "text": text}),
            ContentPart::Image { source, detail } => {
                let mut image = serde_json::json!({"url": source.to_url()});
                if let Some(detail) = detail {
                    image["detail"] = Value::String(detail.clone());
                }
                serde_json::json!({"type": "image_url", "image_url": image})
            }
        })
        .collect();
    Some(Value::Array(parts))
}

pub(crate) fn to_wire<'a>(
    request: &'a InferenceRequest,
    flavor: &Flavor,
    stream: bool,
) -> ChatRequest<'a> {
    let mut messages: Vec<WireMessage> = request
        .messages
        .iter()
        .map(|m| WireMessage {
            role: role_name(m.role),
            content: content_value(m)
                .or_else(|| (m.role != Role::Assistant).then(|| Value::String(String::new()))),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| WireToolCall {
                    id: c.id.clone(),
                    kind: "function".into(),
                    function: WireFunctionCall {
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                })
                .collect(),
            tool_call_id: m.tool_call_id.clone(),
            name: m.name.clone(),
        })
        .collect();
    let tools = request
        .tools
        .iter()
        .map(|t| WireTool {
            kind: "function",
            function: WireFunction {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
                strict: t.strict,
            },
        })
        .collect();
    let tool_choice = request.tool_choice.as_ref().map(|choice| match choice {
        ToolChoice::Auto => Value::from("auto"),
        ToolChoice::None => Value::from("none"),
        // Mistral spells "required" as "any".
        ToolChoice::Required if *flavor == Flavor::Mistral => Value::from("any"),
        ToolChoice::Required => Value::from("required"),
        ToolChoice::Tool(name) => {
            serde_json::json!({"type": "function", "function": {"name": name}})
        }
    });
    if *flavor == Flavor::Mistral {
        mistral_tool_call_ids(&mut messages);
    }
    if *flavor == Flavor::DeepSeek
        && let Some(instruction) = deepseek_json_instruction(request)
    {
        // After the caller's own leading system messages, before the conversation.
        let at = messages
            .iter()
            .position(|m| m.role != "system")
            .unwrap_or(messages.len());
        messages.insert(
            at,
            WireMessage {
                role: "system",
                content: Some(Value::String(instruction)),
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            },
        );
    }
    let response_format = request.response_format.as_ref().map(|format| match format {
        // DeepSeek has JSON output (`json_object`) but no `json_schema`: the schema goes into
        // the prompt, and Baton checks the answer against it afterwards.
        ResponseFormat::JsonSchema { .. } if *flavor == Flavor::DeepSeek => {
            serde_json::json!({"type": "json_object"})
        }
        ResponseFormat::Text => serde_json::json!({"type": "text"}),
        ResponseFormat::JsonObject => serde_json::json!({"type": "json_object"}),
        ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
        } => serde_json::json!({
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": strict.unwrap_or(false)}
        }),
    });
    // OpenAI's reasoning models refuse `max_tokens`; the others know only `max_tokens`.
    let modern = matches!(flavor, Flavor::OpenAi | Flavor::Azure { .. });
    let reasoning_effort = request
        .thinking_budget
        .filter(|_| modern)
        .map(|budget| match budget {
            0..=2048 => "low",
            2049..=8192 => "medium",
            _ => "high",
        });
    ChatRequest {
        model: &request.model,
        messages,
        temperature: request.temperature,
        top_p: request.top_p,
        max_tokens: request.max_tokens.filter(|_| !modern),
        max_completion_tokens: request.max_tokens.filter(|_| modern),
        seed: request.seed.filter(|_| *flavor != Flavor::Mistral),
        random_seed: request.seed.filter(|_| *flavor == Flavor::Mistral),
        stop: request.stop.clone(),
        // OpenAI refuses `parallel_tool_calls` on a request without tools.
        parallel_tool_calls: request
            .parallel_tool_calls
            .filter(|_| !request.tools.is_empty()),
        tools,
        tool_choice,
        response_format,
        reasoning_effort,
        frequency_penalty: request.frequency_penalty,
        presence_penalty: request.presence_penalty,
        stream,
        // Mistral always reports usage on the last chunk and rejects the option.
        stream_options: (stream && *flavor != Flavor::Mistral).then_some(StreamOptions {
            include_usage: true,
        }),
        openai_options: (modern && !request.openai_options.is_empty())
            .then_some(&request.openai_options),
    }
}

/// Whether Mistral takes `id` as a tool-call id: exactly 9 characters of `[a-zA-Z0-9]`.
fn is_mistral_tool_call_id(id: &str) -> bool {
    id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Mistral refuses (400) tool-call ids that are not 9 alphanumerics, which a history carries
/// when another provider made the calls (`toolu_...`, `call_0`). Each such id, in the calls
/// and in the results answering them, becomes one derived from it (FNV-1a, base 62), so a
/// call and its result still match; ids Mistral takes stay as they are, and a derived id
/// that meets one already used is derived again.
fn mistral_tool_call_ids(messages: &mut [WireMessage]) {
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut used: std::collections::HashSet<String> = messages
        .iter()
        .flat_map(|m| {
            m.tool_calls
                .iter()
                .map(|c| c.id.as_str())
                .chain(m.tool_call_id.as_deref())
        })
        .filter(|id| is_mistral_tool_call_id(id))
        .map(str::to_string)
        .collect();
    let mut mapped: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut map = |id: &mut String| {
        if is_mistral_tool_call_id(id) {
            return;
        }
        if let Some(new) = mapped.get(id.as_str()) {
            id.clone_from(new);
            return;
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut derive = |bytes: &[u8]| {
            for &b in bytes {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
            let mut rest = hash;
            let mut out = String::with_capacity(9);
            for _ in 0..9 {
                out.push(char::from(ALPHABET[(rest % 62) as usize]));
                rest /= 62;
            }
            out
        };
        let mut new = derive(id.as_bytes());
        while used.contains(&new) {
            new = derive(b"+");
        }
        used.insert(new.clone());
        mapped.insert(std::mem::replace(id, new.clone()), new);
    };
    for message in messages.iter_mut() {
        for call in &mut message.tool_calls {
            map(&mut call.id);
        }
        if let Some(id) = &mut message.tool_call_id {
            map(id);
        }
    }
}

/// The system instruction DeepSeek's JSON output needs: its prompt must contain the word
/// "json" (the request is refused otherwise), and `json_schema` is not supported, so a
/// schema is given as text. None when JSON is not asked for, or already mentioned.
fn deepseek_json_instruction(request: &InferenceRequest) -> Option<String> {
    match &request.response_format {
        Some(ResponseFormat::JsonSchema { schema, .. }) => Some(format!(
            "Answer with JSON only, matching this JSON Schema: {schema}"
        )),
        Some(ResponseFormat::JsonObject) => {
            let mentioned = request.messages.iter().any(|m| {
                matches!(m.role, Role::System | Role::User)
                    && m.joined_text().to_ascii_lowercase().contains("json")
            });
            (!mentioned).then(|| "Answer with a JSON object only.".to_string())
        }
        _ => None,
    }
}

// ---- Wire types: response ------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(crate) struct ChatResponse {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    message: ResponseMessage,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ResponseMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    annotations: Vec<Annotation>,
}

#[derive(Debug, Deserialize)]
struct Annotation {
    #[serde(default)]
    url_citation: Option<UrlCitation>,
}

#[derive(Debug, Deserialize)]
struct UrlCitation {
    url: String,
    #[serde(default)]
    title: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek reports cache hits here.
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn canonical(&self) -> Usage {
        Usage {
            tokens_in: self.prompt_tokens,
            tokens_out: self.completion_tokens,
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            cached_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens)
                .unwrap_or(0),
            web_search_calls: 0,
        }
    }
}

pub(crate) fn finish_reason(raw: &str) -> FinishReason {
    match raw {
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        // What clients are given is OpenAI's set, which has no error (some compatible servers
        // send one): anything else ended the answer, `stop`.
        _ => FinishReason::Stop,
    }
}

fn text_of(content: &Option<Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        // Some compatible servers (Mistral) answer with content parts.
        Some(Value::Array(parts)) => parts.iter().filter_map(part_text).collect(),
        _ => String::new(),
    }
}

/// The text of one content part (none for a part that is not text).
fn part_text(part: &Value) -> Option<&str> {
    part.get("text").and_then(Value::as_str)
}

pub(crate) fn from_wire(wire: ChatResponse, requested_model: &str) -> InferenceResponse {
    let usage = wire
        .usage
        .as_ref()
        .map(WireUsage::canonical)
        .unwrap_or_default();
    let model = wire.model.unwrap_or_else(|| requested_model.to_string());
    let Some(choice) = wire.choices.into_iter().next() else {
        // An empty answer: OpenAI's finish reasons have no error.
        return InferenceResponse {
            model,
            usage,
            finish_reason: FinishReason::Stop,
            ..Default::default()
        };
    };
    let text = text_of(&choice.message.content);
    let citations = choice
        .message
        .annotations
        .into_iter()
        .filter_map(|a| a.url_citation)
        .map(|c| Citation {
            url: c.url,
            title: c.title,
        })
        .collect();
    InferenceResponse {
        discarded: Vec::new(),
        model,
        text,
        tool_calls: choice
            .message
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.function.name,
                arguments: c.function.arguments,
            })
            .collect(),
        finish_reason: choice
            .finish_reason
            .as_deref()
            .map(finish_reason)
            .unwrap_or_default(),
        usage,
        citations,
        // Kept apart from the text, as OpenAI sends it: a refusal is no answer to validate.
        refusal: choice.message.refusal.filter(|r| !r.is_empty()),
    }
}

// ---- Wire types: stream --------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(crate) struct ChatChunk<'a> {
    /// Every chunk repeats the model; it is read once a stream, so it stays raw (borrowed)
    /// until then.
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    /// Only the first choice is used (Baton asks for one).
    #[serde(default, rename = "choices", deserialize_with = "first_choice")]
    choice: Option<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    /// Every field above is optional, so an error object would read as an empty chunk.
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: ChunkDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: DeltaText,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ChunkToolCall>,
}

#[derive(Debug, Deserialize)]
struct ChunkToolCall {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<ChunkFunction>,
}

#[derive(Debug, Deserialize)]
struct ChunkFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// Per-stream state: which tool-call indices have been announced, whether the model was, and
/// what is held until the answer begins.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    announced: Vec<u32>,
    model_reported: bool,
    held: HeldUntilContent,
}

impl StreamState {
    /// Pushes the deltas `chunk` stands for. The role chunk that opens a stream names the model
    /// but says nothing: the model (and any usage before the answer) goes out with the first
    /// content, tool call or finish, so an error or a stall right after the role chunk is still
    /// a failure before the first token.
    pub(crate) fn map(&mut self, chunk: ChatChunk<'_>, out: &mut Deltas) {
        let from = out.len();
        self.map_chunk(chunk, out);
        self.held.settle(out, from);
    }

    fn map_chunk(&mut self, chunk: ChatChunk<'_>, out: &mut Deltas) {
        let mut push = |delta| out.push_back(Ok(delta));
        if !self.model_reported
            && let Some(model) = chunk
                .model
                .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
                .filter(|m| !m.is_empty())
        {
            self.model_reported = true;
            push(StreamDelta::Model(model));
        }
        if let Some(choice) = chunk.choice {
            let DeltaText(text) = choice.delta.content;
            if !text.is_empty() {
                push(StreamDelta::Text(text));
            }
            if let Some(refusal) = choice.delta.refusal.filter(|r| !r.is_empty()) {
                push(StreamDelta::Refusal(refusal));
            }
            for (position, call) in choice.delta.tool_calls.into_iter().enumerate() {
                let index = call.index.unwrap_or(position as u32);
                let (name, arguments) = match call.function {
                    Some(f) => (f.name, f.arguments),
                    None => (None, None),
                };
                if !self.announced.contains(&index)
                    && let Some(name) = name
                {
                    self.announced.push(index);
                    push(StreamDelta::ToolCallStart {
                        index,
                        id: call.id.unwrap_or_else(|| format!("call_{index}")),
                        name,
                    });
                }
                if let Some(fragment) = arguments.filter(|a| !a.is_empty()) {
                    push(StreamDelta::ToolCallArguments { index, fragment });
                }
            }
            if let Some(reason) = choice.finish_reason {
                push(StreamDelta::Finish(finish_reason(&reason)));
            }
        }
        if let Some(usage) = chunk.usage {
            push(StreamDelta::Usage(usage.canonical()));
        }
    }
}

/// The first element of `choices` (absent when the array is empty); the rest are skipped
/// without being built.
fn first_choice<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ChunkChoice>, D::Error> {
    struct First;
    impl<'de> Visitor<'de> for First {
        type Value = Option<ChunkChoice>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of choices")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    deserializer.deserialize_seq(First)
}

/// A delta's `content` read straight into its text: a string, or (some compatible servers:
/// Mistral) an array of parts whose texts are joined; anything else is no text, as in a
/// complete answer ([`text_of`]). A `Value` and a copy of its string were two allocations a
/// chunk.
#[derive(Debug, Default)]
struct DeltaText(String);

impl<'de> Deserialize<'de> for DeltaText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = DeltaText;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of content parts")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<DeltaText, E> {
                Ok(DeltaText(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<DeltaText, E> {
                Ok(DeltaText(text))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut parts: A) -> Result<DeltaText, A::Error> {
                let mut text = String::new();
                while let Some(part) = parts.next_element::<Value>()? {
                    text.extend(part_text(&part));
                }
                Ok(DeltaText(text))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DeltaText, A::Error> {
                IgnoredAny.visit_map(map)?;
                Ok(DeltaText::default())
            }

            fn visit_unit<E: de::Error>(self) -> Result<DeltaText, E> {
                Ok(DeltaText::default())
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<DeltaText, E> {
                Ok(DeltaText::default())
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<DeltaText, E> {
                Ok(DeltaText::default())
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<DeltaText, E> {
                Ok(DeltaText::default())
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<DeltaText, E> {
                Ok(DeltaText::default())
            }
        }
        deserializer.deserialize_any(Text)
    }
}

#[cfg(test)]
mod tests {
    use baton_domain::chat::{ImageSource, ResponseAccumulator, ToolDefinition};
    use serde_json::json;

    use super::*;

    fn request() -> InferenceRequest {
        InferenceRequest {
            model: "gpt-4o-mini".into(),
            messages: vec![
                Message::text(Role::System, "be brief"),
                Message {
                    role: Role::User,
                    content: vec![
                        ContentPart::Text {
                            text: "what is this?".into(),
                        },
                        ContentPart::Image {
                            source: ImageSource::Base64 {
                                media_type: "image/png".into(),
                                data: "AAAA".into(),
                            },
                            detail: None,
                        },
                    ],
                    tool_calls: vec![],
                    tool_call_id: None,
                    name: None,
                },
            ],
            temperature: Some(0.5),
            max_tokens: Some(100),
            seed: Some(7),
            tools: vec![ToolDefinition {
                name: "lookup".into(),
                description: Some("find".into()),
                parameters: json!({"type": "object"}),
                strict: None,
            }],
            tool_choice: Some(ToolChoice::Required),
            response_format: Some(ResponseFormat::JsonSchema {
                name: "r".into(),
                schema: json!({"type": "object"}),
                strict: None,
            }),
            ..Default::default()
        }
    }

    /// One call a turn and the repetition penalties reach every OpenAI-format provider;
    /// `parallel_tool_calls` only with tools (OpenAI refuses it without).
    #[test]
    fn sends_parallel_tool_calls_with_tools_and_the_penalties() {
        let mut req = InferenceRequest {
            parallel_tool_calls: Some(false),
            frequency_penalty: Some(0.5),
            presence_penalty: Some(-1.0),
            thinking_budget: Some(24_576),
            ..request()
        };
        let wire = serde_json::to_value(to_wire(&req, &Flavor::OpenAi, false)).unwrap();
        assert_eq!(wire["parallel_tool_calls"], false);
        assert_eq!(
            (&wire["frequency_penalty"], &wire["presence_penalty"]),
            (&json!(0.5), &json!(-1.0))
        );
        assert_eq!(wire["reasoning_effort"], "high");
        req.tools.clear();
        req.tool_choice = None;
        let wire = serde_json::to_value(to_wire(&req, &Flavor::OpenAi, false)).unwrap();
        assert!(wire.get("parallel_tool_calls").is_none(), "{wire}");
    }

    #[test]
    fn openai_options_go_to_openai_and_azure_only() {
        let mut req = request();
        req.openai_options = json!({"service_tier": "flex", "prompt_cache_key": "k1",
                                    "metadata": {"team": "search"}})
        .as_object()
        .cloned()
        .unwrap();
        let azure = Flavor::Azure {
            api_version: AZURE_DEFAULT_API_VERSION.into(),
        };
        for flavor in [Flavor::OpenAi, azure] {
            let wire = serde_json::to_value(to_wire(&req, &flavor, true)).unwrap();
            assert_eq!(wire["service_tier"], "flex", "{flavor:?}");
            assert_eq!(wire["prompt_cache_key"], "k1");
            assert_eq!(wire["metadata"]["team"], "search");
            assert_eq!(wire["stream"], true, "the named fields are kept");
        }
        for flavor in [Flavor::Mistral, Flavor::DeepSeek, Flavor::Compatible] {
            let wire = serde_json::to_value(to_wire(&req, &flavor, false)).unwrap();
            assert!(wire.get("service_tier").is_none(), "{flavor:?}: {wire}");
        }
    }

    #[test]
    fn maps_every_field_per_flavor() {
        let req = request();
        let openai = serde_json::to_value(to_wire(&req, &Flavor::OpenAi, true)).unwrap();
        assert_eq!(openai["max_completion_tokens"], 100);
        assert!(openai.get("max_tokens").is_none());
        assert_eq!(openai["tool_choice"], "required");
        assert_eq!(
            openai["messages"][1]["content"][1]["image_url"]["url"],
            "data:image/png;base64,AAAA"
        );
        assert_eq!(openai["messages"][0]["content"], "be brief");
        assert_eq!(openai["response_format"]["json_schema"]["name"], "r");
        assert_eq!(openai["stream_options"]["include_usage"], true);
        assert_eq!(openai["tools"][0]["function"]["name"], "lookup");

        assert!(openai.get("random_seed").is_none());
        assert_eq!(openai["seed"], 7);

        let mistral = serde_json::to_value(to_wire(&req, &Flavor::Mistral, true)).unwrap();
        // Mistral's request schema forbids extra fields; its seed is `random_seed`.
        assert_eq!(mistral["random_seed"], 7);
        assert!(mistral.get("seed").is_none());
        assert_eq!(mistral["max_tokens"], 100);
        assert_eq!(mistral["tool_choice"], "any");
        assert!(mistral.get("stream_options").is_none());
    }

    /// Mistral: tool-call ids must be 9 characters of `[a-zA-Z0-9]`.
    #[test]
    fn mistral_tool_call_ids_are_nine_alphanumerics_and_still_pair_up() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "lookup".into(),
            arguments: "{}".into(),
        };
        let result = |id: &str| Message {
            tool_call_id: Some(id.into()),
            ..Message::text(Role::Tool, "42")
        };
        let req = InferenceRequest {
            model: "mistral-small-latest".into(),
            messages: vec![
                Message::text(Role::User, "hi"),
                Message {
                    role: Role::Assistant,
                    content: vec![],
                    tool_calls: vec![
                        call("toolu_01A09q90qw90lq917835lq9"),
                        call("call_0"),
                        call("D681PevKs"),
                    ],
                    tool_call_id: None,
                    name: None,
                },
                result("toolu_01A09q90qw90lq917835lq9"),
                result("call_0"),
                result("D681PevKs"),
            ],
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&req, &Flavor::Mistral, false)).unwrap();
        let calls: Vec<&str> = wire["messages"][1]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
        let results: Vec<&str> = (2..5)
            .map(|i| wire["messages"][i]["tool_call_id"].as_str().unwrap())
            .collect();
        assert_eq!(calls, results, "each result still names its call");
        assert_eq!(calls[2], "D681PevKs", "an id Mistral takes is kept");
        for id in &calls {
            assert!(is_mistral_tool_call_id(id), "{id}");
        }
        assert_ne!(calls[0], calls[1]);
        // The same history maps the same way.
        let again = serde_json::to_value(to_wire(&req, &Flavor::Mistral, false)).unwrap();
        assert_eq!(again["messages"], wire["messages"]);
        // Other flavors send the ids as they are.
        let openai = serde_json::to_value(to_wire(&req, &Flavor::OpenAi, false)).unwrap();
        assert_eq!(openai["messages"][3]["tool_call_id"], "call_0");
    }

    /// DeepSeek's JSON output: `response_format` `{"type": "json_object"}` only, and the
    /// word "json" in the system or user prompt.
    #[test]
    fn deepseek_gets_json_object_and_the_schema_in_a_system_instruction() {
        let req = request();
        let wire = serde_json::to_value(to_wire(&req, &Flavor::DeepSeek, false)).unwrap();
        assert_eq!(wire["response_format"], json!({"type": "json_object"}));
        let messages = wire["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[0]["content"], "be brief");
        assert_eq!(messages[1]["role"], "system");
        assert_eq!(
            messages[1]["content"],
            r#"Answer with JSON only, matching this JSON Schema: {"type":"object"}"#
        );
        assert_eq!(messages[2]["role"], "user");
        // Other flavors keep json_schema and the caller's messages.
        let openai = serde_json::to_value(to_wire(&req, &Flavor::OpenAi, false)).unwrap();
        assert_eq!(openai["response_format"]["type"], "json_schema");
        assert_eq!(openai["messages"].as_array().unwrap().len(), 2);

        // json_object: an instruction only when no prompt says "json" yet.
        let mut object = InferenceRequest {
            model: "deepseek-chat".into(),
            messages: vec![Message::text(Role::User, "list three colours")],
            response_format: Some(ResponseFormat::JsonObject),
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&object, &Flavor::DeepSeek, false)).unwrap();
        assert_eq!(wire["response_format"], json!({"type": "json_object"}));
        assert_eq!(wire["messages"][0]["role"], "system");
        assert!(
            wire["messages"][0]["content"]
                .as_str()
                .unwrap()
                .contains("JSON")
        );
        object.messages = vec![Message::text(Role::User, "list three colours as Json")];
        let wire = serde_json::to_value(to_wire(&object, &Flavor::DeepSeek, false)).unwrap();
        assert_eq!(wire["messages"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn reads_responses_with_tool_calls_usage_and_citations() {
        let wire: ChatResponse = serde_json::from_value(json!({
            "id": "x", "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":1}"}}],
                "annotations": [{"type": "url_citation", "url_citation": {"url": "https://a.example", "title": "A"}}]}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4},
                      "completion_tokens_details": {"reasoning_tokens": 2}}
        }))
        .unwrap();
        let r = from_wire(wire, "gpt-4o-mini");
        assert_eq!(r.model, "gpt-4o-mini-2024-07-18");
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].arguments, "{\"q\":1}");
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 12,
                tokens_out: 5,
                reasoning_tokens: 2,
                cached_tokens: 4,
                web_search_calls: 0
            }
        );
        assert_eq!(r.citations[0].url, "https://a.example");
    }

    #[test]
    fn stream_chunks_assemble() {
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": "Hi"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}),
        ];
        let mut state = StreamState::default();
        let mut acc = ResponseAccumulator::new("m");
        for chunk in chunks {
            let mut out = Deltas::new();
            let text = chunk.to_string();
            state.map(serde_json::from_str(&text).unwrap(), &mut out);
            for delta in out {
                acc.push(&delta.unwrap());
            }
        }
        let r = acc.finish();
        assert_eq!(r.text, "Hi");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "c1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":1}".into()
            }]
        );
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (3, 7));
        assert_eq!(r.model, "m", "no chunk named a model");
    }

    /// Every chunk repeats the served model; the stream reports it once, escapes read.
    #[test]
    fn stream_reports_the_served_model_once() {
        let mut state = StreamState::default();
        let mut models = Vec::new();
        for chunk in [
            r#"{"model": "org\/llama-3", "choices": [{"delta": {"role": "assistant"}}]}"#,
            r#"{"model": "org/llama-3", "choices": [{"delta": {"content": "Hi"}}]}"#,
            r#"{"model": "other", "choices": [{"delta": {}, "finish_reason": "stop"}]}"#,
        ] {
            let mut out = Deltas::new();
            state.map(serde_json::from_str(chunk).unwrap(), &mut out);
            models.extend(out.into_iter().filter_map(|delta| match delta.unwrap() {
                StreamDelta::Model(model) => Some(model),
                _ => None,
            }));
        }
        assert_eq!(models, ["org/llama-3"]);
        let mut out = Deltas::new();
        StreamState::default().map(serde_json::from_str(r#"{"model": ""}"#).unwrap(), &mut out);
        assert!(out.is_empty(), "an empty name is no report");
    }

    /// A delta's content as the wire may carry it: a string, content parts (Mistral), or
    /// something that is no text; only the first choice counts.
    #[test]
    fn stream_content_in_every_shape_and_only_the_first_choice() {
        // Parsed from text, as a stream's chunks are (escapes and borrowed strings included).
        let text_of_chunk = |chunk: &str| {
            let mut out = Deltas::new();
            StreamState::default().map(serde_json::from_str(chunk).unwrap(), &mut out);
            out.into_iter()
                .map(|delta| match delta.unwrap() {
                    StreamDelta::Text(text) => text,
                    other => panic!("expected text, got {other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let delta =
            |content: &str| format!(r#"{{"choices": [{{"delta": {{"content": {content}}}}}]}}"#);
        assert_eq!(text_of_chunk(&delta(r#""plain""#)), ["plain"]);
        assert_eq!(text_of_chunk(&delta(r#""a\u00e9\n""#)), ["a\u{e9}\n"]);
        let parts = r#"[{"type": "text", "text": "Hel"}, {"type": "image"}, "x", {"text": "lo"}]"#;
        assert_eq!(text_of_chunk(&delta(parts)), ["Hello"]);
        for nothing in [
            "null",
            r#""""#,
            r#"{"text": "no"}"#,
            "3",
            "-1",
            "2.5",
            "true",
        ] {
            assert!(text_of_chunk(&delta(nothing)).is_empty(), "{nothing}");
        }
        let two =
            r#"{"choices": [{"delta": {"content": "first"}}, {"delta": {"content": "second"}}]}"#;
        assert_eq!(text_of_chunk(two), ["first"]);
        assert!(text_of_chunk(r#"{"choices": []}"#).is_empty());
        assert!(text_of_chunk("{}").is_empty());
    }

    /// Chat Completions carry a refusal in `message.refusal` / `delta.refusal`, with content
    /// null; it stays a refusal, not text.
    #[test]
    fn refusals_stay_apart_from_the_text() {
        let wire: ChatResponse = serde_json::from_value(json!({
            "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                "content": null, "refusal": "I'm sorry, I cannot assist with that request."}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 10}
        }))
        .unwrap();
        let r = from_wire(wire, "gpt-4o");
        assert_eq!(r.text, "");
        assert_eq!(
            r.refusal.as_deref(),
            Some("I'm sorry, I cannot assist with that request.")
        );

        let mut state = StreamState::default();
        let mut acc = ResponseAccumulator::new("m");
        for chunk in [
            r#"{"choices": [{"delta": {"role": "assistant", "content": null, "refusal": ""}}]}"#,
            r#"{"choices": [{"delta": {"refusal": "I'm sorry"}}]}"#,
            r#"{"choices": [{"delta": {"refusal": ", no."}}]}"#,
            r#"{"choices": [{"delta": {}, "finish_reason": "stop"}]}"#,
        ] {
            let mut out = Deltas::new();
            state.map(serde_json::from_str(chunk).unwrap(), &mut out);
            for delta in out {
                acc.push(&delta.unwrap());
            }
        }
        let r = acc.finish();
        assert_eq!(r.text, "");
        assert_eq!(r.refusal.as_deref(), Some("I'm sorry, no."));
        assert_eq!(r.finish_reason, FinishReason::Stop);
    }

    /// Clients get OpenAI's finish reasons; a compatible server's `error` (or an answer
    /// without choices) is none of them and ends the answer as `stop`.
    #[test]
    fn finish_reasons_are_openais() {
        for (raw, expected) in [
            ("stop", "stop"),
            ("length", "length"),
            ("tool_calls", "tool_calls"),
            ("function_call", "tool_calls"),
            ("content_filter", "content_filter"),
            ("error", "stop"),
            ("eos", "stop"),
        ] {
            assert_eq!(finish_reason(raw).as_openai(), expected, "{raw}");
        }
        let empty: ChatResponse = serde_json::from_value(json!({"choices": []})).unwrap();
        assert_eq!(from_wire(empty, "m").finish_reason, FinishReason::Stop);
    }

    /// An error object reads as a chunk with every field absent: it must still be an error.
    #[tokio::test]
    async fn an_error_object_inside_a_stream_is_an_error() {
        use futures::StreamExt;
        for error in [r#"{"message": "overloaded"}"#, r#""overloaded""#] {
            let body = format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"a\"}}}}]}}\n\ndata: {{\"error\": {error}}}\n\n"
            );
            let bytes = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(body))]);
            let items: Vec<_> = deltas("p", bytes).collect().await;
            assert!(matches!(items[0], Ok(StreamDelta::Text(ref t)) if t == "a"));
            match &items[1] {
                Err(ProviderError::Status { message, .. }) => assert_eq!(message, "overloaded"),
                other => panic!("{error}: expected an error, got {other:?}"),
            }
        }
    }

    /// An SSE body of `events`' data.
    fn sse_body(events: &[&str]) -> String {
        events
            .iter()
            .map(|data| format!("data: {data}\n\n"))
            .collect()
    }

    fn body_of(body: String) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        futures::stream::iter([Ok(Bytes::from(body))])
    }

    const ROLE: &str = r#"{"model": "gpt-4o-mini-2024-07-18", "choices": [{"delta": {"role": "assistant", "content": ""}}]}"#;

    /// A stream is served (no fallback, no first-token timeout) once its first delta arrives:
    /// the role chunk names the model but says nothing, so it yields nothing, and an error or a
    /// stall right after it is a failure before the first token. The model (and any usage
    /// reported before the answer) comes with the first content, tool call or finish, first.
    #[tokio::test]
    async fn nothing_is_yielded_before_the_answer_begins() {
        use futures::StreamExt;
        let error = r#"{"error": {"message": "overloaded"}}"#;
        let items: Vec<_> = deltas("openai", body_of(sse_body(&[ROLE, error])))
            .collect()
            .await;
        match &items[..] {
            [Err(error @ ProviderError::Status { message, .. })] => {
                assert_eq!(message, "overloaded");
                assert!(error.is_retryable());
            }
            other => panic!("expected the error alone, got {other:?}"),
        }

        let stalled = body_of(sse_body(&[ROLE])).chain(futures::stream::pending());
        let mut stalled = deltas("openai", stalled);
        let first = tokio::time::timeout(Duration::from_millis(50), stalled.next()).await;
        assert!(first.is_err(), "the role chunk yielded {first:?}");

        let model = || Ok(StreamDelta::Model("gpt-4o-mini-2024-07-18".into()));
        let usage = r#"{"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 0}}"#;
        let content =
            r#"{"model": "gpt-4o-mini-2024-07-18", "choices": [{"delta": {"content": "Hi"}}]}"#;
        let items: Vec<_> = deltas("openai", body_of(sse_body(&[ROLE, usage, content])))
            .collect()
            .await;
        assert_eq!(
            items[..3],
            [
                model(),
                Ok(StreamDelta::Usage(Usage {
                    tokens_in: 9,
                    ..Usage::default()
                })),
                Ok(StreamDelta::Text("Hi".into())),
            ]
        );

        let call = r#"{"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}}]}"#;
        let finish = r#"{"choices": [{"delta": {}, "finish_reason": "stop"}]}"#;
        for (first, expected) in [
            (
                call,
                StreamDelta::ToolCallStart {
                    index: 0,
                    id: "c1".into(),
                    name: "f".into(),
                },
            ),
            (finish, StreamDelta::Finish(FinishReason::Stop)),
        ] {
            let items: Vec<_> = deltas("openai", body_of(sse_body(&[ROLE, first])))
                .collect()
                .await;
            assert_eq!(items[..2], [model(), Ok(expected)]);
        }
    }

    /// A connection that breaks before the first delta is retryable (the chain tries the next
    /// model), as a refused connection is; after it, and for an unreadable chunk, it is not.
    #[tokio::test]
    async fn a_connection_broken_before_the_answer_is_retryable() {
        use futures::StreamExt;
        let broken = |body: String| {
            futures::stream::iter([
                Ok(Bytes::from(body)),
                Err(std::io::Error::other("connection reset")),
            ])
        };
        for before in [String::new(), sse_body(&[ROLE])] {
            let items: Vec<_> = deltas("openai", broken(before.clone())).collect().await;
            match &items[..] {
                [Err(error @ ProviderError::Connection { message, .. })] => {
                    assert!(error.is_retryable());
                    assert!(message.contains("connection reset"), "{message}");
                }
                other => panic!("{before:?}: expected a connection error, got {other:?}"),
            }
        }

        let content = r#"{"choices": [{"delta": {"content": "Hi"}}]}"#;
        let items: Vec<_> = deltas("openai", broken(sse_body(&[ROLE, content])))
            .collect()
            .await;
        assert!(matches!(items[1], Ok(StreamDelta::Text(_))), "{items:?}");
        assert!(
            matches!(&items[2], Err(error @ ProviderError::InvalidResponse { .. }) if !error.is_retryable()),
            "{items:?}"
        );

        let items: Vec<_> = deltas("openai", body_of(sse_body(&[ROLE, "{\"choices\": ["])))
            .collect()
            .await;
        assert!(
            matches!(&items[..], [Err(error @ ProviderError::InvalidResponse { .. })] if !error.is_retryable()),
            "{items:?}"
        );
    }
}
