//! Event envelopes on the streaming path: building one (`EventLog::emit_in`: id, timestamp,
//! envelope, the stored copy) and serialising it as the events stream sends it (the SSE framing
//! itself is axum's, in baton-api), a one-call request's stored lifecycle, recorded or kept
//! compactly, plus the client's event-type filter.
//! `cargo xtask bench` (or `cargo bench -p baton-executor`); figures in docs/performance.md.

#![allow(clippy::expect_used)]

use std::hint::black_box;

use baton_domain::chat::{FinishReason, InferenceResponse, Usage};
use baton_domain::credits::Credits;
use baton_domain::lifecycle::LoggedAnswer;
use baton_executor::EventFilter;
use baton_executor::events::{CallInfo, EventLog, record_call_outcome, record_call_started};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

const REQUEST_ID: &str = "0193b2c4-7e1a-7000-8000-00000000002a";

/// What the events stream does with an envelope: its id for the SSE `id:` line, its JSON text.
fn serialise(envelope: &Value) -> (String, String) {
    let id = envelope
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (id, envelope.to_string())
}

fn emit(c: &mut Criterion) {
    let agent_path = vec!["researcher".to_string(), "summariser".to_string()];
    let fresh_log = || EventLog::new(REQUEST_ID.to_string());

    // The most frequent event: not stored, one per provider delta.
    c.bench_function("emit_content_delta", |b| {
        b.iter_batched_ref(
            fresh_log,
            |log| {
                log.emit_in(
                    "contentDelta",
                    json!({"text": black_box("the ")}),
                    &agent_path,
                    2,
                )
            },
            BatchSize::SmallInput,
        )
    });
    c.bench_function("emit_and_serialise_content_delta", |b| {
        b.iter_batched_ref(
            fresh_log,
            |log| {
                let envelope = log.emit_in(
                    "contentDelta",
                    json!({"text": black_box("the ")}),
                    &agent_path,
                    2,
                );
                serialise(&envelope)
            },
            BatchSize::SmallInput,
        )
    });

    // A stored event with a larger payload.
    let call = CallInfo {
        flow_name: None,
        warnings: Vec::new(),
        provider_key: "openai".into(),
        model: "gpt-4.1-mini".into(),
        requested_model: "openai/gpt-4.1-mini".into(),
        message_count: 6,
        tool_count: 2,
        inference_id: "0193b2c4-7e1a-7000-8000-00000000002b".into(),
        was_cached: false,
        was_fallback: false,
        earlier_call: None,
    };
    let response = InferenceResponse {
        model: "gpt-4.1-mini".into(),
        text: "You spent 500.50 on travel in October.".into(),
        finish_reason: FinishReason::Stop,
        usage: Usage {
            tokens_in: 1_250,
            tokens_out: 180,
            ..Usage::default()
        },
        ..InferenceResponse::default()
    };
    c.bench_function("emit_and_serialise_inference_completed", |b| {
        b.iter_batched_ref(
            fresh_log,
            |log| {
                let data = baton_executor::events::data_value(&call.inference_completed(
                    &response,
                    Credits(4_812),
                    1_234,
                ));
                let envelope = log.emit_in("agentInferenceCompleted", data, &agent_path, 2);
                serialise(&envelope)
            },
            BatchSize::SmallInput,
        )
    });
}

/// A one-call request's stored lifecycle: its four events recorded as envelopes (what a
/// stream's failure still does), against the compact lifecycle an answered request keeps
/// (serialised as the store writes it), and that lifecycle rebuilt into the four (a read of
/// `/llm-logs/{id}/events`).
fn lifecycle(c: &mut Criterion) {
    let call = CallInfo {
        flow_name: None,
        warnings: Vec::new(),
        provider_key: "openai".into(),
        model: "gpt-4o-mini".into(),
        requested_model: "gpt-4o-mini".into(),
        message_count: 1,
        tool_count: 0,
        inference_id: "0193b2c4-7e1a-7000-8000-00000000002b".into(),
        was_cached: false,
        was_fallback: false,
        earlier_call: None,
    };
    let response = InferenceResponse {
        model: "gpt-4o-mini".into(),
        text: "Hello! How can I help you today?".into(),
        finish_reason: FinishReason::Stop,
        usage: Usage {
            tokens_in: 12,
            tokens_out: 9,
            ..Usage::default()
        },
        ..InferenceResponse::default()
    };
    let started = || {
        let mut log = EventLog::new(REQUEST_ID.to_string());
        record_call_started(&mut log, &call);
        log
    };
    c.bench_function("one_call_lifecycle_recorded", |b| {
        b.iter_batched(
            started,
            |mut log| {
                record_call_outcome(&mut log, &call, Ok((&response, Credits(7))));
                log.take_stored()
            },
            BatchSize::SmallInput,
        )
    });
    c.bench_function("one_call_lifecycle_kept", |b| {
        b.iter_batched(
            started,
            |mut log| {
                let kept = log.answered_call_lifecycle(&call, &response, Credits(7), true);
                serde_json::to_vec(&kept)
            },
            BatchSize::SmallInput,
        )
    });
    let kept = started()
        .answered_call_lifecycle(&call, &response, Credits(7), true)
        .expect("only the start was recorded");
    let answer = LoggedAnswer {
        text: response.text.clone(),
        ..LoggedAnswer::default()
    };
    c.bench_function("one_call_lifecycle_rebuilt", |b| {
        b.iter(|| black_box(&kept).events(REQUEST_ID, Some(&answer)))
    });
}

fn filter(c: &mut Criterion) {
    let filter = EventFilter::new(&[
        "tool*".to_string(),
        "agent.inference.completed".to_string(),
        "requestCompleted".to_string(),
    ]);
    let types = [
        "contentDelta",
        "toolStarted",
        "agentInferenceCompleted",
        "usageUpdate",
        "requestCompleted",
    ];
    assert_eq!(
        types.iter().filter(|t| filter.allows(t)).count(),
        3,
        "the fixture allows three of five"
    );
    c.bench_function("event_filter_allows_5_types", |b| {
        b.iter(|| types.iter().filter(|t| filter.allows(black_box(t))).count())
    });
    let everything = EventFilter::default();
    c.bench_function("event_filter_allows_unfiltered", |b| {
        b.iter(|| everything.allows(black_box("contentDelta")))
    });
}

criterion_group!(benches, emit, lifecycle, filter);
criterion_main!(benches);
