//! `cargo xtask soak`: a bounded soak of the real `baton` binary on loopback, checking that
//! nothing is lost (docs/reliability.md, "Soak").
//!
//! The mock (`baton-mock`) plays every provider and tool: `openai` goes to its failing route
//! (`/fail/20`: a fifth of the chat calls fail, alternately 500 and 429, which is a tenth of all
//! requests with this mix), `deepseek` to its plain route (flows, agent trees: its model calls
//! the offered tool once, then answers), `mistral` to a one-second stream (the clients that
//! disconnect). Its `/tool/echo` is the External tool and its `/mcp` the MCP server. Baton runs
//! on a fresh SQLite file with its log on (`target/soak/baton.log`), as a development build:
//! only those reach tools on loopback (`BATON_DEV_ALLOW_PRIVATE_NETWORK`).
//!
//! An open loop sends the mix at `--rate` for `--duration`, each request tagged `Soak:<kind>`;
//! then the checks: every request answered once within its deadline, log rows per kind = the
//! requests (plus one child row per agent tree), the ledger's credits per tag = what the clients
//! saw, RSS flat after warm-up; then SIGTERM during a last burst: every request in flight is
//! answered, Baton exits 0, and restarted on the same file its log holds every answered request.
//! Figures go to `target/soak/soak.json`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use crate::load::procs::{self, BatonSpec, Guarded, TempDir};
use crate::load::{driver, target_dir, workspace_root};

const KEY: &str = procs::BOOTSTRAP_KEY;
/// Share of the chat calls the mock fails: chat is half the mix, so a tenth of all requests.
const FAIL_PERCENT: u64 = 20;
/// A request not answered within this is a hang.
const DEADLINE: Duration = Duration::from_secs(30);
/// The disconnecting clients' stream: long enough that they leave mid-way.
const LONG_CHUNKS: u64 = 40;
const LONG_GAP_MS: u64 = 25;
const CHAT_MODEL: &str = "openai/gpt-4o-mini";
const FLOW_MODEL: &str = "deepseek/deepseek-flash";
const LONG_MODEL: &str = "mistral/ministral-3b-2512";
/// Where the soak's flows are pinned.
const ENVIRONMENT: &str = "production";

struct Options {
    duration: Duration,
    rate: u32,
    smoke: bool,
    /// `--only KIND[,KIND]`: the mix restricted to these kinds (to find which one a failed check
    /// comes from); the failure and ledger checks still hold for what is sent.
    only: Option<Vec<Kind>>,
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut duration = None;
        let mut rate = None;
        let mut smoke = false;
        let mut only = None;
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .with_context(|| format!("{flag} needs a value"))
                    .and_then(|v| {
                        v.parse::<u32>()
                            .with_context(|| format!("{flag}: '{v}' is not a whole number"))
                    })
            };
            match flag.as_str() {
                "--duration" => duration = Some(value()?.max(4)),
                "--rate" => rate = Some(value()?.max(1)),
                "--smoke" => smoke = true,
                "--only" => {
                    let list = args.next().context("--only needs a list of kinds")?;
                    let kinds = list
                        .split(',')
                        .map(|name| {
                            Kind::ALL
                                .into_iter()
                                .find(|k| k.name() == name.trim())
                                .with_context(|| format!("--only: unknown kind '{name}'"))
                        })
                        .collect::<anyhow::Result<Vec<Kind>>>()?;
                    only = Some(kinds);
                }
                other => bail!(
                    "unknown option {other}\nusage: cargo xtask soak [--smoke] [--duration SECONDS] [--rate REQUESTS_PER_SECOND] [--only KIND,...]"
                ),
            }
        }
        let default_duration = if smoke { 10 } else { 60 };
        Ok(Options {
            duration: Duration::from_secs(u64::from(duration.unwrap_or(default_duration))),
            // What this 2-core machine serves comfortably with a development build, its log on
            // and other builds beside it (docs/reliability.md, "Soak").
            rate: rate.unwrap_or(if smoke { 40 } else { 60 }),
            smoke,
            only,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    ChatSync,
    ChatStream,
    FlowExternal,
    FlowMcp,
    AgentTree,
    Disconnect,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::ChatSync,
        Kind::ChatStream,
        Kind::FlowExternal,
        Kind::FlowMcp,
        Kind::AgentTree,
        Kind::Disconnect,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::ChatSync => "chat-sync",
            Kind::ChatStream => "chat-stream",
            Kind::FlowExternal => "flow-external",
            Kind::FlowMcp => "flow-mcp",
            Kind::AgentTree => "agent-tree",
            Kind::Disconnect => "disconnect",
        }
    }

    fn tag(self) -> String {
        format!("Soak:{}", self.name())
    }

    /// Whether its calls go to the failing route.
    fn is_chat(self) -> bool {
        matches!(self, Kind::ChatSync | Kind::ChatStream)
    }
}

/// The mix, one kind per slot of twenty, interleaved so every second sees all of them: chat
/// 7 + 3, flows with an External tool 3 and with an MCP tool 2, agent trees 3, disconnects 2.
const SCHEDULE: [Kind; 20] = {
    use Kind::*;
    [
        ChatSync,
        FlowExternal,
        ChatStream,
        AgentTree,
        ChatSync,
        FlowMcp,
        Disconnect,
        ChatSync,
        FlowExternal,
        ChatStream,
        ChatSync,
        AgentTree,
        ChatSync,
        FlowMcp,
        ChatStream,
        ChatSync,
        FlowExternal,
        AgentTree,
        Disconnect,
        ChatSync,
    ]
};

/// What one client saw.
#[derive(Debug, Default, Clone)]
struct Seen {
    request_id: Option<String>,
    status: Option<u16>,
    /// A status and a whole body, a stream's end, or (disconnects) the first chunk.
    answered: bool,
    /// Transport error or hang, with the reason.
    problem: Option<String>,
    credits: i64,
    tokens_in: u64,
    tokens_out: u64,
    /// An events stream that ended with `requestFailed`: a provider failure after the request
    /// started is told in the stream, not by the status.
    stream_failed: bool,
}

impl Seen {
    fn failed(&self) -> bool {
        self.status.is_some_and(|s| s >= 400) || self.stream_failed
    }
}

/// The flows the setup created.
struct Flows {
    external: String,
    mcp: String,
    agent: String,
}

/// Credits of one gpt-4o-mini answer of the mock (12 tokens in, 6 out), priced as the catalogue
/// Baton serves says: the clients of the compatible endpoint see tokens, not credits.
struct ChatPrice {
    input_per_million: i64,
    output_per_million: i64,
}

impl ChatPrice {
    fn credits(&self, tokens_in: u64, tokens_out: u64) -> i64 {
        let micro = i64::try_from(tokens_in).unwrap_or(i64::MAX) * self.input_per_million
            + i64::try_from(tokens_out).unwrap_or(i64::MAX) * self.output_per_million;
        // The ledger rounds half up once per inference.
        (micro + 500_000) / 1_000_000
    }
}

struct Soak {
    client: reqwest::Client,
    base: String,
    flows: Flows,
    price: ChatPrice,
    /// Requests sent and not yet answered (sampled with the RSS: memory follows it).
    in_flight: AtomicUsize,
}

/// Counts a request in flight for as long as it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> InFlight<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    if options.smoke {
        // CI: the dev binaries `cargo test --workspace` built, as `bench load --smoke` uses.
        cargo(&["test", "--workspace", "--no-run"])?;
    } else {
        // Separate builds: together they would unify features and rebuild shared dependencies.
        cargo(&["build", "-p", "baton-server", "--bin", "baton"])?;
        cargo(&["build", "-p", "baton-testkit", "--bin", "baton-mock"])?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(soak(options, target_dir().join("debug")))
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    eprintln!("soak: cargo {}", args.join(" "));
    let status = crate::cargo_command()
        .current_dir(workspace_root())
        .args(args)
        .arg("--quiet")
        .status()?;
    ensure!(status.success(), "cargo {} failed", args.join(" "));
    Ok(())
}

fn baton_spec<'a>(
    bins: &'a Path,
    dir: &'a Path,
    mock_addr: &'a str,
    database_url: &'a str,
    log_file: &'a Path,
) -> BatonSpec<'a> {
    let env = [
        (
            "BATON_PROVIDERS__OPENAI__BASE_URL",
            format!("http://{mock_addr}/fail/{FAIL_PERCENT}/v1"),
        ),
        (
            "BATON_PROVIDERS__DEEPSEEK__BASE_URL",
            format!("http://{mock_addr}/v1"),
        ),
        ("BATON_PROVIDERS__DEEPSEEK__API_KEY", "sk-soak".to_string()),
        (
            "BATON_PROVIDERS__MISTRAL__BASE_URL",
            format!("http://{mock_addr}/shape/{LONG_CHUNKS}/{LONG_GAP_MS}/v1"),
        ),
        ("BATON_PROVIDERS__MISTRAL__API_KEY", "sk-soak".to_string()),
        // The tool host and the MCP server are on loopback (development builds only).
        ("BATON_DEV_ALLOW_PRIVATE_NETWORK", "1".to_string()),
    ];
    BatonSpec {
        log_file: Some(log_file),
        env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..BatonSpec::new(bins, dir, mock_addr, database_url)
    }
}

/// A named check and whether it held.
struct Checks(Vec<Value>);

impl Checks {
    fn add(&mut self, name: &str, ok: bool, detail: String) {
        eprintln!(
            "soak: {} {name}: {detail}",
            if ok { "ok  " } else { "FAIL" }
        );
        self.0
            .push(json!({"check": name, "ok": ok, "detail": detail}));
    }

    fn failed(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|c| c["ok"] == false)
            .filter_map(|c| c["check"].as_str().map(str::to_owned))
            .collect()
    }
}

async fn soak(options: Options, bins: PathBuf) -> anyhow::Result<()> {
    let started = Instant::now();
    let out = target_dir().join("soak");
    std::fs::create_dir_all(&out)?;
    let (_mock, mock_addr) = procs::start_mock(
        &bins,
        &["--chunks".into(), "5".into(), "--gap-ms".into(), "5".into()],
        None,
    )?;
    let dir = TempDir::new("soak")?;
    let database_url = format!("sqlite://{}", dir.0.join("baton.db").display());
    let log_path = out.join("baton.log");
    let (mut baton, address) = procs::start_baton(&baton_spec(
        &bins,
        &dir.0,
        &mock_addr,
        &database_url,
        &log_path,
    ))?;
    eprintln!(
        "soak: baton at {address} (pid {}, log {}), mock at {mock_addr}; {} s at {} req/s",
        baton.pid(),
        log_path.display(),
        options.duration.as_secs(),
        options.rate
    );
    let client = driver::client()?;
    let base = format!("http://{address}/api/v1");
    let flows = setup(&client, &base, &mock_addr).await?;
    let price = chat_price(&client, &base).await?;
    let soak = Arc::new(Soak {
        client,
        base,
        flows,
        price,
        in_flight: AtomicUsize::new(0),
    });
    let mut checks = Checks(Vec::new());

    // The load, with RSS sampled every second.
    let samples = Arc::new(Mutex::new(Vec::<(f64, u64)>::new()));
    let in_flight = Arc::new(Mutex::new(Vec::<usize>::new()));
    let sampling = sample_rss(
        baton.pid(),
        samples.clone(),
        soak.clone(),
        in_flight.clone(),
    );
    let load_started = Instant::now();
    let schedule: Vec<Kind> = SCHEDULE
        .into_iter()
        .filter(|k| options.only.as_ref().is_none_or(|only| only.contains(k)))
        .collect();
    ensure!(!schedule.is_empty(), "--only left no kind to send");
    let seen = open_loop(&soak, options.rate, options.duration, |i| {
        schedule[i % schedule.len()]
    })
    .await;
    let load_secs = load_started.elapsed().as_secs_f64();
    let rss: Vec<(f64, u64)> = samples.lock().map(|s| s.clone()).unwrap_or_default();

    let per_kind = tally(&seen);
    check_answers(&mut checks, &seen);
    let chat_sent = seen.iter().filter(|(k, _)| k.is_chat()).count() as u64;
    let injected = injected_failures(chat_sent);
    let chat_failed = seen
        .iter()
        .filter(|(k, s)| k.is_chat() && s.failed())
        .count() as u64;
    let other_failed: Vec<String> = seen
        .iter()
        .filter(|(k, s)| !k.is_chat() && s.failed())
        .map(|(k, s)| format!("{} {:?}", k.name(), s.status))
        .collect();
    checks.add(
        "injected failures answered as errors",
        chat_failed == injected && other_failed.is_empty(),
        format!(
            "{chat_failed} chat errors for {injected} failures injected into {chat_sent} chat calls; other errors: {other_failed:?}"
        ),
    );

    // Rows are written off the request path: wait for them.
    let expected_rows: u64 = seen.iter().map(|(k, s)| expected_rows(*k, s)).sum();
    let waited = Instant::now();
    driver::wait_for_log_rows(
        &soak.client,
        &address,
        KEY,
        expected_rows,
        Duration::from_secs(120),
    )
    .await?;
    let rows_lag_ms = waited.elapsed().as_millis() as u64;
    eprintln!("soak: the log caught up {rows_lag_ms} ms after the last answer");
    sampling.abort();
    let rss_after: Vec<(f64, u64)> = samples
        .lock()
        .map(|s| s[rss.len().min(s.len())..].to_vec())
        .unwrap_or_default();
    eprintln!(
        "soak: RSS while the log caught up: {:?} MB",
        rss_after
            .iter()
            .map(|(_, kb)| kb / 1024)
            .collect::<Vec<_>>()
    );
    let rows = driver::log_rows(&soak.client, &address, KEY).await?;
    let rows_json = check_rows(&mut checks, &seen, &rows);
    let ledger = check_ledger(&mut checks, &soak, &seen).await?;
    let in_flight_series: Vec<usize> = in_flight.lock().map(|c| c.clone()).unwrap_or_default();
    let memory = check_memory(&mut checks, &rss, &in_flight_series);

    // Graceful shutdown: SIGTERM while a burst is in flight.
    let shutdown = shutdown_phase(&mut checks, &soak, &mut baton, options.rate).await?;
    let answered_ids: HashSet<String> = seen
        .iter()
        .chain(shutdown.seen.iter())
        .filter(|(_, s)| s.answered || s.status.is_some())
        .filter_map(|(_, s)| s.request_id.clone())
        .collect();
    let (restarted, restarted_addr) = procs::start_baton(&baton_spec(
        &bins,
        &dir.0,
        &mock_addr,
        &database_url,
        &out.join("baton-restarted.log"),
    ))?;
    let rows_after = driver::log_rows(&soak.client, &restarted_addr, KEY).await?;
    let ids_after: HashSet<&str> = rows_after.iter().filter_map(|r| r["id"].as_str()).collect();
    let missing: Vec<&String> = answered_ids
        .iter()
        .filter(|id| !ids_after.contains(id.as_str()))
        .collect();
    let pending_after = rows_after
        .iter()
        .filter(|r| r["status"] == "Pending")
        .count();
    checks.add(
        "log flushed at shutdown",
        missing.is_empty() && pending_after == 0,
        format!(
            "after restart {} rows; {} of {} answered requests without a row{}; {pending_after} Pending",
            rows_after.len(),
            missing.len(),
            answered_ids.len(),
            if missing.is_empty() {
                String::new()
            } else {
                format!(" (e.g. {:?})", missing.iter().take(3).collect::<Vec<_>>())
            }
        ),
    );
    drop(restarted);

    let report = json!({
        "options": {"durationSeconds": options.duration.as_secs(), "rate": options.rate,
                    "smoke": options.smoke, "failPercentOfChat": FAIL_PERCENT},
        "elapsedSeconds": started.elapsed().as_secs(),
        "load": {"seconds": load_secs, "sent": seen.len(),
                 "achievedRate": seen.len() as f64 / load_secs.max(0.001),
                 "perKind": per_kind, "failuresInjected": injected, "chatErrors": chat_failed,
                 "disconnects": seen.iter().filter(|(k, _)| *k == Kind::Disconnect).count()},
        "rows": rows_json,
        "ledger": ledger,
        "memory": memory,
        "logCaughtUpMs": rows_lag_ms,
        "inFlightPerSecond": in_flight_series,
        "rssWhileLogCaughtUpKb": rss_after.iter().map(|(_, kb)| kb).collect::<Vec<_>>(),
        "shutdown": shutdown.json,
        "restart": {"rows": rows_after.len(), "answeredRequests": answered_ids.len(),
                    "missing": missing.len(), "pending": pending_after},
        "checks": checks.0,
    });
    let path = out.join("soak.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("soak: figures in {}", path.display());
    let failed = checks.failed();
    ensure!(
        failed.is_empty(),
        "soak checks failed: {} (figures in {}, Baton's log in {})",
        failed.join(", "),
        path.display(),
        log_path.display()
    );
    Ok(())
}

/// The failures the mock injects into the first `calls` calls of its failing route.
fn injected_failures(calls: u64) -> u64 {
    // The rule of `baton_testkit::fast::failures_among`, which the xtask does not link.
    calls.saturating_mul(FAIL_PERCENT) / 100
}

/// The environment, the tools (External on the mock's tool host, MCP imported from the mock's
/// server, Agent), and three flows using them, all active in `production`.
async fn setup(client: &reqwest::Client, base: &str, mock_addr: &str) -> anyhow::Result<Flows> {
    let call = |method: reqwest::Method, path: String, body: Value| {
        driver::api_call(client, base, KEY, "setting up", method, path, body)
    };
    use reqwest::Method;
    driver::ensure_environment(client, base, KEY, ENVIRONMENT).await?;
    let external = call(
        Method::POST,
        "/tools".into(),
        json!({"name": "echo_external", "toolType": "External", "description": "Echoes",
               "webUrl": format!("http://{mock_addr}/tool/echo"),
               "parameters": {"properties": [{"name": "text", "type": "String", "required": true}]}}),
    )
    .await?;
    let server = call(
        Method::POST,
        "/mcp-servers".into(),
        json!({"name": "soak-mcp", "url": format!("http://{mock_addr}/mcp")}),
    )
    .await?;
    let sid = server["id"].as_str().context("MCP server id")?;
    let imported = call(
        Method::POST,
        format!("/mcp-servers/{sid}/import"),
        json!({"toolNames": ["echo"]}),
    )
    .await?;
    let mcp_tool = imported[0]["id"].clone();
    let flow = |title: &'static str, template: Value| {
        driver::pinned_flow(client, base, KEY, title, template, ENVIRONMENT)
    };
    let external_flow = flow(
        "Soak external",
        json!({"template": "Use the tool.", "userTemplate": "[[question]]",
               "toolIds": [external["id"]], "llm": FLOW_MODEL}),
    )
    .await?;
    let mcp_flow = flow(
        "Soak MCP",
        json!({"template": "Use the tool.", "userTemplate": "[[question]]",
               "toolIds": [mcp_tool], "llm": FLOW_MODEL}),
    )
    .await?;
    // The sub-agent: its own External tool call, so the tree's child runs a tool loop too.
    let child = flow(
        "Soak child",
        json!({"template": "Research with the tool.", "userTemplate": "[[input]]",
               "toolIds": [external["id"]], "llm": FLOW_MODEL}),
    )
    .await?;
    let agent_tool = driver::agent_tool(client, base, KEY, "researcher", &child).await?;
    let agent_flow = flow(
        "Soak agent",
        json!({"template": "Delegate.", "userTemplate": "[[question]]",
               "toolIds": [agent_tool], "llm": FLOW_MODEL}),
    )
    .await?;
    Ok(Flows {
        external: external_flow,
        mcp: mcp_flow,
        agent: agent_flow,
    })
}

async fn chat_price(client: &reqwest::Client, base: &str) -> anyhow::Result<ChatPrice> {
    let descriptors: Value = client
        .get(format!("{base}/models/descriptors"))
        .bearer_auth(KEY)
        .send()
        .await?
        .json()
        .await?;
    let mini = descriptors
        .as_array()
        .and_then(|all| all.iter().find(|d| d["id"] == CHAT_MODEL))
        .with_context(|| format!("{CHAT_MODEL} is not among the model descriptors"))?;
    Ok(ChatPrice {
        input_per_million: mini["inputCreditsPerMillion"].as_i64().unwrap_or(0),
        output_per_million: mini["outputCreditsPerMillion"].as_i64().unwrap_or(0),
    })
}

/// Sends `kind_of(i)` at `rate` per second for `duration` (open loop: a slow answer does not
/// delay the next request), then waits for every answer.
async fn open_loop(
    soak: &Arc<Soak>,
    rate: u32,
    duration: Duration,
    kind_of: impl Fn(usize) -> Kind,
) -> Vec<(Kind, Seen)> {
    let total = (f64::from(rate) * duration.as_secs_f64()).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        tokio::time::sleep_until(start + interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
        let kind = kind_of(i);
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move { (kind, send(&soak, kind).await) }));
    }
    let mut seen = Vec::with_capacity(total);
    for task in tasks {
        match task.await {
            Ok(result) => seen.push(result),
            Err(err) => seen.push((
                Kind::ChatSync,
                Seen {
                    problem: Some(format!("client task failed: {err}")),
                    ..Seen::default()
                },
            )),
        }
    }
    seen
}

async fn send(soak: &Soak, kind: Kind) -> Seen {
    let _counted = InFlight::enter(&soak.in_flight);
    match tokio::time::timeout(DEADLINE, send_once(soak, kind)).await {
        Ok(Ok(seen)) => seen,
        Ok(Err((mut seen, problem))) => {
            seen.problem = Some(problem);
            seen
        }
        Err(_) => Seen {
            problem: Some(format!("no answer within {} s", DEADLINE.as_secs())),
            ..Seen::default()
        },
    }
}

fn chat_body(model: &str, stream: bool) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "Say hi"}]});
    if stream {
        body["stream"] = json!(true);
        // The events format: its requestCompleted carries the credits the request cost.
        body["stream_options"] = json!({"format": "events"});
    }
    body
}

async fn send_once(soak: &Soak, kind: Kind) -> Result<Seen, (Seen, String)> {
    let (path, body) = match kind {
        Kind::ChatSync => (
            "/chat/completions".to_string(),
            chat_body(CHAT_MODEL, false),
        ),
        Kind::ChatStream => ("/chat/completions".to_string(), chat_body(CHAT_MODEL, true)),
        Kind::Disconnect => ("/chat/completions".to_string(), chat_body(LONG_MODEL, true)),
        Kind::FlowExternal | Kind::FlowMcp | Kind::AgentTree => {
            let flow = match kind {
                Kind::FlowExternal => &soak.flows.external,
                Kind::FlowMcp => &soak.flows.mcp,
                _ => &soak.flows.agent,
            };
            (
                format!("/flows/{flow}/runs"),
                json!({"environment": ENVIRONMENT, "parameters": {"question": "Hi?"}}),
            )
        }
    };
    let mut seen = Seen::default();
    let response = soak
        .client
        .post(format!("{}{path}", soak.base))
        .bearer_auth(KEY)
        .header("X-Baton-Tags", kind.tag())
        .json(&body)
        .send()
        .await;
    let mut response = match response {
        Ok(response) => response,
        Err(err) => return Err((seen, format!("send: {err}"))),
    };
    seen.status = Some(response.status().as_u16());
    seen.request_id = response
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let streamed = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/event-stream"));
    if kind == Kind::Disconnect && streamed {
        // Leave after the first chunk: dropping the response closes the connection.
        return match response.chunk().await {
            Ok(Some(_)) => {
                seen.answered = true;
                Ok(seen)
            }
            Ok(None) => Err((seen, "stream ended before its first chunk".into())),
            Err(err) => Err((seen, format!("first chunk: {err}"))),
        };
    }
    if streamed {
        let mut text = String::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(None) => break,
                Err(err) => return Err((seen, format!("stream read: {err}"))),
            }
        }
        let mut done = false;
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(event) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if event["type"] == "requestFailed" {
                seen.stream_failed = true;
            }
            if event["type"] == "requestCompleted" {
                let data = &event["data"];
                seen.credits = data["totalCreditsUsed"].as_i64().unwrap_or(0);
                seen.tokens_in = data["totalTokensIn"].as_u64().unwrap_or(0);
                seen.tokens_out = data["totalTokensOut"].as_u64().unwrap_or(0);
            }
        }
        if !done {
            return Err((seen, "stream ended without [DONE]".into()));
        }
        seen.answered = true;
        return Ok(seen);
    }
    let body: Value = match response.json().await {
        Ok(body) => body,
        Err(err) => return Err((seen, format!("body: {err}"))),
    };
    if seen.failed() {
        // An answer, if it is the documented error shape.
        if body["error"]["code"].is_string() {
            seen.answered = true;
            return Ok(seen);
        }
        return Err((seen, format!("error without the error shape: {body}")));
    }
    match kind {
        Kind::ChatSync => {
            seen.tokens_in = body["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            seen.tokens_out = body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
            seen.credits = soak.price.credits(seen.tokens_in, seen.tokens_out);
        }
        _ => {
            seen.tokens_in = body["usage"]["tokensIn"].as_u64().unwrap_or(0);
            seen.tokens_out = body["usage"]["tokensOut"].as_u64().unwrap_or(0);
            seen.credits = body["usage"]["totalCreditsUsed"].as_i64().unwrap_or(0);
        }
    }
    seen.answered = true;
    Ok(seen)
}

/// Rows a request leaves in the log: its own, and the sub-agent's for a tree that got that far.
fn expected_rows(kind: Kind, seen: &Seen) -> u64 {
    match kind {
        Kind::AgentTree if !seen.failed() => 2,
        _ => 1,
    }
}

fn tally(seen: &[(Kind, Seen)]) -> Value {
    let mut per_kind = serde_json::Map::new();
    for kind in Kind::ALL {
        let of: Vec<&Seen> = seen
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, s)| s)
            .collect();
        per_kind.insert(
            kind.name().to_string(),
            json!({
                "sent": of.len(),
                "answered": of.iter().filter(|s| s.answered).count(),
                "errors": of.iter().filter(|s| s.failed()).count(),
                "problems": of.iter().filter(|s| s.problem.is_some()).count(),
                "clientCredits": of.iter().map(|s| s.credits).sum::<i64>(),
                "clientTokensIn": of.iter().map(|s| s.tokens_in).sum::<u64>(),
                "clientTokensOut": of.iter().map(|s| s.tokens_out).sum::<u64>(),
            }),
        );
    }
    Value::Object(per_kind)
}

fn check_answers(checks: &mut Checks, seen: &[(Kind, Seen)]) {
    let problems: Vec<String> = seen
        .iter()
        .filter_map(|(k, s)| s.problem.as_ref().map(|p| format!("{}: {p}", k.name())))
        .collect();
    let unanswered = seen.iter().filter(|(_, s)| !s.answered).count();
    let without_id = seen.iter().filter(|(_, s)| s.request_id.is_none()).count();
    checks.add(
        "every request answered once",
        problems.is_empty() && unanswered == 0 && without_id == 0,
        format!(
            "{} sent, {unanswered} unanswered, {without_id} without X-Request-Id{}",
            seen.len(),
            if problems.is_empty() {
                String::new()
            } else {
                format!("; e.g. {:?}", problems.iter().take(5).collect::<Vec<_>>())
            }
        ),
    );
}

fn check_rows(checks: &mut Checks, seen: &[(Kind, Seen)], rows: &[Value]) -> Value {
    let mut report = serde_json::Map::new();
    let mut all_ok = true;
    let mut details = Vec::new();
    for kind in Kind::ALL {
        let tag = kind.tag();
        let tagged: Vec<&Value> = rows
            .iter()
            .filter(|r| {
                r["tags"]
                    .as_array()
                    .is_some_and(|tags| tags.iter().any(|t| t == tag.as_str()))
            })
            .collect();
        let roots = tagged
            .iter()
            .filter(|r| r["parentRequestId"].is_null())
            .count() as u64;
        let children = tagged.len() as u64 - roots;
        let sent = seen.iter().filter(|(k, _)| *k == kind).count() as u64;
        let expected_children: u64 = seen
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(k, s)| expected_rows(*k, s) - 1)
            .sum();
        let ok = roots == sent && children == expected_children;
        all_ok &= ok;
        details.push(format!(
            "{} {roots}/{sent}{}",
            kind.name(),
            if expected_children > 0 || children > 0 {
                format!(" + {children}/{expected_children} children")
            } else {
                String::new()
            }
        ));
        report.insert(
            kind.name().to_string(),
            json!({"requests": sent, "rootRows": roots, "childRows": children,
                   "expectedChildRows": expected_children}),
        );
    }
    let ids: HashSet<&str> = rows.iter().filter_map(|r| r["id"].as_str()).collect();
    let missing = seen
        .iter()
        .filter_map(|(_, s)| s.request_id.as_deref())
        .filter(|id| !ids.contains(id))
        .count();
    let pending = rows.iter().filter(|r| r["status"] == "Pending").count();
    let by_status = rows
        .iter()
        .fold(BTreeMap::<String, u64>::new(), |mut m, r| {
            *m.entry(r["status"].as_str().unwrap_or("?").to_string())
                .or_default() += 1;
            m
        });
    checks.add(
        "log rows = requests",
        all_ok && missing == 0 && pending == 0,
        format!(
            "{} rows ({}); {missing} request ids without a row; {pending} Pending",
            rows.len(),
            details.join(", ")
        ),
    );
    json!({"total": rows.len(), "byStatus": by_status, "perKind": report,
           "requestIdsWithoutRow": missing})
}

async fn check_ledger(
    checks: &mut Checks,
    soak: &Soak,
    seen: &[(Kind, Seen)],
) -> anyhow::Result<Value> {
    let asked = Instant::now();
    let response = soak
        .client
        .get(format!("{}/statistics/tag-costs/by-key", soak.base))
        .bearer_auth(KEY)
        .query(&[("prefix", "Soak:"), ("limit", "50")])
        .timeout(Duration::from_secs(600))
        .send()
        .await?;
    let status = response.status();
    let report: Value = response.json().await?;
    let report_ms = asked.elapsed().as_millis() as u64;
    eprintln!("soak: tag report in {report_ms} ms");
    ensure!(
        status.is_success(),
        "GET /statistics/tag-costs/by-key: {status} {report}"
    );
    let rows: HashMap<String, &Value> = report["rows"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter_map(|r| Some((r["tag"].as_str()?.to_string(), r)))
                .collect()
        })
        .unwrap_or_default();
    let mut out = serde_json::Map::new();
    let mut all_ok = true;
    let mut details = Vec::new();
    let mut total_ledger = 0;
    let mut total_client = 0;
    for kind in Kind::ALL {
        let row = rows.get(&kind.tag());
        let ledger = row.and_then(|r| r["costCredits"].as_i64()).unwrap_or(0);
        let client: i64 = seen
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, s)| s.credits)
            .sum();
        total_ledger += ledger;
        // A client that left mid-stream saw no total: what was streamed is charged, at most a
        // whole answer each, at least nothing.
        let ok = if kind == Kind::Disconnect {
            ledger >= 0
        } else {
            total_client += client;
            ledger == client
        };
        all_ok &= ok;
        details.push(format!("{} {ledger}/{client}", kind.name()));
        out.insert(
            kind.name().to_string(),
            json!({"ledgerCredits": ledger, "clientCredits": client,
                   "ledgerCalls": row.and_then(|r| r["calls"].as_i64()),
                   "ledgerTokensIn": row.and_then(|r| r["tokensIn"].as_i64()),
                   "ledgerTokensOut": row.and_then(|r| r["tokensOut"].as_i64())}),
        );
    }
    checks.add(
        "ledger credits = credits the clients saw",
        all_ok,
        format!(
            "ledger/client per tag: {} (disconnects: ledger only)",
            details.join(", ")
        ),
    );
    Ok(
        json!({"perKind": out, "totalLedgerCredits": total_ledger, "reportMs": report_ms,
              "totalClientCreditsExceptDisconnects": total_client}),
    )
}

/// RSS of Baton's process, and the requests in flight, every second while the load runs.
fn sample_rss(
    pid: u32,
    samples: Arc<Mutex<Vec<(f64, u64)>>>,
    soak: Arc<Soak>,
    in_flight: Arc<Mutex<Vec<usize>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let kb = procs::rss_kb(pid);
            if let Ok(mut samples) = samples.lock() {
                samples.push((start.elapsed().as_secs_f64(), kb));
            }
            if let Ok(mut counts) = in_flight.lock() {
                counts.push(soak.in_flight.load(Ordering::Relaxed));
            }
        }
    })
}

/// The rule: the first quarter is warm-up; the mean RSS of the last quarter may exceed the mean
/// of the second (the first after warm-up) by 10 % or 20 MB, whichever is more. The requests in
/// flight are reported beside it: a backlog (the machine falling behind the rate) raises RSS
/// without a leak.
fn check_memory(checks: &mut Checks, samples: &[(f64, u64)], in_flight: &[usize]) -> Value {
    let n = samples.len();
    let mean = |part: &[(f64, u64)]| {
        if part.is_empty() {
            0
        } else {
            part.iter().map(|(_, kb)| kb).sum::<u64>() / part.len() as u64
        }
    };
    let quarter = n / 4;
    let after_warmup = mean(&samples[quarter.min(n)..(2 * quarter).min(n)]);
    let last = mean(&samples[n.saturating_sub(quarter.max(1))..]);
    let allowed = after_warmup + (after_warmup / 10).max(20 * 1024);
    let ok = n >= 4 && last <= allowed;
    let most = |part: Option<&[usize]>| part.and_then(|p| p.iter().max().copied()).unwrap_or(0);
    let m = in_flight.len();
    let in_flight_second = most(in_flight.get(m / 4..m / 2));
    let in_flight_last = most(in_flight.get(m.saturating_sub((m / 4).max(1))..));
    checks.add(
        "memory flat after warm-up",
        ok,
        format!(
            "{n} samples; RSS start {} MB, end {} MB; second-quarter mean {} MB, last-quarter mean {} MB (allowed {} MB); most requests in flight {in_flight_second} then {in_flight_last}",
            samples.first().map_or(0, |s| s.1) / 1024,
            samples.last().map_or(0, |s| s.1) / 1024,
            after_warmup / 1024,
            last / 1024,
            allowed / 1024
        ),
    );
    json!({"samples": n, "startKb": samples.first().map(|s| s.1), "endKb": samples.last().map(|s| s.1),
           "peakKb": samples.iter().map(|s| s.1).max(),
           "secondQuarterMeanKb": after_warmup, "lastQuarterMeanKb": last, "allowedKb": allowed,
           "mostInFlightSecondQuarter": in_flight_second, "mostInFlightLastQuarter": in_flight_last,
           "series": samples.iter().map(|(t, kb)| json!([(t * 10.0).round() / 10.0, kb])).collect::<Vec<_>>()})
}

struct Shutdown {
    seen: Vec<(Kind, Seen)>,
    json: Value,
}

/// A burst of the mix (the disconnects replaced by whole long streams, a second each) sent in
/// one go, SIGTERM once they are all in flight, then every answer and the exit status.
async fn shutdown_phase(
    checks: &mut Checks,
    soak: &Arc<Soak>,
    baton: &mut Guarded,
    rate: u32,
) -> anyhow::Result<Shutdown> {
    let burst = usize::try_from(rate.clamp(10, 60)).unwrap_or(20);
    let mut tasks = Vec::new();
    for i in 0..burst {
        let kind = SCHEDULE[i % SCHEDULE.len()];
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move {
            let seen = if kind == Kind::Disconnect {
                long_stream(&soak).await
            } else {
                send(&soak, kind).await
            };
            (kind, seen)
        }));
    }
    // Long enough for every request to be accepted, short of the one-second streams' end.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &baton.pid().to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM {} failed", baton.pid());
    let mut seen = Vec::new();
    for task in tasks {
        if let Ok(result) = task.await {
            seen.push(result);
        }
    }
    let exit = loop {
        if let Some(status) = baton.0.try_wait()? {
            break Some(status);
        }
        if signalled.elapsed() > Duration::from_secs(60) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let exited_in = signalled.elapsed();
    let problems: Vec<String> = seen
        .iter()
        .filter_map(|(k, s)| s.problem.as_ref().map(|p| format!("{}: {p}", k.name())))
        .collect();
    let answered = seen.iter().filter(|(_, s)| s.answered).count();
    let exit_code = exit.and_then(|s| s.code());
    checks.add(
        "graceful shutdown drains in-flight requests",
        problems.is_empty() && answered == burst && exit_code == Some(0),
        format!(
            "{burst} in flight at SIGTERM, {answered} answered; exit {} after {} ms{}",
            exit.map_or("none within 60 s".to_string(), |s| s.to_string()),
            exited_in.as_millis(),
            if problems.is_empty() {
                String::new()
            } else {
                format!("; e.g. {:?}", problems.iter().take(5).collect::<Vec<_>>())
            }
        ),
    );
    let json = json!({"inFlight": burst, "answered": answered, "exitCode": exit_code,
                      "exitMs": exited_in.as_millis() as u64, "problems": problems.len()});
    Ok(Shutdown { seen, json })
}

/// A whole one-second stream, read to its end.
async fn long_stream(soak: &Soak) -> Seen {
    let request = async {
        let mut seen = Seen::default();
        let response = soak
            .client
            .post(format!("{}/chat/completions", soak.base))
            .bearer_auth(KEY)
            .header("X-Baton-Tags", "Soak:shutdown-stream")
            .json(&chat_body(LONG_MODEL, true))
            .send()
            .await
            .map_err(|e| format!("send: {e}"))?;
        seen.status = Some(response.status().as_u16());
        seen.request_id = response
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = response
            .text()
            .await
            .map_err(|e| format!("stream read: {e}"))?;
        if !text.contains("data: [DONE]") {
            return Err("stream ended without [DONE]".to_string());
        }
        seen.answered = true;
        Ok(seen)
    };
    match tokio::time::timeout(DEADLINE, request).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(problem)) => Seen {
            problem: Some(problem),
            ..Seen::default()
        },
        Err(_) => Seen {
            problem: Some(format!("no answer within {} s", DEADLINE.as_secs())),
            ..Seen::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_has_the_stated_mix() {
        let count = |kind| SCHEDULE.iter().filter(|k| **k == kind).count();
        assert_eq!(
            Kind::ALL.map(count),
            [7, 3, 3, 2, 3, 2],
            "chat sync, chat stream, external, mcp, agent, disconnect"
        );
        // Chat is half the mix, so FAIL_PERCENT of it is a tenth of all requests.
        assert_eq!(
            SCHEDULE.iter().filter(|k| k.is_chat()).count() as u64 * FAIL_PERCENT / 20,
            10
        );
    }

    #[test]
    fn chat_credits_round_half_up_once() {
        let price = ChatPrice {
            input_per_million: 150_000,
            output_per_million: 600_000,
        };
        // 12 * 0.15 + 6 * 0.6 = 5.4 credits.
        assert_eq!(price.credits(12, 6), 5);
        assert_eq!(price.credits(10, 5), 5); // 4.5 rounds up
    }

    #[test]
    fn memory_rule_allows_noise_and_catches_growth() {
        let flat: Vec<(f64, u64)> = (0..20)
            .map(|i| (f64::from(i), 100_000 + i as u64))
            .collect();
        let mut checks = Checks(Vec::new());
        check_memory(&mut checks, &flat, &[]);
        assert!(checks.failed().is_empty());
        let growing: Vec<(f64, u64)> = (0..20)
            .map(|i| (f64::from(i), 100_000 + 10_000 * i as u64))
            .collect();
        check_memory(&mut checks, &growing, &[1; 20]);
        assert_eq!(checks.failed().len(), 1);
    }
}
