//! CritiqueLoop tools (SPEC.md "CritiqueLoop"): per iteration, the producer flow runs on the
//! original input plus the last feedback, then the critic flow (temperature 0) on the input plus
//! the producer's answer and must answer `{approved, feedback}`. Approval returns the producer's
//! answer; otherwise the feedback goes to the next iteration, up to `maxLoopIterations`. A critic
//! answer that is not that JSON is asked for once more; after that the loop ends with the last
//! answer and a recoverable `error` event (`CRITIQUE_INVALID`). Every run is a logged child.

use baton_domain::tool::{DEFAULT_LOOP_ITERATIONS, Tool};
use serde_json::{Map, Value, json};

use crate::agents::{SubRun, TreeRunner};
use crate::dispatch::AgentOutcome;

/// The critic's verdict.
struct Verdict {
    approved: bool,
    feedback: String,
}

/// Reads `{approved, feedback}` from the critic's answer, allowing a fenced code block.
fn verdict(text: &str) -> Option<Verdict> {
    let trimmed = text.trim();
    let body = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed)
        .trim();
    let value: Value = serde_json::from_str(body).ok()?;
    Some(Verdict {
        approved: value.get("approved")?.as_bool()?,
        feedback: value
            .get("feedback")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

fn text_of(arguments: &Map<String, Value>) -> String {
    match arguments.get("input") {
        Some(Value::String(input)) => input.clone(),
        Some(other) => other.to_string(),
        None => Value::Object(arguments.clone()).to_string(),
    }
}

pub async fn run(runner: &TreeRunner, tool: &Tool, arguments: Map<String, Value>) -> AgentOutcome {
    let (Some(producer), Some(critic)) = (
        tool.config.producer_flow_id.as_deref(),
        tool.config.critic_flow_id.as_deref(),
    ) else {
        return AgentOutcome {
            result: Err(format!("CritiqueLoop tool '{}' lacks its flows", tool.name)),
            child_request_id: None,
            child_credits: 0,
        };
    };
    let iterations = tool
        .config
        .max_loop_iterations
        .unwrap_or(DEFAULT_LOOP_ITERATIONS)
        .max(1);
    let input = text_of(&arguments);
    let mut spent: i64 = 0;
    let mut feedback: Option<String> = None;
    let mut last: Option<(String, Option<String>)> = None;
    for iteration in 1..=iterations {
        let mut producer_input = arguments.clone();
        let with_feedback = match &feedback {
            Some(feedback) => {
                producer_input.insert("feedback".into(), json!(feedback));
                format!("{input}\n\nFeedback on your previous answer:\n{feedback}")
            }
            None => {
                // No feedback yet: a producer template's `[[feedback]]` renders empty, not as
                // an unresolved placeholder sent to the model.
                producer_input
                    .entry("feedback")
                    .or_insert_with(|| json!(""));
                input.clone()
            }
        };
        producer_input.insert("input".into(), json!(with_feedback));
        let produced = runner
            .run_child(
                SubRun {
                    name: format!("{}.producer#{iteration}", tool.name),
                    flow: producer,
                    max_depth: None,
                    temperature: None,
                },
                producer_input,
            )
            .await;
        spent = spent.saturating_add(produced.child_credits);
        let answer = match produced.result {
            Ok(answer) => answer,
            Err(message) => {
                return AgentOutcome {
                    result: Err(message),
                    child_request_id: produced.child_request_id,
                    child_credits: spent,
                };
            }
        };
        last = Some((answer.clone(), produced.child_request_id.clone()));
        let mut critic_input = Map::new();
        critic_input.insert(
            "input".into(),
            json!(format!("{input}\n\nAnswer to review:\n{answer}")),
        );
        critic_input.insert("output".into(), json!(answer));
        let mut judged = None;
        for attempt in 1..=2 {
            let critique = runner
                .run_child(
                    SubRun {
                        name: format!("{}.critic#{iteration}", tool.name),
                        flow: critic,
                        max_depth: None,
                        temperature: Some(0.0),
                    },
                    critic_input.clone(),
                )
                .await;
            spent = spent.saturating_add(critique.child_credits);
            match critique.result.as_deref().ok().and_then(verdict) {
                Some(found) => {
                    judged = Some(found);
                    break;
                }
                None if attempt == 1 => continue,
                None => {}
            }
        }
        let Some(judged) = judged else {
            runner.events.emit(
                "error",
                json!({"code": "CRITIQUE_INVALID", "agentRole": tool.name, "recoverable": true,
                       "message": format!("the critic of '{}' did not answer {{approved, feedback}} twice; the loop ended after iteration {iteration}", tool.name)}),
            );
            break;
        };
        if judged.approved {
            return AgentOutcome {
                result: Ok(answer),
                child_request_id: produced.child_request_id,
                child_credits: spent,
            };
        }
        feedback = Some(judged.feedback);
    }
    match last {
        Some((answer, child)) => AgentOutcome {
            result: Ok(answer),
            child_request_id: child,
            child_credits: spent,
        },
        None => AgentOutcome {
            result: Err("the critique loop produced nothing".into()),
            child_request_id: None,
            child_credits: spent,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_from_json_with_or_without_fences() {
        let v = verdict(r#"{"approved": false, "feedback": "shorter"}"#).unwrap();
        assert!(!v.approved);
        assert_eq!(v.feedback, "shorter");
        assert!(
            verdict("```json\n{\"approved\": true}\n```")
                .unwrap()
                .approved
        );
        assert!(verdict("looks good to me").is_none());
        assert!(verdict(r#"{"approved": "yes"}"#).is_none());
    }
}
