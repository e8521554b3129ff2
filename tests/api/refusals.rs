//! OpenAI refusals (`message.refusal`, `delta.refusal`) relayed on the compatible endpoint as
//! OpenAI sends them, and taken as a final answer under a response schema (no retry, no error).

use baton_testkit::Reply;
use serde_json::{Value, json};

use crate::chat::{app_with_mock, wait_for_run};

const REFUSAL: &str = "I'm sorry, I can't help with that.";

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "openai/gpt-4o-mini",
                          "messages": [{"role": "user", "content": "Say something forbidden"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn schema() -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {
        "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}}})
}

/// The JSON payloads of an SSE body's `data:` lines, `[DONE]` as a string.
fn sse_data(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.trim().to_string())
        .collect()
}

#[tokio::test]
async fn a_refusal_is_relayed_and_is_a_final_answer_under_a_schema() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    for extra in [json!({}), schema()] {
        let before = mock.received().len();
        mock.push(Reply::Refusal(REFUSAL.into()));
        let response = app
            .post("/api/v1/chat/completions", &key, chat(extra.clone()))
            .await;
        assert_eq!(response.status, 200, "{extra}: {}", response.text);
        let body = response.json();
        let message = &body["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null, "{extra}");
        assert_eq!(message["refusal"], REFUSAL, "{extra}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            mock.received().len(),
            before + 1,
            "{extra}: a refusal is not retried"
        );
        let id = response.headers["x-request-id"].to_str().unwrap();
        let run = wait_for_run(&app, id).await;
        assert_eq!(run.error_code, None, "{extra}");
    }
}

#[tokio::test]
async fn a_streamed_refusal_comes_in_refusal_deltas_without_an_error() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    for extra in [json!({"stream": true}), {
        let mut with_schema = schema();
        with_schema["stream"] = json!(true);
        with_schema
    }] {
        mock.push(Reply::Refusal(REFUSAL.into()));
        let response = app
            .post("/api/v1/chat/completions", &key, chat(extra.clone()))
            .await;
        assert_eq!(response.status, 200, "{extra}: {}", response.text);
        let data = sse_data(&response.text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{extra}");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(
            chunks.iter().all(|c| c.get("error").is_none()),
            "{extra}: {}",
            response.text
        );
        let refusal: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["refusal"].as_str())
            .collect();
        assert_eq!(refusal, REFUSAL, "{extra}");
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "", "{extra}: the refusal is not content");
        let finish: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["choices"][0]["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&json!("stop")], "{extra}");
        let id = response.headers["x-request-id"].to_str().unwrap();
        let run = wait_for_run(&app, id).await;
        assert_eq!(run.error_code, None, "{extra}");
    }
}

/// The service-format answers carry the refusal too: `/inference` and the stored response.
#[tokio::test]
async fn inference_answers_and_the_log_carry_the_refusal() {
    let (app, mock) = app_with_mock().await;
    let key = app.default_tenant.api_key.clone();
    mock.push(Reply::Refusal(REFUSAL.into()));
    let response = app
        .post(
            "/api/v1/inference",
            &key,
            json!({"model": "openai/gpt-4o-mini",
                   "messages": [{"role": "user", "content": "Say something forbidden"}]}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let body = response.json();
    assert_eq!(body["refusal"], REFUSAL, "{body}");
    let id = body["id"].as_str().unwrap();
    let run = wait_for_run(&app, id).await;
    let logged = run.response.unwrap().to_value();
    assert_eq!(logged["refusal"], REFUSAL, "{logged}");
}
