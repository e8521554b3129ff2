//! AWS Bedrock Converse for the mock provider: the JSON answer of `POST /model/{id}/converse`,
//! the event-stream frames of `POST /model/{id}/converse-stream`, and the error body. Frames
//! are encoded with `aws-smithy-eventstream`, as AWS sends them (prelude, headers, payload,
//! CRCs), and are cut at arbitrary bytes by the mock's chunking.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use serde_json::{Value, json};

use crate::mock::{Answer, split_text};

/// The content type of a ConverseStream response.
pub const STREAM_CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

fn stop_reason(answer: &Answer) -> &'static str {
    if answer.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn usage(answer: &Answer) -> Value {
    json!({
        "inputTokens": answer.tokens_in,
        "outputTokens": answer.tokens_out,
        "totalTokens": answer.tokens_in + answer.tokens_out
    })
}

/// A Converse response (Bedrock does not echo the model).
pub fn body(answer: &Answer) -> Value {
    let mut content = Vec::new();
    if !answer.text.is_empty() {
        content.push(json!({"text": answer.text}));
    }
    for call in &answer.tool_calls {
        content.push(
            json!({"toolUse": {"toolUseId": call.id, "name": call.name, "input": call.arguments}}),
        );
    }
    json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason(answer),
        "usage": usage(answer),
        "metrics": {"latencyMs": 1}
    })
}

/// The error body of a failed Converse call (HTTP status set by the caller).
pub fn error_body(message: &str) -> Value {
    json!({"message": message})
}

/// Appends one frame. Should encoding fail (a header or payload beyond the format's limits),
/// the bytes appended are not a frame, so the client under test fails loudly.
fn frame(out: &mut Vec<u8>, headers: [(&'static str, &str); 3], payload: &Value) {
    let mut message = Message::new(payload.to_string().into_bytes());
    for (name, value) in headers {
        message = message.add_header(Header::new(
            name,
            HeaderValue::String(value.to_string().into()),
        ));
    }
    if let Err(err) = write_message_to(&message, out) {
        out.extend_from_slice(format!("unencodable frame: {err}").as_bytes());
    }
}

/// Appends one event frame (`:message-type` `event`).
pub fn event(out: &mut Vec<u8>, event_type: &str, payload: &Value) {
    frame(
        out,
        [
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload,
    );
}

/// One exception frame (`throttlingException`, `modelStreamErrorException`, ...), as Bedrock
/// sends mid-stream failures.
pub fn exception(exception_type: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    frame(
        &mut out,
        [
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        &json!({"message": message}),
    );
    out
}

/// Splits at the middle, moved forward to a character boundary.
fn halves(text: &str) -> (&str, &str) {
    let mut middle = text.len() / 2;
    while !text.is_char_boundary(middle) {
        middle += 1;
    }
    text.split_at(middle)
}

/// ConverseStream frames: messageStart, the text in small deltas, each tool call as a block
/// with its input in two fragments, messageStop, then metadata with the usage.
pub fn stream(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    event(&mut out, "messageStart", &json!({"role": "assistant"}));
    let mut index = 0;
    if !answer.text.is_empty() {
        for piece in split_text(&answer.text) {
            event(
                &mut out,
                "contentBlockDelta",
                &json!({"contentBlockIndex": index, "delta": {"text": piece}}),
            );
        }
        event(
            &mut out,
            "contentBlockStop",
            &json!({"contentBlockIndex": index}),
        );
        index += 1;
    }
    for call in &answer.tool_calls {
        event(
            &mut out,
            "contentBlockStart",
            &json!({"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": call.id, "name": call.name}}}),
        );
        let input = call.arguments.to_string();
        let (head, tail) = halves(&input);
        for part in [head, tail] {
            event(
                &mut out,
                "contentBlockDelta",
                &json!({"contentBlockIndex": index, "delta": {"toolUse": {"input": part}}}),
            );
        }
        event(
            &mut out,
            "contentBlockStop",
            &json!({"contentBlockIndex": index}),
        );
        index += 1;
    }
    event(
        &mut out,
        "messageStop",
        &json!({"stopReason": stop_reason(answer)}),
    );
    event(
        &mut out,
        "metadata",
        &json!({"usage": usage(answer), "metrics": {"latencyMs": 1}}),
    );
    out
}

#[cfg(test)]
mod tests {
    use aws_smithy_eventstream::frame::read_message_from;

    use super::*;
    use crate::mock::ToolCallReply;

    fn answer() -> Answer {
        Answer {
            text: "Grüße, world".into(),
            tool_calls: vec![ToolCallReply {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: json!({"q": "é"}),
            }],
            tokens_in: 10,
            tokens_out: 5,
            model: "us.anthropic.claude-3-v1:0".into(),
            web_searches: 0,
            citations: Vec::new(),
        }
    }

    fn header<'a>(message: &'a Message, name: &str) -> &'a str {
        message
            .headers()
            .iter()
            .find(|h| h.name().as_str() == name)
            .map(|h| h.value().as_string().unwrap().as_str())
            .unwrap()
    }

    /// Every frame decodes (lengths and CRCs hold); returns (event type, payload) pairs.
    fn frames(mut bytes: &[u8]) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let message = read_message_from(&mut bytes).unwrap();
            assert_eq!(header(&message, ":content-type"), "application/json");
            let kind = match header(&message, ":message-type") {
                "event" => header(&message, ":event-type"),
                _ => header(&message, ":exception-type"),
            };
            out.push((
                kind.to_string(),
                serde_json::from_slice(message.payload()).unwrap(),
            ));
        }
        out
    }

    #[test]
    fn stream_frames_carry_the_answer() {
        let frames = frames(&stream(&answer()));
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds.first(), Some(&"messageStart"));
        assert_eq!(kinds[kinds.len() - 2..], ["messageStop", "metadata"]);
        let text: String = frames
            .iter()
            .filter_map(|(_, p)| p["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "Grüße, world");
        let start = frames
            .iter()
            .find(|(k, _)| k == "contentBlockStart")
            .unwrap();
        assert_eq!(
            start.1,
            json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "call_1", "name": "lookup"}}})
        );
        let input: String = frames
            .iter()
            .filter_map(|(_, p)| p["delta"]["toolUse"]["input"].as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&input).unwrap(),
            json!({"q": "é"})
        );
        assert_eq!(frames[frames.len() - 2].1["stopReason"], "tool_use");
        assert_eq!(
            frames[frames.len() - 1].1["usage"],
            json!({"inputTokens": 10, "outputTokens": 5, "totalTokens": 15})
        );
    }

    #[test]
    fn body_and_errors() {
        let body = body(&answer());
        assert_eq!(
            body["output"]["message"]["content"],
            json!([{"text": "Grüße, world"},
                   {"toolUse": {"toolUseId": "call_1", "name": "lookup", "input": {"q": "é"}}}])
        );
        assert_eq!(body["stopReason"], "tool_use");
        assert_eq!(body["usage"]["inputTokens"], 10);
        assert_eq!(error_body("no"), json!({"message": "no"}));
        let frames = frames(&exception("throttlingException", "slow down"));
        assert_eq!(
            frames,
            vec![(
                "throttlingException".to_string(),
                json!({"message": "slow down"})
            )]
        );
    }
}
