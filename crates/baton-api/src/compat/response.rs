use baton_domain::chat::{InferenceResponse, StreamDelta, Usage};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

/// A `chat.completion` object.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    pub created: i64,
    /// The served model, `<provider>/<model>`.
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub choices: Vec<Value>,
    #[schema(value_type = Object)]
    pub usage: Value,
    pub system_fingerprint: Option<String>,
}

pub fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.tokens_in,
        "completion_tokens": usage.tokens_out,
        "total_tokens": usage.tokens_in + usage.tokens_out,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    })
}

fn tool_calls_json(response: &InferenceResponse) -> Value {
    Value::Array(
        response
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

pub fn completion(
    id: &str,
    created: i64,
    model: String,
    response: &InferenceResponse,
) -> ChatCompletion {
    let mut message = json!({
        "role": "assistant",
        "content": if response.text.is_empty() && !response.tool_calls.is_empty() { Value::Null } else { Value::String(response.text.clone()) },
        "refusal": Value::Null,
    });
    if !response.tool_calls.is_empty() {
        message["tool_calls"] = tool_calls_json(response);
    }
    if !response.citations.is_empty() {
        message["annotations"] = Value::Array(
            response
                .citations
                .iter()
                .map(|c| json!({"type": "url_citation", "url_citation": {"url": c.url, "title": c.title}}))
                .collect(),
        );
    }
    ChatCompletion {
        id: id.to_string(),
        object: "chat.completion",
        created,
        model,
        choices: vec![json!({
            "index": 0,
            "message": message,
            "finish_reason": response.finish_reason.as_openai(),
            "logprobs": Value::Null,
        })],
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

impl ChunkWriter {
    pub fn new(id: String, created: i64, model: String) -> Self {
        Self { id, created, model }
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": Value::Null}],
        })
    }

    /// The first chunk announces the assistant role, as OpenAI's does.
    pub fn role(&self) -> Value {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    /// The chunk for one canonical delta, if it has one (usage is sent once, at the end).
    pub fn delta(&self, delta: &StreamDelta) -> Option<Value> {
        match delta {
            StreamDelta::Text(text) => Some(self.chunk(json!({"content": text}), None)),
            StreamDelta::ToolCallStart { index, id, name } => Some(self.chunk(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
                None,
            )),
            StreamDelta::ToolCallArguments { index, fragment } => Some(self.chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
                None,
            )),
            StreamDelta::Finish(reason) => Some(self.chunk(json!({}), Some(reason.as_openai()))),
            StreamDelta::Usage(_) | StreamDelta::Citation(_) => None,
        }
    }

    /// The final usage chunk: no choices, the whole usage.
    pub fn usage(&self, usage: &Usage) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": [],
            "usage": usage_json(usage),
        })
    }
}
