//! The OpenAI response shapes Baton answers with: `chat.completion` and
//! `chat.completion.chunk`.
//!
//! Typed structs that borrow what they show, serialised straight to the body: building them as
//! `serde_json::Value` trees cost an allocation per key and a map insert per field on every
//! completion and every streamed chunk (~28k instructions a completion, `docs/performance.md`,
//! "Typed response bodies"). Fields serialise in declaration order, OpenAI's own.

use baton_domain::chat::{Citation, InferenceResponse, StreamDelta, ToolCall, Usage};
use serde::Serialize;
use utoipa::ToSchema;

/// A `chat.completion` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion<'a> {
    pub id: &'a str,
    /// Always `chat.completion`.
    pub object: &'static str,
    pub created: i64,
    /// The served model, `<provider>/<model>`.
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub choices: [CompletionChoice<'a>; 1],
    #[schema(value_type = Object)]
    pub usage: UsageJson,
    /// Always null.
    #[schema(value_type = Option<String>)]
    pub system_fingerprint: Option<()>,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice<'a> {
    index: u32,
    message: AssistantMessage<'a>,
    finish_reason: &'static str,
    logprobs: Option<()>,
}

#[derive(Debug, Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    /// Null when the model only called tools.
    content: Option<&'a str>,
    refusal: Option<()>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: Vec<ToolCallJson<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    annotations: Vec<Annotation<'a>>,
}

#[derive(Debug, Serialize)]
struct ToolCallJson<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionJson<'a>,
}

#[derive(Debug, Serialize)]
struct FunctionJson<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Debug, Serialize)]
struct Annotation<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    url_citation: UrlCitation<'a>,
}

#[derive(Debug, Serialize)]
struct UrlCitation<'a> {
    url: &'a str,
    title: Option<&'a str>,
}

/// OpenAI's `usage` object.
#[derive(Debug, Serialize)]
pub struct UsageJson {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: CachedTokens,
    completion_tokens_details: ReasoningTokens,
}

#[derive(Debug, Serialize)]
struct CachedTokens {
    cached_tokens: u64,
}

#[derive(Debug, Serialize)]
struct ReasoningTokens {
    reasoning_tokens: u64,
}

pub fn usage_json(usage: &Usage) -> UsageJson {
    UsageJson {
        prompt_tokens: usage.tokens_in,
        completion_tokens: usage.tokens_out,
        total_tokens: usage.tokens_in + usage.tokens_out,
        prompt_tokens_details: CachedTokens {
            cached_tokens: usage.cached_tokens,
        },
        completion_tokens_details: ReasoningTokens {
            reasoning_tokens: usage.reasoning_tokens,
        },
    }
}

fn tool_call_json(call: &ToolCall) -> ToolCallJson<'_> {
    ToolCallJson {
        id: &call.id,
        kind: "function",
        function: FunctionJson {
            name: &call.name,
            arguments: &call.arguments,
        },
    }
}

fn annotation(citation: &Citation) -> Annotation<'_> {
    Annotation {
        kind: "url_citation",
        url_citation: UrlCitation {
            url: &citation.url,
            title: citation.title.as_deref(),
        },
    }
}

pub fn completion<'a>(
    id: &'a str,
    created: i64,
    model: String,
    response: &'a InferenceResponse,
) -> ChatCompletion<'a> {
    let only_tools = response.text.is_empty() && !response.tool_calls.is_empty();
    ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model,
        choices: [CompletionChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: (!only_tools).then_some(response.text.as_str()),
                refusal: None,
                tool_calls: response.tool_calls.iter().map(tool_call_json).collect(),
                annotations: response.citations.iter().map(annotation).collect(),
            },
            finish_reason: response.finish_reason.as_openai(),
            logprobs: None,
        }],
        usage: usage_json(&response.usage),
        system_fingerprint: None,
    }
}

/// Builds `chat.completion.chunk` objects for one stream.
pub struct ChunkWriter {
    id: String,
    created: i64,
    model: String,
}

/// A `chat.completion.chunk` with one choice.
#[derive(Debug, Serialize)]
pub struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    system_fingerprint: Option<()>,
    choices: [ChunkChoice<'a>; 1],
}

#[derive(Debug, Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    finish_reason: Option<&'static str>,
    logprobs: Option<()>,
}

/// What a chunk's choice adds; each variant is the JSON object OpenAI sends for it.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Delta<'a> {
    Role {
        role: &'static str,
        content: &'static str,
    },
    Content {
        content: &'a str,
    },
    ToolCall {
        tool_calls: [ToolCallDelta<'a>; 1],
    },
    /// The finishing chunk's `{}`.
    Empty {},
}

#[derive(Debug, Serialize)]
struct ToolCallDelta<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Debug, Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// The final chunk when usage was asked for: no choices, the whole usage.
#[derive(Debug, Serialize)]
pub struct UsageChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    system_fingerprint: Option<()>,
    choices: [(); 0],
    usage: UsageJson,
}

impl ChunkWriter {
    pub fn new(id: String, created: i64, model: String) -> Self {
        Self { id, created, model }
    }

    fn chunk<'a>(&'a self, delta: Delta<'a>, finish_reason: Option<&'static str>) -> Chunk<'a> {
        Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices: [ChunkChoice {
                index: 0,
                delta,
                finish_reason,
                logprobs: None,
            }],
        }
    }

    /// The first chunk announces the assistant role, as OpenAI's does.
    pub fn role(&self) -> Chunk<'_> {
        self.chunk(
            Delta::Role {
                role: "assistant",
                content: "",
            },
            None,
        )
    }

    /// The chunk for one canonical delta, if it has one (usage is sent once, at the end).
    pub fn delta<'a>(&'a self, delta: &'a StreamDelta) -> Option<Chunk<'a>> {
        let (delta, finish_reason) = match delta {
            StreamDelta::Text(text) => (Delta::Content { content: text }, None),
            StreamDelta::ToolCallStart { index, id, name } => (
                Delta::ToolCall {
                    tool_calls: [ToolCallDelta {
                        index: *index,
                        id: Some(id),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: "",
                        },
                    }],
                },
                None,
            ),
            StreamDelta::ToolCallArguments { index, fragment } => (
                Delta::ToolCall {
                    tool_calls: [ToolCallDelta {
                        index: *index,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: fragment,
                        },
                    }],
                },
                None,
            ),
            StreamDelta::Finish(reason) => (Delta::Empty {}, Some(reason.as_openai())),
            StreamDelta::Usage(_) | StreamDelta::Citation(_) => return None,
        };
        Some(self.chunk(delta, finish_reason))
    }

    /// The final usage chunk: no choices, the whole usage.
    pub fn usage(&self, usage: &Usage) -> UsageChunk<'_> {
        UsageChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices: [],
            usage: usage_json(usage),
        }
    }
}

#[cfg(test)]
mod tests {
    use baton_domain::chat::FinishReason;
    use serde_json::{Value, json};

    use super::*;

    fn value(body: &impl Serialize) -> Value {
        serde_json::to_value(body).unwrap()
    }

    #[test]
    fn a_completion_has_openai_s_shape() {
        let response = InferenceResponse {
            text: "hi".into(),
            finish_reason: FinishReason::Stop,
            usage: Usage {
                tokens_in: 3,
                tokens_out: 2,
                reasoning_tokens: 1,
                cached_tokens: 0,
                web_search_calls: 0,
            },
            citations: vec![Citation {
                url: "https://example.com".into(),
                title: None,
            }],
            ..InferenceResponse::default()
        };
        let body = completion("chatcmpl-1", 7, "openai/m".into(), &response);
        assert_eq!(
            value(&body),
            json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "openai/m",
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null, "message": {
                    "role": "assistant", "content": "hi", "refusal": null,
                    "annotations": [{"type": "url_citation", "url_citation": {"url": "https://example.com", "title": null}}],
                }}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 0},
                          "completion_tokens_details": {"reasoning_tokens": 1}},
                "system_fingerprint": null,
            })
        );
        // Keys in OpenAI's order, not sorted.
        let text = serde_json::to_string(&body).unwrap();
        assert!(
            text.starts_with(
                r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model""#
            ),
            "{text}"
        );
    }

    #[test]
    fn a_tool_calling_completion_has_null_content_and_its_calls() {
        let response = InferenceResponse {
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: r#"{"q":1}"#.into(),
            }],
            finish_reason: FinishReason::ToolCalls,
            ..InferenceResponse::default()
        };
        let body = value(&completion("c", 0, "p/m".into(), &response));
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(
            message["tool_calls"],
            json!([{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":1}"}}])
        );
        assert!(message.get("annotations").is_none());
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn chunks_have_openai_s_shapes() {
        let writer = ChunkWriter::new("c".into(), 9, "p/m".into());
        let envelope = |delta: Value, finish: Value| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 9, "model": "p/m",
                   "system_fingerprint": null,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        };
        assert_eq!(
            value(&writer.role()),
            envelope(json!({"role": "assistant", "content": ""}), Value::Null)
        );
        let text = StreamDelta::Text("tok".into());
        assert_eq!(
            value(&writer.delta(&text).unwrap()),
            envelope(json!({"content": "tok"}), Value::Null)
        );
        let start = StreamDelta::ToolCallStart {
            index: 1,
            id: "call_1".into(),
            name: "lookup".into(),
        };
        assert_eq!(
            value(&writer.delta(&start).unwrap()),
            envelope(
                json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": ""}}]}),
                Value::Null
            )
        );
        let arguments = StreamDelta::ToolCallArguments {
            index: 1,
            fragment: "{\"q\"".into(),
        };
        assert_eq!(
            value(&writer.delta(&arguments).unwrap()),
            envelope(
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"q\""}}]}),
                Value::Null
            )
        );
        let finish = StreamDelta::Finish(FinishReason::Length);
        assert_eq!(
            value(&writer.delta(&finish).unwrap()),
            envelope(json!({}), json!("length"))
        );
        assert!(
            writer
                .delta(&StreamDelta::Usage(Usage::default()))
                .is_none()
        );
        assert_eq!(
            value(&writer.usage(&Usage {
                tokens_in: 1,
                tokens_out: 1,
                ..Usage::default()
            })),
            json!({"id": "c", "object": "chat.completion.chunk", "created": 9, "model": "p/m",
                   "system_fingerprint": null, "choices": [],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                             "prompt_tokens_details": {"cached_tokens": 0},
                             "completion_tokens_details": {"reasoning_tokens": 0}}})
        );
    }
}
