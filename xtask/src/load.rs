//! `cargo xtask bench load`: Baton's overhead under load, measured end to end on loopback.
//!
//! The debug xtask builds `baton`, the fast mock (`baton-mock`) and this xtask in release, then
//! hands over to the release xtask: an unoptimised client would spend more per request than the
//! gateway it measures. The release xtask starts the mock and Baton (SQLite in a temporary
//! directory), runs each scenario directly against the mock and through Baton, reads Baton's CPU
//! time and RSS from `/proc`, checks that every request left an invocation-log row, writes
//! `target/bench/load.json` and prints a table.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use hdrhistogram::Histogram;
use serde_json::{Value, json};

const BOOTSTRAP_KEY: &str = "baton_bench_0123456789abcdef0123456789abcdef";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the invocation log may take to catch up after the load stops.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Options {
    smoke: bool,
    duration: Duration,
    rate: f64,
    concurrency: usize,
    streams: usize,
    mock_delay_ms: u64,
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut smoke = false;
        let (mut duration, mut rate, mut concurrency) = (None, None, None);
        let mut mock_delay_ms = 0;
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .with_context(|| format!("{flag} needs a value"))
                    .and_then(|v| {
                        v.parse::<u64>()
                            .with_context(|| format!("{flag}: '{v}' is not a whole number"))
                    })
            };
            match flag.as_str() {
                "--smoke" => smoke = true,
                "--duration" => duration = Some(value()?),
                "--rate" => rate = Some(value()?),
                "--concurrency" => concurrency = Some(value()?),
                "--mock-delay-ms" => mock_delay_ms = value()?,
                other => bail!(
                    "unknown option {other}\nusage: cargo xtask bench load [--smoke] [--duration SECS] [--rate N] [--concurrency N] [--mock-delay-ms MS]"
                ),
            }
        }
        let (default_duration, default_rate, default_concurrency, streams) = if smoke {
            (2, 100, 8, 5)
        } else {
            (10, 1000, 50, 50)
        };
        let rate = rate.unwrap_or(default_rate);
        ensure!(rate > 0, "--rate must be at least 1");
        Ok(Options {
            smoke,
            duration: Duration::from_secs(duration.unwrap_or(default_duration).max(1)),
            rate: rate as f64,
            concurrency: usize::try_from(concurrency.unwrap_or(default_concurrency))?.max(1),
            streams,
            mock_delay_ms,
        })
    }

    fn forwarded(&self) -> Vec<String> {
        let mut args = vec![
            "--duration".to_string(),
            self.duration.as_secs().to_string(),
            "--rate".into(),
            (self.rate as u64).to_string(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--mock-delay-ms".into(),
            self.mock_delay_ms.to_string(),
        ];
        if self.smoke {
            args.push("--smoke".into());
        }
        args
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    if cfg!(debug_assertions) {
        return hand_over_to_release(&options);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(drive(options))
}

/// Separate builds, not one: building packages together unifies their features and would
/// rebuild the dependencies `baton` shares with the others.
fn hand_over_to_release(options: &Options) -> anyhow::Result<()> {
    for build in [
        &["-p", "baton-server", "--bin", "baton"][..],
        &["-p", "baton-testkit", "--bin", "baton-mock"][..],
        &["-p", "xtask"][..],
    ] {
        let status = Command::new(env!("CARGO"))
            .current_dir(workspace_root())
            .args(["build", "--release", "--quiet"])
            .args(build)
            .status()?;
        ensure!(status.success(), "cargo build --release {build:?} failed");
    }
    let status = Command::new(target_dir().join("release").join("xtask"))
        .current_dir(workspace_root())
        .args(["bench", "load"])
        .args(options.forwarded())
        .status()?;
    ensure!(status.success(), "bench load failed");
    Ok(())
}

/// A process killed when dropped, so an early error leaves nothing running.
struct Guarded(Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where one scenario sends its requests.
#[derive(Clone)]
struct Target {
    url: String,
    key: Option<String>,
    body: Arc<String>,
    stream_body: Arc<String>,
}

fn request_body(model: &str, stream: bool) -> String {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "Say hi"}]})
        .to_string()
}

async fn drive(options: Options) -> anyhow::Result<()> {
    let release = target_dir().join("release");
    let temp = TempDir(std::env::temp_dir().join(format!("baton-bench-{}", std::process::id())));
    std::fs::create_dir_all(&temp.0)?;

    let (mock, mock_addr) = start_mock(&release, options.mock_delay_ms)?;
    let (baton, baton_addr) = start_baton(&release, &temp.0, &mock_addr)?;
    let baton_pid = baton.0.id();
    let clock_ticks = clock_ticks_per_second();

    let client = reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(usize::MAX)
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let direct = Target {
        url: format!("http://{mock_addr}/v1/chat/completions"),
        key: None,
        body: Arc::new(request_body("gpt-4o-mini", false)),
        stream_body: Arc::new(request_body("gpt-4o-mini", true)),
    };
    let gateway = Target {
        url: format!("http://{baton_addr}/api/v1/chat/completions"),
        key: Some(BOOTSTRAP_KEY.to_string()),
        body: Arc::new(request_body("openai/gpt-4o-mini", false)),
        stream_body: Arc::new(request_body("openai/gpt-4o-mini", true)),
    };

    let rss_idle_kb = rss_kb(baton_pid)?;
    let sampler = RssSampler::start(baton_pid);
    let mut gateway_sent = 0u64;
    let mut gateway_errors = 0u64;

    eprintln!("bench: warm-up");
    let warm_up = 200;
    for _ in 0..warm_up {
        send(&client, &direct).await;
    }
    let warm = sequential(&client, &gateway, None, Some(warm_up)).await?;
    gateway_sent += warm.sent;
    gateway_errors += warm.errors;

    eprintln!(
        "bench: concurrency 1 ({}s each)",
        options.duration.as_secs()
    );
    let c1_direct = sequential(&client, &direct, Some(options.duration), None).await?;
    let cpu_before = cpu_ticks(baton_pid)?;
    let c1_gateway = sequential(&client, &gateway, Some(options.duration), None).await?;
    let c1_cpu = cpu_us_per_request(cpu_ticks(baton_pid)? - cpu_before, clock_ticks, &c1_gateway);
    gateway_sent += c1_gateway.sent;
    gateway_errors += c1_gateway.errors;

    eprintln!("bench: fixed rate {} RPS", options.rate);
    let rate_direct = fixed_rate(&client, &direct, options.rate, options.duration).await?;
    let cpu_before = cpu_ticks(baton_pid)?;
    let rate_gateway = fixed_rate(&client, &gateway, options.rate, options.duration).await?;
    let rate_cpu = cpu_us_per_request(
        cpu_ticks(baton_pid)? - cpu_before,
        clock_ticks,
        &rate_gateway,
    );
    gateway_sent += rate_gateway.sent;
    gateway_errors += rate_gateway.errors;

    eprintln!("bench: concurrency {}", options.concurrency);
    let conc_direct = concurrent(&client, &direct, options.concurrency, options.duration).await?;
    let cpu_before = cpu_ticks(baton_pid)?;
    let conc_gateway = concurrent(&client, &gateway, options.concurrency, options.duration).await?;
    let conc_cpu = cpu_us_per_request(
        cpu_ticks(baton_pid)? - cpu_before,
        clock_ticks,
        &conc_gateway,
    );
    gateway_sent += conc_gateway.sent;
    gateway_errors += conc_gateway.errors;

    eprintln!("bench: {} streams", options.streams);
    let ttft_direct = streams(&client, &direct, options.streams).await?;
    let ttft_gateway = streams(&client, &gateway, options.streams).await?;
    gateway_sent += ttft_gateway.sent;
    gateway_errors += ttft_gateway.errors;

    let rss_load_kb = sampler.stop();
    eprintln!("bench: counting invocation-log rows (expecting {gateway_sent})");
    let rows = wait_for_log_rows(&client, &baton_addr, gateway_sent).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after_kb = rss_kb(baton_pid)?;

    let direct_errors = c1_direct.errors + rate_direct.errors + conc_direct.errors;
    let report = json!({
        "machine": machine_description(),
        "smoke": options.smoke,
        "duration_secs": options.duration.as_secs(),
        "mock_delay_ms": options.mock_delay_ms,
        "concurrency_1": {
            "direct": c1_direct.json(),
            "gateway": c1_gateway.json(),
            "added_p50_us": added(&c1_gateway, &c1_direct, 0.50),
            "added_p99_us": added(&c1_gateway, &c1_direct, 0.99),
            "gateway_cpu_us_per_request": c1_cpu,
        },
        "fixed_rate": {
            "rate": options.rate,
            "direct": rate_direct.json(),
            "gateway": rate_gateway.json(),
            "added_p50_us": added(&rate_gateway, &rate_direct, 0.50),
            "added_p99_us": added(&rate_gateway, &rate_direct, 0.99),
            "gateway_cpu_us_per_request": rate_cpu,
        },
        "concurrency": {
            "concurrency": options.concurrency,
            "direct": conc_direct.json(),
            "gateway": conc_gateway.json(),
            "mock_headroom": conc_direct.rps() / conc_gateway.rps().max(f64::MIN_POSITIVE),
            "gateway_cpu_us_per_request": conc_cpu,
        },
        "streaming_ttft": {
            "streams": options.streams,
            "direct": ttft_direct.json(),
            "gateway": ttft_gateway.json(),
            "added_p50_us": added(&ttft_gateway, &ttft_direct, 0.50),
            "added_p99_us": added(&ttft_gateway, &ttft_direct, 0.99),
        },
        "rss_kb": {"idle": rss_idle_kb, "under_load_peak": rss_load_kb, "after_load": rss_after_kb},
        "log_rows": {"requests_sent": gateway_sent, "rows": rows, "gateway_errors": gateway_errors, "direct_errors": direct_errors},
    });
    let out_dir = target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let out_path = out_dir.join("load.json");
    std::fs::write(&out_path, serde_json::to_string_pretty(&report)?)?;
    print_table(&report, &out_path)?;

    drop(baton);
    drop(mock);
    if options.smoke {
        ensure!(
            rows == gateway_sent,
            "invocation log has {rows} rows for {gateway_sent} requests"
        );
        ensure!(
            gateway_errors == 0 && direct_errors == 0,
            "{gateway_errors} gateway and {direct_errors} direct requests failed"
        );
    }
    Ok(())
}

fn start_mock(release: &Path, delay_ms: u64) -> anyhow::Result<(Guarded, String)> {
    let mut child = Guarded(
        Command::new(release.join("baton-mock"))
            .args(["--delay-ms", &delay_ms.to_string()])
            .args(["--chunks", "20", "--gap-ms", "1"])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting baton-mock")?,
    );
    let stdout = child.0.stdout.take().context("mock stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let address = line
        .trim()
        .strip_prefix("listening ")
        .with_context(|| format!("unexpected first line from baton-mock: {line:?}"))?
        .to_string();
    Ok((child, address))
}

/// Baton with a fresh SQLite database, its own environment only (the machine's provider keys
/// and proxies must not leak in), announcing its random port in its JSON log.
fn start_baton(release: &Path, dir: &Path, mock_addr: &str) -> anyhow::Result<(Guarded, String)> {
    let mut command = Command::new(release.join("baton"));
    command
        .args(["serve", "--bind", "127.0.0.1:0"])
        .current_dir(dir)
        .env_clear()
        .env(
            "BATON_DATABASE_URL",
            format!("sqlite://{}", dir.join("baton.db").display()),
        )
        .env("BATON_BOOTSTRAP_API_KEY", BOOTSTRAP_KEY)
        .env(
            "BATON_PROVIDERS__OPENAI__BASE_URL",
            format!("http://{mock_addr}/v1"),
        )
        .env("BATON_PROVIDERS__OPENAI__API_KEY", "sk-bench")
        .env("BATON_LOG_FORMAT", "json")
        .env("BATON_LOG", "warn,baton=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    let mut child = Guarded(command.spawn().context("starting baton")?);
    let stderr = child.0.stderr.take().context("baton stderr")?;
    let (found, address) = std::sync::mpsc::channel();
    // Keeps reading after the port line so a full pipe never blocks Baton's log writer.
    std::thread::spawn(move || {
        let mut found = Some(found);
        let mut before_start = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(sender) = found.as_ref() {
                let address = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|l| l.get("address").and_then(Value::as_str).map(str::to_owned));
                match address {
                    Some(address) => {
                        let _ = sender.send(Ok(address));
                        found = None;
                    }
                    None => before_start.push(line),
                }
            }
        }
        // Baton exited before listening: its output says why.
        if let Some(sender) = found {
            let _ = sender.send(Err(before_start.join("\n")));
        }
    });
    match address.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(address)) => Ok((child, address)),
        Ok(Err(output)) => bail!("baton exited before listening:\n{output}"),
        Err(_) => bail!("baton did not announce its address within 60 s"),
    }
}

/// Latencies of one scenario, in microseconds.
struct Outcome {
    histogram: Histogram<u64>,
    sent: u64,
    errors: u64,
    elapsed: Duration,
}

impl Outcome {
    fn new() -> anyhow::Result<Outcome> {
        Ok(Outcome {
            // 1 us to 60 s at 3 significant figures; larger values saturate.
            histogram: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            sent: 0,
            errors: 0,
            elapsed: Duration::ZERO,
        })
    }

    fn record(&mut self, latency: Duration, ok: bool) {
        self.sent += 1;
        if ok {
            let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
            self.histogram.saturating_record(micros.max(1));
        } else {
            self.errors += 1;
        }
    }

    fn quantile(&self, q: f64) -> u64 {
        self.histogram.value_at_quantile(q)
    }

    fn rps(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn json(&self) -> Value {
        json!({
            "requests": self.sent,
            "errors": self.errors,
            "rps": (self.rps() * 10.0).round() / 10.0,
            "p50_us": self.quantile(0.50),
            "p90_us": self.quantile(0.90),
            "p99_us": self.quantile(0.99),
            "p999_us": self.quantile(0.999),
            "max_us": self.histogram.max(),
            "mean_us": self.histogram.mean().round(),
        })
    }
}

/// Gateway minus direct at one quantile (signed: noise can make it negative).
fn added(gateway: &Outcome, direct: &Outcome, q: f64) -> i64 {
    i64::try_from(gateway.quantile(q)).unwrap_or(i64::MAX)
        - i64::try_from(direct.quantile(q)).unwrap_or(i64::MAX)
}

async fn send(client: &reqwest::Client, target: &Target) -> bool {
    let mut request = client
        .post(&target.url)
        .header("content-type", "application/json")
        .body(target.body.as_str().to_owned());
    if let Some(key) = &target.key {
        request = request.bearer_auth(key);
    }
    match request.send().await {
        Ok(response) => {
            let ok = response.status().is_success();
            response.bytes().await.is_ok() && ok
        }
        Err(_) => false,
    }
}

/// One request at a time, for `duration` or `count` requests.
async fn sequential(
    client: &reqwest::Client,
    target: &Target,
    duration: Option<Duration>,
    count: Option<u64>,
) -> anyhow::Result<Outcome> {
    let mut outcome = Outcome::new()?;
    let start = Instant::now();
    loop {
        if duration.is_some_and(|d| start.elapsed() >= d)
            || count.is_some_and(|c| outcome.sent >= c)
        {
            break;
        }
        let sent_at = Instant::now();
        let ok = send(client, target).await;
        outcome.record(sent_at.elapsed(), ok);
    }
    outcome.elapsed = start.elapsed();
    Ok(outcome)
}

/// Open loop: requests start at fixed intended times whatever the server does, and latency is
/// measured from the intended time, so a stall shows as the queue it causes (no coordinated
/// omission). A plain thread paces the sends because it sleeps more precisely than tokio's
/// millisecond timer.
async fn fixed_rate(
    client: &reqwest::Client,
    target: &Target,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<Outcome> {
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / rate);
    let (results, mut received) = tokio::sync::mpsc::unbounded_channel();
    let handle = tokio::runtime::Handle::current();
    let (client, target) = (client.clone(), target.clone());
    let start = Instant::now();
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let intended = start + period.mul_f64(i as f64);
            let now = Instant::now();
            if intended > now {
                std::thread::sleep(intended - now);
            }
            let (client, target, results) = (client.clone(), target.clone(), results.clone());
            handle.spawn(async move {
                let ok = send(&client, &target).await;
                let _ = results.send((intended.elapsed(), ok));
            });
        }
    });
    let mut outcome = Outcome::new()?;
    while let Some((latency, ok)) = received.recv().await {
        outcome.record(latency, ok);
    }
    outcome.elapsed = start.elapsed();
    pacer
        .join()
        .map_err(|_| anyhow::anyhow!("the pacing thread failed"))?;
    Ok(outcome)
}

/// Closed loop: `workers` requests in flight at all times for `duration`.
async fn concurrent(
    client: &reqwest::Client,
    target: &Target,
    workers: usize,
    duration: Duration,
) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (client, target) = (client.clone(), target.clone());
        tasks.spawn(async move {
            let mut results = Vec::new();
            while start.elapsed() < duration {
                let sent_at = Instant::now();
                let ok = send(&client, &target).await;
                results.push((sent_at.elapsed(), ok));
            }
            results
        });
    }
    let mut outcome = Outcome::new()?;
    while let Some(results) = tasks.join_next().await {
        for (latency, ok) in results.unwrap_or_default() {
            outcome.record(latency, ok);
        }
    }
    outcome.elapsed = start.elapsed();
    Ok(outcome)
}

/// Time to the first body bytes of a stream, one stream at a time; each stream is read to its end.
async fn streams(
    client: &reqwest::Client,
    target: &Target,
    count: usize,
) -> anyhow::Result<Outcome> {
    let mut outcome = Outcome::new()?;
    let start = Instant::now();
    for _ in 0..count {
        let mut request = client
            .post(&target.url)
            .header("content-type", "application/json")
            .body(target.stream_body.as_str().to_owned());
        if let Some(key) = &target.key {
            request = request.bearer_auth(key);
        }
        let sent_at = Instant::now();
        let (first, ok) = match request.send().await {
            Ok(mut response) if response.status().is_success() => {
                let first = response.chunk().await;
                let ttft = sent_at.elapsed();
                let mut body = Vec::new();
                if let Ok(Some(bytes)) = &first {
                    body.extend_from_slice(bytes);
                }
                let mut ok = matches!(first, Ok(Some(_)));
                loop {
                    match response.chunk().await {
                        Ok(Some(bytes)) => body.extend_from_slice(&bytes),
                        Ok(None) => break,
                        Err(_) => {
                            ok = false;
                            break;
                        }
                    }
                }
                let complete = body.windows(6).any(|w| w == b"[DONE]");
                (ttft, ok && complete)
            }
            _ => (sent_at.elapsed(), false),
        };
        outcome.record(first, ok);
    }
    outcome.elapsed = start.elapsed();
    Ok(outcome)
}

/// Pages through `/api/v1/llm-logs` until it holds `expected` rows (rows are written off the
/// request path, so the last ones land shortly after the load stops).
async fn wait_for_log_rows(
    client: &reqwest::Client,
    baton_addr: &str,
    expected: u64,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + LOG_DRAIN_TIMEOUT;
    loop {
        let rows = count_log_rows(client, baton_addr).await?;
        if rows >= expected || Instant::now() >= deadline {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn count_log_rows(client: &reqwest::Client, baton_addr: &str) -> anyhow::Result<u64> {
    let url = format!("http://{baton_addr}/api/v1/llm-logs");
    let mut rows = 0u64;
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("pageSize", "200".to_string())];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let response = client
            .get(&url)
            .bearer_auth(BOOTSTRAP_KEY)
            .query(&query)
            .send()
            .await?;
        let status = response.status();
        let page: Value = response.json().await?;
        ensure!(status.is_success(), "GET /api/v1/llm-logs: {status} {page}");
        rows += page["items"]
            .as_array()
            .map_or(0, |items| items.len() as u64);
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(rows),
        }
    }
}

/// Baton's user plus system CPU time in clock ticks (fields 14 and 15 of `/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after it start past the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}

fn cpu_us_per_request(ticks: u64, ticks_per_second: u64, outcome: &Outcome) -> f64 {
    let micros = ticks as f64 * 1e6 / ticks_per_second.max(1) as f64;
    (micros / outcome.sent.max(1) as f64).round()
}

fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/PID/status")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmRSS without a value")?
        .parse()?)
}

/// Samples Baton's RSS every 100 ms on its own thread; `stop` returns the peak.
struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (stop_flag, peak_kb) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop_flag.load(Ordering::Relaxed) {
                if let Ok(kb) = rss_kb(pid) {
                    peak_kb.fetch_max(kb, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        RssSampler { stop, peak }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.peak.load(Ordering::Relaxed)
    }
}

fn machine_description() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(1),
        "cpu_model": cpu,
    })
}

fn print_table(report: &Value, path: &Path) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let row = |out: &mut std::io::StdoutLock<'_>, name: &str, value: String| {
        writeln!(out, "  {name:<44} {value:>14}")
    };
    let us = |v: &Value| {
        format!(
            "{} us",
            v.as_i64().map_or_else(|| v.to_string(), |n| n.to_string())
        )
    };
    writeln!(
        out,
        "\nBaton load benchmark (loopback; written to {})",
        path.display()
    )?;
    let c1 = &report["concurrency_1"];
    row(
        &mut out,
        "concurrency 1: direct p50 / p99",
        format!("{} / {} us", c1["direct"]["p50_us"], c1["direct"]["p99_us"]),
    )?;
    row(
        &mut out,
        "concurrency 1: gateway p50 / p99",
        format!(
            "{} / {} us",
            c1["gateway"]["p50_us"], c1["gateway"]["p99_us"]
        ),
    )?;
    row(
        &mut out,
        "concurrency 1: added p50",
        us(&c1["added_p50_us"]),
    )?;
    row(
        &mut out,
        "concurrency 1: added p99",
        us(&c1["added_p99_us"]),
    )?;
    let rate = &report["fixed_rate"];
    let rate_name = format!("{} RPS", rate["rate"]);
    row(
        &mut out,
        &format!("{rate_name}: achieved gateway RPS"),
        rate["gateway"]["rps"].to_string(),
    )?;
    row(
        &mut out,
        &format!("{rate_name}: direct p50 / p99"),
        format!(
            "{} / {} us",
            rate["direct"]["p50_us"], rate["direct"]["p99_us"]
        ),
    )?;
    row(
        &mut out,
        &format!("{rate_name}: gateway p50 / p99"),
        format!(
            "{} / {} us",
            rate["gateway"]["p50_us"], rate["gateway"]["p99_us"]
        ),
    )?;
    row(
        &mut out,
        &format!("{rate_name}: added p99"),
        us(&rate["added_p99_us"]),
    )?;
    row(
        &mut out,
        &format!("{rate_name}: gateway CPU per request"),
        us(&rate["gateway_cpu_us_per_request"]),
    )?;
    let conc = &report["concurrency"];
    let conc_name = format!("concurrency {}", conc["concurrency"]);
    row(
        &mut out,
        &format!("{conc_name}: direct RPS"),
        conc["direct"]["rps"].to_string(),
    )?;
    row(
        &mut out,
        &format!("{conc_name}: gateway RPS"),
        conc["gateway"]["rps"].to_string(),
    )?;
    row(
        &mut out,
        &format!("{conc_name}: gateway p99"),
        us(&conc["gateway"]["p99_us"]),
    )?;
    row(
        &mut out,
        &format!("{conc_name}: mock headroom (direct/gateway)"),
        format!("{:.1}x", conc["mock_headroom"].as_f64().unwrap_or(0.0)),
    )?;
    row(
        &mut out,
        &format!("{conc_name}: gateway CPU per request"),
        us(&conc["gateway_cpu_us_per_request"]),
    )?;
    let ttft = &report["streaming_ttft"];
    row(
        &mut out,
        "streaming TTFT: direct p50 / p99",
        format!(
            "{} / {} us",
            ttft["direct"]["p50_us"], ttft["direct"]["p99_us"]
        ),
    )?;
    row(
        &mut out,
        "streaming TTFT: gateway p50 / p99",
        format!(
            "{} / {} us",
            ttft["gateway"]["p50_us"], ttft["gateway"]["p99_us"]
        ),
    )?;
    row(
        &mut out,
        "streaming TTFT: added p99",
        us(&ttft["added_p99_us"]),
    )?;
    let rss = &report["rss_kb"];
    let mb = |v: &Value| format!("{:.1} MB", v.as_f64().unwrap_or(0.0) / 1024.0);
    row(
        &mut out,
        "RSS idle / peak under load / after load",
        format!(
            "{} / {} / {}",
            mb(&rss["idle"]),
            mb(&rss["under_load_peak"]),
            mb(&rss["after_load"])
        ),
    )?;
    let logs = &report["log_rows"];
    row(
        &mut out,
        "log rows / gateway requests sent",
        format!("{} / {}", logs["rows"], logs["requests_sent"]),
    )?;
    row(
        &mut out,
        "errors gateway / direct",
        format!("{} / {}", logs["gateway_errors"], logs["direct_errors"]),
    )?;
    Ok(())
}
