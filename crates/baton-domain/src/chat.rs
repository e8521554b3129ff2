//! Canonical chat types: what every provider adapter maps to and from. Wire formats (OpenAI,
//! Anthropic, Gemini, Bedrock) live in `baton-providers`; nothing above it sees them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DomainError, DomainResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// Where an image comes from. Data URLs are split into media type and base64 payload, because
/// Anthropic, Gemini and Bedrock take them that way.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ImageSource {
    Url { url: String },
    Base64 { media_type: String, data: String },
}

impl ImageSource {
    /// Parses an `image_url.url` value: an `https://` URL or a `data:<media>;base64,<data>` URL.
    pub fn parse(url: &str, param: &str) -> DomainResult<ImageSource> {
        if let Some(rest) = url.strip_prefix("data:") {
            let (meta, data) = rest.split_once(',').ok_or_else(|| {
                DomainError::validation(param, "a data URL needs a ',' before its payload")
            })?;
            let media_type = meta.strip_suffix(";base64").ok_or_else(|| {
                DomainError::validation(
                    param,
                    "only base64 data URLs are supported (data:<type>;base64,...)",
                )
            })?;
            if !media_type.starts_with("image/") {
                return Err(DomainError::validation(
                    param,
                    format!("'{media_type}' is not an image type"),
                ));
            }
            if data.is_empty()
                || !data
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
            {
                return Err(DomainError::validation(
                    param,
                    "the data URL payload is not base64",
                ));
            }
            return Ok(ImageSource::Base64 {
                media_type: media_type.to_string(),
                data: data.to_string(),
            });
        }
        if url.starts_with("https://") || url.starts_with("http://") {
            return Ok(ImageSource::Url {
                url: url.to_string(),
            });
        }
        Err(DomainError::validation(
            param,
            "an image must be an https URL or a base64 data URL",
        ))
    }

    /// The value for an OpenAI-style `image_url.url`.
    pub fn to_url(&self) -> String {
        match self {
            ImageSource::Url { url } => url.clone(),
            ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ContentPart {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
        detail: Option<String>,
    },
}

/// A call the model asked for. `arguments` is the JSON text exactly as the model produced it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<ContentPart>,
    /// Assistant turns that called tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool results name the call they answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            content: vec![ContentPart::Text { text: text.into() }],
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// The text parts joined, for providers and logs that want plain text.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if let ContentPart::Text { text } = part {
                out.push_str(text);
            }
        }
        out
    }
}

/// A function the model may call; `parameters` is a JSON Schema object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "name", rename_all = "camelCase")]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Tool(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        schema: Value,
        strict: Option<bool>,
    },
}

/// Provider-native tools the provider runs itself (DESIGN.md "Virtual tools").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum VendorTool {
    #[serde(rename = "web_search")]
    WebSearch,
    #[serde(rename = "code_interpreter")]
    CodeInterpreter,
    #[serde(rename = "web_search_20250305")]
    WebSearch20250305,
}

impl VendorTool {
    pub fn parse(name: &str, param: &str) -> DomainResult<VendorTool> {
        match name {
            "web_search" => Ok(VendorTool::WebSearch),
            "code_interpreter" => Ok(VendorTool::CodeInterpreter),
            "web_search_20250305" => Ok(VendorTool::WebSearch20250305),
            other => Err(DomainError::validation(
                param,
                format!(
                    "unknown vendor tool '{other}': use web_search, code_interpreter or web_search_20250305"
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VendorTool::WebSearch => "web_search",
            VendorTool::CodeInterpreter => "code_interpreter",
            VendorTool::WebSearch20250305 => "web_search_20250305",
        }
    }
}

/// One model call in canonical form. `model` is the provider's own model name (no prefix).
///
/// Serialised (the invocation log's stored request) without the options left unset: a plain
/// request's text was two-thirds `null`s and empty lists, written with every logged run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct InferenceRequest {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Extended-thinking budget for reasoning models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<u32>,
    /// Whether the model may call several tools in one turn (`None`: the provider's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's repetition penalties, -2 to 2; sent to the providers that take them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vendor_tools: Vec<VendorTool>,
    /// Ask the provider to report usage on streams.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stream_usage: bool,
    /// OpenAI Chat Completions fields with no canonical form (`service_tier`, `store`,
    /// `metadata`, `prompt_cache_key`, ...), as the client sent them: passed on to OpenAI and
    /// Azure OpenAI only, whose API they belong to.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub openai_options: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    #[default]
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Error,
}

impl FinishReason {
    /// The OpenAI spelling, used on the compatible endpoint and in events.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Error => "error",
        }
    }
}

/// Token counts of one model call. `tokens_in` includes cached tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub reasoning_tokens: u64,
    pub cached_tokens: u64,
    /// Provider-run searches billed per call.
    pub web_search_calls: u64,
}

impl Usage {
    /// Streams report usage in pieces; later pieces win where they report a value.
    /// Adds another call's usage (a request of several model calls).
    pub fn add(&mut self, other: Usage) {
        self.tokens_in = self.tokens_in.saturating_add(other.tokens_in);
        self.tokens_out = self.tokens_out.saturating_add(other.tokens_out);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.web_search_calls = self.web_search_calls.saturating_add(other.web_search_calls);
    }

    pub fn merge(&mut self, other: Usage) {
        let take = |mine: &mut u64, theirs: u64| {
            if theirs > 0 {
                *mine = theirs;
            }
        };
        take(&mut self.tokens_in, other.tokens_in);
        take(&mut self.tokens_out, other.tokens_out);
        take(&mut self.reasoning_tokens, other.reasoning_tokens);
        take(&mut self.cached_tokens, other.cached_tokens);
        take(&mut self.web_search_calls, other.web_search_calls);
    }
}

/// A source the model cited (web search results, grounding).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Citation {
    pub url: String,
    pub title: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct InferenceResponse {
    /// The model name the provider reports having served.
    pub model: String,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub citations: Vec<Citation>,
    /// The model declined to answer and said why (OpenAI's `refusal`, apart from `content`).
    /// A refusal is a complete answer: it does not follow a requested schema and is not
    /// checked against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// The usage of answers made for this one and thrown away (a structured-output retry's
    /// first answer), each one model call: they are in `usage` too, but each call is priced
    /// and counted on its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discarded: Vec<Usage>,
}

impl InferenceResponse {
    /// The model calls this answer took.
    pub fn calls(&self) -> u32 {
        1 + u32::try_from(self.discarded.len()).unwrap_or(u32::MAX - 1)
    }

    /// The usage of each call, the answer's own last (`usage` less the discarded ones).
    pub fn usage_per_call(&self) -> impl Iterator<Item = Usage> + '_ {
        let mut own = self.usage;
        for earlier in &self.discarded {
            own.tokens_in = own.tokens_in.saturating_sub(earlier.tokens_in);
            own.tokens_out = own.tokens_out.saturating_sub(earlier.tokens_out);
            own.reasoning_tokens = own
                .reasoning_tokens
                .saturating_sub(earlier.reasoning_tokens);
            own.cached_tokens = own.cached_tokens.saturating_sub(earlier.cached_tokens);
            own.web_search_calls = own
                .web_search_calls
                .saturating_sub(earlier.web_search_calls);
        }
        self.discarded.iter().copied().chain(std::iter::once(own))
    }

    /// Whether the answer says anything (text or tool calls): a stream cut before it did is a
    /// request that got no answer.
    pub fn has_output(&self) -> bool {
        !self.text.is_empty() || !self.tool_calls.is_empty()
    }
}

/// One piece of a streamed response, in canonical form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StreamDelta {
    /// The model name the provider reports serving (dated, or a deployment's model), sent at
    /// most once: a stream's log row and statistics then name the model as a synchronous
    /// call's do.
    Model(String),
    Text(String),
    /// A tool call begins; `index` orders calls within the response.
    ToolCallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// More of the arguments JSON of call `index`.
    ToolCallArguments {
        index: u32,
        fragment: String,
    },
    Citation(Citation),
    /// More of the model's refusal (OpenAI's `delta.refusal`), apart from the text.
    Refusal(String),
    Usage(Usage),
    Finish(FinishReason),
}

/// Folds a stream's deltas into the response they add up to.
#[derive(Debug, Clone, Default)]
pub struct ResponseAccumulator {
    response: InferenceResponse,
    /// Tool calls by the index their deltas carry, in the order first seen. The index comes from
    /// the upstream's bytes: it orders the calls but is never used as a position (a stray
    /// `4000000000` would otherwise allocate for four billion calls and abort the process).
    calls: Vec<(u32, ToolCall)>,
    finished: bool,
}

impl ResponseAccumulator {
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            response: InferenceResponse {
                model: model.into(),
                ..Default::default()
            },
            calls: Vec::new(),
            finished: false,
        }
    }

    pub fn push(&mut self, delta: &StreamDelta) {
        match delta {
            StreamDelta::Model(model) => self.response.model.clone_from(model),
            StreamDelta::Text(text) => self.response.text.push_str(text),
            StreamDelta::ToolCallStart { index, id, name } => {
                let call = match self.calls.iter().position(|(at, _)| at == index) {
                    Some(position) => &mut self.calls[position].1,
                    None => {
                        self.calls.push((
                            *index,
                            ToolCall {
                                id: String::new(),
                                name: String::new(),
                                arguments: String::new(),
                            },
                        ));
                        let last = self.calls.len() - 1;
                        &mut self.calls[last].1
                    }
                };
                call.id.clone_from(id);
                call.name.clone_from(name);
            }
            StreamDelta::ToolCallArguments { index, fragment } => {
                if let Some((_, call)) = self.calls.iter_mut().find(|(at, _)| at == index) {
                    call.arguments.push_str(fragment);
                }
            }
            StreamDelta::Citation(citation) => self.response.citations.push(citation.clone()),
            StreamDelta::Refusal(text) => self
                .response
                .refusal
                .get_or_insert_with(String::new)
                .push_str(text),
            StreamDelta::Usage(usage) => self.response.usage.merge(*usage),
            StreamDelta::Finish(reason) => {
                self.response.finish_reason = *reason;
                self.finished = true;
            }
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub fn usage(&self) -> Usage {
        self.response.usage
    }

    /// The response so far, without ending the accumulation.
    pub fn snapshot(&self) -> InferenceResponse {
        self.clone().finish()
    }

    pub fn finish(mut self) -> InferenceResponse {
        self.calls.sort_by_key(|(index, _)| *index);
        // Calls announced but never filled are dropped rather than sent with empty names.
        self.response.tool_calls.extend(
            self.calls
                .into_iter()
                .map(|(_, call)| call)
                .filter(|call| !call.name.is_empty()),
        );
        self.response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_serialises_without_its_unset_options_and_reads_back() {
        let plain = InferenceRequest {
            model: "gpt-4o-mini".into(),
            messages: vec![Message::text(Role::User, "Say hi")],
            ..InferenceRequest::default()
        };
        let text = serde_json::to_string(&plain).unwrap();
        assert_eq!(
            text,
            r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"Say hi"}]}]}"#
        );
        assert_eq!(
            serde_json::from_str::<InferenceRequest>(&text).unwrap(),
            plain
        );
        let set = InferenceRequest {
            temperature: Some(0.0),
            stop: vec!["END".into()],
            stream_usage: true,
            ..plain
        };
        let value = serde_json::to_value(&set).unwrap();
        assert_eq!(
            (
                &value["temperature"],
                &value["stop"],
                &value["stream_usage"]
            ),
            (
                &serde_json::json!(0.0),
                &serde_json::json!(["END"]),
                &serde_json::json!(true)
            )
        );
        assert_eq!(
            serde_json::from_value::<InferenceRequest>(value).unwrap(),
            set
        );
        // What earlier versions stored, every option spelled out, still reads.
        let old = r#"{"model":"","messages":[],"temperature":null,"top_p":null,"top_k":null,"max_tokens":null,"seed":null,"stop":[],"tools":[],"tool_choice":null,"response_format":null,"thinking_budget":null,"vendor_tools":[],"stream_usage":false}"#;
        assert_eq!(
            serde_json::from_str::<InferenceRequest>(old).unwrap(),
            InferenceRequest::default()
        );
    }

    #[test]
    fn images_parse_data_and_https_urls() {
        assert_eq!(
            ImageSource::parse("data:image/png;base64,iVBORw0KGgo=", "p").unwrap(),
            ImageSource::Base64 {
                media_type: "image/png".into(),
                data: "iVBORw0KGgo=".into()
            }
        );
        assert_eq!(
            ImageSource::parse("https://x.example.com/a.png", "p").unwrap(),
            ImageSource::Url {
                url: "https://x.example.com/a.png".into()
            }
        );
        for bad in [
            "ftp://x/a.png",
            "data:image/png,raw",
            "data:text/plain;base64,aGk=",
            "data:image/png;base64,@@",
        ] {
            assert!(ImageSource::parse(bad, "p").is_err(), "{bad}");
        }
        let b64 = ImageSource::parse("data:image/jpeg;base64,AAAA", "p").unwrap();
        assert_eq!(b64.to_url(), "data:image/jpeg;base64,AAAA");
    }

    /// Found by fuzzing (the OpenAI stream target): a tool-call index of 4000000000 from the
    /// upstream allocated for four billion calls and aborted the process.
    #[test]
    fn accumulator_orders_calls_by_index_without_allocating_by_it() {
        let mut acc = ResponseAccumulator::new("m");
        for (index, name) in [(4_000_000_000, "late"), (u32::MAX, "last"), (3, "first")] {
            acc.push(&StreamDelta::ToolCallStart {
                index,
                id: format!("c{index}"),
                name: name.into(),
            });
            acc.push(&StreamDelta::ToolCallArguments {
                index,
                fragment: "{}".into(),
            });
        }
        // Arguments for a call never started are dropped, as before.
        acc.push(&StreamDelta::ToolCallArguments {
            index: 7,
            fragment: "x".into(),
        });
        let names: Vec<String> = acc
            .finish()
            .tool_calls
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["first", "late", "last"]);
    }

    #[test]
    fn accumulator_assembles_text_tool_calls_and_usage() {
        let mut acc = ResponseAccumulator::new("m");
        for delta in [
            StreamDelta::Text("Hel".into()),
            StreamDelta::Text("lo".into()),
            StreamDelta::ToolCallStart {
                index: 0,
                id: "c1".into(),
                name: "lookup".into(),
            },
            StreamDelta::ToolCallArguments {
                index: 0,
                fragment: "{\"q\":".into(),
            },
            StreamDelta::ToolCallArguments {
                index: 0,
                fragment: "1}".into(),
            },
            StreamDelta::Usage(Usage {
                tokens_in: 10,
                ..Usage::default()
            }),
            StreamDelta::Usage(Usage {
                tokens_out: 4,
                ..Usage::default()
            }),
            StreamDelta::Finish(FinishReason::ToolCalls),
        ] {
            acc.push(&delta);
        }
        assert!(acc.is_finished());
        let r = acc.finish();
        assert_eq!(r.text, "Hello");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "c1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":1}".into()
            }]
        );
        assert_eq!((r.usage.tokens_in, r.usage.tokens_out), (10, 4));
        assert_eq!(r.finish_reason, FinishReason::ToolCalls);
        assert_eq!(r.model, "m", "no model reported: the requested name stays");
    }

    #[test]
    fn accumulator_keeps_a_refusal_apart_from_the_text() {
        let mut acc = ResponseAccumulator::new("m");
        for delta in [
            StreamDelta::Refusal("I can't ".into()),
            StreamDelta::Refusal("help with that.".into()),
            StreamDelta::Finish(FinishReason::Stop),
        ] {
            acc.push(&delta);
        }
        let response = acc.finish();
        assert_eq!(response.refusal.as_deref(), Some("I can't help with that."));
        assert_eq!(response.text, "");
        // Stored responses without the field still read; a response without one writes none.
        let plain = InferenceResponse::default();
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("refusal"), "{text}");
        assert_eq!(
            serde_json::from_str::<InferenceResponse>(&text).unwrap(),
            plain
        );
    }

    #[test]
    fn accumulator_takes_the_model_the_provider_reports() {
        let mut acc = ResponseAccumulator::new("gpt-4o-mini");
        acc.push(&StreamDelta::Model("gpt-4o-mini-2024-07-18".into()));
        acc.push(&StreamDelta::Text("hi".into()));
        assert_eq!(acc.finish().model, "gpt-4o-mini-2024-07-18");
    }
}
