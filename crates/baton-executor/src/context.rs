//! Context tools (SPEC.md "Context tools"), injected into every sub-agent: `get_context`,
//! `get_original_input`, `get_state`, `set_state`. State is scoped lexically: an agent sees its
//! ancestors' values, its own writes shadow them, and siblings and parents never see them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use baton_domain::chat::ToolDefinition;
use serde_json::{Map, Value, json};

use baton_domain::tool::CONTEXT_TOOL_NAMES;

pub const GET_CONTEXT: &str = CONTEXT_TOOL_NAMES[0];
pub const GET_ORIGINAL_INPUT: &str = CONTEXT_TOOL_NAMES[1];
pub const GET_STATE: &str = CONTEXT_TOOL_NAMES[2];
pub const SET_STATE: &str = CONTEXT_TOOL_NAMES[3];

/// One agent's state frame, chained to its parent's.
#[derive(Clone, Default)]
pub struct StateScope {
    frame: Arc<Mutex<HashMap<String, Value>>>,
    parent: Option<Arc<StateScope>>,
}

impl StateScope {
    /// A new frame for a child: it reads through to this one.
    pub fn child(&self) -> StateScope {
        StateScope {
            frame: Arc::default(),
            parent: Some(Arc::new(self.clone())),
        }
    }

    pub fn get(&self, key: &str) -> Option<Value> {
        let own = self
            .frame
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        own.or_else(|| self.parent.as_ref().and_then(|p| p.get(key)))
    }

    pub fn set(&self, key: &str, value: Value) {
        self.frame
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_string(), value);
    }
}

/// What a sub-agent's context tools answer from.
#[derive(Clone)]
pub struct AgentContext {
    pub depth: u32,
    /// Agent roles from the root to this agent.
    pub agent_path: Vec<String>,
    /// The root request's user messages.
    pub original_input: Arc<Vec<String>>,
    pub state: StateScope,
    /// Credits the whole tree has spent so far.
    pub spent: Arc<AtomicI64>,
    /// The request's cost ceiling, when there is one.
    pub budget: Option<i64>,
}

impl AgentContext {
    pub fn definitions() -> Vec<ToolDefinition> {
        let tool = |name: &str, description: &str, parameters: Value| ToolDefinition {
            name: name.to_string(),
            description: Some(description.to_string()),
            parameters,
            strict: None,
        };
        let none = json!({"type": "object", "properties": {}});
        vec![
            tool(
                GET_CONTEXT,
                "Your depth in the agent tree, the agent path from the root, the cost used so far and the budget remaining (credits; 1,000,000 = 1 USD).",
                none.clone(),
            ),
            tool(
                GET_ORIGINAL_INPUT,
                "The user messages of the request that started the whole agent tree.",
                none,
            ),
            tool(
                GET_STATE,
                "Reads a value shared down the agent tree (yours, else the nearest ancestor's).",
                json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}),
            ),
            tool(
                SET_STATE,
                "Writes a value that the agents you start can read; your parent and siblings do not see it.",
                json!({"type": "object", "properties": {"key": {"type": "string"}, "value": {}},
                       "required": ["key", "value"]}),
            ),
        ]
    }

    /// Answers one context tool call (the arguments were checked against its schema).
    pub fn call(&self, name: &str, arguments: &Map<String, Value>) -> Result<String, String> {
        let key = || {
            arguments
                .get("key")
                .and_then(Value::as_str)
                .ok_or_else(|| "'key' must be a string".to_string())
        };
        match name {
            GET_CONTEXT => {
                let spent = self.spent.load(Ordering::Relaxed);
                Ok(json!({
                    "depth": self.depth,
                    "agentPath": self.agent_path,
                    "costUsedCredits": spent,
                    "budgetRemainingCredits": self.budget.map(|b| (b - spent).max(0)),
                })
                .to_string())
            }
            GET_ORIGINAL_INPUT => Ok(json!({"messages": self.original_input.as_ref()}).to_string()),
            GET_STATE => Ok(json!({"key": key()?, "value": self.state.get(key()?)}).to_string()),
            SET_STATE => {
                let value = arguments.get("value").cloned().unwrap_or(Value::Null);
                self.state.set(key()?, value);
                Ok(json!({"ok": true}).to_string())
            }
            other => Err(format!("'{other}' is not a context tool")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_scoped_lexically() {
        let root = StateScope::default();
        root.set("topic", json!("rust"));
        let child = root.child();
        let grandchild = child.child();
        let sibling = root.child();
        // | reader     | sees                                   |
        assert_eq!(
            grandchild.get("topic"),
            Some(json!("rust")),
            "ancestors' values"
        );
        child.set("topic", json!("go"));
        assert_eq!(child.get("topic"), Some(json!("go")), "own write shadows");
        assert_eq!(
            grandchild.get("topic"),
            Some(json!("go")),
            "nearest ancestor wins"
        );
        assert_eq!(
            sibling.get("topic"),
            Some(json!("rust")),
            "siblings do not see it"
        );
        assert_eq!(
            root.get("topic"),
            Some(json!("rust")),
            "parents do not see it"
        );
        grandchild.set("found", json!(1));
        assert_eq!(child.get("found"), None);
        assert_eq!(grandchild.get("missing"), None);
    }

    #[test]
    fn get_context_reports_the_budget_left() {
        let context = AgentContext {
            depth: 2,
            agent_path: vec!["a".into(), "b".into()],
            original_input: Arc::new(vec!["hello".into()]),
            state: StateScope::default(),
            spent: Arc::new(AtomicI64::new(300)),
            budget: Some(1000),
        };
        let answer: Value =
            serde_json::from_str(&context.call(GET_CONTEXT, &Map::new()).unwrap()).unwrap();
        assert_eq!(answer["depth"], 2);
        assert_eq!(answer["agentPath"], json!(["a", "b"]));
        assert_eq!(answer["budgetRemainingCredits"], 700);
        let input: Value =
            serde_json::from_str(&context.call(GET_ORIGINAL_INPUT, &Map::new()).unwrap()).unwrap();
        assert_eq!(input["messages"], json!(["hello"]));
    }
}
