//! The Gemini API's wire format for the mock provider: `generateContent` bodies,
//! `streamGenerateContent?alt=sse` events and error bodies, rendered from a scripted [`Answer`].

use serde_json::{Value, json};

use crate::mock::{Answer, split_text, sse};

const RESPONSE_ID: &str = "mock-gemini-response";

fn usage(answer: &Answer) -> Value {
    json!({
        "promptTokenCount": answer.tokens_in,
        "candidatesTokenCount": answer.tokens_out,
        "totalTokenCount": answer.tokens_in + answer.tokens_out,
    })
}

/// Gemini may omit call ids; the mock sends the scripted ones so ids match across formats.
fn function_call(call: &crate::mock::ToolCallReply) -> Value {
    json!({"functionCall": {"id": call.id, "name": call.name, "args": call.arguments}})
}

fn candidate(parts: Vec<Value>, finish: Option<&str>) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let Some(finish) = finish {
        candidate["finishReason"] = Value::from(finish);
    }
    candidate
}

/// A `GenerateContentResponse`: the text, then the function calls, in one candidate.
pub fn body(answer: &Answer) -> Value {
    let mut parts = Vec::new();
    if !answer.text.is_empty() {
        parts.push(json!({"text": answer.text}));
    }
    parts.extend(answer.tool_calls.iter().map(function_call));
    json!({
        "candidates": [candidate(parts, Some("STOP"))],
        "usageMetadata": usage(answer),
        "modelVersion": answer.model,
        "responseId": RESPONSE_ID,
    })
}

/// SSE `data:` events as Gemini streams them: every chunk a whole response; text in small
/// pieces (carrying the prompt count, as Gemini's chunks do), the function calls whole in one
/// chunk, then a final chunk with an empty text part, `finishReason` and the full usage.
pub fn stream(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    let chunk = |candidate: Value, usage: Value| {
        json!({"candidates": [candidate], "usageMetadata": usage, "modelVersion": answer.model,
               "responseId": RESPONSE_ID})
        .to_string()
    };
    let prompt_only =
        json!({"promptTokenCount": answer.tokens_in, "totalTokenCount": answer.tokens_in});
    for piece in split_text(&answer.text) {
        sse(
            &mut out,
            None,
            &chunk(
                candidate(vec![json!({"text": piece})], None),
                prompt_only.clone(),
            ),
        );
    }
    if !answer.tool_calls.is_empty() {
        let calls = answer.tool_calls.iter().map(function_call).collect();
        sse(
            &mut out,
            None,
            &chunk(candidate(calls, None), prompt_only.clone()),
        );
    }
    sse(
        &mut out,
        None,
        &chunk(
            candidate(vec![json!({"text": ""})], Some("STOP")),
            usage(answer),
        ),
    );
    out
}

fn status_name(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        500 => "INTERNAL",
        501 => "NOT_IMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// Gemini's error body: `{"error": {"code", "message", "status"}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    json!({"error": {"code": status, "message": message, "status": status_name(status)}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::ToolCallReply;

    fn answer() -> Answer {
        Answer {
            text: "Héllo wörld".into(),
            tool_calls: vec![ToolCallReply {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: json!({"q": 1}),
            }],
            tokens_in: 10,
            tokens_out: 5,
            model: "gemini-2.5-flash".into(),
            web_searches: 0,
            citations: Vec::new(),
        }
    }

    #[test]
    fn every_stream_event_is_a_response_chunk() {
        let bytes = stream(&answer());
        let text = String::from_utf8(bytes).unwrap();
        let chunks: Vec<Value> = text
            .split("\r\n\r\n")
            .filter(|event| !event.is_empty())
            .map(|event| {
                let data = event.strip_prefix("data: ").unwrap();
                serde_json::from_str(data).unwrap()
            })
            .collect();
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
            .collect();
        assert_eq!(streamed, "Héllo wörld");
        let calls: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["candidates"][0]["content"]["parts"][0].get("functionCall"))
            .collect();
        assert_eq!(
            calls,
            vec![&json!({"id": "call_1", "name": "lookup", "args": {"q": 1}})]
        );
        let last = chunks.last().unwrap();
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(last["usageMetadata"]["candidatesTokenCount"], 5);
        assert!(
            chunks[..chunks.len() - 1]
                .iter()
                .all(|c| c["candidates"][0].get("finishReason").is_none())
        );
    }

    #[test]
    fn body_and_error_shapes() {
        let body = body(&answer());
        assert_eq!(
            body["candidates"][0]["content"]["parts"][0]["text"],
            "Héllo wörld"
        );
        assert_eq!(
            body["candidates"][0]["content"]["parts"][1]["functionCall"]["name"],
            "lookup"
        );
        assert_eq!(body["usageMetadata"]["promptTokenCount"], 10);
        assert_eq!(body["modelVersion"], "gemini-2.5-flash");
        assert_eq!(
            error_body(429, "slow down"),
            json!({"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}})
        );
    }
}
