//! Agent tools: sub-agents as child requests, costs per agent and across the tree, events with
//! agent paths, depth limits and cycles refused as failed tool calls.

use reqwest::Method;
use serde_json::{Value, json};

use crate::chat::wait_for_run;
use crate::tools::{Setup, calls, events_of, setup, tool_messages};
use baton_testkit::Reply;

impl Setup {
    /// An empty flow (its `main` template is set later): Agent tools need the flow to exist.
    pub(crate) async fn empty_flow(&self, title: &str) -> (String, String) {
        let flow = self
            .ok(Method::POST, "/api/v1/flows", Some(json!({"title": title})))
            .await;
        let slug = flow["name"].as_str().unwrap().to_string();
        let versions = self
            .ok(Method::GET, &format!("/api/v1/flows/{slug}/versions"), None)
            .await;
        (slug, versions[0]["id"].as_str().unwrap().to_string())
    }

    pub(crate) async fn finish_flow(&self, (slug, version): &(String, String), template: Value) {
        self.ok(
            Method::PUT,
            &format!("/api/v1/flows/{slug}/versions/{version}/templates/main"),
            Some(template),
        )
        .await;
        let _ = self
            .call(
                Method::POST,
                "/api/v1/environments",
                Some(json!({"name": "production"})),
            )
            .await;
        self.ok(
            Method::POST,
            &format!("/api/v1/flows/{slug}/versions/{version}/environments"),
            Some(json!({"environment": "production"})),
        )
        .await;
    }

    /// Editor -> researcher -> fact checker: a three-level tree of Agent tools (the middle one
    /// interpolates its input). Returns the root flow's (slug, version).
    pub(crate) async fn editor_tree(&self) -> (String, String) {
        let root = self.empty_flow("Editor").await;
        let middle = self.empty_flow("Researcher").await;
        let leaf = self.empty_flow("Fact checker").await;
        let researcher = self.agent_tool("researcher", &middle.0, None).await;
        let checker = self.agent_tool("fact_checker", &leaf.0, None).await;
        self.finish_flow(
            &root,
            json!({"template": "You edit.", "userTemplate": "[[topic]]", "toolIds": [researcher],
                   "llm": "openai/gpt-4o-mini"}),
        )
        .await;
        self.finish_flow(
            &middle,
            json!({"template": "You research: [[input]]", "toolIds": [checker], "llm": "openai/gpt-4o-mini"}),
        )
        .await;
        self.finish_flow(
            &leaf,
            json!({"template": "You check facts.", "userTemplate": "[[input]]", "llm": "openai/gpt-4o-mini"}),
        )
        .await;
        root
    }

    pub(crate) async fn agent_tool(
        &self,
        name: &str,
        flow: &str,
        max_depth: Option<u32>,
    ) -> String {
        let mut body = json!({"name": name, "toolType": "Agent", "agentTemplateId": flow,
                              "description": format!("Ask the {name}")});
        if let Some(depth) = max_depth {
            body["maxAgentDepth"] = json!(depth);
        }
        self.tool(body).await
    }
}

/// Credits of one mock answer (10 tokens in, 5 out) on gpt-4o-mini.
async fn credits_per_call(s: &Setup) -> i64 {
    let descriptors = s.ok(Method::GET, "/api/v1/models/descriptors", None).await;
    let mini = descriptors
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == "openai/gpt-4o-mini")
        .unwrap()
        .clone();
    let micro = 10 * mini["inputCreditsPerMillion"].as_i64().unwrap()
        + 5 * mini["outputCreditsPerMillion"].as_i64().unwrap();
    (micro + 500_000) / 1_000_000
}

#[tokio::test]
async fn a_three_level_agent_tree_runs_and_its_costs_add_up() {
    let s = setup().await;
    let root = s.editor_tree().await;

    s.mock.push(calls(&[(
        "r1",
        "researcher",
        json!({"input": "find rust facts"}),
    )]));
    s.mock.push(calls(&[(
        "f1",
        "fact_checker",
        json!({"input": "is rust from 2015?"}),
    )]));
    s.mock.push(Reply::text("Yes, 2015."));
    s.mock.push(Reply::text("Rust 1.0: 2015 (checked)."));
    s.mock.push(Reply::text("Final: Rust 1.0 shipped in 2015."));
    let response = s
        .app
        .client
        .post(format!("{}/api/v1/flows/{}/runs", s.app.address, root.0))
        .bearer_auth(&s.key)
        .json(&json!({"stream": true, "parameters": {"topic": "rust"}, "tags": ["Team:docs"],
                      "stream_options": {"include_tool_results": true, "include_agent_results": true}}))
        .header("X-Baton-Customer-Id", "cust-7")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = events_of(&response.text().await.unwrap());
    let of = |t: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == t).collect() };

    // Each agent's model calls carry its path and depth.
    let inferences = of("agentInferenceCompleted");
    assert_eq!(inferences.len(), 5);
    let paths: Vec<(Value, Value)> = inferences
        .iter()
        .map(|e| (e["agentPath"].clone(), e["depth"].clone()))
        .collect();
    assert!(paths.contains(&(json!([]), json!(0))));
    assert!(paths.contains(&(json!(["researcher"]), json!(1))));
    assert!(paths.contains(&(json!(["researcher", "fact_checker"]), json!(2))));
    let started = of("agentStarted");
    assert_eq!(started.len(), 2);
    assert_eq!(started[0]["data"]["agentRole"], "researcher");
    assert_eq!(started[1]["data"]["agentRole"], "fact_checker");
    assert_eq!(started[1]["depth"], 1, "emitted by its parent");

    let c = credits_per_call(&s).await;
    let completed = of("agentCompleted");
    let checker_done = completed
        .iter()
        .find(|e| e["data"]["agentRole"] == "fact_checker")
        .unwrap();
    assert_eq!(checker_done["data"]["totalCreditsUsed"], c);
    let researcher_done = completed
        .iter()
        .find(|e| e["data"]["agentRole"] == "researcher")
        .unwrap();
    assert_eq!(researcher_done["data"]["directCreditsUsed"], 2 * c);
    assert_eq!(researcher_done["data"]["totalCreditsUsed"], 3 * c);
    assert_eq!(researcher_done["data"]["childAgentCount"], 1);
    let tool_done = of("toolCompleted");
    let researcher_call = tool_done
        .iter()
        .find(|e| e["data"]["toolName"] == "researcher")
        .unwrap();
    assert_eq!(researcher_call["data"]["childCreditsUsed"], 3 * c);
    // Full results were asked for.
    assert_eq!(
        researcher_call["data"]["result"],
        "Rust 1.0: 2015 (checked)."
    );
    assert_eq!(checker_done["data"]["result"], "Yes, 2015.");
    // Usage updates count the tree's agents.
    let usage = of("usageUpdate");
    let most_active = usage
        .iter()
        .map(|e| e["data"]["activeAgents"].as_u64().unwrap())
        .max();
    assert_eq!(most_active, Some(3));
    let last = usage.last().unwrap();
    assert_eq!(
        (
            &last["data"]["activeAgents"],
            &last["data"]["completedAgents"]
        ),
        (&json!(1), &json!(2))
    );
    // Cumulative figures are the tree's: the last update has all five calls.
    assert_eq!(last["data"]["cumulativeCreditsUsed"], 5 * c);
    assert_eq!(last["data"]["cumulativeTokensIn"], 5 * 10);
    let end = of("requestCompleted");
    assert_eq!(end[0]["data"]["totalCreditsUsed"], 5 * c);
    // Like the credits, the whole tree's: five model calls, two tool calls.
    assert_eq!(end[0]["data"]["totalInferenceCount"], 5);
    assert_eq!(end[0]["data"]["totalTokensIn"], 5 * 10);
    assert_eq!(end[0]["data"]["totalTokensOut"], 5 * 5);
    assert_eq!(end[0]["data"]["totalToolCalls"], 2);
    assert_eq!(end[0]["data"]["totalAgentSpawns"], 2);
    assert_eq!(end[0]["data"]["maxDepthReached"], 2);
    assert_eq!(
        end[0]["data"]["result"]["textResponse"],
        "Final: Rust 1.0 shipped in 2015."
    );
    // The root's turns reach the stream as their text arrives; a sub-agent's answer is its
    // result, so the deltas joined are the root's words alone.
    let deltas: String = of("contentDelta")
        .iter()
        .inspect(|e| assert_eq!((&e["agentPath"], &e["depth"]), (&json!([]), &json!(0))))
        .map(|e| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "Final: Rust 1.0 shipped in 2015.");

    // The log holds the tree: root, child, grandchild, each with its direct cost.
    let root_id = events[0]["requestId"].as_str().unwrap().to_string();
    let root_run = wait_for_run(&s.app, &root_id).await;
    assert_eq!(root_run.cost_credits, 2 * c);
    let child_id = researcher_call["data"]["childRequestId"].as_str().unwrap();
    let child = wait_for_run(&s.app, child_id).await;
    assert_eq!(child.parent_id.as_deref(), Some(root_id.as_str()));
    assert_eq!(child.root_id, root_id);
    assert_eq!(child.depth, 1);
    assert_eq!(child.agent_role.as_deref(), Some("researcher"));
    assert_eq!(child.cost_credits, 2 * c);
    assert_eq!(child.tags, ["Team:docs"], "tags are inherited");
    assert_eq!(child.customer_external_id.as_deref(), Some("cust-7"));
    let grandchild_id = child.tool_calls[0].child_request_id.clone().unwrap();
    let grandchild = wait_for_run(&s.app, &grandchild_id).await;
    assert_eq!(grandchild.parent_id.as_deref(), Some(child_id));
    assert_eq!(grandchild.depth, 2);
    assert_eq!(grandchild.cost_credits, c);
    // The child's answer was the parent's tool result.
    let results = tool_messages(&s.mock, 4);
    assert!(results[0]["content"].to_string().contains("(checked)"));
}

/// A sub-agent that fails after spending: its subtree's spend is billed on its rows, and the
/// request's totals include it (the tool call's `childCreditsUsed`, `agentFailed`, the run's
/// `totalCreditsUsed`, `requestCompleted` agreeing with the last `usageUpdate`).
#[tokio::test]
async fn a_failed_sub_agents_spend_is_in_the_trees_totals() {
    let s = setup().await;
    let root = s.editor_tree().await;
    let c = credits_per_call(&s).await;
    let script = || {
        s.mock
            .push(calls(&[("r1", "researcher", json!({"input": "facts"}))]));
        s.mock
            .push(calls(&[("f1", "fact_checker", json!({"input": "2015?"}))]));
        s.mock.push(Reply::text("Yes."));
        s.mock.push(Reply::status(
            400,
            "the researcher's second turn is refused",
        ));
        s.mock.push(Reply::text("Went on without the researcher."));
    };
    script();
    let run = s
        .run(&root.0, json!({"parameters": {"topic": "rust"}}), &[])
        .await;
    let call = &run["toolCalls"][0];
    assert_eq!(call["status"], "failed", "{run}");
    assert_eq!(call["childCreditsUsed"], 2 * c, "{run}");
    assert_eq!(run["usage"]["totalCreditsUsed"], 4 * c, "{run}");
    let child = wait_for_run(&s.app, call["childRequestId"].as_str().unwrap()).await;
    assert_eq!(child.cost_credits, c, "the child's own call");

    script();
    let events = s
        .stream_run(
            &root.0,
            json!({"stream": true, "parameters": {"topic": "rust"}}),
        )
        .await;
    let last = |t: &str| events.iter().rev().find(|e| e["type"] == t).unwrap();
    assert_eq!(last("agentFailed")["data"]["totalCreditsUsed"], 2 * c);
    assert_eq!(last("toolFailed")["data"]["childCreditsUsed"], 2 * c);
    assert_eq!(last("requestCompleted")["data"]["totalCreditsUsed"], 4 * c);
    assert_eq!(last("usageUpdate")["data"]["cumulativeCreditsUsed"], 4 * c);
}

/// A sub-agent whose flow is in Route mode runs the template its classifier picks, as a flow
/// run would; the classifier's call is a child of the sub-agent's run, and its cost is in the
/// sub-agent's subtree and the request's total.
#[tokio::test]
async fn a_sub_agent_in_route_mode_runs_the_template_its_classifier_picks() {
    let s = setup().await;
    let root = s.empty_flow("Front desk").await;
    let desk = s.empty_flow("Support desk").await;
    let support = s.agent_tool("support", &desk.0, None).await;
    s.ok(
        Method::PUT,
        &format!("/api/v1/flows/{}/versions/{}/templates/billing", desk.0, desk.1),
        Some(json!({"description": "Invoices, refunds and payments", "template": "You handle billing.",
                    "userTemplate": "[[input]]", "llm": "openai/gpt-4o-mini"})),
    )
    .await;
    s.finish_flow(
        &desk,
        json!({"description": "Technical problems", "template": "You fix technical problems.",
               "userTemplate": "[[input]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.ok(
        Method::PUT,
        &format!("/api/v1/flows/{}", desk.0),
        Some(json!({"executionMode": "Route"})),
    )
    .await;
    s.finish_flow(
        &root,
        json!({"template": "You triage.", "userTemplate": "[[q]]", "toolIds": [support],
               "llm": "openai/gpt-4o-mini"}),
    )
    .await;

    s.mock.push(calls(&[(
        "s1",
        "support",
        json!({"input": "I was charged twice"}),
    )]));
    s.mock.push(Reply::text("billing"));
    s.mock.push(Reply::text("Refund issued."));
    s.mock.push(Reply::text("Your refund is on its way."));
    let before = s.mock.received().len();
    let response = s
        .app
        .post(
            &format!("/api/v1/flows/{}/runs", root.0),
            &s.key,
            json!({"parameters": {"q": "Help with my invoice"}}),
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text);
    let run = response.json();
    assert_eq!(run["output"]["text"], "Your refund is on its way.");

    let received = s.mock.received();
    let classifier = &received[before + 1].body;
    let menu = classifier["messages"][0]["content"].as_str().unwrap();
    assert!(
        menu.contains("billing: Invoices, refunds and payments"),
        "{menu}"
    );
    assert!(menu.contains("main: Technical problems"), "{menu}");
    assert_eq!(classifier["messages"][1]["content"], "I was charged twice");
    assert_eq!(
        received[before + 2].body["messages"][0]["content"],
        "You handle billing.",
        "the sub-agent ran the picked template"
    );

    // The classifier's call is a child of the sub-agent's run, in the same tree.
    let root_id = run["id"].as_str().unwrap().to_string();
    let root_run = wait_for_run(&s.app, &root_id).await;
    let child_id = root_run.tool_calls[0].child_request_id.clone().unwrap();
    let child = wait_for_run(&s.app, &child_id).await;
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    let runs = s.app.store.list_runs(&tenant).await.unwrap();
    let classifier_run = runs
        .iter()
        .find(|r| r.agent_role.as_deref() == Some("classifier"))
        .expect("the classifier's call is logged");
    assert_eq!(classifier_run.parent_id.as_deref(), Some(child_id.as_str()));
    assert_eq!(classifier_run.root_id, root_id);
    assert_eq!(classifier_run.depth, 2);
    // Its cost is in the sub-agent's subtree and the request's total.
    assert!(classifier_run.cost_credits > 0);
    let subtree = child.cost_credits + classifier_run.cost_credits;
    assert_eq!(root_run.tool_calls[0].child_credits_used, Some(subtree));
    assert_eq!(
        run["usage"]["totalCreditsUsed"],
        root_run.cost_credits + subtree
    );
}

/// A Route-mode classifier's call is part of the request, whether the chosen template has tools
/// or not: it counts against `maxCostPerRequestCredits` before the template's first call, and
/// in `requestCompleted`'s totals (a call, its tokens, a run one level down).
#[tokio::test]
async fn a_route_classifier_counts_against_the_cost_ceiling_and_in_the_totals() {
    let s = setup().await;
    let c = credits_per_call(&s).await;
    let echo = s.echo_tool("echo").await;
    for tools in [json!([echo]), json!([])] {
        let desk = s.empty_flow("Triage").await;
        s.ok(
            Method::PUT,
            &format!(
                "/api/v1/flows/{}/versions/{}/templates/billing",
                desk.0, desk.1
            ),
            Some(
                json!({"description": "Invoices", "template": "You handle billing.",
                        "toolIds": tools, "llm": "openai/gpt-4o-mini"}),
            ),
        )
        .await;
        s.finish_flow(
            &desk,
            json!({"description": "Technical problems", "template": "You fix things.",
                   "toolIds": tools, "llm": "openai/gpt-4o-mini"}),
        )
        .await;
        s.ok(
            Method::PUT,
            &format!("/api/v1/flows/{}", desk.0),
            Some(json!({"executionMode": "Route", "classifierModel": "openai/gpt-4o-mini"})),
        )
        .await;
        let runs = format!("/api/v1/flows/{}/runs", desk.0);
        // The smallest ceiling: the classifier's call alone reaches it.
        s.mock.push(Reply::text("billing"));
        let before = s.mock.received().len();
        s.app
            .post(&runs, &s.key, json!({"maxCostPerRequestCredits": 1}))
            .await
            .error(402, "COST_LIMIT_EXCEEDED");
        assert_eq!(
            s.mock.received().len(),
            before + 1,
            "{tools}: only the classifier"
        );
        // Streamed: the stream says so.
        s.mock.push(Reply::text("billing"));
        let events = s
            .app
            .post_events(
                &runs,
                &s.key,
                json!({"stream": true, "maxCostPerRequestCredits": 1}),
            )
            .await;
        let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert!(
            types.ends_with(&["error", "requestFailed"]),
            "{tools}: {types:?}"
        );
        let error = events.iter().find(|e| e["type"] == "error").unwrap();
        assert_eq!(error["data"]["code"], "COST_LIMIT_EXCEEDED", "{tools}");
        assert_eq!(
            s.mock.received().len(),
            before + 2,
            "{tools}: only the classifiers"
        );
        // Within the ceiling, the totals count the classifier's call.
        s.mock.push(Reply::text("billing"));
        s.mock.push(Reply::text("Your invoice is fine."));
        let events = s
            .app
            .post_events(&runs, &s.key, json!({"stream": true}))
            .await;
        let done = &events.last().unwrap()["data"];
        assert_eq!(done["totalCreditsUsed"], 2 * c, "{tools}: {done}");
        assert_eq!(done["totalInferenceCount"], 2, "{tools}: {done}");
        assert_eq!(done["totalTokensIn"], 20, "{tools}: {done}");
        assert_eq!(done["totalTokensOut"], 10, "{tools}: {done}");
        assert_eq!(done["maxDepthReached"], 1, "{tools}: {done}");
        let usage = events
            .iter()
            .rev()
            .find(|e| e["type"] == "usageUpdate")
            .unwrap();
        assert_eq!(
            usage["data"]["cumulativeCreditsUsed"],
            2 * c,
            "{tools}: {usage}"
        );
    }
}

#[tokio::test]
async fn depth_limits_and_cycles_fail_the_tool_call_not_the_run() {
    let s = setup().await;
    let top = s.empty_flow("Top").await;
    let middle = s.empty_flow("Middle").await;
    let bottom = s.empty_flow("Bottom").await;
    let to_middle = s.agent_tool("middle", &middle.0, None).await;
    let to_bottom = s.agent_tool("bottom", &bottom.0, Some(1)).await;
    let back_to_top = s.agent_tool("top_again", &top.0, None).await;
    s.finish_flow(
        &top,
        json!({"template": "t", "toolIds": [to_middle], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &middle,
        json!({"template": "m [[input]]", "toolIds": [to_bottom, back_to_top], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &bottom,
        json!({"template": "b [[input]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.mock
        .push(calls(&[("m1", "middle", json!({"input": "go"}))]));
    s.mock.push(calls(&[
        ("b1", "bottom", json!({"input": "deeper"})),
        ("t1", "top_again", json!({"input": "loop"})),
    ]));
    s.mock.push(Reply::text("middle gave up on both"));
    s.mock.push(Reply::text("top is done"));
    let run = s.run(&top.0, json!({}), &[]).await;
    assert_eq!(run["status"], "Succeeded");
    assert_eq!(run["output"]["text"], "top is done");
    let told: Vec<String> = tool_messages(&s.mock, 2)
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert!(told[0].contains("AGENT_DEPTH_EXCEEDED"), "{told:?}");
    assert!(told[1].contains("AGENT_CYCLE"), "{told:?}");
    // No model was called for the refused agents: four calls in all.
    assert_eq!(s.mock.received().len(), 4);
    // The refusals' events carry their codes apart; the calls are listed in the order made.
    let run_id = run["id"].as_str().unwrap();
    wait_for_run(&s.app, run_id).await;
    let events = s
        .ok(
            Method::GET,
            &format!("/api/v1/llm-logs/{run_id}/events?types=toolFailed"),
            None,
        )
        .await;
    let codes: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["data"]["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes.len(), 2, "{events}");
    assert!(codes.contains(&"AGENT_DEPTH_EXCEEDED") && codes.contains(&"AGENT_CYCLE"));
    let middle_id = run["toolCalls"][0]["childRequestId"].as_str().unwrap();
    let middle_run = wait_for_run(&s.app, middle_id).await;
    let order: Vec<&str> = middle_run
        .tool_calls
        .iter()
        .map(|c| c.call_id.as_str())
        .collect();
    assert_eq!(order, ["b1", "t1"]);
    // The request's own limit wins over the tool's: depth 2 is allowed now.
    s.mock
        .push(calls(&[("m1", "middle", json!({"input": "go"}))]));
    s.mock.push(calls(&[
        ("b1", "bottom", json!({"input": "deeper"})),
        ("t1", "top_again", json!({"input": "loop"})),
    ]));
    s.mock.push(Reply::text("bottom answer"));
    s.mock.push(Reply::text("middle is done"));
    s.mock.push(Reply::text("top is done again"));
    let run = s.run(&top.0, json!({"maxAgentDepth": 5}), &[]).await;
    assert_eq!(run["output"]["text"], "top is done again");
    let told: Vec<String> = tool_messages(&s.mock, 7)
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert!(told[0].contains("bottom answer"), "{told:?}");
    assert!(told[1].contains("AGENT_CYCLE"), "{told:?}");
}

#[tokio::test]
async fn sub_agents_get_context_tools_with_scoped_state() {
    let s = setup().await;
    let root = s.empty_flow("Boss").await;
    let middle = s.empty_flow("Planner").await;
    let leaf = s.empty_flow("Worker").await;
    let deepest = s.empty_flow("Helper").await;
    let planner = s.agent_tool("planner", &middle.0, None).await;
    let worker = s.agent_tool("worker", &leaf.0, None).await;
    let helper = s.agent_tool("helper", &deepest.0, None).await;
    s.finish_flow(
        &root,
        json!({"template": "boss", "userTemplate": "[[topic]]", "toolIds": [planner], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &middle,
        json!({"template": "plan [[input]]", "toolIds": [worker], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &leaf,
        json!({"template": "work [[input]]", "toolIds": [helper], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &deepest,
        json!({"template": "help [[input]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.mock
        .push(calls(&[("p", "planner", json!({"input": "plan it"}))]));
    s.mock.push(calls(&[
        ("s1", "set_state", json!({"key": "goal", "value": "ship"})),
        ("c1", "get_context", json!({})),
    ]));
    s.mock
        .push(calls(&[("w", "worker", json!({"input": "do it"}))]));
    s.mock.push(calls(&[
        ("g1", "get_state", json!({"key": "goal"})),
        ("o1", "get_original_input", json!({})),
        ("c2", "get_context", json!({})),
    ]));
    s.mock
        .push(calls(&[("h", "helper", json!({"input": "help me"}))]));
    s.mock.push(calls(&[
        ("o3", "get_original_input", json!({})),
        ("c3", "get_context", json!({})),
        ("g3", "get_state", json!({"key": "goal"})),
    ]));
    s.mock.push(Reply::text("helper done"));
    s.mock.push(Reply::text("worker done"));
    s.mock.push(Reply::text("planner done"));
    s.mock.push(Reply::text("all done"));
    let run = s
        .run(
            &root.0,
            json!({"parameters": {"topic": "release rust"}}),
            &[],
        )
        .await;
    assert_eq!(run["output"]["text"], "all done");
    // The root itself is offered no context tools; sub-agents are.
    let offered = |n: usize| -> Vec<String> {
        s.mock.received()[n].body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(!offered(0).contains(&"get_context".to_string()));
    assert!(offered(1).contains(&"get_state".to_string()));

    let parse = |m: &Value| -> Value {
        serde_json::from_str(
            m["content"]
                .as_str()
                .unwrap_or_else(|| m["content"][0]["text"].as_str().unwrap()),
        )
        .unwrap()
    };
    let planner_results = tool_messages(&s.mock, 2);
    let context = parse(&planner_results[1]);
    assert_eq!(context["depth"], 1);
    assert_eq!(context["agentPath"], json!(["planner"]));
    let worker_results = tool_messages(&s.mock, 4);
    assert_eq!(
        parse(&worker_results[0])["value"],
        "ship",
        "an ancestor's state"
    );
    assert_eq!(
        parse(&worker_results[1])["messages"],
        json!(["release rust"]),
        "the root's user messages"
    );
    let context = parse(&worker_results[2]);
    assert_eq!(context["depth"], 2);
    assert_eq!(context["agentPath"], json!(["planner", "worker"]));
    assert!(context["costUsedCredits"].as_i64().unwrap() > 0);

    // Depth 3: the root's messages and the grandparent's state still reach the deepest agent.
    let helper_results = tool_messages(&s.mock, 6);
    assert_eq!(
        parse(&helper_results[0])["messages"],
        json!(["release rust"]),
        "the root's user messages from depth 3"
    );
    let context = parse(&helper_results[1]);
    assert_eq!(context["depth"], 3);
    assert_eq!(context["agentPath"], json!(["planner", "worker", "helper"]));
    assert_eq!(parse(&helper_results[2])["value"], "ship");
}

#[tokio::test]
async fn a_cost_ceiling_hit_in_a_child_stops_the_whole_tree() {
    let s = setup().await;
    let root = s.empty_flow("Spender").await;
    let child = s.empty_flow("Helper").await;
    let helper = s.agent_tool("helper", &child.0, None).await;
    s.finish_flow(
        &root,
        json!({"template": "t", "toolIds": [helper], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &child,
        json!({"template": "h [[input]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    let c = credits_per_call(&s).await;
    assert!(c > 0);
    s.mock
        .push(calls(&[("h", "helper", json!({"input": "spend"}))]));
    let response = s
        .app
        .post(
            &format!("/api/v1/flows/{}/runs", root.0),
            &s.key,
            json!({"maxCostPerRequestCredits": c}),
        )
        .await;
    let error = response.error(402, "COST_LIMIT_EXCEEDED");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{c} credits")),
        "{error}"
    );
    // The root's first call spent the budget: the child and the root made no further call.
    assert_eq!(s.mock.received().len(), 1);

    // Streamed: an `error` event with the code, not recoverable, then `requestFailed`.
    s.mock
        .push(calls(&[("h", "helper", json!({"input": "spend"}))]));
    let text = s
        .app
        .client
        .post(format!("{}/api/v1/flows/{}/runs", s.app.address, root.0))
        .bearer_auth(&s.key)
        .json(&json!({"stream": true, "maxCostPerRequestCredits": c}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = events_of(&text);
    let errors: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "error" && e["depth"] == 0)
        .collect();
    assert_eq!(errors[0]["data"]["code"], "COST_LIMIT_EXCEEDED");
    assert_eq!(errors[0]["data"]["recoverable"], false);
    assert!(events.iter().any(|e| e["type"] == "requestFailed"));
    assert!(events.iter().any(|e| e["type"] == "agentFailed"));
}

#[tokio::test]
async fn a_critique_loop_iterates_until_the_critic_approves_or_the_limit() {
    let s = setup().await;
    let root = s.empty_flow("Poet").await;
    let drafter = s.empty_flow("Drafter").await;
    let reviewer = s.empty_flow("Reviewer").await;
    let polish = s
        .tool(
            json!({"name": "polish", "toolType": "CritiqueLoop", "producerFlowId": drafter.0,
                     "criticFlowId": reviewer.0, "maxLoopIterations": 2}),
        )
        .await;
    s.finish_flow(
        &root,
        json!({"template": "poet", "toolIds": [polish], "llm": "openai/gpt-4o-mini", "temperature": 0.9}),
    )
    .await;
    s.finish_flow(
        &drafter,
        json!({"template": "Draft. Last feedback: [[feedback]]", "userTemplate": "[[input]]", "llm": "openai/gpt-4o-mini", "temperature": 0.8}),
    )
    .await;
    s.finish_flow(
        &reviewer,
        json!({"template": "Review. Answer {\"approved\": bool, \"feedback\": string}.", "userTemplate": "[[input]]",
               "llm": "openai/gpt-4o-mini", "temperature": 0.7}),
    )
    .await;

    // Approved on the second iteration.
    s.mock.push(calls(&[(
        "p",
        "polish",
        json!({"input": "a haiku about rain"}),
    )]));
    s.mock.push(Reply::text("draft one"));
    s.mock.push(Reply::text(
        r#"{"approved": false, "feedback": "mention the sea"}"#,
    ));
    s.mock.push(Reply::text("draft two, with the sea"));
    s.mock
        .push(Reply::text(r#"{"approved": true, "feedback": ""}"#));
    s.mock.push(Reply::text("here it is"));
    let run = s.run(&root.0, json!({}), &[]).await;
    assert_eq!(run["output"]["text"], "here it is");
    let received = s.mock.received();
    assert_eq!(received.len(), 6);
    assert_eq!(received[2].body["temperature"], 0.0, "the critic runs at 0");
    assert_eq!(received[4].body["temperature"], 0.0);
    assert!(
        received[3].body["messages"]
            .to_string()
            .contains("mention the sea"),
        "the producer gets the feedback"
    );
    assert!(
        received[2].body["messages"]
            .to_string()
            .contains("draft one"),
        "the critic gets the answer"
    );
    let result = tool_messages(&s.mock, 5)[0]["content"].to_string();
    assert!(result.contains("draft two, with the sea"), "{result}");
    // `[[feedback]]` is empty on the first iteration (not sent as written), the critic's after.
    let system = |n: usize| received[n].body["messages"][0]["content"].clone();
    assert_eq!(system(1), "Draft. Last feedback: ");
    assert_eq!(system(3), "Draft. Last feedback: mention the sea");
    let call = &run["toolCalls"][0];
    assert_eq!(call["toolType"], "CritiqueLoop");
    assert_eq!(call["status"], "succeeded");

    // Never approved: the loop stops after maxLoopIterations with the last answer.
    s.mock
        .push(calls(&[("p", "polish", json!({"input": "a limerick"}))]));
    for round in 1..=2 {
        s.mock.push(Reply::text(format!("limerick {round}")));
        s.mock
            .push(Reply::text(r#"{"approved": false, "feedback": "funnier"}"#));
    }
    s.mock.push(Reply::text("best I could do"));
    let run = s.run(&root.0, json!({}), &[]).await;
    assert_eq!(run["output"]["text"], "best I could do");
    let result = tool_messages(&s.mock, 11)[0]["content"].to_string();
    assert!(result.contains("limerick 2"), "{result}");
    assert_eq!(s.mock.received().len(), 12);
}

#[tokio::test]
async fn cancelling_a_run_stops_its_whole_tree_and_keeps_what_was_produced() {
    let s = setup().await;
    cancel_mid_tree(&s, None).await;
}

/// The cancel is stored: an instance that did not start the run can cancel it.
#[tokio::test]
async fn another_instance_can_cancel_a_run() {
    let s = setup().await;
    let other = s.app.other_instance().await;
    cancel_mid_tree(&s, Some(&other.address)).await;
}

/// Streams a root whose sub-agent (`worker`) sleeps 3 s in a tool; the root's last model call
/// answers `last`. Returns the response, not read yet, and the root's run id.
async fn stream_sleeping_tree(s: &Setup, last: &str) -> (reqwest::Response, String) {
    let root = s.empty_flow("Manager").await;
    let child = s.empty_flow("Sleeper").await;
    let worker = s.agent_tool("worker", &child.0, None).await;
    let nap = s
        .tool(json!({"name": "nap", "toolType": "External",
                     "webUrl": format!("{}/sleep?ms=3000", s.host.origin())}))
        .await;
    s.finish_flow(
        &root,
        json!({"template": "t", "toolIds": [worker], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &child,
        json!({"template": "w [[input]]", "toolIds": [nap], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.mock
        .push(calls(&[("w", "worker", json!({"input": "sleep"}))]));
    s.mock.push(calls(&[("n", "nap", json!({}))]));
    s.mock.push(Reply::text(last));
    s.start_run_stream(&root.0, json!({"stream": true})).await
}

/// A run cancelled while its model answers with tool calls stops before running them; its log
/// keeps that answer as it stood (its tool calls, finish reason `tool_calls`), as the stored
/// `agentInferenceCompleted` says.
#[tokio::test]
async fn a_run_cancelled_before_its_tool_calls_keeps_the_answer_that_asked_for_them() {
    let s = setup().await;
    let echo = s.echo_tool("echo").await;
    let flow = s.flow_with_tool("Asker", &echo).await;
    s.mock.push(Reply::Delayed(
        std::time::Duration::from_secs(3),
        Box::new(calls(&[("e1", "echo", json!({}))])),
    ));
    let (response, run_id) = s.start_run_stream(&flow, json!({"stream": true})).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while s
        .app
        .get(&format!("/api/v1/runs/{run_id}"), &s.key)
        .await
        .status
        != 200
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cancel = s
        .app
        .post(&format!("/api/v1/runs/{run_id}/cancel"), &s.key, json!({}))
        .await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    let _ = response.text().await.unwrap();
    assert!(s.host.requests().is_empty(), "the calls never ran");
    let run = wait_for_run(&s.app, &run_id).await;
    assert!(run.cancelled_at.is_some());
    assert_eq!(run.finish_reason.as_deref(), Some("tool_calls"));
    let answer = run.response.as_ref().unwrap().to_value();
    assert_eq!(answer["toolCalls"][0]["name"], "echo", "{answer}");
}

/// A root whose sub-agent sleeps in a tool; the root is cancelled (through `cancel_via`, else
/// the instance running it) while the tool runs.
async fn cancel_mid_tree(s: &Setup, cancel_via: Option<&str>) {
    let (response, run_id) = stream_sleeping_tree(s, "never asked").await;
    // Cancel the root while the child's tool sleeps (its call has reached the host), once the
    // run's pending row is written (the cancel looks the run up; rows are written in batches,
    // which take longer on a loaded machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let logged = s
            .app
            .get(&format!("/api/v1/runs/{run_id}"), &s.key)
            .await
            .status
            == 200;
        if (logged && s.host.requests().len() == 1) || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cancel = crate::helpers::send(
        s.app
            .client
            .post(format!(
                "{}/api/v1/runs/{run_id}/cancel",
                cancel_via.unwrap_or(&s.app.address)
            ))
            .bearer_auth(&s.key),
    )
    .await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    assert!(cancel.json()["cancelRequestedAt"].is_string());
    let events = events_of(&response.text().await.unwrap());
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let error = types
        .iter()
        .position(|t| *t == "error")
        .expect("an error event");
    assert_eq!(events[error]["data"]["code"], "RUN_CANCELLED");
    assert_eq!(types.last(), Some(&"requestCompleted"), "{types:?}");
    // The sub-agent stopped with it: its call is reported cancelled, not completed; the root
    // alone reports the cancellation.
    assert_eq!(types.iter().filter(|t| **t == "error").count(), 1);
    let agent = events
        .iter()
        .find(|e| e["type"] == "agentCompleted")
        .unwrap();
    assert_eq!(agent["data"]["status"], "cancelled", "{agent}");
    assert!(
        events.iter().any(|e| e["type"] == "toolFailed"),
        "{types:?}"
    );
    assert!(error < types.len() - 1);
    // The in-flight work finished; no model call was made after the cancel.
    assert_eq!(s.mock.received().len(), 2);
    assert_eq!(s.host.requests().len(), 1);

    let root_run = wait_for_run(&s.app, &run_id).await;
    assert!(root_run.cancel_requested_at.is_some());
    assert!(
        root_run
            .cancel_requested_by
            .as_deref()
            .unwrap()
            .starts_with("apiKey:")
    );
    assert!(root_run.cancelled_at.is_some());
    assert_eq!(root_run.status, baton_domain::run::RunStatus::Succeeded);
    assert!(root_run.warnings.iter().any(|w| w.code == "Cancelled"));
    assert!(root_run.cost_credits > 0, "what was produced is billed");
    let child_id = root_run.tool_calls[0].child_request_id.clone().unwrap();
    let child_run = wait_for_run(&s.app, &child_id).await;
    assert!(
        child_run.cancelled_at.is_some(),
        "the sub-agent stopped too"
    );
    // The sub-agent carries the Cancelled flag and is found by its filter.
    let entry = s
        .ok(Method::GET, &format!("/api/v1/llm-logs/{child_id}"), None)
        .await;
    assert_eq!(entry["cancelled"], true, "{entry}");
    let listed = s
        .ok(Method::GET, "/api/v1/llm-logs?cancelled=true", None)
        .await;
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&child_id.as_str()) && ids.contains(&run_id.as_str()),
        "{ids:?}"
    );
    let listed = s
        .ok(Method::GET, "/api/v1/llm-logs?cancelled=false", None)
        .await;
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["id"] != child_id.as_str()),
        "{listed}"
    );
    // A finished run cannot be cancelled again, and the answer does not invite a retry.
    let error = s
        .call(Method::POST, &format!("/api/v1/runs/{run_id}/cancel"), None)
        .await
        .error(409, "CONFLICT");
    assert_eq!(
        error["message"],
        format!("run '{run_id}' has already finished")
    );
}

/// A cancel request for a sub-agent alone stops it; its parent goes on, told the call failed.
#[tokio::test]
async fn a_sub_agent_cancelled_alone_fails_its_call_and_its_parent_goes_on() {
    let s = setup().await;
    let (response, run_id) = stream_sleeping_tree(&s, "went on without it").await;
    // The child's pending row, once its tool call has reached the host.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let child_id = loop {
        let listed = s
            .app
            .get(
                &format!("/api/v1/llm-logs?parentRequestId={run_id}"),
                &s.key,
            )
            .await
            .json();
        let found = listed["items"][0]["id"].as_str().map(str::to_string);
        if let Some(id) = found.filter(|_| s.host.requests().len() == 1) {
            break id;
        }
        assert!(std::time::Instant::now() < deadline, "the child never ran");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let cancel = s
        .call(
            Method::POST,
            &format!("/api/v1/runs/{child_id}/cancel"),
            None,
        )
        .await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);

    let events = events_of(&response.text().await.unwrap());
    let of = |t: &str| -> Vec<&Value> { events.iter().filter(|e| e["type"] == t).collect() };
    let errors = of("error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["data"]["code"], "RUN_CANCELLED");
    assert_eq!(errors[0]["data"]["agentRole"], "worker");
    assert_eq!(errors[0]["data"]["recoverable"], true);
    let failed = of("toolFailed");
    assert_eq!(failed.len(), 1, "{events:?}");
    assert_eq!(failed[0]["data"]["toolName"], "worker");
    let completed = &of("agentCompleted")[0]["data"];
    assert_eq!(completed["status"], "cancelled");
    for field in [
        "directCreditsUsed",
        "inferenceCount",
        "toolCallCount",
        "childAgentCount",
    ] {
        assert!(completed.get(field).is_some(), "{field}: {completed}");
    }
    // The parent was told, and answered.
    let told = tool_messages(&s.mock, 2)[0]["content"].to_string();
    assert!(told.contains("cancelled"), "{told}");
    let completed = of("requestCompleted");
    assert_eq!(
        completed[0]["data"]["result"]["textResponse"],
        "went on without it"
    );
    let root_run = wait_for_run(&s.app, &run_id).await;
    assert!(root_run.cancel_requested_at.is_none());
}

#[tokio::test]
async fn an_agent_tree_is_one_request_for_the_rate_limit() {
    let s = setup().await;
    let root = s.empty_flow("Lead").await;
    let child = s.empty_flow("Helper").await;
    let helper = s.agent_tool("helper", &child.0, None).await;
    s.finish_flow(
        &root,
        json!({"template": "lead", "toolIds": [helper], "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.finish_flow(
        &child,
        json!({"template": "help [[input]] in [[tone]]", "llm": "openai/gpt-4o-mini"}),
    )
    .await;
    s.ok(
        Method::PUT,
        "/api/v1/settings",
        Some(json!({"requestsPerMinute": 1})),
    )
    .await;
    s.mock
        .push(calls(&[("h", "helper", json!({"input": "x"}))]));
    s.mock.push(Reply::text("helped"));
    s.mock.push(Reply::text("led"));
    // Root and sub-agent together take one request: the sub-agent is not refused.
    let run = s.run(&root.0, json!({}), &[]).await;
    assert_eq!(run["output"]["text"], "led");
    assert_eq!(run["toolCalls"][0]["status"], "succeeded", "{run}");
    // The sub-agent's own unresolved parameter is a warning on its run, as a root's is.
    let child_id = run["toolCalls"][0]["childRequestId"].as_str().unwrap();
    let child_run = wait_for_run(&s.app, child_id).await;
    let warning = &child_run.warnings[0];
    assert_eq!(
        (warning.code.as_str(), warning.parameter.as_deref()),
        ("UNRESOLVED_PARAMETER", Some("tone"))
    );
    // The next request is over the limit.
    let refused = s
        .call(
            Method::POST,
            &format!("/api/v1/flows/{}/runs", root.0),
            Some(json!({})),
        )
        .await;
    refused.error(429, "RATE_LIMITED");
}
