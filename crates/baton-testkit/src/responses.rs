//! OpenAI's Responses API wire format for the mock provider (`/v1/responses`, Azure's
//! `/openai/v1/responses`): the response object and its typed SSE events, rendered from a
//! scripted [`Answer`]. Web searches come first as `web_search_call` items, then the message
//! (its citations as `url_citation` annotations), then the function calls.

use serde_json::{Value, json};

use crate::mock::{Answer, split_text, sse};

const RESPONSE_ID: &str = "resp_mock";
const MESSAGE_ID: &str = "msg_mock";

fn usage(answer: &Answer) -> Value {
    json!({
        "input_tokens": answer.tokens_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": answer.tokens_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": answer.tokens_in + answer.tokens_out,
    })
}

fn web_search_call(i: u64, status: &str) -> Value {
    json!({"type": "web_search_call", "id": format!("ws_mock_{i}"), "status": status,
           "action": {"type": "search", "query": "mock query"}})
}

/// Each citation spans the whole text, as the mock has no sentence to point into.
fn annotations(answer: &Answer) -> Vec<Value> {
    answer
        .citations
        .iter()
        .map(|c| {
            json!({"type": "url_citation", "start_index": 0, "end_index": answer.text.chars().count(),
                   "url": c.url, "title": c.title})
        })
        .collect()
}

fn output_text(answer: &Answer) -> Value {
    json!({"type": "output_text", "text": answer.text, "annotations": annotations(answer), "logprobs": []})
}

fn message(answer: &Answer, done: bool) -> Value {
    let (status, content) = if done {
        ("completed", vec![output_text(answer)])
    } else {
        ("in_progress", Vec::new())
    };
    json!({"type": "message", "id": MESSAGE_ID, "status": status, "role": "assistant", "content": content})
}

fn function_call(i: usize, answer: &Answer, done: bool) -> Value {
    let call = &answer.tool_calls[i];
    let (status, arguments) = if done {
        ("completed", call.arguments.to_string())
    } else {
        ("in_progress", String::new())
    };
    json!({"type": "function_call", "id": format!("fc_mock_{i}"), "call_id": call.id,
           "name": call.name, "arguments": arguments, "status": status})
}

fn output(answer: &Answer) -> Vec<Value> {
    let mut output: Vec<Value> = (0..answer.web_searches)
        .map(|i| web_search_call(i, "completed"))
        .collect();
    if !answer.text.is_empty() {
        output.push(message(answer, true));
    }
    output.extend((0..answer.tool_calls.len()).map(|i| function_call(i, answer, true)));
    output
}

fn response(answer: &Answer, status: &str, output: Vec<Value>, usage: Value) -> Value {
    json!({"id": RESPONSE_ID, "object": "response", "created_at": 1, "status": status,
           "model": answer.model, "output": output, "usage": usage, "error": Value::Null,
           "incomplete_details": Value::Null})
}

/// The response object of a non-streamed call.
pub fn body(answer: &Answer) -> Value {
    response(answer, "completed", output(answer), usage(answer))
}

/// The typed events of a streamed call, each with its `event:` name and `sequence_number`.
pub fn stream(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sequence = 0u64;
    let mut emit = |mut event: Value| {
        event["sequence_number"] = Value::from(sequence);
        sequence += 1;
        let kind = event["type"].as_str().unwrap_or("").to_string();
        sse(&mut out, Some(&kind), &event.to_string());
    };
    emit(json!({"type": "response.created",
                "response": response(answer, "in_progress", Vec::new(), Value::Null)}));
    let mut index = 0u64;
    for i in 0..answer.web_searches {
        let id = format!("ws_mock_{i}");
        emit(
            json!({"type": "response.output_item.added", "output_index": index,
                    "item": web_search_call(i, "in_progress")}),
        );
        for phase in ["in_progress", "searching", "completed"] {
            emit(json!({"type": format!("response.web_search_call.{phase}"),
                        "output_index": index, "item_id": id}));
        }
        emit(
            json!({"type": "response.output_item.done", "output_index": index,
                    "item": web_search_call(i, "completed")}),
        );
        index += 1;
    }
    if !answer.text.is_empty() {
        let at = json!({"item_id": MESSAGE_ID, "output_index": index, "content_index": 0});
        let with = |mut event: Value| {
            if let (Some(event), Some(at)) = (event.as_object_mut(), at.as_object()) {
                event.extend(at.clone());
            }
            event
        };
        emit(
            json!({"type": "response.output_item.added", "output_index": index,
                    "item": message(answer, false)}),
        );
        emit(with(json!({"type": "response.content_part.added",
                         "part": {"type": "output_text", "text": "", "annotations": []}})));
        for piece in split_text(&answer.text) {
            emit(with(
                json!({"type": "response.output_text.delta", "delta": piece, "logprobs": []}),
            ));
        }
        for (i, annotation) in annotations(answer).into_iter().enumerate() {
            emit(with(
                json!({"type": "response.output_text.annotation.added",
                             "annotation_index": i, "annotation": annotation}),
            ));
        }
        emit(with(
            json!({"type": "response.output_text.done", "text": answer.text, "logprobs": []}),
        ));
        emit(with(
            json!({"type": "response.content_part.done", "part": output_text(answer)}),
        ));
        emit(
            json!({"type": "response.output_item.done", "output_index": index,
                    "item": message(answer, true)}),
        );
        index += 1;
    }
    for i in 0..answer.tool_calls.len() {
        let id = format!("fc_mock_{i}");
        emit(
            json!({"type": "response.output_item.added", "output_index": index,
                    "item": function_call(i, answer, false)}),
        );
        let args = answer.tool_calls[i].arguments.to_string();
        let (head, tail) = args.split_at(args.floor_char_boundary(args.len() / 2));
        for part in [head, tail] {
            emit(
                json!({"type": "response.function_call_arguments.delta", "output_index": index,
                        "item_id": id, "delta": part}),
            );
        }
        emit(
            json!({"type": "response.function_call_arguments.done", "output_index": index,
                    "item_id": id, "arguments": args}),
        );
        emit(
            json!({"type": "response.output_item.done", "output_index": index,
                    "item": function_call(i, answer, true)}),
        );
        index += 1;
    }
    emit(json!({"type": "response.completed",
                "response": response(answer, "completed", output(answer), usage(answer))}));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{CitationReply, ToolCallReply};

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
            model: "gpt-4o-mini".into(),
            web_searches: 2,
            citations: vec![CitationReply {
                url: "https://a.example".into(),
                title: "A".into(),
            }],
        }
    }

    fn events(bytes: &[u8]) -> Vec<(String, Value)> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.split("\r\n\r\n")
            .filter(|e| !e.is_empty())
            .map(|event| {
                let (name, data) = event.split_once("\r\n").unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_string();
                let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                (name, data)
            })
            .collect()
    }

    #[test]
    fn body_lists_searches_message_and_calls() {
        let body = body(&answer());
        let kinds: Vec<&str> = body["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "web_search_call",
                "web_search_call",
                "message",
                "function_call"
            ]
        );
        assert_eq!(body["output"][2]["content"][0]["text"], "Héllo wörld");
        assert_eq!(
            body["output"][2]["content"][0]["annotations"][0]["url"],
            "https://a.example"
        );
        assert_eq!(body["output"][3]["arguments"], "{\"q\":1}");
        assert_eq!(body["usage"]["input_tokens"], 10);
        assert_eq!(body["status"], "completed");
    }

    #[test]
    fn stream_events_are_named_sequenced_and_complete() {
        let events = events(&stream(&answer()));
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["type"], name.as_str());
            assert_eq!(data["sequence_number"], i);
        }
        let text: String = events
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Héllo wörld");
        let args: String = events
            .iter()
            .filter(|(n, _)| n == "response.function_call_arguments.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"q\":1}");
        let searches_done = events
            .iter()
            .filter(|(n, d)| {
                n == "response.output_item.done" && d["item"]["type"] == "web_search_call"
            })
            .count();
        assert_eq!(searches_done, 2);
        let (last, data) = events.last().unwrap();
        assert_eq!(last, "response.completed");
        assert_eq!(data["response"]["usage"]["output_tokens"], 5);
    }
}
