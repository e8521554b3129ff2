//! Fault injection (issue 10 item 3): providers failing every way the testkit can fail them,
//! the database going away and coming back. Each request must end with the documented error
//! within its deadline (a generous outer timeout is the hang detector, not a speed check), the
//! server must not panic, and every call must leave its invocation-log row.

use std::time::Duration;

use baton_domain::run::{RunRecord, RunStatus};
use baton_providers::ProviderConfig;
use baton_testkit::{MockMcpServer, MockProvider, PausableProxy, Reply, ResetServer};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Response, TestApp, spawn_app_with};
use crate::tools::{Setup, calls, setup_with, tool_messages};

/// The request deadline the server is given: short, so a hang is noticed.
const REQUEST_TIMEOUT_SECS: u64 = 2;
/// Far beyond the deadline: a request still open by then is hung.
const HANG_DETECTOR: Duration = Duration::from_secs(30);

const MODEL: &str = "openai/gpt-4o-mini";
/// Served by a server that resets every connection.
const RESET_MODEL: &str = "mistral/mistral-small-latest";

struct Faulty {
    app: TestApp,
    mock: MockProvider,
    key: String,
}

async fn faulty_app() -> Faulty {
    let mock = MockProvider::start().await.unwrap();
    let reset = ResetServer::start().await.unwrap();
    let (openai_base, reset_base) = (mock.openai_base(), reset.openai_base());
    let app = spawn_app_with(move |config| {
        config.providers.insert(
            "openai".into(),
            ProviderConfig {
                base_url: Some(openai_base),
                api_key: Some("sk-faults".into()),
                ..Default::default()
            },
        );
        config.providers.insert(
            "mistral".into(),
            ProviderConfig {
                base_url: Some(reset_base),
                api_key: Some("sk-reset".into()),
                ..Default::default()
            },
        );
        for key in ["anthropic", "google", "bedrock", "azure", "deepseek"] {
            config
                .providers
                .insert(key.into(), ProviderConfig::default());
        }
        config.server.request_timeout_secs = REQUEST_TIMEOUT_SECS;
    })
    .await;
    let key = app.default_tenant.api_key.clone();
    Faulty { app, mock, key }
}

impl Faulty {
    /// Sends one chat completion; fails the test if it is still open after [`HANG_DETECTOR`].
    async fn chat(&self, what: &str, model: &str, stream: bool) -> Response {
        let body = json!({"model": model, "stream": stream,
                          "messages": [{"role": "user", "content": "hi"}]});
        tokio::time::timeout(
            HANG_DETECTOR,
            self.app.post("/api/v1/chat/completions", &self.key, body),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: the request hung past its deadline"))
    }

    /// The finished invocation-log row of a request (written off the request path).
    async fn logged(&self, what: &str, response: &Response) -> RunRecord {
        finished_row(&self.app, what, response).await
    }

    /// The server still answers: nothing panicked its way out of the listener.
    async fn still_serving(&self, what: &str) {
        self.mock.push(Reply::text("still here"));
        let ok = self.chat(what, MODEL, false).await;
        assert_eq!(ok.status, 200, "{what}: after the fault: {}", ok.text);
    }
}

/// The error chunk of an SSE body and whether it ends with `[DONE]`.
fn stream_error(body: &str) -> (Option<Value>, bool) {
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim))
        .collect();
    let error = data
        .iter()
        .filter(|d| **d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|chunk| chunk.get("error").is_some());
    (error, data.last() == Some(&"[DONE]"))
}

/// Waits until the run `response` answered is finished in the log (written off the request
/// path), up to ~60 s: the log writer backs off up to 10 s between attempts after a failure.
async fn finished_row(app: &TestApp, what: &str, response: &Response) -> RunRecord {
    let id = response.headers["x-request-id"].to_str().unwrap();
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    for _ in 0..600 {
        if let Ok(run) = app.store.get_run(&tenant, id).await
            && run.completed_at.is_some()
        {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: run {id} was never finished in the log");
}

#[tokio::test]
async fn faults_provider_failures_end_with_the_documented_error_and_are_logged() {
    let f = faulty_app().await;
    let hang = || Reply::Delayed(Duration::from_secs(120), Box::new(Reply::text("never")));

    // Sync: each fault is one request answered with the DESIGN.md error, and one Failed row.
    let sync_cases: Vec<(&str, &str, Option<Reply>, u16, &str)> = vec![
        (
            "500",
            MODEL,
            Some(Reply::status(500, "boom")),
            502,
            "PROVIDER_ERROR",
        ),
        (
            "503",
            MODEL,
            Some(Reply::status(503, "overloaded")),
            502,
            "PROVIDER_ERROR",
        ),
        (
            "429 without Retry-After",
            MODEL,
            Some(Reply::status(429, "slow down")),
            502,
            "PROVIDER_ERROR",
        ),
        (
            "429 with a Retry-After past the deadline",
            MODEL,
            Some(Reply::rate_limited(60)),
            502,
            "PROVIDER_ERROR",
        ),
        ("hang", MODEL, Some(hang()), 504, "PROVIDER_TIMEOUT"),
        ("connection reset", RESET_MODEL, None, 502, "PROVIDER_ERROR"),
        (
            "malformed JSON",
            MODEL,
            Some(Reply::Raw(
                r#"{"id": "chatcmpl-x", "choices": [{"mess"#.into(),
            )),
            502,
            "PROVIDER_ERROR",
        ),
        (
            "not JSON at all",
            MODEL,
            Some(Reply::Raw("<html>bad gateway</html>".into())),
            502,
            "PROVIDER_ERROR",
        ),
        (
            "body cut short",
            MODEL,
            Some(Reply::TruncatedStream(Box::new(Reply::text(
                "an answer whose JSON body ends half way",
            )))),
            502,
            "PROVIDER_ERROR",
        ),
        (
            "body broken",
            MODEL,
            Some(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
                "an answer whose connection breaks half way",
            )))),
            502,
            "PROVIDER_ERROR",
        ),
    ];
    for (what, model, fault, status, code) in sync_cases {
        if let Some(fault) = fault {
            f.mock.push(fault);
        }
        let response = f.chat(what, model, false).await;
        assert_eq!(
            response.status.as_u16(),
            status,
            "{what}: {}",
            response.text
        );
        response.error(status, code);
        let run = f.logged(what, &response).await;
        assert_eq!(run.status, RunStatus::Failed, "{what}");
        assert_eq!(run.error_code.as_deref(), Some(code), "{what}");
        f.still_serving(what).await;
    }

    // Streams: a failure before the first byte is an error response; after it, the client
    // keeps what came, then gets an error chunk and `[DONE]`. Either way one Failed row.
    let stream_cases: Vec<(&str, &str, Option<Reply>, &str)> = vec![
        (
            "500",
            MODEL,
            Some(Reply::status(500, "boom")),
            "PROVIDER_ERROR",
        ),
        ("hang", MODEL, Some(hang()), "PROVIDER_TIMEOUT"),
        ("connection reset", RESET_MODEL, None, "PROVIDER_ERROR"),
        (
            "garbage events",
            MODEL,
            Some(Reply::Raw("data: {not json\n\ndata: }}}\n\n".into())),
            "PROVIDER_ERROR",
        ),
        (
            "broken stream",
            MODEL,
            Some(Reply::BreakAfterFirstChunk(Box::new(Reply::text(
                "a streamed answer whose connection breaks",
            )))),
            "PROVIDER_ERROR",
        ),
    ];
    for (what, model, fault, code) in stream_cases {
        if let Some(fault) = fault {
            f.mock.push(fault);
        }
        let response = f.chat(what, model, true).await;
        if response.status == 200 {
            let (error, done) = stream_error(&response.text);
            let error =
                error.unwrap_or_else(|| panic!("{what}: no error chunk: {}", response.text));
            assert_eq!(error["error"]["code"], code, "{what}: {}", response.text);
            assert!(done, "{what}: no [DONE]: {}", response.text);
        } else {
            let status = if code == "PROVIDER_TIMEOUT" { 504 } else { 502 };
            response.error(status, code);
        }
        let run = f.logged(what, &response).await;
        // Content already relayed keeps the row `Succeeded` (with what arrived); the failure
        // is in its error code either way.
        if response.status != 200 {
            assert_eq!(run.status, RunStatus::Failed, "{what}");
        }
        assert_eq!(run.error_code.as_deref(), Some(code), "{what}");
        f.still_serving(what).await;
    }

    let health = f.app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, 200);
}

/// `/readyz`, bounded by the hang detector.
async fn readiness(app: &TestApp) -> u16 {
    let ready = tokio::time::timeout(
        HANG_DETECTOR,
        app.request(Method::GET, "/readyz", None, None),
    )
    .await
    .expect("/readyz hung");
    ready.status.as_u16()
}

/// Polls `/readyz` until it answers `want` (up to ~30 s: the pool must notice by itself).
async fn readiness_becomes(app: &TestApp, want: u16) {
    let mut last = 0;
    for _ in 0..60 {
        last = readiness(app).await;
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("/readyz stayed {last}, never {want}");
}

/// PostgreSQL only (`None` otherwise): an app whose database is reached through a
/// [`PausableProxy`], so the test can cut it without stopping a database other tests share.
/// SQLite has no connection to cut (see the lock test below).
async fn behind_proxy(
    extra: impl FnOnce(&mut baton_server::config::Config) + Send + 'static,
) -> Option<(Setup, PausableProxy)> {
    let admin_url = std::env::var("BATON_TEST_DATABASE_URL").ok()?;
    if !admin_url.starts_with("postgres") {
        return None;
    }
    let postgres: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
    let proxy = PausableProxy::start(postgres).await.unwrap();
    let through = proxy.address().to_string();
    let s = setup_with(move |config| {
        config.database_url = config
            .database_url
            .replace("127.0.0.1:5432", &through)
            .replace("localhost:5432", &through);
        config.database.acquire_timeout_secs = 2;
        extra(config);
    })
    .await;
    assert!(
        proxy.connections() > 0,
        "the server reaches the database through the proxy"
    );
    Some((s, proxy))
}

#[tokio::test]
async fn faults_readiness_reports_the_database_down_and_recovers_by_itself() {
    // SQLite has no connection to cut, and `SELECT 1` needs no lock, so a held `BEGIN
    // EXCLUSIVE` does not make the ping fail: the outage is simulated on PostgreSQL only.
    let Some((Setup { app, .. }, proxy)) = behind_proxy(|_| {}).await else {
        return;
    };
    assert_eq!(readiness(&app).await, 200);

    proxy.pause();
    readiness_becomes(&app, 503).await;
    let down = app.request(Method::GET, "/readyz", None, None).await;
    if down.status == 503 {
        down.error(503, "SERVICE_UNAVAILABLE");
    }
    // Other requests end too (whatever they can do without the database), none hangs.
    let key = app.default_tenant.api_key.clone();
    let listed = tokio::time::timeout(HANG_DETECTOR, app.get("/api/v1/llm-logs", &key))
        .await
        .expect("a request hung while the database was down");
    assert!(
        listed.status == 200 || listed.status.is_server_error(),
        "{}: {}",
        listed.status,
        listed.text
    );
    let health = app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(
        health.status, 200,
        "liveness does not depend on the database"
    );

    proxy.resume();
    readiness_becomes(&app, 200).await;
    let listed = app.get("/api/v1/llm-logs", &key).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
}

/// Runs `flow` with the hang detector around it; returns the response and its finished row.
async fn run_bounded(s: &Setup, what: &str, flow: &str) -> (Response, RunRecord) {
    let response = tokio::time::timeout(
        HANG_DETECTOR,
        s.app
            .post(&format!("/api/v1/flows/{flow}/runs"), &s.key, json!({})),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: the run hung past its deadline"));
    let run = finished_row(&s.app, what, &response).await;
    assert_ne!(run.status, RunStatus::Pending, "{what}");
    (response, run)
}

#[tokio::test]
async fn faults_a_hanging_tool_host_or_mcp_server_does_not_outlive_the_run_deadline() {
    let mcp = MockMcpServer::start().await;
    let mcp_addr = mcp.address();
    let s = setup_with(move |config| {
        config.outbound_allowed.push(mcp_addr);
        config.server.request_timeout_secs = REQUEST_TIMEOUT_SECS;
        // Longer than the request deadline: only the deadline can end the hung call in time.
        config.tools.call_timeout_ms = 120_000;
    })
    .await;

    let hung_tool = s
        .tool(json!({"name": "stuck", "toolType": "External",
                     "webUrl": format!("{}/sleep?ms=600000", s.host.origin())}))
        .await;
    let (_, imported) = s
        .import_mcp(json!({"name": "slowpoke", "url": mcp.url()}), &["slow"])
        .await;
    let (hung_mcp, slow_name) = imported[0].clone();

    for (what, tool, name, arguments) in [
        ("tool host", hung_tool, "stuck".to_string(), json!({})),
        ("MCP server", hung_mcp, slow_name, json!({"ms": 600_000})),
    ] {
        let flow = s
            .flow(
                &format!("Hang {what}"),
                json!({"template": "t", "toolIds": [tool], "llm": MODEL}),
            )
            .await;
        // A run ended by its deadline leaves the second reply unused.
        s.mock.clear();
        s.mock.push(calls(&[("c1", &name, arguments)]));
        s.mock.push(Reply::text("the tool never answered"));
        let (response, run) = run_bounded(&s, what, &flow).await;
        if response.status.is_success() {
            // The hung call was given up as failed, and the run went on without it.
            let body = response.json();
            assert_eq!(body["toolCalls"][0]["status"], "failed", "{what}: {body}");
        } else {
            response.error(504, "PROVIDER_TIMEOUT");
            assert_eq!(run.status, RunStatus::Failed, "{what}");
        }
    }
    let health = s.app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, 200);
}

#[tokio::test]
async fn faults_a_truncated_stream_ends_with_an_error_chunk() {
    let f = faulty_app().await;
    f.mock.push(Reply::TruncatedStream(Box::new(Reply::text(
        "a streamed answer that stops without its final event",
    ))));
    let response = f.chat("truncated stream", MODEL, true).await;
    assert_eq!(response.status, 200, "{}", response.text);
    let (error, done) = stream_error(&response.text);
    let error = error.unwrap_or_else(|| panic!("no error chunk: {}", response.text));
    assert_eq!(
        error["error"]["code"], "PROVIDER_ERROR",
        "{}",
        response.text
    );
    assert!(done, "no [DONE]: {}", response.text);
    // As a broken connection after content: the row keeps what arrived, with the error code.
    let run = f.logged("truncated stream", &response).await;
    assert_eq!(run.error_code.as_deref(), Some("PROVIDER_ERROR"));
}

/// The default `limits.max_tool_result_bytes`.
const DEFAULT_RESULT_LIMIT: usize = 1024 * 1024;
const TEN_MB: usize = 10 * 1024 * 1024;

#[tokio::test]
async fn faults_tool_hosts_and_mcp_servers_sending_10_mb_fail_the_call_and_the_run_goes_on() {
    let sse = MockMcpServer::start().await;
    let plain = MockMcpServer::start_json().await;
    let (sse_addr, plain_addr) = (sse.address(), plain.address());
    // Default limits: the bound under test is the shipped one.
    let s = setup_with(move |config| {
        config.outbound_allowed.push(sse_addr);
        config.outbound_allowed.push(plain_addr);
    })
    .await;
    let origin = s.host.origin();
    let chunked = s
        .sized_tool("chunked", &format!("{origin}/big-chunked"))
        .await;
    let declared = s.sized_tool("declared", &format!("{origin}/big")).await;
    let (_, over_sse) = s
        .import_mcp(json!({"name": "sse", "url": sse.url()}), &["big"])
        .await;
    let (_, over_json) = s
        .import_mcp(json!({"name": "plain", "url": plain.url()}), &["echo"])
        .await;
    // Tool names are unique per tenant: the plain-JSON server's 10 MB is `echo` repeated.
    let bytes = json!({"bytes": TEN_MB});
    let cases = [
        ("External, chunked", &chunked, "chunked", bytes.clone()),
        (
            "External, with Content-Length",
            &declared,
            "declared",
            bytes.clone(),
        ),
        (
            "MCP over SSE",
            &over_sse[0].0,
            over_sse[0].1.as_str(),
            bytes,
        ),
        (
            "MCP as plain JSON",
            &over_json[0].0,
            over_json[0].1.as_str(),
            json!({"text": "x", "times": TEN_MB}),
        ),
    ];
    for (turn, (what, tool, name, arguments)) in cases.into_iter().enumerate() {
        let flow = s
            .flow(
                &format!("Ten megabytes {turn}"),
                json!({"template": "t", "llm": MODEL, "toolIds": [tool]}),
            )
            .await;
        s.mock.push(calls(&[("c1", name, arguments)]));
        s.mock.push(Reply::text("the tool said too much"));
        let (response, run) = run_bounded(&s, what, &flow).await;
        assert_eq!(response.status, 200, "{what}: {}", response.text);
        let body = response.json();
        assert_eq!(body["output"]["text"], "the tool said too much", "{what}");
        assert_eq!(body["toolCalls"][0]["status"], "failed", "{what}: {body}");
        assert_eq!(run.status, RunStatus::Succeeded, "{what}");
        // The model and the log are told why, naming the bound.
        let told = tool_messages(&s.mock, 2 * turn + 1);
        let text = told[0]["content"].as_str().unwrap();
        assert!(
            text.starts_with("Error:")
                && text.contains(&format!("limit of {DEFAULT_RESULT_LIMIT} bytes")),
            "{what}: {}",
            &text[..text.len().min(300)]
        );
        let error = run.tool_calls[0].error.as_deref().unwrap_or_default();
        assert!(error.contains("limit of"), "{what}: {error}");
    }
    // The chunked body was abandoned once past the bound, not read to its end (the margin is
    // what the socket buffers hold; a reader that drained it would have produced all 10 MB).
    assert!(
        s.host.streamed_bytes() < TEN_MB as u64,
        "the tool host produced {} bytes",
        s.host.streamed_bytes()
    );
    let health = s.app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, 200);
}

/// Runs `count` copies of a flow whose tool sleeps `nap_ms`, concurrently; returns once each
/// has made its first model call and is `Pending` in the log, with the requests still open.
/// Returns the flow and the requests.
async fn runs_in_their_tool_call(
    s: &Setup,
    count: usize,
    nap_ms: u64,
) -> (String, Vec<tokio::task::JoinHandle<Response>>) {
    let nap = s
        .tool(json!({"name": "nap", "toolType": "External",
                     "webUrl": format!("{}/sleep?ms={nap_ms}", s.host.origin())}))
        .await;
    let flow = s
        .flow(
            "Napper",
            json!({"template": "t", "toolIds": [nap], "llm": MODEL}),
        )
        .await;
    // Every run's first call comes before any run's second one (the nap is between).
    for _ in 0..count {
        s.mock.push(calls(&[("c1", "nap", json!({}))]));
    }
    for _ in 0..count {
        s.mock.push(Reply::text("rested"));
    }
    let runs: Vec<_> = (0..count)
        .map(|_| {
            let (client, url, key) = (
                s.app.client.clone(),
                s.app.url(&format!("/api/v1/flows/{flow}/runs")),
                s.key.clone(),
            );
            tokio::spawn(async move {
                let request = client.post(url).bearer_auth(key).json(&json!({}));
                tokio::time::timeout(HANG_DETECTOR, crate::helpers::send(request))
                    .await
                    .expect("a run hung past its deadline")
            })
        })
        .collect();
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    // Up to 60 s: a hang detector, not a speed check (10 s once ran out on PostgreSQL with a
    // fat-LTO build sharing the two CPUs, 30 s with a profile-guided one).
    for _ in 0..2_400 {
        let pending = s
            .app
            .store
            .list_runs(&tenant)
            .await
            .map(|runs| {
                runs.iter()
                    .filter(|r| r.status == RunStatus::Pending)
                    .count()
            })
            .unwrap_or(0);
        if pending == count && s.mock.received().len() == count {
            return (flow, runs);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the runs never were all pending in their tool call");
}

#[tokio::test]
async fn faults_a_database_outage_mid_run_leaves_no_run_pending() {
    let Some((s, proxy)) = behind_proxy(|config| {
        config.server.request_timeout_secs = 10;
    })
    .await
    else {
        return;
    };
    let (flow, runs) = runs_in_their_tool_call(&s, 3, 1_500).await;
    // Cut while every run is in its tool call: each then makes its last model call and
    // finishes with the database away.
    proxy.pause();
    let mut responses = Vec::new();
    for run in runs {
        responses.push(run.await.unwrap());
    }
    for response in &responses {
        assert_eq!(response.status, 200, "{}", response.text);
        assert_eq!(response.json()["output"]["text"], "rested");
    }
    // Still down a moment: the log writer's attempts fail. Seen directly (not through the
    // proxy), the runs are still `Pending`: the outage did hit their final rows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let direct = baton_store::Store::connect(&baton_store::StoreOptions::new(s.app.db.url()))
        .await
        .unwrap();
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    let before = direct.list_runs(&tenant).await.unwrap();
    assert_eq!(before.len(), 3);
    assert!(
        before.iter().all(|r| r.status == RunStatus::Pending),
        "the final rows were written through a cut connection: {:?}",
        before.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // A run started while the database is away ends too, within its deadline.
    s.mock.push(calls(&[("c1", "nap", json!({}))]));
    s.mock.push(Reply::text("rested"));
    let late = tokio::time::timeout(
        HANG_DETECTOR,
        s.app
            .post(&format!("/api/v1/flows/{flow}/runs"), &s.key, json!({})),
    )
    .await
    .expect("a run started during the outage hung");
    // What the run reads before its first call is not all cached: 503, not a hang.
    if late.status != 200 {
        late.error(503, "SERVICE_UNAVAILABLE");
    }
    proxy.resume();
    for response in &responses {
        let run = finished_row(&s.app, "after recovery", response).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{}", run.id);
        assert_eq!(run.tool_calls.len(), 1, "{}", run.id);
    }
    let all = direct.list_runs(&tenant).await.unwrap();
    assert!(
        all.iter().all(|r| r.status != RunStatus::Pending),
        "a run was left pending: {:?}",
        all.iter().map(|r| (&r.id, r.status)).collect::<Vec<_>>()
    );
}

/// Another process holding `BEGIN EXCLUSIVE` on a SQLite file (the `sqlite3` CLI) until
/// dropped or [`SqliteLock::release`]d.
struct SqliteLock(std::process::Child);

impl SqliteLock {
    /// `None` when the `sqlite3` CLI is not installed.
    fn hold(path: &str) -> Option<SqliteLock> {
        use std::io::{BufRead, Write};
        let mut child = std::process::Command::new("sqlite3")
            .arg(path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .ok()?;
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b".timeout 10000\nBEGIN EXCLUSIVE;\nSELECT 'locked';\n")
            .unwrap();
        stdin.flush().unwrap();
        // The lock is held once the statement after it answered.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        Some(SqliteLock(child))
    }

    fn release(mut self) {
        use std::io::Write;
        let stdin = self.0.stdin.as_mut().unwrap();
        stdin.write_all(b"COMMIT;\n.quit\n").unwrap();
        stdin.flush().unwrap();
        let _ = self.0.wait();
    }
}

impl Drop for SqliteLock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn faults_a_locked_sqlite_database_delays_the_log_but_loses_no_run() {
    if std::env::var("BATON_TEST_DATABASE_URL").is_ok_and(|url| url.starts_with("postgres")) {
        return;
    }
    let s = setup_with(|config| config.server.request_timeout_secs = 10).await;
    let url = s.app.db.url();
    let path = url.strip_prefix("sqlite://").unwrap().to_string();
    let (flow, runs) = runs_in_their_tool_call(&s, 3, 1_500).await;
    let Some(lock) = SqliteLock::hold(&path) else {
        eprintln!("skipped: the sqlite3 CLI is not installed");
        return;
    };
    // Held past the 5 s busy timeout: the log writer's first attempt fails and is retried.
    let mut responses = Vec::new();
    for run in runs {
        responses.push(run.await.unwrap());
    }
    for response in &responses {
        assert_eq!(response.status, 200, "{}", response.text);
    }
    // Readiness stays 200: WAL readers are not blocked by a writer's lock, and `SELECT 1`
    // takes none. New runs are answered too (their rows wait in the writer's queue).
    assert_eq!(readiness(&s.app).await, 200);
    s.mock.push(calls(&[("c1", "nap", json!({}))]));
    s.mock.push(Reply::text("rested"));
    let late = tokio::time::timeout(
        HANG_DETECTOR,
        s.app
            .post(&format!("/api/v1/flows/{flow}/runs"), &s.key, json!({})),
    )
    .await
    .expect("a run started while the database was locked hung");
    assert_eq!(late.status, 200, "{}", late.text);
    responses.push(late);
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    let pending = s.app.store.list_runs(&tenant).await.unwrap();
    eprintln!(
        "while locked: {:?}",
        pending.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    lock.release();
    for response in &responses {
        let run = finished_row(&s.app, "after recovery", response).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{}", run.id);
    }
    let health = s.app.request(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, 200);
}

/// Three runs finish while the database is cut, then the server is stopped (its log writer's
/// flush must give up rather than wait for the database), then the database comes back.
/// Returns the database and the tenant.
async fn stop_during_an_outage() -> Option<(crate::helpers::TestDatabase, baton_store::TenantId)> {
    let (s, proxy) = behind_proxy(|config| {
        config.server.request_timeout_secs = 10;
    })
    .await?;
    // A hard limit: each run holds credits until its final row is written.
    let budget = s
        .app
        .post(
            "/api/v1/budgets",
            &s.key,
            json!({"name": "Cap", "period": "month", "limitCredits": 1_000_000_000_i64,
                   "hardLimit": true}),
        )
        .await;
    assert_eq!(budget.status, 201, "{}", budget.text);
    let (_, runs) = runs_in_their_tool_call(&s, 3, 1_500).await;
    proxy.pause();
    for run in runs {
        let response = run.await.unwrap();
        assert_eq!(response.status, 200, "{}", response.text);
    }
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    let db = tokio::time::timeout(HANG_DETECTOR, s.app.stop_keeping_database())
        .await
        .expect("the server did not stop while the database was away");
    proxy.resume();
    Some((db, tenant))
}

#[tokio::test]
async fn faults_a_server_stopped_during_a_database_outage_stops() {
    // Before: the writer retried the batch ahead of its close request without end, so
    // shutdown waited for the database to come back.
    let Some((db, tenant)) = stop_during_an_outage().await else {
        return;
    };
    let direct = baton_store::Store::connect(&baton_store::StoreOptions::new(db.url()))
        .await
        .unwrap();
    assert_eq!(direct.list_runs(&tenant).await.unwrap().len(), 3);
}

/// The runs whose final rows the stopped server gave up are finished by the next instance's
/// abandoned-run sweep (here with a cut-off of 2 s and a pass every second), as `Failed` with
/// `RUN_ABANDONED`, and their budget holds are given back.
#[tokio::test]
async fn faults_runs_of_a_process_stopped_during_an_outage_are_not_left_pending() {
    let Some((db, tenant)) = stop_during_an_outage().await else {
        return;
    };
    let direct = baton_store::Store::connect(&baton_store::StoreOptions::new(db.url()))
        .await
        .unwrap();
    let stranded = direct.list_runs(&tenant).await.unwrap();
    assert_eq!(stranded.len(), 3);
    assert!(
        stranded.iter().all(|r| r.status == RunStatus::Pending),
        "the final rows were given up"
    );
    let budget = direct.list_budgets(&tenant).await.unwrap().remove(0);
    let (start, end) = baton_ledger::budget_window(budget.period, chrono::Utc::now());
    let window = || {
        direct.budget_window(
            &tenant,
            &budget,
            baton_domain::Timestamp(start),
            baton_domain::Timestamp(end),
        )
    };
    assert!(
        window().await.unwrap().reserved_credits > 0,
        "holds left reserved"
    );

    // An instance starts on the database again, with a short cut-off.
    let mut config = baton_server::config::Config::for_database(&db.url()).unwrap();
    config.bind = "127.0.0.1:0".parse().unwrap();
    config.server.request_timeout_secs = 1;
    config.limits.max_stream_duration_secs = 1;
    config.retention.abandoned_margin_secs = 0;
    config.retention.abandoned_sweep_interval_secs = 1;
    let again = baton_server::Application::build(&config).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(again.run_until(async move {
        let _ = stopped.await;
    }));
    let mut runs = Vec::new();
    // A bound, not a speed check: the sweep runs every second.
    for _ in 0..300 {
        runs = direct.list_runs(&tenant).await.unwrap();
        if runs.iter().all(|r| r.status != RunStatus::Pending) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let _ = server.await;
    for run in &runs {
        assert_eq!(run.status, RunStatus::Failed, "{}", run.id);
        assert_eq!(
            run.error_code.as_deref(),
            Some("RUN_ABANDONED"),
            "{}",
            run.id
        );
        assert!(run.completed_at.is_some(), "{}", run.id);
    }
    assert_eq!(
        window().await.unwrap().reserved_credits,
        0,
        "holds given back"
    );
}

/// The runs of the default tenant, once `count` of them are finished.
async fn finished_runs(app: &TestApp, count: usize) -> Vec<RunRecord> {
    let tenant = baton_store::TenantId::new(app.default_tenant.id.clone());
    for _ in 0..300 {
        let runs = app.store.list_runs(&tenant).await.unwrap();
        let finished: Vec<RunRecord> = runs
            .into_iter()
            .filter(|r| r.completed_at.is_some())
            .collect();
        if finished.len() >= count {
            return finished;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fewer than {count} runs were ever finished in the log");
}

/// A client that gives up on a synchronous call (its connection closed mid-request) leaves no
/// run `Pending`: a plain chat call is written as failed with `CLIENT_DISCONNECTED`; a flow run
/// with tools goes on to its end on its own task and is logged as it ends.
#[tokio::test]
async fn faults_a_client_that_leaves_a_synchronous_call_leaves_no_run_pending() {
    let s = setup_with(|_| {}).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();

    // A chat call: the provider answers after the client has left.
    s.mock.push(Reply::Delayed(
        Duration::from_secs(3),
        Box::new(Reply::text("too late")),
    ));
    let gone = impatient
        .post(s.app.url("/api/v1/chat/completions"))
        .bearer_auth(&s.key)
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await;
    assert!(gone.is_err(), "the client was meant to give up first");
    let runs = finished_runs(&s.app, 1).await;
    assert_eq!(runs[0].status, RunStatus::Failed);
    assert_eq!(runs[0].error_code.as_deref(), Some("CLIENT_DISCONNECTED"));

    // A flow run whose tool takes longer than the client waits.
    let slow = s
        .tool(json!({"name": "slow", "toolType": "External",
                     "webUrl": format!("{}/sleep?ms=1500", s.host.origin())}))
        .await;
    let flow = s
        .flow(
            "Left alone",
            json!({"template": "t", "toolIds": [slow], "llm": MODEL}),
        )
        .await;
    s.mock.push(calls(&[("c1", "slow", json!({}))]));
    s.mock.push(Reply::text("finished without anyone waiting"));
    let gone = impatient
        .post(s.app.url(&format!("/api/v1/flows/{flow}/runs")))
        .bearer_auth(&s.key)
        .json(&json!({}))
        .send()
        .await;
    assert!(gone.is_err(), "the client was meant to give up first");
    let runs = finished_runs(&s.app, 2).await;
    let run = runs
        .iter()
        .find(|r| r.flow_name.is_some())
        .expect("the flow run's row");
    assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
    assert_eq!(run.tool_calls.len(), 1);
    let tenant = baton_store::TenantId::new(s.app.default_tenant.id.clone());
    let pending = s.app.store.list_runs(&tenant).await.unwrap();
    assert!(pending.iter().all(|r| r.status != RunStatus::Pending));
}
