//! OpenAI Responses API (`POST {base}/responses`), used by `openai` and `azure` only when a request
//! asks for vendor tools (`web_search`, `code_interpreter`): Chat Completions cannot run them.
//! Wire types sit next to the mapping; nothing outside this module sees them.

use std::time::Duration;

use baton_domain::chat::{
    Citation, ContentPart, FinishReason, InferenceRequest, InferenceResponse, ResponseFormat, Role,
    StreamDelta, ToolCall, ToolChoice, Usage, VendorTool,
};
use bytes::Bytes;
use futures::Stream;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{ProviderError, ProviderResult};
use crate::http;
use crate::provider::DeltaStream;
use crate::sse::{self, Deltas, HeldUntilContent};

/// Where and how to call the Responses API; borrowed from the `OpenAiProvider` that delegates.
pub(crate) struct Endpoint<'a> {
    pub(crate) provider: &'a str,
    pub(crate) base_url: &'a str,
    pub(crate) azure: bool,
    pub(crate) api_key: Option<&'a SecretString>,
    pub(crate) client: &'a crate::http::ProviderClient,
    pub(crate) timeout: Option<Duration>,
}

impl Endpoint<'_> {
    /// OpenAI: `{base}/responses` with a bearer key (base is `https://api.openai.com/v1`).
    /// Azure: the v1 surface `{endpoint}/openai/v1/responses` with the `api-key` header. Azure
    /// serves the Responses API only there, not under `/openai/deployments/{name}/...`: the
    /// deployment name goes in the body's `model`, and v1 takes no `api-version`, so the
    /// configured one (for Chat Completions) is not sent.
    fn url(&self) -> String {
        if self.azure {
            format!("{}/openai/v1/responses", self.base_url)
        } else {
            format!("{}/responses", self.base_url)
        }
    }

    fn request(&self, body: &ResponsesRequest<'_>) -> reqwest::RequestBuilder {
        let mut builder = self.client.get().post(self.url()).json(body);
        if let Some(key) = self.api_key {
            builder = if self.azure {
                builder.header("api-key", key.expose_secret())
            } else {
                builder.bearer_auth(key.expose_secret())
            };
        }
        builder
    }

    pub(crate) async fn infer(
        &self,
        request: &InferenceRequest,
    ) -> ProviderResult<InferenceResponse> {
        let body = to_wire(self.provider, request, false)?;
        let wire: ResponsesResponse = http::send_json(
            self.client,
            self.provider,
            &request.model,
            self.request(&body),
            self.timeout,
        )
        .await?;
        from_wire(self.provider, wire, &request.model)
    }

    pub(crate) async fn infer_stream(
        &self,
        request: &InferenceRequest,
    ) -> ProviderResult<DeltaStream> {
        let body = to_wire(self.provider, request, true)?;
        http::stream(
            self.client,
            self.provider,
            &request.model,
            self.request(&body),
            self.timeout,
            |response| deltas(self.provider, response.bytes_stream()),
        )
        .await
    }
}

/// Canonical deltas of a Responses API SSE body: the HTTP response's, or any byte stream
/// (benchmarks drive it from memory).
pub(crate) fn deltas<S, E>(provider: &str, bytes: S) -> DeltaStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let mut state = StreamState::new(provider);
    sse::deltas(provider, bytes, move |data, out| state.parse(data, out))
}

// ---- Wire types: request -------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub(crate) struct ResponsesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<String>,
    input: Vec<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<Value>,
    /// The gateway keeps no conversation state upstream (no `previous_response_id`), so it asks
    /// OpenAI not to retain the response either, unless the client asked for `store`.
    store: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    /// The client's OpenAI options that the Responses API takes under the same name
    /// ([`RESPONSES_PASSTHROUGH`]).
    #[serde(flatten)]
    passthrough: Map<String, Value>,
}

/// Chat Completions options the Responses API takes as they are. The others are mapped
/// (`store`, `verbosity` into `text`, `web_search_options` into the web search tool), refused
/// (audio output, which it cannot give) or dropped (`prediction`, a latency hint it has no
/// counterpart for: the answer is the same without it).
const RESPONSES_PASSTHROUGH: &[&str] = &[
    "service_tier",
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
];

/// Chat Completions' `web_search_options` as the Responses web search tool's fields: the same
/// `search_context_size`, and `user_location` with its `approximate` object's fields lifted
/// beside its `type`.
fn web_search_tool(options: Option<&Value>) -> Value {
    let mut tool = Map::new();
    tool.insert("type".into(), json!("web_search"));
    if let Some(Value::Object(options)) = options {
        for (key, value) in options {
            let value = match (key.as_str(), value) {
                ("user_location", Value::Object(location)) => {
                    let mut flat: Map<String, Value> = location
                        .iter()
                        .filter(|(k, _)| k.as_str() != "approximate")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    if let Some(Value::Object(approximate)) = location.get("approximate") {
                        flat.extend(approximate.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                    Value::Object(flat)
                }
                _ => value.clone(),
            };
            tool.insert(key.clone(), value);
        }
    }
    Value::Object(tool)
}

fn message_item(role: &str, content: Vec<Value>) -> Value {
    json!({"type": "message", "role": role, "content": content})
}

pub(crate) fn to_wire<'a>(
    provider: &str,
    request: &'a InferenceRequest,
    stream: bool,
) -> ProviderResult<ResponsesRequest<'a>> {
    let unsupported = |what: String, field: &'static str| ProviderError::Unsupported {
        provider: provider.to_string(),
        what,
        field: Some(field),
    };
    // The Responses API has no stop sequences; dropping them would change the answer silently.
    if !request.stop.is_empty() {
        return Err(unsupported(
            "stop sequences together with vendor tools (Responses API)".into(),
            "stop",
        ));
    }
    let options = &request.openai_options;
    // Audio output, asked by `audio` or by `modalities` naming it.
    let audio_field = if options.contains_key("audio") {
        Some("audio")
    } else {
        options
            .get("modalities")
            .and_then(Value::as_array)
            .is_some_and(|modalities| modalities.iter().any(|m| m == "audio"))
            .then_some("modalities")
    };
    if let Some(field) = audio_field {
        return Err(unsupported(
            "audio output together with vendor tools (Responses API)".into(),
            field,
        ));
    }
    let mut tools: Vec<Value> = request
        .tools
        .iter()
        // The Responses API makes function tools strict unless told otherwise, which rejects
        // ordinary schemas; Chat Completions' default (not strict) is kept.
        .map(|t| {
            json!({"type": "function", "name": t.name, "description": t.description,
                   "parameters": t.parameters, "strict": t.strict.unwrap_or(false)})
        })
        .collect();
    for tool in &request.vendor_tools {
        tools.push(match tool {
            VendorTool::WebSearch => web_search_tool(options.get("web_search_options")),
            VendorTool::CodeInterpreter => {
                json!({"type": "code_interpreter", "container": {"type": "auto"}})
            }
            VendorTool::WebSearch20250305 => {
                return Err(unsupported(
                    format!("the vendor tool '{}' (it is Anthropic's)", tool.as_str()),
                    "vendor_tools",
                ));
            }
        });
    }

    // Leading system messages become `instructions`; later ones keep their place as developer
    // messages.
    let mut instructions: Vec<String> = Vec::new();
    let mut input: Vec<Value> = Vec::new();
    for message in &request.messages {
        match message.role {
            Role::System if input.is_empty() => instructions.push(message.joined_text()),
            Role::System => input.push(message_item(
                "developer",
                vec![json!({"type": "input_text", "text": message.joined_text()})],
            )),
            Role::User => {
                let content = message
                    .content
                    .iter()
                    .map(|part| match part {
                        ContentPart::Text { text } => json!({"type": "input_text", "text": text}),
                        ContentPart::Image { source, detail } => json!({
                            "type": "input_image",
                            "image_url": source.to_url(),
                            "detail": detail.as_deref().unwrap_or("auto"),
                        }),
                    })
                    .collect();
                input.push(message_item("user", content));
            }
            Role::Assistant => {
                let text = message.joined_text();
                if !text.is_empty() {
                    input.push(message_item(
                        "assistant",
                        vec![json!({"type": "output_text", "text": text, "annotations": []})],
                    ));
                }
                for call in &message.tool_calls {
                    input.push(json!({"type": "function_call", "call_id": call.id,
                                      "name": call.name, "arguments": call.arguments}));
                }
            }
            Role::Tool => input.push(json!({
                "type": "function_call_output",
                "call_id": message.tool_call_id.clone().unwrap_or_default(),
                "output": message.joined_text(),
            })),
        }
    }

    let tool_choice = request.tool_choice.as_ref().map(|choice| match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Tool(name) => json!({"type": "function", "name": name}),
    });
    let text = match &request.response_format {
        Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
        }) => Some(
            json!({"format": {"type": "json_schema", "name": name, "schema": schema,
                                     "strict": strict.unwrap_or(false)}}),
        ),
        Some(ResponseFormat::JsonObject) => Some(json!({"format": {"type": "json_object"}})),
        Some(ResponseFormat::Text) | None => None,
    };
    let text = match (text, options.get("verbosity")) {
        (text, None) => text,
        (Some(Value::Object(mut text)), Some(verbosity)) => {
            text.insert("verbosity".into(), verbosity.clone());
            Some(Value::Object(text))
        }
        (_, Some(verbosity)) => Some(json!({"verbosity": verbosity})),
    };
    // Same effort buckets as the Chat Completions mapping, so a budget means the same on both.
    let reasoning = request.thinking_budget.map(|budget| {
        let effort = match budget {
            0..=2048 => "low",
            2049..=8192 => "medium",
            _ => "high",
        };
        json!({"effort": effort})
    });
    // `seed` has no Responses counterpart; it is best-effort anyway, so it is not sent.
    Ok(ResponsesRequest {
        model: &request.model,
        instructions: (!instructions.is_empty()).then(|| instructions.join("\n\n")),
        input,
        parallel_tool_calls: request
            .parallel_tool_calls
            .filter(|_| !request.tools.is_empty()),
        tools,
        tool_choice,
        temperature: request.temperature,
        top_p: request.top_p,
        max_output_tokens: request.max_tokens,
        reasoning,
        text,
        store: options
            .get("store")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        stream,
        passthrough: RESPONSES_PASSTHROUGH
            .iter()
            .filter_map(|&key| Some((key.to_string(), options.get(key)?.clone())))
            .collect(),
    })
}

// ---- Wire types: response ------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ResponsesResponse {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    output: Vec<OutputItem>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputItem {
    Message {
        #[serde(default)]
        content: Vec<OutputContent>,
    },
    FunctionCall {
        #[serde(default)]
        call_id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        arguments: String,
    },
    WebSearchCall {},
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputContent {
    OutputText {
        #[serde(default)]
        text: String,
        #[serde(default)]
        annotations: Vec<Annotation>,
    },
    Refusal {
        #[serde(default)]
        refusal: String,
    },
    #[serde(other)]
    Other,
}

/// `url_citation` annotations carry `url` and `title`; file citations have no URL and are skipped.
#[derive(Debug, Deserialize)]
struct Annotation {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    title: Option<String>,
}

impl Annotation {
    fn citation(self) -> Option<Citation> {
        match (self.kind.as_str(), self.url) {
            ("url_citation", Some(url)) => Some(Citation {
                url,
                title: self.title,
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Debug, Default, Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn canonical(&self, web_search_calls: u64) -> Usage {
        Usage {
            tokens_in: self.input_tokens,
            tokens_out: self.output_tokens,
            reasoning_tokens: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            web_search_calls,
        }
    }
}

/// A failure the provider reports inside a 200 (a failed response, a stream `error` event), as
/// the status the same failure would have had over HTTP, so retries treat it alike.
fn reported_error(provider: &str, code: Option<&str>, message: Option<String>) -> ProviderError {
    let status = match code.unwrap_or("server_error") {
        "rate_limit_exceeded" | "insufficient_quota" => 429,
        "server_error" | "internal_error" => 500,
        "vector_store_timeout" => 504,
        code if code.starts_with("invalid") || code.contains("image") => 400,
        _ => 502,
    };
    ProviderError::Status {
        provider: provider.to_string(),
        status,
        message: message
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| code.unwrap_or("the response failed").to_string()),
        retry_after: None,
    }
}

fn finish_reason(wire: &ResponsesResponse, has_tool_calls: bool) -> FinishReason {
    let incomplete = wire.status.as_deref() == Some("incomplete");
    let reason = wire
        .incomplete_details
        .as_ref()
        .and_then(|d| d.reason.as_deref());
    match reason {
        Some("max_output_tokens") if incomplete => FinishReason::Length,
        Some("content_filter") if incomplete => FinishReason::ContentFilter,
        _ if has_tool_calls => FinishReason::ToolCalls,
        _ => FinishReason::Stop,
    }
}

fn push_citation(citations: &mut Vec<Citation>, citation: Citation) {
    // The same source is often cited at several places in the text; it is listed once.
    if !citations.iter().any(|c| c.url == citation.url) {
        citations.push(citation);
    }
}

pub(crate) fn from_wire(
    provider: &str,
    mut wire: ResponsesResponse,
    requested_model: &str,
) -> ProviderResult<InferenceResponse> {
    if wire.status.as_deref() == Some("failed") {
        let error = wire.error.take();
        let (code, message) = error.map_or((None, None), |e| (e.code, e.message));
        return Err(reported_error(provider, code.as_deref(), message));
    }
    let mut response = InferenceResponse {
        model: wire
            .model
            .clone()
            .unwrap_or_else(|| requested_model.to_string()),
        ..Default::default()
    };
    let mut refusal = String::new();
    let mut searches = 0;
    for item in std::mem::take(&mut wire.output) {
        match item {
            OutputItem::Message { content } => {
                for part in content {
                    match part {
                        OutputContent::OutputText { text, annotations } => {
                            response.text.push_str(&text);
                            for citation in annotations.into_iter().filter_map(Annotation::citation)
                            {
                                push_citation(&mut response.citations, citation);
                            }
                        }
                        OutputContent::Refusal { refusal: text } => refusal.push_str(&text),
                        OutputContent::Other => {}
                    }
                }
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
            } => response.tool_calls.push(ToolCall {
                id: call_id,
                name,
                arguments,
            }),
            OutputItem::WebSearchCall {} => searches += 1,
            OutputItem::Other => {}
        }
    }
    // Kept apart from the text: a refusal is no answer to validate.
    response.refusal = (!refusal.is_empty()).then_some(refusal);
    response.usage = wire
        .usage
        .as_ref()
        .map(|u| u.canonical(searches))
        .unwrap_or(Usage {
            web_search_calls: searches,
            ..Usage::default()
        });
    response.finish_reason = finish_reason(&wire, !response.tool_calls.is_empty());
    Ok(response)
}

// ---- Wire types: stream --------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum StreamEvent {
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        #[serde(default)]
        delta: String,
    },
    #[serde(rename = "response.refusal.delta")]
    RefusalDelta {
        #[serde(default)]
        delta: String,
    },
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        #[serde(default)]
        output_index: u32,
        item: OutputItem,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        #[serde(default)]
        output_index: u32,
        #[serde(default)]
        delta: String,
    },
    #[serde(rename = "response.output_text.annotation.added")]
    AnnotationAdded { annotation: Annotation },
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        #[serde(default)]
        output_index: u32,
        item: OutputItem,
    },
    /// The response as it starts: it names the model serving it.
    #[serde(rename = "response.created", alias = "response.in_progress")]
    Started { response: ResponsesResponse },
    #[serde(rename = "response.completed", alias = "response.incomplete")]
    Completed { response: ResponsesResponse },
    #[serde(rename = "response.failed")]
    Failed { response: ResponsesResponse },
    #[serde(rename = "error")]
    Error {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: Option<String>,
    },
    #[serde(other)]
    Other,
}

/// A function call being streamed: its place in `output` and whether arguments arrived.
#[derive(Debug)]
struct StreamedCall {
    output_index: u32,
    arguments_seen: bool,
}

/// Per-stream state. Canonical tool-call indices count function calls only, while the wire's
/// `output_index` also counts messages and web searches.
#[derive(Debug)]
pub(crate) struct StreamState {
    provider: String,
    calls: Vec<StreamedCall>,
    searches: u64,
    cited: Vec<String>,
    /// Usage (a finished web search) held until the answer begins.
    held: HeldUntilContent,
}

impl StreamState {
    pub(crate) fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_string(),
            calls: Vec::new(),
            searches: 0,
            cited: Vec::new(),
            held: HeldUntilContent::default(),
        }
    }

    fn call_index(&self, output_index: u32) -> Option<usize> {
        self.calls
            .iter()
            .position(|c| c.output_index == output_index)
    }

    /// One SSE `data` payload to the deltas it stands for.
    pub(crate) fn parse(&mut self, data: &str, out: &mut Deltas) {
        if data.trim().is_empty() {
            return;
        }
        match serde_json::from_str::<StreamEvent>(data) {
            Ok(event) => {
                // A web search finishing reports usage before any text: that must not commit
                // the stream to its model (an error after it still falls back).
                let from = out.len();
                self.map(event, out);
                self.held.settle(out, from);
            }
            Err(err) => out.push_back(Err(ProviderError::InvalidResponse {
                provider: self.provider.clone(),
                message: format!("unreadable stream event: {err}"),
            })),
        }
    }

    fn citation(&mut self, citation: Citation) -> Option<StreamDelta> {
        if self.cited.contains(&citation.url) {
            return None;
        }
        self.cited.push(citation.url.clone());
        Some(StreamDelta::Citation(citation))
    }

    fn map(&mut self, event: StreamEvent, out: &mut Deltas) {
        let mut push = |delta| out.push_back(Ok(delta));
        match event {
            StreamEvent::TextDelta { delta } if !delta.is_empty() => {
                push(StreamDelta::Text(delta));
            }
            StreamEvent::RefusalDelta { delta } if !delta.is_empty() => {
                push(StreamDelta::Refusal(delta));
            }
            StreamEvent::ItemAdded {
                output_index,
                item:
                    OutputItem::FunctionCall {
                        call_id,
                        name,
                        arguments,
                    },
            } if self.call_index(output_index).is_none() => {
                let index = self.calls.len() as u32;
                self.calls.push(StreamedCall {
                    output_index,
                    arguments_seen: !arguments.is_empty(),
                });
                push(StreamDelta::ToolCallStart {
                    index,
                    id: call_id,
                    name,
                });
                if !arguments.is_empty() {
                    push(StreamDelta::ToolCallArguments {
                        index,
                        fragment: arguments,
                    });
                }
            }
            StreamEvent::ArgumentsDelta {
                output_index,
                delta,
            } if !delta.is_empty() => {
                if let Some(index) = self.call_index(output_index) {
                    self.calls[index].arguments_seen = true;
                    push(StreamDelta::ToolCallArguments {
                        index: index as u32,
                        fragment: delta,
                    });
                }
            }
            StreamEvent::AnnotationAdded { annotation } => {
                if let Some(citation) = annotation.citation().and_then(|c| self.citation(c)) {
                    push(citation);
                }
            }
            StreamEvent::ItemDone {
                item: OutputItem::WebSearchCall {},
                ..
            } => {
                self.searches += 1;
                push(StreamDelta::Usage(Usage {
                    web_search_calls: self.searches,
                    ..Usage::default()
                }));
            }
            // Servers that send a call's arguments only whole, on completion.
            StreamEvent::ItemDone {
                output_index,
                item: OutputItem::FunctionCall { arguments, .. },
            } => {
                if let Some(index) = self.call_index(output_index)
                    && !self.calls[index].arguments_seen
                    && !arguments.is_empty()
                {
                    self.calls[index].arguments_seen = true;
                    push(StreamDelta::ToolCallArguments {
                        index: index as u32,
                        fragment: arguments,
                    });
                }
            }
            // Named at the start, so a streaming client's chunks name the served model from
            // the first (held until the answer begins, as every stream's model is).
            StreamEvent::Started { response } => {
                if let Some(model) = response.model.filter(|m| !m.is_empty()) {
                    push(StreamDelta::Model(model));
                }
            }
            StreamEvent::Completed { mut response } => {
                if let Some(model) = response.model.take().filter(|m| !m.is_empty()) {
                    push(StreamDelta::Model(model));
                }
                let searches = response
                    .output
                    .iter()
                    .filter(|i| matches!(i, OutputItem::WebSearchCall {}))
                    .count() as u64;
                self.searches = self.searches.max(searches);
                // Citations that came only with the final response (no annotation events).
                for item in std::mem::take(&mut response.output) {
                    if let OutputItem::Message { content } = item {
                        for part in content {
                            if let OutputContent::OutputText { annotations, .. } = part {
                                for citation in
                                    annotations.into_iter().filter_map(Annotation::citation)
                                {
                                    if let Some(citation) = self.citation(citation) {
                                        push(citation);
                                    }
                                }
                            }
                        }
                    }
                }
                let usage = response.usage.as_ref().map_or(
                    Usage {
                        web_search_calls: self.searches,
                        ..Usage::default()
                    },
                    |u| u.canonical(self.searches),
                );
                push(StreamDelta::Usage(usage));
                push(StreamDelta::Finish(finish_reason(
                    &response,
                    !self.calls.is_empty(),
                )));
            }
            StreamEvent::Failed { response } => {
                let (code, message) = response.error.map_or((None, None), |e| (e.code, e.message));
                out.push_back(Err(reported_error(
                    &self.provider,
                    code.as_deref(),
                    message,
                )));
            }
            StreamEvent::Error { code, message } => {
                out.push_back(Err(reported_error(
                    &self.provider,
                    code.as_deref(),
                    message,
                )));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use baton_domain::chat::{ImageSource, Message, ResponseAccumulator, ToolDefinition};

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
                Message {
                    role: Role::Assistant,
                    content: vec![ContentPart::Text {
                        text: "Let me look.".into(),
                    }],
                    tool_calls: vec![ToolCall {
                        id: "call_7".into(),
                        name: "lookup".into(),
                        arguments: "{\"q\":\"x\"}".into(),
                    }],
                    tool_call_id: None,
                    name: None,
                },
                Message {
                    role: Role::Tool,
                    content: vec![ContentPart::Text {
                        text: "found".into(),
                    }],
                    tool_calls: vec![],
                    tool_call_id: Some("call_7".into()),
                    name: None,
                },
                Message::text(Role::System, "cite sources"),
            ],
            temperature: Some(0.5),
            top_p: Some(0.9),
            max_tokens: Some(100),
            tools: vec![ToolDefinition {
                name: "lookup".into(),
                description: Some("find".into()),
                parameters: json!({"type": "object"}),
                strict: None,
            }],
            tool_choice: Some(ToolChoice::Tool("lookup".into())),
            response_format: Some(ResponseFormat::JsonSchema {
                name: "r".into(),
                schema: json!({"type": "object"}),
                strict: Some(true),
            }),
            thinking_budget: Some(4000),
            vendor_tools: vec![VendorTool::WebSearch, VendorTool::CodeInterpreter],
            ..Default::default()
        }
    }

    #[test]
    fn maps_messages_tool_history_tools_and_options() {
        let req = request();
        let wire = serde_json::to_value(to_wire("openai", &req, true).unwrap()).unwrap();
        assert_eq!(wire["model"], "gpt-4o-mini");
        assert_eq!(wire["instructions"], "be brief");
        assert_eq!(wire["stream"], true);
        assert_eq!(wire["store"], false);
        assert_eq!(wire["max_output_tokens"], 100);
        assert_eq!(wire["temperature"], 0.5);
        assert_eq!(wire["top_p"], 0.9);
        assert_eq!(wire["reasoning"], json!({"effort": "medium"}));
        assert_eq!(
            wire["text"]["format"],
            json!({"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": true})
        );
        assert_eq!(
            wire["tool_choice"],
            json!({"type": "function", "name": "lookup"})
        );
        assert_eq!(
            wire["tools"],
            json!([
                {"type": "function", "name": "lookup", "description": "find", "parameters": {"type": "object"}, "strict": false},
                {"type": "web_search"},
                {"type": "code_interpreter", "container": {"type": "auto"}},
            ])
        );
        assert_eq!(
            wire["input"],
            json!([
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
                ]},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "Let me look.", "annotations": []},
                ]},
                {"type": "function_call", "call_id": "call_7", "name": "lookup", "arguments": "{\"q\":\"x\"}"},
                {"type": "function_call_output", "call_id": "call_7", "output": "found"},
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "cite sources"}]},
            ])
        );
        for absent in [
            "stop",
            "seed",
            "max_tokens",
            "messages",
            "x_nonce",
            "stream_options",
        ] {
            assert!(wire.get(absent).is_none(), "{absent} must not be sent");
        }
        let sync = serde_json::to_value(to_wire("openai", &req, false).unwrap()).unwrap();
        assert!(sync.get("stream").is_none());
    }

    #[test]
    fn urls_and_auth_per_flavor_keep_the_key_out_of_the_url() {
        let client = crate::http::ProviderClient::from(reqwest::Client::new());
        let key = SecretString::from("sk-secret");
        let endpoint = |azure, base_url| Endpoint {
            provider: "p",
            base_url,
            azure,
            api_key: Some(&key),
            client: &client,
            timeout: None,
        };
        let req = request();
        let body = to_wire("p", &req, false).unwrap();
        let openai = endpoint(false, "https://api.openai.com/v1")
            .request(&body)
            .build()
            .unwrap();
        assert_eq!(openai.url().as_str(), "https://api.openai.com/v1/responses");
        assert_eq!(openai.headers()["authorization"], "Bearer sk-secret");
        let azure = endpoint(true, "https://r.openai.azure.com")
            .request(&body)
            .build()
            .unwrap();
        assert_eq!(
            azure.url().as_str(),
            "https://r.openai.azure.com/openai/v1/responses",
            "v1 takes no api-version"
        );
        assert_eq!(azure.headers()["api-key"], "sk-secret");
        assert!(azure.headers().get("authorization").is_none());
    }

    #[test]
    fn refuses_what_the_responses_api_cannot_do() {
        let mut req = request();
        req.vendor_tools = vec![VendorTool::WebSearch20250305];
        assert!(matches!(
            to_wire("openai", &req, false),
            Err(ProviderError::Unsupported { .. })
        ));
        let mut req = request();
        req.stop = vec!["END".into()];
        assert!(matches!(
            to_wire("azure", &req, false),
            Err(ProviderError::Unsupported { .. })
        ));
    }

    #[test]
    fn openai_options_are_carried_over_where_the_responses_api_has_them() {
        let mut req = request();
        req.vendor_tools = vec![VendorTool::WebSearch];
        req.response_format = Some(ResponseFormat::JsonObject);
        req.openai_options = json!({
            "service_tier": "flex", "metadata": {"team": "a"}, "prompt_cache_key": "k1",
            "safety_identifier": "u-1", "store": true, "verbosity": "low",
            "prediction": {"type": "content", "content": "x"},
            "web_search_options": {"search_context_size": "high",
                "user_location": {"type": "approximate", "approximate": {"country": "GB", "city": "London"}}},
        })
        .as_object()
        .unwrap()
        .clone();
        let wire = serde_json::to_value(to_wire("openai", &req, false).unwrap()).unwrap();
        assert_eq!(wire["service_tier"], "flex");
        assert_eq!(wire["metadata"], json!({"team": "a"}));
        assert_eq!(wire["prompt_cache_key"], "k1");
        assert_eq!(wire["safety_identifier"], "u-1");
        assert_eq!(wire["store"], true, "the client's choice");
        assert_eq!(
            wire["text"],
            json!({"format": {"type": "json_object"}, "verbosity": "low"})
        );
        assert!(wire.get("prediction").is_none(), "no Responses counterpart");
        assert!(wire.get("web_search_options").is_none());
        let search = wire["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "web_search")
            .unwrap()
            .clone();
        assert_eq!(
            search,
            json!({"type": "web_search", "search_context_size": "high",
                   "user_location": {"type": "approximate", "country": "GB", "city": "London"}})
        );

        // Verbosity alone makes a `text` of its own; audio output is refused, not dropped.
        let mut req = request();
        req.vendor_tools = vec![VendorTool::WebSearch];
        req.response_format = None;
        req.openai_options = json!({"verbosity": "high"}).as_object().unwrap().clone();
        let wire = serde_json::to_value(to_wire("openai", &req, false).unwrap()).unwrap();
        assert_eq!(wire["text"], json!({"verbosity": "high"}));
        for audio in [
            json!({"modalities": ["text", "audio"]}),
            json!({"audio": {"voice": "alloy", "format": "wav"}}),
        ] {
            req.openai_options = audio.as_object().unwrap().clone();
            assert!(matches!(
                to_wire("openai", &req, false),
                Err(ProviderError::Unsupported { .. })
            ));
        }
    }

    fn response_body() -> Value {
        json!({
            "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4o-mini-2024-07-18",
            "output": [
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "q"}},
                {"type": "web_search_call", "id": "ws_2", "status": "completed"},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
                    {"type": "output_text", "text": "Rust 1.0 shipped in 2015.", "annotations": [
                        {"type": "url_citation", "start_index": 0, "end_index": 10, "url": "https://blog.rust-lang.org", "title": "Rust Blog"},
                        {"type": "url_citation", "start_index": 11, "end_index": 20, "url": "https://blog.rust-lang.org", "title": "Rust Blog"},
                        {"type": "file_citation", "file_id": "f", "index": 0},
                    ]},
                    {"type": "output_text", "text": " Really.", "annotations": [
                        {"type": "url_citation", "start_index": 0, "end_index": 7, "url": "https://en.wikipedia.org/wiki/Rust", "title": null}
                    ]}
                ]},
                {"type": "code_interpreter_call", "id": "ci_1", "code": "1+1"},
            ],
            "usage": {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 20},
                      "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 8}, "total_tokens": 150}
        })
    }

    #[test]
    fn reads_text_citations_usage_and_web_search_calls() {
        let wire = serde_json::from_value(response_body()).unwrap();
        let r = from_wire("openai", wire, "gpt-4o-mini").unwrap();
        assert_eq!(r.model, "gpt-4o-mini-2024-07-18");
        assert_eq!(r.text, "Rust 1.0 shipped in 2015. Really.");
        assert_eq!(
            r.citations,
            vec![
                Citation {
                    url: "https://blog.rust-lang.org".into(),
                    title: Some("Rust Blog".into())
                },
                Citation {
                    url: "https://en.wikipedia.org/wiki/Rust".into(),
                    title: None
                },
            ]
        );
        assert_eq!(
            r.usage,
            Usage {
                tokens_in: 120,
                tokens_out: 30,
                reasoning_tokens: 8,
                cached_tokens: 20,
                web_search_calls: 2
            }
        );
        assert_eq!(r.finish_reason, FinishReason::Stop);
        assert!(r.tool_calls.is_empty());
    }

    #[test]
    fn reads_tool_calls_truncation_and_failures() {
        let wire = serde_json::from_value(json!({"status": "completed", "output": [
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": "{\"q\":1}"}
        ], "usage": {"input_tokens": 5, "output_tokens": 2}}))
        .unwrap();
        let r = from_wire("openai", wire, "gpt-4o-mini").unwrap();
        assert_eq!(r.model, "gpt-4o-mini");
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":1}".into()
            }]
        );

        let wire = serde_json::from_value(json!({"status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "Once upon"}]}]}))
        .unwrap();
        let r = from_wire("openai", wire, "m").unwrap();
        assert_eq!(
            (r.text.as_str(), r.finish_reason),
            ("Once upon", FinishReason::Length)
        );

        let wire = serde_json::from_value(json!({"status": "failed", "output": [],
            "error": {"code": "rate_limit_exceeded", "message": "slow down"}}))
        .unwrap();
        let err = from_wire("openai", wire, "m").unwrap_err();
        assert_eq!(err.status(), Some(429));
        assert!(err.is_retryable());
        assert!(err.to_string().contains("slow down"));
    }

    fn run(events: &[Value]) -> (Vec<StreamDelta>, Vec<ProviderError>) {
        let mut state = StreamState::new("openai");
        let (mut deltas, mut errors) = (Vec::new(), Vec::new());
        for event in events {
            let mut out = Deltas::new();
            state.parse(&event.to_string(), &mut out);
            for item in out {
                match item {
                    Ok(delta) => deltas.push(delta),
                    Err(err) => errors.push(err),
                }
            }
        }
        (deltas, errors)
    }

    #[test]
    fn stream_events_assemble_text_calls_citations_and_searches() {
        let citation = json!({"type": "url_citation", "start_index": 0, "end_index": 4, "url": "https://a.example", "title": "A"});
        let events = [
            json!({"type": "response.created", "response": {"id": "r", "status": "in_progress", "model": "gpt-4o-2024-08-06", "output": []}}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "web_search_call", "id": "ws_1", "status": "in_progress"}}),
            json!({"type": "response.web_search_call.searching", "output_index": 0, "item_id": "ws_1"}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "web_search_call", "id": "ws_1", "status": "completed"}}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "m", "role": "assistant", "content": []}}),
            json!({"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "Héllo"}),
            json!({"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": " there"}),
            json!({"type": "response.output_text.annotation.added", "output_index": 1, "annotation_index": 0, "annotation": citation}),
            json!({"type": "response.output_text.annotation.added", "output_index": 1, "annotation_index": 1, "annotation": citation}),
            json!({"type": "response.output_item.added", "output_index": 2, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 2, "item_id": "fc_1", "delta": "{\"q\":"}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 2, "item_id": "fc_1", "delta": "1}"}),
            json!({"type": "response.output_item.done", "output_index": 2, "item": {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"q\":1}"}}),
            json!({"type": "response.completed", "response": {"status": "completed", "model": "gpt-4o-2024-08-06", "output": [
                {"type": "web_search_call", "id": "ws_1"},
                {"type": "message", "content": [{"type": "output_text", "text": "Héllo there", "annotations": [citation]}]},
                {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"q\":1}"}],
                "usage": {"input_tokens": 40, "output_tokens": 9, "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}}),
        ];
        let (deltas, errors) = run(&events);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            deltas
                .iter()
                .filter(|d| matches!(d, StreamDelta::Citation(_)))
                .count(),
            1,
            "a source cited twice is listed once"
        );
        // The served model (from `response.created`) comes before the first text, so streamed
        // chunks name it from the start.
        let first_model = deltas
            .iter()
            .position(|d| matches!(d, StreamDelta::Model(m) if m == "gpt-4o-2024-08-06"));
        let first_text = deltas
            .iter()
            .position(|d| matches!(d, StreamDelta::Text(_)));
        assert!(
            first_model.is_some() && first_model < first_text,
            "{deltas:?}"
        );
        let mut acc = ResponseAccumulator::new("m");
        for delta in &deltas {
            acc.push(delta);
        }
        assert!(acc.is_finished());
        let r = acc.finish();
        assert_eq!(r.text, "Héllo there");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":1}".into()
            }],
            "the call is index 0 although it is output item 2, and its arguments are not doubled"
        );
        assert_eq!(r.citations[0].url, "https://a.example");
        assert_eq!(
            (
                r.usage.tokens_in,
                r.usage.tokens_out,
                r.usage.web_search_calls
            ),
            (40, 9, 1)
        );
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.model, "gpt-4o-2024-08-06");
    }

    #[test]
    fn stream_truncation_and_errors() {
        let (deltas, _) = run(&[
            json!({"type": "response.output_text.delta", "delta": "Once"}),
            json!({"type": "response.incomplete", "response": {"status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"}, "output": [],
                "usage": {"input_tokens": 3, "output_tokens": 16}}}),
        ]);
        assert_eq!(
            deltas.last(),
            Some(&StreamDelta::Finish(FinishReason::Length))
        );

        let (_, errors) = run(&[
            json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": "server_error", "message": "upstream broke"}}}),
        ]);
        assert_eq!(errors[0].status(), Some(500));
        assert!(errors[0].is_retryable());

        let (_, errors) = run(&[json!({"type": "error", "code": "invalid_prompt",
            "message": "bad prompt", "param": null, "sequence_number": 3})]);
        assert_eq!(errors[0].status(), Some(400));
        assert!(!errors[0].is_retryable());
        assert!(errors[0].to_string().contains("bad prompt"));

        let (_, errors) =
            run(&[json!({"type": "error", "code": "rate_limit_exceeded", "message": "later"})]);
        assert!(errors[0].is_retryable());

        let mut state = StreamState::new("openai");
        let mut out = Deltas::new();
        state.parse("{not json", &mut out);
        assert!(matches!(
            out.make_contiguous(),
            [Err(ProviderError::InvalidResponse { .. })]
        ));
    }

    /// A finished web search reports usage before any text, which must not commit the stream:
    /// a failure after it is still one before the first token (the chain falls back), and the
    /// usage comes with the first text.
    #[test]
    fn a_web_search_before_the_answer_commits_nothing() {
        let searched = json!({"type": "response.output_item.done", "output_index": 0,
            "item": {"type": "web_search_call", "id": "ws_1", "status": "completed"}});
        let failed = json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": "server_error", "message": "upstream broke"}}});
        let text = json!({"type": "response.output_text.delta", "delta": "Found"});
        let parse = |events: &[&Value]| {
            let mut state = StreamState::new("openai");
            let mut out = Deltas::new();
            for event in events {
                state.parse(&event.to_string(), &mut out);
            }
            out
        };
        let mut out = parse(&[&searched, &failed]);
        assert!(
            matches!(out.make_contiguous(), [Err(error)] if error.is_retryable()),
            "{out:?}"
        );
        let out = parse(&[&searched, &text]);
        assert_eq!(
            out,
            [
                Ok(StreamDelta::Usage(Usage {
                    web_search_calls: 1,
                    ..Usage::default()
                })),
                Ok(StreamDelta::Text("Found".into())),
            ]
        );
    }
}
