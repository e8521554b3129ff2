//! Statistics endpoints over a seeded invocation log: several flows, models, tags, customers,
//! three-level agent trees, failures, a cancelled run, a Panel request and a pending run. Every
//! number is recomputed here from the seeded records, independently of the server's code.

use std::collections::{BTreeMap, BTreeSet};

use baton_domain::run::{RunKind, RunRecord, RunStatus, ToolCallRecord};
use baton_domain::{TenantId, Timestamp};
use chrono::DateTime;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

const MINUTE: i64 = 60_000;
const DAY: i64 = 24 * 60 * MINUTE;
const MODELS: [&str; 3] = [
    "openai/gpt-4o-mini",
    "anthropic/claude-3-5-haiku",
    "mystery/unpriced",
];
const ROOT_FLOWS: [&str; 3] = ["support", "research", "triage"];

fn at(ms: i64) -> Timestamp {
    Timestamp(DateTime::from_timestamp_millis(ms).unwrap())
}

fn tool_call(n: usize) -> ToolCallRecord {
    ToolCallRecord {
        call_id: format!("call-{n}"),
        tool_name: "lookup".into(),
        tool_type: "External".into(),
        status: "succeeded".into(),
        target_url: None,
        origin_source: None,
        duration_ms: 5,
        error: None,
        turn: 0,
        child_request_id: None,
        child_credits_used: None,
    }
}

/// A small deterministic generator, so the workload is varied but the same on every run.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % below) as i64
    }
}

struct Seed {
    runs: Vec<RunRecord>,
    now: i64,
}

fn run(tenant: &TenantId, id: String, flow: &str, model: &str, created: i64) -> RunRecord {
    let mut r = baton_store::runs::new_record(id, tenant.clone(), RunKind::Flow, model.into());
    r.flow_name = Some(flow.into());
    r.served_model = Some(model.into());
    r.status = RunStatus::Succeeded;
    r.created_at = at(created);
    r.completed_at = Some(at(created + 1));
    r
}

fn seed(tenant: &TenantId) -> Seed {
    let now = Timestamp::now().0.timestamp_millis();
    let mut rng = Lcg(42);
    let mut runs = Vec::new();
    let fill = |r: &mut RunRecord, rng: &mut Lcg| {
        r.usage.tokens_in = rng.next(2_000) as u64 + 1;
        r.usage.tokens_out = rng.next(800) as u64;
        r.duration_ms = rng.next(20_000) as u64 + 20;
        if r.served_model.as_deref() == Some(MODELS[2]) {
            r.pricing_uncertain = true;
        } else {
            r.raw_cost_credits = rng.next(9_000) + 1;
            r.cost_credits = r.raw_cost_credits + r.raw_cost_credits / 10;
        }
    };
    for i in 0..72usize {
        let flow = ROOT_FLOWS[i % 3];
        let model = MODELS[(i * 7 / 3) % 3];
        // Most in the last 40 hours; every sixth one in the week before (the previous period).
        let created = if i % 6 == 5 {
            now - 7 * DAY - (i as i64 + 1) * 97 * MINUTE
        } else {
            now - (i as i64 + 1) * 33 * MINUTE
        };
        let mut root = run(tenant, format!("req-{i:03}"), flow, model, created);
        fill(&mut root, &mut rng);
        root.tags = vec![
            if i % 2 == 0 {
                "Team:search"
            } else {
                "Team:billing"
            }
            .to_string(),
            "Env:prod".to_string(),
        ];
        if i % 9 == 0 {
            root.tags.push("Team:ops".into());
        }
        root.customer_external_id = Some(format!("cust-{}", i % 4));
        root.tool_calls = (0..(i % 4)).map(tool_call).collect();
        if i % 11 == 0 {
            root.status = RunStatus::Failed;
            root.error_code = Some("PROVIDER_ERROR".into());
        }
        if i == 13 {
            // A cancelled run: stopped mid-way, billed for what it produced.
            root.cancel_requested_at = Some(at(created + 1));
            root.cancelled_at = Some(at(created + 1));
            root.status = RunStatus::Failed;
        }
        // Research requests are three-level agent trees: research -> summarise -> lookup.
        let mut tree = Vec::new();
        if flow == "research" {
            for c in 0..(1 + i % 2) {
                let mut child = run(
                    tenant,
                    format!("req-{i:03}-c{c}"),
                    "summarise",
                    MODELS[(i + c) % 2],
                    created + 1,
                );
                fill(&mut child, &mut rng);
                child.root_id = root.id.clone();
                child.parent_id = Some(root.id.clone());
                child.depth = 1;
                child.tags = root.tags.clone();
                child.agent_role = Some("summariser".into());
                if i % 5 < 2 {
                    let mut grandchild = run(
                        tenant,
                        format!("req-{i:03}-c{c}-g"),
                        "lookup",
                        MODELS[2 - c],
                        created + 2,
                    );
                    fill(&mut grandchild, &mut rng);
                    grandchild.root_id = root.id.clone();
                    grandchild.parent_id = Some(child.id.clone());
                    grandchild.depth = 2;
                    grandchild.tags = root.tags.clone();
                    if c == 1 {
                        grandchild.status = RunStatus::Failed;
                    }
                    tree.push(grandchild);
                }
                tree.push(child);
            }
        }
        runs.push(root);
        runs.extend(tree);
    }
    // A Panel deliberation: a separate request with fixed tags, never in tag reports.
    let mut panel = run(
        tenant,
        "panel-1".into(),
        "support",
        MODELS[0],
        now - 90 * MINUTE,
    );
    fill(&mut panel, &mut rng);
    panel.tags = vec!["Panel".into(), "Team:search".into()];
    runs.push(panel);
    // A run still going: no statistics count it.
    let mut pending = run(
        tenant,
        "pending-1".into(),
        "support",
        MODELS[0],
        now - MINUTE,
    );
    pending.status = RunStatus::Pending;
    pending.cost_credits = 777_777;
    pending.tags = vec!["Team:search".into()];
    runs.push(pending);
    // Tags that a prefix must not catch by substring, case or wildcard.
    for (n, tag) in ["team:lower", "XTeam:y", "Team%x", "Team_y"]
        .iter()
        .enumerate()
    {
        let mut r = run(
            tenant,
            format!("odd-{n}"),
            "triage",
            MODELS[1],
            now - (n as i64 + 2) * MINUTE,
        );
        fill(&mut r, &mut rng);
        r.tags = vec![tag.to_string()];
        runs.push(r);
    }
    Seed { runs, now }
}

/// The smallest value with at least p% of the values at or below it (the sorted-list
/// definition, written without the server's rank formula).
fn percentile(values: &[i64], p: u64) -> i64 {
    let mut sorted = values.to_vec();
    sorted.sort();
    let n = sorted.len() as u64;
    *sorted
        .iter()
        .find(|&&x| sorted.iter().filter(|&&v| v <= x).count() as u64 * 100 >= p * n)
        .unwrap()
}

fn check_distribution(got: &Value, values: &[i64], what: &str) {
    assert_eq!(got["count"], values.len(), "{what}");
    if values.is_empty() {
        return;
    }
    for p in [50, 90, 95, 99] {
        assert_eq!(
            got[format!("p{p}")].as_i64().unwrap(),
            percentile(values, p),
            "{what} p{p}"
        );
    }
    assert_eq!(got["min"], *values.iter().min().unwrap(), "{what}");
    assert_eq!(got["max"], *values.iter().max().unwrap(), "{what}");
    let avg = values.iter().sum::<i64>() as f64 / values.len() as f64;
    assert!((got["avg"].as_f64().unwrap() - avg).abs() < 1e-9, "{what}");
}

fn usd(credits: i64) -> f64 {
    credits as f64 / 1_000_000.0
}

fn finished(r: &&RunRecord) -> bool {
    r.status != RunStatus::Pending
}

async fn seeded() -> (TestApp, Seed, String) {
    let app = spawn_app().await;
    let tenant = TenantId::new(app.default_tenant.id.clone());
    let key = app.default_tenant.api_key.clone();
    // Some flows exist as records, `summarise` and `lookup` only in the log (deleted flows keep
    // their statistics).
    for title in ["Support", "Research", "Triage"] {
        let created = app
            .post("/api/v1/flows", &key, json!({"title": title}))
            .await;
        assert_eq!(created.status, 201, "{}", created.text);
    }
    let seed = seed(&tenant);
    app.store.write_runs(&seed.runs, &[]).await.unwrap();
    (app, seed, key)
}

#[tokio::test]
async fn flow_statistics_match_the_seeded_runs() {
    let (app, seed, key) = seeded().await;
    for flow in ["research", "summarise", "lookup", "support"] {
        let runs: Vec<&RunRecord> = seed
            .runs
            .iter()
            .filter(finished)
            .filter(|r| r.flow_name.as_deref() == Some(flow))
            .collect();
        let body = app
            .get(&format!("/api/v1/statistics/flow/{flow}"), &key)
            .await;
        assert_eq!(body.status, 200, "{}", body.text);
        let body = body.json();
        assert_eq!(body["calls"], runs.len());
        let models: BTreeSet<&str> = runs
            .iter()
            .map(|r| r.served_model.as_deref().unwrap())
            .collect();
        assert_eq!(body["models"].as_array().unwrap().len(), models.len());
        for stats in body["models"].as_array().unwrap() {
            let model = stats["model"].as_str().unwrap();
            let mine: Vec<&&RunRecord> = runs
                .iter()
                .filter(|r| r.served_model.as_deref() == Some(model))
                .collect();
            let n = mine.len() as f64;
            assert_eq!(stats["calls"], mine.len(), "{flow} {model}");
            assert_eq!(
                stats["failed"],
                mine.iter()
                    .filter(|r| r.status == RunStatus::Failed)
                    .count()
            );
            let cost: i64 = mine.iter().map(|r| r.cost_credits).sum();
            assert_eq!(stats["costCredits"], cost);
            assert_eq!(stats["costUsd"].as_f64().unwrap(), usd(cost));
            assert_eq!(
                stats["rawCostCredits"],
                mine.iter().map(|r| r.raw_cost_credits).sum::<i64>()
            );
            let tokens_in: u64 = mine.iter().map(|r| r.usage.tokens_in).sum();
            assert!((stats["avgTokensIn"].as_f64().unwrap() - tokens_in as f64 / n).abs() < 1e-9);
            let tokens_out: u64 = mine.iter().map(|r| r.usage.tokens_out).sum();
            assert!((stats["avgTokensOut"].as_f64().unwrap() - tokens_out as f64 / n).abs() < 1e-9);
            let latencies: Vec<i64> = mine.iter().map(|r| r.duration_ms as i64).collect();
            check_distribution(
                &stats["latencyMs"],
                &latencies,
                &format!("{flow} {model} latency"),
            );
            let histogram = stats["latencyHistogram"].as_array().unwrap();
            assert_eq!(
                histogram
                    .iter()
                    .map(|b| b["count"].as_u64().unwrap())
                    .sum::<u64>(),
                mine.len() as u64
            );
            for bucket in histogram {
                let lower = bucket["lower"].as_i64().unwrap();
                let upper = bucket["upper"].as_i64().unwrap_or(i64::MAX);
                let inside = latencies
                    .iter()
                    .filter(|&&v| v >= lower && v < upper)
                    .count();
                assert_eq!(bucket["count"], inside, "{flow} {model} bucket {lower}");
            }
        }
    }

    // Request level: research roots with their whole trees.
    let roots: Vec<&RunRecord> = seed
        .runs
        .iter()
        .filter(finished)
        .filter(|r| r.flow_name.as_deref() == Some("research") && r.parent_id.is_none())
        .collect();
    let tree_of = |root: &RunRecord| -> Vec<&RunRecord> {
        seed.runs.iter().filter(|r| r.root_id == root.id).collect()
    };
    let tree_costs: Vec<i64> = roots
        .iter()
        .map(|r| tree_of(r).iter().map(|x| x.cost_credits).sum())
        .collect();
    let request = app
        .get("/api/v1/statistics/flow/research/request", &key)
        .await
        .json();
    assert_eq!(request["requests"], roots.len());
    assert_eq!(request["costCredits"], tree_costs.iter().sum::<i64>());
    assert_eq!(
        request["failed"],
        roots
            .iter()
            .filter(|r| r.status == RunStatus::Failed)
            .count()
    );
    check_distribution(&request["costPerRequest"], &tree_costs, "tree cost");
    let calls: Vec<i64> = roots.iter().map(|r| r.tool_calls.len() as i64).collect();
    assert_eq!(request["functionCalls"], calls.iter().sum::<i64>());
    check_distribution(
        &request["functionCallsPerRequest"],
        &calls,
        "function calls",
    );
    let latencies: Vec<i64> = roots.iter().map(|r| r.duration_ms as i64).collect();
    check_distribution(&request["latencyMs"], &latencies, "request latency");
    for by_model in request["byPrimaryModel"].as_array().unwrap() {
        let model = by_model["model"].as_str().unwrap();
        let mine: Vec<&&RunRecord> = roots
            .iter()
            .filter(|r| r.served_model.as_deref() == Some(model))
            .collect();
        assert_eq!(by_model["requests"], mine.len());
        assert_eq!(
            by_model["costCredits"],
            mine.iter()
                .map(|r| tree_of(r).iter().map(|x| x.cost_credits).sum::<i64>())
                .sum::<i64>()
        );
        let latencies: Vec<i64> = mine.iter().map(|r| r.duration_ms as i64).collect();
        check_distribution(&by_model["latencyMs"], &latencies, model);
    }

    // Tree level.
    let tree = app
        .get("/api/v1/statistics/flow/research/tree", &key)
        .await
        .json();
    assert_eq!(tree["trees"], roots.len());
    let agents: Vec<i64> = roots.iter().map(|r| tree_of(r).len() as i64).collect();
    let depths: Vec<i64> = roots
        .iter()
        .map(|r| tree_of(r).iter().map(|x| x.depth as i64).max().unwrap())
        .collect();
    assert_eq!(
        depths.iter().max(),
        Some(&2),
        "the workload has three-level trees"
    );
    check_distribution(&tree["agentCount"], &agents, "agents");
    check_distribution(&tree["maxDepth"], &depths, "depth");
    let counts = |values: &[i64]| -> Value {
        let mut map = BTreeMap::<i64, u64>::new();
        for v in values {
            *map.entry(*v).or_default() += 1;
        }
        Value::Array(
            map.into_iter()
                .map(|(value, count)| json!({"value": value, "count": count}))
                .collect(),
        )
    };
    assert_eq!(tree["agentCountDistribution"], counts(&agents));
    assert_eq!(tree["maxDepthDistribution"], counts(&depths));
    assert_eq!(tree["costCredits"], tree_costs.iter().sum::<i64>());

    // Extended: the three levels again, and a series holding every run of the flow.
    let extended = app
        .get(
            "/api/v1/statistics/flow/research/extended?period=3d&resolution=hour",
            &key,
        )
        .await;
    assert_eq!(extended.status, 200, "{}", extended.text);
    let extended = extended.json();
    assert_eq!(extended["resolution"], "Hour");
    let recent: Vec<&RunRecord> = seed
        .runs
        .iter()
        .filter(finished)
        .filter(|r| {
            r.flow_name.as_deref() == Some("research")
                && r.created_at.0.timestamp_millis() > seed.now - 3 * DAY
        })
        .collect();
    let series = extended["series"].as_array().unwrap();
    assert!(series.len() >= 72 && series.len() <= 73, "{}", series.len());
    assert_eq!(
        series
            .iter()
            .map(|p| p["invocations"].as_i64().unwrap())
            .sum::<i64>(),
        recent.len() as i64
    );
    assert_eq!(
        series
            .iter()
            .map(|p| p["costCredits"].as_i64().unwrap())
            .sum::<i64>(),
        recent.iter().map(|r| r.cost_credits).sum::<i64>()
    );
    for point in series {
        let start = DateTime::parse_from_rfc3339(point["start"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        assert_eq!(start % (60 * MINUTE), 0, "hour buckets start on the hour");
        let inside = recent
            .iter()
            .filter(|r| (start..start + 60 * MINUTE).contains(&r.created_at.0.timestamp_millis()))
            .count();
        assert_eq!(point["invocations"], inside);
    }
    assert_eq!(extended["inference"]["calls"], recent.len());
    assert_eq!(extended["tree"]["trees"], extended["request"]["requests"]);

    // Unknown flows are 404, as another tenant's are.
    app.get("/api/v1/statistics/flow/nope", &key)
        .await
        .error(404, "NOT_FOUND");

    // A deleted flow keeps its statistics, by its id as by its slug.
    let support = app.get("/api/v1/flows/support", &key).await.json();
    let id = support["id"].as_str().unwrap();
    let before = app
        .get("/api/v1/statistics/flow/support", &key)
        .await
        .json();
    assert_eq!(app.delete("/api/v1/flows/support", &key).await.status, 204);
    for name in ["support", id] {
        let after = app
            .get(&format!("/api/v1/statistics/flow/{name}"), &key)
            .await;
        assert_eq!(after.status, 200, "{name}: {}", after.text);
        assert_eq!(after.json()["calls"], before["calls"], "{name}");
    }
}

#[tokio::test]
async fn tenant_statistics_overview_and_model_costs_match_the_seeded_runs() {
    let (app, seed, key) = seeded().await;
    let ms = |r: &RunRecord| r.created_at.0.timestamp_millis();
    let finished_runs: Vec<&RunRecord> = seed.runs.iter().filter(finished).collect();

    let report = app
        .get("/api/v1/statistics?period=7.00:00:00&resolution=HOUR", &key)
        .await;
    assert_eq!(report.status, 200, "{}", report.text);
    let report = report.json();
    let to = DateTime::parse_from_rfc3339(report["to"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    let from = to - 7 * DAY;
    let current: Vec<&&RunRecord> = finished_runs
        .iter()
        .filter(|r| (from..to).contains(&ms(r)))
        .collect();
    let previous: Vec<&&RunRecord> = finished_runs
        .iter()
        .filter(|r| (from - 7 * DAY..from).contains(&ms(r)))
        .collect();
    assert!(!previous.is_empty());
    assert_eq!(report["invocations"]["current"], current.len());
    assert_eq!(report["invocations"]["previous"], previous.len());
    let change = (current.len() as f64 - previous.len() as f64) * 100.0 / previous.len() as f64;
    assert!((report["invocations"]["changePercent"].as_f64().unwrap() - change).abs() < 1e-9);
    let roots = |list: &[&&RunRecord]| {
        list.iter()
            .map(|r| r.root_id.clone())
            .collect::<BTreeSet<_>>()
            .len()
    };
    assert_eq!(report["requests"]["current"], roots(&current));
    assert_eq!(report["requests"]["previous"], roots(&previous));
    let cost = |list: &[&&RunRecord]| list.iter().map(|r| r.cost_credits).sum::<i64>();
    assert_eq!(report["credits"]["currentCredits"], cost(&current));
    assert_eq!(report["credits"]["previousCredits"], cost(&previous));
    assert_eq!(
        report["failed"]["current"],
        current
            .iter()
            .filter(|r| r.status == RunStatus::Failed)
            .count()
    );
    let series = report["series"].as_array().unwrap();
    // Hour buckets from the hour holding `from` (169, or 168 when `from` falls on the hour).
    assert!(
        (7 * 24..=7 * 24 + 1).contains(&series.len()),
        "{}",
        series.len()
    );
    for point in series {
        let start = DateTime::parse_from_rfc3339(point["start"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        let inside: Vec<&&&RunRecord> = current
            .iter()
            .filter(|r| (start.max(from)..start + 60 * MINUTE).contains(&ms(r)))
            .collect();
        assert_eq!(point["invocations"], inside.len());
        assert_eq!(
            point["costCredits"],
            inside.iter().map(|r| r.cost_credits).sum::<i64>()
        );
        assert_eq!(
            point["tokensIn"],
            inside.iter().map(|r| r.usage.tokens_in).sum::<u64>()
        );
        assert_eq!(
            point["tokensOut"],
            inside.iter().map(|r| r.usage.tokens_out).sum::<u64>()
        );
    }
    let mut per_flow = BTreeMap::<String, usize>::new();
    for r in &current {
        *per_flow.entry(r.flow_name.clone().unwrap()).or_default() += 1;
    }
    for flow in report["flows"].as_array().unwrap() {
        let name = flow["flowName"].as_str().unwrap();
        let total: i64 = flow["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["invocations"].as_i64().unwrap())
            .sum();
        assert_eq!(total as usize, per_flow[name], "{name}");
    }
    assert_eq!(report["flows"].as_array().unwrap().len(), per_flow.len());
    let top = report["topFlows"].as_array().unwrap();
    let mut expected_top: Vec<(usize, &String)> = per_flow.iter().map(|(k, v)| (*v, k)).collect();
    expected_top.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    assert_eq!(
        top.iter()
            .map(|t| t["flowName"].as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        expected_top.iter().map(|t| t.1.clone()).collect::<Vec<_>>()
    );

    // Overview (30 days: every finished run here).
    let overview = app.get("/api/v1/statistics/overview", &key).await.json();
    let total_cost: i64 = finished_runs.iter().map(|r| r.cost_credits).sum();
    assert_eq!(overview["calls"], finished_runs.len());
    assert_eq!(overview["costCredits"], total_cost);
    for row in overview["byModel"].as_array().unwrap() {
        let model = row["name"].as_str().unwrap();
        let mine: Vec<&&RunRecord> = finished_runs
            .iter()
            .filter(|r| r.served_model.as_deref() == Some(model))
            .collect();
        let cost: i64 = mine.iter().map(|r| r.cost_credits).sum();
        assert_eq!(row["calls"], mine.len());
        assert_eq!(row["costCredits"], cost);
        assert!(
            (row["costPercent"].as_f64().unwrap() - cost as f64 * 100.0 / total_cost as f64).abs()
                < 1e-9
        );
        assert!(
            (row["callsPercent"].as_f64().unwrap()
                - mine.len() as f64 * 100.0 / finished_runs.len() as f64)
                .abs()
                < 1e-9
        );
    }
    let by_flow = overview["byFlow"].as_array().unwrap();
    assert_eq!(
        by_flow
            .iter()
            .map(|r| r["costCredits"].as_i64().unwrap())
            .sum::<i64>(),
        total_cost
    );
    let percent: f64 = by_flow
        .iter()
        .map(|r| r["costPercent"].as_f64().unwrap())
        .sum();
    assert!((percent - 100.0).abs() < 1e-6);
    let costs: Vec<i64> = by_flow
        .iter()
        .map(|r| r["costCredits"].as_i64().unwrap())
        .collect();
    assert!(costs.windows(2).all(|w| w[0] >= w[1]), "ranked by cost");

    // Model costs: a 2-day period is bucketed by hour, 7 days by day, 120 days by week.
    for (period, bucket, width) in [
        ("2d", "Hour", 60 * MINUTE),
        ("7d", "Day", DAY),
        ("120d", "Week", 7 * DAY),
    ] {
        let costs = app
            .get(
                &format!("/api/v1/statistics/model-costs?period={period}&flowName=research"),
                &key,
            )
            .await;
        assert_eq!(costs.status, 200, "{}", costs.text);
        let costs = costs.json();
        assert_eq!(costs["bucket"], bucket);
        let to = DateTime::parse_from_rfc3339(costs["to"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        let from = DateTime::parse_from_rfc3339(costs["from"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        let mine: Vec<&&RunRecord> = finished_runs
            .iter()
            .filter(|r| r.flow_name.as_deref() == Some("research") && (from..to).contains(&ms(r)))
            .collect();
        let mut expected = BTreeMap::<(i64, String), (i64, i64, i64)>::new();
        for r in &mine {
            let offset = if bucket == "Week" { 4 * DAY } else { 0 };
            let start = (ms(r) - offset).div_euclid(width) * width + offset;
            let cell = expected
                .entry((start, r.served_model.clone().unwrap()))
                .or_default();
            cell.0 += 1;
            cell.1 += r.cost_credits;
            cell.2 += r.raw_cost_credits;
        }
        let cells = costs["cells"].as_array().unwrap();
        assert_eq!(cells.len(), expected.len(), "{period}");
        for cell in cells {
            let start = DateTime::parse_from_rfc3339(cell["bucketStart"].as_str().unwrap())
                .unwrap()
                .timestamp_millis();
            let (calls, cost, raw) =
                expected[&(start, cell["model"].as_str().unwrap().to_string())];
            assert_eq!(cell["calls"], calls);
            assert_eq!(cell["costCredits"], cost);
            assert_eq!(cell["rawCostCredits"], raw);
            assert!(
                (cell["avgCostCredits"].as_f64().unwrap() - cost as f64 / calls as f64).abs()
                    < 1e-9
            );
        }
    }
}

#[tokio::test]
async fn tag_costs_split_and_rollup_total_the_same_and_by_key_ranks_prefixes() {
    let (app, seed, key) = seeded().await;
    let tagged: Vec<&RunRecord> = seed
        .runs
        .iter()
        .filter(finished)
        .filter(|r| {
            r.tags.iter().any(|t| t == "Team:search") && !r.tags.iter().any(|t| t == "Panel")
        })
        .collect();
    let flow_of = |r: &RunRecord| r.flow_name.clone().unwrap();
    let root_flow_of = |r: &RunRecord| {
        seed.runs
            .iter()
            .find(|x| x.id == r.root_id)
            .unwrap()
            .flow_name
            .clone()
            .unwrap()
    };
    let mut totals = Vec::new();
    for (grouping, key_of) in [
        ("split", &flow_of as &dyn Fn(&RunRecord) -> String),
        ("rollup", &root_flow_of),
    ] {
        let report = app
            .get(
                &format!(
                    "/api/v1/statistics/tag-costs?tag=Team:search&grouping={}",
                    grouping.to_uppercase()
                ),
                &key,
            )
            .await;
        assert_eq!(report.status, 200, "{}", report.text);
        let report = report.json();
        assert_eq!(report["grouping"], grouping);
        let mut expected =
            BTreeMap::<(String, String), (i64, i64, usize, BTreeSet<String>, bool)>::new();
        for r in &tagged {
            let cell = expected
                .entry((key_of(r), r.served_model.clone().unwrap()))
                .or_default();
            cell.0 += r.cost_credits;
            cell.1 += r.raw_cost_credits;
            cell.2 += 1;
            cell.3.insert(r.root_id.clone());
            cell.4 |= r.pricing_uncertain;
        }
        let cells = report["cells"].as_array().unwrap();
        assert_eq!(cells.len(), expected.len(), "{grouping}");
        for cell in cells {
            let (cost, raw, calls, requests, uncertain) = &expected[&(
                cell["flowName"].as_str().unwrap().to_string(),
                cell["model"].as_str().unwrap().to_string(),
            )];
            assert_eq!(cell["costCredits"], *cost);
            assert_eq!(cell["costUsd"].as_f64().unwrap(), usd(*cost));
            assert_eq!(cell["rawCostUsd"].as_f64().unwrap(), usd(*raw));
            assert_eq!(cell["calls"], *calls);
            assert_eq!(cell["requests"], requests.len());
            assert_eq!(cell["pricingUncertain"], *uncertain);
        }
        if grouping == "rollup" {
            assert!(
                cells
                    .iter()
                    .all(|c| c["flowName"] != "summarise" && c["flowName"] != "lookup")
            );
        } else {
            assert!(cells.iter().any(|c| c["flowName"] == "lookup"));
        }
        let cell_sum: i64 = cells
            .iter()
            .map(|c| c["costCredits"].as_i64().unwrap())
            .sum();
        assert_eq!(report["totals"]["costCredits"], cell_sum);
        assert_eq!(cell_sum, tagged.iter().map(|r| r.cost_credits).sum::<i64>());
        assert_eq!(
            report["totals"]["requests"],
            tagged
                .iter()
                .map(|r| &r.root_id)
                .collect::<BTreeSet<_>>()
                .len()
        );
        assert_eq!(report["totals"]["pricingUncertain"], true);
        totals.push(report["totals"].clone());
    }
    assert_eq!(totals[0], totals[1], "split and rollup total the same");

    // An explicit window: nothing before it counts.
    let from = at(seed.now - 10 * 33 * MINUTE).to_string();
    let narrow = app
        .get(
            &format!("/api/v1/statistics/tag-costs?tag=Team:search&from={from}"),
            &key,
        )
        .await
        .json();
    let from_ms = seed.now - 10 * 33 * MINUTE;
    assert_eq!(
        narrow["totals"]["calls"],
        tagged
            .iter()
            .filter(|r| r.created_at.0.timestamp_millis() >= from_ms)
            .count()
    );

    // A bare date is that day's UTC midnight, as on /llm-logs.
    let day = chrono::DateTime::from_timestamp_millis(from_ms)
        .unwrap()
        .date_naive();
    let by_day = app
        .get(
            &format!("/api/v1/statistics/tag-costs?tag=Team:search&from={day}"),
            &key,
        )
        .await;
    assert_eq!(by_day.status, 200, "{}", by_day.text);
    let midnight = day
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp_millis();
    assert_eq!(
        by_day.json()["totals"]["calls"],
        tagged
            .iter()
            .filter(|r| r.created_at.0.timestamp_millis() >= midnight)
            .count()
    );

    // By key: anchored, case-sensitive, wildcard-free prefixes, ranked by spend, Panel excluded.
    let by_key = app
        .get("/api/v1/statistics/tag-costs/by-key?prefix=Team:", &key)
        .await;
    assert_eq!(by_key.status, 200, "{}", by_key.text);
    let by_key = by_key.json();
    let mut expected: Vec<(i64, String, usize)> = ["Team:search", "Team:billing", "Team:ops"]
        .iter()
        .map(|tag| {
            let mine: Vec<&RunRecord> = seed
                .runs
                .iter()
                .filter(finished)
                .filter(|r| r.tags.iter().any(|t| t == tag) && !r.tags.iter().any(|t| t == "Panel"))
                .collect();
            (
                mine.iter().map(|r| r.cost_credits).sum(),
                tag.to_string(),
                mine.len(),
            )
        })
        .collect();
    expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let rows = by_key["rows"].as_array().unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (
                r["costCredits"].as_i64().unwrap(),
                r["tag"].as_str().unwrap().to_string(),
                r["calls"].as_u64().unwrap() as usize
            ))
            .collect::<Vec<_>>(),
        expected
    );
    assert_eq!(by_key["truncated"], false);
    assert_eq!(by_key["limit"], 50);
    let limited = app
        .get(
            "/api/v1/statistics/tag-costs/by-key?prefix=Team:&limit=2",
            &key,
        )
        .await
        .json();
    assert_eq!(limited["rows"].as_array().unwrap().len(), 2);
    assert_eq!(limited["truncated"], true);
    assert_eq!(limited["rows"][0]["tag"], expected[0].1.as_str());
    for (prefix, only) in [
        ("Team%25", "Team%x"),
        ("Team_", "Team_y"),
        ("team", "team:lower"),
        ("XTeam", "XTeam:y"),
    ] {
        let rows = app
            .get(
                &format!("/api/v1/statistics/tag-costs/by-key?prefix={prefix}"),
                &key,
            )
            .await
            .json()["rows"]
            .clone();
        assert_eq!(
            rows.as_array()
                .unwrap()
                .iter()
                .map(|r| r["tag"].as_str().unwrap())
                .collect::<Vec<_>>(),
            vec![only],
            "{prefix}"
        );
    }
    // The window is capped at 365 days before `to`.
    let capped = app
        .get("/api/v1/statistics/tag-costs/by-key?prefix=Team:&from=2000-01-01T00:00:00Z&to=2030-01-01T00:00:00Z", &key)
        .await
        .json();
    assert_eq!(capped["from"], "2029-01-01T00:00:00.000Z");
}

#[tokio::test]
async fn invalid_statistics_queries_name_the_field() {
    let app = spawn_app().await;
    let key = app.default_tenant.api_key.clone();
    for (path, param) in [
        ("/api/v1/statistics?period=soon", "period"),
        ("/api/v1/statistics?period=0d", "period"),
        ("/api/v1/statistics?resolution=Month", "resolution"),
        (
            "/api/v1/statistics?period=365d&resolution=minutes5",
            "resolution",
        ),
        ("/api/v1/statistics/overview?period=-1d", "period"),
        ("/api/v1/statistics/model-costs?period=x", "period"),
        ("/api/v1/statistics/tag-costs", "tag"),
        (
            "/api/v1/statistics/tag-costs?tag=A:b&grouping=sideways",
            "grouping",
        ),
        (
            "/api/v1/statistics/tag-costs?tag=A:b&from=yesterday",
            "from",
        ),
        (
            "/api/v1/statistics/tag-costs?tag=A:b&from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
            "from",
        ),
        ("/api/v1/statistics/tag-costs/by-key", "prefix"),
        (
            "/api/v1/statistics/tag-costs/by-key?prefix=A&limit=0",
            "limit",
        ),
        (
            "/api/v1/statistics/tag-costs/by-key?prefix=A&limit=201",
            "limit",
        ),
        (
            "/api/v1/statistics/tag-costs/by-key?prefix=A&limit=ten",
            "limit",
        ),
        (
            "/api/v1/statistics/tag-costs/by-key?prefix=A&to=never",
            "to",
        ),
        ("/api/v1/statistics?bogus=1", "bogus"),
    ] {
        let body = app.get(path, &key).await.error(400, "VALIDATION_ERROR");
        assert_eq!(body["param"], param, "{path}");
    }
    // Empty reports are zeros, not errors.
    let empty = app
        .get("/api/v1/statistics?period=24h&resolution=minutes15", &key)
        .await;
    assert_eq!(empty.status, 200, "{}", empty.text);
    assert_eq!(empty.json()["invocations"]["current"], 0);
    let buckets = empty.json()["series"].as_array().unwrap().len();
    assert!((24 * 4..=24 * 4 + 1).contains(&buckets), "{buckets}");
    let by_key = app
        .get(
            "/api/v1/statistics/tag-costs/by-key?prefix=A&limit=200",
            &key,
        )
        .await;
    assert_eq!(by_key.status, 200, "{}", by_key.text);
}
