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
    /// Null when the model only called tools or refused.
    content: Option<&'a str>,
    /// The model's refusal, null when it answered.
    refusal: Option<&'a str>,
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
    // OpenAI sends content null beside tool calls or a refusal.
    let no_content =
        response.text.is_empty() && (!response.tool_calls.is_empty() || response.refusal.is_some());
    ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model,
        choices: [CompletionChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: (!no_content).then_some(response.text.as_str()),
                refusal: response.refusal.as_deref(),
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
    /// A choice chunk's JSON up to its delta's value (`{"id":...,"delta":`), the same for every
    /// chunk of the stream: serialised once, so a chunk serialises only its delta (the id and
    /// model strings were most of a chunk's serialising).
    head: Vec<u8>,
}

/// A chunk's fields before `choices`, in OpenAI's order (`ChunkWriter::head`).
#[derive(Serialize)]
struct ChunkHead<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    system_fingerprint: Option<()>,
}

/// A `chat.completion.chunk` with one choice: the shape `ChunkWriter` writes (built as a
/// struct only in tests, to check those bytes).
#[cfg(test)]
#[derive(Debug, Serialize)]
pub struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    system_fingerprint: Option<()>,
    choices: [ChunkChoice<'a>; 1],
}

#[cfg(test)]
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
    Refusal {
        refusal: &'a str,
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

/// The first chunk's delta.
const ROLE: Delta<'static> = Delta::Role {
    role: "assistant",
    content: "",
};

/// What a canonical delta adds to a chunk: its delta and finish reason; `None` for what is not
/// sent as a chunk (usage is sent once, at the end).
fn chunk_delta(delta: &StreamDelta) -> Option<(Delta<'_>, Option<&'static str>)> {
    Some(match delta {
        StreamDelta::Text(text) => (Delta::Content { content: text }, None),
        StreamDelta::Refusal(refusal) => (Delta::Refusal { refusal }, None),
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
        StreamDelta::Model(_) | StreamDelta::Usage(_) | StreamDelta::Citation(_) => return None,
    })
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
        let mut head = serde_json::to_vec(&ChunkHead {
            id: &id,
            object: "chat.completion.chunk",
            created,
            model: &model,
            system_fingerprint: None,
        })
        .unwrap_or_default();
        // The object stays open: `choices` follows, then the delta.
        head.pop();
        head.extend_from_slice(br#","choices":[{"index":0,"delta":"#);
        Self {
            id,
            created,
            model,
            head,
        }
    }

    /// The same stream's writer naming `model` (what the provider reports serving).
    pub fn serving(&self, model: String) -> ChunkWriter {
        ChunkWriter::new(self.id.clone(), self.created, model)
    }

    /// Writes the first chunk, which announces the assistant role as OpenAI's does.
    pub fn write_role(&self, out: &mut Vec<u8>) {
        self.write_chunk(&ROLE, None, out);
    }

    /// Writes the chunk for one canonical delta as JSON, if it has one (usage is sent once, at
    /// the end); the bytes are those of the `Chunk` it stands for.
    pub fn write_delta(&self, delta: &StreamDelta, out: &mut Vec<u8>) {
        if let Some((delta, finish_reason)) = chunk_delta(delta) {
            self.write_chunk(&delta, finish_reason, out);
        }
    }

    fn write_chunk(
        &self,
        delta: &Delta<'_>,
        finish_reason: Option<&'static str>,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(&self.head);
        // Writing into a `Vec` cannot fail; these values serialise.
        match delta {
            // Nearly every chunk of a stream: only its text is serialised (serde's struct
            // machinery escaped the key each time too).
            Delta::Content { content } => {
                out.extend_from_slice(br#"{"content":"#);
                let _ = serde_json::to_writer(&mut *out, content);
                out.push(b'}');
            }
            other => {
                let _ = serde_json::to_writer(&mut *out, other);
            }
        }
        match finish_reason {
            None => out.extend_from_slice(br#","finish_reason":null,"logprobs":null}]}"#),
            Some(reason) => {
                out.extend_from_slice(br#","finish_reason":"#);
                let _ = serde_json::to_writer(&mut *out, reason);
                out.extend_from_slice(br#","logprobs":null}]}"#);
            }
        }
    }

    /// The chunk `write_chunk` writes, as a struct (what its bytes are checked against).
    #[cfg(test)]
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

    /// OpenAI: a refusal comes in `message.refusal` with content null, and streams it in
    /// `delta.refusal`.
    #[test]
    fn a_refusal_is_relayed_as_openai_sends_it() {
        let response = InferenceResponse {
            refusal: Some("I can't help with that.".into()),
            ..InferenceResponse::default()
        };
        let body = value(&completion("c", 0, "p/m".into(), &response));
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["refusal"], "I can't help with that.");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");

        let writer = ChunkWriter::new("c".into(), 0, "p/m".into());
        let chunk = written(&writer, &StreamDelta::Refusal("I can't".into())).unwrap();
        assert_eq!(chunk["choices"][0]["delta"], json!({"refusal": "I can't"}));
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
    }

    /// The chunk `writer` writes for `delta`, checked to be the bytes its struct serialises to.
    fn written(writer: &ChunkWriter, delta: &StreamDelta) -> Option<Value> {
        let mut out = Vec::new();
        writer.write_delta(delta, &mut out);
        let (parts, finish_reason) = chunk_delta(delta)?;
        let expected = serde_json::to_vec(&writer.chunk(parts, finish_reason)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
        Some(serde_json::from_slice(&out).unwrap())
    }

    #[test]
    fn chunks_have_openai_s_shapes() {
        let writer = ChunkWriter::new("c".into(), 9, "p/m".into());
        let envelope = |delta: Value, finish: Value| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 9, "model": "p/m",
                   "system_fingerprint": null,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        };
        let mut role = Vec::new();
        writer.write_role(&mut role);
        assert_eq!(
            serde_json::from_slice::<Value>(&role).unwrap(),
            envelope(json!({"role": "assistant", "content": ""}), Value::Null)
        );
        assert_eq!(role, serde_json::to_vec(&writer.chunk(ROLE, None)).unwrap());
        let text = StreamDelta::Text("tok".into());
        assert_eq!(
            written(&writer, &text).unwrap(),
            envelope(json!({"content": "tok"}), Value::Null)
        );
        let escaped = "a \"quote\", a \\ and a line\n\u{1}é✓";
        assert_eq!(
            written(&writer, &StreamDelta::Text(escaped.into())).unwrap(),
            envelope(json!({"content": escaped}), Value::Null)
        );
        let start = StreamDelta::ToolCallStart {
            index: 1,
            id: "call_1".into(),
            name: "lookup".into(),
        };
        assert_eq!(
            written(&writer, &start).unwrap(),
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
            written(&writer, &arguments).unwrap(),
            envelope(
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"q\""}}]}),
                Value::Null
            )
        );
        let finish = StreamDelta::Finish(FinishReason::Length);
        assert_eq!(
            written(&writer, &finish).unwrap(),
            envelope(json!({}), json!("length"))
        );
        assert!(written(&writer, &StreamDelta::Usage(Usage::default())).is_none());
        let mut usage_only = Vec::new();
        writer.write_delta(&StreamDelta::Usage(Usage::default()), &mut usage_only);
        assert!(usage_only.is_empty(), "usage is not a chunk of its own");
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

    #[test]
    fn the_pre_serialised_head_escapes_the_id_and_model() {
        let writer = ChunkWriter::new("c\"1\\".into(), -3, "p/m\u{7}é\n".into());
        let value = written(&writer, &StreamDelta::Text("a\"b".into())).unwrap();
        assert_eq!(value["id"], "c\"1\\");
        assert_eq!(value["model"], "p/m\u{7}é\n");
        assert_eq!(value["created"], -3);
        assert_eq!(value["choices"][0]["delta"]["content"], "a\"b");
    }
}
