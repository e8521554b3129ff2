//! The events of a request made of one streamed model call (DESIGN.md "Streams"): SPEC.md
//! envelopes (`requestStarted`, `agentInferenceStarted`, `contentDelta`,
//! `agentInferenceCompleted`, `usageUpdate`, `heartbeat`, `requestCompleted`, `error`,
//! `requestFailed`) as the deltas arrive. The stream starts before the provider has answered
//! (its model may think for a while first), with heartbeats while it waits; a provider that
//! fails before its first token ends it with `error` and `requestFailed`. Dropping the stream
//! (the client left) cancels the provider call; what it produced is still logged and billed.

use std::time::Instant;

use baton_domain::chat::{InferenceResponse, ResponseAccumulator, StreamDelta, Usage};
use baton_domain::credits::Credits;
use baton_providers::DeltaStream;
use baton_providers::structured::OutputSchema;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::time::{Interval, MissedTickBehavior, interval_at};

use crate::cache::CacheFill;
use crate::error::ExecutorError;
use crate::events::{
    CallInfo, EventLog, EventOptions, data_value, record_call_end, request_completed, request_error,
};
use crate::gateway::{Answer, Failure, Opening, Routed};
use crate::runlog::{Pricing, RunLog};

/// A streamed answer is checked against the requested schema once complete. The text is already
/// with the client, so there is no retry: the client is told, and the run records it.
pub fn structured_output_problem(
    schema: Option<&OutputSchema>,
    response: &InferenceResponse,
) -> Option<ExecutorError> {
    // Tool calls and a refusal are complete answers that follow no schema.
    let schema = schema.filter(|_| response.tool_calls.is_empty() && response.refusal.is_none())?;
    schema.check(&response.text).err().map(|problem| {
        ExecutorError::StructuredOutputInvalid(format!(
            "the streamed answer does not follow the response schema: {problem}"
        ))
    })
}

enum Phase {
    Start,
    /// Waiting for the provider's first event.
    Opening,
    Relay,
    Done,
}

pub struct EventStream {
    /// The provider call until its stream has started.
    opening: Option<Opening>,
    /// The provider's deltas once it has (an empty stream until then).
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
    /// Past it the stream ends with an `error` event (`limits.max_stream_duration`).
    deadline: Option<Deadline>,
}

impl EventStream {
    /// `schema`: the requested response schema, checked once the answer is complete.
    pub fn new(
        opening: Opening,
        events: EventLog,
        options: EventOptions,
        log: RunLog,
        pricing: Pricing,
        call: CallInfo,
        schema: Option<OutputSchema>,
    ) -> Self {
        let now = tokio::time::Instant::now();
        // A tick missed while a step was busy is not made up in a burst of copies.
        let every = |period| {
            let mut tick = interval_at(now + period, period);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        };
        Self {
            usage_tick: every(options.usage_interval),
            heartbeat_tick: every(options.heartbeat_interval),
            opening: Some(opening),
            upstream: Box::pin(futures::stream::empty()),
            events,
            options,
            accumulator: ResponseAccumulator::new(call.model.clone()),
            log: Some(log),
            pricing,
            inference_started: Instant::now(),
            call,
            phase: Phase::Start,
            fill: None,
            schema,
            deadline: None,
        }
    }

    /// Ends the stream after `max` with an `error` event carrying `error`; the provider call is
    /// dropped and what it produced is logged and billed.
    pub fn with_deadline(mut self, max: std::time::Duration, error: ExecutorError) -> Self {
        self.deadline = Some(Deadline::after(max, error));
        self
    }

    /// Ends the stream on `error`: `error` event, then `requestCompleted` if anything was
    /// produced (else `requestFailed`); the log records the partial answer with the error.
    async fn fail(&mut self, error: &ExecutorError) -> Vec<Option<Value>> {
        let mut batch = vec![self.emit("error", request_error(error.code(), &error.to_string()))];
        let mut partial = self.accumulator.snapshot();
        let produced = partial.has_output();
        self.phase = Phase::Done;
        let mut log = self.log.take();
        // What the run is billed on (an estimate when the provider reported no usage) is what
        // the stream's last events say it cost.
        if let Some(log) = log.as_mut() {
            partial.usage = log.finish_partial(
                &self.call.provider_key,
                &self.call.model,
                &partial,
                self.accumulator.is_finished(),
                error.code(),
                &error.to_string(),
            );
        }
        if produced {
            batch.push(self.inference_completed(&partial));
            batch.push(self.request_completed(&partial));
        } else {
            batch.push(self.emit(
                "requestFailed",
                json!({"code": error.code(), "message": error.to_string()}),
            ));
        }
        if let Some(mut log) = log {
            log.attach_events(self.events.take_stored());
            log.flush().await;
        }
        batch
    }

    /// The provider call's outcome: its stream relayed from now on, or the request failed.
    async fn opened(
        &mut self,
        (opened, routed, fill): (
            Result<Answer<DeltaStream>, Failure>,
            Routed,
            Option<CacheFill>,
        ),
    ) -> Vec<Option<Value>> {
        self.opening = None;
        if let Some(log) = self.log.as_mut() {
            routed.note(log);
        }
        match opened {
            Ok(answer) => {
                self.call
                    .served_by(&answer.model, answer.fallback_used, answer.cached);
                if answer.cached {
                    self.pricing = self.pricing.for_cached();
                }
                self.accumulator = ResponseAccumulator::new(self.call.model.clone());
                self.fill = fill;
                self.upstream = answer.value;
                self.phase = Phase::Relay;
                Vec::new()
            }
            Err(failure) => {
                self.phase = Phase::Done;
                let (code, message) = (failure.error.code(), failure.error.to_string());
                let batch = vec![
                    self.emit("error", request_error(code, &message)),
                    self.emit("requestFailed", json!({"code": code, "message": message})),
                ];
                if let Some(mut log) = self.log.take() {
                    log.attach_events(self.events.take_stored());
                    failure.log(log).await;
                }
                batch
            }
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

    /// Emits an event; returns its envelope if the client's filter lets it through.
    fn emit(&mut self, event_type: &str, data: Value) -> Option<Value> {
        if !self.options.filter.allows(event_type) {
            self.events.record(event_type, data);
            return None;
        }
        Some(self.events.emit(event_type, data))
    }

    fn usage_update(&mut self) -> Option<Value> {
        let mut usage = self.accumulator.usage();
        let mut credits = self.cost(&usage);
        // A call made before this one for the request (a Route classifier's) is in the tally.
        if let Some(earlier) = self.call.earlier_call {
            usage.add(earlier.usage);
            credits = Credits(credits.0.saturating_add(earlier.credits));
        }
        let data = json!({
            "cumulativeCreditsUsed": credits.0, "cumulativeCostUsd": credits.to_usd(),
            "cumulativeTokensIn": usage.tokens_in, "cumulativeTokensOut": usage.tokens_out,
            "activeAgents": if matches!(self.phase, Phase::Done) { 0 } else { 1 },
            "completedAgents": if matches!(self.phase, Phase::Done) { 1 } else { 0 },
            "elapsedMs": self.events.elapsed_ms(),
        });
        self.emit("usageUpdate", data)
    }

    fn inference_completed(&mut self, response: &InferenceResponse) -> Option<Value> {
        let credits = self.cost(&response.usage);
        let duration_ms =
            u64::try_from(self.inference_started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let data = data_value(
            &self
                .call
                .inference_completed(response, credits, duration_ms)
                .finished(self.accumulator.is_finished()),
        );
        self.emit("agentInferenceCompleted", data)
    }

    fn request_completed(&mut self, response: &InferenceResponse) -> Option<Value> {
        let credits = self.cost(&response.usage);
        let data = data_value(&request_completed(
            &self.call,
            response,
            credits,
            self.events.elapsed_ms(),
        ));
        self.emit("requestCompleted", data)
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if let Some(mut log) = self.log.take() {
            // The client left: the provider call is cancelled with `upstream`; what it produced
            // is still logged and billed, and the stored lifecycle ends as a chunks stream's does.
            let mut partial = self.accumulator.snapshot();
            let (code, message) = log.cut_short("the client closed the stream");
            partial.usage = log.finish_partial(
                &self.call.provider_key,
                &self.call.model,
                &partial,
                self.accumulator.is_finished(),
                code,
                message,
            );
            let credits = self.cost(&partial.usage);
            record_call_end(
                &mut self.events,
                &self.call,
                &partial,
                credits,
                self.accumulator.is_finished(),
                Some((code, message)),
            );
            log.attach_events(self.events.take_stored());
            log.flush_in_background();
        }
    }
}

/// When a stream must end, and the error it ends with. One timer for the stream's life (not
/// one per event).
pub struct Deadline {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    error: ExecutorError,
}

impl Deadline {
    pub fn after(max: std::time::Duration, error: ExecutorError) -> Deadline {
        Deadline {
            sleep: Box::pin(tokio::time::sleep(max)),
            error,
        }
    }
}

/// Resolves with the error once the deadline passes; never without one.
pub async fn past(deadline: Option<&mut Deadline>) -> ExecutorError {
    match deadline {
        Some(deadline) => {
            deadline.sleep.as_mut().await;
            deadline.error.clone()
        }
        None => std::future::pending().await,
    }
}

/// The envelopes of the stream, as the client's filter lets them through; the caller ends the
/// stream (SSE: `[DONE]`). The state is boxed so that `unfold`, which moves it out of each
/// step's future and into the next, moves a pointer rather than the whole struct.
pub fn envelopes(state: EventStream) -> impl Stream<Item = Value> + Send {
    futures::stream::unfold(Box::new(state), |mut s| async move {
        let mut batch: Vec<Option<Value>> = Vec::new();
        match s.phase {
            Phase::Start => {
                let (started, inference) = (
                    data_value(&s.call.request_started()),
                    data_value(&s.call.inference_started()),
                );
                batch.push(s.emit("requestStarted", started));
                batch.push(s.emit("agentInferenceStarted", inference));
                s.phase = Phase::Opening;
            }
            Phase::Opening => {
                let opening = async {
                    match s.opening.as_mut() {
                        Some(opening) => opening.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    opened = opening => batch.extend(s.opened(opened).await),
                    _ = s.usage_tick.tick(), if s.options.include_usage => batch.push(s.usage_update()),
                    _ = s.heartbeat_tick.tick() => {
                        let data = json!({"elapsedMs": s.events.elapsed_ms(), "eventCount": s.events.count()});
                        batch.push(s.emit("heartbeat", data));
                    }
                    error = past(s.deadline.as_mut()) => {
                        s.opening = None;
                        batch.extend(s.fail(&error).await);
                    }
                }
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
                            let error = ExecutorError::from(err);
                            batch.extend(s.fail(&error).await);
                        }
                        None => {
                            let mut response = s.accumulator.snapshot();
                            // An answer its provider reported no usage for is billed an estimate.
                            if let Some(log) = s.log.as_mut() {
                                log.estimate_unreported(&mut response);
                            }
                            let invalid = structured_output_problem(s.schema.as_ref(), &response);
                            if let Some(error) = &invalid {
                                batch.push(s.emit("error", request_error(error.code(), &error.to_string())));
                            }
                            batch.push(s.inference_completed(&response));
                            s.phase = Phase::Done;
                            if s.options.include_usage {
                                batch.push(s.usage_update());
                            }
                            batch.push(s.request_completed(&response));
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
                                        log.finish_partial(&s.call.provider_key, &s.call.model, &response, true, error.code(), &error.to_string());
                                        log.flush().await;
                                    }
                                }
                            }
                        }
                    },
                    _ = s.usage_tick.tick(), if s.options.include_usage => batch.push(s.usage_update()),
                    _ = s.heartbeat_tick.tick() => {
                        let data = json!({"elapsedMs": s.events.elapsed_ms(), "eventCount": s.events.count()});
                        batch.push(s.emit("heartbeat", data));
                    }
                    error = past(s.deadline.as_mut()) => batch.extend(s.fail(&error).await),
                }
            }
            Phase::Done => return None,
        }
        Some((futures::stream::iter(batch.into_iter().flatten()), s))
    })
    .flatten()
}
