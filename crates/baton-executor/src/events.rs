//! Execution events (SPEC.md "Events"): the envelope, type filters, and the record of a
//! request's lifecycle events kept for `/llm-logs/{id}/events`.

use std::time::{Duration, Instant};

use baton_domain::Timestamp;
use baton_domain::chat::{InferenceResponse, Usage};
use baton_domain::credits::Credits;
use baton_domain::lifecycle::{
    CallLifecycle, CallTarget, CallTokens, EventEnvelope, EventStamp, RequestTotals,
};
pub use baton_domain::lifecycle::{
    InferenceCompleted, InferenceStarted, InferenceUsage, RequestCompleted, RequestStarted,
    TextResult,
};
use baton_domain::run::{RawJson, RunWarning, StoredEvent};
use baton_providers::routing::{Chain, ChainModel};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::ExecutorError;

/// `contentDelta` events are streamed but not stored: they would repeat the response text.
const NOT_STORED: &[&str] = &["contentDelta", "heartbeat"];

/// Every event type Baton emits: SPEC.md "Event types and data fields", and `contentDelta`.
pub const EVENT_TYPES: &[&str] = &[
    "requestStarted",
    "requestCompleted",
    "requestFailed",
    "agentStarted",
    "agentInferenceStarted",
    "agentInferenceCompleted",
    "agentCompleted",
    "agentFailed",
    "toolStarted",
    "toolCompleted",
    "toolFailed",
    "usageUpdate",
    "heartbeat",
    "error",
    "contentDelta",
];

/// Which event types a client wants: camelCase (`toolStarted`), dotted (`tool.started`) or
/// wildcards (`tool*`, `tool.*`, `agent*`), in any case. Empty means all.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Each pattern as [`key`] writes it, and whether it is a prefix.
    patterns: Vec<(String, bool)>,
}

/// A type name as filters compare it: without dots, lower case, so `toolStarted`,
/// `tool.started` and `TOOLSTARTED` are one name (DESIGN.md: enum values in any case).
fn key_bytes(name: &str) -> impl Iterator<Item = u8> + '_ {
    name.bytes()
        .filter(|b| *b != b'.')
        .map(|b| b.to_ascii_lowercase())
}

fn key(name: &str) -> String {
    key_bytes(name).map(char::from).collect()
}

impl EventFilter {
    pub fn new(patterns: &[String]) -> EventFilter {
        let patterns = patterns
            .iter()
            .map(|p| p.trim())
            .filter(|p| !p.is_empty())
            .map(|p| match p.strip_suffix('*') {
                Some(prefix) => (key(prefix), true),
                None => (key(p), false),
            })
            .collect();
        EventFilter { patterns }
    }

    /// Refuses a pattern that names no event type: neither a type (`toolStarted`,
    /// `tool.started`) nor the start of one followed by `*` (`tool*`); the message says which.
    pub fn check_pattern(pattern: &str) -> Result<(), String> {
        let (body, wildcard) = match pattern.strip_suffix('*') {
            Some(prefix) => (prefix, true),
            None => (pattern, false),
        };
        let wanted = key(body);
        let known = body.chars().all(|c| c.is_ascii_alphabetic() || c == '.')
            && EVENT_TYPES.iter().any(|t| {
                let t = key(t);
                if wildcard {
                    t.starts_with(&wanted)
                } else {
                    t == wanted
                }
            });
        if known {
            Ok(())
        } else {
            Err(format!(
                "'{pattern}' is not an event type ({}) or the start of one followed by '*'",
                EVENT_TYPES.join(", ")
            ))
        }
    }

    /// Compares without building the event's key (called for every event of a stream).
    pub fn allows(&self, event_type: &str) -> bool {
        if self.patterns.is_empty() {
            return true;
        }
        self.patterns.iter().any(|(pattern, wildcard)| {
            let mut name = key_bytes(event_type);
            pattern.bytes().all(|b| name.next() == Some(b)) && (*wildcard || name.next().is_none())
        })
    }
}

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

/// Whether `stream_options` asks for the events format: `format` says so, or an option only
/// that format has is set. An unknown `format`, or `chunks` with such an option, is refused.
pub fn wants_events(options: &Map<String, Value>) -> Result<bool, ExecutorError> {
    let event_option = EVENT_ONLY_OPTIONS
        .iter()
        .find(|k| options.contains_key(**k));
    match options.get("format") {
        None | Some(Value::Null) => Ok(event_option.is_some()),
        Some(Value::String(format)) if format.eq_ignore_ascii_case("events") => Ok(true),
        Some(Value::String(format)) if format.eq_ignore_ascii_case("chunks") => {
            match event_option {
                None => Ok(false),
                Some(option) => Err(ExecutorError::validation(
                    "stream_options.format",
                    format!(
                        "{option} belongs to the events format: drop it or ask for format 'events'"
                    ),
                )),
            }
        }
        Some(_) => Err(ExecutorError::validation(
            "stream_options.format",
            "format must be 'chunks' or 'events'",
        )),
    }
}

/// The events-format options, validated.
#[derive(Debug, Clone)]
pub struct EventOptions {
    pub(crate) include_usage: bool,
    pub(crate) usage_interval: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub filter: EventFilter,
    /// Full tool results in `toolCompleted` (`result`), not only the preview.
    pub include_tool_results: bool,
    /// Full sub-agent answers in `agentCompleted` (`result`).
    pub include_agent_results: bool,
}

impl EventOptions {
    /// A flow run's `streamOptions`: the events format's options, in snake_case or camelCase;
    /// an unknown key is refused (a misspelt filter would silently stream everything), and so
    /// is a `format` other than `events`, the only one a flow run streams.
    pub fn parse_for_run(options: &Map<String, Value>) -> Result<EventOptions, ExecutorError> {
        const KNOWN: &[(&str, &str)] = &[
            ("include_usage", "includeUsage"),
            ("usage_interval_ms", "usageIntervalMs"),
            ("heartbeat_interval_ms", "heartbeatIntervalMs"),
            ("include_tool_results", "includeToolResults"),
            ("include_agent_results", "includeAgentResults"),
            ("event_types", "eventTypes"),
            ("format", "format"),
        ];
        let mut named = Map::new();
        for (key, value) in options {
            let Some((snake, _)) = KNOWN
                .iter()
                .find(|(snake, camel)| key == snake || key == camel)
            else {
                return Err(ExecutorError::validation(
                    format!("stream_options.{key}"),
                    format!(
                        "unknown stream option '{key}'; expected one of: {}",
                        KNOWN
                            .iter()
                            .map(|(snake, _)| *snake)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            };
            if named.insert((*snake).to_string(), value.clone()).is_some() {
                return Err(ExecutorError::validation(
                    format!("stream_options.{snake}"),
                    format!("{snake} is given twice (snake_case and camelCase)"),
                ));
            }
        }
        match named.get("format") {
            None | Some(Value::Null) => {}
            Some(Value::String(format)) if format.eq_ignore_ascii_case("events") => {}
            Some(_) => {
                return Err(ExecutorError::validation(
                    "stream_options.format",
                    "a flow run streams the events format: format must be 'events' or left out",
                ));
            }
        }
        EventOptions::parse(&named)
    }

    pub fn parse(options: &Map<String, Value>) -> Result<EventOptions, ExecutorError> {
        let interval = |name: &str, default: u64| -> Result<Duration, ExecutorError> {
            match options.get(name) {
                None | Some(Value::Null) => Ok(Duration::from_millis(default)),
                Some(v) => v
                    .as_u64()
                    .filter(|ms| *ms >= MIN_INTERVAL_MS)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        ExecutorError::validation(
                            format!("stream_options.{name}"),
                            format!("{name} must be an integer of at least {MIN_INTERVAL_MS}"),
                        )
                    }),
            }
        };
        let flag = |name: &str| -> Result<bool, ExecutorError> {
            match options.get(name) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ExecutorError::validation(
                    format!("stream_options.{name}"),
                    format!("{name} must be a boolean"),
                )),
            }
        };
        let types = match options.get("event_types") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                let types: Vec<String> = items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect();
                for (i, pattern) in types.iter().enumerate() {
                    EventFilter::check_pattern(pattern.trim()).map_err(|message| {
                        ExecutorError::validation(
                            format!("stream_options.event_types[{i}]"),
                            message,
                        )
                    })?;
                }
                types
            }
            Some(_) => {
                return Err(ExecutorError::validation(
                    "stream_options.event_types",
                    "event_types must be an array of strings",
                ));
            }
        };
        Ok(EventOptions {
            include_usage: match options.get("include_usage") {
                None | Some(Value::Null) => true,
                _ => flag("include_usage")?,
            },
            usage_interval: interval("usage_interval_ms", DEFAULT_USAGE_INTERVAL_MS)?,
            heartbeat_interval: interval("heartbeat_interval_ms", DEFAULT_HEARTBEAT_INTERVAL_MS)?,
            filter: EventFilter::new(&types),
            include_tool_results: flag("include_tool_results")?,
            include_agent_results: flag("include_agent_results")?,
        })
    }
}

impl Default for EventOptions {
    /// No options given: every event, usage every 5 s, heartbeat every 30 s.
    fn default() -> Self {
        EventOptions {
            include_usage: true,
            usage_interval: Duration::from_millis(DEFAULT_USAGE_INTERVAL_MS),
            heartbeat_interval: Duration::from_millis(DEFAULT_HEARTBEAT_INTERVAL_MS),
            filter: EventFilter::default(),
            include_tool_results: false,
            include_agent_results: false,
        }
    }
}

/// Builds envelopes for one request and keeps the ones to store.
pub struct EventLog {
    request_id: String,
    started: Instant,
    seq: u32,
    stored: Vec<StoredEvent>,
    /// False when nothing keeps stored events (the invocation log is off): an event only
    /// `record`ed is then just counted, and an `emit`ted one is built for its stream only.
    storing: bool,
    /// A one-call request's start, stamped ([`record_call_started`]) but serialised only when
    /// the next event is stored: its two envelopes are then written after the model call
    /// rather than before it goes out.
    pending_start: Option<Box<PendingStart>>,
}

/// When and in which place `requestStarted` and `agentInferenceStarted` happened, with the
/// call as it was then.
struct PendingStart {
    call: CallInfo,
    request: Stamp,
    inference: Stamp,
}

/// An event's id, time and sequence number, taken when it happened.
struct Stamp {
    id: String,
    timestamp: Timestamp,
    seq: u32,
}

impl EventLog {
    pub fn new(request_id: String) -> Self {
        Self {
            request_id,
            started: Instant::now(),
            seq: 0,
            stored: Vec::new(),
            storing: true,
            pending_start: None,
        }
    }

    /// Whether events are kept for the invocation log (by default they are).
    pub fn storing(mut self, storing: bool) -> Self {
        self.storing = storing;
        self
    }

    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn count(&self) -> u32 {
        self.seq
    }

    /// A new event envelope (root agent: empty path, depth 0), stored too unless a delta or a
    /// heartbeat. For an event nobody streams, [`EventLog::record`] saves a copy.
    #[must_use = "an event only stored is `record`ed: that moves it instead of copying it"]
    pub fn emit(&mut self, event_type: &str, data: Value) -> Value {
        self.emit_in(event_type, data, &[], 0)
    }

    /// A new event envelope of the agent at `agent_path` (roles from the root), `depth` deep.
    #[must_use = "an event only stored is `record`ed: that moves it instead of copying it"]
    pub fn emit_in(
        &mut self,
        event_type: &str,
        data: Value,
        agent_path: &[String],
        depth: u32,
    ) -> Value {
        let (id, timestamp, envelope) = self.envelope(event_type, data, agent_path, depth);
        if self.storing && !NOT_STORED.contains(&event_type) {
            self.settle_pending_start();
            let seq = self.seq;
            self.store(id, seq, event_type, RawJson::of(&envelope), timestamp);
        }
        self.seq += 1;
        envelope
    }

    /// An event for the log only (no stream is listening): the envelope moves into the stored
    /// list; a delta or heartbeat is only counted.
    pub fn record<D: Serialize>(&mut self, event_type: &str, data: D) {
        self.record_in(event_type, data, &[], 0);
    }

    /// [`EventLog::record`] for the agent at `agent_path`, `depth` deep.
    pub fn record_in<D: Serialize>(
        &mut self,
        event_type: &str,
        data: D,
        agent_path: &[String],
        depth: u32,
    ) {
        if self.storing && !NOT_STORED.contains(&event_type) {
            self.settle_pending_start();
            let stamp = self.stamp();
            self.store_serialised(stamp, event_type, &data, agent_path, depth);
        }
        self.seq += 1;
    }

    /// The next event's id, time and sequence number, now.
    fn stamp(&self) -> Stamp {
        Stamp {
            id: uuid::Uuid::now_v7().to_string(),
            timestamp: Timestamp::now(),
            seq: self.seq,
        }
    }

    /// Serialised once, from borrowed parts: no envelope tree is built for the log.
    fn store_serialised<D: Serialize>(
        &mut self,
        stamp: Stamp,
        event_type: &str,
        data: &D,
        agent_path: &[String],
        depth: u32,
    ) {
        let payload = RawJson::of(&EventEnvelope {
            id: &stamp.id,
            timestamp: stamp.timestamp,
            request_id: &self.request_id,
            event_type,
            agent_path,
            depth,
            data,
        });
        self.store(stamp.id, stamp.seq, event_type, payload, stamp.timestamp);
    }

    /// A one-call request's `requestStarted` and `agentInferenceStarted`, stamped now and
    /// serialised with the next stored event (or when the stored events are taken).
    fn stamp_call_started(&mut self, call: &CallInfo) {
        if !self.storing {
            self.seq += 2;
            return;
        }
        self.settle_pending_start();
        let request = self.stamp();
        self.seq += 1;
        let inference = self.stamp();
        self.seq += 1;
        self.pending_start = Some(Box::new(PendingStart {
            call: call.clone(),
            request,
            inference,
        }));
    }

    fn settle_pending_start(&mut self) {
        if let Some(pending) = self.pending_start.take() {
            let PendingStart {
                call,
                request,
                inference,
            } = *pending;
            self.store_serialised(request, "requestStarted", &call.request_started(), &[], 0);
            self.store_serialised(
                inference,
                "agentInferenceStarted",
                &call.inference_started(),
                &[],
                0,
            );
        }
    }

    /// The envelope, built field by field so `data` is moved in (`json!` would copy it).
    fn envelope(
        &self,
        event_type: &str,
        data: Value,
        agent_path: &[String],
        depth: u32,
    ) -> (String, Timestamp, Value) {
        let id = uuid::Uuid::now_v7().to_string();
        let timestamp = Timestamp::now();
        let mut envelope = Map::with_capacity(7);
        envelope.insert("id".into(), Value::String(id.clone()));
        envelope.insert(
            "timestamp".into(),
            serde_json::to_value(timestamp).unwrap_or(Value::Null),
        );
        envelope.insert("requestId".into(), Value::String(self.request_id.clone()));
        envelope.insert("type".into(), Value::String(event_type.to_string()));
        envelope.insert(
            "agentPath".into(),
            Value::Array(agent_path.iter().cloned().map(Value::String).collect()),
        );
        envelope.insert("depth".into(), Value::from(depth));
        envelope.insert("data".into(), data);
        (id, timestamp, Value::Object(envelope))
    }

    fn store(
        &mut self,
        id: String,
        seq: u32,
        event_type: &str,
        envelope: RawJson,
        created_at: Timestamp,
    ) {
        self.stored.push(StoredEvent {
            id,
            run_id: self.request_id.clone(),
            seq,
            event_type: event_type.to_string(),
            payload: envelope,
            created_at,
        });
    }

    pub fn take_stored(&mut self) -> Vec<StoredEvent> {
        self.settle_pending_start();
        std::mem::take(&mut self.stored)
    }

    /// An answered one-call request's lifecycle in the form the log keeps of it (its completion
    /// stamped now), when its start is all that has been recorded: its four events are then
    /// rebuilt when read instead of serialised now. `None` when events are not stored, or when
    /// others were recorded (they are recorded the usual way, [`record_call_outcome`] or
    /// [`record_call_end`]).
    /// `finished`: whether the provider sent its finish (a stream may end without one).
    pub fn answered_call_lifecycle(
        &mut self,
        call: &CallInfo,
        response: &InferenceResponse,
        credits: Credits,
        finished: bool,
    ) -> Option<CallLifecycle> {
        let pending = self.pending_start.as_ref()?;
        if !self.storing
            || !self.stored.is_empty()
            || pending.call.inference_id != call.inference_id
        {
            return None;
        }
        let PendingStart {
            call: at_start,
            request,
            inference,
        } = *self.pending_start.take()?;
        let completed = self.stamp();
        self.seq += 1;
        let done = self.stamp();
        self.seq += 1;
        let duration_ms = self.elapsed_ms();
        let totals = request_completed(call, response, credits, duration_ms);
        let totals = RequestTotals {
            credits: totals.total_credits_used,
            tokens_in: totals.total_tokens_in,
            tokens_out: totals.total_tokens_out,
            inference_count: totals.total_inference_count,
            max_depth: totals.max_depth_reached,
        };
        let stamp = |stamp: Stamp| EventStamp::new(stamp.id, stamp.seq, stamp.timestamp);
        Some(CallLifecycle {
            stamps: [
                stamp(request),
                stamp(inference),
                stamp(completed),
                stamp(done),
            ],
            flow_name: at_start.flow_name,
            warnings: at_start.warnings,
            requested_model: at_start.requested_model,
            inference_id: at_start.inference_id,
            started: CallTarget {
                provider: at_start.provider_key,
                model: at_start.model,
            },
            served: CallTarget {
                provider: call.provider_key.clone(),
                model: call.model.clone(),
            },
            message_count: at_start.message_count,
            tool_count: at_start.tool_count,
            duration_ms,
            tokens: call_tokens(&response.usage),
            credits: credits.0,
            finish_reason: finished.then(|| response.finish_reason.as_openai().to_string()),
            tool_call_count: response.tool_calls.len(),
            was_cached: call.was_cached,
            was_fallback: call.was_fallback,
            totals,
        })
    }
}

/// The one model call of a chat, inference or flow request, as its events describe it.
#[derive(Clone)]
pub struct CallInfo {
    /// The flow a flow run runs (`requestStarted.flowName`); `None` for chat and inference.
    pub flow_name: Option<String>,
    /// A flow run's warnings known at its start (unresolved parameters): `requestStarted`
    /// carries them, so a streaming client learns of them as the synchronous response says.
    pub warnings: Vec<RunWarning>,
    pub provider_key: String,
    pub model: String,
    pub requested_model: String,
    pub message_count: usize,
    pub tool_count: usize,
    pub inference_id: String,
    pub was_cached: bool,
    pub was_fallback: bool,
    /// A call made for the request before this one (a Route classifier's, logged as a child
    /// run one level down): `requestCompleted`'s totals include it.
    pub earlier_call: Option<EarlierCall>,
}

/// What a call made before a request's own one spent.
#[derive(Debug, Clone, Copy, Default)]
pub struct EarlierCall {
    pub credits: i64,
    pub usage: Usage,
}

impl CallInfo {
    /// A call about to go to `chain`'s first model, as the client named it `requested_model`
    /// ([`CallInfo::served_by`] sets the model that answered).
    pub fn for_chain(
        chain: &Chain,
        requested_model: String,
        message_count: usize,
        tool_count: usize,
    ) -> CallInfo {
        let primary = chain.primary();
        CallInfo {
            flow_name: None,
            warnings: Vec::new(),
            provider_key: primary.map(|m| m.provider.clone()).unwrap_or_default(),
            model: primary.map_or_else(|| requested_model.clone(), |m| m.model.clone()),
            requested_model,
            message_count,
            tool_count,
            inference_id: uuid::Uuid::now_v7().to_string(),
            was_cached: false,
            was_fallback: false,
            earlier_call: None,
        }
    }

    /// The model that answered, once the chain has been walked.
    pub fn served_by(&mut self, model: &ChainModel, was_fallback: bool, was_cached: bool) {
        self.provider_key.clone_from(&model.provider);
        self.model.clone_from(&model.model);
        self.was_fallback = was_fallback;
        self.was_cached = was_cached;
    }

    pub fn request_started(&self) -> RequestStarted<'_> {
        RequestStarted::new(
            self.flow_name.as_deref(),
            &self.warnings,
            &self.requested_model,
            self.tool_count,
        )
    }

    pub fn inference_started(&self) -> InferenceStarted<'_> {
        InferenceStarted::new(
            &self.inference_id,
            (&self.provider_key, &self.model),
            self.message_count,
            self.tool_count,
        )
    }

    pub fn inference_completed(
        &self,
        response: &InferenceResponse,
        credits: Credits,
        duration_ms: u64,
    ) -> InferenceCompleted<'_> {
        InferenceCompleted {
            inference_request_id: &self.inference_id,
            model: &self.model,
            provider: &self.provider_key,
            duration_ms,
            usage: InferenceUsage::new(call_tokens(&response.usage), credits),
            finish_reason: Some(response.finish_reason.as_openai()),
            tool_call_count: response.tool_calls.len(),
            was_cached: self.was_cached,
            was_fallback: self.was_fallback,
        }
    }
}

/// The token counts a call's events report of its usage.
fn call_tokens(usage: &Usage) -> CallTokens {
    CallTokens {
        tokens_in: usage.tokens_in,
        tokens_out: usage.tokens_out,
        reasoning_tokens: usage.reasoning_tokens,
    }
}

/// `requestCompleted` of a request made of one model call (and `call.earlier_call`'s).
pub fn request_completed<'a>(
    call: &CallInfo,
    response: &'a InferenceResponse,
    credits: Credits,
    duration_ms: u64,
) -> RequestCompleted<'a> {
    let earlier = call.earlier_call.unwrap_or_default();
    let credits = Credits(credits.0.saturating_add(earlier.credits));
    RequestCompleted {
        duration_ms,
        total_credits_used: credits.0,
        total_cost_usd: credits.to_usd(),
        total_tokens_in: response
            .usage
            .tokens_in
            .saturating_add(earlier.usage.tokens_in),
        total_tokens_out: response
            .usage
            .tokens_out
            .saturating_add(earlier.usage.tokens_out),
        total_inference_count: response.calls() + u32::from(call.earlier_call.is_some()),
        total_tool_calls: response.tool_calls.len(),
        total_agent_spawns: 0,
        max_depth_reached: u32::from(call.earlier_call.is_some()),
        result: Some(TextResult {
            text_response: &response.text,
            tool_calls: &response.tool_calls,
            refusal: response.refusal.as_deref(),
        }),
    }
}

/// The data of an event as a `Value`, for the streamed envelopes [`EventLog::emit`] builds.
pub fn data_value<D: Serialize>(data: &D) -> Value {
    serde_json::to_value(data).unwrap_or(Value::Null)
}

/// The start of a one-call request's stored lifecycle (a synchronous request's, or a stream's
/// in OpenAI's chunks): stamped now, serialised with the next stored event, so the request's
/// model call goes out without waiting for two envelopes nobody reads before it ends.
pub fn record_call_started(events: &mut EventLog, call: &CallInfo) {
    events.stamp_call_started(call);
}

/// The end of a synchronous one-call request's stored lifecycle: completion events, or `error`
/// and `requestFailed`.
pub fn record_call_outcome(
    events: &mut EventLog,
    call: &CallInfo,
    outcome: Result<(&InferenceResponse, Credits), &ExecutorError>,
) {
    match outcome {
        Ok((response, credits)) => record_completion(events, call, response, credits, true),
        Err(err) => emit_failure(events, err.code(), &err.to_string()),
    }
}

/// `agentInferenceCompleted` and `requestCompleted` of a one-call request, for the log.
fn record_completion(
    events: &mut EventLog,
    call: &CallInfo,
    response: &InferenceResponse,
    credits: Credits,
    finished: bool,
) {
    let elapsed = events.elapsed_ms();
    events.record(
        "agentInferenceCompleted",
        call.inference_completed(response, credits, elapsed)
            .finished(finished),
    );
    events.record(
        "requestCompleted",
        request_completed(call, response, credits, elapsed),
    );
}

/// The end of a one-call request's stored lifecycle, whatever it came to: the completion events
/// with `response` (its usage as billed, `credits`; `finished`: whether the provider had sent
/// its finish); after a failure (`(code, message)`), `error` first, and `requestFailed` instead
/// of the completions when nothing was produced.
pub fn record_call_end(
    events: &mut EventLog,
    call: &CallInfo,
    response: &InferenceResponse,
    credits: Credits,
    finished: bool,
    failure: Option<(&str, &str)>,
) {
    let produced = response.has_output();
    match failure {
        Some((code, message)) if !produced => emit_failure(events, code, message),
        Some((code, message)) => {
            events.record("error", request_error(code, message));
            record_completion(events, call, response, credits, finished);
        }
        None => record_completion(events, call, response, credits, finished),
    }
}

/// The data of the request's own `error` event (not an agent's, not recoverable).
pub fn request_error(code: &str, message: &str) -> Value {
    json!({"code": code, "message": message, "agentRole": Value::Null, "recoverable": false})
}

/// `error` then `requestFailed`, for the log: the end of a request that produced nothing.
pub fn emit_failure(events: &mut EventLog, code: &str, message: &str) {
    events.record("error", request_error(code, message));
    events.record("requestFailed", json!({"code": code, "message": message}));
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_domain::chat::ToolCall;
    use baton_domain::lifecycle::LoggedAnswer;

    #[test]
    fn malformed_event_type_patterns_are_refused_naming_the_item() {
        let parse = |types: Value| {
            let mut options = Map::new();
            options.insert("event_types".into(), types);
            EventOptions::parse(&options)
        };
        assert!(parse(json!(["toolStarted", "agent.*", "tool*", " usageUpdate "])).is_ok());
        for bad in [
            "tool?",
            "tool-started",
            "*tool",
            "tool**",
            "nonsense",
            "tool",
            "x*",
            "toolStarted.extra",
        ] {
            match parse(json!(["toolStarted", bad])) {
                Err(ExecutorError::Validation { param, message }) => {
                    assert_eq!(param, "stream_options.event_types[1]");
                    assert!(message.contains(bad), "{message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    fn allows(patterns: &[&str], event: &str) -> bool {
        EventFilter::new(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).allows(event)
    }

    #[test]
    fn filters_accept_camel_dotted_and_wildcards() {
        assert!(allows(&[], "anything"));
        assert!(allows(&["toolStarted"], "toolStarted"));
        assert!(allows(&["tool.started"], "toolStarted"));
        assert!(allows(&["tool*"], "toolCompleted"));
        assert!(allows(&["tool.*"], "toolFailed"));
        assert!(allows(&["agent*"], "agentInferenceCompleted"));
        assert!(allows(&["usage.update"], "usageUpdate"));
        assert!(!allows(&["tool*"], "agentStarted"));
        assert!(!allows(&["toolStarted"], "toolCompleted"));
        assert!(!allows(&["request.started"], "requestCompleted"));
        // Any case, as DESIGN.md has enum values.
        assert!(allows(&["toolstarted"], "toolStarted"));
        assert!(allows(&["TOOLSTARTED"], "toolStarted"));
        assert!(allows(&["Tool.Started"], "toolStarted"));
        assert!(allows(&["TOOL*"], "toolFailed"));
        assert!(!allows(&["toolstarted"], "toolStartedLater"));
        for name in EVENT_TYPES {
            assert!(EventFilter::check_pattern(name).is_ok(), "{name}");
            assert!(EventFilter::check_pattern(&name.to_ascii_uppercase()).is_ok());
        }
        assert!(EventFilter::check_pattern("*").is_ok());
        assert!(EventFilter::check_pattern("agent.inference.*").is_ok());
    }

    #[test]
    fn the_format_is_chunks_or_events_and_event_options_need_events() {
        let options = |value: Value| value.as_object().cloned().unwrap();
        assert!(!wants_events(&options(json!({"include_usage": true}))).unwrap());
        assert!(wants_events(&options(json!({"format": "Events"}))).unwrap());
        assert!(wants_events(&options(json!({"event_types": ["tool*"]}))).unwrap());
        assert!(!wants_events(&options(json!({"format": "chunks"}))).unwrap());
        for refused in [
            json!({"format": "bogus"}),
            json!({"format": 3}),
            json!({"format": "chunks", "event_types": ["tool*"]}),
        ] {
            match wants_events(&options(refused.clone())) {
                Err(ExecutorError::Validation { param, .. }) => {
                    assert_eq!(param, "stream_options.format", "{refused}")
                }
                other => panic!("{refused}: {other:?}"),
            }
        }
    }

    #[test]
    fn envelopes_carry_the_spec_fields_and_deltas_are_not_stored() {
        let mut log = EventLog::new("r1".into());
        let started = log.emit("requestStarted", json!({"model": "m"}));
        for field in [
            "id",
            "timestamp",
            "requestId",
            "type",
            "agentPath",
            "depth",
            "data",
        ] {
            assert!(started.get(field).is_some(), "{field}");
        }
        log.record("contentDelta", json!({"text": "x"}));
        log.record_in(
            "requestCompleted",
            json!({"ok": true}),
            &["critic".into()],
            1,
        );
        let stored = log.take_stored();
        assert_eq!(
            stored
                .iter()
                .map(|e| e.event_type.as_str())
                .collect::<Vec<_>>(),
            ["requestStarted", "requestCompleted"]
        );
        assert_eq!(stored[1].seq, 2);
        // Recorded, not emitted: the same envelope as `emit_in` builds.
        assert_eq!(stored[0].payload.to_value(), started);
        let completed = &stored[1].payload.to_value();
        assert_eq!(completed["type"], "requestCompleted");
        assert_eq!(completed["requestId"], "r1");
        assert_eq!(completed["agentPath"], json!(["critic"]));
        assert_eq!(completed["depth"], 1);
        assert_eq!(completed["data"], json!({"ok": true}));
        assert_eq!(completed["id"], json!(stored[1].id));
        assert_eq!(completed["timestamp"], json!(stored[1].created_at));
    }

    /// A one-call request's start is stamped when it happens and serialised with the next
    /// stored event: the stored lifecycle keeps its order, its start time and the model the
    /// call began with, even after `served_by` named a fallback.
    #[test]
    fn a_call_start_is_stamped_when_it_happens_and_serialised_later() {
        let mut call = CallInfo {
            flow_name: None,
            warnings: Vec::new(),
            provider_key: "openai".into(),
            model: "primary".into(),
            requested_model: "alias".into(),
            message_count: 1,
            tool_count: 0,
            inference_id: "inf-1".into(),
            was_cached: false,
            was_fallback: false,
            earlier_call: None,
        };
        let mut log = EventLog::new("r1".into());
        record_call_started(&mut log, &call);
        assert_eq!(log.count(), 2);
        std::thread::sleep(Duration::from_millis(5));
        let fallback = ChainModel {
            provider: "anthropic".into(),
            model: "fallback".into(),
        };
        call.served_by(&fallback, true, false);
        let response = InferenceResponse {
            text: "hi".into(),
            ..InferenceResponse::default()
        };
        record_call_outcome(&mut log, &call, Ok((&response, Credits(7))));
        let stored = log.take_stored();
        let types: Vec<&str> = stored.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "requestStarted",
                "agentInferenceStarted",
                "agentInferenceCompleted",
                "requestCompleted"
            ]
        );
        let seqs: Vec<u32> = stored.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [0, 1, 2, 3]);
        let started = stored[1].payload.to_value();
        assert_eq!(started["data"]["model"], "primary");
        assert_eq!(started["data"]["provider"], "openai");
        assert_eq!(started["timestamp"], json!(stored[1].created_at));
        assert_eq!(stored[2].payload.to_value()["data"]["model"], "fallback");
        assert!(
            stored[1].created_at < stored[2].created_at,
            "the start keeps the time it happened"
        );
        assert_eq!(stored[0].payload.to_value()["data"]["model"], "alias");
    }

    /// An answered call's lifecycle, kept compactly and rebuilt when read, gives the events
    /// recording them would have stored: same types, order, sequence numbers and data (ids,
    /// times and durations are each path's own).
    #[test]
    fn a_kept_lifecycle_rebuilds_the_events_recording_would_store() {
        let mut call = CallInfo {
            flow_name: Some("support".into()),
            warnings: vec![RunWarning {
                code: "UNRESOLVED_PARAMETER".into(),
                message: "no value for 'name'".into(),
                parameter: Some("name".into()),
            }],
            provider_key: "openai".into(),
            model: "primary".into(),
            requested_model: "alias".into(),
            message_count: 3,
            tool_count: 1,
            inference_id: "inf-1".into(),
            was_cached: false,
            was_fallback: false,
            earlier_call: Some(EarlierCall {
                credits: 40,
                usage: Usage {
                    tokens_in: 4,
                    tokens_out: 1,
                    ..Usage::default()
                },
            }),
        };
        let fallback = ChainModel {
            provider: "anthropic".into(),
            model: "fallback".into(),
        };
        let response = InferenceResponse {
            text: "the answer \"quoted\"".into(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "lookup".into(),
                arguments: r#"{"q":"x"}"#.into(),
            }],
            refusal: Some("partly".into()),
            usage: Usage {
                tokens_in: 12,
                tokens_out: 7,
                reasoning_tokens: 2,
                ..Usage::default()
            },
            ..InferenceResponse::default()
        };
        let without_stamps = |events: Vec<StoredEvent>| -> Vec<(u32, String, Value)> {
            events
                .into_iter()
                .map(|event| {
                    let mut envelope = event.payload.to_value();
                    envelope["id"] = Value::Null;
                    envelope["timestamp"] = Value::Null;
                    if let Some(data) = envelope["data"].as_object_mut()
                        && data.contains_key("durationMs")
                    {
                        data.insert("durationMs".into(), Value::Null);
                    }
                    (event.seq, event.event_type, envelope)
                })
                .collect()
        };

        let mut recorded = EventLog::new("r1".into());
        let mut kept = EventLog::new("r1".into());
        record_call_started(&mut recorded, &call);
        record_call_started(&mut kept, &call);
        call.served_by(&fallback, true, false);
        record_call_outcome(&mut recorded, &call, Ok((&response, Credits(900))));
        let lifecycle = kept
            .answered_call_lifecycle(&call, &response, Credits(900), true)
            .expect("only the start was recorded");
        assert!(kept.take_stored().is_empty(), "nothing else is stored");
        let logged = crate::runlog::logged_response(&response, Some("stop"));
        let answer = LoggedAnswer::read(&logged).unwrap();
        let rebuilt = lifecycle.events("r1", Some(&answer));
        for event in &rebuilt {
            let envelope = event.payload.to_value();
            assert_eq!(
                envelope["id"],
                json!(event.id),
                "the envelope's id is the event's"
            );
            assert_eq!(envelope["timestamp"], json!(event.created_at));
        }
        assert_eq!(
            without_stamps(rebuilt),
            without_stamps(recorded.take_stored())
        );
    }

    /// Once another event is stored the lifecycle is not kept: the events are recorded.
    #[test]
    fn no_lifecycle_is_kept_once_other_events_were_stored() {
        let call = CallInfo {
            flow_name: None,
            warnings: Vec::new(),
            provider_key: "openai".into(),
            model: "m".into(),
            requested_model: "m".into(),
            message_count: 1,
            tool_count: 0,
            inference_id: "inf-1".into(),
            was_cached: false,
            was_fallback: false,
            earlier_call: None,
        };
        let mut log = EventLog::new("r1".into());
        record_call_started(&mut log, &call);
        log.record("toolStarted", json!({}));
        let response = InferenceResponse::default();
        assert!(
            log.answered_call_lifecycle(&call, &response, Credits(1), true)
                .is_none()
        );
        record_call_outcome(&mut log, &call, Ok((&response, Credits(1))));
        assert_eq!(log.take_stored().len(), 5);
        let mut off = EventLog::new("r2".into()).storing(false);
        record_call_started(&mut off, &call);
        assert!(
            off.answered_call_lifecycle(&call, &response, Credits(1), true)
                .is_none()
        );
    }

    /// With nothing to keep them (the invocation log off) events are counted and streamed
    /// envelopes still built, but none is stored.
    #[test]
    fn a_log_not_storing_keeps_nothing_but_still_counts_and_builds_envelopes() {
        let mut log = EventLog::new("r1".into()).storing(false);
        let started = log.emit("requestStarted", json!({"model": "m"}));
        assert_eq!(started["type"], "requestStarted");
        assert_eq!(started["data"], json!({"model": "m"}));
        log.record("agentInferenceStarted", json!({}));
        log.record_in("requestCompleted", json!({"ok": true}), &[], 0);
        assert_eq!(log.count(), 3);
        assert!(log.take_stored().is_empty());
    }
}
