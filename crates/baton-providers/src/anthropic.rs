//! Anthropic Messages API (`POST {base}/v1/messages`). Structured output is a forced tool call;
//! `web_search_20250305` is passed through as Anthropic's server tool.

use std::collections::HashMap;
use std::sync::Arc;
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

use crate::catalogue::Catalogue;
use crate::error::{ProviderError, ProviderResult};
use crate::http;
use crate::provider::{DeltaStream, Provider, ToolBlock, system_only_as_user, thinking_under_cap};
use crate::sse::{self, Deltas};

pub const API_VERSION: &str = "2023-06-01";
/// Anthropic requires `max_tokens`; used when neither request nor catalogue gives one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The forced tool that carries structured output.
const STRUCTURED_TOOL: &str = "structured_output";

pub struct AnthropicProvider {
    key: String,
    /// `{base_url}/v1/messages`.
    messages_url: http::FixedUrl,
    api_key: SecretString,
    client: http::ProviderClient,
    timeout: Option<Duration>,
    /// Where a model's max output tokens come from when a request sets no `max_tokens`.
    catalogue: Option<Arc<Catalogue>>,
}

impl AnthropicProvider {
    pub fn new(
        key: impl Into<String>,
        base_url: impl Into<String>,
        api_key: SecretString,
        client: impl Into<http::ProviderClient>,
        timeout: Option<Duration>,
    ) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        Self {
            key: key.into(),
            messages_url: http::FixedUrl::new(format!("{base_url}/v1/messages")),
            api_key,
            client: client.into(),
            timeout,
            catalogue: None,
        }
    }

    /// Requests without `max_tokens` ask for the model's max output tokens from `catalogue`
    /// (Anthropic requires the field; a fixed default would cut long answers short).
    pub fn with_catalogue(mut self, catalogue: Arc<Catalogue>) -> Self {
        self.catalogue = Some(catalogue);
        self
    }

    fn request(&self, body: &MessagesRequest) -> reqwest::RequestBuilder {
        self.messages_url
            .post(self.client.get())
            .header("x-api-key", self.api_key.expose_secret())
            .header("anthropic-version", API_VERSION)
            .json(body)
    }

    fn wire(&self, request: &InferenceRequest, stream: bool) -> ProviderResult<MessagesRequest> {
        if let Some(tool) = request
            .vendor_tools
            .iter()
            .find(|t| **t != VendorTool::WebSearch20250305)
        {
            return Err(ProviderError::Unsupported {
                provider: self.key.clone(),
                what: format!(
                    "the vendor tool '{}' (Anthropic runs web_search_20250305)",
                    tool.as_str()
                ),
                field: Some("vendor_tools"),
            });
        }
        let default_max_tokens =
            catalogue_max_tokens(self.catalogue.as_deref(), &self.key, &request.model)
                .unwrap_or(DEFAULT_MAX_TOKENS);
        Ok(to_wire(request, stream, default_max_tokens))
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn key(&self) -> &str {
        &self.key
    }

    async fn infer(&self, request: &InferenceRequest) -> ProviderResult<InferenceResponse> {
        let body = self.wire(request, false)?;
        let wire: MessagesResponse = http::send_json(
            &self.client,
            &self.key,
            &request.model,
            self.request(&body),
            self.timeout,
        )
        .await?;
        Ok(from_wire(wire, structured(request)))
    }

    async fn infer_stream(&self, request: &InferenceRequest) -> ProviderResult<DeltaStream> {
        let body = self.wire(request, true)?;
        let structured = structured(request);
        http::stream(
            &self.client,
            &self.key,
            &request.model,
            self.request(&body),
            self.timeout,
            |response| deltas(&self.key, response.bytes_stream(), structured),
        )
        .await
    }
}

/// Canonical deltas of a Messages SSE body: the HTTP response's, or any byte stream
/// (benchmarks drive it from memory).
pub(crate) fn deltas<S, E>(provider: &str, bytes: S, structured: bool) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let name = provider.to_string();
    let mut state = StreamState {
        structured,
        ..StreamState::default()
    };
    sse::deltas(
        provider,
        bytes,
        move |data, out| match serde_json::from_str::<StreamEvent>(data) {
            Ok(StreamEvent::Error { error }) => out.push_back(Err(ProviderError::Status {
                provider: name.clone(),
                status: error_status(&error.kind),
                message: error.message,
                retry_after: None,
            })),
            Ok(event) => state.map(event, out),
            Err(err) => out.push_back(Err(ProviderError::InvalidResponse {
                provider: name.clone(),
                message: format!("unreadable stream event: {err}"),
            })),
        },
    )
}

/// The HTTP status an error event stands for (Anthropic's error types are its statuses'), so
/// one sent before the answer began moves on to the next model as the status would.
fn error_status(kind: &str) -> u16 {
    match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => 500,
    }
}

/// The catalogue's max output tokens of a model (dated names find their entry).
pub(crate) fn catalogue_max_tokens(
    catalogue: Option<&Catalogue>,
    provider: &str,
    model: &str,
) -> Option<u32> {
    let entry = catalogue?.lookup_served(provider, model)?;
    (entry.max_output_tokens > 0)
        .then(|| u32::try_from(entry.max_output_tokens).unwrap_or(u32::MAX))
}

pub(crate) fn structured(request: &InferenceRequest) -> bool {
    matches!(
        request.response_format,
        Some(ResponseFormat::JsonSchema { .. } | ResponseFormat::JsonObject)
    )
}

// ---- Request -------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub(crate) struct MessagesRequest {
    model: String,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop_sequences: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Debug, Serialize)]
struct WireMessage {
    role: &'static str,
    content: Vec<Value>,
}

fn image_block(source: &ImageSource) -> Value {
    match source {
        ImageSource::Base64 { media_type, data } => {
            // Anthropic's media types are image/jpeg, png, gif and webp; `image/jpg` (common in
            // data URLs) is refused.
            let media_type = match media_type.as_str() {
                "image/jpg" => "image/jpeg",
                other => other,
            };
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
        }
        ImageSource::Url { url } => json!({"type": "image", "source": {"type": "url", "url": url}}),
    }
}

/// Anthropic's smallest thinking budget.
const MIN_THINKING_BUDGET: u32 = 1024;

/// The thinking budget of a request to a Claude model (the Messages API, Bedrock's Converse), or
/// `None` for no thinking. The caller's max_tokens bounds the answer, thinking included (Claude
/// counts the budget in it): the budget (at least Anthropic's 1,024) shrinks to fit under it,
/// and thinking is off when it cannot.
pub(crate) fn claude_thinking_budget(request: &InferenceRequest) -> Option<u32> {
    // With thinking on, Claude refuses a conversation whose last assistant turn called tools
    // unless that turn starts with the thinking block (and signature) it was answered with.
    // Canonical messages cannot carry one back: an OpenAI-format client has no field for it, and
    // Baton's own tool loop keeps only a turn's text and calls. The turn that continues a tool
    // call is sent without thinking instead of being refused with 400.
    if continues_tool_use(&request.messages) {
        return None;
    }
    let budget = request.thinking_budget?.max(MIN_THINKING_BUDGET);
    thinking_under_cap(budget, request.max_tokens, MIN_THINKING_BUDGET)
}

/// Whether the last assistant turn that says anything called tools: the request goes on with
/// their results.
fn continues_tool_use(messages: &[Message]) -> bool {
    messages
        .iter()
        .rev()
        .find(|m| {
            m.role == Role::Assistant
                && (!m.tool_calls.is_empty()
                    || m.content
                        .iter()
                        .any(|part| !matches!(part, ContentPart::Text { text } if text.is_empty())))
        })
        .is_some_and(|m| !m.tool_calls.is_empty())
}

/// The Messages request; `default_max_tokens` is sent when the request sets no `max_tokens`.
pub(crate) fn to_wire(
    request: &InferenceRequest,
    stream: bool,
    default_max_tokens: u32,
) -> MessagesRequest {
    let as_user = system_only_as_user(request);
    let request = as_user.as_ref().unwrap_or(request);
    let mut system = Vec::new();
    let mut messages: Vec<WireMessage> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message.role {
            Role::System => {
                system.push(message.joined_text());
                continue;
            }
            Role::Tool => (
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id.clone().unwrap_or_default(),
                    "content": message.joined_text(),
                })],
            ),
            Role::User | Role::Assistant => {
                let mut blocks: Vec<Value> = message
                    .content
                    .iter()
                    .filter_map(|part| match part {
                        ContentPart::Text { text } if text.is_empty() => None,
                        ContentPart::Text { text } => Some(json!({"type": "text", "text": text})),
                        ContentPart::Image { source, .. } => Some(image_block(source)),
                    })
                    .collect();
                for call in &message.tool_calls {
                    let input: Value =
                        serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                }
                (
                    if message.role == Role::User {
                        "user"
                    } else {
                        "assistant"
                    },
                    blocks,
                )
            }
        };
        // Anthropic refuses a turn without content (an empty assistant string mid-conversation
        // would be `"content": []`); the turns around it merge below.
        if blocks.is_empty() {
            continue;
        }
        // Anthropic wants alternating roles: consecutive tool results share one user turn.
        match messages.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => messages.push(WireMessage {
                role,
                content: blocks,
            }),
        }
    }

    // Without a max_tokens the default is raised to fit the budget (below).
    let thinking_budget = claude_thinking_budget(request);
    let thinking_on = thinking_budget.is_some();
    let mut tools: Vec<Value> = request
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description.clone().unwrap_or_default(), "input_schema": t.parameters}))
        .collect();
    let structured_tool = match &request.response_format {
        Some(ResponseFormat::JsonSchema { schema, .. }) => Some(
            json!({"name": STRUCTURED_TOOL, "description": "Return the answer as this JSON object.", "input_schema": schema}),
        ),
        Some(ResponseFormat::JsonObject) => Some(
            json!({"name": STRUCTURED_TOOL, "description": "Return the answer as a JSON object.", "input_schema": {"type": "object"}}),
        ),
        _ => None,
    };
    let tool_choice = match structured_tool {
        None => request.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            // Thinking only allows auto and none: forcing a tool is refused with 400.
            ToolChoice::Required | ToolChoice::Tool(_) if thinking_on => json!({"type": "auto"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
        }),
        Some(structured_tool) => {
            // The answer comes as the structured tool's input. With the caller's tools offered
            // too, "any" lets the model call a real tool in a tool loop or answer through the
            // structured tool; forcing the structured tool would end every loop at once.
            let choice = match &request.tool_choice {
                Some(ToolChoice::Tool(name)) if !thinking_on => {
                    json!({"type": "tool", "name": name})
                }
                Some(ToolChoice::None) => {
                    tools.clear();
                    json!({"type": "tool", "name": STRUCTURED_TOOL})
                }
                _ if tools.is_empty() => json!({"type": "tool", "name": STRUCTURED_TOOL}),
                _ => json!({"type": "any"}),
            };
            tools.push(structured_tool);
            // Thinking only allows auto and none (forced tool use is refused with 400): the
            // tool's description and the answer check have to carry the format then.
            Some(if thinking_on {
                json!({"type": "auto"})
            } else {
                choice
            })
        }
    };
    // One tool call a turn: Anthropic says so in tool_choice (`none` takes no such flag).
    let tool_choice = match (tool_choice, request.parallel_tool_calls) {
        (choice, Some(false)) if !request.tools.is_empty() => {
            let mut choice = choice.unwrap_or_else(|| json!({"type": "auto"}));
            if choice["type"] != "none" {
                choice["disable_parallel_tool_use"] = json!(true);
            }
            Some(choice)
        }
        (choice, _) => choice,
    };
    for tool in &request.vendor_tools {
        if *tool == VendorTool::WebSearch20250305 {
            tools.push(json!({"type": "web_search_20250305", "name": "web_search"}));
        }
    }
    let thinking =
        thinking_budget.map(|budget| json!({"type": "enabled", "budget_tokens": budget}));
    let max_tokens = request.max_tokens.unwrap_or(default_max_tokens);
    MessagesRequest {
        model: request.model.clone(),
        // The thinking budget counts against max_tokens, which must exceed it.
        max_tokens: match thinking_budget {
            Some(budget) => max_tokens.max(budget + 1),
            None => max_tokens,
        },
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages,
        // Thinking isn't compatible with temperature or top_k modifications and takes top_p
        // only from 0.95 up (400 otherwise): the thinking asked for wins over sampling settings.
        temperature: request.temperature.filter(|_| !thinking_on),
        top_p: request
            .top_p
            .map(|p| if thinking_on { p.max(0.95) } else { p }),
        top_k: request.top_k.filter(|_| !thinking_on),
        stop_sequences: request.stop.clone(),
        tools,
        tool_choice,
        thinking,
        stream,
    }
}

// ---- Response ------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
pub(crate) struct MessagesResponse {
    #[serde(default)]
    model: String,
    #[serde(default)]
    content: Vec<Block>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
        #[serde(default)]
        citations: Option<Vec<WireCitation>>,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct WireCitation {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    title: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    server_tool_use: Option<ServerToolUse>,
}

#[derive(Debug, Default, Deserialize)]
struct ServerToolUse {
    #[serde(default)]
    web_search_requests: u64,
}

impl WireUsage {
    /// Anthropic's `input_tokens` excludes cache reads and writes; ours includes them.
    fn canonical(&self) -> Usage {
        let cached = self.cache_read_input_tokens.unwrap_or(0);
        Usage {
            tokens_in: self.input_tokens + cached + self.cache_creation_input_tokens.unwrap_or(0),
            tokens_out: self.output_tokens,
            reasoning_tokens: 0,
            cached_tokens: cached,
            web_search_calls: self
                .server_tool_use
                .as_ref()
                .map_or(0, |s| s.web_search_requests),
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
        "refusal" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

pub(crate) fn from_wire(wire: MessagesResponse, structured: bool) -> InferenceResponse {
    let mut response = InferenceResponse {
        model: wire.model,
        usage: wire.usage.canonical(),
        ..Default::default()
    };
    // The structured-output tool's input is the answer's text; text the model wrote around it
    // (possible when thinking leaves the choice to the model) is not part of the JSON.
    let mut structured_answer = None;
    for block in wire.content {
        match block {
            Block::Text { text, citations } => {
                response.text.push_str(&text);
                for c in citations.unwrap_or_default() {
                    if let Some(url) = c.url
                        && !response.citations.iter().any(|x| x.url == url)
                    {
                        response.citations.push(Citation {
                            url,
                            title: c.title,
                        });
                    }
                }
            }
            Block::ToolUse { name, input, .. } if structured && name == STRUCTURED_TOOL => {
                structured_answer = Some(input.to_string());
            }
            Block::ToolUse { id, name, input } => {
                response.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: input.to_string(),
                });
            }
            Block::Other => {}
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

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: u32,
        content_block: StartBlock,
    },
    ContentBlockDelta {
        index: u32,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    Error {
        error: WireError,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct StartMessage {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: WireUsage,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock {
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    CitationsDelta {
        citation: WireCitation,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct MessageDeltaBody {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

#[derive(Debug, Default)]
struct StreamState {
    structured: bool,
    /// Content-block index to its tool call.
    tool_blocks: HashMap<u32, ToolBlock>,
    next_tool: u32,
    usage: Usage,
    /// The model message_start named, told with the stream's first delta.
    model: Option<String>,
    /// A delta has been yielded: the stream has started.
    started: bool,
    /// Structured output: text held back until it is known whether the answer comes through
    /// the structured tool (then the text is not part of it) or as text (sent at the finish).
    held_text: String,
    /// Structured output: the structured tool's input has begun; later text is dropped.
    structured_answer: bool,
}

impl StreamState {
    /// Pushes the deltas `event` stands for. The first of a stream comes with the model and
    /// input usage message_start named: a stream counts as started (no fallback, no first-token
    /// timeout) at its first delta, so nothing is yielded before the answer begins, and an error
    /// event or a stall right after message_start is still a failure before the first token.
    fn map(&mut self, event: StreamEvent, out: &mut Deltas) {
        let before = out.len();
        self.map_event(event, out);
        if !self.started && out.len() > before {
            self.started = true;
            if self.usage != Usage::default() {
                out.insert(before, Ok(StreamDelta::Usage(self.usage)));
            }
            if let Some(model) = self.model.take() {
                out.insert(before, Ok(StreamDelta::Model(model)));
            }
        }
    }

    fn map_event(&mut self, event: StreamEvent, out: &mut Deltas) {
        let mut push = |delta| out.push_back(Ok(delta));
        match event {
            StreamEvent::MessageStart { message } => {
                self.model = message.model.filter(|m| !m.is_empty());
                self.usage = message.usage.canonical();
                // message_start's output_tokens is a placeholder (1), not a count: output stays
                // unreported until message_delta, so a stream cut short before it is estimated
                // from what it streamed rather than billed one token.
                self.usage.tokens_out = 0;
            }
            StreamEvent::ContentBlockStart {
                index,
                content_block: StartBlock::ToolUse { id, name },
            } => {
                if self.structured && name == STRUCTURED_TOOL {
                    self.tool_blocks.insert(index, ToolBlock::new(None));
                    self.structured_answer = true;
                    self.held_text.clear();
                    return;
                }
                let ordinal = self.next_tool;
                self.next_tool += 1;
                self.tool_blocks
                    .insert(index, ToolBlock::new(Some(ordinal)));
                push(StreamDelta::ToolCallStart {
                    index: ordinal,
                    id,
                    name,
                });
            }
            // A call without arguments streams no input_json_delta.
            StreamEvent::ContentBlockStop { index } => {
                if let Some(delta) = self.tool_blocks.get_mut(&index).and_then(ToolBlock::close) {
                    push(delta);
                }
            }
            StreamEvent::ContentBlockDelta { index, delta } => match delta {
                BlockDelta::TextDelta { text } if self.structured => {
                    if !self.structured_answer {
                        self.held_text.push_str(&text);
                    }
                }
                BlockDelta::TextDelta { text } => push(StreamDelta::Text(text)),
                BlockDelta::InputJsonDelta { partial_json } => {
                    if let Some(block) = self.tool_blocks.get_mut(&index) {
                        push(block.input(partial_json));
                    }
                }
                BlockDelta::CitationsDelta { citation } => {
                    if let Some(url) = citation.url {
                        push(StreamDelta::Citation(Citation {
                            url,
                            title: citation.title,
                        }));
                    }
                }
                BlockDelta::Other => {}
            },
            StreamEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    let mut update = usage.canonical();
                    // message_delta carries output tokens (and server tool use); input came first.
                    update.tokens_in = self.usage.tokens_in.max(update.tokens_in);
                    update.cached_tokens = self.usage.cached_tokens.max(update.cached_tokens);
                    self.usage = update;
                    push(StreamDelta::Usage(update));
                }
                if let Some(reason) = delta.stop_reason {
                    if !self.held_text.is_empty() {
                        push(StreamDelta::Text(std::mem::take(&mut self.held_text)));
                    }
                    push(StreamDelta::Finish(finish_reason(
                        &reason,
                        self.next_tool > 0,
                    )));
                }
            }
            StreamEvent::ContentBlockStart { .. }
            | StreamEvent::Error { .. }
            | StreamEvent::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use baton_domain::chat::{Message, ResponseAccumulator, ToolDefinition};

    use super::*;

    #[test]
    fn maps_system_tools_results_and_structured_output() {
        let request = InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![
                Message::text(Role::System, "sys"),
                Message::text(Role::User, "hi"),
                Message {
                    role: Role::Assistant,
                    content: vec![],
                    tool_calls: vec![ToolCall {
                        id: "t1".into(),
                        name: "f".into(),
                        arguments: "{\"a\":1}".into(),
                    }],
                    tool_call_id: None,
                    name: None,
                },
                Message {
                    tool_call_id: Some("t1".into()),
                    ..Message::text(Role::Tool, "42")
                },
            ],
            tools: vec![ToolDefinition {
                name: "f".into(),
                description: None,
                parameters: json!({"type": "object"}),
                strict: None,
            }],
            response_format: Some(ResponseFormat::JsonSchema {
                name: "r".into(),
                schema: json!({"type": "object"}),
                strict: None,
            }),
            top_k: Some(5),
            vendor_tools: vec![VendorTool::WebSearch20250305],
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(wire["system"], "sys");
        assert_eq!(wire["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(wire["top_k"], 5);
        assert_eq!(wire["messages"][1]["content"][0]["type"], "tool_use");
        assert_eq!(wire["messages"][1]["content"][0]["input"], json!({"a": 1}));
        assert_eq!(wire["messages"][2]["content"][0]["type"], "tool_result");
        // The caller's tool stays callable beside the structured-output tool.
        assert_eq!(wire["tools"][0]["name"], "f");
        assert_eq!(wire["tools"][1]["name"], STRUCTURED_TOOL);
        assert_eq!(wire["tool_choice"], json!({"type": "any"}));
        assert_eq!(wire["tools"][2]["type"], "web_search_20250305");
    }

    #[test]
    fn empty_turns_are_left_out_and_jpg_is_jpeg() {
        let request = InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![
                Message::text(Role::User, "first"),
                Message::text(Role::Assistant, ""),
                Message {
                    role: Role::User,
                    content: vec![ContentPart::Image {
                        source: ImageSource::Base64 {
                            media_type: "image/jpg".into(),
                            data: "AAAA".into(),
                        },
                        detail: None,
                    }],
                    tool_calls: vec![],
                    tool_call_id: None,
                    name: None,
                },
                Message::text(Role::Assistant, "ok"),
            ],
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(
            wire["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "first"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}}
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}
            ])
        );
    }

    #[test]
    fn a_full_context_window_is_a_length_finish() {
        let wire: MessagesResponse = serde_json::from_value(json!({
            "model": "claude-sonnet-4-5", "stop_reason": "model_context_window_exceeded",
            "content": [{"type": "text", "text": "partial"}]
        }))
        .unwrap();
        assert_eq!(from_wire(wire, false).finish_reason, FinishReason::Length);
        let mut state = StreamState::default();
        let r = accumulate(
            &mut state,
            vec![
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "partial"}}),
                json!({"type": "message_delta", "delta": {"stop_reason": "model_context_window_exceeded"}}),
            ],
        );
        assert_eq!(r.finish_reason, FinishReason::Length);
    }

    /// `max_tokens` is required by the Messages API; without one of the request's the model's
    /// max output from the catalogue is asked for, 4096 for a model the catalogue lacks.
    #[tokio::test]
    async fn max_tokens_defaults_to_the_catalogues_max_output() {
        use baton_testkit::MockProvider;
        let catalogue = Arc::new(Catalogue::shipped().unwrap());
        let haiku = catalogue.get("anthropic", "claude-haiku-4-5").unwrap();
        let max_output = u32::try_from(haiku.max_output_tokens).unwrap();
        assert_ne!(max_output, DEFAULT_MAX_TOKENS);
        assert_eq!(
            catalogue_max_tokens(Some(&catalogue), "anthropic", "claude-haiku-4-5-20251001"),
            Some(max_output),
            "a dated name finds its entry"
        );
        assert_eq!(
            catalogue_max_tokens(Some(&catalogue), "anthropic", "claude-unknown"),
            None
        );

        let mock = MockProvider::start().await.unwrap();
        let provider = AnthropicProvider::new(
            "anthropic",
            mock.root(),
            SecretString::from("sk-ant-test-0000".to_string()),
            crate::http::ProviderClient::new(None).unwrap(),
            None,
        )
        .with_catalogue(catalogue);
        for (model, max_tokens, expected) in [
            ("claude-haiku-4-5", None, max_output),
            ("claude-haiku-4-5", Some(100), 100),
            ("claude-unknown", None, DEFAULT_MAX_TOKENS),
        ] {
            let request = InferenceRequest {
                model: model.into(),
                messages: vec![Message::text(Role::User, "hi")],
                max_tokens,
                ..Default::default()
            };
            provider.infer(&request).await.unwrap();
            let sent = mock.received().pop().unwrap();
            assert_eq!(sent.body["max_tokens"], expected, "{model} {max_tokens:?}");
        }
    }

    /// Anthropic: "Thinking isn't compatible with temperature or top_k modifications as well
    /// as forced tool use"; top_p must be at least 0.95 or unset.
    /// `parallel_tool_calls: false` is Anthropic's `disable_parallel_tool_use`, on the choice.
    #[test]
    fn one_tool_call_a_turn_is_said_in_the_tool_choice() {
        let mut request = InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![Message::text(Role::User, "hi")],
            tools: vec![ToolDefinition {
                name: "lookup".into(),
                description: None,
                parameters: json!({"type": "object"}),
                strict: None,
            }],
            parallel_tool_calls: Some(false),
            ..Default::default()
        };
        let wire = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(
            wire["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
        request.tool_choice = Some(ToolChoice::Required);
        let wire = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(
            wire["tool_choice"],
            json!({"type": "any", "disable_parallel_tool_use": true})
        );
        request.parallel_tool_calls = None;
        let wire = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(wire["tool_choice"], json!({"type": "any"}));
    }

    /// The caller's max_tokens is a bound on the answer, thinking included.
    #[test]
    fn the_thinking_budget_fits_under_the_callers_max_tokens() {
        let request = |max_tokens: Option<u32>| InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![Message::text(Role::User, "hi")],
            max_tokens,
            thinking_budget: Some(24_576),
            ..Default::default()
        };
        let wire = |max_tokens| {
            serde_json::to_value(to_wire(&request(max_tokens), false, DEFAULT_MAX_TOKENS)).unwrap()
        };
        let capped = wire(Some(3000));
        assert_eq!(capped["max_tokens"], 3000);
        assert_eq!(capped["thinking"]["budget_tokens"], 2999);
        let small = wire(Some(1000));
        assert_eq!(small["max_tokens"], 1000);
        assert!(small.get("thinking").is_none(), "no room to think: {small}");
        let open = wire(None);
        assert_eq!(open["thinking"]["budget_tokens"], 24_576);
        assert!(open["max_tokens"].as_u64().unwrap() > 24_576);
    }

    #[test]
    fn thinking_drops_the_sampling_settings_it_refuses() {
        let mut request = InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![Message::text(Role::User, "hi")],
            temperature: Some(0.2),
            top_p: Some(0.5),
            top_k: Some(10),
            ..Default::default()
        };
        let plain = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(
            (&plain["temperature"], &plain["top_p"], &plain["top_k"]),
            (&json!(0.2), &json!(0.5), &json!(10))
        );
        request.thinking_budget = Some(2048);
        let thinking = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert!(thinking.get("temperature").is_none(), "{thinking}");
        assert!(thinking.get("top_k").is_none(), "{thinking}");
        assert_eq!(thinking["top_p"], json!(0.95));
        assert_eq!(
            thinking["thinking"],
            json!({"type": "enabled", "budget_tokens": 2048})
        );
        request.top_p = Some(0.99);
        let thinking = serde_json::to_value(to_wire(&request, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(thinking["top_p"], json!(0.99));
    }

    fn structured_request(tools: bool, choice: Option<ToolChoice>) -> InferenceRequest {
        InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![Message::text(Role::User, "hi")],
            tools: if tools {
                vec![ToolDefinition {
                    name: "lookup".into(),
                    description: None,
                    parameters: json!({"type": "object"}),
                    strict: None,
                }]
            } else {
                vec![]
            },
            tool_choice: choice,
            response_format: Some(ResponseFormat::JsonSchema {
                name: "r".into(),
                schema: json!({"type": "object"}),
                strict: None,
            }),
            ..Default::default()
        }
    }

    fn tool_names(wire: &Value) -> Vec<&str> {
        wire["tools"]
            .as_array()
            .map(|tools| tools.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default()
    }

    /// Anthropic's tool_choice: `auto`, `any`, `tool` (with `name`), `none`; thinking allows
    /// only `auto` and `none`.
    #[test]
    fn structured_output_leaves_the_callers_tools_callable() {
        let forced = json!({"type": "tool", "name": STRUCTURED_TOOL});
        for choice in [None, Some(ToolChoice::Auto), Some(ToolChoice::Required)] {
            let wire = serde_json::to_value(to_wire(
                &structured_request(true, choice.clone()),
                false,
                DEFAULT_MAX_TOKENS,
            ))
            .unwrap();
            assert_eq!(tool_names(&wire), ["lookup", STRUCTURED_TOOL], "{choice:?}");
            assert_eq!(wire["tool_choice"], json!({"type": "any"}), "{choice:?}");
            // Without tools of the caller's the structured tool is forced.
            let wire = serde_json::to_value(to_wire(
                &structured_request(false, choice.clone()),
                false,
                DEFAULT_MAX_TOKENS,
            ))
            .unwrap();
            assert_eq!(tool_names(&wire), [STRUCTURED_TOOL], "{choice:?}");
            assert_eq!(wire["tool_choice"], forced, "{choice:?}");
        }
        // "none": only the structured tool is offered, and forced.
        let wire = serde_json::to_value(to_wire(
            &structured_request(true, Some(ToolChoice::None)),
            false,
            DEFAULT_MAX_TOKENS,
        ))
        .unwrap();
        assert_eq!(tool_names(&wire), [STRUCTURED_TOOL]);
        assert_eq!(wire["tool_choice"], forced);
        // A specific function stays chosen.
        let chosen = structured_request(true, Some(ToolChoice::Tool("lookup".into())));
        let wire = serde_json::to_value(to_wire(&chosen, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(tool_names(&wire), ["lookup", STRUCTURED_TOOL]);
        assert_eq!(
            wire["tool_choice"],
            json!({"type": "tool", "name": "lookup"})
        );
        // Thinking allows no forced tool use.
        for tools in [false, true] {
            let thinking = InferenceRequest {
                thinking_budget: Some(2048),
                ..structured_request(tools, Some(ToolChoice::Required))
            };
            let wire = serde_json::to_value(to_wire(&thinking, false, DEFAULT_MAX_TOKENS)).unwrap();
            assert_eq!(
                wire["tool_choice"],
                json!({"type": "auto"}),
                "tools: {tools}"
            );
        }
        let thinking = InferenceRequest {
            thinking_budget: Some(2048),
            response_format: None,
            ..structured_request(true, Some(ToolChoice::Tool("lookup".into())))
        };
        let wire = serde_json::to_value(to_wire(&thinking, false, DEFAULT_MAX_TOKENS)).unwrap();
        assert_eq!(wire["tool_choice"], json!({"type": "auto"}));
    }

    #[test]
    fn a_real_tool_call_under_structured_output_stays_a_tool_call() {
        let wire: MessagesResponse = serde_json::from_value(json!({
            "model": "claude-sonnet-4-5", "stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}],
            "usage": {"input_tokens": 10, "output_tokens": 3}
        }))
        .unwrap();
        let r = from_wire(wire, true);
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].name, "lookup");
        assert_eq!(r.tool_calls[0].arguments, r#"{"q":"x"}"#);
        assert_eq!(r.text, "");
        // Text around the structured tool (thinking leaves the choice to the model) is no JSON.
        let wire: MessagesResponse = serde_json::from_value(json!({
            "model": "claude-sonnet-4-5", "stop_reason": "tool_use",
            "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Here it is:"},
                        {"type": "tool_use", "id": "toolu_2", "name": STRUCTURED_TOOL, "input": {"a": 1}}],
        }))
        .unwrap();
        let r = from_wire(wire, true);
        assert_eq!(r.text, r#"{"a":1}"#);
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert!(r.tool_calls.is_empty());
    }

    fn accumulate(state: &mut StreamState, events: Vec<Value>) -> InferenceResponse {
        let mut acc = ResponseAccumulator::new("m");
        for event in events {
            let mut out = sse::Deltas::new();
            state.map(serde_json::from_value(event).unwrap(), &mut out);
            for delta in out {
                acc.push(&delta.unwrap());
            }
        }
        acc.finish()
    }

    #[test]
    fn structured_streams_tell_real_tool_calls_from_the_answer() {
        let mut state = StreamState {
            structured: true,
            ..StreamState::default()
        };
        let r = accumulate(
            &mut state,
            vec![
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"q\":1}"}}),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
            ],
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.tool_calls[0].id, "toolu_1");
        assert_eq!(r.text, "");

        let mut state = StreamState {
            structured: true,
            ..StreamState::default()
        };
        let r = accumulate(
            &mut state,
            vec![
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Here:"}}),
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_2", "name": STRUCTURED_TOOL, "input": {}}}),
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}}),
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "1}"}}),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
            ],
        );
        assert_eq!(r.text, r#"{"a":1}"#);
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert!(r.tool_calls.is_empty());

        // An answer written as text (thinking on, the model chose not to call the tool) is
        // sent whole at the finish.
        let mut state = StreamState {
            structured: true,
            ..StreamState::default()
        };
        let r = accumulate(
            &mut state,
            vec![
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "{\"a\":"}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "2}"}}),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
            ],
        );
        assert_eq!(r.text, r#"{"a":2}"#);
        assert_eq!(r.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn reads_structured_output_usage_and_search_calls() {
        let wire: MessagesResponse = serde_json::from_value(json!({
            "model": "claude-sonnet-4-5-20250929", "stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": "x", "name": STRUCTURED_TOOL, "input": {"answer": 42}}],
            "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 5,
                      "server_tool_use": {"web_search_requests": 2}}
        }))
        .unwrap();
        let r = from_wire(wire, true);
        assert_eq!(r.text, "{\"answer\":42}");
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 15,
                tokens_out: 3,
                reasoning_tokens: 0,
                cached_tokens: 5,
                web_search_calls: 2
            }
        );
    }

    /// A Messages SSE body of `events`, each named by its type as Anthropic names them.
    fn sse_body(events: &[Value]) -> String {
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect()
    }

    fn message_start() -> Value {
        json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-haiku-4-5-20251001",
            "usage": {"input_tokens": 9, "output_tokens": 1}}})
    }

    fn stream_of(
        body: String,
    ) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        futures::stream::iter([Ok(Bytes::from(body))])
    }

    /// A stream is served (no fallback, no first-token timeout) once its first delta arrives:
    /// message_start alone yields nothing, so an error right after it (Anthropic's overloaded
    /// and rate-limit errors come so) is a retryable failure before the first token, and a
    /// stall after it is the first-token timeout's.
    #[tokio::test]
    async fn nothing_is_yielded_before_the_answer_begins() {
        use futures::StreamExt;
        for (kind, status) in [
            ("overloaded_error", 529),
            ("api_error", 500),
            ("rate_limit_error", 429),
        ] {
            let body = sse_body(&[
                message_start(),
                json!({"type": "ping"}),
                json!({"type": "error", "error": {"type": kind, "message": "Overloaded"}}),
            ]);
            let items: Vec<_> = deltas("anthropic", stream_of(body), false).collect().await;
            match &items[..] {
                [Err(error @ ProviderError::Status { status: s, .. })] => {
                    assert_eq!(*s, status, "{kind}");
                    assert!(error.is_retryable(), "{kind}");
                }
                other => panic!("{kind}: expected the error alone, got {other:?}"),
            }
        }

        let started = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(sse_body(&[
            message_start(),
        ])))])
        .chain(futures::stream::pending());
        let mut stalled = deltas("anthropic", started, false);
        let first = tokio::time::timeout(Duration::from_millis(50), stalled.next()).await;
        assert!(first.is_err(), "message_start yielded {first:?}");

        // The first content brings the model and the input usage with it.
        let body = sse_body(&[
            message_start(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        ]);
        let items: Vec<_> = deltas("anthropic", stream_of(body), false).collect().await;
        assert_eq!(
            items,
            [
                Ok(StreamDelta::Model("claude-haiku-4-5-20251001".into())),
                Ok(StreamDelta::Usage(Usage {
                    tokens_in: 9,
                    ..Usage::default()
                })),
                Ok(StreamDelta::Text("Hi".into())),
            ]
        );
    }

    /// message_start's `output_tokens` is a placeholder: a stream cut before message_delta
    /// reports no output, so the executor estimates it from what was streamed.
    #[test]
    fn a_stream_cut_short_reports_no_output_usage() {
        let text = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a long answ"}});
        let cut = accumulate(
            &mut StreamState::default(),
            vec![message_start(), text.clone()],
        );
        assert_eq!(
            (cut.usage.tokens_in, cut.usage.tokens_out),
            (9, 0),
            "{:?}",
            cut.usage
        );
        let whole = accumulate(
            &mut StreamState::default(),
            vec![
                message_start(),
                text,
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
            ],
        );
        assert_eq!((whole.usage.tokens_in, whole.usage.tokens_out), (9, 3));
    }

    /// A tool call without arguments streams no input_json_delta (or an empty one): its
    /// arguments are `{}`, as a complete answer's.
    #[test]
    fn a_streamed_call_without_arguments_has_empty_object_arguments() {
        let r = accumulate(
            &mut StreamState::default(),
            vec![
                message_start(),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}}}),
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
                json!({"type": "content_block_stop", "index": 1}),
                json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_3", "name": "f", "input": {}}}),
                json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":1}"}}),
                json!({"type": "content_block_stop", "index": 2}),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
            ],
        );
        let arguments: Vec<&str> = r.tool_calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(arguments, ["{}", "{}", "{\"a\":1}"]);
        let sync: MessagesResponse = serde_json::from_value(json!({
            "model": "m", "stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}]
        }))
        .unwrap();
        assert_eq!(from_wire(sync, false).tool_calls[0].arguments, "{}");
    }

    /// Claude wants the last assistant turn of a tool loop to start with its thinking block;
    /// canonical messages cannot carry one, so the turn that continues a tool call goes without
    /// thinking (and may then force a tool again).
    #[test]
    fn a_continued_tool_turn_is_sent_without_thinking() {
        let call = Message {
            role: Role::Assistant,
            content: vec![ContentPart::Text {
                text: "Let me look.".into(),
            }],
            tool_calls: vec![ToolCall {
                id: "toolu_1".into(),
                name: "lookup".into(),
                arguments: "{}".into(),
            }],
            tool_call_id: None,
            name: None,
        };
        let result = Message {
            tool_call_id: Some("toolu_1".into()),
            ..Message::text(Role::Tool, "42")
        };
        let request = |messages: Vec<Message>| InferenceRequest {
            model: "claude-sonnet-4-5".into(),
            messages,
            tools: vec![ToolDefinition {
                name: "lookup".into(),
                description: None,
                parameters: json!({"type": "object"}),
                strict: None,
            }],
            tool_choice: Some(ToolChoice::Required),
            thinking_budget: Some(8192),
            ..Default::default()
        };
        let wire = |messages| {
            serde_json::to_value(to_wire(&request(messages), false, DEFAULT_MAX_TOKENS)).unwrap()
        };
        let first = wire(vec![Message::text(Role::User, "hi")]);
        assert_eq!(first["thinking"]["budget_tokens"], 8192);
        let continued = wire(vec![
            Message::text(Role::User, "hi"),
            call.clone(),
            result.clone(),
        ]);
        assert!(continued.get("thinking").is_none(), "{continued}");
        assert_eq!(continued["tool_choice"], json!({"type": "any"}));
        // An empty assistant message after the call does not hide it.
        let continued = wire(vec![
            Message::text(Role::User, "hi"),
            call.clone(),
            result.clone(),
            Message::text(Role::Assistant, ""),
        ]);
        assert!(continued.get("thinking").is_none(), "{continued}");
        // Once the model answered in text, the next question thinks again.
        let next = wire(vec![
            Message::text(Role::User, "hi"),
            call,
            result,
            Message::text(Role::Assistant, "It is 42."),
            Message::text(Role::User, "why?"),
        ]);
        assert_eq!(next["thinking"]["budget_tokens"], 8192);
    }

    #[test]
    fn stream_events_assemble() {
        let events = [
            json!({"type": "message_start", "message": {"model": "claude-haiku-4-5-20251001", "usage": {"input_tokens": 9, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "1}"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}}),
            json!({"type": "message_stop"}),
            json!({"type": "ping"}),
        ];
        let mut state = StreamState::default();
        let mut acc = ResponseAccumulator::new("m");
        for event in events {
            let mut out = sse::Deltas::new();
            state.map(serde_json::from_value(event).unwrap(), &mut out);
            for delta in out {
                acc.push(&delta.unwrap());
            }
        }
        let r = acc.finish();
        assert_eq!(r.text, "Hello");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "t".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into()
            }]
        );
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (9, 12));
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.model, "claude-haiku-4-5-20251001");
    }
}
