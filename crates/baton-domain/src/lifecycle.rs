//! A one-call request's lifecycle events (SPEC.md "Events": `requestStarted`,
//! `agentInferenceStarted`, `agentInferenceCompleted`, `requestCompleted`): their data as they
//! are serialised, and [`CallLifecycle`], what the invocation log keeps of the four for a
//! request that answered, from which they are rebuilt when read (docs/performance.md,
//! "Lifecycles rebuilt when read").

use serde::{Deserialize, Serialize};

use crate::Timestamp;
use crate::chat::ToolCall;
use crate::credits::Credits;
use crate::run::{RawJson, RunWarning, StoredEvent};

/// An event's envelope (SPEC.md "Events", in its field order), from borrowed parts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventEnvelope<'a, D> {
    pub id: &'a str,
    pub timestamp: Timestamp,
    pub request_id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    pub agent_path: &'a [String],
    pub depth: u32,
    pub data: &'a D,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestStarted<'a> {
    pub flow_name: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub warnings: &'a [RunWarning],
    pub context_id: Option<&'a str>,
    pub model: &'a str,
    pub has_tools: bool,
    pub tool_count: usize,
}

impl<'a> RequestStarted<'a> {
    /// A request's start; it has no context (`contextId`) and has tools when it offers any.
    pub fn new(
        flow_name: Option<&'a str>,
        warnings: &'a [RunWarning],
        model: &'a str,
        tool_count: usize,
    ) -> Self {
        RequestStarted {
            flow_name,
            warnings,
            context_id: None,
            model,
            has_tools: tool_count > 0,
            tool_count,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InferenceStarted<'a> {
    pub inference_request_id: &'a str,
    pub model: &'a str,
    pub provider: &'a str,
    pub message_count: usize,
    pub has_tools: bool,
    pub tool_count: usize,
}

impl<'a> InferenceStarted<'a> {
    pub fn new(
        inference_request_id: &'a str,
        target: (&'a str, &'a str),
        message_count: usize,
        tool_count: usize,
    ) -> Self {
        let (provider, model) = target;
        InferenceStarted {
            inference_request_id,
            model,
            provider,
            message_count,
            has_tools: tool_count > 0,
            tool_count,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InferenceCompleted<'a> {
    pub inference_request_id: &'a str,
    pub model: &'a str,
    pub provider: &'a str,
    pub duration_ms: u64,
    pub usage: InferenceUsage,
    /// Null when the answer never finished (its stream was cut).
    pub finish_reason: Option<&'a str>,
    pub tool_call_count: usize,
    pub was_cached: bool,
    pub was_fallback: bool,
}

impl InferenceCompleted<'_> {
    /// The same call, its answer unfinished (`finished` false: its stream was cut before the
    /// provider's finish): no finish reason is invented for it.
    pub fn finished(mut self, finished: bool) -> Self {
        if !finished {
            self.finish_reason = None;
        }
        self
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InferenceUsage {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub reasoning_tokens: u64,
    pub cost_credits: i64,
    pub cost_usd: f64,
}

impl InferenceUsage {
    /// A call's tokens and its billed cost, in credits and in USD.
    pub fn new(tokens: CallTokens, credits: Credits) -> Self {
        InferenceUsage {
            tokens_in: tokens.tokens_in,
            tokens_out: tokens.tokens_out,
            reasoning_tokens: tokens.reasoning_tokens,
            cost_credits: credits.0,
            cost_usd: credits.to_usd(),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestCompleted<'a> {
    pub duration_ms: u64,
    pub total_credits_used: i64,
    pub total_cost_usd: f64,
    pub total_tokens_in: u64,
    pub total_tokens_out: u64,
    pub total_inference_count: u32,
    pub total_tool_calls: usize,
    pub total_agent_spawns: u32,
    pub max_depth_reached: u32,
    /// Null once retention has dropped the run's text (as it blanks a stored event's).
    pub result: Option<TextResult<'a>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TextResult<'a> {
    pub text_response: &'a str,
    /// The calls the model asked for, when the caller offered its own tools (a chat request's
    /// `tools`): what it needs to go on with the conversation.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tool_calls: &'a [ToolCall],
    /// Why the model declined to answer (OpenAI's `refusal`), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<&'a str>,
}

/// A run's response as the log keeps it (`RunRecord::response`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggedResponse<'a> {
    pub text: &'a str,
    pub tool_calls: &'a [ToolCall],
    pub citations: &'a [crate::chat::Citation],
    /// Null when the answer never finished (a stream cut short).
    pub finish_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<&'a str>,
}

/// The answer of a run as its [`LoggedResponse`] holds it (`RunRecord::response`: text, tool
/// calls, citations, finish reason, refusal), read back for `requestCompleted.result`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggedAnswer {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default)]
    pub refusal: Option<String>,
}

impl LoggedAnswer {
    /// The answer in a logged response; an error when the text is not one (Baton never writes
    /// such: the caller reports it).
    pub fn read(response: &RawJson) -> Result<LoggedAnswer, serde_json::Error> {
        serde_json::from_str(response.as_str())
    }

    pub fn as_result(&self) -> TextResult<'_> {
        TextResult {
            text_response: &self.text,
            tool_calls: &self.tool_calls,
            refusal: self.refusal.as_deref(),
        }
    }
}

/// When and in which place of the request's sequence an event happened, with its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventStamp {
    pub id: String,
    pub seq: u32,
    /// Epoch milliseconds (the precision of [`Timestamp`]).
    pub at: i64,
}

impl EventStamp {
    pub fn new(id: String, seq: u32, timestamp: Timestamp) -> EventStamp {
        EventStamp {
            id,
            seq,
            at: timestamp.0.timestamp_millis(),
        }
    }

    pub fn timestamp(&self) -> Timestamp {
        Timestamp(chrono::DateTime::from_timestamp_millis(self.at).unwrap_or_default())
    }
}

/// A model as an event names it: the provider's key and the model's name there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallTarget {
    pub provider: String,
    pub model: String,
}

/// Token counts of a call as its events report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CallTokens {
    pub tokens_in: u64,
    pub tokens_out: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
}

/// `requestCompleted`'s totals: the call's own, with what a call made before it spent (a
/// Route classifier's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestTotals {
    pub credits: i64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub inference_count: u32,
    pub max_depth: u32,
}

/// What the log keeps of an answered one-call request's four lifecycle events: their stamps and
/// every value of their data except the answer, which the run's logged response holds. Kept in
/// place of the events themselves, it is ~0.5 KB of JSON written with no envelope serialised and
/// nothing compressed; [`CallLifecycle::events`] rebuilds the envelopes as they would have been
/// stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallLifecycle {
    /// `requestStarted`, `agentInferenceStarted`, `agentInferenceCompleted`,
    /// `requestCompleted`, in that order.
    pub stamps: [EventStamp; 4],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_name: Option<String>,
    /// The warnings known at the request's start (`requestStarted.warnings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<RunWarning>,
    pub requested_model: String,
    pub inference_id: String,
    /// The model the call went to first (`agentInferenceStarted`)...
    pub started: CallTarget,
    /// ...and the one that answered (`agentInferenceCompleted`): another after a fallback.
    pub served: CallTarget,
    pub message_count: usize,
    pub tool_count: usize,
    pub duration_ms: u64,
    pub tokens: CallTokens,
    /// The call's billed cost.
    pub credits: i64,
    pub finish_reason: Option<String>,
    pub tool_call_count: usize,
    pub was_cached: bool,
    pub was_fallback: bool,
    pub totals: RequestTotals,
}

impl CallLifecycle {
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
            (&self.started.provider, &self.started.model),
            self.message_count,
            self.tool_count,
        )
    }

    pub fn inference_completed(&self) -> InferenceCompleted<'_> {
        InferenceCompleted {
            inference_request_id: &self.inference_id,
            model: &self.served.model,
            provider: &self.served.provider,
            duration_ms: self.duration_ms,
            usage: InferenceUsage::new(self.tokens, Credits(self.credits)),
            finish_reason: self.finish_reason.as_deref(),
            tool_call_count: self.tool_call_count,
            was_cached: self.was_cached,
            was_fallback: self.was_fallback,
        }
    }

    pub fn request_completed<'a>(&self, result: Option<TextResult<'a>>) -> RequestCompleted<'a> {
        RequestCompleted {
            duration_ms: self.duration_ms,
            total_credits_used: self.totals.credits,
            total_cost_usd: Credits(self.totals.credits).to_usd(),
            total_tokens_in: self.totals.tokens_in,
            total_tokens_out: self.totals.tokens_out,
            total_inference_count: self.totals.inference_count,
            total_tool_calls: self.tool_call_count,
            total_agent_spawns: 0,
            max_depth_reached: self.totals.max_depth,
            result,
        }
    }

    /// The four events of run `run_id` as they are stored, `answer` in `requestCompleted`
    /// (`None`: the run's text was dropped, and the result is null).
    pub fn events(&self, run_id: &str, answer: Option<&LoggedAnswer>) -> Vec<StoredEvent> {
        let [started, inference, completed, done] = &self.stamps;
        vec![
            stored(run_id, started, "requestStarted", &self.request_started()),
            stored(
                run_id,
                inference,
                "agentInferenceStarted",
                &self.inference_started(),
            ),
            stored(
                run_id,
                completed,
                "agentInferenceCompleted",
                &self.inference_completed(),
            ),
            stored(
                run_id,
                done,
                "requestCompleted",
                &self.request_completed(answer.map(LoggedAnswer::as_result)),
            ),
        ]
    }
}

/// A root-agent event of run `run_id`, its envelope serialised as the log stores it.
pub fn stored<D: Serialize>(
    run_id: &str,
    stamp: &EventStamp,
    event_type: &str,
    data: &D,
) -> StoredEvent {
    let timestamp = stamp.timestamp();
    StoredEvent {
        id: stamp.id.clone(),
        run_id: run_id.to_string(),
        seq: stamp.seq,
        event_type: event_type.to_string(),
        payload: RawJson::of(&EventEnvelope {
            id: &stamp.id,
            timestamp,
            request_id: run_id,
            event_type,
            agent_path: &[],
            depth: 0,
            data,
        }),
        created_at: timestamp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lifecycle() -> CallLifecycle {
        let stamp = |seq: u32| EventStamp {
            id: format!("e{seq}"),
            seq,
            at: 1_764_600_000_000 + i64::from(seq),
        };
        CallLifecycle {
            stamps: [stamp(0), stamp(1), stamp(2), stamp(3)],
            flow_name: None,
            warnings: Vec::new(),
            requested_model: "fast".into(),
            inference_id: "inf-1".into(),
            started: CallTarget {
                provider: "openai".into(),
                model: "gpt-4o".into(),
            },
            served: CallTarget {
                provider: "anthropic".into(),
                model: "claude".into(),
            },
            message_count: 2,
            tool_count: 0,
            duration_ms: 12,
            tokens: CallTokens {
                tokens_in: 10,
                tokens_out: 5,
                reasoning_tokens: 0,
            },
            credits: 1_500,
            finish_reason: Some("stop".into()),
            tool_call_count: 0,
            was_cached: false,
            was_fallback: true,
            totals: RequestTotals {
                credits: 1_500,
                tokens_in: 10,
                tokens_out: 5,
                inference_count: 1,
                max_depth: 0,
            },
        }
    }

    #[test]
    fn the_four_events_are_rebuilt_with_their_stamps_and_the_answer() {
        let answer = LoggedAnswer {
            text: "hello".into(),
            ..LoggedAnswer::default()
        };
        let events = lifecycle().events("run-1", Some(&answer));
        let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "requestStarted",
                "agentInferenceStarted",
                "agentInferenceCompleted",
                "requestCompleted"
            ]
        );
        let envelope = events[3].payload.to_value();
        assert_eq!(envelope["id"], "e3");
        assert_eq!(envelope["requestId"], "run-1");
        assert_eq!(envelope["timestamp"], "2025-12-01T14:40:00.003Z");
        assert_eq!(events[3].created_at.0.timestamp_millis(), 1_764_600_000_003);
        assert_eq!(events[3].seq, 3);
        assert_eq!(envelope["data"]["result"], json!({"textResponse": "hello"}));
        assert_eq!(envelope["data"]["totalCostUsd"], 0.0015);
        let started = events[1].payload.to_value();
        assert_eq!(started["data"]["provider"], "openai");
        let completed = events[2].payload.to_value();
        assert_eq!(completed["data"]["provider"], "anthropic");
        assert_eq!(completed["data"]["wasFallback"], true);
        assert_eq!(events[0].payload.to_value()["data"]["model"], "fast");
    }

    #[test]
    fn without_the_answer_the_result_is_null_as_retention_leaves_it() {
        let events = lifecycle().events("run-1", None);
        let mut kept = lifecycle()
            .events("run-1", Some(&LoggedAnswer::default()))
            .pop()
            .unwrap()
            .payload
            .to_value();
        assert!(crate::retention::strip_event_text(&mut kept));
        assert_eq!(events[3].payload.to_value(), kept);
    }

    #[test]
    fn a_lifecycle_reads_back_as_written() {
        let json = serde_json::to_vec(&lifecycle()).unwrap();
        let read: CallLifecycle = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, lifecycle());
    }

    #[test]
    fn the_answer_is_read_from_a_logged_response() {
        let response = RawJson::from_text(
            r#"{"text":"hi","toolCalls":[{"id":"c1","name":"f","arguments":"{}"}],"citations":[],"finishReason":"tool_calls"}"#
                .to_string(),
        )
        .unwrap();
        let answer = LoggedAnswer::read(&response).unwrap();
        assert_eq!(answer.text, "hi");
        assert_eq!(answer.tool_calls.len(), 1);
        assert_eq!(answer.refusal, None);
    }
}
