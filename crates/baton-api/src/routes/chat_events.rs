//! The events stream format of `/chat/completions` (DESIGN.md "Streams"): SPEC.md envelopes
//! (`requestStarted`, `agentInferenceStarted`, `contentDelta`, `agentInferenceCompleted`,
//! `usageUpdate`, `heartbeat`, `requestCompleted`, `error`, `requestFailed`) instead of chunks.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::sse::Event;
use baton_domain::chat::{ResponseAccumulator, StreamDelta, Usage};
use baton_domain::credits::Credits;
use baton_providers::DeltaStream;
use baton_providers::structured::OutputSchema;
use futures::{Stream, StreamExt};
use serde_json::{Map, Value, json};
use tokio::time::{Interval, interval_at};

use crate::cache::CacheFill;
use crate::error::ApiError;
use crate::events::{CallInfo, EventFilter, EventLog, request_completed};
use crate::routes::chat::structured_output_problem;

use crate::runlog::{Pricing, RunLog};

const EVENT_ONLY_OPTIONS: &[&str] = &[
    "usage_interval_ms",
    "heartbeat_interval_ms",
    "include_tool_results",
    "include_agent_results",
    "event_types",
];
const DEFAULT_USAGE_INTERVAL_MS: u64 = 5_000;
const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 30_000;
const MIN_INTERVAL_MS: u64 = 100;

/// Whether `stream_options` asks for the events format.
pub fn wants_events(options: &Map<String, Value>) -> bool {
    options.get("format").and_then(Value::as_str) == Some("events")
        || EVENT_ONLY_OPTIONS.iter().any(|k| options.contains_key(*k))
}

/// The events-format options, validated.
pub struct EventOptions {
    include_usage: bool,
    usage_interval: Duration,
    heartbeat_interval: Duration,
    pub filter: EventFilter,
    /// Full tool results in `toolCompleted` (`result`), not only the preview.
    pub include_tool_results: bool,
    /// Full sub-agent answers in `agentCompleted` (`result`).
    pub include_agent_results: bool,
}

impl EventOptions {
    pub fn parse(options: &Map<String, Value>) -> Result<EventOptions, ApiError> {
        let interval = |name: &str, default: u64| -> Result<Duration, ApiError> {
            match options.get(name) {
                None | Some(Value::Null) => Ok(Duration::from_millis(default)),
                Some(v) => v
                    .as_u64()
                    .filter(|ms| *ms >= MIN_INTERVAL_MS)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        ApiError::validation(
                            format!("stream_options.{name}"),
                            format!("{name} must be an integer of at least {MIN_INTERVAL_MS}"),
                        )
                    }),
            }
        };
        let flag = |name: &str| -> Result<bool, ApiError> {
            match options.get(name) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ApiError::validation(
                    format!("stream_options.{name}"),
                    format!("{name} must be a boolean"),
                )),
            }
        };
        let types = match options.get("event_types") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            Some(_) => {
                return Err(ApiError::validation(
                    "stream_options.event_types",
                    "event_types must be an array of strings",
                ));
            }
        };
        Ok(EventOptions {
            include_usage: options
                .get("include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            usage_interval: interval("usage_interval_ms", DEFAULT_USAGE_INTERVAL_MS)?,
            heartbeat_interval: interval("heartbeat_interval_ms", DEFAULT_HEARTBEAT_INTERVAL_MS)?,
            filter: EventFilter::new(&types),
            include_tool_results: flag("include_tool_results")?,
            include_agent_results: flag("include_agent_results")?,
        })
    }
}

enum Phase {
    Start,
    Relay,
    Done,
}

/// What a stream does when it ends well: check the schema, fill the cache.
pub struct StreamEnd {
    pub fill: Option<CacheFill>,
    pub schema: Option<OutputSchema>,
}

pub struct EventStream {
    upstream: DeltaStream,
    events: EventLog,
    options: EventOptions,
    accumulator: ResponseAccumulator,
    log: Option<RunLog>,
    pricing: Pricing,
    call: CallInfo,
    inference_started: Instant,
    usage_tick: Interval,
    heartbeat_tick: Interval,
    phase: Phase,
    /// Where a complete answer is cached.
    fill: Option<CacheFill>,
    /// The requested response schema, checked when the stream ends.
    schema: Option<OutputSchema>,
}

impl EventStream {
    pub fn new(
        upstream: DeltaStream,
        events: EventLog,
        options: EventOptions,
        log: RunLog,
        pricing: Pricing,
        call: CallInfo,
        end: StreamEnd,
    ) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            usage_tick: interval_at(now + options.usage_interval, options.usage_interval),
            heartbeat_tick: interval_at(
                now + options.heartbeat_interval,
                options.heartbeat_interval,
            ),
            upstream,
            events,
            options,
            accumulator: ResponseAccumulator::new(call.model.clone()),
            log: Some(log),
            pricing,
            inference_started: Instant::now(),
            call,
            phase: Phase::Start,
            fill: end.fill,
            schema: end.schema,
        }
    }

    fn cost(&self, usage: &Usage) -> Credits {
        self.pricing
            .cost(
                &self.call.provider_key,
                &self.call.model,
                &self.call.model,
                usage,
            )
            .billed
    }

    /// Emits an event; returns its SSE form if the client's filter lets it through.
    fn emit(&mut self, event_type: &str, data: Value) -> Option<Event> {
        let envelope = self.events.emit(event_type, data);
        self.options.filter.allows(event_type).then(|| {
            let id = envelope["id"].as_str().unwrap_or_default().to_string();
            Event::default().id(id).data(envelope.to_string())
        })
    }

    fn usage_update(&mut self) -> Option<Event> {
        let usage = self.accumulator.usage();
        let credits = self.cost(&usage);
        let data = json!({
            "cumulativeCreditsUsed": credits.0, "cumulativeCostUsd": credits.to_usd(),
            "cumulativeTokensIn": usage.tokens_in, "cumulativeTokensOut": usage.tokens_out,
            "activeAgents": if matches!(self.phase, Phase::Done) { 0 } else { 1 },
            "completedAgents": if matches!(self.phase, Phase::Done) { 1 } else { 0 },
            "elapsedMs": self.events.elapsed_ms(),
        });
        self.emit("usageUpdate", data)
    }

    fn inference_completed(&mut self) -> Option<Event> {
        let response = self.accumulator.snapshot();
        let credits = self.cost(&response.usage);
        let duration_ms =
            u64::try_from(self.inference_started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let data = self
            .call
            .inference_completed(&response, credits, duration_ms);
        self.emit("agentInferenceCompleted", data)
    }

    fn request_completed(&mut self) -> Option<Event> {
        let response = self.accumulator.snapshot();
        let credits = self.cost(&response.usage);
        let data = request_completed(&response, credits, self.events.elapsed_ms());
        self.emit("requestCompleted", data)
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if let Some(mut log) = self.log.take() {
            // The client left: the provider call is cancelled with `upstream`; what it produced
            // is still logged and billed.
            let partial = self.accumulator.snapshot();
            log.finish_partial(
                &self.call.provider_key,
                &self.call.model,
                &partial,
                "CLIENT_DISCONNECTED",
                "the client closed the stream",
            );
            log.attach_events(self.events.take_stored());
            log.flush_in_background();
        }
    }
}

/// `[DONE]` ends every stream; like every event it has an id.
fn done_event() -> Event {
    Event::default()
        .id(uuid::Uuid::now_v7().to_string())
        .data("[DONE]")
}

/// The SSE events of an events-format stream, ending with `[DONE]`.
pub fn event_stream(state: EventStream) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    futures::stream::unfold(state, |mut s| async move {
        let mut batch: Vec<Option<Event>> = Vec::new();
        match s.phase {
            Phase::Start => {
                s.phase = Phase::Relay;
                let (started, inference) = (s.call.request_started(), s.call.inference_started());
                batch.push(s.emit("requestStarted", started));
                batch.push(s.emit("agentInferenceStarted", inference));
            }
            Phase::Relay => {
                tokio::select! {
                    item = s.upstream.next() => match item {
                        Some(Ok(delta)) => {
                            s.accumulator.push(&delta);
                            if let StreamDelta::Text(text) = &delta {
                                batch.push(s.emit("contentDelta", json!({"text": text})));
                            }
                        }
                        Some(Err(err)) => {
                            let error = ApiError::from(err);
                            batch.push(s.emit("error", json!({"code": error.code(), "message": error.to_string(),
                                                              "agentRole": Value::Null, "recoverable": false})));
                            let partial = s.accumulator.snapshot();
                            let produced = !partial.text.is_empty() || !partial.tool_calls.is_empty();
                            s.phase = Phase::Done;
                            if produced {
                                batch.push(s.request_completed());
                            } else {
                                batch.push(s.emit("requestFailed", json!({"code": error.code(), "message": error.to_string()})));
                            }
                            if let Some(mut log) = s.log.take() {
                                log.finish_partial(&s.call.provider_key, &s.call.model, &partial, error.code(), &error.to_string());
                                log.attach_events(s.events.take_stored());
                                log.flush().await;
                            }
                            batch.push(Some(done_event()));
                        }
                        None => {
                            let response = s.accumulator.snapshot();
                            let invalid = structured_output_problem(s.schema.as_ref(), &response);
                            if let Some(error) = &invalid {
                                batch.push(s.emit("error", json!({"code": error.code(), "message": error.to_string(),
                                                                  "agentRole": Value::Null, "recoverable": false})));
                            }
                            batch.push(s.inference_completed());
                            s.phase = Phase::Done;
                            if s.options.include_usage {
                                batch.push(s.usage_update());
                            }
                            batch.push(s.request_completed());
                            if let Some(mut log) = s.log.take() {
                                log.attach_events(s.events.take_stored());
                                match invalid {
                                    None => {
                                        log.succeed(&s.call.provider_key, &s.call.model, &response).await;
                                        if let Some(fill) = s.fill.take() {
                                            fill.fill(response).await;
                                        }
                                    }
                                    Some(error) => {
                                        log.finish_partial(&s.call.provider_key, &s.call.model, &response, error.code(), &error.to_string());
                                        log.flush().await;
                                    }
                                }
                            }
                            batch.push(Some(done_event()));
                        }
                    },
                    _ = s.usage_tick.tick(), if s.options.include_usage => batch.push(s.usage_update()),
                    _ = s.heartbeat_tick.tick() => {
                        let data = json!({"elapsedMs": s.events.elapsed_ms(), "eventCount": s.events.count()});
                        batch.push(s.emit("heartbeat", data));
                    }
                }
            }
            Phase::Done => return None,
        }
        Some((futures::stream::iter(batch.into_iter().flatten().map(Ok)), s))
    })
    .flatten()
}
