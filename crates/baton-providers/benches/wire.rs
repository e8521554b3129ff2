//! Each wire format's per-call work without HTTP: the canonical request mapped and serialised
//! as sent, a non-streamed answer decoded and mapped back, and a streamed answer (100 text
//! deltas, a tool call, usage) parsed from memory in 1 KB chunks into canonical deltas.
//! The bodies are the mock provider's (`baton-testkit`), which speak the real wire formats.
//! `cargo xtask bench` (or `cargo bench -p baton-providers`); figures in docs/performance.md.

// A benchmark whose fixture is wrong should stop loudly, like a test.
#![allow(clippy::expect_used)]

use std::convert::Infallible;
use std::hint::black_box;

use baton_domain::chat::{
    InferenceRequest, Message, Role, StreamDelta, ToolCall, ToolChoice, ToolDefinition,
};
use baton_providers::bench::{Format, parse_response, parse_stream, request_body};
use baton_testkit::{Answer, ToolCallReply, bedrock, gemini, mock, responses};
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use serde_json::json;

const CHUNK_BYTES: usize = 1024;

fn model(format: Format) -> &'static str {
    match format {
        Format::OpenAiChat | Format::OpenAiResponses => "gpt-4.1-mini",
        Format::Anthropic => "claude-sonnet-4-5",
        Format::Gemini => "gemini-2.5-flash",
        Format::Bedrock => "anthropic.claude-3-5-sonnet-20241022-v2:0",
    }
}

fn tool(name: &str, description: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: Some(description.into()),
        parameters: json!({
            "type": "object",
            "properties": {
                "account_id": {"type": "string", "description": "The customer's account"},
                "from": {"type": "string", "format": "date"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100}
            },
            "required": ["account_id"],
            "additionalProperties": false
        }),
        strict: None,
    }
}

/// A support conversation: a 2 KB system prompt, three user turns, an assistant tool call and
/// its result, two tools.
fn request(format: Format) -> InferenceRequest {
    let system =
        "You answer questions about the customer's account precisely and politely. ".repeat(28);
    let messages = vec![
        Message::text(Role::System, system),
        Message::text(Role::User, "What did I spend on travel last month?"),
        Message {
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "list_transactions".into(),
                arguments: r#"{"account_id":"acc_42","from":"2026-10-01"}"#.into(),
            }],
            ..Message::text(Role::Assistant, "")
        },
        Message {
            tool_call_id: Some("call_1".into()),
            name: Some("list_transactions".into()),
            ..Message::text(
                Role::Tool,
                json!([{"date": "2026-10-03", "amount": 412.5, "category": "travel"},
                       {"date": "2026-10-17", "amount": 88.0, "category": "travel"}])
                .to_string(),
            )
        },
        Message::text(Role::Assistant, "You spent 500.50 on travel in October."),
        Message::text(Role::User, "And the month before? Compare the two."),
    ];
    InferenceRequest {
        model: model(format).into(),
        messages,
        temperature: Some(0.2),
        max_tokens: Some(1024),
        tools: vec![
            tool(
                "list_transactions",
                "Transactions of an account since a date",
            ),
            tool("account_summary", "Balance and limits of an account"),
        ],
        tool_choice: Some(ToolChoice::Auto),
        stream_usage: true,
        ..InferenceRequest::default()
    }
}

/// 300 characters of text (100 stream deltas of 3 characters) and one tool call.
fn answer(format: Format) -> Answer {
    Answer {
        text: "Your travel spend was 500.50 in October and 310.20 in September. ".repeat(5)[..300]
            .to_string(),
        tool_calls: vec![ToolCallReply {
            id: "call_2".into(),
            name: "account_summary".into(),
            arguments: json!({"account_id": "acc_42"}),
        }],
        tokens_in: 1250,
        tokens_out: 180,
        model: model(format).into(),
        web_searches: 0,
        citations: Vec::new(),
    }
}

fn body(format: Format, answer: &Answer) -> Vec<u8> {
    let value = match format {
        Format::OpenAiChat => mock::openai_body(answer),
        Format::OpenAiResponses => responses::body(answer),
        Format::Anthropic => mock::anthropic_body(answer),
        Format::Gemini => gemini::body(answer),
        Format::Bedrock => bedrock::body(answer),
    };
    value.to_string().into_bytes()
}

fn stream_body(format: Format, answer: &Answer) -> Bytes {
    Bytes::from(match format {
        Format::OpenAiChat => mock::openai_stream(answer),
        Format::OpenAiResponses => responses::stream(answer),
        Format::Anthropic => mock::anthropic_stream(answer),
        Format::Gemini => gemini::stream(answer),
        Format::Bedrock => bedrock::stream(answer),
    })
}

/// Parses `body` as it would arrive, in `CHUNK_BYTES` pieces; returns the number of deltas.
fn parse(format: Format, body: &Bytes, request: &InferenceRequest) -> usize {
    let chunks: Vec<Result<Bytes, Infallible>> = (0..body.len())
        .step_by(CHUNK_BYTES)
        .map(|start| Ok(body.slice(start..(start + CHUNK_BYTES).min(body.len()))))
        .collect();
    let deltas = parse_stream(format, futures::stream::iter(chunks), request);
    futures::executor::block_on(deltas.fold(0, |count, delta| {
        black_box(delta.expect("the stream parses"));
        async move { count + 1 }
    }))
}

fn wire(c: &mut Criterion) {
    let mut mapping = c.benchmark_group("request_body");
    for format in Format::ALL {
        let request = request(format);
        let bytes = request_body(format, &request, true).expect("maps");
        mapping.throughput(Throughput::Bytes(bytes.len() as u64));
        mapping.bench_function(BenchmarkId::from_parameter(format.name()), |b| {
            b.iter(|| request_body(format, black_box(&request), true))
        });
    }
    mapping.finish();

    let mut sync = c.benchmark_group("parse_response");
    for format in Format::ALL {
        let request = request(format);
        let answer = answer(format);
        let bytes = body(format, &answer);
        let parsed = parse_response(format, &bytes, &request).expect("parses");
        assert_eq!(parsed.text, answer.text, "{}", format.name());
        assert_eq!(parsed.tool_calls.len(), 1, "{}", format.name());
        sync.throughput(Throughput::Bytes(bytes.len() as u64));
        sync.bench_function(BenchmarkId::from_parameter(format.name()), |b| {
            b.iter(|| parse_response(format, black_box(&bytes), &request))
        });
    }
    sync.finish();

    let mut stream = c.benchmark_group("parse_stream");
    for format in Format::ALL {
        let request = request(format);
        let answer = answer(format);
        let bytes = stream_body(format, &answer);
        let deltas: Vec<StreamDelta> = futures::executor::block_on(
            parse_stream(
                format,
                futures::stream::iter([Ok::<_, Infallible>(bytes.clone())]),
                &request,
            )
            .map(|d| d.expect("the stream parses"))
            .collect(),
        );
        let texts = deltas
            .iter()
            .filter(|d| matches!(d, StreamDelta::Text(_)))
            .count();
        assert!(texts >= 100, "{}: {texts} text deltas", format.name());
        assert!(
            deltas.iter().any(|d| matches!(d, StreamDelta::Usage(_))),
            "{}: no usage",
            format.name()
        );
        eprintln!(
            "{}: stream of {} bytes, {} deltas",
            format.name(),
            bytes.len(),
            deltas.len()
        );
        stream.throughput(Throughput::Bytes(bytes.len() as u64));
        stream.bench_function(BenchmarkId::from_parameter(format.name()), |b| {
            b.iter(|| parse(format, black_box(&bytes), &request))
        });
    }
    stream.finish();
}

criterion_group!(benches, wire);
criterion_main!(benches);
